"""The %gpu_status card (text.py, html.py), clear_cache's report and the memory holders
(memory.py), and charts (chart.py).

Here: how every renderer, the live monitor's, allocator's and find_batch's too, writes a value
(folding at 80 columns; sizes, durations, counts and n/a from colab_gpu.words, re-exported)
and the phrases the text and HTML card share (cuda:N names, torch and allocator summaries,
processes, MIG instances), so they agree.
"""
from __future__ import annotations

import os
import re
import textwrap
from typing import Optional, Sequence

from ..runtime import names_mig_instances
from ..words import NA, count, duration, significant, size, with_article  # the renderers' too

__all__ = [
    # colab_gpu.words' own, for every renderer
    "NA", "count", "duration", "significant", "size", "with_article",
    # writing a value
    "WIDTH", "fold", "fold_items", "labelled_row", "number", "celsius", "ratio", "power", "words",
    # the phrases the text and HTML card share
    "pcie_link", "capability", "UNKNOWN_CUDA_NAME", "FASTEST_FIRST_NOTE", "DRIVER_NUMBERING_NOTE", "seen_as",
    "short_uuid", "mig_instance_summary", "this_process", "process_name", "unrecorded_rows", "driver_versions",
    "torch_summary", "allocator_summary", "NOT_TOLD_APART", "outside_torch_label", "breakdown_summary",
]

WIDTH = 80  # a terminal's columns: it breaks a longer line at any character, mid-word


def fold(line: str, indent: int, width: int = WIDTH) -> str:
    """``line`` wrapped at spaces to ``width`` columns, its continuation lines indented by
    ``indent`` (under the value, not under the label); a long word (a path) is not split."""
    if len(line) <= width:
        return line
    text = line.lstrip(" ")
    return textwrap.fill(text, width, initial_indent=line[:len(line) - len(text)],
                         subsequent_indent=" " * indent, break_long_words=False, break_on_hyphens=False)


_GLUE = "\x00"  # stands for a space that must not break, while fold() runs


def fold_items(line: str, indent: int, width: int = WIDTH) -> str:
    """``line``, a list of facts ("a, b; c"), folded like :func:`fold` but after a comma or a
    semicolon: "388 MiB reserved by the driver" is not split across two lines, unless that
    fact alone is too wide (a sentence), which then flows like any text."""
    text = line.lstrip(" ")
    facts = re.split(r"(?<=[,;]) ", text)
    glued = " ".join(fact if len(fact) > width - indent else fact.replace(" ", _GLUE) for fact in facts)
    return fold(line[:len(line) - len(text)] + glued, indent, width).replace(_GLUE, " ")


def labelled_row(label: str, value: str, label_width: int) -> str:
    """"  label  value", the value in the column after ``label_width`` and a space, a list of
    facts folded under it (:func:`fold_items`): the rows of every text report."""
    return fold_items(f"  {label:<{label_width}} {value}", label_width + 3)


def number(value: Optional[float], unit: str = "", digits: int = 0) -> str:
    if value is None:
        return NA
    return f"{value:.{digits}f}{unit}"


def celsius(value: Optional[float]) -> str:
    """A temperature, spelt the same in the status, the live line, the panel and the record."""
    return number(value, " °C")


def ratio(value: Optional[float], maximum: Optional[float], unit: str) -> str:
    """"1590 / 1590 MHz", or the one known half."""
    if value is None and maximum is None:
        return NA
    if maximum is None:
        return f"{value:.0f} {unit}"
    return f"{number(value)} / {maximum:.0f} {unit}"


def power(draw: Optional[float], limit: Optional[float]) -> str:
    """"26.8 W of 70 W", or the draw alone where no limit is known ("n/a", not "n/a of n/a")."""
    if limit is None:
        return number(draw, " W", 1)
    return f"{number(draw, ' W', 1)} of {number(limit, ' W')}"


def pcie_link(gpu) -> str:
    """"gen 3/3 x8/16" (current/maximum); only the current value where the maximum is unknown
    (old drivers record none), rather than "x16/n/a"; n/a where neither is known."""
    if gpu.pcie_generation is None and gpu.pcie_width is None:
        return NA

    def part(prefix: str, current: Optional[int], maximum: Optional[int]) -> str:
        return f"{prefix}{number(current)}" + ("" if maximum is None else f"/{maximum}")

    return (f"{part('gen ', gpu.pcie_generation, gpu.pcie_generation_max)} "
            f"{part('x', gpu.pcie_width, gpu.pcie_width_max)}")


def capability(gpu) -> str:
    """"compute capability 7.5", with ", MIG on" for a GPU split into MIG instances."""
    digits = ".".join(map(str, gpu.compute_capability)) if gpu.compute_capability else NA
    return f"compute capability {digits}" + (", MIG on" if gpu.mig_enabled else "")


UNKNOWN_CUDA_NAME = "cuda:?"
FASTEST_FIRST_NOTE = f"{UNKNOWN_CUDA_NAME} - CUDA numbers these different GPUs fastest first"
# Said once on the card when cuda:N came from colab_gpu.cuda_order (a user may wonder how)
DRIVER_NUMBERING_NOTE = "cuda:N as the CUDA driver numbers these different GPUs, asked in a child process"


def seen_as(status, gpu, short: bool = False) -> str:
    """How torch names an NVML GPU: "cuda:1", "hidden from torch", or why that is unknown, as
    ``status.hidden_from_torch`` answers. ``short``: "cuda:?" without the why, for a display
    that says FASTEST_FIRST_NOTE once."""
    torch_index = status.torch_index_of.get(gpu.index)
    if torch_index is not None and status.cuda_numbering_known:
        return f"cuda:{torch_index}"
    hidden = status.hidden_from_torch(gpu)
    named = sorted(mig for index, mig in status.mig_torch_index_of if index == gpu.index)
    if hidden is False and named:
        return f"torch runs on its MIG instance {', '.join(map(str, named))}"
    if hidden:
        return "hidden from torch"
    if names_mig_instances(status.visible_devices):
        # the instances' UUIDs are unknown: which GPU holds the named one cannot be told
        return "hidden from torch unless the MIG instance in CUDA_VISIBLE_DEVICES is on it"
    return UNKNOWN_CUDA_NAME if short else FASTEST_FIRST_NOTE


def short_uuid(uuid: Optional[str]) -> str:
    """"MIG-4f2b0b4e": the prefix CUDA_VISIBLE_DEVICES also accepts; n/a when unknown."""
    if uuid is None:
        return NA
    prefix, _, rest = uuid.partition("-")
    return f"{prefix}-{rest[:8]}" if rest else uuid


def mig_instance_summary(status, gpu, mig) -> str:
    """One MIG instance: its memory, ids and size, its UUID and whether torch runs on it."""
    parts = [f"{size(mig.memory_used)} used / {size(mig.memory_total)}",
             f"GPU instance {number(mig.gpu_instance_id)}, compute instance {number(mig.compute_instance_id)}"]
    if mig.multiprocessors is not None:
        parts.append(f"{mig.multiprocessors} SMs")
    if mig.uuid is not None or not status.snapshot.recorded:  # nvidia-smi's XML never has it
        parts.append(f"uuid {short_uuid(mig.uuid)}")
    torch_index = status.mig_torch_index_of.get((gpu.index, mig.index))
    if torch_index is not None:
        parts.append(f"cuda:{torch_index} of this process (CUDA_VISIBLE_DEVICES)")
    return ", ".join(parts)


def this_process(status, process) -> str:
    """" (this process)" after the row of this kernel's own process: on a shared box, which
    GPU is mine. NVML's host pid matches only outside containers; a recording is not this machine."""
    return " (this process)" if not status.snapshot.recorded and process.pid == os.getpid() else ""


def process_name(name: Optional[str], width: int = 60) -> str:
    """A process's name cut to ``width`` characters: nvidia-smi records whole command lines
    (a browser's GPU process runs to 400 characters), which overflowed the card."""
    if name is None:
        return NA
    return name if len(name) <= width else name[:width - 1] + "…"


def unrecorded_rows(snapshot, gpu) -> set:
    """Rows a recording holds nothing for ("memory", "power", "clocks" ...): left out rather than shown
    as a line of n/a. From the live driver, n/a says a read failed, so they stay."""
    if not snapshot.recorded:
        return set()
    fields = {"memory": (gpu.memory_total, gpu.memory_used, gpu.memory_free, gpu.memory_reserved),
              "busy": (gpu.utilization_gpu, gpu.utilization_memory),
              "power": (gpu.power_draw, gpu.power_limit, gpu.temperature, gpu.performance_state),
              "clocks": (gpu.sm_clock, gpu.sm_clock_max, gpu.memory_clock, gpu.memory_clock_max,
                         gpu.clock_event_reasons),
              "PCIe": (gpu.pcie_generation, gpu.pcie_width, gpu.bus_id), "uuid": (gpu.uuid,),
              "processes": (gpu.processes,)}
    return {row for row, values in fields.items() if all(value is None for value in values)}


def driver_versions(snapshot, driver: str = "Driver", cuda: str = "CUDA driver") -> Optional[str]:
    """"Driver 515.105.01, CUDA driver 11.7", None where neither is known. A recording leaves
    out the version it does not hold (a --query-gpu log has no CUDA version): its "n/a" read as
    a machine without CUDA. From the live driver, n/a says a read failed, so it stays."""
    parts = [(driver, snapshot.driver_version), (cuda, snapshot.cuda_driver_version)]
    if not any(version for _, version in parts):
        return None
    return ", ".join(f"{label} {version or NA}" for label, version in parts
                     if version or not snapshot.recorded)


def words(items: Optional[Sequence[str]], empty: str = "none") -> str:
    if items is None:
        return NA
    return ", ".join(items) if items else empty


def torch_summary(torch) -> str:
    """"torch 2.11.0 (CUDA 12.8), CUDA not initialized", from a TorchState."""
    if not torch.imported:
        return "torch not imported yet" if torch.installed else "torch is not installed"
    build = {"cuda": f"CUDA {torch.cuda_version}", "rocm": f"ROCm {torch.hip_version}",
             "mps": "MPS: the Mac's GPU", "cpu": "CPU-only build"}[torch.build]
    state = "CUDA initialized" if torch.cuda_initialized else "CUDA not initialized"
    return f"torch {torch.version} ({build}), {state}"


def allocator_summary(memory) -> str:
    """One line of torch's allocator statistics for a device."""
    return (f"allocated {size(memory.allocated)} (peak {size(memory.peak_allocated)}), reserved "
            f"{size(memory.reserved)} (peak {size(memory.peak_reserved)}), reserved but unallocated "
            f"{size(memory.reserved_unallocated)}; {count(memory.num_ooms, 'OOM')}, "
            f"{count(memory.num_alloc_retries, 'cache flush')}")


# Where NVML lists no process under this one's id (a container's are the host's), the memory
# outside torch cannot be split between this process and the others: said as one sum.
NOT_TOLD_APART = "NVML lists no process under this one's id: in a container ids are the host's"


def outside_torch_label(part) -> str:
    """What ``part.context_and_non_torch`` holds: this process's CUDA context and non-torch
    memory, or, where this process cannot be told apart, every process's memory outside torch."""
    return ("CUDA context and non-torch" if part.other_processes is not None
            else "every process's CUDA context and non-torch")


def breakdown_summary(part) -> str:
    """Where a GPU's memory went, largest consumers named."""
    if part.other_processes is not None:
        outside = (f"other processes {size(part.other_processes)}, {outside_torch_label(part)} "
                   f"{size(part.context_and_non_torch)}")
    else:
        outside = f"{outside_torch_label(part)} {size(part.context_and_non_torch)} ({NOT_TOLD_APART})"
    return (f"{outside}, torch cache {size(part.torch_cache)}, "
            f"torch tensors {size(part.torch_tensors)}, free {size(part.free)}")
