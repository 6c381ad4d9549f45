"""torch's view of the GPUs: how it numbers them under CUDA_VISIBLE_DEVICES and
CUDA_DEVICE_ORDER, and what its caching allocator holds on each, as a :class:`Status`.

Shared core: the status card (gpu_status.status() adds the advice), the live monitor's labels
and clear_cache's readings all number the GPUs by :func:`torch_view`. Reads torch's figures
only when the user's code has already initialized CUDA; never initializes CUDA itself.
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys
from typing import TYPE_CHECKING, Any, Dict, NamedTuple, Optional, Sequence, Tuple

from .cuda_order import driver_torch_indices
from .devices import GPU, MigInstance, Snapshot
from .render.shown import Shown
from .runtime import (Runtime, cuda_numbering_known, cuda_torch, mig_torch_indices, names_mig_instances,
                      torch_indices)
from .state import session

if TYPE_CHECKING:
    from .advice import Advice

__all__ = ["TorchMemory", "MemoryBreakdown", "Status", "torch_memory", "breakdown", "torch_view",
           "visible_at_cuda_start", "CudaNumbering", "cuda_numbering"]


@dataclasses.dataclass(frozen=True)
class TorchMemory:
    """torch's caching allocator on one device (``torch.cuda.memory_stats``)."""

    torch_index: int
    nvml_index: Optional[int]
    allocated: int
    reserved: int
    peak_allocated: int
    peak_reserved: int
    inactive_split: int  # cached blocks split off and unusable for larger requests
    num_ooms: int
    num_alloc_retries: int  # times the cache was flushed to satisfy a request ("thrashing")

    @property
    def reserved_unallocated(self) -> int:
        """What an OOM message calls "reserved but unallocated": the fragmentation to watch."""
        return max(0, self.reserved - self.allocated)


@dataclasses.dataclass(frozen=True)
class MemoryBreakdown:
    """Where one GPU's memory went, largest consumers named separately."""

    nvml_index: int
    total: int
    driver_reserved: Optional[int]
    other_processes: Optional[int]  # None when this process cannot be told apart (containers)
    context_and_non_torch: int  # CUDA context, cuBLAS/cuDNN workspaces, other libraries
    torch_cache: int
    torch_tensors: int
    free: int


@dataclasses.dataclass(frozen=True, repr=False)
class Status(Shown):
    """What ``%gpu_status`` shows; ``status()`` returns it.

    ``print(status)`` is the card, ``status.summary()`` its first line, ``status.to_json()``
    what ``%gpu_status --json`` prints.

    Attributes
    ----------
    runtime : Runtime
        The platform, torch's state, ``CUDA_VISIBLE_DEVICES`` (as CUDA started under it) and
        ``CUDA_DEVICE_ORDER``.
    snapshot : Snapshot
        The GPUs as read (``gpus``), or why none could be (``problem``).
    torch_index_of : dict of int to int
        NVML index -> torch's index (``cuda:N``) of each GPU torch sees.
    torch_memory : tuple of TorchMemory
        torch's allocator figures per device, read only once the user's code started CUDA.
    breakdown : tuple of MemoryBreakdown
        Each GPU's used memory split into other processes, CUDA context and non-torch
        libraries, torch's cache and tensors.
    advice : tuple of Advice
        The tips and warnings, each with the rule that gave it.
    cuda_numbering_known : bool
        False where ``torch_index_of`` is a guess: different GPUs numbered fastest first that
        the CUDA driver could not be asked about.
    cuda_numbering_asked : bool
        ``torch_index_of`` came from the CUDA driver, asked in a child process.
    mig_torch_index_of : dict of (int, int) to int
        (NVML index, MIG index) -> torch's index of each MIG instance CUDA_VISIBLE_DEVICES names.
    visible_devices_changed : (str or None, bool) or None
        Where CUDA_VISIBLE_DEVICES changed after CUDA started: its value now, and whether the
        one CUDA started under is certain.
    """

    runtime: Runtime
    snapshot: Snapshot
    torch_index_of: Dict[int, int]  # NVML index -> torch index under CUDA_VISIBLE_DEVICES
    torch_memory: Tuple[TorchMemory, ...] = ()
    breakdown: Tuple[MemoryBreakdown, ...] = ()
    advice: Tuple[Advice, ...] = ()
    # False on a box of different GPUs numbered fastest first that the CUDA driver could not be
    # asked about: torch_index_of is then a guess, and torch's figures are not put on any NVML GPU.
    cuda_numbering_known: bool = True
    # torch_index_of came from asking the CUDA driver, in a child process (a box of different
    # GPUs numbered fastest first)
    cuda_numbering_asked: bool = False
    # (NVML index, MIG index) -> torch index of each MIG instance CUDA_VISIBLE_DEVICES names
    mig_torch_index_of: Dict[Tuple[int, int], int] = dataclasses.field(default_factory=dict)
    # Where CUDA_VISIBLE_DEVICES was changed after this process's CUDA started: (its value now,
    # whether runtime's, the one CUDA started under, is certain: :func:`visible_at_cuda_start`)
    visible_devices_changed: Optional[Tuple[Optional[str], bool]] = None

    @property
    def gpus(self) -> Tuple[GPU, ...]:
        return self.snapshot.gpus

    def torch_memory_of(self, nvml_index: int) -> Optional[TorchMemory]:
        return next((m for m in self.torch_memory if m.nvml_index == nvml_index), None)

    @property
    def torch_memory_without_gpu(self) -> Tuple[TorchMemory, ...]:
        """torch devices NVML could not be matched to (no NVML, or an unresolvable mapping)."""
        return tuple(m for m in self.torch_memory if m.nvml_index is None)

    @property
    def visible_devices(self) -> Optional[str]:
        """CUDA_VISIBLE_DEVICES as it applies to these GPUs: a recording comes from another
        machine, which this one's variable says nothing about (None: every GPU visible)."""
        return None if self.snapshot.recorded else self.runtime.cuda_visible_devices

    def hidden_from_torch(self, gpu: GPU, mig: Optional[MigInstance] = None) -> Optional[bool]:
        """Whether CUDA_VISIBLE_DEVICES hides ``gpu`` (or its MIG instance ``mig``) from this
        process's torch: True, False, or None where it cannot be told. The one answer the
        card, the advice, the live labels and clear_cache's readings all follow."""
        if names_mig_instances(self.visible_devices):
            return self._hidden_by_mig_entries(gpu, mig)
        if not self.torch_index_of:
            return True  # "" or "-1", or entries naming no GPU here: none is visible, in any order
        if len(self.torch_index_of) == len(self.gpus):
            return False  # every GPU visible, whichever order CUDA numbers them in
        if not self.cuda_numbering_known:
            return None  # ordinals count fastest first: which GPUs they pick is unknown
        return gpu.index not in self.torch_index_of

    def _hidden_by_mig_entries(self, gpu: GPU, mig: Optional[MigInstance]) -> Optional[bool]:
        """hidden_from_torch where CUDA_VISIBLE_DEVICES names MIG instances. CUDA enumerates
        the first one only (:func:`~colab_gpu.runtime.mig_torch_indices`), matched where NVML
        gave its UUID; where it was left unmatched and some instance's UUID is unknown, it may
        be that instance: unknown, not hidden."""
        named = self.mig_torch_index_of
        if mig is not None:
            if (gpu.index, mig.index) in named:
                return False
            instances: Tuple[MigInstance, ...] = (mig,)
        else:
            if gpu.index in self.torch_index_of or any(index == gpu.index for index, _ in named):
                return False
            if not gpu.mig_enabled:
                return True  # a whole GPU: CUDA sees the MIG instances named, not it
            instances = gpu.mig_instances or ()
        if not named and (not instances or any(instance.uuid is None for instance in instances)):
            return None
        return True

    def breakdown_of(self, nvml_index: int) -> Optional[MemoryBreakdown]:
        return next((part for part in self.breakdown if part.nvml_index == nvml_index), None)

    def to_dict(self) -> Dict[str, Any]:
        data = dataclasses.asdict(self)
        data["torch_index_of"] = {str(k): v for k, v in self.torch_index_of.items()}
        data["mig_torch_index_of"] = {f"{gpu}:{mig}": v for (gpu, mig), v in self.mig_torch_index_of.items()}
        return data

    def to_json(self, indent: Optional[int] = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, default=str)

    line_view = "colab_gpu.render.text:status_line"
    text_view = "colab_gpu.render.text:render_status"  # the card %gpu_status prints
    html_view = "colab_gpu.render.html:render_status"


def torch_memory(index_of: Dict[int, int], modules=sys.modules) -> Tuple[TorchMemory, ...]:
    """Allocator statistics per device, read only when CUDA is already initialized."""
    torch = cuda_torch(modules)
    if torch is None:
        return ()
    nvml_of = {torch_index: nvml_index for nvml_index, torch_index in index_of.items()}
    result = []
    for device in range(torch.cuda.device_count()):
        stats = torch.cuda.memory_stats(device)
        result.append(TorchMemory(
            torch_index=device,
            nvml_index=nvml_of.get(device),
            allocated=stats.get("allocated_bytes.all.current", 0),
            reserved=stats.get("reserved_bytes.all.current", 0),
            peak_allocated=stats.get("allocated_bytes.all.peak", 0),
            peak_reserved=stats.get("reserved_bytes.all.peak", 0),
            inactive_split=stats.get("inactive_split_bytes.all.current", 0),
            num_ooms=stats.get("num_ooms", 0),
            num_alloc_retries=stats.get("num_alloc_retries", 0),
        ))
    return tuple(result)


def breakdown(gpu: GPU, memory: Optional[TorchMemory], pid: int) -> Optional[MemoryBreakdown]:
    """Split NVML's "used" into other processes, context/non-torch, torch cache and tensors."""
    if gpu.memory_total is None or gpu.memory_used is None or gpu.memory_free is None:
        return None
    reserved = memory.reserved if memory else 0
    allocated = memory.allocated if memory else 0
    others = None
    if gpu.processes is not None and any(p.pid == pid for p in gpu.processes):
        others = sum(p.used_memory or 0 for p in gpu.processes if p.pid != pid)
    used = gpu.memory_used  # with memory info v1 this includes the driver's reserve
    return MemoryBreakdown(
        nvml_index=gpu.index,
        total=gpu.memory_total,
        driver_reserved=gpu.memory_reserved,
        other_processes=others,
        context_and_non_torch=max(0, used - reserved - (others or 0)),
        torch_cache=max(0, reserved - allocated),
        torch_tensors=allocated,
        free=gpu.memory_free,
    )


def torch_view(snapshot: Snapshot, runtime: Runtime) -> Status:
    """The status of ``snapshot`` without torch's figures or advice: how torch numbers each GPU
    under ``runtime``'s CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER, which every display labels
    its GPUs by (the card, and the live monitor from its first sample)."""
    started_under, certain = visible_at_cuda_start(runtime.cuda_visible_devices, runtime.torch.cuda_initialized)
    changed = None
    if started_under != runtime.cuda_visible_devices:
        changed = runtime.cuda_visible_devices, certain
        runtime = dataclasses.replace(runtime, cuda_visible_devices=started_under)
    status = Status(runtime=runtime, snapshot=snapshot, torch_index_of={},
                    visible_devices_changed=None if snapshot.recorded else changed)
    visible = status.visible_devices
    numbering = cuda_numbering(visible, runtime.cuda_device_order, snapshot.gpus, ask_driver=not snapshot.recorded)
    return dataclasses.replace(status, torch_index_of=numbering.torch_index_of,
                               cuda_numbering_known=numbering.known or snapshot.recorded,
                               cuda_numbering_asked=numbering.asked,
                               mig_torch_index_of=mig_torch_indices(visible, snapshot.gpus))


def visible_at_cuda_start(now: Optional[str], cuda_started: bool) -> Tuple[Optional[str], bool]:
    """The CUDA_VISIBLE_DEVICES torch numbers the GPUs by, and whether that is certain. CUDA
    reads it once, at its start: a value set later changes nothing until a restart. Once CUDA
    runs, the value first seen then; certain where the last look before the start saw the
    same, not where CUDA started before colab_gpu first looked or the value changed around it
    (set in the cell that started CUDA, most likely before it: the value first seen is kept).
    Looked at on import (the extension's load) and at each torch_view: ``session.visible_seen``."""
    seen = session.visible_seen
    if not cuda_started:
        seen["before"] = now
        return now, True
    started = seen.setdefault("started", now)
    return started, "before" in seen and seen["before"] == started


class CudaNumbering(NamedTuple):
    """NVML index -> torch index, whether CUDA really numbers the GPUs so, and whether the
    CUDA driver was asked (in a child process) to know it."""

    torch_index_of: Dict[int, int]
    known: bool
    asked: bool


def cuda_numbering(cuda_visible_devices: Optional[str], cuda_device_order: str, gpus: Sequence[GPU],
                   ask_driver: bool = True) -> CudaNumbering:
    """How torch numbers ``gpus`` under these settings. In NVML's bus order where CUDA keeps it;
    on a box of different GPUs numbered fastest first, as this machine's CUDA driver numbers
    them (asked once per setting, in a child process: :mod:`colab_gpu.cuda_order`), else a
    guess in bus order that is not ``known``. ``ask_driver`` False: ``gpus`` are not this
    machine's."""
    in_bus_order = torch_indices(cuda_visible_devices, gpus)
    if cuda_numbering_known(cuda_visible_devices, cuda_device_order, gpus):
        return CudaNumbering(in_bus_order, known=True, asked=False)
    asked = driver_torch_indices(cuda_visible_devices, cuda_device_order, gpus) if ask_driver else None
    if asked is None:
        return CudaNumbering(in_bus_order, known=False, asked=False)
    return CudaNumbering(asked, known=True, asked=True)


visible_at_cuda_start(os.environ.get("CUDA_VISIBLE_DEVICES"), cuda_torch() is not None)
