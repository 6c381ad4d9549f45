"""What a batch-size search found: one row per trial, the answer, and how it was reached."""
from __future__ import annotations

import dataclasses
from typing import Optional, Tuple

from .. import words
from ..oom import ErrorKind
from ..render.shown import Shown
from ..words import NA, count, duration, significant

FITS = "fits"
OUT_OF_MEMORY = ErrorKind.OUT_OF_MEMORY.value
OVER_HEADROOM = "over headroom"  # ran, but its peak left less free memory than asked
DEVICE_BROKEN = ErrorKind.DEVICE_BROKEN.value
ERROR = ErrorKind.OTHER.value
INTERRUPTED = "interrupted"
RUNNING = "still running"  # ``stopped`` while the search goes on (the progress table)
INTERRUPTED_NOTE = "interrupted (Ctrl-C); the best size so far is the answer"  # ``stopped`` by Ctrl-C
INTERRUPTED_EARLY = "interrupted (Ctrl-C) before any size fitted"


@dataclasses.dataclass(frozen=True)
class Trial:
    """One size, run ``runs`` times; timings are the median of the timed runs."""

    size: int
    outcome: str
    peak_memory: Optional[int] = None  # bytes, on the device's own scale (see capacity)
    # Bytes in use before the trial ran, same scale: an out-of-memory error can leave memory
    # behind (address space on the CPU, reserved memory on CUDA), which raises it for later trials.
    baseline: Optional[int] = None
    capacity: Optional[int] = None  # bytes the device can give at most, same scale as peak_memory
    # Going past ``capacity`` gets the process killed (Linux's OOM killer, the CPU without an
    # address-space limit) instead of raising an out-of-memory error the search can survive.
    capacity_kills: bool = False
    seconds_per_step: Optional[float] = None
    runs: int = 0  # runs started, the failed one included
    error: Optional[str] = None  # "RuntimeError: ..." of a failed trial, first line
    # Out-of-memory errors the CUDA allocator counted while the trial ran and which never reached
    # the search: cuDNN's fallback to a smaller workspace, or a cell that skips its batch on OOM.
    caught_ooms: int = 0
    # The fastest and slowest timed runs (the middle half of them from four on) where they
    # disagreed even when the trial ran them again: a busy machine, so the time is uncertain.
    timing_range: Optional[Tuple[float, float]] = None

    @property
    def fits(self) -> bool:
        return self.outcome == FITS

    @property
    def too_large(self) -> bool:
        """The size did not fit: it ran out of memory, or over the headroom kept free."""
        return self.outcome in (OUT_OF_MEMORY, OVER_HEADROOM)

    @property
    def samples_per_second(self) -> Optional[float]:
        if not self.fits or not self.seconds_per_step:
            return None
        return self.size / self.seconds_per_step

    @property
    def samples_computed(self) -> int:
        """Samples of the runs that completed: a run cut short (out of memory, an error, Ctrl-C)
        computed none a user could keep. benchmarks/find_batch_vs_peers.py counts the other
        tools' steps the same way, once they complete."""
        return self.size * (self.runs if self.outcome in (FITS, OVER_HEADROOM) else max(self.runs - 1, 0))


def trial_row(trial: Trial) -> Tuple[str, str, str, str, str]:
    # samples/s with significant digits: a slow step's 0.4, not 0
    speed = trial.samples_per_second
    return (str(trial.size), trial.outcome, words.size(trial.peak_memory),
            duration(trial.seconds_per_step), NA if speed is None else significant(speed))


@dataclasses.dataclass(frozen=True)
class MemoryFit:
    """Peak memory = intercept + slope * batch size, from two measured successes."""

    intercept: float
    slope: float  # bytes per sample
    sizes: Tuple[int, int]  # the two sizes it was fitted on

    def memory_at(self, batch: float) -> float:
        return self.intercept + self.slope * batch

    def largest_under(self, limit: float) -> int:
        return int((limit - self.intercept) // self.slope)


@dataclasses.dataclass(frozen=True)
class Prior:
    """A plan's answer for ``gpu``, predicted before any trial: the search starts there, and
    its trials confirm it (it ran, and a size just above did not) or show it too high or low."""

    size: int
    gpu: str


@dataclasses.dataclass(frozen=True, repr=False)
class BatchResult(Shown):
    """The search's trials and its answer: ``answer`` is always a size that ran and fitted.

    ``print(result)`` is the table ``%%find_batch`` shows; ``result.rows()`` its rows.

    Attributes
    ----------
    variable : str
        The name of the size.
    mode : str
        ``"max"`` or ``"throughput"``.
    device : str
        The device searched on (``"cuda:0"``, ``"cpu"``).
    trials : tuple of Trial
        Each size tried, in order: its outcome, peak memory and time per step.
    answer : int or None
        The largest size that fits (max mode) or the fastest (throughput); None when no
        size fitted.
    largest_fitting, fastest : int or None
        The largest size that fitted, and the one with the most samples per second.
    capacity, usable : int or None
        The device's memory on the scale of the peaks, and what headroom left of it (bytes).
    fit : MemoryFit or None
        Peak memory as a line in the batch size, from two measured successes.
    stopped : str
        Why the search ended, one sentence.
    notes : tuple of str
        What else the user should know (a rounded ``start``, headroom not applied ...).
    plan : Prior or None
        The planned size the search started from (``find_batch(plan=...)``, ``--plan this``).
    """

    variable: str
    mode: str  # "max" or "throughput"
    device: str
    trials: Tuple[Trial, ...]
    answer: Optional[int]
    largest_fitting: Optional[int]
    fastest: Optional[int]  # best samples/s (throughput mode: not a larger size < 5 % faster)
    capacity: Optional[int]
    usable: Optional[int]  # capacity minus headroom
    fit: Optional[MemoryFit]
    stopped: str  # why the search ended, one sentence
    notes: Tuple[str, ...] = ()
    plan: Optional[Prior] = None
    # True when the user asked for text (%config GPUMagics.output = 'text'): no HTML view, so a
    # notebook shows the result, as the cell's Out too, as plain text.
    text_only: bool = dataclasses.field(default=False, repr=False, compare=False)

    @property
    def out_of_memory_count(self) -> int:
        return sum(trial.outcome == OUT_OF_MEMORY for trial in self.trials)

    @property
    def samples_computed(self) -> int:
        return sum(trial.samples_computed for trial in self.trials)

    @property
    def interrupted(self) -> bool:
        """Ctrl-C stopped the search: in a trial (its row says "interrupted"), or between two,
        held until the state was put back, where no trial was cut short and no row says so."""
        return self.stopped in (INTERRUPTED_NOTE, INTERRUPTED_EARLY)

    def rows(self):
        """(size, outcome, peak memory, time per step, samples/s) as text, one per trial."""
        return [trial_row(trial) for trial in self.trials]

    def tally(self) -> str:
        """Like "2 trials, 1 out of memory": in the summary line and in the facts under the table."""
        return f"{count(len(self.trials), 'trial')}, {self.out_of_memory_count} out of memory"

    line_view = "colab_gpu.batch.render:render_line"
    text_view = "colab_gpu.batch.render:render_text"  # the table %%find_batch shows
    html_view = "colab_gpu.batch.render:render_html"
