"""The search itself, pure: it only sees ``run(size) -> Trial``, so any oracle can test it.

Max mode. When peak memory and capacity are measured, fit memory against batch size from
two small successes and jump most of the way to the predicted largest size (curves bend
upwards, so a long extrapolation overshoots), then refit from the two largest successes and
aim just under the new, short-range prediction so that one verifying run lands within
TOLERANCE (5 %) of it. A fit is refused while memory has not grown measurably; when it stays
flat over a FLAT_RANGE (512x) range (a cell that ignores the variable) the search falls back
for good to doubling, as it does where memory cannot be measured. A failed prediction steps
just under the failure, then bisects between the largest success and the smallest failure;
a fit that still predicts a size at or above a failure is wrong up there and is not followed.
A --start above what fits halves to a first success, then measures a size BELOW times
smaller, so that the fit, not blind bisection, places the rest. Throughput mode doubles from
the start and stops when two doublings in a row gain less than 5 % samples/s over the best,
which is then the answer (not a larger size a noise's width faster, for more memory);
a size that fails is not the end: it bisects between the largest success and the failure
until within TOLERANCE of it, under the same rule.

The answer is always a size that ran and fitted: never an interpolated one.
"""
from __future__ import annotations

import keyword
import math
import operator
import re
from typing import Callable, List, Optional, Tuple

from .. import words
from ..errors import UserError
from ..spelling import option
from ..words import count
from .result import (DEVICE_BROKEN, ERROR, INTERRUPTED, INTERRUPTED_EARLY, INTERRUPTED_NOTE,
                     OUT_OF_MEMORY, OVER_HEADROOM, RUNNING, BatchResult, MemoryFit, Trial)

MODES = ("max", "throughput")
DEFAULT_START = 2  # not 1: batch norm refuses a batch of one in training mode
DEFAULT_MAX = 65536
AIM = 0.8  # a long jump goes 80 % of the way to the predicted largest size: curves bend upwards
NEAR = 0.98  # a short-range prediction is verified 2 % under it
SHORT_RANGE = 0.5  # a prediction this far (in fit spans) beyond the largest success is short-range
UNDER_FAILURE = 0.9  # after the first failure of a fitted jump, try this share of it
LONGEST_JUMP = 64  # extrapolate at most this far from the largest success in one trial
FLAT_RANGE = 512  # memory flat (< FLAT_BYTES) over this size ratio: the cell ignores the variable
FLAT_BYTES = 256 * 1024  # 256 bytes a sample over that range: less than any real input row
SECOND = 8  # the second size, far enough from the first for memory to grow measurably
BELOW = 4  # from above: the size measured under the first success (near enough for a local fit)
TOLERANCE = 0.05  # max mode stops once the answer is proven within 5 % of the largest size that fits
THROUGHPUT_GAIN = 1.05  # a doubling must pay at least 5 % samples/s to go on
THROUGHPUT_PATIENCE = 2  # doublings in a row that do not pay before stopping: one slow trial is noise
SMALLEST_BARE_HEADROOM = 1024 ** 2  # a unit-less headroom below 1 MiB is a unit left out
_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "kib": 1024, "m": 1000 ** 2, "mb": 1000 ** 2,
          "mib": 1024 ** 2, "g": 1000 ** 3, "gb": 1000 ** 3, "gib": 1024 ** 3}


class SearchError(UserError, ValueError):
    """An option the search cannot work with; the message says what is accepted."""


class Headroom:
    """Memory to keep free: bytes (``512MiB``) or a share of capacity (``10%``)."""

    def __init__(self, spec="0"):
        self.spec = str(spec).strip()
        given = option("headroom", spec)  # as the caller wrote it: headroom=512 is no string
        if self.spec.startswith("-"):
            raise SearchError(f"{given}: headroom cannot be negative; give bytes like 512MiB or a "
                              f"percentage of device memory like 10%")
        match = re.fullmatch(r"([0-9]*\.?[0-9]+)\s*(%|[kmg]i?b?|b)?", self.spec.lower())
        if not match:
            raise SearchError(f"{given}: give bytes like 512MiB or 2GB, or a percentage of device "
                              f"memory like 10%")
        value, unit = float(match.group(1)), match.group(2) or ""
        if unit in ("", "b") and value != int(value):
            raise SearchError(f"{given}: a number without a unit is bytes; for a "
                              f"share of device memory write a percentage like 10%")
        if unit == "" and 0 < value < SMALLEST_BARE_HEADROOM:  # 10 meant 10% or 10GiB, never 10 bytes
            share = f"{int(value)}% for a share of device memory, or " if value < 100 else ""
            raise SearchError(f"{given}: a number without a unit is bytes, and {int(value)} bytes "
                              f"is less than one allocation; write {share}a unit like 512MiB or 2GiB "
                              f"({int(value)}b keeps {int(value)} bytes)")
        if unit == "%" and value >= 100:
            raise SearchError(f"{given}: a percentage must be below 100%")
        self.fraction = value / 100 if unit == "%" else None
        self.bytes = None if unit == "%" else int(value * _UNITS[unit])

    def usable(self, capacity: Optional[int]) -> Optional[int]:
        if capacity is None:
            return None
        if self.fraction is not None:
            return int(capacity * (1 - self.fraction))
        return max(0, capacity - (self.bytes or 0))  # a headroom above the device leaves nothing, not less

    @property
    def is_zero(self) -> bool:
        return not (self.fraction or self.bytes)


NO_HEADROOM = Headroom("0")
KILL_HEADROOM = Headroom("10%")  # the default where going past memory kills the process


def kill_note() -> str:
    """Why the default KILL_HEADROOM applies, and how to go without it."""
    return (f"{option('headroom', KILL_HEADROOM.spec, plain=True)} by default on the CPU: with no "
            f"address-space limit set, Linux kills a kernel that goes past the machine's memory "
            f"instead of raising an out-of-memory error the search survives; "
            f"{option('headroom', 0)} uses all of it")


def caught_note(variable: str, answer: int, caught: int) -> str:
    """The answer ran, but out-of-memory errors were caught inside it: harmless from cuDNN,
    a size that does not fit from a cell that skips its batch on them. Only the user knows."""
    return (f"{variable}={answer} ran with {count(caught, 'out-of-memory error')} caught inside it "
            f"(torch's CUDA allocator counted them): cuDNN's fallback to a smaller workspace does "
            f"that, and {answer} fits; a cell that skips its batch on out-of-memory does too, and "
            f"then {answer} does not fit: let that error out of the cell and search again")


def whole_number(name: str, value) -> int:
    """``value`` as an int if it is a whole number >= 1, NumPy's and torch's integers too (a
    size computed with them: ``max=np.int64(512)``), else SearchError naming the option."""
    try:
        number = 0 if isinstance(value, bool) else operator.index(value)
    except TypeError:  # 2.5, "8": not a whole number
        number = 0
    if number < 1:
        raise SearchError(f"{option(name, value)}: give a whole number >= 1")
    return number


def noise_floor(capacity: int) -> int:
    """Peak-memory growth below this is allocator rounding, not the batch."""
    return max(8 * 1024 ** 2, capacity // 200)


def aim_after_success(lo: int, predicted: int, fit_span: int) -> float:
    """Where to go from the largest success ``lo`` when the fit predicts ``predicted``.

    A long extrapolation (from two small sizes) goes AIM of the way. A short one (within
    SHORT_RANGE fit spans of ``lo``) goes NEAR the prediction, so one run verifies it. When
    ``lo`` is already within (1 - TOLERANCE)^2 of the prediction, probe ``lo / (1 - TOLERANCE)``:
    a failure there proves ``lo`` within TOLERANCE, and a success is most likely within
    TOLERANCE of the refitted prediction.
    """
    if lo >= (1 - TOLERANCE) ** 2 * predicted:
        return min(lo / (1 - TOLERANCE), predicted)
    candidate = lo + AIM * (predicted - lo)
    if predicted - lo <= SHORT_RANGE * fit_span:
        candidate = max(candidate, NEAR * predicted)
    return candidate


def step_after_failure(lo: int, hi: int, fitted: bool, first_failure: bool) -> float:
    """The next size between the largest success ``lo`` and the smallest failure ``hi``.

    The first failure of a fitted jump means the curve bent upwards a little more than the
    fit: try just under it (rounded up, so a near miss is still caught). Later failures, or
    no fit, bisect (geometrically over wide ranges).
    """
    if not fitted:
        return _middle(lo, hi)
    if first_failure:
        return max((lo + hi) / 2, math.ceil(UNDER_FAILURE * hi))
    return (lo + hi) / 2


def _line_through(small: Trial, large: Trial) -> MemoryFit:
    """Peak memory against size through two measured successes."""
    slope = (_peak(large) - _peak(small)) / (large.size - small.size)
    return MemoryFit(_peak(large) - slope * large.size, slope, (small.size, large.size))


def _peak(trial: Trial) -> int:
    """The peak memory of a success that measured it (see Search._measured)."""
    assert trial.peak_memory is not None, trial
    return trial.peak_memory


def _middle(lo: int, hi: int) -> float:
    """Bisect geometrically over wide ranges (2..16 -> 5.7, not 9), arithmetically over narrow ones."""
    return math.sqrt(lo * hi) if hi >= 4 * lo else (lo + hi) / 2


class _Stop(Exception):
    """Ends the search early (broken device, the user's error, Ctrl-C)."""


def check_variable(variable: str) -> str:
    """``variable`` if it can name the batch size, else SearchError saying what is accepted."""
    if not isinstance(variable, str) or not variable.isidentifier() or keyword.iskeyword(variable):
        raise SearchError(f"{option('variable', variable)}: give a Python variable name, like "
                          f"batch_size or bs")
    return variable


def _check_multiple(multiple_of: int, start: Optional[int], maximum: Optional[int]) -> None:
    """SearchError for a ``multiple_of`` above the largest size tried: no size would be left to
    try, and the search tried one above ``max`` (a start below the first multiple is raised to it)."""
    largest = maximum if maximum is not None else max(DEFAULT_MAX, start or 0)
    if multiple_of <= largest:
        return
    span = f"from {option('start', start)} to " if start is not None else "up to "
    span += option("max", maximum) if maximum is not None else \
        f"{largest}, the largest size tried without {option('max')}"
    raise SearchError(f"{option('multiple_of', multiple_of)} leaves no batch size to try {span}: give "
                      f"{option('multiple_of', largest)} or less, or {option('max', multiple_of)} or more")


class Search:
    """One search; ``result()`` may be called at any time for the best so far."""

    def __init__(self, run: Callable[[int], Trial], *, variable: str = "batch_size",
                 mode: str = "max", start: Optional[int] = None, maximum: Optional[int] = None,
                 multiple_of: int = 1, headroom=None, device: str = "",
                 on_trial: Callable[["Search"], None] = lambda search: None):
        if mode not in MODES:
            raise SearchError(f"{option('mode', mode)}: use one of {', '.join(MODES)}")
        check_variable(variable)
        multiple_of = whole_number("multiple_of", multiple_of)
        start, maximum = (None if value is None else whole_number(name, value)
                          for name, value in (("start", start), ("max", maximum)))
        _check_multiple(multiple_of, start, maximum)
        self.step = multiple_of
        first_size = max(DEFAULT_START, multiple_of)
        if start is None and maximum is not None:  # --max 1 alone asks for 1, not for 2
            first_size = min(first_size, maximum)
        self.start = self._align(start if start is not None else first_size)
        self.maximum = maximum if maximum is not None else max(DEFAULT_MAX, self.start)
        if self.maximum < self.start:  # a --start above --max: the size typed, and what --multiple-of made of it
            rounded = f" ({self.start} as a multiple of {multiple_of})" if self.start != start else ""
            raise SearchError(f"{option('max', self.maximum)} is below {option('start', start)}{rounded}")
        self._run, self.variable, self.mode, self.device = run, variable, mode, device
        self._headroom = (headroom if isinstance(headroom, Headroom) or headroom is None
                          else Headroom(headroom))
        self.on_trial = on_trial
        self.trials: List[Trial] = []
        # Sizes are multiples of multiple_of: a --start or --max between two is rounded down (a
        # start below the first multiple, up to it), as the user is told.
        self.notes: List[str] = [
            f"{option(name, given)} is not a multiple of {multiple_of}: {what} {size}"
            for name, given, size, what in (("start", start, self.start, "the first size tried is"),
                                            ("max", maximum, self._align(self.maximum), "sizes go up to"))
            if given is not None and given % multiple_of]
        self.stopped = "not started"
        self.refused = False  # memory stayed flat: no fit from now on
        self._plateau: Optional[Trial] = None  # throughput mode: the size larger ones did not pay over
        self._fit_stopped = False  # throughput mode ended at the memory fit's top

    # --- bookkeeping -------------------------------------------------------------------
    def _align(self, size: float) -> int:
        return max(self.step, int(size) // self.step * self.step)

    @property
    def capacity(self) -> Optional[int]:
        known = [trial.capacity for trial in self.trials if trial.capacity]
        return known[-1] if known else None

    @property
    def usable(self) -> Optional[int]:
        return self.headroom.usable(self.capacity)

    def _successes(self) -> List[Trial]:
        return sorted((t for t in self.trials if t.fits), key=lambda t: t.size)

    def _measured(self) -> List[Trial]:
        """The successes whose peak memory was measured, smallest first: what a fit uses."""
        return [t for t in self._successes() if t.peak_memory is not None]

    @property
    def lo(self) -> Optional[int]:
        successes = self._successes()
        return successes[-1].size if successes else None

    @property
    def hi(self) -> Optional[int]:
        failed = [t.size for t in self.trials if t.outcome in (OUT_OF_MEMORY, OVER_HEADROOM)]
        return min(failed) if failed else None

    @property
    def headroom(self) -> Headroom:
        """The --headroom given; by default none, except where going past the capacity gets the
        process killed instead of raising (the CPU without an address-space limit): there a
        search aiming at 98 % of memory would end with the kernel, not with an answer."""
        if self._headroom is not None:
            return self._headroom
        known = [trial for trial in self.trials if trial.capacity]
        return KILL_HEADROOM if known and known[-1].capacity_kills else NO_HEADROOM

    def attempt(self, size: int) -> Trial:
        trial = self._run(size)
        self.trials.append(trial)
        usable = self.usable if trial.capacity else None
        if trial.fits and not self.headroom.is_zero and trial.peak_memory and usable is not None \
                and trial.peak_memory > usable:
            trial = self.trials[-1] = Trial(**{**trial.__dict__, "outcome": OVER_HEADROOM})
        nothing_fits = usable is not None and usable <= 0
        if nothing_fits:
            self.stopped = (f"{option('headroom', self.headroom.spec, plain=True)} keeps all of "
                            f"the device's {words.size(trial.capacity)} free: no size can fit")
        self.on_trial(self)
        if nothing_fits:
            raise _Stop
        if trial.outcome == DEVICE_BROKEN:
            self.stopped = (f"{self.variable}={size} broke the device ({trial.error}); restart the "
                            f"runtime: nothing on this device works until the process restarts")
            raise _Stop
        if trial.outcome == ERROR:
            self.stopped = f"{self.variable}={size} raised {trial.error}"
            raise _Stop
        if trial.outcome == INTERRUPTED:
            self.stopped = self._interrupted_note()
            raise _Stop
        return trial

    def _interrupted_note(self) -> str:
        """Ctrl-C's stop: "the best size so far is the answer" only when one has fitted."""
        return INTERRUPTED_NOTE if self.lo is not None else INTERRUPTED_EARLY

    def fit(self, reach_back: bool = False) -> Optional[MemoryFit]:
        """Memory against size from the two largest measured successes, or None.

        ``reach_back`` (throughput mode): where those two grew less than the noise (sizes a
        sample apart: a jump to the fit's prediction, then its refit), from the largest and
        the largest one below it that used measurably less, which is no reason to double
        past them.
        """
        measured = self._measured()
        if self.refused or len(measured) < 2 or self.capacity is None:
            return None
        small, large = measured[-2], measured[-1]
        if _peak(large) - _peak(small) >= noise_floor(self.capacity):
            return _line_through(small, large)
        flat = _peak(large) - _peak(measured[0]) < FLAT_BYTES
        if flat and large.size >= FLAT_RANGE * measured[0].size:
            self.refused = True
            self.notes.append(
                f"peak memory did not grow from {self.variable}={measured[0].size} to "
                f"{large.size}: no memory fit (does the cell use {self.variable}?); doubling instead")
            return None
        if reach_back:
            for small in reversed(measured[:-2]):
                if _peak(large) - _peak(small) >= noise_floor(self.capacity):
                    return _line_through(small, large)
        return None

    # --- the two modes -----------------------------------------------------------------
    def run(self) -> BatchResult:
        self.stopped = RUNNING
        try:
            if self._first_success() is not None:
                if self.mode == "max":
                    self._largest()
                else:
                    self._fastest()
        except _Stop:
            pass
        except KeyboardInterrupt:  # ``run(size)`` may raise it between trials
            self.stopped = self._interrupted_note()
        return self.result()

    def _first_success(self) -> Optional[int]:
        size = self.start
        while not self.attempt(size).fits:
            if size <= self.step:
                self.stopped = f"even {self.variable}={size} does not fit"
                return None
            size = self._align(size // 2)
        return size

    def _close(self, lo: int, upper: int) -> bool:
        return upper - lo <= self.step or lo >= (1 - TOLERANCE) * upper

    def _next_size(self, failed_last: bool) -> Optional[int]:
        """The next size to run in max mode, or None when the answer is close enough."""
        lo, hi = self.lo, self.hi
        assert lo is not None  # called after the first success
        fit = self.fit()
        usable = self.usable
        predicted = fit.largest_under(usable) if fit is not None and usable is not None else None
        if predicted is not None and hi is not None and predicted >= hi:
            predicted = None  # a failure proved the fit wrong up there: bisect, not retry under it
        upper = min(x for x in (hi, predicted, self.maximum + 1) if x is not None)
        if hi is None and predicted is not None and predicted <= lo:
            self.stopped = f"the memory fit says {self.variable}={lo} is as large as fits"
            return None
        if self._close(lo, upper):
            self.stopped = (f"within {TOLERANCE:.0%} of the largest size that fits"
                            if upper <= self.maximum else f"reached {option('max', self.maximum)}")
            return None
        if failed_last and hi is not None:
            first_failure = sum(t.outcome in (OUT_OF_MEMORY, OVER_HEADROOM) for t in self.trials) == 1
            candidate = step_after_failure(lo, hi, fit is not None, first_failure)
        elif predicted is not None and fit is not None:
            candidate = aim_after_success(lo, predicted, lo - fit.sizes[0])
            if hi is None and candidate > LONGEST_JUMP * lo:
                candidate = math.sqrt(lo * candidate)  # refine the fit halfway (geometrically)
        elif hi is not None:
            candidate = _middle(lo, hi)
        else:
            measurable = self.capacity is not None and not self.refused
            candidate = lo * (SECOND if measurable else 2)
        ceiling = min(self.maximum, hi - 1) if hi is not None else self.maximum
        candidate = self._align(min(max(candidate, lo + self.step), ceiling))
        if candidate <= lo:
            self.stopped = f"within {TOLERANCE:.0%} of the largest size that fits"
            return None
        return candidate

    def _largest(self) -> None:
        self._measure_below()
        failed_last = False
        while True:
            size = self._next_size(failed_last)
            if size is None:
                return
            failed_last = not self.attempt(size).fits

    def _measure_below(self) -> None:
        """Started above what fits: the first success is the only measured size, and bisecting
        blind towards the failure above costs an out-of-memory error a step. A size BELOW
        times smaller is cheap and always fits; with it the memory fit places the rest."""
        lo = self.lo
        assert lo is not None  # called after the first success
        below = self._align(lo / BELOW)
        if self.hi is not None and len(self._measured()) == 1 and self.capacity is not None \
                and below < lo:
            self.attempt(below)

    def _fastest(self) -> None:
        """Double from the first success while samples/s pays. Once a size has failed, the
        sizes between the largest success and that failure are bisected, not given up: where
        samples/s still grew at the last doubling, the fastest size lies up there."""
        best = self._successes()[-1]
        unpaid: List[Tuple[int, int]] = []  # (lo, size) of the sizes up that did not pay
        while True:
            lo, hi, fit = self.lo, self.hi, self.fit(reach_back=True)
            assert lo is not None  # called after the first success
            if hi is not None and self._close(lo, hi):
                self.stopped = f"{self.variable}={hi} did not fit" + (
                    f", and {lo} is within {TOLERANCE:.0%} of it" if hi - lo > self.step else "")
                return
            ceiling = min(x for x in (self.maximum, hi and hi - 1,
                                      fit and self.usable and fit.largest_under(self.usable))
                          if x)
            size = self._align(min(2 * lo if hi is None else _middle(lo, hi), ceiling))
            if size <= lo:  # a failure just above lo ended the search before: the fit did this
                self._fit_stopped = ceiling != self.maximum
                self.stopped = (f"the memory fit says {self.variable}={lo} is as large as fits"
                                if self._fit_stopped else f"reached {option('max', self.maximum)}")
                return
            trial = self.attempt(size)
            if not trial.fits:
                continue  # the next size lies between the largest success and this failure
            if (trial.samples_per_second or 0) >= THROUGHPUT_GAIN * (best.samples_per_second or 0):
                best, unpaid = trial, []
                continue
            unpaid.append((lo, size))
            if len(unpaid) == THROUGHPUT_PATIENCE:
                doubled = all(size == 2 * lo for lo, size in unpaid)
                self._plateau = best
                self.stopped = (f"{'doubling' if doubled else 'going up'} to "
                                f"{' and '.join(str(size) for _, size in unpaid)} gained less than "
                                f"{THROUGHPUT_GAIN - 1:.0%} samples/s over {best.size}")
                return

    def result(self) -> BatchResult:
        successes = self._successes()
        largest = successes[-1].size if successes else None
        fastest = max(successes, key=lambda t: t.samples_per_second or 0).size if successes else None
        if self.mode == "throughput" and self._plateau is not None:
            fastest = self._plateau.size  # what larger sizes gained, under 5 %, is noise for more memory
        if any(t.samples_per_second is None for t in successes):
            fastest = None if self.mode == "max" else largest
        answer = fastest if self.mode == "throughput" else largest
        if self.trials and self.trials[-1].outcome == ERROR:
            answer = None  # the user's error is raised and nothing set: no "batch_size = 2" headline
        # the fit the search went by: a report that says "the memory fit says" shows that fit
        fit = self.fit(reach_back=self.mode == "throughput")
        return BatchResult(
            variable=self.variable, mode=self.mode, device=self.device, trials=tuple(self.trials),
            answer=answer, largest_fitting=largest, fastest=fastest, capacity=self.capacity,
            usable=self.usable, fit=fit, stopped=self.stopped,
            notes=tuple(self.notes) + ((kill_note(),) if self._kill_headroom_binds(fit) else ())
            + tuple(caught_note(self.variable, answer, trial.caught_ooms) for trial in successes
                    if trial.size == answer and trial.caught_ooms))

    def _kill_headroom_binds(self, fit: Optional[MemoryFit]) -> bool:
        """The default KILL_HEADROOM is in effect and memory bounds the answer: a size ran over
        it, or the fit puts the largest size under it below --max (in throughput mode, the
        search stopped there: where samples/s stopped paying first, memory bounded nothing)."""
        if self.headroom is not KILL_HEADROOM:  # given, or not where going past memory kills
            return False
        if any(trial.outcome == OVER_HEADROOM for trial in self.trials):
            return True
        if self.mode == "throughput":  # stopped by samples/s, memory bounded nothing
            return self._fit_stopped
        usable = self.usable  # known where a fit is
        return fit is not None and usable is not None and fit.largest_under(usable) <= self.maximum
