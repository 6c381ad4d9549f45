"""``nvidia-smi --query-gpu=... --format=csv`` logs: one time step per timestamp.

What people log with ``nvidia-smi -l``: with or without units, with a header of nvidia-smi field
names or a few custom names seen in real logs, or without a header when the columns' units match
a known layout; also the --query-gpu logs inside a capture of several nvidia-smi outputs
(:mod:`.capture`). A header that contradicts its values is refused rather than read into wrong
numbers. The table reader hands its cells to this module's row reader, so both follow one rule
per field. A log of days, too large to read whole, is read in parts (:class:`LargeLog`).
"""
from __future__ import annotations

import csv
import dataclasses
import functools
import io
import re
from typing import Any, Dict, Generator, Iterable, Iterator, List, Optional, Sequence, Tuple

from ... import words
from .. import GPU, Snapshot, known_compute_capability
from ..nvml import decode_clock_event_reasons
from .values import (UNIT_BYTES, UNKNOWN_NAME, RecordingError, as_bytes, as_enabled, as_float, as_int, as_text,
                     decode, epoch, event_reasons, latest, open_regular, value_and_unit, with_note)

__all__ = ["BLOCK", "TAIL_CAP", "TAIL_START", "LargeLog", "lines_of", "open_large", "query_gpu_logs", "read",
           "row_gpu", "sniff"]

# Column name (nvidia-smi's, or a custom one seen in real logs) -> GPU field and reader.
_COLUMNS = {
    "index": ("index", as_int), "gpu_index": ("index", as_int),
    "name": ("name", as_text), "gpu_name": ("name", as_text),
    "uuid": ("uuid", as_text), "gpu_uuid": ("uuid", as_text),
    "pci.bus_id": ("bus_id", as_text), "gpu_bus_id": ("bus_id", as_text),
    "compute_cap": ("compute_capability", as_text),
    "mig.mode.current": ("mig_enabled", as_enabled),
    "memory.total": ("memory_total", as_bytes),
    "memory.used": ("memory_used", as_bytes),
    "memory.free": ("memory_free", as_bytes),
    "memory.reserved": ("memory_reserved", as_bytes),
    "utilization.gpu": ("utilization_gpu", as_float), "utilization_gpu_percent": ("utilization_gpu", as_float),
    "utilization.memory": ("utilization_memory", as_float),
    "temperature.gpu": ("temperature", as_float), "temperature_c": ("temperature", as_float),
    "power.draw": ("power_draw", as_float), "power.draw.average": ("power_draw", as_float),
    "power.draw.instant": ("power_draw", as_float), "power_w": ("power_draw", as_float),
    "enforced.power.limit": ("power_limit", as_float), "power.limit": ("power_limit", as_float),
    "clocks.sm": ("sm_clock", as_int), "clocks.current.sm": ("sm_clock", as_int),
    "clocks.max.sm": ("sm_clock_max", as_int),
    "clocks.mem": ("memory_clock", as_int), "clocks.current.memory": ("memory_clock", as_int),
    "clocks.max.mem": ("memory_clock_max", as_int), "clocks.max.memory": ("memory_clock_max", as_int),
    "pstate": ("performance_state", as_text),
    "pcie.link.gen.current": ("pcie_generation", as_int),
    "pcie.link.gen.max": ("pcie_generation_max", as_int),
    "pcie.link.width.current": ("pcie_width", as_int),
    "pcie.link.width.max": ("pcie_width_max", as_int),
    "clocks_event_reasons.active": ("clock_event_reasons", as_text),
    "clocks_throttle_reasons.active": ("clock_event_reasons", as_text),
}
# When one field has several columns, the first listed in _COLUMNS wins (power.draw first).
_PRIORITY = {name: rank for rank, name in enumerate(_COLUMNS)}

# The units a numeric field's values (or its header's "[unit]") may carry; a bare number is
# always accepted. A unit outside these means the header names the column wrongly.
_BYTE_UNITS = frozenset(UNIT_BYTES)
_FIELD_UNITS = {
    "index": frozenset(), "temperature": frozenset(),
    "memory_total": _BYTE_UNITS, "memory_used": _BYTE_UNITS,
    "memory_free": _BYTE_UNITS, "memory_reserved": _BYTE_UNITS,
    "utilization_gpu": frozenset({"%"}), "utilization_memory": frozenset({"%"}),
    "power_draw": frozenset({"W"}), "power_limit": frozenset({"W"}),
    "sm_clock": frozenset({"MHz"}), "sm_clock_max": frozenset({"MHz"}),
    "memory_clock": frozenset({"MHz"}), "memory_clock_max": frozenset({"MHz"}),
    "pcie_generation": frozenset(), "pcie_generation_max": frozenset(),
    "pcie_width": frozenset(), "pcie_width_max": frozenset(),
}

# Columns of nvidia-smi's other --query-* lists, which name a GPU on every row (gpu_name,
# gpu_uuid ...) but whose rows are not GPUs: one row per process, or per retired memory page.
_NOT_GPU_ROWS = {
    "pid": "a per-process log (`nvidia-smi --query-compute-apps` or `--query-accounted-apps`): "
           "its rows are processes, not GPUs",
    "retired_pages.address": "a `nvidia-smi --query-retired-pages` log: its rows are retired memory "
                             "pages, not GPUs",
}

# Files written with --format=csv,noheader: a layout is recognised by the units of its values.
_HEADERLESS_LAYOUTS = {
    ("time", "%", "%", "MiB", "MiB", "", "W"): (
        "timestamp", "utilization.gpu", "utilization.memory", "memory.used", "memory.free",
        "temperature.gpu", "power.draw"),
}


def _column_name(header: str) -> str:
    """"memory.used [MiB]" -> "memory.used"; custom names compare case-insensitively."""
    return re.sub(r"\s*\[[^\]]*\]\s*$", "", header).strip().lower()


def _shape(cell: str) -> str:
    """What a headerless cell holds: "time", a unit ("%", "MiB", "W", "" for a bare number), "text"."""
    parsed = value_and_unit(cell)
    if parsed is not None:
        return parsed[1]
    return "time" if epoch(cell) is not None else "text"


def _is_header(cells: Sequence[str]) -> bool:
    return all(_shape(cell) == "text" for cell in cells if cell)


# A log names the same few GPUs on every row: their capability is looked up once each.
_capability = functools.lru_cache(maxsize=256)(known_compute_capability)


def row_gpu(position: int, row: Dict[str, str]) -> GPU:
    fields: Dict[str, Any] = {}  # GPU's keyword arguments, each of its field's type
    for column in sorted(row, key=lambda name: _PRIORITY.get(name, len(_PRIORITY))):
        if column not in _COLUMNS:
            continue
        field, read = _COLUMNS[column]
        value = read(row[column])
        if value is None or field in fields:
            continue
        fields[field] = value
    mask = fields.pop("clock_event_reasons", None)
    if mask is not None:
        try:
            fields["clock_event_reasons"] = decode_clock_event_reasons(int(str(mask), 16))
        except ValueError:
            pass
    else:
        states = {column.split(".", 1)[1]: as_text(value) for column, value in row.items()
                  if column.startswith(("clocks_event_reasons.", "clocks_throttle_reasons."))}
        decoded = event_reasons(states)
        if decoded is not None:
            fields["clock_event_reasons"] = decoded
    capability = fields.pop("compute_capability", None)
    if capability is not None:
        major, _, minor = (as_int(part) if part.isdigit() else None for part in str(capability).partition("."))
        if isinstance(major, int) and isinstance(minor, int):  # not None, nor inf of 5000 digits
            fields["compute_capability"] = (major, minor)
    if "memory_total" not in fields and "memory_used" in fields and "memory_free" in fields:
        # nvidia-smi's total is used + free + the driver's reserve (tesla-t4.xml: 1032 + 13939 + 388
        # of 15360 MiB); without it the card said "2 MiB used / n/a" and no fraction was judged full.
        fields["memory_total"] = fields["memory_used"] + fields["memory_free"] + fields.get("memory_reserved", 0)
    fields.setdefault("index", position)
    fields.setdefault("name", UNKNOWN_NAME)
    if "compute_capability" not in fields:
        fields["compute_capability"] = _capability(fields["name"])
    return GPU(**fields)


def _check_units(titles: Sequence[str], header: Sequence[str], first_row: Sequence[str]) -> None:
    """Refuse a header whose units contradict the field it names or the values under it."""
    for number, (title, name, cell) in enumerate(zip(titles, header, first_row), start=1):
        accepted = _FIELD_UNITS.get(_COLUMNS.get(name, ("",))[0])
        if accepted is None:
            continue
        titled = re.search(r"\[([^\]]*)\]\s*$", title)
        parsed = value_and_unit(cell)
        problem = None
        if titled and titled.group(1).strip() and titled.group(1).strip() not in accepted:
            problem = f"its header says [{titled.group(1).strip()}]"
        elif parsed and parsed[1] and parsed[1] not in accepted:
            problem = f"it holds {cell!r} on the first row"
        if problem:
            raise RecordingError(f"is a CSV whose header contradicts its values: column {number} "
                                 f"is named {name} but {problem}; fix the header line")


def _check_index(index: str, steps: Sequence[List[Dict[str, str]]]) -> None:
    """Refuse a header that names the GPU index column wrongly: another named column holds
    0, 1, ..., n-1 in every time step while the one named index does not."""
    def counts_gpus(column: str, step: List[Dict[str, str]]) -> bool:
        return [as_float(row[column]) for row in step] == list(range(len(step)))

    size = max(len(step) for step in steps)
    whole = [step for step in steps if len(step) == size]  # a log cut off mid-step ends short
    if size < 2 or all(counts_gpus(index, step) for step in whole):
        return
    for column in whole[0][0]:
        if column != index and _COLUMNS.get(column, ("",))[0] in _FIELD_UNITS \
                and all(counts_gpus(column, step) for step in whole):
            held = ", ".join(row[index] for row in whole[0][:3])
            raise RecordingError(
                f"is a CSV whose header contradicts its values: the column named {column} holds "
                f"0, 1, ..., {size - 1} in every time step, like GPU indices, while the "
                f"one named {index} holds {held}, ...; fix the header line")


def _time_steps(rows: Iterable[Dict[str, str]], gpu: Optional[str]) -> Iterator[List[Dict[str, str]]]:
    """Rows of one moment: one timestamp, or (without timestamps) until a GPU repeats, told
    apart by the column ``gpu`` (its index, UUID or bus id); with none, one row per moment."""
    step: List[Dict[str, str]] = []
    for row in rows:
        if "timestamp" in row:
            starts_new = bool(step) and row["timestamp"] != step[0]["timestamp"]
        else:
            starts_new = gpu is None or any(earlier[gpu] == row[gpu] for earlier in step)
        if step and starts_new:
            yield step
            step = []
        step.append(row)
    if step:
        yield step


def lines_of(text: str, first_number: int = 1) -> List[Tuple[int, List[str]]]:
    """The CSV's lines that hold a value, as (line number, cells stripped, without the empty
    cells nvidia-smi ends some rows with); ``first_number``: the number of the text's first line."""
    reader = csv.reader(io.StringIO(text), skipinitialspace=True)
    lines = []
    try:
        for cells in reader:
            if any(cell.strip() for cell in cells):
                cells = [cell.strip() for cell in cells]
                while cells and not cells[-1]:
                    cells.pop()
                lines.append((first_number + reader.line_num - 1, cells))
    except csv.Error as error:  # a value over csv's 131,072 characters: no nvidia-smi log holds one
        raise RecordingError(f"is not a CSV log nvidia-smi writes: {error} on line "
                             f"{first_number + reader.line_num - 1}") from None
    return lines


@dataclasses.dataclass(frozen=True)
class _Layout:
    """What a log's first lines say of all its rows: its columns, and the notes they call for."""

    titles: Optional[Tuple[str, ...]]  # the header line as written; None in a log without one
    header: Tuple[str, ...]  # the column names
    notes: Tuple[str, ...]
    index: Optional[str]  # the column of GPU indices
    gpu: Optional[str]  # the column that tells GPUs apart: the index, else the UUID or bus id


def _layout(lines: List[Tuple[int, List[str]]]) -> Tuple[_Layout, List[Tuple[int, List[str]]]]:
    """The log's layout, and its lines below the header."""
    note = None
    first = lines[0][1]
    if _is_header(first):
        titles: Optional[List[str]] = first
        lines = lines[1:]
        header = [_column_name(cell) for cell in first]
        other = next((_NOT_GPU_ROWS[name] for name in header if name in _NOT_GPU_ROWS), None)
        if other:
            raise RecordingError(f"is {other}; save `nvidia-smi -q -x` instead (the GPUs and "
                                 f"their processes)")
    else:
        shape = tuple(_shape(cell) for cell in first)
        if shape not in _HEADERLESS_LAYOUTS:
            raise RecordingError(
                f"is a CSV without a header line whose columns ({', '.join(s or 'number' for s in shape)}) "
                f"match no known nvidia-smi layout: record it with a header (--format=csv)")
        titles = None
        header = list(_HEADERLESS_LAYOUTS[shape])
        note = f"no header: columns read from their units as {', '.join(header)}"
    if not any(name in _COLUMNS for name in header):
        if len(header) == 1:  # no comma on the first line: a text file, not a CSV log
            raise RecordingError(f"is neither XML nor a CSV log: its first line is {first[0][:60]!r}")
        raise RecordingError(f"is a CSV whose columns ({', '.join(header[:6])}"
                             f"{', ...' if len(header) > 6 else ''}) are not nvidia-smi --query-gpu fields")
    if not lines:  # what the header names is known by now: a one-line text file is not "a CSV header"
        raise RecordingError("has a CSV header but no rows")
    if titles is not None:
        _check_units(titles, header, lines[0][1])
    notes = [note] if note else []
    columns = {_COLUMNS[name][0] for name in header if name in _COLUMNS}
    if {"memory_used", "memory_free"} <= columns and not {"memory_total", "memory_reserved"} & columns:
        notes.append("memory total taken as used + free")  # the driver's reserve, if any, is not recorded
    index = next((name for name in header if _COLUMNS.get(name, ("",))[0] == "index"), None)
    # Without an index, a single `--query-gpu=name,memory.used` of two T4s tells them apart
    # by UUID or bus id; it showed the second T4 alone, as GPU 0.
    gpu = index or next((name for name in header if _COLUMNS.get(name, ("",))[0] in ("uuid", "bus_id")), None)
    return _Layout(None if titles is None else tuple(titles), tuple(header), tuple(notes), index, gpu), lines


def _rows(layout: _Layout, lines: List[Tuple[int, List[str]]], ended: bool,
          more_above: bool = False) -> Tuple[List[Dict[str, str]], List[str]]:
    """The rows of ``lines`` by column name, and the note of a last line cut off. ``ended``: the
    text ends with a line end; ``more_above``: rows above these were read apart."""
    notes = []
    header = layout.header
    if lines and (len(lines) > 1 or more_above) and len(lines[-1][1]) < len(header) and not ended:
        # A log copied while nvidia-smi -l was still writing it ends in half a line.
        notes.append(f"its last line is cut off ({len(lines[-1][1])} of {len(header)} values) and left out")
        lines = lines[:-1]
    rows = []
    for number, cells in lines:
        if tuple(cells) == layout.titles:
            continue  # `nvidia-smi ... -l 1 >> gpu.csv` run twice writes its header again
        if len(cells) != len(header):
            raise RecordingError(f"has {len(cells)} values on line {number} where the header "
                                 f"names {len(header)} columns")
        rows.append(dict(zip(header, cells)))
    return rows, notes


_REPEATS = "its index column repeats within one time step, so GPUs are numbered in row order"


def _frame(layout: _Layout, step: List[Dict[str, str]], label: str, fallback_time: float) -> Tuple[Snapshot, bool]:
    """The snapshot of one time step, and whether its index column repeats (then ignored)."""
    index = layout.index
    indices = [row[index] for row in step] if index else []
    repeats = len(set(indices)) < len(indices)  # the "index" column does not hold GPU indices
    if repeats:
        step = [{name: value for name, value in row.items() if name != index} for row in step]
    recorded = epoch(step[0].get("timestamp", ""))
    return Snapshot(
        source=label,
        recorded=True,
        gpus=tuple(row_gpu(position, row) for position, row in enumerate(step)),
        driver_version=as_text(step[0].get("driver_version")),
        timestamp=recorded if recorded is not None else fallback_time,
    ), repeats


def _frames(layout: _Layout, rows: List[Dict[str, str]], notes: List[str], label: str,
            fallback_time: float) -> Tuple[Snapshot, ...]:
    """Every time step of ``rows``, each saying in its source the notes of the whole."""
    notes = list(layout.notes) + notes
    if layout.gpu is None and "timestamp" not in layout.header and len(rows) > 1:
        notes.append("no timestamp, GPU index, uuid or bus id: each row is read as the next "
                     "time step of one GPU")
    steps = list(_time_steps(rows, layout.gpu))
    if layout.index is not None and steps:
        _check_index(layout.index, steps)
    frames = []
    for step in steps:
        frame, repeats = _frame(layout, step, label, fallback_time)
        if repeats and _REPEATS not in notes:
            notes.append(_REPEATS)
        frames.append(frame)
    if notes:
        frames = [with_note(frame, "; ".join(notes)) for frame in frames]
    return tuple(frames)


def sniff(text: str) -> bool:
    """Any text no other format claims is read as a CSV log (this format is tried last)."""
    return True


def read(text: str, label: str, fallback_time: float) -> Tuple[Snapshot, ...]:
    """Every time step of the log ``text``."""
    lines = lines_of(text)
    if not lines:
        raise RecordingError("holds no values")
    layout, lines = _layout(lines)
    rows, notes = _rows(layout, lines, ended=text.endswith(("\n", "\r")))
    if not rows:
        raise RecordingError("has a CSV header but no rows")
    return _frames(layout, rows, notes, label, fallback_time)


def query_gpu_logs(text: str) -> str:
    """The `--query-gpu` CSV logs in a file that holds several nvidia-smi outputs (the table,
    `nvidia-smi -q`, `--query-compute-apps` ...), each a header and its rows under `#` comment
    lines, joined (a repeated header is skipped as in a log appended to twice); "" if none."""
    logs = []
    for block in re.split(r"\n\s*\n", text):
        lines = [line for line in block.splitlines() if line.strip() and not line.startswith("#")]
        try:
            header = [_column_name(cell) for cell in next(csv.reader(lines[:1], skipinitialspace=True), [])]
        except csv.Error:  # a line over csv's field limit heads no log
            continue
        if len(header) > 1 and any(name in _COLUMNS for name in header) \
                and not any(name in _NOT_GPU_ROWS for name in header):
            logs.append("\n".join(lines))
    return "\n".join(logs) + "\n" if logs else ""


# A log larger than LARGE_FROM bytes (`nvidia-smi -l` for days) is not parsed whole: that took
# 17 s and 474 MiB for 20 MB. Its last state is read from its end, a few KiB first, more until
# every GPU of its first rows has its last row (up to TAIL_CAP); its time steps a block at a time.
TAIL_START = 16 * 1024
TAIL_CAP = 4 * 1024 * 1024
BLOCK = 256 * 1024


class LargeLog:
    """A --query-gpu log too large to read whole: its header and first rows from its start (the
    checks of its layout), its last state from its end, its time steps as they are replayed.
    Only a log's first and last rows are read for its last state: a broken row between them is
    not seen, nor a GPU that appears only there."""

    def __init__(self, path: str, head: bytes, size: int, label: str, fallback_time: float):
        self.path, self.size, self.label, self.fallback_time = path, size, label, fallback_time
        end = head.rfind(b"\n") + 1
        if not end:
            raise RecordingError(f"has no line end in its first {words.size(len(head))}: it is no "
                                 f"log nvidia-smi writes")
        self.head_end = end
        lines = lines_of(decode(head[:end]))
        if not lines:
            raise RecordingError(f"holds no values in its first {words.size(end)}")
        self.layout, lines = _layout(lines)
        rows, notes = _rows(self.layout, lines, ended=True)
        if not rows:
            raise RecordingError(f"has a CSV header but no rows in its first {words.size(end)}")
        # The checks of the whole log, on its first rows; the GPUs its last state must show.
        self.gpus = {gpu.index for gpu in latest(_frames(self.layout, rows, notes, label, fallback_time)).gpus}
        self.first_gpu = rows[0][self.layout.gpu] if self.layout.gpu else None

    def _read(self, start: int, end: int) -> bytes:
        try:
            with open_regular(self.path) as file:
                file.seek(start)
                return file.read(end - start)
        except OSError as error:  # deleted since, or on a disk gone
            raise RecordingError(f"could not be read: {error.strerror or error}") from None

    def _line_number(self, offset: int) -> int:
        """The number of the line that starts at byte ``offset``, for an error's message."""
        count, start = 1, 0
        while start < offset:
            count += self._read(start, min(offset, start + BLOCK)).count(b"\n")
            start += BLOCK
        return count

    def _starts_step(self, before: Dict[str, str], row: Dict[str, str]) -> bool:
        """Whether ``row`` starts a time step, as the rows read from the start group them."""
        if "timestamp" in row:
            return row["timestamp"] != before["timestamp"]
        return self.layout.gpu is None or row[self.layout.gpu] == self.first_gpu

    def _tail(self, text: str, first_number: int) -> Tuple[Snapshot, ...]:
        """The time steps of the log's end ``text``, from the first that starts in it."""
        lines = lines_of(text, first_number)
        ended = text.endswith(("\n", "\r"))
        rows, notes = _rows(self.layout, lines, ended, more_above=True)
        start = next((number for number in range(1, len(rows)) if self._starts_step(rows[number - 1], rows[number])),
                     len(rows))
        rows = rows[start:]
        return _frames(self.layout, rows, notes, self.label, self.fallback_time) if rows else ()

    def last(self) -> Snapshot:
        """The log's last state: each GPU's last row, read from the end, as :func:`latest` of
        every time step gives it."""
        span = TAIL_START
        while True:
            start = self.size - span
            if start <= self.head_end:  # a log of a few MiB whose GPUs' last rows lie far apart
                return latest(read(decode(self._read(0, self.size)), self.label, self.fallback_time))
            data = self._read(start, self.size)
            cut = data.find(b"\n") + 1  # the line the read began in is whole in a longer read
            frames: Tuple[Snapshot, ...] = ()
            if cut:
                text = decode(data[cut:])
                try:
                    frames = self._tail(text, 1)
                except RecordingError:
                    self._tail(text, self._line_number(start + cut))  # the same, with the file's line numbers
                    raise
            shown = {gpu.index for frame in frames for gpu in frame.gpus}
            if frames and (self.gpus <= shown or span >= TAIL_CAP):
                break
            if span >= TAIL_CAP:
                raise RecordingError(f"holds no whole time step in its last {words.size(span)}")
            span *= 4
        note = f"a {words.size(self.size)} log: its last state read from its last {words.size(len(data) - cut)}"
        missing = sorted(self.gpus - shown)
        if missing:
            note += f"; GPU {', '.join(map(str, missing))} of its first rows not among them, left out"
        return with_note(latest(frames), note)

    def frames(self) -> Generator[Snapshot, None, None]:
        """Every time step from the first, read a block at a time: the memory of one block."""
        note = "; ".join(self.layout.notes + (f"a {words.size(self.size)} log read as it is replayed",))
        for step in _time_steps(self._all_rows(), self.layout.gpu):
            frame, repeats = _frame(self.layout, step, self.label, self.fallback_time)
            yield with_note(frame, note + (f"; {_REPEATS}" if repeats else ""))

    def _all_rows(self) -> Iterator[Dict[str, str]]:
        try:
            file = open_regular(self.path)
        except OSError as error:
            raise RecordingError(f"could not be read: {error.strerror or error}") from None
        with file:
            number, carry = 1, b""
            while True:
                try:
                    block = file.read(BLOCK)
                except OSError as error:
                    raise RecordingError(f"could not be read: {error.strerror or error}") from None
                data, ended = carry + block, len(block) < BLOCK
                end = len(data) if ended else data.rfind(b"\n") + 1
                if not end:
                    raise RecordingError(f"has a line over {words.size(BLOCK)} long after line {number}")
                data, carry = data[:end], data[end:]
                text = decode(data)
                rows, _ = _rows(self.layout, lines_of(text, number), ended=not ended or text.endswith(("\n", "\r")),
                                more_above=number > 1)
                yield from rows
                number += text.count("\n")
                if ended:
                    return


def open_large(path: str, head: bytes, size: int, label: str, fallback_time: float) -> LargeLog:
    """The reader of a log too large to read whole, of which ``head`` is the start."""
    return LargeLog(path, head, size, label, fallback_time)
