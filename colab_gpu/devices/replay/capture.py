"""A capture of several ``nvidia-smi`` outputs in one file (nvidia_gpu_exporter's): its
``--query-gpu`` CSV logs are read, its other outputs left out, and the snapshot says so.

It holds the table or ``nvidia-smi -q`` text too, so it is tried before those formats.
"""
from __future__ import annotations

from typing import Tuple

from .. import Snapshot
from . import csv_log, query_text, table
from .values import with_note

__all__ = ["read", "sniff"]

_NOTE = "read from its --query-gpu CSV logs; its other nvidia-smi outputs left out"


def sniff(text: str) -> bool:
    """Another nvidia-smi output (the table, ``-q`` text) with --query-gpu logs besides."""
    return (table.sniff(text) or query_text.sniff(text)) and bool(csv_log.query_gpu_logs(text))


def read(text: str, label: str, fallback_time: float) -> Tuple[Snapshot, ...]:
    """Every time step of the capture's --query-gpu logs, joined."""
    return tuple(with_note(frame, _NOTE) for frame in csv_log.read(csv_log.query_gpu_logs(text), label, fallback_time))
