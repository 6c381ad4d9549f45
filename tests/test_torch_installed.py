"""%gpu_status on a Python without torch says "torch is not installed", not "not imported yet",
which told a user to wait for an import that could never happen."""
from __future__ import annotations

import importlib.util
import os
import pathlib
import subprocess
import sys

from conftest import ROOT

from colab_gpu.render import torch_summary
from colab_gpu.runtime import TorchState, torch_state


def test_the_state_tells_installed_from_imported_without_importing_torch(monkeypatch):
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    state = torch_state(modules={})
    assert state == TorchState(imported=False, installed=True) and "torch" not in sys.modules
    assert torch_summary(state) == "torch not imported yet"
    assert torch_summary(TorchState(imported=False, installed=False)) == "torch is not installed"


def test_gpu_status_in_a_python_without_torch_says_it_is_not_installed(tmp_path):
    """A real interpreter whose path holds every installed package but torch's."""
    site = pathlib.Path(importlib.util.find_spec("IPython").origin).parent.parent
    for entry in site.iterdir():
        if not entry.name.lower().startswith(("torch", "functorch")):
            (tmp_path / entry.name).symlink_to(entry)
    code = ("import importlib.util\nassert importlib.util.find_spec('torch') is None\n"
            "from IPython.testing.globalipapp import start_ipython\nshell = start_ipython()\n"
            "shell.run_line_magic('load_ext', 'colab_gpu')\nshell.run_line_magic('gpu_status', '')\n")
    environ = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{tmp_path}"}
    done = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True,
                          env=environ, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert "torch is not installed" in done.stdout and "not imported" not in done.stdout, done.stdout
