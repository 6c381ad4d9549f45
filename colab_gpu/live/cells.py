"""Per-cell GPU memory peaks (``%gpu_status --live --cells``): one line after each cell
that has something to say (none after a cell too short to be sampled).

Where this process has started CUDA, the numbers are torch's own allocator counters, exact
and without polling: the peak counters are reset when a cell starts
(``torch.cuda.reset_peak_memory_stats``), so ``torch.cuda.max_memory_allocated()`` reads per
cell while this is on. Where it has not, the line comes from the live sampler's NVML readings
during the cell: the whole GPU (every process), at the sampling interval, said as such.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Callable, Dict, List, Optional, Tuple

from ..spelling import command
from ..runtime import cuda_torch
from ..words import count, size
from .panel import source_title, torch_labels

if TYPE_CHECKING:
    from .sampler import Sampler


def _signed(value: int) -> str:
    return ("+" if value >= 0 else "-") + size(abs(value))


class CellPeaks:
    """``before()`` at pre_run_cell, ``after()`` at post_run_cell returns the line to show."""

    def __init__(self, sampler: Callable[[], Optional[Sampler]]):
        self._sampler = sampler  # the running sampler, looked up per cell
        self._started: Optional[float] = None
        self._allocated: Optional[List[int]] = None  # per torch device at the cell's start
        self._told_stopped = False  # the user was told the monitor stopped
        self._told_unreported = False  # ... that the source reports no memory used
        self._tally: Optional["_CellTally"] = None  # the samples of the cell running now
        # Said as its caller runs it, decided now: the lines are made in IPython's cell hooks,
        # outside the magic that turned them on (where as_magic() says nothing any more).
        self._stop_hint = command("%gpu_status --stop shows why and ends these lines",
                                  "colab_gpu.live.stop() says why")

    def before(self) -> None:
        self._stop_tally()
        sampler = self._sampler()
        if sampler is not None:  # followed from now: the buffer may drop the cell's first samples
            self._tally = _CellTally(sampler)
            sampler.add_listener(self._tally.add)
        self._started = time.time()
        torch = cuda_torch()
        self._allocated = None
        if torch is not None:
            self._allocated = []
            for device in range(torch.cuda.device_count()):
                torch.cuda.reset_peak_memory_stats(device)
                self._allocated.append(torch.cuda.memory_allocated(device))

    def after(self) -> Optional[str]:
        if self._started is None:  # the cell that turned this on
            return None
        self._started = None
        tally = self._stop_tally()
        torch = cuda_torch()
        if torch is not None:
            return self._torch_line(torch)
        return self._sampled_line(tally)

    def _stop_tally(self) -> Optional["_CellTally"]:
        tally, self._tally = self._tally, None
        if tally is not None:
            tally.sampler.remove_listener(tally.add)
        return tally

    def _torch_line(self, torch) -> str:
        """Devices that held nothing during the cell are left out: on an 8-GPU box a model on
        one GPU would otherwise add seven "peak 0 B" parts to every cell's line."""
        parts = []
        devices = torch.cuda.device_count()
        for device in range(devices):
            before = self._allocated[device] if self._allocated and device < len(self._allocated) else 0
            now, reserved = torch.cuda.memory_allocated(device), torch.cuda.max_memory_reserved(device)
            if devices == 1 or reserved or now or before:
                parts.append(f"cuda:{device} peak {size(torch.cuda.max_memory_allocated(device))} "
                             f"allocated ({_signed(now - before)} kept), {size(reserved)} reserved")
        return "cell GPU memory (torch): " + ("; ".join(parts) or f"nothing held on any of the {devices} GPUs")

    def _sampled_line(self, tally: Optional["_CellTally"]) -> Optional[str]:
        sampler = self._sampler()
        if sampler is None:  # it stopped by itself (a lost GPU): said once, not after every cell
            if self._told_stopped:
                return None
            self._told_stopped = True
            return ("cell GPU memory: CUDA not started by this process and the live monitor has "
                    f"stopped; {self._stop_hint}")
        self._told_stopped = False
        # Read once, whole: the sampler thread may be adding the sample taken as the cell ended.
        taken, memory = tally.tallied if tally is not None else (0, {})
        if tally is None or tally.sampler is not sampler or not taken:
            return None  # e.g. print("x"): a line after each such cell would only be noise
        if sampler.recorded:  # --demo / --from FILE: not this machine's GPU at all
            source = f"{source_title(sampler)}, {count(taken, 'sample')}"
        else:
            source = f"NVML, all processes, {count(taken, 'sample')}; CUDA not started by this process"
        if not memory:  # a log without memory columns: said once, not an empty line per cell
            if self._told_unreported:
                return None
            self._told_unreported = True
            reporter = "the recording" if sampler.recorded else "NVML"
            return (f"cell GPU memory ({source}): {reporter} reports no memory used; later cells "
                    f"get no line while it reports none")
        parts, labels = [], torch_labels(sampler)
        for index in sorted(memory):
            first, peak, last = memory[index]
            start = tally.baseline.get(index)
            change = last - (first if start is None else start)
            named = f"GPU {index} ({labels[index]})" if index in labels else f"GPU {index}"
            parts.append(f"{named} peak {size(peak)} used ({_signed(change)})")
        return f"cell GPU memory ({source}): " + "; ".join(parts)


class _CellTally:
    """Memory used per GPU over every sample taken during a cell (a sampler listener), also
    those the sampler's buffer drops before the cell ends: an hour-long cell's early peak."""

    def __init__(self, sampler):
        self.sampler = sampler
        latest = sampler.latest()  # the cell's change is counted from the sample before it
        self.baseline = {r.index: r.memory_used for r in latest.gpus} if latest is not None else {}
        self.seen = sampler.count
        # (samples counted, GPU index -> (first, peak, last) memory used), replaced whole after
        # each sample: the cell's line is read in the main thread while the sampler thread may
        # be in add(), and removing the listener does not wait for a call in flight.
        self.tallied: Tuple[int, Dict[int, Tuple[int, int, int]]] = (0, {})

    def add(self, sampler) -> None:
        """After each sample, in the sampler thread (and once more when the run ends)."""
        if sampler.count == self.seen:
            return
        self.seen = sampler.count
        taken, memory = self.tallied
        memory = dict(memory)
        for reading in sampler.latest().gpus:
            used = reading.memory_used
            if used is not None:
                first, peak, _ = memory.get(reading.index, (used, used, used))
                memory[reading.index] = (first, max(peak, used), used)
        self.tallied = (taken + 1, memory)
