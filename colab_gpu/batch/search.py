"""The search itself, pure: it only sees ``run(size) -> Trial``, so any oracle can test it.

Max mode. Every sentence the result ends on is backed by trials: the answer ran, and it is
"within X % of the largest size that fits" only once a size at most X % above it failed
(TOLERANCE, 5 %, is where the search stops); otherwise the result says what is known (the
largest that ran, the next size not tried) and the search goes on while its budget of
MAX_TRIALS allows.

When peak memory and capacity are measured, memory is fitted against batch size through two
measured successes whose peaks differ by FIT_NOISES noise floors at least (a slope through
two sizes a few samples apart is noise), and only on successes that share a baseline: after a
failure that left memory behind (address space on the CPU, reserved or fragmented memory on
CUDA), the memory in use before the next trial has moved, and the peaks before it are on
another footing. Where a failure costs no more than a trial (CUDA), the next size is the
fit's prediction itself: with a trial on the other side of it, TOLERANCE away, that proves
the answer wherever the prediction was within TOLERANCE. Where a failure lowers what fits
afterwards (the CPU, or once a failure has been seen to move the baseline), the top is
approached from below (a long jump AIM of the way, a short one NEAR the prediction) so that
the first failure is the one that proves, and after a failure the next sizes retry the
answer's neighbourhood, just above it, rather than bisecting down. While memory has grown too
little for a fit, sizes grow by SECOND at most and never past what the room holds at the
steepest slope that growth allows; when it stays flat over a FLAT_RANGE (512x) range (a cell
that ignores the variable) the search falls back for good to doubling, as it does where
memory cannot be measured. A fit that still predicts a size at or above a failure is wrong
up there and is not followed: the search bisects. A --start above what fits halves to a
first success, then measures a size BELOW times smaller, so that the fit, not blind
bisection, places the rest. Where going past memory gets the process killed, no size the fit
puts over the usable memory is run: the result says so instead of proving by a failure. A
plan's answer (a Prior) is the first size, and stands in for the fit's prediction until the
trials give a fit, or a failure at or below it shows it too high: on a right plan, the planned
size runs and the size TOLERANCE above fails, two trials.

Throughput mode doubles from the start and stops when two doublings in a row gain less than
5 % samples/s over the best, which is then the answer (not a larger size a noise's width
faster, for more memory); a size that fails is not the end: it bisects between the largest
success and the failure until within TOLERANCE of it, under the same rule.

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
                     OVER_HEADROOM, RUNNING, BatchResult, MemoryFit, Prior, Trial)

MODES = ("max", "throughput")
DEFAULT_START = 2  # not 1: batch norm refuses a batch of one in training mode
DEFAULT_MAX = 65536
AIM = 0.8  # where failures cost more than a trial, a long jump goes 80 % of the way: curves bend upwards
NEAR = 0.98  # ... and a short-range one lands 2 % under the prediction
SHORT_RANGE = 0.5  # a prediction this far (in fit spans) beyond the largest success is short-range
LONGEST_JUMP = 64  # extrapolate at most this far from the largest success in one trial
FLAT_RANGE = 512  # memory flat (< FLAT_BYTES) over this size ratio: the cell ignores the variable
FLAT_BYTES = 256 * 1024  # 256 bytes a sample over that range: less than any real input row
SECOND = 8  # the second size, far enough from the first for memory to grow measurably
BELOW = 4  # from above: the size measured under the first success (near enough for a local fit)
TOLERANCE = 0.05  # max mode stops once a failure at most 5 % above the answer proves it
FIT_NOISES = 4  # a fit's two sizes peak this many noise floors apart: the slope is off by half at most
MAX_TRIALS = 24  # max mode's budget: enough to double from 2 to 65536 and bisect to 5 %
THROUGHPUT_GAIN = 1.05  # a doubling must pay at least 5 % samples/s to go on
THROUGHPUT_PATIENCE = 2  # doublings in a row that do not pay before stopping: one slow trial is noise
SMALLEST_BARE_HEADROOM = 1024 ** 2  # a unit-less headroom below 1 MiB is a unit left out
# the bytes in each unit a user may type (--headroom, --plan's capacity): decimal kB/MB/GB, binary KiB/MiB/GiB
BYTE_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "kib": 1024, "m": 1000 ** 2, "mb": 1000 ** 2,
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
        self.bytes = None if unit == "%" else int(value * BYTE_UNITS[unit])

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


def aim_after_success(lo: int, predicted: int, fit_span: int, cautious: bool) -> float:
    """Where to go from the largest success ``lo`` when the fit predicts ``predicted``.

    Where a failure costs no more than a trial, at the prediction itself: with a trial on the
    other side of it, TOLERANCE away, the answer is proven wherever the prediction was within
    TOLERANCE. Where a failure lowers what fits afterwards (``cautious``), from below: a long
    extrapolation goes AIM of the way (curves bend upwards), a short one (within SHORT_RANGE
    fit spans of ``lo``) NEAR the prediction, so that the first failure is the one that proves.
    """
    short = predicted - lo <= SHORT_RANGE * fit_span
    if not cautious:
        return predicted
    candidate = lo + AIM * (predicted - lo)
    if short:
        candidate = max(candidate, NEAR * predicted)
    return candidate


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
                 multiple_of: int = 1, headroom=None, device: str = "", prior: Optional[Prior] = None,
                 on_trial: Callable[["Search"], None] = lambda search: None):
        if mode not in MODES:
            raise SearchError(f"{option('mode', mode)}: use one of {', '.join(MODES)}")
        check_variable(variable)
        multiple_of = whole_number("multiple_of", multiple_of)
        start, maximum = (None if value is None else whole_number(name, value)
                          for name, value in (("start", start), ("max", maximum)))
        _check_multiple(multiple_of, start, maximum)
        self.step = multiple_of
        first_size = max(DEFAULT_START if prior is None else prior.size, multiple_of)
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
        self.on_trial, self.prior = on_trial, prior
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
        self._probes = 0  # max mode: probes above the largest success that fitted, in a row
        self._probing = False  # max mode: the size chosen next is such a probe
        self._predicted: Optional[int] = None  # max mode: the fit's largest size when the next was chosen
        self._jumped = False  # max mode: the last size was the memory fit's prediction (or under it)

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
        """The successes a fit may use, smallest first: measured, and since the last trial whose
        aftermath moved the baseline (their peaks share one)."""
        epoch = self.trials[self._epoch_start(failures_only=False):]
        return sorted((t for t in epoch if t.fits and t.peak_memory is not None), key=lambda t: t.size)

    @property
    def lo(self) -> Optional[int]:
        successes = self._successes()
        return successes[-1].size if successes else None

    @property
    def hi(self) -> Optional[int]:
        """The smallest size above the answer that failed (below it, a failure says that the
        process lost memory since, not where the top is)."""
        lo = self.lo or 0
        failed = [t.size for t in self._failures() if t.size > lo]
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

    def fit(self) -> Optional[MemoryFit]:
        """Memory against size through the largest measured success and the largest one below it
        far enough away that the growth between them is FIT_NOISES noise floors, or None: two
        sizes a few samples apart grow by the noise, and a slope through them is noise too."""
        measured = self._measured()
        if self.refused or len(measured) < 2 or self.capacity is None:
            return None
        large, noise = measured[-1], noise_floor(self.capacity)
        for small in reversed(measured[:-1]):
            if _peak(large) - _peak(small) >= FIT_NOISES * noise:
                return _line_through(small, large)
        flat = _peak(large) - _peak(measured[0]) < FLAT_BYTES
        if flat and large.size >= FLAT_RANGE * measured[0].size:
            self.refused = True
            self.notes.append(
                f"peak memory did not grow from {self.variable}={measured[0].size} to "
                f"{large.size}: no memory fit (does the cell use {self.variable}?); doubling instead")
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
            planned = len(self.trials) == 1 and self.prior is not None and size == self._align(self.prior.size)
            under = self._under(size)  # a plan a little too high: a success just under it proves the answer
            size = under if planned and under < size else self._align(size // 2)
        return size

    def _close(self, lo: int, upper: int) -> bool:
        return upper - lo <= self.step or lo >= (1 - TOLERANCE) * upper

    def _proven(self, lo: int, hi: int) -> bool:
        """Whether a failure at ``hi`` proves ``lo`` within TOLERANCE of the largest size that
        fits: ``hi`` at most TOLERANCE above ``lo``, or the next size."""
        return hi - lo <= self.step or hi <= lo * (1 + TOLERANCE)

    def _proof(self, lo: int, hi: int) -> str:
        if hi - lo <= self.step:
            largest = "size" if self.step == 1 else f"multiple of {self.step}"
            return f"{self.variable}={hi} did not fit: {lo} is the largest {largest} that fits"
        return (f"{self.variable}={hi} did not fit: {lo} is within "
                f"{math.ceil(100 * (hi - lo) / lo)}% of the largest size that fits")

    def _failures(self) -> List[Trial]:
        return [trial for trial in self.trials if trial.too_large]

    def _lowered(self) -> bool:
        """Whether a failure may have lowered what fits in this process: the baseline measured
        after it moved, or it cannot be measured and a second failure followed the first."""
        return self._epoch_start(failures_only=True) > 0 or (self.capacity is None and len(self._failures()) > 1)

    def _epoch_start(self, failures_only: bool) -> int:
        """The first trial whose peak can be fitted with the latest ones: the one after the last
        trial (``failures_only``: the last failure) whose aftermath moved the baseline by more
        than the noise. On the CPU a failed trial can leave address space behind, and the first
        clean-up can hand back heap the process held before (a rank forked from a notebook that
        trained); on CUDA, reserved and fragmented memory."""
        start = 0
        noise = noise_floor(self.capacity) if self.capacity else 0
        for index, trial in enumerate(self.trials):
            if (failures_only and trial.fits) or trial.baseline is None:
                continue
            after = next((later.baseline for later in self.trials[index + 1:] if later.baseline is not None), None)
            if after is not None and abs(after - trial.baseline) > noise:
                start = index + 1
        return start

    def _cautious(self) -> bool:
        """Whether a failure costs more than a trial: on the CPU a failed allocation leaves
        address space behind (or, without a limit, gets the process killed); anywhere, once a
        failure has been seen to lower what fits."""
        return self.device == "cpu" or any(t.capacity_kills for t in self.trials) or self._lowered()

    def _within_growth(self) -> float:
        """The largest size the room left holds at the steepest slope the measured sizes allow:
        they grew too little for a fit, yet that growth and a noise floor bound the slope. With
        one size measured, its growth over the least memory in use before any trial bounds the
        slope too (the step's fixed cost makes it steeper, never flatter). Not over the memory in
        use just before it: on the CPU that counts the heap earlier trials left free, which the
        step reuses, and a peak a few MiB over it read as a slope near zero (an MLP jumped from
        6256 to 12673 where 7600 failed)."""
        measured = self._measured()
        if not measured or self.capacity is None:
            return math.inf
        large = measured[-1]
        baselines = [trial.baseline for trial in self.trials if trial.baseline is not None]
        if len(measured) >= 2:
            small_size, small_peak = measured[0].size, _peak(measured[0])
        elif baselines:
            small_size, small_peak = 0, min(baselines)
        else:
            return math.inf
        steepest = (_peak(large) - small_peak + noise_floor(self.capacity)) / (large.size - small_size)
        return large.size + ((self.usable or 0) - _peak(large)) / steepest

    def _probe_above(self, lo: int, hi: Optional[int]) -> float:
        """Just above ``lo``: a failure there proves ``lo`` within TOLERANCE. Each such probe in
        a row that fitted doubles the step, so a fit that was too low costs few trials, up to
        halfway to a failure above."""
        self._probing = True
        probe = lo * (1 + TOLERANCE * 2 ** self._probes)
        return probe if hi is None else min(probe, max((lo + hi) / 2, lo * (1 + TOLERANCE)))

    def _next_size(self) -> Optional[int]:
        """The next size to run in max mode, or None once the trials prove the answer (or
        reach --max, or the budget of trials is spent); ``stopped`` then says which."""
        lo, hi, top = self.lo, self.hi, self._align(self.maximum)
        assert lo is not None  # called after the first success
        if hi is not None and self._proven(lo, hi):
            self.stopped = self._proof(lo, hi)
            return None
        if lo >= top:
            self.stopped = f"reached {option('max', self.maximum)}"
            return None
        ceiling = min(top, hi - self.step) if hi is not None else top
        self._probing = False
        candidate = self._candidate(lo, hi)
        size = self._align(min(max(candidate, lo + self.step), ceiling))
        if len(self.trials) >= MAX_TRIALS:
            known = f"{hi} did not fit" if hi is not None else f"{size} was not tried"
            self.stopped = (f"the budget of {MAX_TRIALS} trials is spent before the answer was proven: "
                            f"{self.variable}={lo} ran, {known}")
            return None
        fit, usable = self.fit(), self.usable
        if self.trials[-1].capacity_kills and fit is not None and usable is not None \
                and fit.memory_at(size) > usable:
            # no proof by failure where a failure ends the process: the fit's word, said as such
            self.stopped = (f"{self.variable}={size} was not tried: the memory fit puts its peak over "
                            f"the {words.size(usable)} usable, and going past memory here gets "
                            f"the process killed")
            return None
        return size

    def _planned(self) -> Optional[int]:
        """The plan's size while it stands in for the fit: no failure at or below it (which
        shows the plan too high)."""
        if self.prior is None or any(trial.size <= self.prior.size for trial in self._failures()):
            return None
        return self.prior.size

    def _candidate(self, lo: int, hi: Optional[int]) -> float:
        fit, usable = self.fit(), self.usable
        predicted: Optional[int]
        if fit is not None and usable is not None:
            predicted, fit_span = fit.largest_under(usable), lo - fit.sizes[0]
        else:  # no fit measured yet: the plan's size, on a line from zero
            predicted, fit_span = self._planned(), lo
        if predicted is not None and hi is not None and predicted >= hi:
            predicted = None  # a failure proved the fit wrong up there: bisect, not retry under it
        self._predicted = predicted
        if hi is not None:
            if self._under(hi) <= max(lo * (1 + TOLERANCE), lo + self.step):  # a success or a failure there proves
                return self._under(hi)
            if self._cautious() and hi <= 2 * lo:
                # what fails now may have fitted before a failure: a retry of the answer's neighbourhood
                return self._probe_above(lo, hi)
        if predicted is not None:
            if predicted <= lo * (1 + TOLERANCE):  # the fit puts the top at lo: a failure just above proves it
                return self._probe_above(lo, hi)
            candidate = aim_after_success(lo, predicted, fit_span, self._cautious())
            if candidate <= lo * (1 + TOLERANCE):  # as good as a probe, and probes in a row step up faster
                return self._probe_above(lo, hi)
            if hi is None and candidate > LONGEST_JUMP * lo:
                candidate = math.sqrt(lo * candidate)  # refine the fit halfway (geometrically)
            return candidate
        if hi is None:
            if self.capacity is None or self.refused:
                return 2 * lo
            bound = self._within_growth()
            if bound <= lo * (1 + TOLERANCE):  # the room holds no more at the steepest slope: a failure just above proves lo
                return self._probe_above(lo, hi)
            return min(lo * SECOND, bound)
        if self._jumped and self.trials[-1].size == hi and not self._cautious():
            return self._under(hi)  # a jump to the prediction overshot a little: a success there proves
        return (lo + hi) / 2

    def _under(self, hi: int) -> int:
        """The smallest size whose success proves it within TOLERANCE of the failure at ``hi``."""
        return math.ceil(hi / (1 + TOLERANCE) / self.step) * self.step

    def _largest(self) -> None:
        self._measure_below()
        while True:
            size = self._next_size()
            if size is None:
                return
            probing, predicted = self._probing, self._predicted
            self._jumped = predicted is not None and not probing  # to the fit's prediction
            fitted = self.attempt(size).fits
            # probes that fit, one after the other, show the fit's top (or the failure) too low
            self._probes = self._probes + 1 if probing and fitted else 0

    def _measure_below(self) -> None:
        """Started above what fits: the first success is the only measured size, and bisecting
        blind towards the failure above costs an out-of-memory error a step. A size BELOW
        times smaller is cheap and always fits; with it the memory fit places the rest."""
        lo = self.lo
        assert lo is not None  # called after the first success
        below = self._align(lo / BELOW)
        if self.hi is not None and len(self._measured()) == 1 and self.capacity is not None \
                and below < lo and not self._proven(lo, self.hi):
            self.attempt(below)

    def _fastest(self) -> None:
        """Double from the first success while samples/s pays. Once a size has failed, the
        sizes between the largest success and that failure are bisected, not given up: where
        samples/s still grew at the last doubling, the fastest size lies up there."""
        best = self._successes()[-1]
        unpaid: List[Tuple[int, int]] = []  # (lo, size) of the sizes up that did not pay
        while True:
            lo, hi, fit = self.lo, self.hi, self.fit()
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
        fit = self.fit()
        return BatchResult(
            variable=self.variable, mode=self.mode, device=self.device, trials=tuple(self.trials),
            answer=answer, largest_fitting=largest, fastest=fastest, capacity=self.capacity,
            usable=self.usable, fit=fit, stopped=self.stopped, plan=self.prior,
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
