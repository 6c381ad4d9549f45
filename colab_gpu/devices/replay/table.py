"""The plain ``nvidia-smi`` table (drivers 440 to 595): one time step per table.

It is what notebook users paste most; ``nvidia-smi -l`` appends one table a step, under the
time it was taken. A GPU's cells are read as the --query-gpu columns they hold and handed to the
log's row reader; the table has no free, driver-reserved, clocks, PCIe link or UUID column, and
the snapshot's source says so.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Dict, List, Optional, Sequence, Tuple

from .. import GPU, GPUProcess, MigInstance, Snapshot
from .csv_log import row_gpu
from .values import RecordingError, as_bytes, as_int, as_text, epoch, process_kind, with_note

__all__ = ["read", "sniff"]

_TABLE_START = re.compile(r"\|\s*NVIDIA-SMI\s+\S+\s+Driver Version:\s*(?P<driver>\S+)"
                          r"(?:\s+CUDA Version:\s*(?P<cuda>\S+))?")

# A GPU's cell, by the first word of the header cell above it, as the --query-gpu columns
# row_gpu reads ("__" stands for "."); fan, ECC, persistence, display and compute mode have
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
    return row_gpu(position, row)


def _table_mig_instance(cells: List[str]) -> Optional[Tuple[int, MigInstance]]:
    """(GPU index, instance) of a MIG devices row "GPU GI CI Dev | used / total | SM ECC | ..."."""
    match = _TABLE_MIG.fullmatch(cells[0])
    if match is None or len(cells) < 3:
        return None
    gpu, index, gi, ci = (as_int(match[name]) for name in ("gpu", "index", "gi", "ci"))
    if gpu is None or index is None:  # a number of 400 digits
        return None
    memory = re.fullmatch(_TABLE_CELLS["Memory-Usage"], cells[1])
    return gpu, MigInstance(
        index=index, gpu_instance_id=gi, compute_instance_id=ci,
        multiprocessors=as_int(cells[2].split()[0]) if cells[2] else None,
        memory_used=as_bytes(memory["memory__used"]) if memory else None,
        memory_total=as_bytes(memory["memory__total"]) if memory else None)


def _table_frame(lines: Sequence[str], label: str, timestamp: float) -> Snapshot:
    versions = _TABLE_START.match(lines[0].strip())
    assert versions is not None  # read() starts a frame at each line it matches
    sections = _table_sections(lines[1:])
    header, blocks = sections["gpus"]
    gpus = [_table_gpu(position, header, block) for position, block in enumerate(blocks)]
    if not gpus:
        raise RecordingError("is the `nvidia-smi` table but holds no GPU rows")
    processes: Dict[int, List[GPUProcess]] = {}
    for block in sections.get("processes", ((), ()))[1]:
        match = _TABLE_PROCESS.fullmatch(block[0][0])
        if match is None:
            continue
        gpu, pid = as_int(match["gpu"]), as_int(match["pid"])
        if gpu is not None and pid is not None:  # None: a number of 400 digits
            processes.setdefault(gpu, []).append(GPUProcess(
                pid=pid, name=as_text(match["name"]), used_memory=as_bytes(match["memory"]),
                kind=process_kind(match["kind"])))
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
                    driver_version=as_text(versions["driver"]), cuda_driver_version=as_text(versions["cuda"]),
                    timestamp=timestamp)


def sniff(text: str) -> bool:
    """The table's banner and rules."""
    return "NVIDIA-SMI" in text and "+----" in text


def read(text: str, label: str, fallback_time: float) -> Tuple[Snapshot, ...]:
    """One time step per table: `nvidia-smi -l` appends a table a step, the time above each."""
    lines = text.splitlines()  # CRLF too
    starts = [number for number, line in enumerate(lines) if _TABLE_START.match(line.strip())]
    if not starts:
        raise RecordingError("looks like the `nvidia-smi` table but has no 'NVIDIA-SMI ... Driver "
                             "Version' line")
    frames = []
    for start, end in zip(starts, starts[1:] + [len(lines)]):
        above = [line for line in lines[max(0, start - 3):start] if line.strip() and "---" not in line]
        recorded = epoch(above[-1]) if above else None
        frames.append(_table_frame(lines[start:end], label, fallback_time if recorded is None else recorded))
    notes = [_TABLE_NOTE]
    if any(gpu.name.endswith("...") for frame in frames for gpu in frame.gpus):
        notes.append("names cut short by the table are shown as given")
    return tuple(with_note(frame, "; ".join(notes)) for frame in frames)
