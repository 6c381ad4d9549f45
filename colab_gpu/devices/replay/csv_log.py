"""``nvidia-smi --query-gpu=... --format=csv`` logs: one time step per timestamp.

What people log with ``nvidia-smi -l``: with or without units, with a header of nvidia-smi field
names or a few custom names seen in real logs, or without a header when the columns' units match
a known layout; also the --query-gpu logs inside a capture of several nvidia-smi outputs. A
header that contradicts its values is refused rather than read into wrong numbers. The table
reader hands its cells to this module's row reader, so both follow one rule per field.
"""
from __future__ import annotations

import csv
import io
import re
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from .. import GPU, Snapshot, known_compute_capability
from ..nvml import decode_clock_event_reasons
from .values import (_UNIT_BYTES, UNKNOWN_NAME, RecordingError, _bytes, _enabled, _epoch, _float,
                     _int, _number, _reasons, _text, _with_note)

# Column name (nvidia-smi's, or a custom one seen in real logs) -> GPU field and reader.
_COLUMNS = {
    "index": ("index", _int), "gpu_index": ("index", _int),
    "name": ("name", _text), "gpu_name": ("name", _text),
    "uuid": ("uuid", _text), "gpu_uuid": ("uuid", _text),
    "pci.bus_id": ("bus_id", _text), "gpu_bus_id": ("bus_id", _text),
    "compute_cap": ("compute_capability", _text),
    "mig.mode.current": ("mig_enabled", _enabled),
    "memory.total": ("memory_total", _bytes),
    "memory.used": ("memory_used", _bytes),
    "memory.free": ("memory_free", _bytes),
    "memory.reserved": ("memory_reserved", _bytes),
    "utilization.gpu": ("utilization_gpu", _float), "utilization_gpu_percent": ("utilization_gpu", _float),
    "utilization.memory": ("utilization_memory", _float),
    "temperature.gpu": ("temperature", _float), "temperature_c": ("temperature", _float),
    "power.draw": ("power_draw", _float), "power.draw.average": ("power_draw", _float),
    "power.draw.instant": ("power_draw", _float), "power_w": ("power_draw", _float),
    "enforced.power.limit": ("power_limit", _float), "power.limit": ("power_limit", _float),
    "clocks.sm": ("sm_clock", _int), "clocks.current.sm": ("sm_clock", _int),
    "clocks.max.sm": ("sm_clock_max", _int),
    "clocks.mem": ("memory_clock", _int), "clocks.current.memory": ("memory_clock", _int),
    "clocks.max.mem": ("memory_clock_max", _int), "clocks.max.memory": ("memory_clock_max", _int),
    "pstate": ("performance_state", _text),
    "pcie.link.gen.current": ("pcie_generation", _int),
    "pcie.link.gen.max": ("pcie_generation_max", _int),
    "pcie.link.width.current": ("pcie_width", _int),
    "pcie.link.width.max": ("pcie_width_max", _int),
    "clocks_event_reasons.active": ("clock_event_reasons", _text),
    "clocks_throttle_reasons.active": ("clock_event_reasons", _text),
}
# When one field has several columns, the first listed in _COLUMNS wins (power.draw first).
_PRIORITY = {name: rank for rank, name in enumerate(_COLUMNS)}

# The units a numeric field's values (or its header's "[unit]") may carry; a bare number is
# always accepted. A unit outside these means the header names the column wrongly.
_BYTE_UNITS = frozenset(_UNIT_BYTES)
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
    parsed = _number(cell)
    if parsed is not None:
        return parsed[1]
    return "time" if _epoch(cell) is not None else "text"


def _is_header(cells: Sequence[str]) -> bool:
    return all(_shape(cell) == "text" for cell in cells if cell)


def _csv_gpu(position: int, row: Dict[str, str]) -> GPU:
    fields: Dict[str, object] = {}
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
        states = {column.split(".", 1)[1]: _text(value) for column, value in row.items()
                  if column.startswith(("clocks_event_reasons.", "clocks_throttle_reasons."))}
        decoded = _reasons(states)
        if decoded is not None:
            fields["clock_event_reasons"] = decoded
    capability = fields.pop("compute_capability", None)
    if capability is not None:
        major, _, minor = str(capability).partition(".")
        if major.isdigit() and minor.isdigit():
            fields["compute_capability"] = (int(major), int(minor))
    if "memory_total" not in fields and "memory_used" in fields and "memory_free" in fields:
        # nvidia-smi's total is used + free + the driver's reserve (tesla-t4.xml: 1032 + 13939 + 388
        # of 15360 MiB); without it the card said "2 MiB used / n/a" and no fraction was judged full.
        fields["memory_total"] = fields["memory_used"] + fields["memory_free"] + fields.get("memory_reserved", 0)
    fields.setdefault("index", position)
    fields.setdefault("name", UNKNOWN_NAME)
    fields.setdefault("compute_capability", known_compute_capability(fields["name"]))
    return GPU(**fields)


def _check_units(titles: Sequence[str], header: Sequence[str], first_row: Sequence[str]) -> None:
    """Refuse a header whose units contradict the field it names or the values under it."""
    for number, (title, name, cell) in enumerate(zip(titles, header, first_row), start=1):
        accepted = _FIELD_UNITS.get(_COLUMNS.get(name, ("",))[0])
        if accepted is None:
            continue
        titled = re.search(r"\[([^\]]*)\]\s*$", title)
        parsed = _number(cell)
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
        return [_float(row[column]) for row in step] == list(range(len(step)))

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


def _time_steps(rows: List[Dict[str, str]], gpu: Optional[str]) -> Iterable[List[Dict[str, str]]]:
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


def _csv_frames(text: str, label: str, fallback_time: float) -> Tuple[Snapshot, ...]:
    lines = [cells for cells in csv.reader(io.StringIO(text), skipinitialspace=True)
             if any(cell.strip() for cell in cells)]
    lines = [[cell.strip() for cell in cells] for cells in lines]
    for cells in lines:  # nvidia-smi ends some rows with ", "
        while cells and not cells[-1]:
            cells.pop()
    if not lines:
        raise RecordingError("holds no values")
    note = None
    if _is_header(lines[0]):
        titles, lines = lines[0], lines[1:]
        header = [_column_name(cell) for cell in titles]
        other = next((_NOT_GPU_ROWS[name] for name in header if name in _NOT_GPU_ROWS), None)
        if other:
            raise RecordingError(f"is {other}; save `nvidia-smi -q -x` instead (the GPUs and "
                                 f"their processes)")
    else:
        shape = tuple(_shape(cell) for cell in lines[0])
        if shape not in _HEADERLESS_LAYOUTS:
            raise RecordingError(
                f"is a CSV without a header line whose columns ({', '.join(s or 'number' for s in shape)}) "
                f"match no known nvidia-smi layout: record it with a header (--format=csv)")
        header = list(_HEADERLESS_LAYOUTS[shape])
        note = f"no header: columns read from their units as {', '.join(header)}"
    if not any(name in _COLUMNS for name in header):
        if len(header) == 1:  # no comma on the first line: a text file, not a CSV log
            raise RecordingError(f"is neither XML nor a CSV log: its first line is {titles[0][:60]!r}")
        raise RecordingError(f"is a CSV whose columns ({', '.join(header[:6])}"
                             f"{', ...' if len(header) > 6 else ''}) are not nvidia-smi --query-gpu fields")
    if not lines:  # what the header names is known by now: a one-line text file is not "a CSV header"
        raise RecordingError("has a CSV header but no rows")
    if note is None:
        _check_units(titles, header, lines[0])
    notes = [note] if note else []
    columns = {_COLUMNS[name][0] for name in header if name in _COLUMNS}
    if {"memory_used", "memory_free"} <= columns and not {"memory_total", "memory_reserved"} & columns:
        notes.append("memory total taken as used + free")  # the driver's reserve, if any, is not recorded
    if len(lines) > 1 and len(lines[-1]) < len(header) and not text.endswith(("\n", "\r")):
        # A log copied while nvidia-smi -l was still writing it ends in half a line.
        notes.append(f"its last line is cut off ({len(lines[-1])} of {len(header)} values) and left out")
        lines = lines[:-1]
    rows = []
    for number, cells in enumerate(lines, start=2 if note is None else 1):
        if note is None and cells == titles:
            continue  # `nvidia-smi ... -l 1 >> gpu.csv` run twice writes its header again
        if len(cells) != len(header):
            raise RecordingError(f"has {len(cells)} values on line {number} where the header "
                                 f"names {len(header)} columns")
        rows.append(dict(zip(header, cells)))
    if not rows:
        raise RecordingError("has a CSV header but no rows")
    index = next((name for name in header if _COLUMNS.get(name, ("",))[0] == "index"), None)
    # Without an index, a single `--query-gpu=name,memory.used` of two T4s tells them apart
    # by UUID or bus id; it showed the second T4 alone, as GPU 0.
    gpu = index or next((name for name in header if _COLUMNS.get(name, ("",))[0] in ("uuid", "bus_id")), None)
    if gpu is None and "timestamp" not in header and len(rows) > 1:
        notes.append("no timestamp, GPU index, uuid or bus id: each row is read as the next "
                     "time step of one GPU")
    steps = list(_time_steps(rows, gpu))
    if index is not None:
        _check_index(index, steps)
    frames = []
    for step in steps:
        indices = [row[index] for row in step] if index else []
        if len(set(indices)) < len(indices):  # the "index" column does not hold GPU indices
            repeats = "its index column repeats within one time step, so GPUs are numbered in row order"
            notes += [repeats] if repeats not in notes else []
            step = [{name: value for name, value in row.items() if name != index} for row in step]
        recorded = _epoch(step[0].get("timestamp", ""))
        frames.append(Snapshot(
            source=label,
            recorded=True,
            gpus=tuple(_csv_gpu(position, row) for position, row in enumerate(step)),
            driver_version=_text(step[0].get("driver_version")),
            timestamp=recorded if recorded is not None else fallback_time,
        ))
    if notes:
        frames = [_with_note(frame, "; ".join(notes)) for frame in frames]
    return tuple(frames)


def _query_gpu_logs(text: str) -> str:
    """The `--query-gpu` CSV logs in a file that holds several nvidia-smi outputs (the table,
    `nvidia-smi -q`, `--query-compute-apps` ...), each a header and its rows under `#` comment
    lines, joined (a repeated header is skipped as in a log appended to twice); "" if none."""
    logs = []
    for block in re.split(r"\n\s*\n", text):
        lines = [line for line in block.splitlines() if line.strip() and not line.startswith("#")]
        header = [_column_name(cell) for cell in next(csv.reader(lines[:1], skipinitialspace=True), [])]
        if len(header) > 1 and any(name in _COLUMNS for name in header) \
                and not any(name in _NOT_GPU_ROWS for name in header):
            logs.append("\n".join(lines))
    return "\n".join(logs) + "\n" if logs else ""
