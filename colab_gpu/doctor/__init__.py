"""The out-of-memory doctor: why a cell ran out of memory, and what to do, from measurements.

``explain_oom(error_or_text)`` returns an :class:`OomReport`; ``%explain_oom`` shows it, and
after ``%load_ext colab_gpu`` a card appears under every cell that fails with an
out-of-memory error. Layers: ``parse`` reads a message's numbers, ``device`` the device now,
``kernel`` what the kernel holds (within a time budget), ``cell`` the failed cell's code,
``causes`` the rules from those measurements to causes and fixes, ``render`` the card.
Nothing here imports IPython, and nothing initializes CUDA.
"""
from __future__ import annotations

from .explain import BUDGET, explain_error, explain_oom, explain_text
from .parse import OomMessage, parse_message
from .report import Cause, Graph, OomReport, OtherProcess, Place

__all__ = ["BUDGET", "Cause", "Graph", "OomMessage", "OomReport", "OtherProcess", "Place", "explain_error",
           "explain_oom", "explain_text", "parse_message"]
