"""The answer from the measured rates (pure): the smallest setting within 5 % of the best, and
whether the rounds measured tell it apart from the smaller settings it was preferred over.

With a training step of S seconds, a setting is judged by the rate it would train at: workers
make batches beside the step, so a batch every max(L, S) seconds (L: the loader's interval
alone, counted 20 % longer for the jitter of both); without workers the main process makes each
batch between two steps, every L + S. The smallest setting that feeds the step is then the
answer, not the one that outruns it most.
"""
from __future__ import annotations

import dataclasses
import statistics
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from .settings import Setting

__all__ = ["Choice", "choose", "training_rate", "WITHIN", "MARGIN", "low", "high"]

WITHIN = 0.05  # a setting this close to the best rate is as good: the smallest of them wins
# Workers that deliver batches only just as fast as the step leave it waiting whenever either
# jitters (seen: a loader alone 2 % slower than the step, measured together: the step waited
# 13 %): a loader feeds the step when it is this much faster alone.
MARGIN = 1.2


@dataclasses.dataclass(frozen=True)
class Choice:
    best: Setting  # the highest median rate of the loader alone
    answer: Setting
    keeps_up: bool  # with a step: the answer feeds it (training runs within 5 % of the step's own rate)
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


def training_rate(setting: Setting, loader_rate: float, step_seconds: Optional[float]) -> float:
    """Batches a second training would run at with this setting's loader (``loader_rate``
    alone) and a step of ``step_seconds``; the loader's own rate without a step."""
    if step_seconds is None:
        return loader_rate
    interval = 1 / loader_rate
    return 1 / (max(MARGIN * interval, step_seconds) if setting.num_workers else interval + step_seconds)


def _smallest_near_best(rates: Mapping[Setting, List[float]], within: float) -> Tuple[Setting, Setting, float]:
    """(best, answer, the bar as the best's low rounds would set it)."""
    medians = {setting: statistics.median(values) for setting, values in rates.items()}
    best = max(medians, key=lambda setting: (medians[setting], [-part for part in setting.cost]))
    bar = (1 - within) * medians[best]
    answer = min((setting for setting, rate in medians.items() if rate >= bar), key=lambda s: s.cost)
    return best, answer, (1 - within) * low(rates[best])


def choose(rates: Mapping[Setting, Sequence[float]], step_seconds: Optional[float] = None,
           within: float = WITHIN) -> Choice:
    """From each setting's rates (batches/s, one a round), the smallest setting (Setting.cost)
    whose median is within ``within`` of the best median; with ``step_seconds``, of the best
    training rate (:func:`training_rate`). A smaller setting is unresolved where one of its
    good rounds reached the bar that the best's low rounds set."""
    loader: Dict[Setting, List[float]] = {setting: list(values) for setting, values in rates.items() if values}
    if not loader:
        raise ValueError("no setting was measured")
    training = {setting: [training_rate(setting, rate, step_seconds) for rate in values]
                for setting, values in loader.items()}
    _, answer, low_bar = _smallest_near_best(training, within)
    unresolved = tuple(sorted((setting for setting in training
                               if setting.cost < answer.cost and high(training[setting]) >= low_bar),
                              key=lambda s: s.cost))
    best = _smallest_near_best(loader, within)[0]
    keeps_up = step_seconds is not None and statistics.median(training[answer]) >= (1 - within) / step_seconds
    return Choice(best, answer, keeps_up, unresolved)
