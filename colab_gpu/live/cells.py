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
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Mapping, Optional, Tuple

from ..host import process_cpu, usable_cores
from ..load import TUNE, CellLoad, busy_words, data_loaders, input_pipeline_hint
from ..spelling import command
from ..runtime import cuda_torch
from ..state import session
from ..words import count, size
from .panel import hidden_gpus, source_title, torch_labels

if TYPE_CHECKING:
    from .sampler import Sampler


def _signed(value: int) -> str:
    return ("+" if value >= 0 else "-") + size(abs(value))


class CellPeaks:
    """``before()`` at pre_run_cell, ``after()`` at post_run_cell returns the lines to show:
    the cell's memory, then how busy the GPU and the CPUs were (from the sampler's readings
    and the CPU times), with the input-pipeline hint when the GPU waited on saturated CPUs.
    ``namespace``: the notebook's, where the hint looks for the DataLoader to name."""

    def __init__(self, sampler: Callable[[], Optional[Sampler]], namespace: Optional[Mapping[str, Any]] = None):
        self._sampler = sampler  # the running sampler, looked up per cell
        self._namespace = namespace if namespace is not None else {}
        self._started: Optional[float] = None
        # wall clock, and process_cpu() then: the process, with its workers, its main thread's wanted time
        self._cpu: Optional[Tuple[float, float, Optional[float], Optional[float]]] = None
        self._allocated: Optional[List[int]] = None  # per torch device at the cell's start
        self._told_stopped = False  # the user was told the monitor stopped
        self._told_unreported = False  # ... that the source reports no memory used
        self._tally: Optional["_CellTally"] = None  # the samples of the cell running now
        # Said as its caller runs it, decided now: the lines are made in IPython's cell hooks,
        # outside the magic that turned them on (where as_magic() says nothing any more).
        self._stop_hint = command("%gpu_status --stop shows why and ends these lines",
                                  "colab_gpu.live.stop() says why")
        self._tune = command(*TUNE)

    def before(self) -> None:
        self._stop_tally()
        sampler = self._sampler()
        if sampler is not None:  # followed from now: the buffer may drop the cell's first samples
            self._tally = _CellTally(sampler)
            sampler.add_listener(self._tally.add)
        self._started = time.time()
        self._cpu = (time.monotonic(), *process_cpu())
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
        load = self._load(tally)
        torch = cuda_torch()
        memory = self._torch_line(torch) if torch is not None else self._sampled_line(tally)
        lines = [line for line in (self._load_line(load), memory, self._hint(load)) if line]
        return "\n".join(lines) or None

    def _load(self, tally: Optional["_CellTally"]) -> Optional[CellLoad]:
        """The cell's GPU and CPU busy shares; None without a sample of this machine's GPUs
        during it (a replay's GPUs are another machine's: no bound can be told from them)."""
        if tally is None or self._cpu is None or tally.sampler.recorded:
            return None
        taken, _, busy = tally.tallied
        if not taken:
            return None
        wall, process, tree, wanted = self._cpu
        seconds = max(time.monotonic() - wall, 1e-9)
        process_now, tree_now, wanted_now = process_cpu()
        cores, _ = usable_cores()
        hidden = hidden_gpus(tally.sampler)
        means = {index: total / samples for index, (total, samples) in busy.items() if index not in hidden}
        gpu = max(means, key=lambda index: means[index]) if means else None
        return CellLoad(seconds=seconds, samples=taken, gpu=gpu, gpu_busy=None if gpu is None else means[gpu],
                        process_cpu=(process_now - process) / seconds,
                        workers_cpu=None if tree is None or tree_now is None else (tree_now - tree) / seconds / cores,
                        cores=cores,
                        thread_wanted=None if wanted is None or wanted_now is None else (wanted_now - wanted) / seconds)

    def _load_line(self, load: Optional[CellLoad]) -> Optional[str]:
        """"cell load: GPU 0 busy 31 %; CPU: ...", kept for %gpu_status's advice when sampled
        twice at least (a shorter cell says nothing of a bound)."""
        if load is None:
            return None
        if load.samples >= 2:
            session.cell_load, session.cell_loaders = load, tuple(data_loaders(self._namespace))
        return f"cell load: {busy_words(load)}"

    def _hint(self, load: Optional[CellLoad]) -> Optional[str]:
        """The input-pipeline hint, last, naming the notebook's DataLoader."""
        return None if load is None else input_pipeline_hint(load, data_loaders(self._namespace), self._tune)

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
        taken, memory, _ = tally.tallied if tally is not None else (0, {}, {})
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
    """Memory used and busy per GPU over every sample taken during a cell (a sampler listener),
    also those the sampler's buffer drops before the cell ends: an hour-long cell's early peak."""

    def __init__(self, sampler):
        self.sampler = sampler
        latest = sampler.latest()  # the cell's change is counted from the sample before it
        self.baseline = {r.index: r.memory_used for r in latest.gpus} if latest is not None else {}
        self.seen = sampler.count
        # (samples counted, GPU index -> (first, peak, last) memory used, GPU index -> (busy
        # percent summed, readings)), replaced whole after each sample: the cell's line is read
        # in the main thread while the sampler thread may be in add(), and removing the listener
        # does not wait for a call in flight.
        self.tallied: Tuple[int, Dict[int, Tuple[int, int, int]], Dict[int, Tuple[float, int]]] = (0, {}, {})

    def add(self, sampler) -> None:
        """After each sample, in the sampler thread (and once more when the run ends)."""
        if sampler.count == self.seen:
            return
        self.seen = sampler.count
        taken, memory, busy = self.tallied
        memory, busy = dict(memory), dict(busy)
        for reading in sampler.latest().gpus:
            used = reading.memory_used
            if used is not None:
                first, peak, _ = memory.get(reading.index, (used, used, used))
                memory[reading.index] = (first, max(peak, used), used)
            if reading.utilization is not None:
                total, readings = busy.get(reading.index, (0.0, 0))
                busy[reading.index] = (total + reading.utilization, readings + 1)
        self.tallied = (taken + 1, memory, busy)
