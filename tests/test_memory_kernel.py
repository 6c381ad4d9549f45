"""%clear_cache in a real Jupyter kernel (ipykernel keeps its own state around a failed cell)."""
from __future__ import annotations

import os
import sys

import pytest

from conftest import ROOT

pytestmark = pytest.mark.kernel

CELLS = [
    "%load_ext colab_gpu\nimport sys, torch, weakref\nprint(sys.prefix)",
    "def step():\n    x = torch.ones(16_000_000)\n    global failed\n    failed = weakref.ref(x)\n    raise RuntimeError('boom')\nstep()",
    "shown = torch.ones(8_000_000)\nkept_by_out = weakref.ref(shown)\nshown",
    "del shown\nprint(failed() is not None, kept_by_out() is not None)",
    "%clear_cache --quiet",
    "print(failed() is not None, kept_by_out() is not None)",
]


def test_failed_cell_and_output_are_freed_in_a_kernel():
    import nbformat
    from nbclient import NotebookClient

    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(code) for code in CELLS])
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    client = NotebookClient(notebook, timeout=120, kernel_name="python3", allow_errors=True)
    # The kernelspec runs "python": put this environment's first on PATH.
    path = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
    client.execute(env={**os.environ, "PATH": path, "PYTHONPATH": str(ROOT)})

    def text(index: int) -> str:
        return "".join(output.get("text", "") for output in notebook.cells[index].outputs
                       if output.get("output_type") == "stream")

    assert text(0).strip() == sys.prefix
    assert notebook.cells[1].outputs[0]["output_type"] == "error"
    assert text(3).strip() == "True True", "the traceback and Out should keep both tensors alive"
    assert text(4).startswith("clear_cache: freed cpu tensors 91.6 MiB")  # 96,000,000 B
    assert text(5).strip() == "False False"
