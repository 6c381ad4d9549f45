"""The replay source: GPUs read from a saved ``nvidia-smi`` recording instead of the driver.

Users paste these files when asking for help, and they are how the project shows real
hardware where there is none. Three kinds are read, each by a module of its own:

* ``nvidia-smi -q -x`` XML, one time step (:mod:`.nvsmi_xml`);
* ``nvidia-smi --query-gpu=... --format=csv`` logs, one time step per timestamp (:mod:`.csv_log`);
* the plain ``nvidia-smi`` table, one time step per table (:mod:`.table`).

This module reads the file, tells which kind it is and hands it to that module;
:class:`ReplaySource` serves the time steps. Values nvidia-smi could not read ("N/A",
"[Not Supported]", ...) become ``None`` (:mod:`.values`).
"""
from __future__ import annotations

import dataclasses
import os
import threading
from typing import Dict, Optional, Sequence, Tuple

from .. import GPU, InvalidIndex, Snapshot
from .csv_log import _csv_frames, _query_gpu_logs
from .nvsmi_xml import _xml_frames
from .table import _table_frames
from .values import UNKNOWN_NAME, RecordingError, _with_note

__all__ = ["ACCEPTED", "LABEL_PREFIX", "UNKNOWN_NAME", "RecordingError", "ReplaySource", "latest",
           "load_frames", "replay_label"]

ACCEPTED = ("accepted: an `nvidia-smi -q -x` XML file, an "
            "`nvidia-smi --query-gpu=... --format=csv` log or the `nvidia-smi` table")


def load_frames(path: "str | os.PathLike[str]") -> Tuple[Snapshot, ...]:
    """Every time step of the recording at ``path``, in order (an XML file is one step).

    Raises :class:`RecordingError` with one line saying what is wrong with which file.
    """
    path = os.path.expanduser(os.fspath(path))  # the magic's line reaches here unexpanded
    label = replay_label(path)
    try:
        with open(path, "rb") as file:
            data = file.read()
        fallback_time = os.path.getmtime(path)
    except FileNotFoundError:
        raise RecordingError(f"cannot replay {path}: no such file; {ACCEPTED}") from None
    except IsADirectoryError:
        raise RecordingError(f"cannot replay {path}: it is a directory; {ACCEPTED}") from None
    except OSError as error:
        raise RecordingError(f"cannot replay {path}: {error.strerror or error}; {ACCEPTED}") from None
    try:
        return _parse(data, label, fallback_time)
    except (RecordingError, InvalidIndex) as error:
        raise RecordingError(f"cannot replay {path}: it {error}; {ACCEPTED}") from None


def _parse(data: bytes, label: str, fallback_time: float) -> Tuple[Snapshot, ...]:
    # Windows PowerShell 5's `nvidia-smi ... > file` writes UTF-16 with a byte-order mark.
    utf16 = data.startswith((b"\xff\xfe", b"\xfe\xff"))
    if not utf16 and b"\0" in data:
        raise RecordingError("holds binary data, not text")
    try:
        text = data.decode("utf-16" if utf16 else "utf-8-sig")
    except UnicodeDecodeError:
        raise RecordingError(f"is not {'UTF-16' if utf16 else 'UTF-8'} text") from None
    stripped = text.lstrip()
    if not stripped:
        raise RecordingError("is empty")
    if stripped.startswith("<"):
        return _xml_frames(stripped, label, fallback_time)
    table, query = "NVIDIA-SMI" in text and "+----" in text, "==NVSMI LOG==" in text
    logs = _query_gpu_logs(text) if table or query else ""
    if logs:  # a capture of several outputs (nvidia_gpu_exporter's) was called "the table"
        return tuple(_with_note(frame, "read from its --query-gpu CSV logs; its other nvidia-smi outputs left out")
                     for frame in _csv_frames(logs, label, fallback_time))
    if table:
        return _table_frames(text, label, fallback_time)
    if query:
        raise RecordingError("is `nvidia-smi -q` text; save `nvidia-smi -q -x` (XML) instead")
    return _csv_frames(text, label, fallback_time)


LABEL_PREFIX = "replay of "


def replay_label(path: "str | os.PathLike[str]") -> str:
    return LABEL_PREFIX + os.path.basename(os.fspath(path))


def latest(frames: Sequence[Snapshot]) -> Snapshot:
    """The last row of every GPU: a log cut off mid-step still shows each GPU's last state."""
    by_index: Dict[int, GPU] = {}
    for frame in frames:
        by_index.update((gpu.index, gpu) for gpu in frame.gpus)
    return dataclasses.replace(frames[-1], gpus=tuple(by_index[index] for index in sorted(by_index)))


class ReplaySource:
    """A :class:`~colab_gpu.devices.DeviceSource` over a recording (read once, on first use).

    ``follow=False``: every snapshot is the recording's final state (the last row per GPU).
    ``follow=True``: each snapshot is the next time step, looping at the end (a demo trace).
    """

    def __init__(self, path: "str | bytes | os.PathLike", follow: bool = False):
        self.path = os.fsdecode(path)
        self.follow = follow
        self.label = replay_label(self.path)
        self._frames: Optional[Tuple[Snapshot, ...]] = None
        self._problem: Optional[str] = None
        self._next = 0
        self._lock = threading.Lock()  # a sampler thread and the notebook may both read

    def _load(self) -> None:
        if self._frames is None and self._problem is None:
            try:
                self._frames = load_frames(self.path)
            except RecordingError as error:
                self._problem = str(error)

    def snapshot(self) -> Snapshot:
        with self._lock:
            self._load()
            if self._problem is not None:
                return Snapshot(source=self.label, problem=self._problem, recorded=True)
            frames = self._frames
            if not self.follow:
                return latest(frames)
            frame = frames[self._next]
            self._next = (self._next + 1) % len(frames)
            return frame

    def light_snapshot(self) -> Snapshot:
        """The same as :meth:`snapshot`: the recording was parsed whole at the first read, so
        leaving fields out would save nothing."""
        return self.snapshot()

    def close(self) -> None:
        """Nothing to release: the file was read whole and closed at once."""
