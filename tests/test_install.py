"""The set-up files install what they say: torch's CPU build, never PyPI's multi-GB CUDA one."""
from __future__ import annotations

import re

import pytest

from conftest import ROOT

CPU_INDEX = "https://download.pytorch.org/whl/cpu"
TORCH = re.compile(r"\btorch(?:[<>=!~]=?[\w.*,<>=]*)?(?:\s|$)")


def torch_installs(script: str):
    """Each logical line of ``script`` (continuations joined) that pip-installs torch."""
    lines = script.replace("\\\n", " ").splitlines()
    return [line for line in lines if "pip install" in line and not line.lstrip().startswith("#")
            and TORCH.search(line.split("pip install", 1)[1])]


@pytest.mark.parametrize("name", ["run.sh", "test.sh"])
def test_scripts_install_torch_from_the_cpu_index(name):
    installs = torch_installs((ROOT / "scripts" / name).read_text())
    assert installs, f"scripts/{name} no longer installs torch first"
    # PyPI's Linux torch is the CUDA build, with gigabytes of nvidia-* wheels.
    assert all(f"--index-url {CPU_INDEX}" in line for line in installs), installs


def test_binder_takes_torch_from_the_cpu_index():
    requirements = (ROOT / "binder" / "requirements.txt").read_text().splitlines()
    assert f"--extra-index-url {CPU_INDEX}" in requirements
