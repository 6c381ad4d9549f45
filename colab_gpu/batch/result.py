"""What a batch-size search found: one row per trial, the answer, and how it was reached."""
from __future__ import annotations

import dataclasses
from typing import Optional, Tuple

from ..words import NA, count, duration, significant, size as format_size

FITS = "fits"
OUT_OF_MEMORY = "out of memory"
OVER_HEADROOM = "over headroom"  # ran, but its peak left less free memory than asked
DEVICE_BROKEN = "device broken"
ERROR = "error"
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

    @property
    def fits(self) -> bool:
        return self.outcome == FITS

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
    return (str(trial.size), trial.outcome, format_size(trial.peak_memory),
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
class BatchResult:
    """The search's trials and its answer: ``answer`` is always a size that ran and fitted."""

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

    def summary(self) -> str:
        tally = self.tally()
        if self.stopped == RUNNING:
            best = (f"{self.largest_fitting} fits so far" if self.largest_fitting is not None
                    else "nothing has fitted yet")
            return f"searching {self.variable}: {best} ({tally})"
        if self.answer is None:
            return f"no {self.variable} found: {self.stopped}"
        what = "fastest" if self.mode == "throughput" else "largest fitting"
        where = f" on {self.device}" if self.device else ""
        return f"{self.variable} = {self.answer} ({what}{where}, {tally})"

    def __repr__(self) -> str:
        return f"<BatchResult {self.summary()}>"

    def __str__(self) -> str:
        """The table ``%%find_batch`` shows, so ``print(find_batch(...))`` shows it in a script."""
        from .render import render_text

        return render_text(self)

    def _repr_pretty_(self, printer, cycle) -> None:
        printer.text(repr(self) if cycle else str(self))

    def _repr_html_(self) -> Optional[str]:
        """None when text_only: IPython's HTML formatter then leaves text/html out."""
        if self.text_only:
            return None
        from .render import render_html

        return render_html(self)
