"""The one base of every error in what the user asked for."""
from __future__ import annotations

__all__ = ["UserError"]


class UserError(Exception):
    """An error in what the user asked for (an option, a file, a setting), shown as one line:
    each magic turns it into IPython's UsageError, with no traceback; the Python API raises it
    as it is. Each subclass keeps its own name and other bases (ValueError) for its callers."""
