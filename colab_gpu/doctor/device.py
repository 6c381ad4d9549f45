"""The failing device as it is now: capacity, free memory, torch's allocator, other processes.

A GPU is read through NVML, which never creates a CUDA context, and torch's counters only where
the user's code has already started CUDA (it has, if CUDA ran out). The CPU is read from the
address-space limit (RLIMIT_AS, ``ulimit -v``) where one is set, else from the machine's (or
its container's) memory. Nothing here raises: what cannot be read stays None, with why.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Optional, Tuple

from ..devices import GPU, DeviceSource, default_source, known_compute_capability
from ..host import cgroup_memory, meminfo, process_status
from ..torch_view import TorchMemory, breakdown, torch_memory, torch_view
from ..runtime import cuda_torch, detect_runtime
from .report import OtherProcess

__all__ = ["DeviceNow", "read_device"]


@dataclasses.dataclass(frozen=True)
class DeviceNow:
    """One device's memory now; None where it could not be read."""

    device: str
    name: Optional[str] = None
    capacity: Optional[int] = None
    free: Optional[int] = None
    allocated: Optional[int] = None  # torch's tensors (CUDA)
    reserved: Optional[int] = None  # torch's cache, allocated included (CUDA)
    allowed: Optional[int] = None  # torch's per-process cap, or the address-space limit
    non_torch: Optional[int] = None  # this process's CUDA context and other libraries
    in_use: Optional[int] = None  # CPU: this process's address space, or resident memory
    processes: Tuple[OtherProcess, ...] = ()  # the other processes on the GPU
    others_known: bool = False  # NVML told this process apart from the others
    compute_capability: Optional[Tuple[int, int]] = None
    problem: Optional[str] = None  # why the GPU could not be read


def read_device(device: Optional[str], source: Optional[DeviceSource] = None) -> DeviceNow:
    """``device`` ("cuda:0", "cpu") now; other devices (mps, xpu) are not read."""
    if device == "cpu":
        return read_cpu()
    if device is not None and device.startswith("cuda:") and device[5:].isdigit():
        return read_cuda(int(device[5:]), source)
    return DeviceNow(device or "unknown")


def _snapshot(source: Optional[DeviceSource]):
    try:
        return (source or default_source()).snapshot()
    except Exception:  # a source promises not to raise; the card must come anyway
        return None


def read_cuda(index: int, source: Optional[DeviceSource] = None) -> DeviceNow:
    """cuda:``index``: NVML's view of its GPU (matched as the status card matches it), and
    torch's allocator counters once CUDA runs."""
    snapshot = _snapshot(source)
    gpu, index_of = None, {}
    problem: Optional[str] = "NVML could not be read"
    if snapshot is not None:
        view = torch_view(snapshot, detect_runtime())
        index_of = view.torch_index_of if view.cuda_numbering_known else {}
        nvml = next((nvml for nvml, torch_index in index_of.items() if torch_index == index), None)
        gpu = next((found for found in view.gpus if found.index == nvml), None)
        problem = snapshot.problem or (None if gpu else f"NVML lists no GPU that is cuda:{index}")
    memory = next((m for m in torch_memory(index_of) if m.torch_index == index), None)
    now = DeviceNow(f"cuda:{index}", problem=problem)
    if gpu is not None and not gpu.error:
        now = _with_gpu(now, gpu, memory)
    elif memory is not None:
        now = dataclasses.replace(now, allocated=memory.allocated, reserved=memory.reserved)
    return _with_torch_cap(now, index)


def _with_gpu(now: DeviceNow, gpu: GPU, memory: Optional[TorchMemory]) -> DeviceNow:
    part = breakdown(gpu, memory, os.getpid())
    others_known = part is not None and part.other_processes is not None
    mine = os.getpid()
    processes = tuple(OtherProcess(p.pid, p.used_memory or 0, p.name) for p in gpu.processes or ()
                      if p.pid != mine) if others_known else ()
    return dataclasses.replace(
        now, name=gpu.name, capacity=gpu.memory_total, free=gpu.memory_free,
        allocated=memory.allocated if memory else None, reserved=memory.reserved if memory else None,
        non_torch=part.context_and_non_torch if part is not None and others_known else None,
        processes=tuple(sorted(processes, key=lambda p: -p.nbytes)), others_known=others_known,
        compute_capability=gpu.compute_capability or known_compute_capability(gpu.name))


def _with_torch_cap(now: DeviceNow, index: int) -> DeviceNow:
    """torch.cuda.set_per_process_memory_fraction's cap, where the installed torch can say it
    (2.6+) and CUDA runs; torch's name and capability where NVML gave none."""
    torch = cuda_torch()
    if torch is None:
        return now
    try:
        fraction = getattr(torch.cuda, "get_per_process_memory_fraction", lambda device: 1.0)(index)
        name = now.name or torch.cuda.get_device_name(index)
        capability = now.compute_capability or tuple(torch.cuda.get_device_capability(index))
        total = torch.cuda.get_device_properties(index).total_memory  # what the fraction is of
    except Exception:  # a broken context: what NVML said stands
        return now
    allowed = int(total * fraction) if fraction < 1 else None
    return dataclasses.replace(now, name=name, compute_capability=capability, capacity=total, allowed=allowed)


def read_cpu() -> DeviceNow:
    """Under an address-space limit, allocations fail at it (torch raises): the limit and the
    address space in use. Without one, the machine's memory (or the container's), where Linux
    kills the process instead of raising."""
    try:
        import resource

        limit = resource.getrlimit(resource.RLIMIT_AS)[0]
        status, memory, (cgroup, room) = process_status(), meminfo(), cgroup_memory()
        capacity = memory["MemTotal"] if cgroup is None else min(memory["MemTotal"], cgroup)
        if limit != resource.RLIM_INFINITY:
            return DeviceNow("cpu", capacity=capacity, allowed=limit, in_use=status["VmSize"],
                             free=max(0, limit - status["VmSize"]))
        free = memory["MemAvailable"]
        return DeviceNow("cpu", capacity=capacity, free=free if room is None else min(free, room),
                         in_use=status["VmRSS"])
    except (ImportError, OSError, KeyError, ValueError, IndexError):  # not Linux
        return DeviceNow("cpu", problem="the CPU's memory is read on Linux only")
