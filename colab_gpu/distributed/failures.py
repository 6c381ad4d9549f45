"""What ``launch`` raises: a refusal before any process starts (one line, a UserError), a rank
that failed (its own traceback, as the cause), or the whole run out of time."""
from __future__ import annotations

from typing import Optional

from ..errors import UserError

__all__ = ["LaunchOptionError", "LaunchRefused", "RankError", "RankTraceback", "LaunchTimeout"]


class LaunchOptionError(UserError, ValueError):
    """An nprocs, backend or timeout launch cannot use; the message says what it takes."""


class LaunchRefused(UserError, ValueError):
    """Processes forked from here could not do what was asked: CUDA already initialized in
    this process, no fork on this system, torch.distributed or the backend missing."""


class RankTraceback(Exception):
    """A rank's traceback, as the rank formatted it: the cause of its RankError, so that the
    traceback shown reads the lines of the notebook's function that failed in the rank."""

    def __str__(self) -> str:
        return self.args[0]


class RankError(RuntimeError):
    """A rank raised, or its process ended without returning (killed, crashed, ``os._exit``);
    the other ranks were stopped. ``rank``: which one; ``traceback``: its text (None for a
    process that died without one); ``exception``: the rank's exception itself, where it could
    be sent back (pickled); ``exit_code``: its process's status when it ended by itself
    (negative: the signal that killed it)."""

    def __init__(self, message: str, rank: int, traceback: Optional[str] = None,
                 exception: Optional[BaseException] = None, exit_code: Optional[int] = None):
        super().__init__(message)
        self.rank = rank
        self.traceback = traceback
        self.exception = exception
        self.exit_code = exit_code

    def __reduce__(self):
        return type(self), (self.args[0], self.rank, self.traceback, self.exception, self.exit_code)


class LaunchTimeout(TimeoutError):
    """The ranks were still running when ``timeout`` ran out; every one was stopped."""
