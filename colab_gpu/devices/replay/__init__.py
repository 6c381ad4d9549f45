"""The replay source: GPUs read from a saved ``nvidia-smi`` recording instead of the driver.

Users paste these files when asking for help, and they are how the project shows real
hardware where there is none. Each kind of recording is read by a module of its own, listed in
:data:`FORMATS` in the order they are tried:

* ``nvidia-smi -q -x`` XML, one time step (:mod:`.nvsmi_xml`);
* a capture of several nvidia-smi outputs, read from its --query-gpu logs (:mod:`.capture`);
* the plain ``nvidia-smi`` table, one time step per table (:mod:`.table`);
* ``nvidia-smi -q`` text, refused with what to save instead (:mod:`.query_text`);
* ``nvidia-smi --query-gpu=... --format=csv`` logs, one time step per timestamp (:mod:`.csv_log`).

Each offers ``sniff(text)``, whether the text is of its kind (the first that says so reads it),
and ``read(text, label, fallback_time)``, its time steps; a format that can replay a file too
large to read whole offers ``open_large`` besides (the CSV log). This module checks the file and
hands it over; :class:`ReplaySource` serves the time steps. Values nvidia-smi could not read
("N/A", "[Not Supported]", ...) become ``None`` (:mod:`.values`).
"""
from __future__ import annotations

import os
import stat
import threading
import time
from typing import Any, Callable, Generator, NamedTuple, Optional, Tuple

from ... import words
from ...spelling import option
from .. import InvalidIndex, MiB, Snapshot
from . import capture, csv_log, nvsmi_xml, query_text, table
from .values import UNKNOWN_NAME, RecordingError, decode, latest, not_a_file, open_regular, with_note

__all__ = ["ACCEPTED", "FORMATS", "HEAD", "LABEL_PREFIX", "LARGE_FROM", "UNKNOWN_NAME", "WHOLE_CAP", "RecordingError",
           "ReplaySource", "check_path", "latest", "load_frames", "replay_label"]

# The kinds of recording, in the order they are tried: a capture holds the table or -q text
# too, and the CSV log takes any text the others do not.
FORMATS = (nvsmi_xml, capture, table, query_text, csv_log)

ACCEPTED = ("accepted: an `nvidia-smi -q -x` XML file, an "
            "`nvidia-smi --query-gpu=... --format=csv` log or the `nvidia-smi` table")

HEAD = 64 * 1024  # what is read first, to tell a large file's kind
# A larger file whose format can (a CSV log) is read in parts by ReplaySource: its last state
# from its end, its time steps a block at a time. A 1 MiB log took 0.8 s to read whole.
LARGE_FROM = MiB
# The largest file read whole: an 8-GPU `nvidia-smi -q -x` is 100 KiB, a day of the table every
# 10 s 20 MiB; /dev/zero renamed, or a disk image, would be read until memory ran out.
WHOLE_CAP = 64 * MiB
SLOW = 1.0  # seconds: a whole read that takes longer says so in the snapshot's source


def check_path(path: "str | bytes | os.PathLike[str]") -> str:
    """The file name ``path`` gives, ``~`` expanded. Raises :class:`RecordingError` (one line)
    unless it names a regular file: a FIFO would block the read until something wrote to it,
    /dev/zero never end it."""
    given = os.fsdecode(path)
    if not given.strip():  # it read "cannot replay : no such file"
        raise RecordingError(f"{option('path', given)}: give the recording's file name; {ACCEPTED}")
    name = os.path.expanduser(given)  # the magic's line reaches here unexpanded
    try:
        mode = os.stat(name).st_mode  # a FIFO's stat does not wait for a writer, its open does
    except (FileNotFoundError, NotADirectoryError):
        raise RecordingError(f"cannot replay {name}: no such file") from None
    except OSError as error:  # a folder above it that may not be entered, a name too long
        raise RecordingError(f"cannot replay {name}: {_reason(error)}") from None
    except ValueError:  # "embedded null byte"
        raise RecordingError(f"cannot replay {name!r}: no file name holds a NUL character") from None
    if not stat.S_ISREG(mode):
        raise RecordingError(f"cannot replay {name}: it {not_a_file(mode)}")
    return name


def _reason(error: OSError) -> str:
    """"permission denied" of ``PermissionError(13, 'Permission denied')``."""
    reason = error.strerror or str(error)
    return reason[:1].lower() + reason[1:]


class _File(NamedTuple):
    """A recording's file as it was opened: the whole of it, or its start where ``large``, its
    format's reader of a file too large to read whole, reads the rest."""

    name: str
    size: int
    mtime: float
    data: bytes
    large: Optional[Callable[..., Any]]


def _open(path: "str | bytes | os.PathLike[str]", large_from: int) -> _File:
    """The recording at ``path``, read whole unless it is larger than ``large_from`` and of a
    format that reads it in parts. Raises RecordingError (one line) where it is no regular file
    this process may read, or too large to read whole."""
    name = check_path(path)
    try:
        with open_regular(name) as file:
            info = os.fstat(file.fileno())
            data = file.read(HEAD)
            large = _large_reader(data) if info.st_size > large_from else None
            if large is None and info.st_size <= WHOLE_CAP:
                data += file.read(WHOLE_CAP + 1 - len(data))  # a file in /proc may say it is empty
    except RecordingError as error:
        raise RecordingError(f"cannot replay {name}: it {error}") from None
    except OSError as error:
        raise RecordingError(f"cannot replay {name}: {_reason(error)}") from None
    if large is None and max(info.st_size, len(data)) > WHOLE_CAP:
        told = words.size(info.st_size) if info.st_size > WHOLE_CAP else "over " + words.size(WHOLE_CAP)
        raise RecordingError(f"cannot replay {name}: it is {told}, more than the {words.size(WHOLE_CAP)} a recording "
                             f"read whole may be (only a --query-gpu CSV log may be larger)")
    return _File(name, info.st_size, info.st_mtime, data, large)


def _large_reader(head: bytes) -> Optional[Callable[..., Any]]:
    """``open_large`` of the format of a file that starts with ``head``, if it has one."""
    if head.startswith((b"\xff\xfe", b"\xfe\xff")):  # UTF-16: its lines are not found by their bytes
        return None
    try:
        text = decode(head[:head.rfind(b"\n") + 1])  # not a character cut in two
    except RecordingError:
        return None
    kind = next(kind for kind in FORMATS if kind.sniff(text))
    return getattr(kind, "open_large", None)


def _parse(data: bytes, label: str, fallback_time: float) -> Tuple[Snapshot, ...]:
    text = decode(data)
    if not text.strip():
        raise RecordingError("is empty")
    kind = next(kind for kind in FORMATS if kind.sniff(text))
    return kind.read(text, label, fallback_time)


def _read_whole(file: _File, label: str) -> Tuple[Snapshot, ...]:
    """Every time step of a file read whole; one that took long says what was read."""
    started = time.monotonic()
    frames = _parse(file.data, label, file.mtime)
    took = time.monotonic() - started
    if took > SLOW:
        note = f"{words.size(len(file.data))} read whole in {words.duration(took)}"
        frames = tuple(with_note(frame, note) for frame in frames)
    return frames


def _problem(name: str, error: "RecordingError | InvalidIndex") -> str:
    return f"cannot replay {name}: it {error}; {ACCEPTED}"


def load_frames(path: "str | os.PathLike[str]") -> Tuple[Snapshot, ...]:
    """Every time step of the recording at ``path``, in order (an XML file is one step).

    Raises :class:`RecordingError` with one line saying what is wrong with which file.
    """
    file = _open(path, WHOLE_CAP)
    try:
        if file.large is not None:
            return tuple(file.large(file.name, file.data, file.size, replay_label(file.name), file.mtime).frames())
        return _read_whole(file, replay_label(file.name))
    except (RecordingError, InvalidIndex) as error:
        raise RecordingError(_problem(file.name, error)) from None


LABEL_PREFIX = "replay of "


def replay_label(path: "str | os.PathLike[str]") -> str:
    return LABEL_PREFIX + os.path.basename(os.fspath(path))


class ReplaySource:
    """A :class:`~colab_gpu.devices.DeviceSource` over a recording.

    The file is opened at once: a path that names no regular file this process may read (none,
    a directory, a FIFO, /dev/zero) or a file too large to read whole raises
    :class:`RecordingError`. What it holds is read at the first snapshot; a recording that
    cannot be replayed is the snapshot's problem.

    ``follow=False``: every snapshot is the recording's final state (the last row per GPU).
    ``follow=True``: each snapshot is the next time step, looping at the end (a demo trace).
    An empty ``path`` is refused at once (RecordingError), for ``status()`` and the live monitor alike.
    A CSV log over :data:`LARGE_FROM` is never read whole: its final state is read from its
    end, its time steps a block at a time.
    """

    def __init__(self, path: "str | bytes | os.PathLike", follow: bool = False):
        self.path = os.fsdecode(path)
        self.follow = follow
        self.label = replay_label(self.path)
        self._file: Optional[_File] = _open(self.path, LARGE_FROM)
        self._name = self._file.name
        self._frames: Optional[Tuple[Snapshot, ...]] = None
        self._large: Any = None  # the format's reader of a large file (csv_log.LargeLog)
        self._last: Optional[Snapshot] = None
        self._steps: Optional[Generator[Snapshot, None, None]] = None
        self._problem: Optional[str] = None
        self._next = 0
        self._lock = threading.Lock()  # a sampler thread and the notebook may both read

    def _read(self) -> Snapshot:
        if self._file is not None:
            file, self._file = self._file, None  # its bytes are not kept once read
            label = replay_label(file.name)  # its snapshots', whatever self.label is set to
            if file.large is not None:
                self._large = file.large(file.name, file.data, file.size, label, file.mtime)
            else:
                self._frames = _read_whole(file, label)
        if self._large is not None and not self.follow:
            if self._last is None:
                self._last = self._large.last()
            return self._last
        if self._large is not None:
            frame = next(self._steps, None) if self._steps is not None else None
            if frame is None:  # the first step, or the end: from the start again
                self._steps = self._large.frames()
                frame = next(self._steps, None)
            if frame is None:
                raise RecordingError("holds no rows any more")
            return frame
        frames = self._frames or ()
        if not self.follow:
            return latest(frames)
        frame = frames[self._next]
        self._next = (self._next + 1) % len(frames)
        return frame

    def snapshot(self) -> Snapshot:
        with self._lock:
            if self._problem is None:
                try:
                    return self._read()
                except (RecordingError, InvalidIndex) as error:
                    self._problem = _problem(self._name, error)
            return Snapshot(source=self.label, problem=self._problem, recorded=True)

    def light_snapshot(self) -> Snapshot:
        """The same as :meth:`snapshot`: a time step is read whole, so leaving fields out
        would save nothing."""
        return self.snapshot()

    def close(self) -> None:
        """Close the file a large log's time steps are read from, if open; harmless twice."""
        with self._lock:
            if self._steps is not None:
                self._steps.close()
                self._steps = None
