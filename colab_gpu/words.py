"""How a value reads in any message: sizes, durations, counts of things, n/a. The core packages
(memory/, batch/, allocator/, live/) word their errors and results with these without
depending on render/, which re-exports them for its renderers.
"""
from __future__ import annotations

from typing import Optional

NA = "n/a"


def significant(value: float) -> str:
    """Three significant digits below 100 (3.81, 0.4), whole numbers above."""
    return f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"


def _digits(value: float, unit: str) -> str:
    """A value in ``unit``, :func:`significant` (3.81 MiB, not 4 MiB)."""
    return f"{significant(value)} {unit}"


def size(value: Optional[float]) -> str:
    """Bytes in the unit nvidia-smi users read: MiB below 1 GiB, GiB above (KiB, B when tiny)."""
    if value is None:
        return NA
    if abs(value) < 1024:
        return f"{value:.0f} B"
    if abs(value) < 1024 ** 2:
        return _digits(value / 1024, "KiB")
    if abs(value) < 1024 ** 3:
        return _digits(value / 1024 ** 2, "MiB")
    return f"{value / 1024 ** 3:.2f} GiB"


def duration(seconds: Optional[float]) -> str:
    """Seconds as µs, ms or s: a step of a few microseconds reads 4.2 µs, not 0.0 ms."""
    if seconds is None:
        return NA
    if abs(seconds) < 1e-3:
        return _digits(seconds * 1e6, "µs")
    if abs(seconds) < 1:
        return _digits(seconds * 1e3, "ms")
    return _digits(seconds, "s")


def count(amount: int, noun: str) -> str:
    """"1 trial", "2 trials", "1 cache flush", "2 cache flushes": the plural an English reader expects."""
    if amount == 1:
        return f"{amount} {noun}"
    return f"{amount} {noun}{'es' if noun.endswith(('s', 'x', 'z', 'ch', 'sh')) else 's'}"


def with_article(noun: str) -> str:
    """"a Linear", "an int", "an Embedding": a type's name with the article it reads with."""
    return f"{'an' if noun[:1].lower() in 'aeiou' else 'a'} {noun}"
