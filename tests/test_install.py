"""The set-up files install what they say: torch's CPU build, never PyPI's multi-GB CUDA one;
the package builds into a wheel that holds its data and a source distribution that runs its
tests; the scripts run from a fresh checkout."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile

import pytest

from conftest import ROOT

CPU_INDEX = "https://download.pytorch.org/whl/cpu"
TORCH = re.compile(r"\btorch(?:[<>=!~]=?[\w.*,<>=]*)?(?:\s|$)")


def torch_installs(script: str):
    """Each logical line of ``script`` (continuations joined) that pip-installs torch."""
    lines = script.replace("\\\n", " ").splitlines()
    return [line for line in lines if "pip install" in line and not line.lstrip().startswith("#")
            and TORCH.search(line.split("pip install", 1)[1])]


def test_run_sh_installs_torch_from_the_cpu_index():
    installs = torch_installs((ROOT / "scripts" / "run.sh").read_text())
    assert installs, "scripts/run.sh no longer installs torch first"
    # PyPI's Linux torch is the CUDA build, with gigabytes of nvidia-* wheels.
    assert all(f"--index-url {CPU_INDEX}" in line for line in installs), installs


def test_test_sh_installs_the_torch_it_chose_before_the_project():
    """The newest end takes the CPU build; the Colab one Colab's own 2.11.0 (PyPI's CUDA build,
    on purpose): each an exact version, installed before the project's range could pick one."""
    script = (ROOT / "scripts" / "test.sh").read_text()
    choices = re.findall(r"torch=\((.*?)\)", script)
    assert f"--no-deps --index-url {CPU_INDEX} torch==2.13.0" in choices and "torch==2.11.0" in choices
    torch_first = script.index('pip install -q "${torch[@]}"')
    assert torch_first < script.index('pip install -q -e ".[$extras]"')


def test_binder_takes_torch_from_the_cpu_index():
    requirements = (ROOT / "binder" / "requirements.txt").read_text().splitlines()
    assert f"--extra-index-url {CPU_INDEX}" in requirements


def test_the_wheel_holds_the_data_and_builds_without_deprecations(tmp_path):
    """pip install git+... builds a wheel: the recordings and the live page must be in it, and a
    deprecated pyproject form (setuptools stops building those in 2027) must not be."""
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, source)
    shutil.copytree(ROOT / "colab_gpu", source / "colab_gpu",
                    ignore=shutil.ignore_patterns("__pycache__"))
    build = subprocess.run(
        # Build isolation, as a user's install: the build gets the setuptools pyproject asks for.
        [sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "-w", str(tmp_path / "dist"), str(source)],
        capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    assert "SetuptoolsDeprecationWarning" not in build.stdout + build.stderr
    wheel, = (tmp_path / "dist").glob("colab_gpu-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for data in ("colab_gpu/data/tesla-t4.xml", "colab_gpu/data/v100s-pcie-32gb_miris.csv",
                 "colab_gpu/data/LICENSE.telegraf", "colab_gpu/data/LICENSE.miris",
                 "colab_gpu/data/nanogpt-8gpu-training_gpus0-3.csv", "colab_gpu/data/LICENSE.nanogpt",
                 "colab_gpu/live/page.html"):
        assert data in names
    for module in ("__init__", "arguments", "cell", "later_runs"):  # a subpackage, found by include
        assert f"colab_gpu/magics/{module}.py" in names
    for module in ("__init__", "values", "nvsmi_xml", "csv_log", "table"):  # --from's readers
        assert f"colab_gpu/devices/replay/{module}.py" in names
    for module in ("__init__", "walk", "namespace", "readings", "rounding", "holders", "clear"):
        assert f"colab_gpu/memory/{module}.py" in names
    for module in ("__init__", "schema", "parse", "installed"):
        assert f"colab_gpu/torch_allocator/{module}.py" in names
    for module in ("cuda", "torch_view", "oom"):
        assert f"colab_gpu/{module}.py" in names
    assert any(name.endswith(".dist-info/licenses/LICENSE") for name in names), "no MIT licence text"


# What the tests read besides colab_gpu/: themselves, their helpers and recordings, the
# notebooks they execute, the scripts and set-up files they check (and ci/, which
# scripts/test.sh reads).
SDIST_FOLDERS = ("tests", "notebooks", "scripts", "binder", "ci", "benchmarks", "gpu_checks")


def test_the_sdist_runs_its_own_tests(tmp_path):
    """Who runs pytest in an unpacked source distribution (a distribution's packager, say)
    gets the whole suite: setuptools alone shipped tests/test_*.py without conftest.py, the
    helpers and the recordings, and every test file failed at 'from conftest import ...'."""
    pytest.importorskip("setuptools", minversion="77")  # the SPDX licence string of pyproject
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE", "MANIFEST.in"):
        if (ROOT / name).exists():
            shutil.copy(ROOT / name, source)
    skip = shutil.ignore_patterns("__pycache__", "*.pyc", "out")  # gpu_checks/out: a run's logs
    for folder in ("colab_gpu",) + SDIST_FOLDERS:
        shutil.copytree(ROOT / folder, source / folder, ignore=skip)
    build = subprocess.run(
        [sys.executable, "-c", "import sys; from setuptools import build_meta; "
         "print(build_meta.build_sdist(sys.argv[1]))", str(tmp_path / "dist")],
        cwd=source, capture_output=True, text=True, timeout=120)
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    sdist = tmp_path / "dist" / build.stdout.split()[-1]
    with tarfile.open(sdist) as archive:
        names = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    wanted = {str(path.relative_to(source)) for folder in SDIST_FOLDERS
              for path in (source / folder).rglob("*") if path.is_file()}
    assert "tests/conftest.py" in wanted and "tests/data/README.md" in wanted
    assert sorted(wanted - names) == []
    assert not [name for name in names if name.endswith(".pyc") or "/out/" in name]


# Put this checkout first on sys.path later, not when loaded: in main() (status_speed,
# cuda_order_cost) or in the PYTHONPATH of the processes they start (alloc_conf,
# find_batch_vs_peers).
PATH_SET_LATER = {"benchmarks/status_speed.py", "benchmarks/cuda_order_cost.py",
                  "benchmarks/find_batch_vs_peers.py", "gpu_checks/alloc_conf.py"}
PROBE = """
import runpy, sys, traceback
for script in sys.argv[1:]:
    path = list(sys.path)
    for name in [name for name in sys.modules if name.partition(".")[0] == "colab_gpu"]:
        del sys.modules[name]
    try:
        runpy.run_path(script, run_name="probe")  # the module's own code, not main()
        import colab_gpu
        print(script, colab_gpu.__file__)
    except BaseException as error:
        print(script, "failed:", "".join(traceback.format_exception_only(type(error), error)).strip())
    sys.path[:] = path
"""


def test_benchmarks_and_gpu_checks_measure_their_own_checkout(tmp_path):
    """`python benchmarks/memory_holders.py` (or gpu_checks/find_batch.py) run from a fresh
    checkout must import that checkout's colab_gpu: not fail with "No module named 'colab_gpu'",
    nor measure another copy that pip or PYTHONPATH provides."""
    decoy = tmp_path / "decoy" / "colab_gpu"
    decoy.mkdir(parents=True)
    (decoy / "__init__.py").write_text("")  # an empty package: another colab_gpu first on PYTHONPATH
    scripts = sorted(str(path.relative_to(ROOT)) for folder in ("benchmarks", "gpu_checks")
                     for path in (ROOT / folder).glob("*.py"))
    probed = [script for script in scripts if script not in PATH_SET_LATER]
    assert len(probed) >= 8, probed
    done = subprocess.run([sys.executable, "-c", PROBE, *(str(ROOT / script) for script in probed)],
                          cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(tmp_path / "decoy")),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    own = str(ROOT / "colab_gpu" / "__init__.py")
    lines = done.stdout.splitlines()
    assert [line.split(" ", 1)[0] for line in lines] == [str(ROOT / script) for script in probed], done.stdout
    assert all(line.endswith(" " + own) for line in lines), done.stdout
