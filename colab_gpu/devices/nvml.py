"""The live source: NVML through the ``pynvml`` module of NVIDIA's ``nvidia-ml-py``.

NVML reads never create a CUDA context, so this source is safe before ``%alloc_conf``.
Every failure becomes words: a missing module or library, an unloaded driver or a lost GPU
is ``Snapshot.problem`` or ``GPU.error``; a field a device does not support is ``None``.
"""
from __future__ import annotations

import functools
import os
import sys
import threading
import warnings
from typing import Any, Callable, Dict, Optional, Tuple

from . import GPU, UNKNOWN_GPU, GPUProcess, MemoryFields, MigInstance, Snapshot

# nvml.h's clocks-event reason bits, in words a notebook user understands.
CLOCK_EVENT_REASONS = (
    (0x001, "idle"),
    (0x002, "application clock setting"),
    (0x004, "power cap"),
    (0x008, "hardware slowdown"),
    (0x010, "sync boost"),
    (0x020, "thermal (software)"),
    (0x040, "thermal (hardware)"),
    (0x080, "power brake"),
    (0x100, "display clock setting"),
)

# Why NVML could not start, by the pynvml exception class name (classes are made at import).
# At most 67 characters: "No GPU read: ..." stays one line of an 80-column terminal.
INIT_PROBLEMS = {
    "NVMLError_LibraryNotFound": "no NVIDIA driver is installed here: libnvidia-ml.so was not found",  # Linux's
    "NVMLError_DriverNotLoaded": "the NVIDIA driver is not loaded: no usable NVIDIA GPU here",
    "NVMLError_LibRmVersionMismatch": "the NVIDIA driver was updated but not reloaded: restart the machine",
    "NVMLError_NoPermission": "no permission to read the GPU through NVML",
    "NVMLError_GpuIsLost": "a GPU fell off the bus: restart the runtime or the machine",
    "NVMLError_FunctionNotFound": "the NVIDIA driver is too old for this NVML function",
    "NVMLError_Uninitialized": "NVML is not initialized",
    "NVMLError_NotSupported": "the NVIDIA driver does not support this read on this GPU",
    "NVMLError_Timeout": "the NVIDIA driver timed out: try again, or restart the machine",
    "NVMLError_Unknown": "the NVIDIA driver failed: try again, or restart the machine",
}

# NVMLError_LibraryNotFound off Linux: the file pynvml looks for there, or that there is none.
_LIBRARY_NOT_FOUND_ON = {
    "win": "no NVIDIA driver is installed here: nvml.dll was not found",
    "darwin": "no NVIDIA driver is installed here: NVML does not run on macOS",
}

NO_PYNVML = "the pynvml module is not installed: pip install nvidia-ml-py"


DRIVER_WITHOUT_NVML = ("the NVIDIA driver is loaded but its NVML library (libnvidia-ml.so.1) is not "
                       "on the loader's path: in a container, start it with the driver's utility "
                       "libraries (docker run --gpus all); on WSL, add /usr/lib/wsl/lib to LD_LIBRARY_PATH")


# Problems that say an NVIDIA driver is here and answered or is installed, so a GPU most
# likely is too, only unreadable now: "no GPU" advice would contradict the card's own line.
DRIVER_PRESENT_PROBLEMS = frozenset({NO_PYNVML, DRIVER_WITHOUT_NVML} | {
    problem for name, problem in INIT_PROBLEMS.items()
    if name not in ("NVMLError_LibraryNotFound", "NVMLError_DriverNotLoaded")})


def driver_loaded() -> bool:
    """The NVIDIA kernel module (Linux, containers too) or WSL's GPU bridge is there."""
    return os.path.exists("/proc/driver/nvidia") or os.path.exists("/dev/dxg")


def _windows_nvml_paths() -> Tuple[str, ...]:
    """Where pynvml loads nvml.dll from on Windows: System32 (DCH drivers), then NVSMI."""
    return (os.path.join(os.getenv("WINDIR", "C:/Windows"), "System32", "nvml.dll"),
            os.path.join(os.getenv("ProgramFiles", "C:/Program Files"), "NVIDIA Corporation", "NVSMI", "nvml.dll"))


@functools.lru_cache(maxsize=None)
def nvidia_driver_present() -> bool:
    """Whether this machine has an NVIDIA driver, where pynvml would find it: on Windows its
    nvml.dll; elsewhere loaded (see driver_loaded) or NVML's library on the loader's path,
    which macOS never has (NVML is made for Linux and Windows only)."""
    if sys.platform.startswith("win"):
        return any(os.path.exists(path) for path in _windows_nvml_paths())
    import ctypes.util

    return driver_loaded() or ctypes.util.find_library("nvidia-ml") is not None


# NVML's answers that a device or driver lacks a field for good, unlike a busy or failing driver
# (a timeout, an unknown error) that may answer the next call: only then is a fixed field's None kept.
_LASTING_ERRORS = frozenset({"NVMLError_NotSupported", "NVMLError_FunctionNotFound"})


def decode_clock_event_reasons(mask: int) -> Tuple[str, ...]:
    """Words for each bit set in an NVML clocks-event (throttle) reason mask."""
    return tuple(word for bit, word in CLOCK_EVENT_REASONS if mask & bit)


def describe_nvml_error(error: BaseException) -> str:
    """One line for an NVML exception, in words rather than a class name."""
    name = type(error).__name__
    if name == "NVMLError_LibraryNotFound":
        return _library_not_found()
    return INIT_PROBLEMS.get(name, f"NVML error: {error}")


def _library_not_found() -> str:
    """No NVIDIA driver, naming the library missing on this platform: a Windows user told that
    libnvidia-ml.so was not found would look for a Linux file."""
    return next((problem for prefix, problem in _LIBRARY_NOT_FOUND_ON.items() if sys.platform.startswith(prefix)),
                INIT_PROBLEMS["NVMLError_LibraryNotFound"])


def _is_lost(error: BaseException) -> bool:
    """A GPU that fell off the bus fails every call: the device is gone, not one field."""
    return type(error).__name__ == "NVMLError_GpuIsLost"


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlSource:
    """Reads every GPU through NVML. Initializes NVML once; ``close()`` shuts it down.

    What cannot change while NVML is up (a device's handle, name, UUID, bus, compute
    capability, maximum clocks and PCIe link, MIG mode, the driver's versions) is read once: a live
    chart samples every second, and on an H200 the two maximum-clock reads alone took 2.7 of
    a snapshot's 3.3 ms (0.10 ms without them). Once only where each read answered or said the
    field is not supported: a driver that failed or timed out is asked again next time.
    """

    label = "NVML"

    def __init__(self, nvml: Any = None):
        self._nvml = nvml  # injectable: tests pass a recording-backed stand-in
        self._started = False
        self._lock = threading.Lock()  # one NVML call sequence at a time; close waits for it
        self._versions: Optional[Tuple[Optional[str], Optional[str]]] = None  # driver, CUDA driver
        self._devices: Dict[int, Tuple[Any, str, Dict[str, Any]]] = {}  # index -> handle, name, fixed fields

    def _start(self) -> Optional[str]:
        """Import and initialize NVML; the problem in words if that fails."""
        if self._started:
            return None
        if self._nvml is None:
            try:
                with warnings.catch_warnings():
                    # The deprecated `pynvml` package (12+, which other tools pull in) warns at the
                    # first `import pynvml` even where nvidia-ml-py provides the module: a warning
                    # the user cannot act on, and an exception under `python -W error`.
                    warnings.filterwarnings("ignore", "The pynvml package is deprecated", FutureWarning)
                    import pynvml
            except ImportError:
                # Colab's CPU and TPU images lack both: installing pynvml there would not help.
                if not nvidia_driver_present():
                    return _library_not_found()
                return NO_PYNVML
            self._nvml = pynvml
        try:
            self._nvml.nvmlInit()
        except Exception as error:  # pynvml raises NVMLError subclasses; OSError from ctypes
            if type(error).__name__ == "NVMLError_LibraryNotFound" and sys.platform.startswith("linux") \
                    and driver_loaded():
                return DRIVER_WITHOUT_NVML  # "no driver installed" would be false here
            return describe_nvml_error(error)
        self._started = True
        return None

    def snapshot(self) -> Snapshot:
        return self._read(self._read_fields)

    def light_snapshot(self) -> Snapshot:
        """Only what a live chart keeps of each GPU: no processes (NVML's slowest calls,
        one more per process), clocks, PCIe link or MIG instances."""
        return self._read(self._read_light_fields)

    def _read(self, read_fields: Callable[..., GPU]) -> Snapshot:
        """Every GPU, each read by ``read_fields(index, handle, name, fixed)``."""
        with self._lock:
            problem = self._start()
            if problem:
                return Snapshot(source=self.label, problem=problem)
            nvml = self._nvml
            try:
                count = nvml.nvmlDeviceGetCount()
                versions = self._versions
                if versions is None:  # no one GPU's: even "GPU is lost" leaves them n/a
                    failed: list = []
                    versions = (self._field(lambda: _text(nvml.nvmlSystemGetDriverVersion()), False, failed),
                                self._field(self._cuda_driver_version, False, failed))
                    self._versions = None if failed else versions
            except Exception as error:
                return Snapshot(source=self.label, problem=describe_nvml_error(error))
            return Snapshot(
                source=self.label,
                gpus=tuple(self._read_gpu(index, read_fields) for index in range(count)),
                driver_version=versions[0],
                cuda_driver_version=versions[1],
            )

    def close(self) -> None:
        with self._lock:  # waits for a sampler thread's call in flight (nvitop's segfault)
            if self._started:
                self._started = False
                self._versions, self._devices = None, {}
                try:
                    self._nvml.nvmlShutdown()
                except Exception:
                    pass

    @staticmethod
    def _field(read: Callable[[], Any], device: bool = True, failed: Optional[list] = None) -> Any:
        """A field's value, or None where the device or driver does not support it; a device's
        field that finds its GPU lost raises, for _read_gpu to mark the whole device. An error
        that may pass (see _LASTING_ERRORS) is added to ``failed``."""
        try:
            return read()
        except Exception as error:
            if device and _is_lost(error):
                raise
            if failed is not None and type(error).__name__ not in _LASTING_ERRORS:
                failed.append(error)
            return None

    def _cuda_driver_version(self) -> str:
        version = self._nvml.nvmlSystemGetCudaDriverVersion()
        return f"{version // 1000}.{version % 1000 // 10}"

    def _read_gpu(self, index: int, read_fields: Callable[..., GPU]) -> GPU:
        try:
            handle, name, fixed = self._device(index)
        except Exception as error:
            return GPU(index=index, name=UNKNOWN_GPU, error=describe_nvml_error(error))
        try:
            return read_fields(index, handle, name, fixed)
        except Exception as error:  # only a lost GPU gets here: the fields let the rest through
            return GPU(index=index, name=name, error=describe_nvml_error(error))

    def _device(self, index: int) -> Tuple[Any, str, Dict[str, Any]]:
        """The handle, name and fields that stay fixed while NVML is up, read on first use and
        kept once every read has answered for good."""
        if index not in self._devices:
            failed: list = []
            nvml, field = self._nvml, functools.partial(self._field, failed=failed)
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            # A name NVML cannot give (a vGPU, a timeout) leaves the other fields readable.
            name = field(lambda: _text(nvml.nvmlDeviceGetName(handle))) or UNKNOWN_GPU
            fixed = dict(
                uuid=field(lambda: _text(nvml.nvmlDeviceGetUUID(handle))),
                bus_id=field(lambda: _text(nvml.nvmlDeviceGetPciInfo(handle).busId)),
                compute_capability=field(lambda: tuple(nvml.nvmlDeviceGetCudaComputeCapability(handle))),
                sm_clock_max=field(lambda: nvml.nvmlDeviceGetMaxClockInfo(handle, nvml.NVML_CLOCK_SM)),
                memory_clock_max=field(lambda: nvml.nvmlDeviceGetMaxClockInfo(handle, nvml.NVML_CLOCK_MEM)),
                pcie_generation_max=field(lambda: nvml.nvmlDeviceGetMaxPcieLinkGeneration(handle)),
                pcie_width_max=field(lambda: nvml.nvmlDeviceGetMaxPcieLinkWidth(handle)),
                # Changing the mode takes a GPU reset, which ends this handle anyway.
                mig_enabled=field(lambda: nvml.nvmlDeviceGetMigMode(handle)[0] == nvml.NVML_DEVICE_MIG_ENABLE),
            )
            if failed:  # "unknown GPU", no UUID ... only until the driver answers
                return handle, name, fixed
            self._devices[index] = (handle, name, fixed)
        return self._devices[index]

    def _read_light_fields(self, index: int, handle: Any, name: str, fixed: Dict[str, Any]) -> GPU:
        return GPU(index=index, name=name, **self._light_fields(handle))

    def _light_fields(self, handle: Any) -> Dict[str, Any]:
        """Memory, utilization, temperature and power draw: what the live monitor samples."""
        nvml = self._nvml
        field = self._field
        utilization = field(lambda: nvml.nvmlDeviceGetUtilizationRates(handle))
        power = field(lambda: nvml.nvmlDeviceGetPowerUsage(handle))
        return dict(
            **self._memory_fields(handle),
            utilization_gpu=utilization and float(utilization.gpu),
            utilization_memory=utilization and float(utilization.memory),
            temperature=field(lambda: float(nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU))),
            power_draw=None if power is None else power / 1000.0,
        )

    def _read_fields(self, index: int, handle: Any, name: str, fixed: Dict[str, Any]) -> GPU:
        nvml = self._nvml
        field = self._field
        limit = field(lambda: nvml.nvmlDeviceGetEnforcedPowerLimit(handle))
        reasons = field(lambda: self._clock_event_mask(handle))
        pstate = field(lambda: nvml.nvmlDeviceGetPerformanceState(handle))
        return GPU(
            index=index,
            name=name,
            **self._light_fields(handle),
            power_limit=None if limit is None else limit / 1000.0,
            sm_clock=field(lambda: nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM)),
            memory_clock=field(lambda: nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_MEM)),
            clock_event_reasons=None if reasons is None else decode_clock_event_reasons(reasons),
            performance_state=None if pstate is None else f"P{pstate}",
            pcie_generation=field(lambda: nvml.nvmlDeviceGetCurrPcieLinkGeneration(handle)),
            pcie_width=field(lambda: nvml.nvmlDeviceGetCurrPcieLinkWidth(handle)),
            processes=field(lambda: self._processes(handle)),
            mig_instances=field(lambda: self._mig_instances(handle)) if fixed["mig_enabled"] else None,
            **fixed,
        )

    def _memory_fields(self, handle: Any) -> MemoryFields:
        """memory_total/used/free/reserved of a GPU or MIG device, all None where unreadable."""
        total, used, free, reserved = self._field(lambda: self._memory(handle)) or (None,) * 4
        return MemoryFields(memory_total=total, memory_used=used, memory_free=free, memory_reserved=reserved)

    def _memory(self, handle: Any) -> Tuple[int, int, int, Optional[int]]:
        """(total, used, free, reserved): v2 keeps the driver's reserve out of "used"."""
        nvml = self._nvml
        version = getattr(nvml, "nvmlMemory_v2", None)
        if version is not None:
            try:
                info = nvml.nvmlDeviceGetMemoryInfo(handle, version=version)
                return int(info.total), int(info.used), int(info.free), int(info.reserved)
            except Exception as error:
                if _is_lost(error):
                    raise
                # drivers before 510 have no v2: fall back to v1 below
        info = nvml.nvmlDeviceGetMemoryInfo(handle)
        return int(info.total), int(info.used), int(info.free), None

    def _mig_instances(self, handle: Any) -> Tuple[MigInstance, ...]:
        """The GPU's MIG instances, read anew each time: they are made and destroyed
        (nvidia-smi mig -cgi/-dgi) without a GPU reset. An empty slot answers NotFound."""
        nvml, field = self._nvml, self._field
        instances = []
        for slot in range(nvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
            mig = field(functools.partial(nvml.nvmlDeviceGetMigDeviceHandleByIndex, handle, slot))
            if mig is None:
                continue
            instances.append(self._mig_instance(slot, mig))
        return tuple(instances)

    def _mig_instance(self, slot: int, mig: Any) -> MigInstance:
        nvml, field = self._nvml, self._field
        return MigInstance(
            index=slot,
            uuid=field(lambda: _text(nvml.nvmlDeviceGetUUID(mig))),
            gpu_instance_id=field(lambda: int(nvml.nvmlDeviceGetGpuInstanceId(mig))),
            compute_instance_id=field(lambda: int(nvml.nvmlDeviceGetComputeInstanceId(mig))),
            multiprocessors=field(lambda: int(nvml.nvmlDeviceGetAttributes(mig).multiprocessorCount)),
            **self._memory_fields(mig),
        )

    def _clock_event_mask(self, handle: Any) -> int:
        nvml = self._nvml
        read = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
        if read is not None:
            try:
                return int(read(handle))
            except Exception as error:
                if _is_lost(error):
                    raise
                # an older driver: try the deprecated name
        return int(nvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle))

    def _processes(self, handle: Any) -> Optional[Tuple[GPUProcess, ...]]:
        """Compute then graphics processes; None (n/a) when NVML answered for neither kind."""
        nvml = self._nvml
        found = {}
        answered = False
        for kind, read in (("compute", nvml.nvmlDeviceGetComputeRunningProcesses),
                           ("graphics", nvml.nvmlDeviceGetGraphicsRunningProcesses)):
            try:
                infos = read(handle)
            except Exception as error:
                if _is_lost(error):
                    raise
                continue
            answered = True
            for info in infos:
                if info.pid in found:
                    continue
                found[info.pid] = self._process(info, kind)
        return tuple(found.values()) if answered else None

    def _process(self, info: Any, kind: str) -> GPUProcess:
        nvml = self._nvml
        used = getattr(info, "usedGpuMemory", None)
        return GPUProcess(
            pid=int(info.pid),
            name=self._field(lambda: _text(nvml.nvmlSystemGetProcessName(info.pid))),
            used_memory=int(used) if isinstance(used, int) and used >= 0 else None,
            kind=kind,
        )
