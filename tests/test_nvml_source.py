"""NvmlSource against a pynvml stand-in that answers from real recordings and raises pynvml's
own exception classes: values come through field by field, failures become words."""
from __future__ import annotations

import dataclasses
import importlib.abc
import sys
import threading
import warnings

import pynvml
import pytest

import colab_gpu
import colab_gpu.devices
import colab_gpu.devices.nvml as nvml_module
from colab_gpu.devices.nvml import NO_PYNVML, NvmlSource, decode_clock_event_reasons, describe_nvml_error
from colab_gpu.devices.replay import ReplaySource
from colab_gpu.state import session

from conftest import DATA
from nvml_recording import COMPUTE_CAPABILITY, RecordedNvml

T4 = DATA / "nvidia-smi-xml" / "tesla-t4.xml"
A100 = DATA / "nvidia-smi-xml" / "a100-sxm4-v12.xml"
GTX1660 = DATA / "nvidia-smi-xml" / "gtx-1660-ti.xml"
EIGHT_GPUS = DATA / "nvidia-smi-csv" / "8gpu-training_nanogpt-pr643.csv"

# The failures the issue names, as pynvml raises them: NVMLError(code) returns the subclass.
INIT_FAILURES = {
    "NVMLError_LibraryNotFound": pynvml.NVML_ERROR_LIBRARY_NOT_FOUND,
    "NVMLError_DriverNotLoaded": pynvml.NVML_ERROR_DRIVER_NOT_LOADED,
    "NVMLError_LibRmVersionMismatch": pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH,
    "NVMLError_NoPermission": pynvml.NVML_ERROR_NO_PERMISSION,
}


def recorded_gpus(path):
    """The GPUs of a recording as NVML reports them: it knows the compute capability, and lists
    compute processes before graphics ones."""
    def as_nvml(gpu):
        processes = gpu.processes and tuple(sorted(gpu.processes, key=lambda p: p.kind != "compute"))
        return dataclasses.replace(gpu, compute_capability=COMPUTE_CAPABILITY.get(gpu.name), processes=processes)

    return tuple(as_nvml(gpu) for gpu in ReplaySource(path).snapshot().gpus)


@pytest.mark.parametrize("path", [T4, A100], ids=["tesla-t4", "a100-sxm4"])
@pytest.mark.parametrize("names_as_bytes", [False, True], ids=["str-names", "bytes-names"])
def test_every_field_of_the_recording_comes_through(path, names_as_bytes):
    nvml = RecordedNvml.from_recording(path, names_as_bytes=names_as_bytes)
    snapshot = NvmlSource(nvml=nvml).snapshot()
    recording = ReplaySource(path).snapshot()
    assert snapshot.ok and snapshot.source == "NVML"
    assert (snapshot.driver_version, snapshot.cuda_driver_version) == (
        recording.driver_version, recording.cuda_driver_version)
    assert snapshot.gpus == recorded_gpus(path)  # every field, processes and their names included


def test_tesla_t4_values_in_nvml_units():
    (gpu,) = NvmlSource(nvml=RecordedNvml.from_recording(T4)).snapshot().gpus
    assert (gpu.name, gpu.compute_capability, gpu.memory_reserved, gpu.power_draw, gpu.power_limit) == (
        "Tesla T4", (7, 5), 388 * 2**20, 26.78, 70.0)
    assert [(p.pid, p.kind, p.name) for p in gpu.processes] == [
        (5762, "compute", "python"), (675, "graphics", "/usr/lib/xorg/Xorg")]


def test_all_eight_gpus_of_a_server_are_listed():
    # The A100 XML holds one <gpu> (attached_gpus says 4); the nanoGPT log records 8 GPUs.
    nvml = RecordedNvml.from_recording(EIGHT_GPUS)
    snapshot = NvmlSource(nvml=nvml).snapshot()
    assert [gpu.index for gpu in snapshot.gpus] == list(range(8))
    assert [gpu.power_draw for gpu in snapshot.gpus] == [gpu.power_draw for gpu in recorded_gpus(EIGHT_GPUS)]
    # The log has no memory columns: NVML's NOT_SUPPORTED for them is n/a, not an error.
    assert all(gpu.memory_total is None and gpu.error is None for gpu in snapshot.gpus)
    assert snapshot.driver_version is None


@pytest.mark.parametrize("name", INIT_FAILURES)
def test_init_failures_become_the_snapshot_problem(name, monkeypatch):
    monkeypatch.setattr(nvml_module, "driver_loaded", lambda: False)
    code = INIT_FAILURES[name]
    assert type(pynvml.NVMLError(code)).__name__ == name  # the real class, made as pynvml makes it
    nvml = RecordedNvml.from_recording(T4).fail("nvmlInit", code)
    snapshot = NvmlSource(nvml=nvml).snapshot()
    assert snapshot.problem == describe_nvml_error(pynvml.NVMLError(code))
    assert not snapshot.problem.startswith("NVML error")  # a sentence, not a class name
    assert snapshot.gpus == () and "nvmlDeviceGetCount" not in nvml.calls


def test_a_loaded_driver_without_its_nvml_library_is_not_called_missing(monkeypatch):
    """A container started without the driver's utility libraries, or WSL with /usr/lib/wsl/lib
    off the loader's path: the GPU is there, so "no NVIDIA driver is installed" was false."""
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setattr(nvml_module, "driver_loaded", lambda: True)
    nvml = RecordedNvml.from_recording(T4).fail("nvmlInit", pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    problem = NvmlSource(nvml=nvml).snapshot().problem
    assert "no NVIDIA driver is installed" not in problem
    assert "driver is loaded" in problem and "libnvidia-ml.so.1" in problem and "--gpus all" in problem


def test_missing_pynvml_module_is_a_problem(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` raises ImportError
    monkeypatch.setattr(nvml_module, "nvidia_driver_present", lambda: True)
    assert NvmlSource().snapshot().problem == NO_PYNVML


def test_missing_pynvml_without_a_driver_says_there_is_no_driver(monkeypatch):
    """Colab's CPU runtime has neither: "pip install nvidia-ml-py" would not give it a GPU."""
    monkeypatch.setitem(sys.modules, "pynvml", None)
    monkeypatch.setattr(nvml_module, "nvidia_driver_present", lambda: False, raising=False)
    problem = NvmlSource().snapshot().problem
    assert "pip install" not in problem and "no NVIDIA driver is installed here" in problem


@pytest.fixture
def driver_probe():
    """nvidia_driver_present() asked anew: it keeps its answer for the process."""
    nvml_module.nvidia_driver_present.cache_clear()
    yield nvml_module.nvidia_driver_present
    nvml_module.nvidia_driver_present.cache_clear()


def test_a_mac_has_no_nvidia_driver(monkeypatch, driver_probe):
    """On a Mac without pynvml the card said "pip install nvidia-ml-py", which reads no GPU
    there either, and the advice kept quiet about there being none."""
    monkeypatch.setattr(sys, "platform", "darwin")
    monkeypatch.setitem(sys.modules, "pynvml", None)
    assert driver_probe() is False
    status = colab_gpu.status(NvmlSource())
    assert "pip install" not in status.snapshot.problem
    assert "no NVIDIA driver is installed here" in status.snapshot.problem
    assert "no_gpu_found" in [advice.rule for advice in status.advice]


@pytest.mark.parametrize("folder", [None, ("WINDIR", "System32"), ("ProgramFiles", "NVIDIA Corporation/NVSMI")],
                         ids=["no-driver", "dch-driver", "nvsmi"])
def test_a_windows_driver_is_told_by_its_nvml_dll(monkeypatch, tmp_path, driver_probe, folder):
    """Where pynvml loads nvml.dll from: a Windows laptop without an NVIDIA driver was told to
    pip install nvidia-ml-py; one with the driver but no pynvml still is."""
    monkeypatch.setattr(sys, "platform", "win32")
    monkeypatch.setitem(sys.modules, "pynvml", None)
    monkeypatch.setenv("WINDIR", str(tmp_path / "Windows"))
    monkeypatch.setenv("ProgramFiles", str(tmp_path / "Program Files"))
    if folder is not None:
        variable, under = folder
        dll = tmp_path / ("Windows" if variable == "WINDIR" else "Program Files") / under / "nvml.dll"
        dll.parent.mkdir(parents=True)
        dll.write_bytes(b"")
    assert driver_probe() is (folder is not None)
    problem = NvmlSource().snapshot().problem
    assert (problem == NO_PYNVML) is (folder is not None)
    assert ("no NVIDIA driver is installed here: nvml.dll was not found" == problem) is (folder is None)


@pytest.mark.parametrize("platform, library", [("win32", "nvml.dll"), ("darwin", "macOS"),
                                               ("linux", "libnvidia-ml.so")])
def test_no_driver_names_the_library_missing_on_this_platform(monkeypatch, platform, library):
    """pynvml installed, no NVIDIA driver: a Windows laptop was told that libnvidia-ml.so, a
    Linux file, was not found; pynvml looks for nvml.dll there, and a Mac has no NVML at all."""
    monkeypatch.setattr(sys, "platform", platform)
    monkeypatch.setattr(nvml_module, "driver_loaded", lambda: False)
    nvml = RecordedNvml.from_recording(T4).fail("nvmlInit", pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    status = colab_gpu.status(NvmlSource(nvml=nvml))
    assert status.snapshot.problem.startswith("no NVIDIA driver is installed here: ")
    assert library in status.snapshot.problem
    assert ("libnvidia-ml.so" in status.snapshot.problem) is (platform == "linux")
    assert len(f"No GPU read: {status.snapshot.problem}") <= 80  # one line of the card
    assert "no_gpu_found" in [advice.rule for advice in status.advice]


class _DeprecatedPynvmlFinder(importlib.abc.MetaPathFinder):
    """What the deprecated ``pynvml`` package (12+, pulled in by other tools) installs through a
    .pth file next to nvidia-ml-py: a FutureWarning at ``import pynvml``, the module found as usual."""

    def find_spec(self, name, path=None, target=None):
        if name.startswith("pynvml"):
            warnings.warn("The pynvml package is deprecated. Please install nvidia-ml-py instead. If you "
                          "did not install pynvml directly, please report this to the maintainers of the "
                          "package that installed pynvml for you.", FutureWarning, stacklevel=2)
        return None


def test_the_deprecated_pynvml_package_neither_warns_nor_raises(monkeypatch):
    """Where the deprecated pynvml package sits next to nvidia-ml-py, the first ``import pynvml``
    warned: the notebook showed a FutureWarning it cannot act on above the first card, and under
    ``python -W error`` (or pytest's filterwarnings = error) ``status()`` raised it."""
    monkeypatch.delitem(sys.modules, "pynvml")
    monkeypatch.setattr(sys, "meta_path", [_DeprecatedPynvmlFinder(), *sys.meta_path])
    source = NvmlSource()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        snapshot = source.snapshot()
    source.close()
    assert isinstance(snapshot, colab_gpu.devices.Snapshot)
    assert snapshot.problem != NO_PYNVML


def test_device_count_failure_is_a_problem():
    nvml = RecordedNvml.from_recording(T4).fail("nvmlDeviceGetCount", pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    assert NvmlSource(nvml=nvml).snapshot().problem.startswith("the NVIDIA driver is not loaded")


def test_a_lost_gpu_is_marked_and_the_others_still_read():
    nvml = RecordedNvml.from_recording(EIGHT_GPUS).fail("nvmlDeviceGetHandleByIndex", pynvml.NVML_ERROR_GPU_IS_LOST, index=3)
    gpus = NvmlSource(nvml=nvml).snapshot().gpus
    assert gpus[3].error.startswith("a GPU fell off the bus")
    assert [gpu.error for gpu in gpus[:3] + gpus[4:]] == [None] * 7
    assert gpus[4].power_draw == recorded_gpus(EIGHT_GPUS)[4].power_draw


def test_a_gpu_lost_in_the_middle_of_a_read_is_marked_lost_not_n_a():
    nvml = RecordedNvml.from_recording(T4).fail("nvmlDeviceGetMemoryInfo", pynvml.NVML_ERROR_GPU_IS_LOST)
    (gpu,) = NvmlSource(nvml=nvml).snapshot().gpus
    assert gpu.error.startswith("a GPU fell off the bus")
    assert gpu.name == "Tesla T4"


@pytest.mark.parametrize("function, fields", [
    ("nvmlDeviceGetPowerUsage", ["power_draw"]),
    ("nvmlDeviceGetEnforcedPowerLimit", ["power_limit"]),
    ("nvmlDeviceGetUtilizationRates", ["utilization_gpu", "utilization_memory"]),
    ("nvmlDeviceGetTemperature", ["temperature"]),
    ("nvmlDeviceGetCudaComputeCapability", ["compute_capability"]),
    ("nvmlDeviceGetCurrPcieLinkWidth", ["pcie_width"]),
    ("nvmlDeviceGetUUID", ["uuid"]),
])
@pytest.mark.parametrize("code", [pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_NO_PERMISSION,
                                  pynvml.NVML_ERROR_FUNCTION_NOT_FOUND])
def test_a_field_that_fails_is_n_a_and_the_rest_is_read(function, fields, code):
    nvml = RecordedNvml.from_recording(T4).fail(function, code)
    (gpu,) = NvmlSource(nvml=nvml).snapshot().gpus
    (expected,) = recorded_gpus(T4)
    assert [getattr(gpu, field) for field in fields] == [None] * len(fields) and gpu.error is None
    assert dataclasses.replace(gpu, **{field: getattr(expected, field) for field in fields}) == expected


def test_processes_not_readable_are_n_a():
    nvml = (RecordedNvml.from_recording(T4)
            .fail("nvmlDeviceGetComputeRunningProcesses", pynvml.NVML_ERROR_NO_PERMISSION)
            .fail("nvmlDeviceGetGraphicsRunningProcesses", pynvml.NVML_ERROR_NO_PERMISSION))
    (gpu,) = NvmlSource(nvml=nvml).snapshot().gpus
    assert gpu.processes is None  # NVML answered for neither kind: unknown, not "none"
    assert gpu.memory_used == 1032 * 2**20


def test_fixed_fields_are_read_once_while_nvml_is_up():
    """A live chart snapshots every second: what cannot change is not asked again, and a new
    NVML session (after close) asks again."""
    nvml = RecordedNvml.from_recording(A100)
    source = NvmlSource(nvml=nvml)
    first = source.snapshot()
    after_first = list(nvml.calls)
    second = source.snapshot()
    assert first.gpus == second.gpus == recorded_gpus(A100)
    assert second.driver_version == first.driver_version is not None
    for fixed in ("nvmlDeviceGetHandleByIndex", "nvmlDeviceGetName", "nvmlDeviceGetUUID",
                  "nvmlDeviceGetPciInfo", "nvmlDeviceGetMaxClockInfo", "nvmlSystemGetDriverVersion"):
        assert after_first.count(fixed) >= 1 and nvml.calls.count(fixed) == after_first.count(fixed), fixed
    for changing in ("nvmlDeviceGetUtilizationRates", "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetClockInfo"):
        assert nvml.calls.count(changing) == 2 * after_first.count(changing) >= 2, changing
    source.close()
    source.snapshot()
    assert nvml.calls.count("nvmlDeviceGetUUID") == 2 * after_first.count("nvmlDeviceGetUUID")


def test_a_field_the_gpu_lacks_is_asked_once():
    """A T4 has no MIG mode and the 8-GPU log's driver no version: NVML's NotSupported is an
    answer for good, kept like a value, so a live chart does not ask again every second."""
    for path, lacking in ((T4, "nvmlDeviceGetMigMode"), (EIGHT_GPUS, "nvmlSystemGetDriverVersion")):
        nvml = RecordedNvml.from_recording(path)
        source = NvmlSource(nvml=nvml)
        source.snapshot()
        asked = nvml.calls.count(lacking)
        source.snapshot()
        assert nvml.calls.count(lacking) == asked >= 1, lacking


def test_a_driver_that_failed_once_is_asked_again(shell, capsys, live):
    """A driver busy at the first %gpu_status (a timeout, an unknown error) answers later: the
    card kept "unknown GPU", no UUID, no compute capability (so no fp16 advice) and no driver
    version for the rest of the process."""
    nvml = live(RecordedNvml.from_recording(T4).fail("nvmlInit", pynvml.NVML_ERROR_TIMEOUT))
    assert "No GPU read: the NVIDIA driver timed out" in run_status(shell, capsys)
    nvml._failures.clear()
    for function in ("nvmlDeviceGetName", "nvmlDeviceGetUUID", "nvmlDeviceGetCudaComputeCapability",
                     "nvmlSystemGetDriverVersion", "nvmlDeviceGetMaxClockInfo"):
        nvml.fail(function, pynvml.NVML_ERROR_TIMEOUT)
    first = run_status(shell, capsys)
    assert "unknown GPU" in first and "fp16" not in first
    nvml._failures.clear()
    text = run_status(shell, capsys)
    assert "unknown GPU" not in text and "Tesla T4" in text and "fp16" in text
    assert "515.105.01" in text and "GPU-d37e67a5" in text
    status = colab_gpu.status()
    assert status.snapshot.driver_version == "515.105.01" and status.gpus[0].sm_clock_max == 1590


def test_both_cards_show_cuda_visible_devices_of_this_machine_only(monkeypatch):
    """The HTML card (what a notebook shows) left it out; a recording's card showed this machine's."""
    from IPython.lib.pretty import pretty

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    live = colab_gpu.status(NvmlSource(nvml=RecordedNvml.from_recording(T4)))
    assert "CUDA_VISIBLE_DEVICES='0'" in pretty(live) and "CUDA_VISIBLE_DEVICES=&#x27;0&#x27;" in live._repr_html_()
    recorded = colab_gpu.status(T4)
    assert "CUDA_VISIBLE_DEVICES" not in pretty(recorded) + recorded._repr_html_()


def test_driver_without_memory_info_v2_falls_back_to_v1():
    nvml = RecordedNvml.from_recording(T4, memory_v2=False)
    (gpu,) = NvmlSource(nvml=nvml).snapshot().gpus
    assert gpu.memory_reserved is None
    assert gpu.memory_used == (15360 - 13939) * 2**20  # v1's "used" includes the driver's reserve
    assert nvml.calls.count("nvmlDeviceGetMemoryInfo") == 2


def test_deprecated_throttle_reasons_used_when_clock_event_reasons_is_missing():
    nvml = RecordedNvml.from_recording(GTX1660, clocks_event_reasons=False)
    (gpu,) = NvmlSource(nvml=nvml).snapshot().gpus
    assert gpu.clock_event_reasons == ("idle",)
    assert "nvmlDeviceGetCurrentClocksThrottleReasons" in nvml.calls


def test_clock_event_reasons_decoded_into_words():
    assert decode_clock_event_reasons(0) == ()
    assert decode_clock_event_reasons(0x1 | 0x4 | 0x40) == ("idle", "power cap", "thermal (hardware)")
    assert decode_clock_event_reasons(0x1FF) == (
        "idle", "application clock setting", "power cap", "hardware slowdown", "sync boost",
        "thermal (software)", "thermal (hardware)", "power brake", "display clock setting")


def test_close_is_idempotent_and_the_source_reopens():
    nvml = RecordedNvml.from_recording(T4)
    source = NvmlSource(nvml=nvml)
    source.close()  # before any snapshot: nothing to shut down
    assert nvml.shutdowns == 0 and "nvmlShutdown" not in nvml.calls
    source.snapshot()
    source.close()
    source.close()
    assert nvml.shutdowns == 1 and not nvml.initialized
    assert source.snapshot().gpus[0].name == "Tesla T4"  # initialized again


def test_close_waits_for_a_call_in_flight():
    nvml = RecordedNvml.from_recording(T4)
    source = NvmlSource(nvml=nvml)
    gate = nvml.hold("nvmlDeviceGetPowerUsage")
    results = []
    reader = threading.Thread(target=lambda: results.append(source.snapshot()))
    reader.start()
    assert gate.entered.wait(5)
    closer = threading.Thread(target=source.close)
    closer.start()
    closer.join(0.2)
    assert closer.is_alive() and nvml.shutdowns == 0  # shutting NVML down now would be a use-after-free
    gate.release.set()
    reader.join(5)
    closer.join(5)
    assert nvml.shutdowns == 1 and nvml.calls[-1] == "nvmlShutdown"
    assert results[0].gpus[0].power_draw == 26.78


# --- %gpu_status in the real shell ----------------------------------------------------


@pytest.fixture
def live(monkeypatch):
    """Point %gpu_status's live source at NvmlSource over a stand-in; returns a setter."""
    def use(nvml):
        monkeypatch.setattr(session, "default_source", NvmlSource(nvml=nvml))
        return nvml

    return use


def run_status(shell, capsys, line=""):
    shell.run_line_magic("gpu_status", line)
    captured = capsys.readouterr()
    assert "Traceback" not in captured.out + captured.err
    return captured.out + captured.err


@pytest.mark.parametrize("name", INIT_FAILURES)
def test_gpu_status_shows_an_init_failure_as_one_line(shell, capsys, live, name):
    live(RecordedNvml.from_recording(T4).fail("nvmlInit", INIT_FAILURES[name]))
    text = run_status(shell, capsys)
    line = describe_nvml_error(pynvml.NVMLError(INIT_FAILURES[name]))
    assert f"No GPU read: {line}" in text.splitlines()
    assert "torch" in text.splitlines()[0]  # the runtime line is still shown


def test_gpu_status_without_pynvml(shell, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    monkeypatch.setattr(nvml_module, "nvidia_driver_present", lambda: True)
    monkeypatch.setattr(session, "default_source", NvmlSource())
    text = run_status(shell, capsys)
    assert f"No GPU read: {NO_PYNVML}" in text.splitlines()


@pytest.mark.parametrize("platform", [{}, {"KAGGLE_KERNEL_RUN_TYPE": "Interactive"}], ids=["local", "kaggle"])
def test_a_driver_the_card_says_is_here_is_not_called_no_gpu(shell, capsys, live, monkeypatch, clean_env, platform):
    """The card's line says a driver is here (pynvml missing, no permission, a driver updated
    but not reloaded): the advice said "No NVIDIA GPU found: torch will run on the CPU" (on
    Kaggle, "has no GPU: Settings > Accelerator"). Where there is no driver, it still says so."""
    for name, value in platform.items():
        clean_env.setenv(name, value)
    no_gpu = ("No NVIDIA GPU found", "This Kaggle notebook has no GPU")
    monkeypatch.setattr(nvml_module, "nvidia_driver_present", lambda: True)
    monkeypatch.setitem(sys.modules, "pynvml", None)
    monkeypatch.setattr(session, "default_source", NvmlSource())
    text = run_status(shell, capsys)
    assert f"No GPU read: {NO_PYNVML}" in text.splitlines() and not any(words in text for words in no_gpu)
    for code in (pynvml.NVML_ERROR_NO_PERMISSION, pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH):
        live(RecordedNvml.from_recording(T4).fail("nvmlInit", code))
        text = run_status(shell, capsys)
        assert "No GPU read: " in text and not any(words in text for words in no_gpu), text
    live(RecordedNvml.from_recording(T4).fail("nvmlInit", pynvml.NVML_ERROR_DRIVER_NOT_LOADED))
    assert any(words in run_status(shell, capsys) for words in no_gpu)


def test_gpu_status_shows_the_lost_gpu_and_the_others(shell, capsys, live):
    live(RecordedNvml.from_recording(EIGHT_GPUS).fail("nvmlDeviceGetHandleByIndex", pynvml.NVML_ERROR_GPU_IS_LOST, index=2))
    lines = run_status(shell, capsys).splitlines()
    assert [line for line in lines if line.startswith("GPU 2 ")] == [
        f"GPU 2  unknown GPU: {describe_nvml_error(pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST))}"]
    assert sum(line.startswith("GPU ") for line in lines) == 8


def test_gpu_status_shows_unsupported_fields_as_n_a(shell, capsys, live):
    live(RecordedNvml.from_recording(T4)
         .fail("nvmlDeviceGetPowerUsage", pynvml.NVML_ERROR_NOT_SUPPORTED)
         .fail("nvmlDeviceGetMemoryInfo", pynvml.NVML_ERROR_FUNCTION_NOT_FOUND))
    text = run_status(shell, capsys)
    assert "  power       n/a of 70 W, temperature 40 °C, state P0" in text.splitlines()
    assert "memory      n/a used / n/a" in text
    assert "GPU 0  Tesla T4  (cuda:0, compute capability 7.5)" in text.splitlines()


def test_gpu_status_on_the_recorded_t4_names_the_fp16_advice(shell, capsys, live):
    live(RecordedNvml.from_recording(T4))
    text = run_status(shell, capsys)
    assert "GPU 0  Tesla T4" in text and "15.00 GiB" in text
    assert "fp16" in text  # the T4 rule fires on NVML's compute capability 7.5


@pytest.mark.parametrize("path, expected", [
    (T4, "GPU 0  Tesla T4  "),
    (DATA / "nvidia-smi-csv" / "v100s-pcie-32gb_miris.csv", "GPU 0  Tesla V100S-PCIE-32GB  "),
])
def test_gpu_status_from_a_recording(shell, capsys, path, expected):
    text = run_status(shell, capsys, f"--from {path}")
    assert any(line.startswith(expected) for line in text.splitlines())
    assert f"Source: replay of {path.name}" in text.splitlines()


@pytest.mark.parametrize("content, expected", [
    # no file at all is a UsageError, no card: test_replay_hostile.py
    (b"<nvidia_smi_log><gpu>", "it is not well-formed XML"),
])
def test_gpu_status_from_a_bad_file_is_one_line(shell, capsys, tmp_path, content, expected):
    path = tmp_path / "pasted.xml"
    path.write_bytes(content)
    text = run_status(shell, capsys, f"--from {path}")
    said = " ".join(text.split())  # folded at 80 columns: the path alone is 70 characters here
    assert said.count("No GPU read: ") == 1 and f"No GPU read: cannot replay {path}: " in said and expected in said
    assert "torch" in text.splitlines()[0]
