"""Plain-text rendering, for terminals and for the text/plain part of notebook output.

Every line fits an 80-column terminal (WIDTH), which would otherwise break it mid-word: facts
are folded between items, prose between words, and a value that cannot be broken (a path, a
UUID, a configuration string) gets a line of its own.
"""
from __future__ import annotations

from typing import List

from . import (DRIVER_NUMBERING_NOTE, FASTEST_FIRST_NOTE, NA, WIDTH, allocator_summary, breakdown_summary,
               capability, celsius, driver_versions, fold, fold_items, labelled_row, mig_instance_summary, number,
               pcie_link, power, process_name, ratio, seen_as, size, this_process, torch_summary, unrecorded_rows,
               words)

LABEL = 11  # a GPU row's label column ("  memory      "): its values start at column 14


def _row(label: str, value: str) -> str:
    return labelled_row(label, value, LABEL)


def _process(status, process) -> str:
    """A process row, its command line cut to what the row leaves of the terminal's width."""
    start, mine = f"  process     {process.pid:>7}  {size(process.used_memory):>10}  ", this_process(status, process)
    return f"{start}{process_name(process.name, WIDTH - len(start) - len(mine))}{mine}"


def _gpu_lines(status, gpu) -> List[str]:
    title = f"GPU {gpu.index}  "
    if gpu.error:
        return [fold(f"{title}{gpu.name}: {gpu.error}", len(title))]
    memory = f"{size(gpu.memory_used)} used / {size(gpu.memory_total)}, {size(gpu.memory_free)} free, " \
             f"{size(gpu.memory_reserved)} reserved by the driver"
    rows = [
        ("", fold_items(f"{title}{gpu.name}  ({seen_as(status, gpu, short=True)}, {capability(gpu)})", len(title))),
        ("memory", _row("memory", memory)),
        ("busy", _row("busy", f"{number(gpu.utilization_gpu, '%')} compute, "
                              f"{number(gpu.utilization_memory, '%')} memory bus")),
        ("power", f"  power       {power(gpu.power_draw, gpu.power_limit)}"
                  f"   temperature {celsius(gpu.temperature)}   state {gpu.performance_state or NA}"),
        ("clocks", _row("clocks", f"SM {ratio(gpu.sm_clock, gpu.sm_clock_max, 'MHz')}, memory "
                                  f"{ratio(gpu.memory_clock, gpu.memory_clock_max, 'MHz')}; slowed by: "
                                  f"{words(gpu.clock_event_reasons)}")),
        ("PCIe", f"  PCIe        {pcie_link(gpu)}   bus {gpu.bus_id or NA}"),
        ("uuid", f"  uuid        {gpu.uuid or NA}"),
        ("processes", f"  processes   {NA if gpu.processes is None else 'none visible'}"
         if not gpu.processes else None),
    ]
    rows += [("processes", _process(status, process)) for process in gpu.processes or ()]
    left_out = unrecorded_rows(status.snapshot, gpu)
    lines = [line for row, line in rows if line is not None and row not in left_out]
    lines += [_row(f"MIG {mig.index}", mig_instance_summary(status, gpu, mig)) for mig in gpu.mig_instances or ()]
    memory, part = status.torch_memory_of(gpu.index), status.breakdown_of(gpu.index)
    if memory:
        lines.append(_row("torch", allocator_summary(memory)))
    if part:
        lines.append(_row("where", breakdown_summary(part)))
    return lines


def render_status(status) -> str:
    runtime, snapshot = status.runtime, status.snapshot
    lines = [f"{runtime.platform_name} - {torch_summary(runtime.torch)}"]
    if snapshot.source != "NVML":
        lines.append(fold(f"Source: {snapshot.source}", len("Source: ")))
    versions = driver_versions(snapshot)
    if versions:
        lines.append(versions)
    if runtime.cuda_visible_devices is not None and not snapshot.recorded:
        lines.append(f"CUDA_VISIBLE_DEVICES={runtime.cuda_visible_devices!r}")
    if status.cuda_numbering_asked:
        lines.append(DRIVER_NUMBERING_NOTE)
    if snapshot.problem:
        lines.append(fold(f"No GPU read: {snapshot.problem}", len("No GPU read: ")))
    elif not snapshot.gpus:
        lines.append("No GPU found.")
    if not status.cuda_numbering_known:  # once, not in every GPU's title
        lines.append(FASTEST_FIRST_NOTE)
    for gpu in snapshot.gpus:
        lines.extend(_gpu_lines(status, gpu))
    for memory in status.torch_memory_without_gpu:
        lines.append(fold_items(f"torch cuda:{memory.torch_index}  {allocator_summary(memory)}", 2))
    for advice in status.advice:
        lines.append(fold(f"{advice.level}: {advice.message}", len(advice.level) + 2))  # under the message
    return "\n".join(lines)
