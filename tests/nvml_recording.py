"""A stand-in for the ``pynvml`` module at the hardware boundary, answering from a recording.

:class:`RecordedNvml` is built from a :class:`~colab_gpu.devices.Snapshot` that the replay
reader parsed from a real ``nvidia-smi -q -x`` file, and answers the NVML calls the project
makes the way ``pynvml`` (nvidia-ml-py) does: the same ctypes structs (``c_nvmlMemory_v2_t``
with ``.total/.used/.free/.reserved``, ``c_nvmlUtilization_t``, ``nvmlPciInfo_t`` whose
``busId`` is bytes), milliwatts for power, process infos with ``.pid/.usedGpuMemory``, str
(or bytes, as pynvml before 11.515 returned) for names. Failures are the real pynvml
exception classes, made the way pynvml makes them: ``pynvml.NVMLError(code)`` returns the
subclass for ``code``. Every call but ``nvmlInit`` raises ``NVMLError_Uninitialized`` when
NVML is not initialized, as the library does.
"""
from __future__ import annotations

import functools
import threading
from typing import Callable, Dict, List, Optional, Tuple

import pynvml

from colab_gpu.devices import GPU, MigInstance, Snapshot
from colab_gpu.devices.nvml import CLOCK_EVENT_REASONS
from colab_gpu.devices.replay import ReplaySource

# nvidia-smi's XML does not record the compute capability; NVML does. These are NVIDIA's figures.
COMPUTE_CAPABILITY = {"Tesla T4": (7, 5), "NVIDIA A100-SXM4-80GB": (8, 0)}
# Nor how many MIG devices a GPU can hold (nvmlDeviceGetMaxMigDeviceCount): NVIDIA's figure, 7 on an A100.
MAX_MIG_DEVICES = {"NVIDIA A100-SXM4-80GB": 7}


def nvml_error(code: int) -> pynvml.NVMLError:
    """The exception pynvml raises for an NVML return code (``NVMLError(code)`` picks the subclass)."""
    return pynvml.NVMLError(code)


class Gate:
    """Holds one NVML call inside the library until released (a call still in flight)."""

    def __init__(self):
        self.entered = threading.Event()
        self.release = threading.Event()


class _Handle:
    """An opaque device handle, as ``nvmlDeviceGetHandleByIndex`` returns."""

    def __init__(self, index: int):
        self.index = index


class _MigHandle(_Handle):
    """A MIG device's handle (``nvmlDeviceGetMigDeviceHandleByIndex``); ``index`` is its GPU's."""

    def __init__(self, index: int, instance: MigInstance):
        super().__init__(index)
        self.instance = instance


def _nvml_call(function: Callable) -> Callable:
    """Record the call (``"<name> on MIG"`` for a MIG device's), refuse it before nvmlInit,
    raise an injected failure or hold it."""
    name = function.__name__

    @functools.wraps(function)
    def call(self, *args, **kwargs):
        handles = [arg for arg in args if isinstance(arg, _Handle)]  # two for a call about a pair of GPUs
        handle = handles[0] if handles else None
        # A call on a MIG device is logged apart, so a GPU's calls can still be counted.
        self.calls.append(f"{name} on MIG" if isinstance(handle, _MigHandle) else name)
        if not self.initialized and name != "nvmlInit":
            raise nvml_error(pynvml.NVML_ERROR_UNINITIALIZED)
        indices = [h.index for h in handles] or [args[0] if name == "nvmlDeviceGetHandleByIndex" else None]
        code = next((self._failures[(name, index)] for index in indices if (name, index) in self._failures),
                    self._failures.get((name, None)))
        if code is not None:
            raise nvml_error(code)
        gate = self._gates.get(name)
        if gate is not None:
            gate.entered.set()
            gate.release.wait(10)
        return function(self, *args, **kwargs)

    return call


class Wiring:
    """How a box's GPUs are linked, which no nvidia-smi recording holds (``topo -m`` in the
    captures shows one GPU): ``nvlinks[index]``, each active NVLink's far end as (PCI bus id,
    NVML device type: 0 a GPU, 2 an NVSwitch); ``ancestors[frozenset({a, b})]``, the NVML
    topology level (NVML_TOPOLOGY_*) of their nearest common PCIe ancestor. A GPU not in
    ``nvlinks`` has no NVLink (NOT_SUPPORTED, as the RTX 4080 capture's "Device does not have or
    support Nvlink"); a pair not in ``ancestors`` is NOT_SUPPORTED too."""

    def __init__(self, nvlinks: Optional[Dict[int, List[Tuple[str, int]]]] = None,
                 ancestors: Optional[Dict[frozenset, int]] = None):
        self.nvlinks = nvlinks or {}
        self.ancestors = ancestors or {}


class RecordedNvml:
    """The parts of the ``pynvml`` module colab_gpu uses, answering from a recorded snapshot.

    ``memory_v2=False`` plays a driver older than 510 (no ``nvmlDeviceGetMemoryInfo_v2``);
    ``clocks_event_reasons=False`` one older than 535 (no ``...ClocksEventReasons``): pynvml
    then raises ``NVMLError_FunctionNotFound`` from the call, as it does when the library lacks
    the symbol. ``names_as_bytes=True`` plays pynvml releases that returned bytes.
    """

    # Constants and exception classes come from the real module.
    NVML_TEMPERATURE_GPU = pynvml.NVML_TEMPERATURE_GPU
    NVML_CLOCK_SM = pynvml.NVML_CLOCK_SM
    NVML_CLOCK_MEM = pynvml.NVML_CLOCK_MEM
    nvmlMemory_v2 = pynvml.nvmlMemory_v2
    NVML_DEVICE_MIG_ENABLE = pynvml.NVML_DEVICE_MIG_ENABLE
    NVML_NVLINK_MAX_LINKS = pynvml.NVML_NVLINK_MAX_LINKS
    NVML_FEATURE_ENABLED = pynvml.NVML_FEATURE_ENABLED
    NVMLError = pynvml.NVMLError

    def __init__(self, snapshot: Snapshot, *, memory_v2: bool = True, clocks_event_reasons: bool = True,
                 names_as_bytes: bool = False, wiring: Optional["Wiring"] = None):
        assert snapshot.ok and snapshot.gpus, "build the stand-in from a recording that has GPUs"
        self.snapshot = snapshot
        self.wiring = wiring
        self.memory_v2 = memory_v2
        self.clocks_event_reasons = clocks_event_reasons
        self.names_as_bytes = names_as_bytes
        self.calls: List[str] = []
        self.initialized = False
        self.shutdowns = 0
        self._failures: Dict[Tuple[str, Optional[int]], int] = {}
        self._gates: Dict[str, Gate] = {}

    @classmethod
    def from_recording(cls, path, **options) -> "RecordedNvml":
        return cls(ReplaySource(path).snapshot(), **options)

    # --- failure injection ---------------------------------------------------------------

    def fail(self, function: str, code: int, index: Optional[int] = None) -> "RecordedNvml":
        """Make ``function`` raise pynvml's exception for ``code`` (on one device, or on all)."""
        if not hasattr(self, function):
            raise AttributeError(f"the stand-in has no {function}")
        self._failures[(function, index)] = code
        return self

    def hold(self, function: str) -> Gate:
        """Keep the next calls of ``function`` inside the library until ``gate.release`` is set."""
        gate = self._gates[function] = Gate()
        return gate

    # --- pynvml's API --------------------------------------------------------------------

    def _text(self, value: str):
        return value.encode() if self.names_as_bytes else value

    def _gpu(self, handle: _Handle) -> GPU:
        return self.snapshot.gpus[handle.index]

    def _device(self, handle: _Handle):
        """What a handle reads: its MIG instance, or its GPU."""
        return handle.instance if isinstance(handle, _MigHandle) else self._gpu(handle)

    @staticmethod
    def _value(value):
        """A recorded value, or the NOT_SUPPORTED NVML returns for what the device lacks."""
        if value is None:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return value

    @_nvml_call
    def nvmlInit(self) -> None:
        self.initialized = True

    @_nvml_call
    def nvmlShutdown(self) -> None:
        self.initialized = False
        self.shutdowns += 1

    @_nvml_call
    def nvmlDeviceGetCount(self) -> int:
        return len(self.snapshot.gpus)

    @_nvml_call
    def nvmlSystemGetDriverVersion(self):
        return self._text(self._value(self.snapshot.driver_version))

    @_nvml_call
    def nvmlSystemGetCudaDriverVersion(self) -> int:
        major, minor = self._value(self.snapshot.cuda_driver_version).split(".")
        return int(major) * 1000 + int(minor) * 10

    @_nvml_call
    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        if not 0 <= index < len(self.snapshot.gpus):
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return _Handle(index)

    @_nvml_call
    def nvmlDeviceGetName(self, handle):
        return self._text(self._gpu(handle).name)

    @_nvml_call
    def nvmlDeviceGetUUID(self, handle):
        return self._text(self._value(self._device(handle).uuid))

    @_nvml_call
    def nvmlDeviceGetPciInfo(self, handle) -> pynvml.nvmlPciInfo_t:
        info = pynvml.nvmlPciInfo_t()
        info.busId = self._value(self._gpu(handle).bus_id).encode()  # a c_char array: bytes
        return info

    @_nvml_call
    def nvmlDeviceGetCudaComputeCapability(self, handle) -> Tuple[int, int]:
        return self._value(COMPUTE_CAPABILITY.get(self._gpu(handle).name))

    @_nvml_call
    def nvmlDeviceGetMemoryInfo(self, handle, version=None):
        device = self._device(handle)
        total, used, free = (self._value(value)
                             for value in (device.memory_total, device.memory_used, device.memory_free))
        if not version:  # v1 counts the driver's reserve as used
            return pynvml.c_nvmlMemory_t(total=total, free=free, used=total - free)
        if not self.memory_v2:
            raise nvml_error(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        return pynvml.c_nvmlMemory_v2_t(version=version, total=total, reserved=self._value(device.memory_reserved),
                                        free=free, used=used)

    @_nvml_call
    def nvmlDeviceGetUtilizationRates(self, handle) -> pynvml.c_nvmlUtilization_t:
        gpu = self._gpu(handle)
        return pynvml.c_nvmlUtilization_t(gpu=int(self._value(gpu.utilization_gpu)),
                                          memory=int(self._value(gpu.utilization_memory)))

    @_nvml_call
    def nvmlDeviceGetTemperature(self, handle, sensor: int) -> int:
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return int(self._value(self._gpu(handle).temperature))

    @_nvml_call
    def nvmlDeviceGetPowerUsage(self, handle) -> int:
        return round(self._value(self._gpu(handle).power_draw) * 1000)  # milliwatts

    @_nvml_call
    def nvmlDeviceGetEnforcedPowerLimit(self, handle) -> int:
        return round(self._value(self._gpu(handle).power_limit) * 1000)

    def _clock(self, handle, clock: int, maximum: bool) -> int:
        gpu = self._gpu(handle)
        fields = {pynvml.NVML_CLOCK_SM: (gpu.sm_clock, gpu.sm_clock_max),
                  pynvml.NVML_CLOCK_MEM: (gpu.memory_clock, gpu.memory_clock_max)}
        return self._value(fields[clock][maximum])

    @_nvml_call
    def nvmlDeviceGetClockInfo(self, handle, clock: int) -> int:
        return self._clock(handle, clock, maximum=False)

    @_nvml_call
    def nvmlDeviceGetMaxClockInfo(self, handle, clock: int) -> int:
        return self._clock(handle, clock, maximum=True)

    def _reason_mask(self, handle) -> int:
        words = self._value(self._gpu(handle).clock_event_reasons)
        return sum(bit for bit, word in CLOCK_EVENT_REASONS if word in words)

    @_nvml_call
    def nvmlDeviceGetCurrentClocksEventReasons(self, handle) -> int:
        if not self.clocks_event_reasons:
            raise nvml_error(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        return self._reason_mask(handle)

    @_nvml_call
    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle) -> int:
        return self._reason_mask(handle)

    @_nvml_call
    def nvmlDeviceGetMigMode(self, handle) -> list:
        """[current, pending], as pynvml returns them."""
        enabled = self._value(self._gpu(handle).mig_enabled)
        mode = pynvml.NVML_DEVICE_MIG_ENABLE if enabled else pynvml.NVML_DEVICE_MIG_DISABLE
        return [mode, mode]

    def _max_mig_devices(self, handle) -> int:
        """0 where MIG is off, as NVML answers; else the most instances the GPU can hold."""
        gpu = self._gpu(handle)
        return 0 if gpu.mig_instances is None else self._value(MAX_MIG_DEVICES.get(gpu.name))

    @staticmethod
    def _instance(handle) -> MigInstance:
        """The MIG instance of a MIG handle; a GPU's handle is refused, as NVML refuses it."""
        if not isinstance(handle, _MigHandle):
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return handle.instance

    @_nvml_call
    def nvmlDeviceGetMaxMigDeviceCount(self, handle) -> int:
        return self._max_mig_devices(handle)

    @_nvml_call
    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle, index: int) -> _MigHandle:
        """The recorded instance at ``index``; a slot no instance fills answers NOT_FOUND."""
        if not 0 <= index < self._max_mig_devices(handle):
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        for instance in self._gpu(handle).mig_instances:
            if instance.index == index:
                return _MigHandle(handle.index, instance)
        raise nvml_error(pynvml.NVML_ERROR_NOT_FOUND)

    @_nvml_call
    def nvmlDeviceGetGpuInstanceId(self, handle) -> int:
        return self._value(self._instance(handle).gpu_instance_id)

    @_nvml_call
    def nvmlDeviceGetComputeInstanceId(self, handle) -> int:
        return self._value(self._instance(handle).compute_instance_id)

    @_nvml_call
    def nvmlDeviceGetAttributes(self, handle) -> pynvml.c_nvmlDeviceAttributes:
        """Only the multiprocessor count is recorded; the struct's other fields stay 0."""
        return pynvml.c_nvmlDeviceAttributes(multiprocessorCount=self._value(self._instance(handle).multiprocessors))

    @_nvml_call
    def nvmlDeviceGetPerformanceState(self, handle) -> int:
        return int(self._value(self._gpu(handle).performance_state).lstrip("P"))

    @_nvml_call
    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle) -> int:
        return self._value(self._gpu(handle).pcie_generation)

    @_nvml_call
    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle) -> int:
        return self._value(self._gpu(handle).pcie_generation_max)

    @_nvml_call
    def nvmlDeviceGetCurrPcieLinkWidth(self, handle) -> int:
        return self._value(self._gpu(handle).pcie_width)

    @_nvml_call
    def nvmlDeviceGetMaxPcieLinkWidth(self, handle) -> int:
        return self._value(self._gpu(handle).pcie_width_max)

    def _processes(self, handle, kind: str) -> list:
        """pynvml's friendly objects: .pid, .usedGpuMemory (None where NVML has no figure) ..."""
        result = []
        for process in self._value(self._gpu(handle).processes):
            if process.kind != kind:
                continue
            used = process.used_memory
            info = pynvml.nvmlStructToFriendlyObject(pynvml.c_nvmlProcessInfo_t(
                pid=process.pid,
                usedGpuMemory=pynvml.NVML_VALUE_NOT_AVAILABLE_ulonglong.value if used is None else used,
                gpuInstanceId=pynvml.NVML_VALUE_NOT_AVAILABLE_uint.value,
                computeInstanceId=pynvml.NVML_VALUE_NOT_AVAILABLE_uint.value))
            if info.usedGpuMemory == pynvml.NVML_VALUE_NOT_AVAILABLE_ulonglong.value:
                info.usedGpuMemory = None
            result.append(info)
        return result

    @_nvml_call
    def nvmlDeviceGetComputeRunningProcesses(self, handle) -> list:
        return self._processes(handle, "compute")

    @_nvml_call
    def nvmlDeviceGetGraphicsRunningProcesses(self, handle) -> list:
        return self._processes(handle, "graphics")

    def _link(self, handle, link: int) -> Tuple[str, int]:
        """An NVLink's far end: NOT_SUPPORTED on a GPU without NVLink, INVALID_ARGUMENT past its last link."""
        links = self.wiring.nvlinks.get(handle.index) if self.wiring else None
        if links is None:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if not 0 <= link < len(links):
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return links[link]

    @_nvml_call
    def nvmlDeviceGetNvLinkState(self, handle, link: int) -> int:
        self._link(handle, link)
        return pynvml.NVML_FEATURE_ENABLED

    @_nvml_call
    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle, link: int) -> pynvml.nvmlPciInfo_t:
        info = pynvml.nvmlPciInfo_t()
        info.busId = self._link(handle, link)[0].encode()
        return info

    @_nvml_call
    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle, link: int) -> int:
        return self._link(handle, link)[1]

    @_nvml_call
    def nvmlDeviceGetTopologyCommonAncestor(self, first, second) -> int:
        pair = frozenset({first.index, second.index})
        return self._value(self.wiring.ancestors.get(pair) if self.wiring else None)

    @_nvml_call
    def nvmlSystemGetProcessName(self, pid: int):
        for gpu in self.snapshot.gpus:
            for process in gpu.processes or ():
                if process.pid == pid and process.name:
                    return self._text(process.name)
        raise nvml_error(pynvml.NVML_ERROR_NOT_FOUND)
