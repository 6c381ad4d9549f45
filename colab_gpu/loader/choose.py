"""The answer from the measured rates (pure): the smallest setting within 5 % of the best, or,
with a training step measured, the smallest that keeps the step fed; and whether the rounds
measured tell it apart from the smaller settings it was preferred over."""
from __future__ import annotations

import dataclasses
import statistics
from typing import Mapping, Optional, Sequence, Tuple

from .settings import Setting

__all__ = ["Choice", "choose", "step_bar", "WITHIN", "KEEPS_UP", "SERIAL_KEEPS_UP", "low", "high"]

WITHIN = 0.05  # a setting this close to the best rate is as good: the smallest of them wins
# A loader with workers this much faster than the step keeps it fed through the step's and the
# loader's jitter: more workers would only take cores from the training loop.
KEEPS_UP = 1.2
# Without workers the loader makes each batch between two steps, never beside them: the step
# waits L / (L + S) of the time, below WITHIN only for a loader this many times the step's rate.
SERIAL_KEEPS_UP = (1 - WITHIN) / WITHIN


@dataclasses.dataclass(frozen=True)
class Choice:
    best: Setting  # the highest median rate
    answer: Setting
    bar: float  # the rate the answer had to reach (batches/s)
    keeps_up: bool  # the step's rate set the bar, not the best's
    # Smaller settings left out whose rounds reached the bar now and then: the rounds did not
    # tell them apart from it (more rounds, or a quieter machine, would).
    unresolved: Tuple[Setting, ...] = ()


def low(values: Sequence[float]) -> float:
    """A low but not freak round: the lowest, or the second lowest of five or more."""
    ordered = sorted(values)
    return ordered[1] if len(ordered) >= 5 else ordered[0]


def high(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return ordered[-2] if len(ordered) >= 5 else ordered[-1]


def step_bar(setting: Setting, step_rate: float) -> float:
    """The rate at which ``setting`` keeps a step of ``step_rate`` (steps a second) fed."""
    return (KEEPS_UP if setting.num_workers else SERIAL_KEEPS_UP) * step_rate


def choose(rates: Mapping[Setting, Sequence[float]], step_rate: Optional[float] = None,
           within: float = WITHIN) -> Choice:
    """From each setting's rates (batches/s, one a round), the smallest setting (Setting.cost)
    whose median is within ``within`` of the best median; with ``step_rate`` (the steps a
    second the training step runs at), the smallest that keeps the step fed (step_bar) where
    that is a smaller setting."""
    medians = {setting: statistics.median(values) for setting, values in rates.items() if values}
    if not medians:
        raise ValueError("no setting was measured")
    best = max(medians, key=lambda setting: (medians[setting], [-part for part in setting.cost]))
    bar = (1 - within) * medians[best]
    answer = min((setting for setting, rate in medians.items() if rate >= bar), key=lambda s: s.cost)
    # The bar as the best's low rounds would have set it: a smaller setting that reached it in
    # its good rounds was not clearly below.
    low_bar = {setting: (1 - within) * low(rates[best]) for setting in medians}
    keeps_up = False
    if step_rate is not None:
        fed = [setting for setting, rate in medians.items() if rate >= step_bar(setting, step_rate)]
        smallest = min(fed, key=lambda s: s.cost, default=None)
        if smallest is not None and smallest.cost < answer.cost:
            answer, keeps_up, bar = smallest, True, step_bar(smallest, step_rate)
            low_bar = {setting: step_bar(setting, step_rate) for setting in medians}
    unresolved = tuple(sorted((setting for setting in medians
                               if setting.cost < answer.cost and high(rates[setting]) >= low_bar[setting]),
                              key=lambda s: s.cost))
    return Choice(best, answer, bar, keeps_up, unresolved)
