"""One trial: run the step at one size ``steps`` times, measure peak memory and time.

The first run is not timed (allocator warm-up, cuDNN autotuning, optimizer state). The
device is synchronized only when the user's code has already initialized CUDA, so timing
never starts CUDA behind the user's back. Memory is read where it can be measured:
torch's allocator on CUDA; on Linux CPUs, the process's peak resident memory (reset through
/proc/self/clear_refs) on the scale of the address-space limit or free RAM.
"""
from __future__ import annotations

import contextlib
import ctypes
import gc
import os
import signal
import statistics
import sys
import threading
import time
from typing import Callable, ContextManager, List, Optional, Tuple

from ..cuda import cuda_devices_in_use, empty_cuda_cache, working_device
from ..host import process_status, ram_available
from ..oom import ErrorKind, classify, describe, error_chain
from ..runtime import cuda_torch
from .result import FITS, INTERRUPTED, Trial


def _cuda_index(device: str) -> Optional[int]:
    """The CUDA device a spec means, or None when it is not (yet) a CUDA device.

    ``auto`` is the device the user's code runs on (see working_device): measuring the bare
    current device would read the wrong GPU and create a context on it."""
    torch = None if device == "cpu" else cuda_torch()
    if torch is None:
        return None
    if device.startswith("cuda:"):
        return int(device.split(":", 1)[1])
    current = torch.cuda.current_device()
    return working_device(current, cuda_devices_in_use(torch)) if device == "auto" else current


class CudaGauge:
    """torch's caching allocator: peak allocated bytes against what the allocator may hold."""

    def __init__(self, index: int):
        self.torch, self.index = sys.modules["torch"], index

    def reset(self) -> None:
        self.torch.cuda.reset_peak_memory_stats(self.index)
        self.before = self.torch.cuda.memory_allocated(self.index)

    def baseline(self) -> int:
        return self.before

    def peak(self) -> int:
        return self.torch.cuda.max_memory_allocated(self.index)

    def capacity(self) -> int:
        cuda = self.torch.cuda
        free, total = cuda.mem_get_info(self.index)
        limit = total
        fraction = getattr(cuda, "get_per_process_memory_fraction", None)
        if fraction is not None:
            limit = int(total * fraction(self.index))
        return min(limit, free + cuda.memory_reserved(self.index))

    def label(self) -> str:
        return f"cuda:{self.index} ({self.torch.cuda.get_device_name(self.index)})"

    capacity_kills = False  # torch raises OutOfMemoryError


class CpuGauge:
    """Linux only: peak resident memory of this process, reset per trial.

    Under an address-space limit (``ulimit -v``, RLIMIT_AS) the capacity is that limit and
    a trial's peak is the address space's new high (VmPeak) when it set one, else the
    address space in use before it plus the resident growth during it; otherwise the
    capacity is resident memory plus what the machine (or the cgroup) still has available.
    """

    def __init__(self):
        import resource  # POSIX only; available() has checked for Linux

        self.unlimited = resource.RLIM_INFINITY
        self.limit = resource.getrlimit(resource.RLIMIT_AS)[0]
        self.before = process_status()

    @staticmethod
    def available() -> bool:
        return sys.platform.startswith("linux") and os.access("/proc/self/clear_refs", os.W_OK)

    def reset(self) -> None:
        with open("/proc/self/clear_refs", "w") as clear:
            clear.write("5")  # resets VmHWM, the peak resident set
        self.before = process_status()

    def baseline(self) -> int:
        """In use before the trial: address space under a limit, else resident memory."""
        return self.before["VmRSS" if self.limit == self.unlimited else "VmSize"]

    def peak(self) -> int:
        now = process_status()
        grown = max(0, now["VmHWM"] - self.before["VmRSS"])
        if self.limit == self.unlimited:
            return self.before["VmRSS"] + grown
        if now["VmPeak"] > self.before["VmPeak"]:
            return now["VmPeak"]  # a new high of the address space: exact
        return min(self.before["VmSize"] + grown, self.before["VmPeak"])

    @property
    def capacity_kills(self) -> bool:
        """Under an address-space limit, malloc fails and torch raises; without one, Linux
        overcommits and its OOM killer ends the process (a Colab "session crashed")."""
        return self.limit == self.unlimited

    def capacity(self) -> int:
        if self.limit != self.unlimited:
            return self.limit
        return process_status()["VmRSS"] + (ram_available() or 0)  # no limit: the RAM's room alone

    def label(self) -> str:
        return "cpu"


def open_gauge(device: str, index: Optional[int], measure: bool = True):
    """The memory gauge for a device spec whose CUDA index is now ``index`` (``_cuda_index``),
    or None where memory cannot be measured."""
    if not measure:
        return None
    if index is not None:
        return CudaGauge(index)
    if device.startswith("cuda"):
        return None  # CUDA not started yet: the first run will start it
    return CpuGauge() if device in ("cpu", "auto") and CpuGauge.available() else None


def device_label(device: str) -> str:
    index = _cuda_index(device)
    if index is not None:
        return CudaGauge(index).label()
    return "cpu" if device == "auto" else device


def _cuda_ooms(index: Optional[int]) -> int:
    """The out-of-memory errors torch's caching allocator has raised on a started CUDA device,
    caught or not (0 before CUDA starts: its counts start there). The cudaMallocAsync backend
    does not count them."""
    if index is None:
        return 0
    return sys.modules["torch"].cuda.memory_stats(index).get("num_ooms", 0)


def trim_heap() -> None:
    """Hand glibc's free heap memory back to the system (Linux): kept, it stays resident and
    fragments the address space, so that what fits after a few trials, and after a failed one
    most, is far less than in a fresh process (a CNN under ulimit -v: 175 failed after 157
    ran; trimmed, 232 ran). Elsewhere (musl, macOS) there is nothing to call."""
    if not sys.platform.startswith("linux"):
        return
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return
    trim(0)


def release_memory(device: str) -> None:
    """Collect the garbage, give the heap's free memory, cached blocks and cuBLAS's workspaces
    back, reset the peak (CUDA only if started): memory returns to where it was before the trial."""
    gc.collect()
    trim_heap()
    index = _cuda_index(device)
    if index is not None:
        torch = sys.modules["torch"]
        empty_cuda_cache(torch)
        torch.cuda.reset_peak_memory_stats(index)


def _forget_frames(error: BaseException) -> None:
    """Cut the tracebacks along the chain: they hold the failed trial's tensors."""
    for link in error_chain(error):
        link.__traceback__ = None


class CtrlC:
    """Ctrl-C interrupts the user's step at once (and stops the search even when the cell
    catches it); anywhere else in the search it is held.

    Between steps the search restores state and frees memory: a KeyboardInterrupt there
    would escape half-way through a restore, or vanish into a finalizer (ipykernel's own
    hooks swallow it). Held, it stops the search before the next trial, everything restored.
    Signals reach only the main thread, so elsewhere there is nothing to hold; a handler
    installed from C (``getsignal`` gives None) could not be put back, so it is left alone.
    """

    def __init__(self):
        self.pressed = False
        self._in_step = False
        self._previous = None

    def __enter__(self) -> "CtrlC":
        if threading.current_thread() is threading.main_thread() \
                and signal.getsignal(signal.SIGINT) is not None:
            self._previous = signal.signal(signal.SIGINT, self._on_sigint)
        return self

    def __exit__(self, *exc_info) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)

    def _on_sigint(self, signum, frame) -> None:
        self.pressed = True  # also in the step: a cell may catch it (a loop's early stop)
        if self._in_step:
            raise KeyboardInterrupt

    @contextlib.contextmanager
    def deliverable(self):
        """While the user's code runs, Ctrl-C raises KeyboardInterrupt as usual."""
        self._in_step = True
        try:
            yield
        finally:
            self._in_step = False


MOST_RUNS = 1000  # a cell of a few µs stops here, not after min_timed of runs


def stops_the_search(error: Optional[BaseException]) -> bool:
    """Whether the error a run raised stops the search as the user's error, which they are
    shown: raised again when the search ends, or named in its stop where it broke the device.
    Any error but two: Ctrl-C stops the search as asked, and after an out-of-memory error it
    tries a smaller size. ``sys.exit()`` in the cell (SystemExit) is the user's error too."""
    return error is not None and not isinstance(error, KeyboardInterrupt) \
        and classify(error) is not ErrorKind.OUT_OF_MEMORY


def _enough(runs: int, steps: int, timings, min_timed: float) -> bool:
    return runs >= steps and (sum(timings) >= min_timed or runs >= MOST_RUNS)


# Timed runs disagree when the slower took UNEVEN times the faster and UNEVEN_FLOOR seconds more
# (less is one of the scheduler's time slices, not the step): on a busy CPU neighbouring sizes
# were timed 10x apart.
UNEVEN = 1.5
UNEVEN_FLOOR = 1e-3


def timing_range(timings) -> Optional[Tuple[float, float]]:
    """The fastest and slowest timed runs, of the middle half from four on (one hiccup in a
    thousand runs of a fast step is no disagreement); None where fewer than two were timed."""
    if len(timings) < 2:
        return None
    ordered = sorted(timings)
    cut = len(ordered) // 4
    return ordered[cut], ordered[-1 - cut]


def uneven(span: Optional[Tuple[float, float]]) -> bool:
    return span is not None and span[1] > UNEVEN * span[0] and span[1] - span[0] > UNEVEN_FLOOR


def _spread(timings) -> float:
    """How many times the fastest timed run the slowest took (of the middle half, as above)."""
    span = timing_range(timings)
    return span[1] / span[0] if span and span[0] else float("inf")


def _run_once(step: Callable[[int], object], size: int, ctrl_c: Optional[CtrlC]) -> float:
    """Run ``step(size)`` once, Ctrl-C deliverable in it; when it began (time.perf_counter)."""
    began = time.perf_counter()
    with ctrl_c.deliverable() if ctrl_c else contextlib.nullcontext():
        step(size)
    if ctrl_c is not None and ctrl_c.pressed:  # the cell caught it: stop all the same,
        raise KeyboardInterrupt  # this run cut short is no fitting size
    return began


def run_trial(step: Callable[[int], object], size: int, steps: int = 3, device: str = "auto",
              measure: bool = True, ctrl_c: Optional[CtrlC] = None, min_timed: float = 0.0,
              around: Callable[[], ContextManager] = contextlib.nullcontext,
              ) -> Tuple[Trial, Optional[BaseException]]:
    """Run ``step(size)`` ``steps`` times, and more (up to MOST_RUNS) until the timed runs add
    up to ``min_timed`` seconds; the error comes back only when the user must see it.

    Each run is inside ``around()`` (the magic hides later runs' output there), untimed: a
    fixed cost per run would make larger sizes look faster in throughput mode. Ctrl-C is
    held there too, so hiding is never left half-undone. Timed runs that disagree (see
    ``uneven``) are run once more, as many: a busy moment passes, and the calmer set is kept;
    where both disagree the trial's ``timing_range`` says by how much.

    An out-of-memory error or Ctrl-C is dropped here, outside the ``except`` block, with
    its frames, so that the failed trial's tensors can be freed. Out-of-memory errors the CUDA
    allocator counted but the step caught are recorded, not taken for a failure: cuDNN catches
    its own when it falls back to an algorithm with a smaller workspace, and the size runs.
    """
    __tracebackhide__ = True  # IPython shows the user's frames of their error, not ours
    # Resolved once per trial, not in each timed run (for auto it asks every GPU for a context).
    index = _cuda_index(device)
    gauge = open_gauge(device, index, measure)
    if gauge is not None:
        gauge.reset()
    timings: List[float] = []
    runs, error, ooms = 0, None, _cuda_ooms(index)
    first: Optional[List[float]] = None  # the timed runs, where they disagreed and are being run again
    try:
        while True:
            if first is None and _enough(runs, steps, timings, min_timed):
                if not uneven(timing_range(timings)):
                    break
                first, timings = timings, []  # once more, as many timed runs
            if first is not None and len(timings) >= len(first):
                break
            runs += 1
            with around():  # entered and left outside the timed region
                began = _run_once(step, size, ctrl_c)
                started_cuda = False
                if runs == 1 and index is None:  # the first run may have started CUDA
                    index = _cuda_index(device)
                    started_cuda = index is not None
                if index is not None:  # wait for queued GPU work: timing, and async errors in their trial
                    sys.modules["torch"].cuda.synchronize(index)
                if runs > 1 or steps == 1:  # the first run is warm-up, unless it is all there is
                    timings.append(time.perf_counter() - began)
            if started_cuda:
                gauge = open_gauge(device, index, measure)
                if gauge is not None:  # measure=False: none
                    gauge.reset()
    except BaseException as caught:  # Ctrl-C is a trial outcome too
        error = caught
    if first is not None and error is None:
        timings = min(first, timings, key=_spread)
    span = timing_range(timings)
    if error is None:
        return Trial(size, FITS, peak_memory=gauge.peak() if gauge else None,
                     baseline=gauge.baseline() if gauge else None,
                     capacity=gauge.capacity() if gauge else None,
                     capacity_kills=bool(gauge and gauge.capacity_kills),
                     seconds_per_step=statistics.median(timings), runs=runs,
                     caught_ooms=_cuda_ooms(index) - ooms, timing_range=span if uneven(span) else None), None
    interrupted = isinstance(error, KeyboardInterrupt)
    kind = None if interrupted else classify(error)
    trial = Trial(size, INTERRUPTED if kind is None else kind.value, runs=runs,
                  baseline=gauge.baseline() if gauge else None,
                  capacity=gauge.capacity() if gauge and kind is ErrorKind.OUT_OF_MEMORY else None,
                  capacity_kills=bool(gauge and gauge.capacity_kills), error=describe(error))
    if not stops_the_search(error):
        _forget_frames(error)
        error = None
    return trial, error
