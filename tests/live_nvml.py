"""A stand-in for the ``pynvml`` module at the hardware boundary, fed by a real recording.

Each snapshot (one ``nvmlDeviceGetCount``) steps to the recording's next time step. It can
lose a GPU after some reads (``NVMLError_GpuIsLost``, as a GPU falling off the bus does), and
it records any call made after ``nvmlShutdown`` (the use-after-free that crashes nvitop).
"""
from __future__ import annotations

import threading
import time
import types

from colab_gpu.devices.replay import load_frames

NVML_TEMPERATURE_GPU = 0


class NVMLError_GpuIsLost(Exception):
    pass


class NVMLError_Uninitialized(Exception):
    pass


class NVMLError_NotSupported(Exception):
    pass


def _known(*values):
    """What the recording has; a field it lacks is one the device does not support."""
    if any(value is None for value in values):
        raise NVMLError_NotSupported("not recorded")
    return values


class RecordedNvml:
    NVML_TEMPERATURE_GPU = NVML_TEMPERATURE_GPU  # NvmlSource reads it from the module it is given

    def __init__(self, path, delay: float = 0.0, lose_gpu_after: int = 0):
        self.frames = load_frames(path)
        self.delay = delay  # seconds each read takes, to widen the window of a call in flight
        self.lose_gpu_after = lose_gpu_after  # 0: never
        self.reads = 0
        self.initialized = False
        self.late_calls = []  # names of calls made after nvmlShutdown
        self.on_shutdown = None  # called inside nvmlShutdown, before NVML "frees" itself
        self._frame = self.frames[0]

    def _check(self, name: str) -> None:
        if not self.initialized:
            self.late_calls.append((name, threading.current_thread().name))
            raise NVMLError_Uninitialized(name)

    def nvmlInit(self):
        self.initialized = True

    def nvmlShutdown(self):
        if self.on_shutdown is not None:
            self.on_shutdown()
        self.initialized = False

    def nvmlDeviceGetCount(self):
        self._check("nvmlDeviceGetCount")
        time.sleep(self.delay)
        self._frame = self.frames[self.reads % len(self.frames)]
        self.reads += 1
        return len(self._frame.gpus)

    def nvmlDeviceGetHandleByIndex(self, index):
        self._check("nvmlDeviceGetHandleByIndex")
        return types.SimpleNamespace(index=index)  # opaque and lasting, as NVML's handles are

    def _gpu(self, name, handle):
        """The handle's GPU at the current time step; a lost GPU fails every call on it."""
        self._check(name)
        if self.lose_gpu_after and self.reads > self.lose_gpu_after:
            raise NVMLError_GpuIsLost("GPU is lost")
        return self._frame.gpus[handle.index]

    def nvmlDeviceGetName(self, handle):
        return self._gpu("nvmlDeviceGetName", handle).name

    def nvmlDeviceGetMemoryInfo(self, handle, version=None):
        gpu = self._gpu("nvmlDeviceGetMemoryInfo", handle)
        total, used = _known(gpu.memory_total, gpu.memory_used)
        return types.SimpleNamespace(total=total, used=used, free=total - used)

    def nvmlDeviceGetUtilizationRates(self, handle):
        gpu = self._gpu("nvmlDeviceGetUtilizationRates", handle)
        busy, bus = _known(gpu.utilization_gpu, gpu.utilization_memory or 0)
        return types.SimpleNamespace(gpu=busy, memory=bus)

    def nvmlDeviceGetTemperature(self, handle, sensor):
        return _known(self._gpu("nvmlDeviceGetTemperature", handle).temperature)[0]
