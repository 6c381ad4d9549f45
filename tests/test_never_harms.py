"""The "never do harm" promises, checked by injecting faults at the boundaries.

NVML: every function NvmlSource calls (the lists come from healthy runs of the real code) raises,
one at a time, each error pynvml raises for a broken machine: at init, on the second of two GPUs,
and while the live monitor samples. Imports: torch, ipywidgets, matplotlib or pandas missing, in a
fresh process. CUDA: with torch imported and CUDA not started, no magic or API calls a torch.cuda
function that would start it. Input: every option's bad values are one UsageError line and change
nothing. Variables: no magic deletes or rebinds a user's variable it was not asked to.
"""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pynvml
import pytest

import colab_gpu.devices
from colab_gpu.devices.nvml import NvmlSource, describe_nvml_error
from colab_gpu.devices.replay import ReplaySource
from colab_gpu.live.sampler import Sampler
from colab_gpu.state import session

from conftest import DATA, ROOT
from nvml_recording import RecordedNvml

T4 = DATA / "nvidia-smi-xml" / "tesla-t4.xml"

# The failures of a broken machine the issue names, as pynvml raises them.
NVML_ERRORS = {name: getattr(pynvml, f"NVML_ERROR_{code}") for name, code in (
    ("LibraryNotFound", "LIBRARY_NOT_FOUND"), ("DriverNotLoaded", "DRIVER_NOT_LOADED"),
    ("LibRmVersionMismatch", "LIB_RM_VERSION_MISMATCH"), ("NotSupported", "NOT_SUPPORTED"),
    ("FunctionNotFound", "FUNCTION_NOT_FOUND"), ("GpuIsLost", "GPU_IS_LOST"),
    ("NoPermission", "NO_PERMISSION"), ("Unknown", "UNKNOWN"), ("Timeout", "TIMEOUT"),
    ("Uninitialized", "UNINITIALIZED"))}


def two_t4s() -> colab_gpu.devices.Snapshot:
    """Kaggle's two T4s: the recorded T4 twice, the second on its own bus."""
    snapshot = ReplaySource(T4).snapshot()
    (gpu,) = snapshot.gpus
    second = dataclasses.replace(gpu, index=1, uuid="GPU-00000000-0000-0000-0000-000000000001",
                                 bus_id="00000000:00:05.0")
    return dataclasses.replace(snapshot, gpus=(gpu, second))


def nvml_calls() -> list:
    """Every NVML function the real code calls for a full snapshot, in order."""
    nvml = RecordedNvml(two_t4s())
    assert NvmlSource(nvml=nvml).snapshot().ok
    return list(dict.fromkeys(nvml.calls))


def light_calls(after_full: bool) -> list:
    """Every NVML function the live monitor's light read calls, in order: after a full
    snapshot (the sampler's reads), or as a source's first read (handles, fixed fields too)."""
    nvml = RecordedNvml(two_t4s())
    source = NvmlSource(nvml=nvml)
    if after_full:
        assert source.snapshot().ok
        nvml.calls.clear()
    assert source.light_snapshot().ok
    return list(dict.fromkeys(nvml.calls))


NVML_CALLS = nvml_calls()
LIGHT_CALLS = light_calls(after_full=True)
FIRST_LIGHT_CALLS = light_calls(after_full=False)
SYSTEM_CALLS = {"nvmlInit", "nvmlDeviceGetCount"}  # no GPU is read without them
DEVICE_CALLS = sorted(name for name in set(NVML_CALLS) - SYSTEM_CALLS if name.startswith("nvmlDevice"))


def test_the_call_list_is_the_real_codes():
    assert len(NVML_CALLS) >= 20 and NVML_CALLS[0] == "nvmlInit"
    assert {"nvmlDeviceGetMemoryInfo", "nvmlDeviceGetHandleByIndex", "nvmlSystemGetDriverVersion",
            "nvmlDeviceGetComputeRunningProcesses", "nvmlSystemGetProcessName"} <= set(NVML_CALLS)
    assert {"nvmlDeviceGetCount", "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetUtilizationRates"} <= set(LIGHT_CALLS)
    assert set(LIGHT_CALLS) < set(FIRST_LIGHT_CALLS) <= set(NVML_CALLS) and FIRST_LIGHT_CALLS[0] == "nvmlInit"


@pytest.fixture
def gpu_status_text(shell, capsys, monkeypatch):
    """%gpu_status over NvmlSource(nvml), as text; fails on any traceback."""
    def run(nvml, line=""):
        monkeypatch.setattr(session, "default_source", NvmlSource(nvml=nvml))
        shell.run_line_magic("gpu_status", line)
        captured = capsys.readouterr()
        assert "Traceback" not in captured.out + captured.err and captured.err == ""
        return captured.out

    return run


def assert_worded(text: str) -> None:
    """An NVML failure is said in words, never as pynvml's class or its bare message."""
    assert "NVMLError" not in text and "NVML error:" not in text


@pytest.mark.parametrize("error", NVML_ERRORS)
@pytest.mark.parametrize("function", NVML_CALLS)
def test_every_nvml_call_failing_on_every_gpu_leaves_an_honest_card(gpu_status_text, function, error):
    text = gpu_status_text(RecordedNvml(two_t4s()).fail(function, NVML_ERRORS[error]))
    lines = text.splitlines()
    assert lines[0].startswith("IPython in a terminal")  # the runtime line is always shown
    assert_worded(text)
    if function in SYSTEM_CALLS:
        assert [line for line in lines if line.startswith("No GPU read: ")] == [
            f"No GPU read: {describe_nvml_error(pynvml.NVMLError(NVML_ERRORS[error]))}"]
    else:  # both GPUs keep their line: read, or marked with what went wrong
        assert sum(line.startswith(("GPU 0 ", "GPU 1 ")) for line in lines) == 2, text


@pytest.mark.parametrize("error", NVML_ERRORS)
@pytest.mark.parametrize("function", DEVICE_CALLS)
def test_every_nvml_call_failing_on_the_second_gpu_leaves_the_first_whole(gpu_status_text, function, error):
    text = gpu_status_text(RecordedNvml(two_t4s()).fail(function, NVML_ERRORS[error], index=1))
    assert_worded(text)
    assert "GPU 0  Tesla T4  (cuda:0, compute capability 7.5)" in text.splitlines()
    assert "  memory      1.01 GiB used / 15.00 GiB, 13.61 GiB free,\n              388 MiB reserved by the driver" in text
    second = [line for line in text.splitlines() if line.startswith("GPU 1 ")]
    assert len(second) == 1
    if error == "GpuIsLost":
        assert second[0].endswith(describe_nvml_error(pynvml.NVMLError(NVML_ERRORS[error])))


def test_a_driver_version_that_finds_a_gpu_lost_does_not_hide_every_gpu(gpu_status_text):
    """Before, the driver-version read re-raised "GPU is lost" and the card said No GPU read."""
    nvml = RecordedNvml(two_t4s()).fail("nvmlSystemGetDriverVersion", pynvml.NVML_ERROR_GPU_IS_LOST)
    snapshot = NvmlSource(nvml=nvml).snapshot()
    assert snapshot.problem is None and [gpu.name for gpu in snapshot.gpus] == ["Tesla T4"] * 2
    assert snapshot.driver_version is None


def test_a_name_nvml_cannot_give_leaves_the_rest_of_the_gpu_read():
    """Before, a NotSupported or Timeout name made the whole GPU 'unknown GPU: NVML error: ...'."""
    nvml = RecordedNvml(two_t4s()).fail("nvmlDeviceGetName", pynvml.NVML_ERROR_TIMEOUT, index=1)
    first, second = NvmlSource(nvml=nvml).snapshot().gpus
    assert second.error is None and second.name == "unknown GPU"
    assert dataclasses.replace(second, name=first.name, index=0, uuid=first.uuid, bus_id=first.bus_id) == first


@pytest.mark.parametrize("error", ["NotSupported", "Unknown", "Timeout"])
def test_init_failures_nvml_has_no_words_for_are_said_in_words(error):
    """Before: "No GPU read: NVML error: Timeout" - pynvml's message, not what to do."""
    nvml = RecordedNvml(two_t4s()).fail("nvmlInit", NVML_ERRORS[error])
    problem = NvmlSource(nvml=nvml).snapshot().problem
    assert problem.startswith("the NVIDIA driver ") and "NVML error" not in problem


@pytest.mark.parametrize("error", NVML_ERRORS)
@pytest.mark.parametrize("function, index", [(function, None) for function in FIRST_LIGHT_CALLS]
                         + [(function, 1) for function in FIRST_LIGHT_CALLS if function in DEVICE_CALLS])
def test_every_nvml_call_failing_in_a_light_read_is_said_in_words(function, index, error):
    """The live monitor's light read, as a source's first read (every call it can make)."""
    nvml = RecordedNvml(two_t4s()).fail(function, NVML_ERRORS[error], index=index)
    snapshot = NvmlSource(nvml=nvml).light_snapshot()  # never raises
    if snapshot.problem is not None:
        assert function in SYSTEM_CALLS and snapshot.gpus == ()
        assert_worded(snapshot.problem)
        return
    assert [gpu.index for gpu in snapshot.gpus] == [0, 1]
    for gpu in snapshot.gpus:
        assert gpu.error is None or (gpu.error.count("\n") == 0 and "NVMLError" not in gpu.error)
    if index == 1:  # the first GPU is read whole
        first = snapshot.gpus[0]
        assert first.error is None and first.name == "Tesla T4" and first.memory_used == two_t4s().gpus[0].memory_used


@pytest.mark.parametrize("error", NVML_ERRORS)
@pytest.mark.parametrize("function", sorted((set(NVML_CALLS) | set(LIGHT_CALLS)) - {"nvmlInit"}))
def test_every_nvml_call_failing_while_the_monitor_samples_ends_it_in_words(function, error):
    """Fixed fields are read once, at the first sample, and the monitor's later reads are light
    (LIGHT_CALLS): a later failure of another call is never seen; one of these is met."""
    nvml = RecordedNvml(two_t4s())
    sampler = Sampler(NvmlSource(nvml=nvml), interval=0.001).start()
    try:
        nvml.fail(function, NVML_ERRORS[error], index=1 if function in DEVICE_CALLS else None)
        mark = len(nvml.calls)
        first = sampler.count
        assert sampler.wait(first + 2, timeout=5) or not sampler.running
        sampler.wait(first + 3, timeout=5)
        if sampler.error is not None:  # the GPU or NVML went away: said once, in words
            assert not sampler.running and sampler.error.count("\n") == 0
            assert_worded(sampler.error)
        else:  # a field became n/a: sampling goes on
            assert sampler.running and sampler.count >= first + 2
        assert (function in nvml.calls[mark:]) is (function in LIGHT_CALLS)
    finally:
        sampler.stop()


# --- imports that fail, CUDA that must not start: a fresh shell in a subprocess --------------------

SHELL_SESSION = r'''
import contextlib, io, json, os, sys, traceback
{setup}
from IPython.testing.globalipapp import start_ipython
from IPython.core.error import UsageError

shell = start_ipython()
before_load = set(sys.modules)  # IPython's test shell may import matplotlib itself
for formatter in shell.display_formatter.formatters.values():  # a notebook's: HTML, PNG too
    formatter.enabled = True
shell.run_line_magic("load_ext", "colab_gpu")
shell.run_line_magic("config", "GPUMagics.live_lines = 2")
shell.run_line_magic("config", "GPUMagics.live_interval = 0.1")
shell.user_ns.update(batch_size=4, model=[1, 2])
report = {{"runs": [], "heavy_after_load": sorted(
    name for name in set(sys.modules) - before_load if name in ("torch", "matplotlib", "ipywidgets", "pandas"))}}

def run(label, action):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            value = action()
            if value is not None:
                shell.display_formatter.format(value)
            outcome = "ok"
        except UsageError as error:
            outcome = "UsageError: " + str(error)
        except BaseException:
            outcome = "RAISED " + traceback.format_exc()
    report["runs"].append(dict(label=label, outcome=outcome, out=out.getvalue(), err=err.getvalue()))

import colab_gpu, colab_gpu.live
magic, cell = shell.run_line_magic, shell.run_cell_magic
steps = [
    ("%gpu_status", lambda: magic("gpu_status", "")),
    ("%gpu_status --json", lambda: magic("gpu_status", "--json")),
    ("%gpu_status --from", lambda: magic("gpu_status", "--from {t4}")),
    ("%gpu_status --live --demo --cells", lambda: magic("gpu_status", "--live --demo --cells")),
    ("a cell", lambda: shell.run_cell("x = 1")),
    ("%gpu_status --stop", lambda: magic("gpu_status", "--stop")),
    ("widgets", lambda: (magic("config", "GPUMagics.live_display = 'widgets'"),
                         magic("gpu_status", "--live --demo"), colab_gpu.live.stop(), None)[-1]),
    ("%alloc_conf", lambda: magic("alloc_conf", "")),
    ("%alloc_conf set", lambda: magic("alloc_conf", "max_split_size_mb=128")),
    ("%alloc_conf --check", lambda: magic("alloc_conf", "--check expandable_segments:True")),
    ("%alloc_conf --keys", lambda: magic("alloc_conf", "--keys")),
    ("%clear_cache", lambda: magic("clear_cache", "")),
    ("%clear_cache --vars", lambda: magic("clear_cache", "--vars")),
    ("%%find_batch", lambda: cell("find_batch", "-o --max 4", "y = [0] * batch_size")),
    ("status()", lambda: colab_gpu.status()),
    ("status(path)", lambda: colab_gpu.status("{t4}")),
    ("alloc_conf()", lambda: colab_gpu.alloc_conf()),
    ("clear_cache()", lambda: colab_gpu.clear_cache()),
    ("find_batch()", lambda: str(colab_gpu.find_batch(lambda size: [0] * size, max=4, progress=False))),
    ("history()", lambda: colab_gpu.history()),
    ("is_out_of_memory()", lambda: colab_gpu.is_out_of_memory(RuntimeError("CUDA out of memory."))),
    {extra}
]
for label, action in steps:
    run(label, action)
report["user_ns"] = sorted(name for name in ("batch_size", "model") if name in shell.user_ns)
{finish}
print("\nREPORT" + json.dumps(report))
'''


def start_session(setup="", extra="", finish="") -> subprocess.Popen:
    """Start running every magic and API entry point in a fresh IPython shell."""
    script = SHELL_SESSION.format(setup=setup, extra=extra, finish=finish, t4=T4)
    env = dict(os.environ, PYTHONPATH=str(ROOT), COLAB_GPU_CONFIG_DIR=os.environ["COLAB_GPU_CONFIG_DIR"])
    for name in list(env):
        if name.startswith(("PYTORCH_", "CUDA_", "COLAB_RELEASE", "KAGGLE_")):
            del env[name]
    return subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, cwd=str(ROOT))


def session_report(process: subprocess.Popen, timeout=300) -> dict:
    """What each entry point of a started session did."""
    stdout, stderr = process.communicate(timeout=timeout)
    line = next((line for line in stdout.splitlines() if line.startswith("REPORT")), None)
    assert line is not None, stdout[-3000:] + stderr[-3000:]
    return json.loads(line[len("REPORT"):])


@pytest.fixture(scope="module")
def sessions():
    """The fresh-shell sessions, started together (each spends seconds importing)."""
    started = {missing: start_session(setup=BLOCKED.format(name=missing)) for missing in OPTIONAL_PACKAGES}
    started["cuda"] = start_session(
        setup=RECORD_CUDA_CALLS.format(starters=CUDA_STARTERS),
        extra='("%%find_batch --device cpu", lambda: cell("find_batch", "--device cpu --max 4", '
              '"import torch\\ny = torch.zeros(batch_size)")),',
        finish='report["cuda_calls"] = cuda_calls; report["initialized"] = torch.cuda.is_initialized()')
    yield started
    for process in started.values():
        if process.poll() is None:
            process.kill()
            process.communicate()


def assert_no_harm(report: dict) -> None:
    """No traceback anywhere; a refusal is one UsageError line; no user variable lost."""
    for run in report["runs"]:
        text = run["outcome"] + run["out"] + run["err"]
        assert "Traceback" not in text and not run["outcome"].startswith("RAISED"), run
        if run["outcome"].startswith("UsageError"):
            assert "\n" not in run["outcome"], run
    assert report["user_ns"] == ["batch_size", "model"]


BLOCKED = r'''
class Blocked:
    """A meta-path finder that makes `import {name}` fail as if it were not installed."""
    def find_spec(self, fullname, path=None, target=None):
        if fullname == "{name}" or fullname.startswith("{name}."):
            raise ModuleNotFoundError(f"No module named {{fullname!r}}", name=fullname)
sys.meta_path.insert(0, Blocked())
'''


OPTIONAL_PACKAGES = ("torch", "ipywidgets", "matplotlib", "pandas")


@pytest.mark.parametrize("missing", OPTIONAL_PACKAGES)
def test_every_magic_and_api_without_an_optional_package(sessions, missing):
    report = session_report(sessions[missing])
    assert_no_harm(report)
    assert report["heavy_after_load"] == []  # import colab_gpu and %load_ext import none of them
    for run in report["runs"]:  # whoever needed it says, on one line, what to install
        text = run["out"] + run["err"] + run["outcome"]
        for line in text.splitlines():
            if missing in line and ("No module" in line or "could not be imported" in line or "needs" in line):
                assert f"pip install {missing}" in line, run
    if missing == "ipywidgets":
        (widgets,) = [run for run in report["runs"] if run["label"] == "widgets"]
        assert "pip install ipywidgets" in widgets["err"]
    if missing == "matplotlib":  # before: a traceback from the notebook's HTML formatter
        (stop,) = [run for run in report["runs"] if run["label"] == "%gpu_status --stop"]
        assert stop["outcome"] == "ok" and stop["out"].startswith("Live monitor stopped: ")


def test_the_run_without_matplotlib_shows_its_summary_and_says_what_the_chart_needs(monkeypatch):
    from colab_gpu import live

    live.start(demo=True, interval=0.1)
    try:
        live.running().wait(2, timeout=5)
    finally:
        record = live.stop()
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    html = record._repr_html_().replace("&nbsp;", " ")  # a number held to its unit reads as one space
    assert "pip install matplotlib" in html and record.headline() in html and "<img" not in html


BROKEN_MATPLOTLIB_CHARTS = r'''
import html, json, sys
from colab_gpu import find_batch, live

live.start(demo=True, interval=0.1)
try:
    live.running().wait(2, timeout=5)
finally:
    record = live.stop()
shown = {"stop": html.unescape(record._repr_html_()).replace("\xa0", " "), "headline": record.headline(),
         "find_batch": find_batch(lambda size: [0] * size, max=4, progress=False)._repr_html_()}
print("REPORT" + json.dumps(shown))
'''


def test_a_matplotlib_that_fails_to_import_leaves_the_summaries_and_says_why():
    """matplotlib installed but raising at import (here a mistyped MPLBACKEND, as a NumPy it was
    not built for does with pandas' ValueError): before, the notebook's HTML formatter showed a
    ValueError traceback under %gpu_status --stop and under %%find_batch's report."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), MPLBACKEND="agg-typo")
    done = subprocess.run([sys.executable, "-c", BROKEN_MATPLOTLIB_CHARTS], capture_output=True,
                          text=True, env=env, cwd=str(ROOT), timeout=120)
    line = next((line for line in done.stdout.splitlines() if line.startswith("REPORT")), None)
    assert line is not None, done.stdout[-3000:] + done.stderr[-3000:]
    shown = json.loads(line[len("REPORT"):])
    assert shown["headline"] in shown["stop"] and "<img" not in shown["stop"]
    assert "The chart could not be drawn: matplotlib failed to import (ValueError: Key backend: 'agg-typo'" \
        in shown["stop"]
    assert "batch_size = 4" in shown["find_batch"] and "<img" not in shown["find_batch"]


CUDA_STARTERS = ("mem_get_info", "device_count", "get_device_properties", "get_device_name",
                 "memory_stats", "memory_reserved", "memory_allocated", "max_memory_allocated",
                 "reset_peak_memory_stats", "empty_cache", "ipc_collect", "synchronize",
                 "set_device", "current_device", "get_rng_state_all", "set_rng_state_all", "_lazy_init")

RECORD_CUDA_CALLS = r'''
import torch
cuda_calls = []
def recorder(name):
    def called(*args, **kwargs):
        cuda_calls.append(name)
        raise RuntimeError(f"torch.cuda.{{name}} would start CUDA")
    return called
for name in {starters!r}:
    setattr(torch.cuda, name, recorder(name))
assert not torch.cuda.is_initialized()
'''


def test_no_magic_or_api_calls_a_cuda_function_before_cuda_started(sessions):
    """torch imported, CUDA not started: every entry point, and nothing that would start CUDA
    is called (each recorder raises too, so a call could not pass unnoticed)."""
    report = session_report(sessions["cuda"])
    assert_no_harm(report)
    assert report["cuda_calls"] == [] and report["initialized"] is False
    assert len(report["runs"]) >= 20


def cuda_calls_in_the_code() -> dict:
    """Every call of a torch.cuda function in colab_gpu/, by file and function: 'torch.cuda.x(',
    'cuda.x(' or 'torch.cuda.x.y('."""
    import ast

    found = {}
    for path in sorted((ROOT / "colab_gpu").rglob("*.py")):
        tree = ast.parse(path.read_text())
        for function in ast.walk(tree):
            if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(function):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                    text = ast.unparse(node.func)
                    if ".cuda." in f".{text}" and not text.endswith("is_initialized"):
                        found.setdefault(f"{path.relative_to(ROOT)}:{function.name}", set()).add(text)
    return found


# Why each function that calls torch.cuda cannot start CUDA: the guard it sits behind.
CUDA_GUARDS = {
    "colab_gpu/torch_view.py:torch_memory": "returns () unless torch.cuda.is_initialized()",
    "colab_gpu/cuda.py:cuda_devices_in_use": "called by empty_cuda_cache and _cuda_index, after their check",
    "colab_gpu/loader/__init__.py:resolve_device": "auto: current_device() only with the torch cuda_torch() "
                                                    "returned; an explicit device='cuda[:N]' is the user's request",
    "colab_gpu/doctor/device.py:_with_torch_cap": "returns at once unless runtime.cuda_torch() gives torch "
                                                  "(CUDA initialized)",
    "colab_gpu/doctor/explain.py:_default_device": "current_device() only with the torch runtime.cuda_torch() "
                                                   "returned: CUDA initialized",
    "colab_gpu/cuda.py:empty_cuda_cache": "returns at once unless CUDA is initialized",
    "colab_gpu/memory/rounding.py:_split_limit": "asked only for a storage on a CUDA device: CUDA already runs",
    "colab_gpu/live/cells.py:before": "only with the torch runtime.cuda_torch() returned: CUDA initialized",
    "colab_gpu/live/cells.py:_torch_line": "only with the torch runtime.cuda_torch() returned: CUDA initialized",
    "colab_gpu/cuda.py:visible_cuda_devices": "device_count() only after torch.cuda.is_initialized()",
    "colab_gpu/batch/state.py:__init__": "get_rng_state_all only if torch.cuda.is_initialized()",
    "colab_gpu/batch/state.py:restore": "set_rng_state_all only with a CUDA state saved while initialized; "
                                          "the generators reseeded only if cuda_torch() says CUDA started",
    "colab_gpu/batch/trial.py:_cuda_index": "returns None unless runtime.cuda_torch() gives torch (CUDA initialized)",
    "colab_gpu/batch/trial.py:run_trial": "synchronize only for the index _cuda_index gave (CUDA initialized)",
    "colab_gpu/batch/trial.py:release_memory": "only for the index _cuda_index gave (CUDA initialized)",
    "colab_gpu/batch/trial.py:_cuda_ooms": "returns 0 for no index; run_trial passes the one _cuda_index gave",
    "colab_gpu/batch/trial.py:reset": "a CudaGauge exists only for the index _cuda_index gave",
    "colab_gpu/batch/trial.py:peak": "a CudaGauge exists only for the index _cuda_index gave",
    "colab_gpu/batch/trial.py:capacity": "a CudaGauge exists only for the index _cuda_index gave",
    "colab_gpu/batch/trial.py:label": "a CudaGauge exists only for the index _cuda_index gave",
    "colab_gpu/distributed/rank.py:_run": "in a forked rank, never the kernel: set_device(rank) for NCCL",
    "colab_gpu/distributed/launcher.py:run_here": "only in a process that is already a rank (torchrun's "
                                                  "RANK and WORLD_SIZE), which torchrun started for its GPU",
}


def test_every_cuda_call_in_the_code_is_behind_a_known_guard():
    """A new torch.cuda call must be added here with the guard that keeps CUDA from starting."""
    found = cuda_calls_in_the_code()
    assert found, "the scan finds the calls"
    unknown = sorted(set(found) - set(CUDA_GUARDS))
    assert not unknown, {name: found[name] for name in unknown}


# --- bad input: one UsageError line, nothing changed -------------------------------------------

from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402
from IPython.core.error import UsageError  # noqa: E402


@pytest.mark.parametrize("line, message", [
    ("--device ''", "--device '': use auto, cpu, cuda or cuda:N"),  # before: taken for auto
    ("--device cuda:\u0661", "--device 'cuda:\u0661': use auto, cpu, cuda or cuda:N"),  # before: cuda:1
    ("--var def", "--var 'def': give a Python variable name, like batch_size or bs"),
])
def test_find_batch_refuses_what_it_took_or_hinted_at_before(shell, capsys, line, message):
    shell.user_ns["batch_size"] = 3
    shell.user_ns.pop("y", None)
    with pytest.raises(UsageError) as refused:
        shell.run_cell_magic("find_batch", line, "y = [0] * batch_size")
    assert str(refused.value) == message
    assert capsys.readouterr().err == ""  # before, --var def first printed "the cell never mentions def"
    assert shell.user_ns["batch_size"] == 3 and "y" not in shell.user_ns


@pytest.mark.parametrize("line", ["max_split_size_mb=\u0661\u0662\u0668", "--check max_split_size_mb:\u0661\u0662\u0668",
                                  "roundup_power2_divisions=[\u0662\u0665\u0666:1]"])
def test_alloc_conf_refuses_digits_torch_cannot_read(shell, line):
    """Python reads "١٢٨" as 128; torch's parser does not: --check said it would accept it."""
    before = {name: os.environ.get(name) for name in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")}
    with pytest.raises(UsageError) as refused:
        shell.run_line_magic("alloc_conf", line)
    assert "\n" not in str(refused.value)
    assert {name: os.environ.get(name) for name in before} == before


MAGIC_LINES = st.lists(st.one_of(
    st.sampled_from(["--json", "--live", "--stop", "--interval", "--demo", "--cells", "--from", "--unset",
                     "--reset", "--check", "--preset", "--save", "--forget", "--keys", "--history",
                     "--vars", "--quiet", "-1", "0", "nan", "''", "=", ":", ",", "max_split_size_mb=64"]),
    st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\n\r\x00"),
            max_size=12)), max_size=4).map(" ".join)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(magic=st.sampled_from(["alloc_conf", "clear_cache"]), line=MAGIC_LINES)
def test_fuzzed_lines_either_run_or_are_one_usage_error_line_and_change_nothing(shell, capsys, magic, line):
    if "--save" in line or "--forget" in line:
        line = line.replace("--save", "").replace("--forget", "")  # no writes to the config dir
    shell.user_ns.update(model=[1], data=[2])
    before = {name: os.environ.get(name) for name in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")}
    try:
        shell.run_line_magic(magic, line)
    except UsageError as refused:
        assert "\n" not in str(refused) and str(refused)
        assert {name: os.environ.get(name) for name in before} == before
    captured = capsys.readouterr()
    assert "Traceback" not in captured.out + captured.err
    for name in ("model", "data"):  # %clear_cache deletes only the names it is given
        if name not in line.split():
            assert name in shell.user_ns
    for name in before:
        os.environ.pop(name, None)


# --- variables: none deleted or rebound unless asked ---------------------------------------------


def user_variables(shell) -> dict:
    hidden = set(shell.user_ns_hidden) | {"_", "__", "___", "_i", "_ii", "_iii", "_oh", "_dh", "Out", "In"}
    return {name: value for name, value in shell.user_ns.items()
            if not name.startswith("_") and name not in hidden}


@pytest.mark.parametrize("ending, answered", [
    ("raise ValueError('a bug')", False),  # the user's error: batch_size stays as it was
    ("raise KeyboardInterrupt", True),  # Ctrl-C: the best size so far
    ("raise MemoryError()", True),  # out of memory from 16 on: the largest that fitted
])
def test_find_batch_rebinds_only_its_variable_however_the_search_ends(shell, ending, answered):
    # Not `cfg`: IPython 7.34's %config evaluates its line with the user's namespace as locals.
    shell.run_cell("batch_size = 3; kept = [1, 2]; x = 'the user\\'s x'; hparams = {'lr': 0.1}")
    before = user_variables(shell)
    shell.run_cell(f"%%find_batch --max 64\nx = [0] * batch_size\nif batch_size >= 16:\n    {ending}\n")
    after = user_variables(shell)
    assert after.keys() == before.keys()
    assert all(after[name] is before[name] for name in before if name != "batch_size")
    if answered:  # a size that ran
        assert 2 <= after["batch_size"] < 16
    else:
        assert after["batch_size"] is before["batch_size"]


def test_clear_cache_without_options_deletes_or_rebinds_no_variable(shell, capsys):
    shell.run_cell("import torch; model = torch.nn.Linear(4, 4); kept = torch.zeros(1000); n = 3")
    shell.run_cell("kept")  # an output-history entry holding a tensor: the history may go, not the name
    before = user_variables(shell)
    shell.run_line_magic("clear_cache", "")
    after = user_variables(shell)
    assert after.keys() == before.keys() and all(after[name] is before[name] for name in before)


# --- old and deprecated pynvml modules -----------------------------------------------------------

# What nvidia-ml-py (or the old `pynvml` package, 8.x-11.x) added late: an old module lacks them.
LATE_NAMES = ("nvmlMemory_v2", "nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetMigMode",
              "NVML_DEVICE_MIG_ENABLE", "nvmlSystemGetCudaDriverVersion", "nvmlDeviceGetMaxPcieLinkGeneration")


def old_pynvml_module(nvml: RecordedNvml):
    """A `pynvml` module as an old release ships it: bytes names, and none of LATE_NAMES."""
    import types

    module = types.ModuleType("pynvml")
    for name in dir(nvml):
        if name.startswith(("nvml", "NVML")) and name not in LATE_NAMES:
            setattr(module, name, getattr(nvml, name))
    assert not any(hasattr(module, name) for name in LATE_NAMES)
    return module


def test_an_old_pynvml_module_still_gives_the_card(shell, capsys, monkeypatch):
    nvml = RecordedNvml(two_t4s(), names_as_bytes=True)
    monkeypatch.setitem(sys.modules, "pynvml", old_pynvml_module(nvml))
    monkeypatch.setattr(session, "default_source", NvmlSource())  # the real `import pynvml`
    shell.run_line_magic("gpu_status", "")
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    assert "Traceback" not in captured.out + captured.err
    assert "GPU 0  Tesla T4  (cuda:0, compute capability 7.5)" in lines
    assert "GPU 1  Tesla T4  (cuda:1, compute capability 7.5)" in lines
    assert "Driver 515.105.01" in captured.out  # the CUDA driver version is n/a, not an error
    assert sum("13.61 GiB free" in line for line in lines) == 2  # memory through v1
    assert "nvmlDeviceGetCurrentClocksThrottleReasons" in nvml.calls


def test_the_deprecated_pynvml_package_that_warns_on_import_still_gives_the_card(shell, capsys, monkeypatch):
    """pynvml 12+ is a shim over nvidia-ml-py that warns (FutureWarning) when imported."""
    import types
    import warnings

    nvml = RecordedNvml(two_t4s())

    class DeprecatedPackage(types.ModuleType):
        def __getattr__(self, name):
            return getattr(nvml, name)

    monkeypatch.delitem(sys.modules, "pynvml")

    class Finder:
        def find_spec(self, fullname, path=None, target=None):
            if fullname != "pynvml":
                return None
            import importlib.util

            class Loader:
                def create_module(self, spec):
                    return DeprecatedPackage("pynvml")

                def exec_module(self, module):
                    warnings.warn("The pynvml package is deprecated. Please install nvidia-ml-py instead.",
                                  FutureWarning, stacklevel=2)

            return importlib.util.spec_from_loader("pynvml", Loader())

    finder = Finder()
    monkeypatch.setattr(sys, "meta_path", [finder] + sys.meta_path)
    monkeypatch.setattr(session, "default_source", NvmlSource())
    with warnings.catch_warnings():  # the shim's warning is not the user's to act on: another
        warnings.simplefilter("error")  # tool pulled it in, and nvidia-ml-py is already there
        shell.run_line_magic("gpu_status", "")
    captured = capsys.readouterr()
    assert "Traceback" not in captured.out + captured.err
    assert "GPU 1  Tesla T4  (cuda:1, compute capability 7.5)" in captured.out.splitlines()
