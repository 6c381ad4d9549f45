"""Timing a DataLoader: a window of batches after its workers' start-up, the split of one batch's
time in the main process, a training step on a batch, and a persistent loader's new epoch.

Everything here runs on copies (settings.rebuilt): the user's loader, and the iterator it may
hold, are never iterated. Each copy's workers are shut down before the next is started, also
when a batch raises; :func:`random_state_kept` puts back every random generator a copy draws
from, so the user's next epoch comes in the order it would have.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import random
import sys
import time
import traceback
from typing import Any, Callable, Iterator, List, Optional, Tuple

from .settings import LoaderError

__all__ = ["Window", "Split", "random_state_kept", "shut_down", "time_window", "split_batch",
           "step_seconds", "restart_seconds", "error_text", "batch_length", "mover", "MIN_BATCHES"]

MIN_BATCHES = 3  # timed batches a window needs at least, however slow they are
MAX_EPOCHS = 3  # epochs one window starts where an epoch is shorter than the window
BLOCKED_MIN = 0.05  # seconds of fetching below which the share spent blocked is not told
COLLATE_CHECKED = 0.3  # collate_fn's share of a batch above which it is timed again on one thread
Clock = Callable[[], float]


@dataclasses.dataclass(frozen=True)
class Window:
    """One timing of a setting: ``batches`` (holding ``samples``) took ``seconds`` once the
    first round of batches (one a worker) had arrived; ``startup``: from ``iter()`` to the
    first batch. ``with_startup``: its epochs were too short to time anything past their first
    round, so the time includes the start-up."""

    batches: int
    samples: Optional[int]
    seconds: float
    startup: float
    with_startup: bool = False

    @property
    def rate(self) -> float:
        return self.batches / self.seconds if self.seconds > 0 else float("inf")


def _generators(loader) -> List[Any]:
    """The torch generators the loader's iteration draws from, each once: its own, its
    sampler's and its batch sampler's sampler's (one object where DataLoader passed it on)."""
    found: List[Any] = []
    for holder in (loader, loader.sampler, getattr(loader.batch_sampler, "sampler", None)):
        generator = getattr(holder, "generator", None)
        if generator is not None and hasattr(generator, "get_state") and all(generator is not g for g in found):
            found.append(generator)
    return found


@contextlib.contextmanager
def random_state_kept(loader) -> Iterator[None]:
    """Put back, on the way out, the random state a copy of ``loader`` draws from: torch's
    global generator (a shuffling sampler without a generator seeds itself from it, and every
    iterator draws its workers' base seed), the loader's and its samplers' own generators,
    and Python's and NumPy's global ones (a transform run in this process draws from them).
    A generator the dataset keeps inside itself advances, as in any use of the dataset."""
    import torch

    generators = [(generator, generator.get_state()) for generator in _generators(loader)]
    torch_state = torch.get_rng_state()
    python_state = random.getstate()
    numpy = sys.modules.get("numpy")
    numpy_state = numpy.random.get_state() if numpy is not None else None
    try:
        yield
    finally:
        for generator, state in generators:
            generator.set_state(state)
        torch.set_rng_state(torch_state)
        random.setstate(python_state)
        if numpy is not None:
            numpy.random.set_state(numpy_state)


def shut_down(iterator, loader=None) -> None:
    """Stop an iterator's worker processes now, not when the garbage collector gets to it: an
    error's traceback holds the iterator (its frames' ``self``) for as long as it is shown.
    A loader with persistent workers keeps its iterator to reset it on the next ``iter()``:
    ``loader`` forgets it, so that the next epoch starts new workers."""
    stop = getattr(iterator, "_shutdown_workers", None)
    if stop is not None:
        stop()
    if loader is not None and getattr(loader, "_iterator", None) is iterator:
        loader._iterator = None


def batch_length(batch, depth: int = 0) -> Optional[int]:
    """The samples in a batch: the first dimension of its first tensor or array (inside a
    tuple, list or dict, as collate functions build them), else a list's length."""
    shape = getattr(batch, "shape", None)
    if shape is not None:
        return int(shape[0]) if len(shape) else None
    if depth > 3:
        return None
    if isinstance(batch, dict):
        return batch_length(next(iter(batch.values())), depth + 1) if batch else None
    if isinstance(batch, (list, tuple)):
        if not batch:
            return 0
        first = batch[0]
        if hasattr(first, "shape") or isinstance(first, (list, tuple, dict)):
            return batch_length(first, depth + 1)
        return len(batch)
    return None


def mover(device: str, non_blocking: bool) -> Callable[[Any], Any]:
    """A function that copies a batch's tensors to ``device``, keeping its structure."""
    def moved(batch):
        if hasattr(batch, "to") and hasattr(batch, "is_pinned"):
            return batch.to(device, non_blocking=non_blocking)
        if isinstance(batch, dict):
            return {key: moved(value) for key, value in batch.items()}
        if isinstance(batch, (list, tuple)):
            items = [moved(value) for value in batch]
            return type(batch)(*items) if hasattr(batch, "_fields") else type(batch)(items)
        return batch
    return moved


def _no_wait() -> None:
    pass


def time_window(loader, seconds: float, deliver: Optional[Callable[[Any], Any]] = None,
                wait: Callable[[], None] = _no_wait, length: Callable[[Any], Optional[int]] = batch_length,
                clock: Clock = time.perf_counter) -> Window:
    """Iterate ``loader`` (a copy) and time its batches after the first round, one a worker,
    which arrives together after the start-up: at least ``seconds`` and MIN_BATCHES, within
    MAX_EPOCHS epochs. ``deliver(batch)``: what each batch goes through (the copy to the device,
    a training step); ``wait()``: waits for the device's queued work before the clock is read
    at the window's ends. The copy's workers are shut down before this returns or raises."""
    skip = max(1, loader.num_workers)
    timed = 0.0
    batches = 0
    samples: Optional[int] = 0
    startup: Optional[float] = None
    # seconds, batches, samples of whole epochs, start-up included
    whole_seconds, whole_batches = 0.0, 0
    whole_samples: Optional[int] = 0
    iterator = None
    try:
        for _ in range(MAX_EPOCHS):
            began = clock()
            iterator = iter(loader)
            index, mark = 0, None
            for batch in iterator:
                size = length(batch)
                if deliver is not None:
                    deliver(batch)
                index += 1
                if index == 1 and startup is None:
                    wait()
                    startup = clock() - began
                whole_batches += 1
                whole_samples = None if whole_samples is None or size is None else whole_samples + size
                if index == skip:
                    wait()
                    mark = clock()
                elif mark is not None:  # past the first round: index > skip
                    batches += 1
                    samples = None if samples is None or size is None else samples + size
                    if batches >= MIN_BATCHES and timed + clock() - mark >= seconds:
                        break
            wait()
            end = clock()
            shut_down(iterator, loader)
            iterator = None
            whole_seconds += end - began
            if mark is not None and index > skip:
                timed += end - mark
            if batches >= MIN_BATCHES and timed >= seconds:
                break
    finally:
        if iterator is not None:
            shut_down(iterator, loader)
    if startup is None:
        raise LoaderError("the loader yields no batch: its dataset or sampler is empty")
    if batches == 0:
        return Window(whole_batches, whole_samples, whole_seconds, startup, with_startup=True)
    return Window(batches, samples, timed, startup)


@dataclasses.dataclass(frozen=True)
class Split:
    """Where one batch's time goes in the main process (num_workers=0), seconds per batch:
    fetching its items (``__getitem__``, or ``__getitems__``, or the iterable dataset's
    ``next``), ``collate_fn``, and the copy to the device (None: the batches stay on the CPU).
    ``fetch_blocked``: the share of the fetch time this thread neither ran nor waited for a
    core (Linux's scheduler statistics): items waiting on storage or the network; None where
    that cannot be told from a busy machine's wait for a core."""

    batches: int
    fetch: float
    collate: float
    transfer: Optional[float]
    fetch_blocked: Optional[float]
    items: Optional[float]  # items a batch held, on average
    collate_one_thread: Optional[float] = None  # collate_fn with torch on one thread, where it was checked

    @property
    def total(self) -> float:
        return self.fetch + self.collate + (self.transfer or 0.0)

    def share(self, part: str) -> float:
        return (getattr(self, part) or 0.0) / self.total if self.total else 0.0


def _fetcher(loader) -> Tuple[Iterator[Any], Callable[[Any], Any]]:
    """The work one batch starts from and how its items are fetched, as torch's own fetchers
    do it in the main process."""
    from torch.utils.data import IterableDataset

    dataset = loader.dataset
    auto = loader.batch_sampler is not None  # torch batches the items (batch_size or batch_sampler)
    if isinstance(dataset, IterableDataset):
        items = iter(dataset)
        size = loader.batch_size if auto else None

        def fetch_iterable(_):
            if size is None:
                return next(items)
            batch = []
            for item in items:
                batch.append(item)
                if len(batch) == size:
                    break
            if not batch or (len(batch) < size and loader.drop_last):
                raise StopIteration
            return batch
        return iter(int, 1), fetch_iterable  # an endless source of placeholders
    if not auto:
        return iter(loader.sampler), dataset.__getitem__
    many = getattr(dataset, "__getitems__", None)
    if many:
        return iter(loader.batch_sampler), many
    return iter(loader.batch_sampler), lambda indices: [dataset[index] for index in indices]


def split_batch(loader, seconds: float, transfer: Optional[Callable[[Any], Any]] = None,
                wait: Callable[[], None] = _no_wait, clock: Clock = time.perf_counter) -> Tuple[Split, Any]:
    """Time fetch, collate and transfer separately in this process, batch after batch, for at
    least ``seconds`` (the first batch untimed, as a warm-up, unless it is the only one); and
    the last batch as the loader yields it, for timing a step on it."""
    keys, fetch = _fetcher(loader)
    collate = loader.collate_fn
    totals = [0.0, 0.0, 0.0, 0.0]  # fetch, collate, transfer, fetch on a core or queued for one
    batches, items, last, last_data, first = 0, 0, None, None, None
    reader = _scheduled()
    scheduled = reader or (lambda: 0.0)
    while True:
        try:
            key = next(keys)
            began, busy = clock(), scheduled()
            data = fetch(key)
        except StopIteration:
            break
        fetched, busy = clock(), scheduled() - busy
        batch = collate(data)
        collated = clock()
        if transfer is not None:
            transfer(batch)
            wait()
        done = clock()
        size = len(data) if isinstance(data, list) else 1
        times = (fetched - began, collated - fetched, done - collated, busy)
        if first is None:
            first = (times, size)
        else:
            batches += 1
            items += size
            totals = [total + each for total, each in zip(totals, times)]
        last, last_data = batch, data
        if batches >= 2 and totals[0] + totals[1] + totals[2] >= seconds:
            break
    if first is None:
        raise LoaderError("the loader yields no batch: its dataset or sampler is empty")
    if batches == 0:  # an epoch of one batch: its warm-up is all there is
        totals, batches, items = list(first[0]), 1, first[1]
    blocked = None
    if reader is not None and totals[0] >= BLOCKED_MIN:
        blocked = min(1.0, max(0.0, 1 - totals[3] / totals[0]))
    collate_seconds = totals[1] / batches
    one_thread = None
    if collate_seconds >= COLLATE_CHECKED * (totals[0] + totals[1] + totals[2]) / batches:
        one_thread = _one_thread(collate, last_data, clock)
    return Split(batches, totals[0] / batches, collate_seconds,
                 totals[2] / batches if transfer is not None else None, blocked,
                 items / batches if loader.batch_sampler is not None else 1.0, one_thread), last


def _one_thread(collate, data, clock: Clock) -> Optional[float]:
    """collate_fn's time on the last batch's items with torch running one thread (the median of
    three), torch's own count put back after; None where torch already runs one. On a busy
    machine torch's threads can wait for each other: stacking a batch took 290 ms with two
    threads and 0.8 ms with one on a 2-core machine at a load of 8 (workers run one thread)."""
    import torch

    threads = torch.get_num_threads()
    if threads == 1:
        return None
    times = []
    try:
        torch.set_num_threads(1)
        for _ in range(3):
            began = clock()
            collate(data)
            times.append(clock() - began)
    finally:
        torch.set_num_threads(threads)
    return sorted(times)[1]


def read_scheduled() -> float:
    """Seconds this thread has computed (its CPU clock) or waited in a core's queue (Linux's
    scheduler statistics): the rest of a stretch of time, it was blocked, reading a file."""
    with open("/proc/thread-self/schedstat") as file:
        queued = int(file.read().split()[1])
    return time.thread_time() + queued / 1e9


def _scheduled() -> Optional[Callable[[], float]]:
    """read_scheduled where Linux has it, else None."""
    try:
        read_scheduled()
    except (OSError, ValueError, IndexError):
        return None
    return read_scheduled


def step_seconds(step: Callable[[Any], Any], batch, seconds: float, wait: Callable[[], None] = _no_wait,
                 clock: Clock = time.perf_counter) -> Tuple[float, int]:
    """Seconds ``step(batch)`` takes, once warm: the mean of runs for at least ``seconds``
    (three at least) after one untimed run; and how many runs were timed."""
    step(batch)
    wait()
    runs, began = 0, clock()
    while runs < MIN_BATCHES or clock() - began < seconds:
        step(batch)
        runs += 1
    wait()
    return (clock() - began) / runs, runs


def restart_seconds(loader, clock: Clock = time.perf_counter) -> float:
    """For a copy with persistent workers: seconds from a second ``iter()`` (a new epoch, the
    workers kept) to its first batch. Its workers are shut down before this returns."""
    iterator = iter(loader)
    try:
        next(iterator)
        began = clock()
        iterator = iter(loader)  # the same iterator, reset: its workers start the epoch again
        next(iterator)
        return clock() - began
    finally:
        shut_down(iterator, loader)


_HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # colab_gpu/


def error_text(error: BaseException) -> str:
    """An error a batch raised, as the user needs to read it: a worker's error carries the
    worker's own traceback in its message (torch puts it there); an error raised in this
    process gets its traceback without colab_gpu's and torch's DataLoader frames."""
    message = "".join(traceback.format_exception_only(type(error), error)).rstrip()
    if "Original Traceback" in message:
        return message
    torch_data = os.path.join("torch", "utils", "data")
    frames = [frame for frame in traceback.extract_tb(error.__traceback__)
              if not frame.filename.startswith(_HERE) and torch_data not in frame.filename]
    if not frames:
        return message
    return "Traceback (most recent call last):\n" + "".join(traceback.format_list(frames)) + message
