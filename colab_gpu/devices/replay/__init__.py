"""The replay source: GPUs read from a saved ``nvidia-smi`` recording instead of the driver.

Users paste these files when asking for help, and they are how the project shows real
hardware where there is none. Three kinds are read:

* ``nvidia-smi -q -x`` XML (schema v10 to v13: field names moved between versions, e.g.
  ``clocks_throttle_reasons`` -> ``clocks_event_reasons``, ``power_readings`` ->
  ``gpu_power_readings``, ``power_draw`` -> ``average_power_draw``): one time step.
* ``nvidia-smi --query-gpu=... --format=csv`` logs, with or without units, with a header of
  nvidia-smi field names or a few custom names seen in real logs, or without a header when
  the columns' units match a known layout: one time step per timestamp.
* the plain ``nvidia-smi`` table (drivers 440 to 595), what notebook users paste most: one
  time step per table (``nvidia-smi -l`` appends one a step, under the time it was taken).

Values nvidia-smi could not read ("N/A", "[Not Supported]", ...) become ``None``.
"""
from __future__ import annotations

import calendar
import csv
import dataclasses
import datetime
import io
import os
import re
import threading
import xml.etree.ElementTree as ElementTree
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from .. import GPU, GPUProcess, MiB, MigInstance, Snapshot, known_compute_capability
from ..nvml import decode_clock_event_reasons

ACCEPTED = ("accepted: an `nvidia-smi -q -x` XML file, an "
            "`nvidia-smi --query-gpu=... --format=csv` log or the `nvidia-smi` table")

UNKNOWN_NAME = "name not recorded"


class RecordingError(ValueError):
    """A recording that cannot be replayed; the message is one line for the user."""


# --- values -----------------------------------------------------------------------------

_UNIT_BYTES = {"B": 1, "KiB": 1024, "MiB": MiB, "GiB": 1024 * MiB}
_NUMBER = re.compile(r"^\s*([-+]?\d+(?:\.\d+)?)\s*([A-Za-z%]*)\s*$")


def _number(text: Optional[str]) -> Optional[Tuple[float, str]]:
    """(value, unit) of "26.78 W" / "16x" / "40"; None for "N/A", "[Not Supported]" ..."""
    if text is None:
        return None
    match = _NUMBER.match(text)
    if match is None:
        return None
    return float(match.group(1)), match.group(2)


def _float(text: Optional[str]) -> Optional[float]:
    parsed = _number(text)
    return None if parsed is None else parsed[0]


def _int(text: Optional[str]) -> Optional[int]:
    parsed = _number(text)
    return None if parsed is None else int(parsed[0])


def _bytes(text: Optional[str], default_unit: str = "MiB") -> Optional[int]:
    """Bytes from "1032 MiB" (nvidia-smi's unit) or a bare number in ``default_unit``."""
    parsed = _number(text)
    if parsed is None:
        return None
    value, unit = parsed
    scale = _UNIT_BYTES.get(unit or default_unit)
    return None if scale is None else int(round(value * scale))


def _text(text: Optional[str]) -> Optional[str]:
    """Text as recorded; None for nvidia-smi's placeholders ("N/A", "[Not Supported]" ...)."""
    if text is None:
        return None
    text = text.strip()
    bare = text.strip("[]")
    if not text or bare in ("N/A", "Not Supported", "Unknown Error", "Insufficient Permissions",
                            "Requested functionality has been deprecated", "GPU is lost"):
        return None
    return text


def _enabled(text: Optional[str]) -> Optional[bool]:
    """nvidia-smi's "Enabled" / "Disabled"; None for "N/A" (a GPU without the feature)."""
    text = _text(text)
    return None if text is None else text == "Enabled"


def _epoch(text: str) -> Optional[float]:
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


def _reasons(states: Dict[str, Optional[str]]) -> Optional[Tuple[str, ...]]:
    """Decoded reasons from nvidia-smi's per-reason "Active" / "Not Active" words."""
    known = {name: state for name, state in states.items() if name in _REASON_BITS and state}
    if not known:
        return None
    mask = sum(_REASON_BITS[name] for name, state in known.items() if state.strip() == "Active")
    return decode_clock_event_reasons(mask)


# --- nvidia-smi -q -x -------------------------------------------------------------------


def _find(element, *paths: str) -> Optional[str]:
    """The text of the first of ``paths`` that holds a value (names moved across versions)."""
    for path in paths:
        found = element.find(path)
        if found is not None and _text(found.text) is not None:
            return found.text.strip()
    return None


def _process_kind(kind: str) -> str:
    """nvidia-smi's process type: C, C+G, M+C (MPS) run kernels; G alone only draws."""
    return "compute" if "C" in kind else "graphics"


def _xml_processes(gpu) -> Optional[Tuple[GPUProcess, ...]]:
    processes = gpu.find("processes")
    if processes is None:
        return None
    result = []
    for info in processes.findall("process_info"):
        pid = _int(_find(info, "pid"))
        if pid is None:
            continue
        result.append(GPUProcess(
            pid=pid,
            name=_find(info, "process_name"),
            used_memory=_bytes(_find(info, "used_memory")),
            kind=_process_kind(_find(info, "type") or "C"),
        ))
    return tuple(result)


def _xml_memory(element) -> Dict[str, Optional[int]]:
    """memory_total/used/free/reserved of a GPU's or a MIG device's ``<fb_memory_usage>``."""
    return {f"memory_{name}": _bytes(_find(element, f"fb_memory_usage/{name}"))
            for name in ("total", "used", "free", "reserved")}


def _xml_mig_instance(position: int, device) -> MigInstance:
    recorded_index = _int(_find(device, "index"))
    return MigInstance(
        index=position if recorded_index is None else recorded_index,
        gpu_instance_id=_int(_find(device, "gpu_instance_id")),
        compute_instance_id=_int(_find(device, "compute_instance_id")),
        multiprocessors=_int(_find(device, "device_attributes/shared/multiprocessor_count")),
        **_xml_memory(device),
    )


def _xml_mig_instances(gpu) -> Optional[Tuple[MigInstance, ...]]:
    """The GPU's MIG instances from ``<mig_devices>``; None for a GPU without MIG on."""
    devices = gpu.find("mig_devices")
    if devices is None or _enabled(_find(gpu, "mig_mode/current_mig")) is not True:
        return None
    return tuple(_xml_mig_instance(position, device)
                 for position, device in enumerate(devices.findall("mig_device")))


def _xml_gpu(index: int, gpu) -> GPU:
    power = "power_readings", "gpu_power_readings"
    reasons = gpu.find("clocks_event_reasons")
    if reasons is None:
        reasons = gpu.find("clocks_throttle_reasons")
    states = {} if reasons is None else {
        re.sub(r"^clocks_(event|throttle)_reason_", "", child.tag): _text(child.text)
        for child in reasons}
    name = _find(gpu, "product_name") or UNKNOWN_NAME
    return GPU(
        index=index,
        name=name,
        compute_capability=known_compute_capability(name),
        mig_enabled=_enabled(_find(gpu, "mig_mode/current_mig")),
        uuid=_find(gpu, "uuid"),
        bus_id=_find(gpu, "pci/pci_bus_id") or _text(gpu.get("id")),
        **_xml_memory(gpu),
        utilization_gpu=_float(_find(gpu, "utilization/gpu_util")),
        utilization_memory=_float(_find(gpu, "utilization/memory_util")),
        temperature=_float(_find(gpu, "temperature/gpu_temp")),
        power_draw=_float(_find(gpu, *(f"{group}/{name}" for group in power for name in
                                        ("power_draw", "average_power_draw", "instant_power_draw")))),
        power_limit=_float(_find(gpu, *(f"{group}/{name}" for group in power for name in
                                         ("enforced_power_limit", "current_power_limit", "power_limit")))),
        sm_clock=_int(_find(gpu, "clocks/sm_clock")),
        sm_clock_max=_int(_find(gpu, "max_clocks/sm_clock")),
        memory_clock=_int(_find(gpu, "clocks/mem_clock")),
        memory_clock_max=_int(_find(gpu, "max_clocks/mem_clock")),
        clock_event_reasons=_reasons(states),
        performance_state=_find(gpu, "performance_state"),
        pcie_generation=_int(_find(gpu, "pci/pci_gpu_link_info/pcie_gen/current_link_gen")),
        pcie_generation_max=_int(_find(gpu, "pci/pci_gpu_link_info/pcie_gen/max_link_gen")),
        pcie_width=_int(_find(gpu, "pci/pci_gpu_link_info/link_widths/current_link_width")),
        pcie_width_max=_int(_find(gpu, "pci/pci_gpu_link_info/link_widths/max_link_width")),
        processes=_xml_processes(gpu),
        mig_instances=_xml_mig_instances(gpu),
    )


def _xml_frames(text: str, label: str, fallback_time: float) -> Tuple[Snapshot, ...]:
    try:
        root = ElementTree.fromstring(text)
    except ElementTree.ParseError as error:
        raise RecordingError(f"is not well-formed XML ({error})") from None
    if root.tag != "nvidia_smi_log":
        raise RecordingError(f"is XML but not from `nvidia-smi -q -x` (its root element is "
                             f"<{root.tag}>, not <nvidia_smi_log>)")
    recorded = _find(root, "timestamp")
    frame = Snapshot(
        source=label,
        recorded=True,
        gpus=tuple(_xml_gpu(index, gpu) for index, gpu in enumerate(root.findall("gpu"))),
        driver_version=_find(root, "driver_version"),
        cuda_driver_version=_find(root, "cuda_version"),
        timestamp=(recorded and _epoch(recorded)) or fallback_time,
    )
    attached = _int(_find(root, "attached_gpus"))
    if attached is not None and attached > len(frame.gpus):
        # `nvidia-smi -q -x -i 2` records one GPU of several, without its index
        frame = _with_note(frame, f"holds {len(frame.gpus)} of the machine's {attached} GPUs, "
                                  f"numbered here from 0: the file does not say which")
    return (frame,)


# --- nvidia-smi --query-gpu=... --format=csv --------------------------------------------

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


def _with_note(frame: Snapshot, note: str) -> Snapshot:
    """Say in the snapshot's source how a file that does not describe itself was read."""
    return dataclasses.replace(frame, source=f"{frame.source} ({note})")


# --- nvidia-smi (the table) ---------------------------------------------------------------

_TABLE_START = re.compile(r"\|\s*NVIDIA-SMI\s+\S+\s+Driver Version:\s*(?P<driver>\S+)"
                          r"(?:\s+CUDA Version:\s*(?P<cuda>\S+))?")

# A GPU's cell, by the first word of the header cell above it, as the --query-gpu columns
# _csv_gpu reads ("__" stands for "."); fan, ECC, persistence, display and compute mode have
# no GPU field. "15360MiB" is MiB, as in a log.
_TABLE_CELLS = {
    "GPU": r"(?P<index>\d+)\s+(?P<name>.*?\S)\s+\S+",  # the name as shown, "..." and all
    "Bus-Id": r"(?P<pci__bus_id>\S+)(?:\s+\S+)?",
    "Fan": r"\S+\s+(?P<temperature__gpu>\S+)\s+(?P<pstate>\S+)\s+(?P<power__draw>\S+)\s*/\s*"
           r"(?P<enforced__power__limit>\S+)",
    "Memory-Usage": r"(?P<memory__used>\S+)\s*/\s*(?P<memory__total>\S+)",
    "GPU-Util": r"(?P<utilization__gpu>\S+)(?:\s+.*)?",
    "MIG": r"(?P<mig__mode__current>.+)",
}
# "GPU GI CI PID Type Process name GPU Memory"; drivers before 450 have no GI / CI columns.
_TABLE_PROCESS = re.compile(r"(?P<gpu>\d+)\s+(?:\S+\s+\S+\s+)?(?P<pid>\d+)\s+(?P<kind>\S+)\s+"
                            r"(?P<name>.*?)\s+(?P<memory>\S+)")
_TABLE_MIG = re.compile(r"(?P<gpu>\d+)\s+(?P<gi>\d+)\s+(?P<ci>\d+)\s+(?P<index>\d+)")

# The table has no free-memory column: free stays unknown, as in a --query-gpu log of total and
# used, since total - used would count the driver's reserve (FIELD-NOTES: NVML memory v2) as free.
_TABLE_NOTE = ("read from the `nvidia-smi` table: memory used / total only (no free or "
               "driver-reserved column); no clocks, PCIe link, UUID or memory-bus use")


def _table_sections(lines: Sequence[str]) -> Dict[str, Tuple[List[List[str]], List[List[List[str]]]]]:
    """{"gpus" / "mig devices" / "processes": (header rows, blocks)} of one table; a row is its
    cells, a block the rows of one GPU, MIG device or process (a new one starts at a number)."""
    sections: Dict[str, Tuple[List[List[str]], List[List[List[str]]]]] = {}
    header: List[List[str]] = []
    blocks: List[List[List[str]]] = []
    sections["gpus"] = header, blocks
    below = False
    for line in lines:
        line = line.strip()
        if not line.startswith("|") or line.startswith("|-"):
            continue  # rules, blank lines, the time above the next table
        if line.startswith("|="):
            below = True  # the rule under a section's header
            continue
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        title = re.match(r"(Processes|MIG devices):", cells[0])
        if title:
            header, blocks, below = [], [], False
            sections[title.group(1).lower()] = header, blocks
        elif not below:
            header.append(cells)
        elif re.match(r"\d+\s", cells[0]) or not blocks:
            blocks.append([cells])
        else:
            blocks[-1].append(cells)
    return sections


def _table_gpu(position: int, header: List[List[str]], block: List[List[str]]) -> GPU:
    row: Dict[str, str] = {}
    for labels, cells in zip(header, block):
        for label, cell in zip(labels, cells):
            pattern = _TABLE_CELLS.get(label.split()[0]) if label else None
            match = pattern and re.fullmatch(pattern, cell)
            if match:
                row.update((name.replace("__", "."), value) for name, value in match.groupdict().items())
    return _csv_gpu(position, row)


def _table_mig_instance(cells: List[str]) -> Optional[Tuple[int, MigInstance]]:
    """(GPU index, instance) of a MIG devices row "GPU GI CI Dev | used / total | SM ECC | ..."."""
    match = _TABLE_MIG.fullmatch(cells[0])
    if match is None or len(cells) < 3:
        return None
    memory = re.fullmatch(_TABLE_CELLS["Memory-Usage"], cells[1])
    return int(match["gpu"]), MigInstance(
        index=int(match["index"]), gpu_instance_id=int(match["gi"]), compute_instance_id=int(match["ci"]),
        multiprocessors=_int(cells[2].split()[0]) if cells[2] else None,
        memory_used=_bytes(memory["memory__used"]) if memory else None,
        memory_total=_bytes(memory["memory__total"]) if memory else None)


def _table_frame(lines: Sequence[str], label: str, timestamp: float) -> Snapshot:
    versions = _TABLE_START.match(lines[0].strip())
    sections = _table_sections(lines[1:])
    header, blocks = sections["gpus"]
    gpus = [_table_gpu(position, header, block) for position, block in enumerate(blocks)]
    if not gpus:
        raise RecordingError("is the `nvidia-smi` table but holds no GPU rows")
    processes: Dict[int, List[GPUProcess]] = {}
    for block in sections.get("processes", ((), ()))[1]:
        match = _TABLE_PROCESS.fullmatch(block[0][0])
        if match:
            processes.setdefault(int(match["gpu"]), []).append(GPUProcess(
                pid=int(match["pid"]), name=_text(match["name"]), used_memory=_bytes(match["memory"]),
                kind=_process_kind(match["kind"])))
    instances: Dict[int, List[MigInstance]] = {}
    for block in sections.get("mig devices", ((), ()))[1]:
        instance = _table_mig_instance(block[0])
        if instance:
            instances.setdefault(instance[0], []).append(instance[1])
    gpus = [dataclasses.replace(
        gpu,
        processes=tuple(processes.get(gpu.index, ())) if "processes" in sections else None,
        mig_instances=tuple(instances.get(gpu.index, ())) if "mig devices" in sections and gpu.mig_enabled else None,
    ) for gpu in gpus]
    return Snapshot(source=label, recorded=True, gpus=tuple(gpus),
                    driver_version=_text(versions["driver"]), cuda_driver_version=_text(versions["cuda"]),
                    timestamp=timestamp)


def _table_frames(text: str, label: str, fallback_time: float) -> Tuple[Snapshot, ...]:
    """One time step per table: `nvidia-smi -l` appends a table a step, the time above each."""
    lines = text.splitlines()  # CRLF too
    starts = [number for number, line in enumerate(lines) if _TABLE_START.match(line.strip())]
    if not starts:
        raise RecordingError("looks like the `nvidia-smi` table but has no 'NVIDIA-SMI ... Driver "
                             "Version' line")
    frames = []
    for start, end in zip(starts, starts[1:] + [len(lines)]):
        above = [line for line in lines[max(0, start - 3):start] if line.strip() and "---" not in line]
        recorded = _epoch(above[-1]) if above else None
        frames.append(_table_frame(lines[start:end], label, fallback_time if recorded is None else recorded))
    notes = [_TABLE_NOTE]
    if any(gpu.name.endswith("...") for frame in frames for gpu in frame.gpus):
        notes.append("names cut short by the table are shown as given")
    return tuple(_with_note(frame, "; ".join(notes)) for frame in frames)


# --- files -------------------------------------------------------------------------------


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
    except RecordingError as error:
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
