"""``nvidia-smi -q`` text: not read, but recognised, so that it is refused with what to save
instead (``nvidia-smi -q -x``, the same report as XML) rather than called a broken CSV log.
"""
from __future__ import annotations

from typing import Tuple

from .. import Snapshot
from .values import RecordingError

__all__ = ["read", "sniff"]


def sniff(text: str) -> bool:
    """The banner of ``nvidia-smi -q``."""
    return "==NVSMI LOG==" in text


def read(text: str, label: str, fallback_time: float) -> Tuple[Snapshot, ...]:
    """Refused, saying what to save instead."""
    raise RecordingError("is `nvidia-smi -q` text; save `nvidia-smi -q -x` (XML) instead")
