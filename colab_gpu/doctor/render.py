"""The out-of-memory card: text for a terminal (80 columns), theme-neutral HTML for notebooks,
in the look of the %gpu_status card (its STYLE, rows and folding), and a one-line summary."""
from __future__ import annotations

import re
from html import escape
from typing import List, Optional, Tuple

from ..render import count, fold, labelled_row, size
from ..render.html import STYLE, rows_table, unbroken_units
from .report import THIS_KERNEL, OomReport

__all__ = ["report_line", "report_text", "report_html", "title", "origin", "rows"]

LABEL = 10  # the rows' label column: "  variables  "
_SHORT = {"request_too_large": "request too large", "other_process": "other processes",
          "kept_by_ipython": "kept by IPython", "autograd_graph": "autograd graph",
          "fragmentation": "fragmentation", "mixed_precision": "float32 training", "eval_graph": "graph in evaluation",
          "library": "library", "outside_torch": "memory outside torch", "tensors_fill": "tensors fill the device"}


def title(report: OomReport) -> str:
    where = report.device or "the device"
    if report.device_name:
        where += f" ({report.device_name})"
    asked = (f"the failing call asked for {size(report.requested_bytes)}" if report.requested_bytes is not None
             else f"{report.kind} could not allocate")
    return f"Out of memory on {where}: {asked}"


def origin(report: OomReport) -> Optional[str]:
    """Where the numbers come from, unless measured here: "pasted message, PyTorch 2.1"."""
    if report.source == THIS_KERNEL:
        return None
    return report.source + (f", {report.wording}" if report.wording else "")


def _known(*parts: Tuple[str, Optional[int]]) -> str:
    return ", ".join(f"{size(value)} {label}" for label, value in parts if value is not None)


def _others(report: OomReport) -> Optional[str]:
    if report.other_processes_bytes is None and not report.processes:
        return None
    named = ", ".join(f"{p.pid}{' ' + p.name if p.name else ''} {size(p.nbytes)}" for p in report.processes[:3])
    more = f" and {len(report.processes) - 3} more" if len(report.processes) > 3 else ""
    held = count(len(report.processes), "process") if report.processes else "processes"
    return f"{held} {size(report.other_processes_bytes)}" + (f": {named}{more}" if named else "")


def rows(report: OomReport) -> List[Tuple[str, str]]:
    """(label, text) rows, the same in the text and the HTML card; rows without a number left out."""
    found = [
        ("from", origin(report) or ""),
        ("device", _known(("capacity", report.capacity_bytes), ("allowed", report.allowed_bytes),
                          ("in use by this process", report.in_use_bytes), ("free", report.free_bytes))),
        ("torch", _known(("allocated", report.allocated_bytes), ("reserved", report.reserved_bytes),
                         ("reserved but unallocated", report.reserved_unallocated_bytes))),
        ("outside", _known(("this process outside torch (CUDA context, libraries)", report.non_torch_bytes))),
        ("others", _others(report) or ""),
        ("kept", ", ".join(f"{place.name} {size(place.nbytes)}" for place in report.kept)
         + (" - held by no variable" if report.kept else "")),
        ("variables", ", ".join(f"{place.name} {size(place.nbytes)}" for place in report.variables)),
    ]
    if report.source != THIS_KERNEL:
        found.append(("message", report.error))
    return [(label, text) for label, text in found if text]


def _gives_back(cause) -> str:
    if cause.decisive:
        return "nothing else can make room"
    return f"gives back {size(cause.frees)}" if cause.frees is not None else "gives back an unmeasured amount"


def report_line(report: OomReport) -> str:
    asked = f", asked {size(report.requested_bytes)}" if report.requested_bytes is not None else ""
    causes = "; ".join(f"{_SHORT.get(cause.kind, cause.kind)}" + (f" {size(cause.frees)}" if cause.frees else "")
                       for cause in report.causes) or "no cause found"
    return f"out of memory on {report.device or report.kind}{asked}: {causes}"


def report_text(report: OomReport) -> str:
    lines = [fold(title(report), 2)]
    lines += [labelled_row(label, text, LABEL) for label, text in rows(report)]
    if report.causes:
        lines.append("Causes, the fix that gives back most first:")
    for number, cause in enumerate(report.causes, 1):
        lines.append(fold(f"  {number}. {cause.finding} [{_gives_back(cause)}]", 5))
        lines.append(fold(f"     fix: {cause.fix}", 10))
        if cause.why:
            lines.append(fold(f"     {cause.why}", 5))
    lines += [fold(f"Note: {note}", 6) for note in report.notes]
    return "\n".join(lines)


def _code(text: str) -> str:
    """Escaped, each `command` set as code: the part to copy."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", escape(text))


def report_html(report: OomReport) -> str:
    parts = [STYLE, '<div class="cgpu-card cgpu-oom">', f"<div><b>{escape(title(report))}</b></div>",
             rows_table([(label, escape(text)) for label, text in rows(report)])]
    if report.causes:
        parts.append("<h4>Causes, the fix that gives back most first</h4><ul>")
        for cause in report.causes:
            why = f"<br><span class='cgpu-muted'>{escape(cause.why)}</span>" if cause.why else ""
            parts.append(f"<li class='{'warning' if cause.decisive else 'tip'}'>{_code(cause.finding)} "
                         f"<span class='cgpu-muted'>[{escape(_gives_back(cause))}]</span><br>"
                         f"<b>fix</b> {_code(cause.fix)}{why}</li>")
        parts.append("</ul>")
    parts += [f"<p class='cgpu-muted'>{_code(note)}</p>" for note in report.notes]
    parts.append("</div>")
    return unbroken_units("".join(parts))
