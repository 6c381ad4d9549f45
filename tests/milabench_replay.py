"""A device stand-in replaying milabench's measured memory-against-batch curves.

Peak memory at a batch size is interpolated linearly between the measured points (and
extended along the last measured segment); a trial fails exactly where that curve crosses
the emulated capacity. Only the hardware is fake: the search runs for real on it.
The files use a small YAML subset (one flow mapping per observation), read here without
PyYAML so the tests need nothing extra.
"""
from __future__ import annotations

import bisect
import collections
import pathlib
import re
from typing import Dict, Iterable, List, Tuple

from colab_gpu.batch.result import FITS, OUT_OF_MEMORY, Trial

MILABENCH = pathlib.Path(__file__).resolve().parent / "data" / "milabench"
MiB = 1024 ** 2
_OBSERVATION = re.compile(r"^\s+- \{batch_size: (\d+),.*memory: ([0-9.]+) MiB")
_BENCH = re.compile(r"^([A-Za-z0-9_.+-]+):\s*$")


def load_curves(path: pathlib.Path) -> Dict[str, List[Tuple[int, int]]]:
    """benchmark name -> sorted [(batch size, peak bytes)], the largest reading per size."""
    curves: Dict[str, Dict[int, int]] = {}
    name = None
    for line in path.read_text().splitlines():
        header = _BENCH.match(line)
        if header:
            name = header.group(1)
            continue
        observation = _OBSERVATION.match(line)
        if observation and name:
            batch, memory = int(observation.group(1)), int(float(observation.group(2)) * MiB)
            points = curves.setdefault(name, {})
            points[batch] = max(points.get(batch, 0), memory)
    return {name: sorted(points.items()) for name, points in curves.items()}


class Curve:
    """Memory(batch) by linear interpolation between measured points."""

    def __init__(self, points: List[Tuple[int, int]]):
        self.sizes = [size for size, _ in points]
        self.memory = [memory for _, memory in points]

    def __call__(self, batch: int) -> float:
        index = min(max(bisect.bisect_left(self.sizes, batch), 1), len(self.sizes) - 1)
        (x0, x1), (y0, y1) = self.sizes[index - 1:index + 1], self.memory[index - 1:index + 1]
        return y0 + (y1 - y0) * (batch - x0) / (x1 - x0)

    def largest_under(self, capacity: int) -> int:
        """The true answer: the largest batch whose peak stays within capacity."""
        low, high = 0, 1
        while self(high) <= capacity:
            low, high = high, high * 2
        while high - low > 1:
            middle = (low + high) // 2
            low, high = (middle, high) if self(middle) <= capacity else (low, middle)
        return low


class ReplayDevice:
    """``run(size) -> Trial`` for the search: a real curve, a hard capacity."""

    def __init__(self, curve: Curve, capacity: int):
        self.curve, self.capacity = curve, capacity
        self.sizes_run: List[int] = []

    def __call__(self, size: int) -> Trial:
        self.sizes_run.append(size)
        peak = int(self.curve(size))
        if peak > self.capacity:
            return Trial(size, OUT_OF_MEMORY, capacity=self.capacity, runs=1,
                         error="OutOfMemoryError: CUDA out of memory (replayed)")
        return Trial(size, FITS, peak_memory=peak, capacity=self.capacity, seconds_per_step=0.1, runs=3)


CAPACITIES_GIB = (16, 24, 40, 80)  # common GPU sizes: the search's constants were chosen on these
# Every 2 GiB from 12 to 80 but those four: capacities the constants never saw, to show they generalise.
HELD_OUT_GIB = tuple(gib for gib in range(12, 81, 2) if gib not in CAPACITIES_GIB)


def problems(capacities_gib=CAPACITIES_GIB):
    """(label, curve, capacity) for every curve that really crosses a capacity in its measured range.

    Curves with fewer than three distinct sizes or whose memory does not grow are skipped:
    they measure nothing a fit could use.
    """
    for path in sorted(MILABENCH.glob("*.yaml")):
        for name, points in load_curves(path).items():
            if len(points) < 3 or points[-1][1] <= points[0][1]:
                continue
            curve = Curve(points)
            for gib in capacities_gib:
                capacity = gib * 1024 ** 3
                if points[0][1] < capacity < points[-1][1] and curve.largest_under(capacity) >= 4:
                    yield f"{path.stem}/{name}@{gib}GiB", curve, capacity


def fit_problems(capacities_gib=CAPACITIES_GIB):
    """(label, curve, capacity, true largest) for the problems a memory fit is judged on: answers
    of at least 20 (tiny ones are exact-or-nothing) on curves that never fall (a falling curve
    has no single answer)."""
    for label, curve, capacity in problems(capacities_gib):
        largest = curve.largest_under(capacity)
        if largest >= 20 and all(b >= a for a, b in zip(curve.memory, curve.memory[1:])):
            yield label, curve, capacity, largest


def claim_backed(stopped: str, answer, trials: Iterable[Tuple[int, str]]) -> bool:
    """Whether the sentence a max-mode search ended on is true of its trials (size, outcome):
    "within X %" and "the largest size that fits" need a failure at most X % (or one size)
    above the answer, and no sentence may rest on the memory fit's word alone."""
    if "memory fit says" in stopped:
        return False
    failed = [size for size, outcome in trials if outcome != "fits"]
    claim = re.search(r"within (\d+)%", stopped)
    if claim is not None:
        return any(answer < size <= answer * (1 + int(claim.group(1)) / 100) for size in failed)
    exact = re.search(r"=(\d+) did not fit: (\d+) is the largest (size|multiple of (\d+)) that fits", stopped)
    if exact is not None:
        step = int(exact.group(4) or 1)
        return int(exact.group(2)) == answer and int(exact.group(1)) in failed and int(exact.group(1)) == answer + step
    return True


def distribution(numbers: Iterable[int]) -> str:
    """"4:82 5:14 ...": how many searches took each number of trials."""
    counted = collections.Counter(numbers)
    return " ".join(f"{number}:{counted[number]}" for number in sorted(counted))
