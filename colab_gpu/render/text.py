"""Plain-text rendering, for terminals and for the text/plain part of notebook output.

Every line fits an 80-column terminal (WIDTH), which would otherwise break it mid-word: facts
are folded between items, prose between words, and a value that cannot be broken (a path, a
UUID, a configuration string) gets a line of its own.
"""
from __future__ import annotations

from typing import List

from . import (DRIVER_NUMBERING_NOTE, FASTEST_FIRST_NOTE, WIDTH, allocator_summary, capability, driver_versions, fold,
               fold_items, labelled_row, process_name, seen_as, size, this_process, torch_summary)
from .card import gpu_rows

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
    lines = [fold_items(f"{title}{gpu.name}  ({seen_as(status, gpu, short=True)}, {capability(gpu)})", len(title))]
    for label, value in gpu_rows(status, gpu):
        if value is None:  # the processes listed: a row each, in columns
            lines += [_process(status, process) for process in gpu.processes]
        else:
            lines.append(_row(label, value))
    return lines


def status_line(status) -> str:
    """"Colab; 0: Tesla T4; 1 advice; source NVML": the Status's one line (its repr)."""
    gpus = ", ".join(f"{gpu.index}: {gpu.name}" for gpu in status.gpus) or "no GPU"
    return f"{status.runtime.platform_name}; {gpus}; {len(status.advice)} advice; source {status.snapshot.source}"


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
