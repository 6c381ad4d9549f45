"""The sampler: one background thread per process that reads a device source into a ring buffer.

It reads and stores only what the live charts need (utilization, memory, power, temperature
per GPU: the source's light read, without processes or clocks), so an hour at one sample a
second stays small and each sample cheap. It never imports torch and never prints: the
displays read its buffer. A failure of the source (an exception, a lost GPU, a driver that
went away) stops it and is kept in :attr:`Sampler.error` for the display to show once.
"""
from __future__ import annotations

import atexit
import collections
import copy
import dataclasses
import numbers
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Dict, List, NamedTuple, Optional, Tuple

from ..devices import DeviceSource, Snapshot
from ..errors import UserError
from ..words import count

if TYPE_CHECKING:
    from ..torch_view import Status

THREAD_NAME = "colab_gpu-sampler"
# An hour: slower sampling cannot follow a notebook's cells, and far longer waits overflow
# threading's timeouts (threading.TIMEOUT_MAX), which killed the sampler thread.
MAX_INTERVAL = 3600.0
DEFAULT_INTERVAL = 1.0  # seconds between two samples, when neither --interval nor %config says
DEFAULT_HISTORY = 3600  # samples kept: an hour at the default interval
# How often a display waiting for a sample that is due looks again (wait() polls: see
# Sampler.__init__); until it is due, it sleeps.
POLL_SECONDS = 0.01
# The longest a fork waits for a read in flight (pause_for_fork): NVML answers in
# milliseconds; a read stuck on a lost GPU must not stop every fork of the process.
FORK_WAIT = 5.0


class LiveOptionError(UserError, ValueError):
    """An interval or history length the monitor cannot use, or sources start() cannot take
    together; the message says what was given and what is accepted."""


def check_interval(seconds: float, name: str = "the interval", shortest: float = 0.0) -> float:
    """``seconds`` as a float, or a LiveOptionError that says what is accepted; the one rule for
    the sampler, ``--interval`` and ``GPUMagics.live_interval``. ``shortest``: the shortest
    interval taken (start()'s floor, see ``colab_gpu.live.MIN_INTERVAL``); by default any
    positive number. Not a number: TypeError."""
    if isinstance(seconds, bool) or not isinstance(seconds, numbers.Real):
        raise TypeError(f"{name} is a number of seconds, e.g. 1 or 0.5; not {seconds!r}")
    if not (0 < seconds <= MAX_INTERVAL and seconds >= shortest):  # also refuses nan and inf
        accepted = (f"a number of seconds from {shortest:g} (NVML's counters change every 1/6 s "
                    f"to 1 s) to {MAX_INTERVAL:g}" if shortest else
                    f"a positive number of seconds up to {MAX_INTERVAL:g}")
        raise LiveOptionError(f"{name} must be {accepted} (an hour), e.g. 1 or 0.5; not {seconds:g}")
    return float(seconds)


def check_history(samples: int, name: str = "the history length") -> int:
    """``samples``, the buffer's length, or a LiveOptionError (TypeError: not a whole number)."""
    if isinstance(samples, bool) or not isinstance(samples, numbers.Integral):
        raise TypeError(f"{name} is a whole number of samples, e.g. 3600; not {samples!r}")
    if samples < 1:
        raise LiveOptionError(f"{name} must be at least 1 sample, not {samples!r}")
    return samples


class GPUReading(NamedTuple):
    """One GPU at one moment: the fields the live monitor draws (None where not reported)."""

    index: int  # type: ignore[assignment]  # the GPU's, named as everywhere; it shadows tuple.index
    utilization: Optional[float]  # percent of time a kernel ran
    memory_used: Optional[int]  # bytes
    memory_total: Optional[int]  # bytes
    power: Optional[float]  # watts
    temperature: Optional[float]  # degrees Celsius


class Sample(NamedTuple):
    """Every GPU at one moment; ``time`` is the wall-clock time the sampler read it."""

    time: float
    gpus: Tuple[GPUReading, ...]


def reading_of(gpu) -> GPUReading:
    return GPUReading(gpu.index, gpu.utilization_gpu, gpu.memory_used, gpu.memory_total,
                      gpu.power_draw, gpu.temperature)


PEAKS = ("utilization", "memory_used", "memory_total", "power", "temperature")  # RunTotals' peaks


@dataclasses.dataclass
class RunTotals:
    """One GPU's readings over every sample of the run, also those the buffer has dropped:
    what the summary's means and peaks are taken from (a two-hour run's early peak is gone
    from an hour-long buffer). A dataclass, so a RunRecord compares and converts whole."""

    busy_sum: float = 0.0
    busy_count: int = 0
    # each reading's own type: bytes an int, percent, watts and °C a float
    peaks: Dict[str, Any] = dataclasses.field(default_factory=lambda: dict.fromkeys(PEAKS))

    def add(self, reading: GPUReading) -> None:
        if reading.utilization is not None:
            self.busy_sum += reading.utilization
            self.busy_count += 1
        for name in PEAKS:
            value, peak = getattr(reading, name), self.peaks[name]
            if value is not None and (peak is None or value > peak):
                self.peaks[name] = value

    @property
    def busy_mean(self) -> Optional[float]:
        return self.busy_sum / self.busy_count if self.busy_count else None


def count_in(totals: Dict[int, RunTotals], sample: Sample) -> None:
    """Add ``sample``'s readings to ``totals`` (GPU index -> RunTotals)."""
    for reading in sample.gpus:
        totals.setdefault(reading.index, RunTotals()).add(reading)


def totals_of(samples) -> Dict[int, RunTotals]:
    """GPU index -> RunTotals over ``samples``, as the sampler keeps them while it runs."""
    totals: Dict[int, RunTotals] = {}
    for sample in samples:
        count_in(totals, sample)
    return totals


def snapshot_problem(snapshot: Snapshot) -> Optional[str]:
    """Why a snapshot cannot be charted: the source failed or a GPU fell off (one line)."""
    if snapshot.problem:
        return snapshot.problem
    failed = [f"GPU {gpu.index}: {gpu.error}" for gpu in snapshot.gpus if gpu.error]
    if failed:
        return "; ".join(failed)
    if not snapshot.gpus:
        return "the source shows no GPU"
    return None


def _one_line(error: Exception) -> str:
    return f"{type(error).__name__}: {error}"


class SourceError(UserError, ValueError):
    """The source could not be read at the start; the message is one line for the user."""


class Sampler:
    """Reads ``source`` every ``interval`` seconds into a buffer of the last ``history`` samples.

    ``start()`` launches a daemon thread and registers ``stop`` with ``atexit``; ``stop()`` ends
    the thread and waits for a read in flight, so the source (NVML) can be shut down safely
    afterwards. Listeners added with :meth:`add_listener` run in the thread after each sample.
    """

    def __init__(self, source: DeviceSource, interval: float = DEFAULT_INTERVAL, history: int = DEFAULT_HISTORY,
                 close_source: bool = False):
        check_history(history)
        self.source = source
        self.interval = check_interval(interval)
        self.close_source = close_source  # a source this sampler opened itself (a replay)
        self.error: Optional[str] = None  # why the sampler stopped by itself
        self.stop_reason: Optional[str] = None  # what stopped it on request ("%gpu_status --stop")
        self.listener_error: Optional[str] = None  # why a display was dropped
        self.gpu_names: Dict[int, str] = {}
        # The first sample's GPUs as the card sees them (cuda:N, hidden from torch): what the
        # displays label them by, read with the CUDA_VISIBLE_DEVICES of the start.
        self.torch_view: Optional[Status] = None
        # The source is a recording of some other machine (its first snapshot says so), not
        # this one's GPUs: every display marks it, whatever the source's label.
        self.recorded = False
        self.started_at: Optional[float] = None
        self.stopped_at: Optional[float] = None
        self._buffer: "collections.deque[Sample]" = collections.deque(maxlen=history)
        self.history = history  # samples kept for the charts
        self._totals: Dict[int, RunTotals] = {}  # GPU index -> over the whole run
        self._count = 0
        self._last_read = time.monotonic()  # when the latest sample was taken
        # Only C-level locks in ``with`` blocks, never a Condition or an Event waited on or set
        # by the caller: their __enter__ is Python code, so a Ctrl-C landing just after it
        # took the lock left it taken, the thread then waited for it forever and stop()
        # joined that thread. ``_lock`` guards the buffer; ``_running_gate`` is held from
        # the start and released to ask the thread to stop (it then takes it and ends).
        self._lock = threading.Lock()
        self._reading = threading.Lock()  # held by the thread while it reads: a fork waits for it
        self._fork_held = False  # pause_for_fork() holds _reading
        self._running_gate = threading.Lock()
        self._running_gate.acquire()
        self._stop_asked = False  # set after the release: a Ctrl-C between them asks again
        self._closed = False  # and one later in stop() leaves it to the next stop() to finish
        self._done = False
        self._thread: Optional[threading.Thread] = None
        self._listeners: List[Callable[["Sampler"], None]] = []

    @property
    def label(self) -> str:
        return self.source.label

    def __repr__(self) -> str:
        """What ``colab_gpu.live.start()`` shows as a cell's result: the run, not an address."""
        state = f"sampling every {self.interval:g} s" if self.running else "stopped"
        return f"<Sampler {self.label}: {state}, {count(self._count, 'sample')}>"

    @property
    def running(self) -> bool:
        return self._thread is not None and not self._done

    @property
    def closed(self) -> bool:
        """stop() ran to its end: the thread ended and an owned source was closed."""
        return self._closed

    @property
    def count(self) -> int:
        """Samples taken since the start (the buffer keeps the last ``history`` of them)."""
        return self._count

    def start(self) -> "Sampler":
        """Read once here (a source that cannot be read raises SourceError), then in a thread."""
        if self._thread is not None:
            return self
        first, problem = self._read(self.source.snapshot)  # whole: the labels need UUIDs, MIG
        if problem is not None:
            raise SourceError(f"{self.label}: {problem}")
        from ..torch_view import torch_view
        from ..runtime import detect_runtime

        self.torch_view = torch_view(first, detect_runtime())
        self.recorded = first.recorded
        self.started_at = time.time()
        self._record(first)
        self._thread = threading.Thread(target=self._run, name=THREAD_NAME, daemon=True)
        self._thread.start()
        # Registered after the source was created, so it runs before the source's own
        # atexit close (atexit runs last-registered first): NVML is never shut down under
        # a read in flight (nvitop's segfault).
        atexit.register(self.stop)
        return self

    def stop(self, reason: Optional[str] = None) -> None:
        """End the thread, wait for its read in flight, close a source it owns. Idempotent,
        and a call that Ctrl-C cut short is finished by the next one.
        ``reason``: what asked for it, for the displays that outlive the run; the first kept."""
        if not self._stop_asked:
            self.stop_reason = reason
            try:
                self._running_gate.release()
            except RuntimeError:  # released already (this stop was interrupted, or raced)
                pass
            self._stop_asked = True
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()
        atexit.unregister(self.stop)
        if self.close_source and not self._closed:
            self.source.close()
        self._closed = True

    def add_listener(self, listener: Callable[["Sampler"], None]) -> None:
        """Call ``listener(sampler)`` in the sampler thread after each sample and at the end."""
        self._listeners.append(listener)

    def remove_listener(self, listener: Callable[["Sampler"], None]) -> None:
        if listener in self._listeners:
            self._listeners.remove(listener)

    def samples(self) -> Tuple[Sample, ...]:
        with self._lock:
            return tuple(self._buffer)

    def samples_after(self, count: int) -> Tuple[int, Tuple[Sample, ...]]:
        """(count now, the samples taken after the ``count``-th that are still buffered)."""
        with self._lock:
            new = min(self._count - count, len(self._buffer))
            recent = tuple(self._buffer)[len(self._buffer) - new:] if new > 0 else ()
            return self._count, recent

    def totals(self) -> Dict[int, RunTotals]:
        """GPU index -> its readings over the whole run (the buffer keeps only the last)."""
        with self._lock:
            return copy.deepcopy(self._totals)

    def latest(self) -> Optional[Sample]:
        with self._lock:
            return self._buffer[-1] if self._buffer else None

    def wait(self, count: int, timeout: Optional[float] = None) -> bool:
        """Wait until more than ``count`` samples were taken or the sampler ended; False when
        ``timeout`` seconds passed first. It polls, sharing no lock with the thread, so that
        Ctrl-C can land anywhere in it (see __init__)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not (self._count > count or not self.running):
            now = time.monotonic()
            step = max(POLL_SECONDS, self._last_read + self.interval - now)  # till the next is due
            if deadline is not None:
                step = min(step, deadline - now)
                if step <= 0:
                    return False
            time.sleep(step)
        return True

    def _read(self, read: Callable[[], Snapshot]):
        """(snapshot, None), or (None, why the source cannot be read)."""
        try:
            snapshot = read()
        except Exception as error:  # a source that breaks its promise not to raise
            return None, _one_line(error)
        return snapshot, snapshot_problem(snapshot)

    def _run(self) -> None:
        try:
            next_time = time.monotonic() + self.interval
            while not self._running_gate.acquire(timeout=max(0.0, next_time - time.monotonic())):
                with self._reading:
                    snapshot, problem = self._read(self.source.light_snapshot)  # what _record keeps
                if problem is not None:
                    self.error = problem
                    break
                self._record(snapshot)
                next_time += self.interval
                if next_time < time.monotonic():  # a read took longer than the interval: no burst
                    next_time = time.monotonic()
        except Exception as error:  # a bug: the run ends and says why, like a failed read
            self.error = _one_line(error)
        finally:  # a dead thread must never leave a sampler that claims to run
            self.stopped_at = time.time()
            self._done = True
            self._notify()

    def _record(self, snapshot: Snapshot) -> None:
        for gpu in snapshot.gpus:
            self.gpu_names.setdefault(gpu.index, gpu.name)
        sample = Sample(time.time(), tuple(reading_of(gpu) for gpu in snapshot.gpus))
        with self._lock:
            self._buffer.append(sample)
            self._count += 1
            count_in(self._totals, sample)
        self._last_read = time.monotonic()
        self._notify()

    def _notify(self) -> None:
        for listener in list(self._listeners):
            try:
                listener(self)
            except Exception as error:  # a broken display must not stop the recording
                self.remove_listener(listener)
                self.listener_error = _one_line(error)

    def pause_for_fork(self) -> None:
        """Before a fork: wait for a read in flight and hold the next one back (see
        live.__init__'s fork hooks); resume_after_fork() lets the thread read again."""
        if self.running and self._thread is not threading.current_thread() and not self._fork_held:
            self._fork_held = self._reading.acquire(timeout=FORK_WAIT)

    def resume_after_fork(self) -> None:
        if self._fork_held:
            self._fork_held = False
            self._reading.release()

    def forked(self) -> None:
        """In a forked child: the thread was not copied, so the sampler has ended there, with
        fresh locks (one may have been held by the thread at the fork) and nothing to stop
        at the child's exit (its NVML belongs to the parent's run)."""
        self._lock = threading.Lock()
        self._reading = threading.Lock()
        self._fork_held = False
        self._done = True
        self.stopped_at = self.stopped_at or time.time()
        atexit.unregister(self.stop)
