"""Plain-text rendering, for terminals and for the text/plain part of notebook output."""
from __future__ import annotations

from typing import List

from . import (DRIVER_NUMBERING_NOTE, NA, allocator_summary, breakdown_summary, capability, celsius, fold,
               mig_instance_summary, number, pcie_link, power, process_name, ratio, seen_as, size, this_process,
               torch_summary, unrecorded_rows, words)


def _gpu_lines(status, gpu) -> List[str]:
    if gpu.error:
        return [f"GPU {gpu.index}  {gpu.name}: {gpu.error}"]
    rows = [
        ("", f"GPU {gpu.index}  {gpu.name}  ({seen_as(status, gpu)}, {capability(gpu)})"),
        ("memory", f"  memory      {size(gpu.memory_used)} used / {size(gpu.memory_total)}"
                   f"  ({size(gpu.memory_free)} free, {size(gpu.memory_reserved)} reserved by the driver)"),
        ("busy", f"  busy        {number(gpu.utilization_gpu, '%')} compute, "
                 f"{number(gpu.utilization_memory, '%')} memory bus"),
        ("power", f"  power       {power(gpu.power_draw, gpu.power_limit)}"
                  f"   temperature {celsius(gpu.temperature)}   state {gpu.performance_state or NA}"),
        ("clocks", f"  clocks      SM {ratio(gpu.sm_clock, gpu.sm_clock_max, 'MHz')}, memory "
                   f"{ratio(gpu.memory_clock, gpu.memory_clock_max, 'MHz')}; slowed by: "
                   f"{words(gpu.clock_event_reasons)}"),
        ("PCIe", f"  PCIe        {pcie_link(gpu)}   bus {gpu.bus_id or NA}   uuid {gpu.uuid or NA}"),
        ("processes", f"  processes   {NA if gpu.processes is None else 'none visible'}"
         if not gpu.processes else None),
    ]
    rows += [("processes", f"  process     {process.pid:>7}  {size(process.used_memory):>10}  "
                           f"{process_name(process.name)}{this_process(status, process)}")
             for process in gpu.processes or ()]
    left_out = unrecorded_rows(status.snapshot, gpu)
    lines = [line for row, line in rows if line is not None and row not in left_out]
    lines += [f"  MIG {mig.index:<8}{mig_instance_summary(status, gpu, mig)}" for mig in gpu.mig_instances or ()]
    memory, part = status.torch_memory_of(gpu.index), status.breakdown_of(gpu.index)
    if memory:
        lines.append(f"  torch       {allocator_summary(memory)}")
    if part:
        lines.append(f"  where       {breakdown_summary(part)}")
    return lines


def render_status(status) -> str:
    runtime, snapshot = status.runtime, status.snapshot
    lines = [f"{runtime.platform_name} - {torch_summary(runtime.torch)}"]
    if snapshot.source != "NVML":
        lines.append(f"Source: {snapshot.source}")
    if snapshot.driver_version or snapshot.cuda_driver_version:
        lines.append(f"Driver {snapshot.driver_version or NA}, CUDA driver {snapshot.cuda_driver_version or NA}")
    if runtime.cuda_visible_devices is not None and not snapshot.recorded:
        lines.append(f"CUDA_VISIBLE_DEVICES={runtime.cuda_visible_devices!r}")
    if status.cuda_numbering_asked:
        lines.append(DRIVER_NUMBERING_NOTE)
    if snapshot.problem:
        lines.append(f"No GPU read: {snapshot.problem}")
    elif not snapshot.gpus:
        lines.append("No GPU found.")
    for gpu in snapshot.gpus:
        lines.extend(_gpu_lines(status, gpu))
    for memory in status.torch_memory_without_gpu:
        lines.append(f"torch cuda:{memory.torch_index}  {allocator_summary(memory)}")
    for advice in status.advice:
        lines.append(fold(f"{advice.level}: {advice.message}", len(advice.level) + 2))  # under the message
    return "\n".join(lines)
