"""Run code cells in a real Jupyter kernel (ipykernel, through nbclient) and return the outputs.

The kernel is this interpreter (``sys.executable``) from a kernelspec written to a temporary
folder, with ``PYTHONPATH`` set to the repository root so it imports this checkout, whatever
other kernelspecs the machine has.
"""
from __future__ import annotations

import json
import pathlib
import sys
import tempfile
from typing import Dict, List, Optional, Sequence

from conftest import ROOT

KERNEL_NAME = "colab-gpu-test"


def kernel_manager(folder: pathlib.Path):
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager

    spec = folder / KERNEL_NAME
    spec.mkdir()
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "colab_gpu tests",
        "language": "python",
        "env": {"PYTHONPATH": str(ROOT)},
    }))
    specs = KernelSpecManager(kernel_dirs=[str(folder)], ensure_native_kernel=False)
    return KernelManager(kernel_name=KERNEL_NAME, kernel_spec_manager=specs)


def execute(notebook, cwd: pathlib.Path = ROOT, timeout: int = 120, messages: Optional[list] = None):
    """Execute ``notebook`` in place in one fresh kernel whose working directory is ``cwd``.

    ``timeout`` is per cell. A cell that raises fails the run with nbclient's
    CellExecutionError, which shows the kernel's traceback, unless the cell is tagged
    ``raises-exception``. ``messages``, when given, receives every output message the front
    end got, in order, as (cell index, message type, content): the saved notebook keeps only
    the last state of an output that ``update_display_data`` replaced.
    """
    from nbclient import NotebookClient

    class Recording(NotebookClient):
        def process_message(self, msg, cell, cell_index):
            messages.append((cell_index, msg["msg_type"], msg["content"]))
            return super().process_message(msg, cell, cell_index)

    with tempfile.TemporaryDirectory() as folder:
        manager = kernel_manager(pathlib.Path(folder))
        client = NotebookClient if messages is None else Recording
        client(notebook, km=manager, timeout=timeout, resources={"metadata": {"path": str(cwd)}}).execute()
    return notebook


def run_cells(cells: Sequence[str], timeout: int = 120, messages: Optional[list] = None):
    """Execute ``cells`` in order in one fresh kernel; the executed notebook (nbformat v4)."""
    import nbformat

    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source) for source in cells])
    return execute(notebook, timeout=timeout, messages=messages)


def bundles(cell) -> List[Dict[str, str]]:
    """The MIME bundles a cell displayed or returned (``display_data`` / ``execute_result``)."""
    return [output["data"] for output in cell.outputs if output.output_type in ("display_data", "execute_result")]


def stream(cell, name: str = "stdout") -> str:
    """Everything the cell printed on ``name`` (stdout or stderr)."""
    return "".join(output.text for output in cell.outputs
                   if output.output_type == "stream" and output.name == name)
