"""What tune_loader measured: each setting's rates, where a batch's time goes, the training
step's time, and the answer, with what would help where settings cannot."""
from __future__ import annotations

import dataclasses
import statistics
from typing import Any, Optional, Tuple

from ..render.shown import Shown
from .settings import Setting, rebuilt

__all__ = ["Measurement", "StepTiming", "LoaderTuning", "waiting"]


@dataclasses.dataclass(frozen=True)
class Measurement:
    """One setting, timed in ``rates`` (batches/s, one a round, each after the workers'
    start-up); ``startups``: seconds from ``iter()`` to the first batch, one a round;
    ``restart``: with persistent workers, a new epoch's wait for its first batch; ``error``:
    what a batch raised under this setting, a worker's traceback included."""

    setting: Setting
    rates: Tuple[float, ...] = ()
    startups: Tuple[float, ...] = ()
    samples_per_batch: Optional[float] = None
    with_startup: bool = False  # epochs too short to time past their start-up: the rates include it
    error: Optional[str] = None
    restart: Optional[float] = None

    @property
    def batches_per_second(self) -> Optional[float]:
        return statistics.median(self.rates) if self.rates else None

    @property
    def samples_per_second(self) -> Optional[float]:
        rate = self.batches_per_second
        return None if rate is None or self.samples_per_batch is None else rate * self.samples_per_batch

    @property
    def startup(self) -> Optional[float]:
        return statistics.median(self.startups) if self.startups else None

    @property
    def spread(self) -> Optional[float]:
        """Half the range of the rounds' rates, relative to their median: ±0.05 is ±5 %."""
        if len(self.rates) < 2:
            return None
        return (max(self.rates) - min(self.rates)) / 2 / statistics.median(self.rates)


@dataclasses.dataclass(frozen=True)
class StepTiming:
    """The training step's time for one of this loader's batches, where it came from, and the
    rates measured with the step in the loop (batches/s, one a round), for some settings."""

    seconds_per_batch: float
    source: str
    together: Tuple[Tuple[Setting, Tuple[float, ...]], ...] = ()

    def together_rate(self, setting: Setting) -> Optional[float]:
        for each, rates in self.together:
            if each == setting and rates:
                return statistics.median(rates)
        return None


def waiting(loader_rate: float, step_seconds: float, workers: int,
            together_rate: Optional[float] = None) -> Tuple[bool, float]:
    """Whether the loader bounds training, and the share of time the step waits for batches.
    Measured with both in the loop where ``together_rate`` is known (the step busy
    step_seconds x that rate); otherwise estimated: workers make batches beside the step, so
    it waits for what the loader is slower by; with no workers the loader makes each batch in
    the training loop's own thread, between two steps."""
    interval = 1 / loader_rate
    if together_rate is not None:
        share = max(0.0, 1 - step_seconds * together_rate)
    elif workers:
        share = max(0.0, 1 - step_seconds / interval)
    else:
        share = interval / (interval + step_seconds)
    return interval > step_seconds, share


@dataclasses.dataclass(frozen=True, repr=False)
class LoaderTuning(Shown):
    """A loader's settings measured.

    Attributes
    ----------
    name : str
        The loader's name in the notebook.
    current, answer, measured_answer, best : Setting
        The loader's own setting; the one to use (what ``new_loader()`` builds and ``call``
        writes); the measured row it was chosen from (``answer`` adds persistent workers where
        epochs pay their start-up, and the user's own pin_memory where it was not measured);
        the fastest.
    measurements : tuple of Measurement
        Every setting's rate and start-up.
    factors : tuple of float
        The answer's rate over the current's, one a round measuring both.
    rounds : int
        Rounds of timings.
    seconds : float
        Each timing's window.
    cores, cores_how : int, str
        The usable cores and how they were counted.
    load : float or None
        The machine's load average before timing.
    start_method : str
        The workers' start method (fork, spawn ...).
    device : str or None
        Where batches go: "cuda:0", None for the CPU.
    batch_size, batches_per_epoch : int or None
        The loader's batch size and batches in an epoch.
    split : Split
        Where a batch's time goes in the main process.
    step : StepTiming or None
        The training step's timing, with ``step=``.
    keeps_up : bool
        Chosen as the smallest setting that feeds the step, not within 5 % of the best.
    unresolved : tuple of Setting
        Settings the timings could not tell apart from the answer.
    hints, notes : tuple of str
        What would help where settings cannot; what else to know.
    call : str
        The DataLoader call to paste.
    interrupted : bool
        Ctrl-C cut the timings short: the answer is from what was measured.
    """

    name: str
    current: Setting
    answer: Setting
    measured_answer: Setting
    best: Setting
    measurements: Tuple[Measurement, ...]
    factors: Tuple[float, ...]  # the answer's rate over the current's, one a round measuring both
    rounds: int
    seconds: float  # each timing's window
    cores: int
    cores_how: str
    load: Optional[float]  # the machine's load average before timing (others' processes), None where unknown
    start_method: str
    device: Optional[str]  # where batches go: "cuda:0", None for the CPU
    batch_size: Optional[int]
    batches_per_epoch: Optional[int]
    split: Any  # measure.Split: where a batch's time goes in the main process
    step: Optional[StepTiming]
    keeps_up: bool  # chosen as the smallest setting that feeds the step, not within 5 % of the best
    unresolved: Tuple[Setting, ...]
    hints: Tuple[str, ...]  # what would help, where settings cannot
    notes: Tuple[str, ...]
    call: str  # the DataLoader call to paste
    interrupted: bool = False
    source: Any = dataclasses.field(default=None, repr=False, compare=False)  # the user's loader

    def measurement(self, setting: Setting) -> Optional[Measurement]:
        for measurement in self.measurements:
            if measurement.setting == setting:
                return measurement
        return None

    @property
    def current_measurement(self) -> Measurement:
        return self.measurements[0]

    @property
    def factor(self) -> Optional[float]:
        """How many times the current setting's batches/s the answer delivers (median of the
        rounds that measured both), None where the current setting failed."""
        return statistics.median(self.factors) if self.factors else None

    @property
    def unchanged(self) -> bool:
        return self.answer == self.current

    def new_loader(self):
        """A new DataLoader over the same dataset, sampler, batch size, collate_fn, drop_last
        and generator, with ``answer``'s settings (a torch DataLoader, whatever the class of
        the loader measured)."""
        return rebuilt(self.source, self.answer)

    line_view = "colab_gpu.loader.render:render_line"
    text_view = "colab_gpu.loader.render:render_text"
    html_view = "colab_gpu.loader.render:render_html"
