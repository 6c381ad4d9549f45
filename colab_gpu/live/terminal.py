"""The terminal display: a compact line per sample, in the foreground, until Ctrl-C."""
from __future__ import annotations

import shutil
import time
from typing import Callable, Dict, Optional

from ..render import NA, celsius, fold, number, size
from .panel import idle_gpus_hint, numbering_note, recording_note, torch_labels
from .sampler import Sample, Sampler


def _named(text: str, name: str) -> str:
    """The line has no column headers, so a value it cannot show says which one it is."""
    return f"{name} {NA}" if text == NA else text


def _memory(used, total) -> str:
    """"966 MiB/32.00 GiB"; a recording without the total says "966 MiB used", one without
    memory at all "memory n/a" (not "n/a/n/a")."""
    if used is None:
        return f"memory {NA}"
    if total is None:
        return f"{size(used)} used"
    return f"{size(used)}/{size(total)}"


def sample_line(sample: Sample, labels: Dict[int, str], replay: bool = False, width: int = 0) -> str:
    """"12:00:01  GPU0 cuda:0  19% 966 MiB/32.00 GiB 45.0 W 28 °C | GPU1 hidden from torch ...",
    marked when replayed; ``labels``: how torch names each GPU (panel.torch_labels).

    Wider than ``width`` (0: no limit), as on an 8-GPU server, the GPUs go on as many lines as
    they need, indented under the first: a terminal that wraps one long line mixes them up."""
    prefix = f"{time.strftime('%H:%M:%S', time.localtime(sample.time))}  {'REPLAY  ' if replay else ''}"
    parts = [f"GPU{r.index}{' ' + labels[r.index] if r.index in labels else ''} "
             f"{_named(number(r.utilization, '%'), 'busy'):>4} "
             f"{_memory(r.memory_used, r.memory_total)} {_named(number(r.power, ' W', 1), 'power')} "
             f"{_named(celsius(r.temperature), 'temperature')}" for r in sample.gpus]
    lines = [prefix + (parts[0] if parts else "")]
    for part in parts[1:]:
        if width and len(lines[-1]) + len(" | " + part) > width:
            lines.append(" " * len(prefix) + part)
        else:
            lines[-1] += " | " + part
    return "\n".join(lines)


def watch(sampler: Sampler, write: Callable[[str], None], max_lines: int = 0,
          width: Optional[int] = None) -> int:
    """Write a line per sample until the sampler ends or ``max_lines`` (0: no limit) were
    written; Ctrl-C (KeyboardInterrupt) reaches the caller. Returns the lines written.
    ``width``: the terminal's columns, read from it when not given."""
    replay, labels, note = sampler.recorded, torch_labels(sampler), numbering_note(sampler)
    width = shutil.get_terminal_size().columns if width is None else width
    for line in (note, recording_note(sampler)):
        if line:
            write(fold(line, len("Source: ")))
    seen = max(0, sampler.count - 1)  # start with the latest sample at once
    written, told = 0, False
    while True:
        sampler.wait(seen, timeout=max(1.0, 2 * sampler.interval))
        seen, new = sampler.samples_after(seen)
        for sample in new:
            write(sample_line(sample, labels, replay, width))
            written += 1
            if max_lines and written >= max_lines:
                return written
        if new:  # said once when it starts to hold, not under every line
            hint = idle_gpus_hint(sampler)
            if hint and not told:
                write(fold(hint, 2))
            told = hint is not None
        if not sampler.running:
            if sampler.error:
                write(f"stopped: {sampler.error}")
            return written
