"""Values as nvidia-smi writes them, shared by the readers of a recording.

nvidia-smi prints numbers with their units ("26.78 W", "1032 MiB", "16x"), times in a few
layouts, and words in place of the values it could not read ("N/A", "[Not Supported]", ...):
those become ``None`` here, so a value nvidia-smi lacked reads as unknown, never as 0. Here too
are what every reader needs besides: the one error a recording that cannot be replayed raises,
how a file is opened (a regular one only) and decoded, the process kinds, the note that says in
a snapshot's source how a file was read, and the last state of a recording of several time steps.
"""
from __future__ import annotations

import calendar
import dataclasses
import datetime
import math
import os
import re
import stat
from typing import Any, BinaryIO, Dict, Optional, Sequence, Tuple

from ...errors import UserError
from .. import GPU, MiB, Snapshot
from ..nvml import decode_clock_event_reasons

__all__ = ["UNIT_BYTES", "UNKNOWN_NAME", "RecordingError", "as_bytes", "as_enabled", "as_float", "as_int",
           "as_text", "decode", "epoch", "event_reasons", "latest", "not_a_file", "open_regular", "process_kind",
           "value_and_unit", "with_note"]

UNKNOWN_NAME = "name not recorded"


class RecordingError(UserError, ValueError):
    """A recording that cannot be replayed; the message is one line for the user."""


def not_a_file(mode: int) -> str:
    """What a path of this ``st_mode`` names instead of a file: "is a directory, not a saved recording"."""
    kinds = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a named pipe (FIFO)"),
             (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))
    kind = next((word for test, word in kinds if test(mode)), "no regular file")
    return f"is {kind}, not a saved recording"


def open_regular(name: str) -> BinaryIO:
    """The regular file ``name`` opened to read. A FIFO put in its place since it was checked
    does not block the open (O_NONBLOCK) and raises RecordingError, as a device does; what the
    system refuses raises OSError."""
    file = os.fdopen(os.open(name, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)), "rb")
    try:
        mode = os.fstat(file.fileno()).st_mode
        if not stat.S_ISREG(mode):
            raise RecordingError(not_a_file(mode))
    except BaseException:
        file.close()
        raise
    return file


def decode(data: bytes) -> str:
    """The text of a recording: UTF-8 (a byte-order mark dropped), or UTF-16 with its mark, as
    Windows PowerShell 5's `nvidia-smi ... > file` writes it."""
    utf16 = data.startswith((b"\xff\xfe", b"\xfe\xff"))
    if not utf16 and b"\0" in data:
        raise RecordingError("holds binary data, not text")
    try:
        return data.decode("utf-16" if utf16 else "utf-8-sig")
    except UnicodeDecodeError:
        raise RecordingError(f"is not {'UTF-16' if utf16 else 'UTF-8'} text") from None


UNIT_BYTES = {"B": 1, "KiB": 1024, "MiB": MiB, "GiB": 1024 * MiB}
_NUMBER = re.compile(r"^\s*([-+]?\d+(?:\.\d+)?)\s*([A-Za-z%]*)\s*$")


def value_and_unit(text: Optional[str]) -> Optional[Tuple[float, str]]:
    """(value, unit) of "26.78 W" / "16x" / "40"; None for "N/A", "[Not Supported]" .... A number
    too large for a float (400 digits) is infinite: :class:`~colab_gpu.devices.GPU` refuses it
    as a reading, with what was read."""
    match = _number(text)
    if match is None:
        return None
    value = float(match.group(1))
    return value, match.group(2)


def _number(text: Optional[str]) -> Optional[re.Match[str]]:
    return None if text is None else _NUMBER.match(text)


def as_float(text: Optional[str]) -> Optional[float]:
    parsed = value_and_unit(text)
    return None if parsed is None else parsed[0]


def as_int(text: Optional[str]) -> Optional[int]:
    """An integer as written: through a float, a 20-digit GPU index read 12345678901234567168."""
    match = _number(text)
    return None if match is None else _whole(match, 1)


def as_bytes(text: Optional[str], default_unit: str = "MiB") -> Optional[int]:
    """Bytes from "1032 MiB" (nvidia-smi's unit) or a bare number in ``default_unit``."""
    match = _number(text)
    if match is None:
        return None
    scale = UNIT_BYTES.get(match.group(2) or default_unit)
    return None if scale is None else _whole(match, scale)


def _whole(number: re.Match[str], scale: int) -> Any:  # an int; past int()'s digits the float below
    """The matched number times ``scale``, exact where it is an integer; one past what ``int()``
    reads of a string (4300 digits) or past a float (1e308) stays a float, infinite at worst,
    which :class:`~colab_gpu.devices.GPU` refuses as a reading (int(inf) raised OverflowError)."""
    literal = number.group(1)
    value = float(literal)
    if "." not in literal:
        try:
            return int(literal) * scale
        except ValueError:  # longer than sys.get_int_max_str_digits()
            pass
    return int(round(value * scale)) if math.isfinite(value * scale) else value * scale


def as_text(text: Optional[str]) -> Optional[str]:
    """Text as recorded; None for nvidia-smi's placeholders ("N/A", "[Not Supported]" ...)."""
    if text is None:
        return None
    text = text.strip()
    bare = text.strip("[]")
    if not text or bare in ("N/A", "Not Supported", "Unknown Error", "Insufficient Permissions",
                            "Requested functionality has been deprecated", "GPU is lost"):
        return None
    return text


def as_enabled(text: Optional[str]) -> Optional[bool]:
    """nvidia-smi's "Enabled" / "Disabled"; None for "N/A" (a GPU without the feature)."""
    text = as_text(text)
    return None if text is None else text == "Enabled"


def epoch(text: str) -> Optional[float]:
    """Seconds since the epoch of a recorded time; zone-less times are taken as UTC."""
    text = text.strip()
    moment = None
    for layout in ("%Y/%m/%d %H:%M:%S.%f", "%Y/%m/%d %H:%M:%S", "%a %b %d %H:%M:%S %Y"):
        try:
            moment = datetime.datetime.strptime(text, layout)
            break
        except ValueError:
            continue
    if moment is None:
        try:
            moment = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            return None
    if moment.tzinfo is not None:
        return moment.timestamp()
    return calendar.timegm(moment.timetuple()) + moment.microsecond / 1e6


# Bits of NVML's clocks-event mask by the suffix nvidia-smi gives each reason.
_REASON_BITS = {
    "gpu_idle": 0x001,
    "applications_clocks_setting": 0x002,
    "sw_power_cap": 0x004,
    "hw_slowdown": 0x008,
    "sync_boost": 0x010,
    "sw_thermal_slowdown": 0x020,
    "hw_thermal_slowdown": 0x040,
    "hw_power_brake_slowdown": 0x080,
    "display_clocks_setting": 0x100,
}


def event_reasons(states: Dict[str, Optional[str]]) -> Optional[Tuple[str, ...]]:
    """Decoded reasons from nvidia-smi's per-reason "Active" / "Not Active" words."""
    known = {name: state for name, state in states.items() if name in _REASON_BITS and state}
    if not known:
        return None
    mask = sum(_REASON_BITS[name] for name, state in known.items() if state.strip() == "Active")
    return decode_clock_event_reasons(mask)


def process_kind(kind: str) -> str:
    """nvidia-smi's process type: C, C+G, M+C (MPS) run kernels; G alone only draws."""
    return "compute" if "C" in kind else "graphics"


def with_note(frame: Snapshot, note: str) -> Snapshot:
    """Say in the snapshot's source how a file that does not describe itself was read."""
    return dataclasses.replace(frame, source=f"{frame.source} ({note})")


def latest(frames: Sequence[Snapshot]) -> Snapshot:
    """The last row of every GPU: a log cut off mid-step still shows each GPU's last state."""
    by_index: Dict[int, GPU] = {}
    for frame in frames:
        by_index.update((gpu.index, gpu) for gpu in frame.gpus)
    return dataclasses.replace(frames[-1], gpus=tuple(by_index[index] for index in sorted(by_index)))
