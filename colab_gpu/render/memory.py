"""Text and HTML for clear_cache's report and the memory-holder ranking."""
from __future__ import annotations

from html import escape
from typing import List, Optional, Tuple

from ..spelling import command
from . import NA, NOT_TOLD_APART, count, fold, fold_items, labelled_row, size
from .html import STYLE, rows_table, unbroken_units

# Reading field -> what the user calls it, per device kind.
_FIELDS = (("allocated", "allocated"), ("reserved", "reserved"), ("nvml_used", "NVML used"))
TOP = 10  # holders listed; the rest are summed


def _label(device: str, field: str, name: str) -> str:
    return "tensors" if device == "cpu" and field == "allocated" else name


def _changes(report, before, after) -> List[Tuple[str, int]]:
    """("cpu tensors", bytes freed) for every device and field that changed; negative: grew."""
    changes = []
    for reading in after:
        for field, name in _FIELDS:
            freed = report.freed(reading.device, field, before, after)
            if freed:
                changes.append((f"{reading.device} {_label(reading.device, field, name)}", freed))
    return changes


def _changed(what: str, freed: int) -> str:
    return f"{what} {'freed' if freed > 0 else 'grew by'} {size(abs(freed))}"


def _device_lines(report) -> List[Tuple[str, str]]:
    """Per device: each field before -> after (freed)."""
    rows = []
    for reading in report.after:
        parts = []
        for field, name in _FIELDS:
            end = getattr(reading, field)
            start = next((getattr(r, field) for r in report.before if r.device == reading.device), None)
            if start is None and end is None:
                continue
            freed = report.freed(reading.device, field)
            tail = f" (freed {size(freed)})" if freed and freed > 0 else ""
            parts.append(f"{_label(reading.device, field, name)} {size(start)} -> {size(end)}{tail}")
        rows.append((reading.device, "; ".join(parts) or NA))
    return rows


def _step_rows(report) -> List[Tuple[str, str]]:
    rows, before = [], report.before
    for number, step in enumerate(report.steps, 1):
        changes = [_changed(what, freed) for what, freed in _changes(report, before, step.after)]
        freed = f"  [{', '.join(changes)}]" if changes else ""
        rows.append((f"{number}. {step.name}", f"{step.done}{freed}"))
        before = step.after
    return rows


def _holder_line(holder) -> str:
    devices = f" ({_devices(holder.by_device)})" if holder.by_device else ""  # meta tensors: on no device
    shared = ("" if holder.unique == holder.nbytes else "; all shared with other variables"
              if not holder.unique else f"; {size(holder.unique)} held by it alone")
    bound = " (at least: too large to walk fully)" if holder.truncated else ""
    held = [count(holder.tensors, "tensor")] if holder.tensors or not holder.arrays else []
    held += [count(holder.arrays, "NumPy array")] if holder.arrays else []
    return (f"{size(holder.nbytes)}{bound} in {' and '.join(held)}{devices}{shared}"
            f" - {holder.type_name}")


def _outside_rows(holders) -> List[Tuple[str, str]]:
    return [_outside_line(part, holders.torch_labels.get(part.nvml_index)) for part in holders.outside_torch]


def _outside_line(part, torch_label: Optional[str]) -> Tuple[str, str]:
    """NVML's GPU N, with the cuda:N torch and the lines above call it (Kaggle's GPU 1 under
    CUDA_VISIBLE_DEVICES=1 is cuda:0)."""
    if part.other_processes is not None:
        outside = (f"other processes {size(part.other_processes)}; this process "
                   f"{size(part.context_and_non_torch)} (CUDA context and other libraries)")
    else:
        outside = f"other processes and this one {size(part.context_and_non_torch)} ({NOT_TOLD_APART})"
    return (f"GPU {part.nvml_index}" + (f" ({torch_label})" if torch_label else ""),
            f"{outside}; torch cache {size(part.torch_cache)}")


def _holder_rows(holders) -> List[Tuple[str, str]]:
    rows = [(holder.name, _holder_line(holder)) for holder in holders.holders[:TOP]]
    rows += _more(holders.holders[TOP:])
    if holders.total_by_device:
        rows.append(("all variables", f"{_devices(holders.total_by_device)} (each storage counted once)"))
    return rows


def _devices(by_device) -> str:
    return ", ".join(f"{device} {size(n)}" for device, n in by_device)


def _more(rest) -> List[Tuple[str, str]]:
    """The row for those past the TOP shown: not their sum, as storage they share would count
    once for each."""
    return [(f"{len(rest)} more", f"each {size(rest[0].nbytes)} or less")] if rest else []


def _elsewhere_rows(holders) -> List[Tuple[str, str]]:
    """The outputs and the last error by what they hold that no variable does, then the rest."""
    rows, clear = [], command("%clear_cache", "colab_gpu.clear_cache()")
    for place in holders.elsewhere[:TOP]:
        bound = " (at least)" if place.truncated else ""
        hint = (f" - {clear} clears it" if place.name.startswith("Out[") else
                f" - its traceback's frames; {clear} drops it" if place.name == "the last error"
                else "")
        # clearing it frees its own tensors only: those a variable holds too are said apart
        shared = f" (and {count(place.shared, 'tensor')} whose memory a variable holds)" if place.shared else ""
        rows.append((place.name, f"{_devices(place.by_device)}{bound} in "
                                 f"{count(place.tensors, 'tensor')}{shared}{hint}"))
    rows += _more(holders.elsewhere[TOP:])
    if holders.unreached:
        unwalked = any(h.truncated for h in holders.holders + holders.elsewhere)
        held = ("a library's cache, a thread, a reference cycle or a variable too large to walk "
                "fully" if unwalked else "a library's cache, a thread or a reference cycle")
        rows.append(("the rest", f"{_rest(holders)} that no variable, output or error reaches; "
                                 f"held by {held}"))
    return rows


def _rest(holders) -> str:
    """"cpu 12.0 MiB, at least cuda:0 3.00 GiB": on a GPU what the allocator's rounding could
    explain is left out, a lower bound; the CPU's figure is exact."""
    return ", ".join(f"{'' if device == 'cpu' else 'at least '}{device} {size(n)}"
                     for device, n in holders.unreached)


def _elsewhere_title(holders) -> str:
    return f"Held by none of your variables: {_devices(holders.not_yours)}"


def _holders_note(holders) -> Optional[str]:
    if not holders.torch_imported:
        return "torch is not imported: no tensor is held."
    if not holders.holders:
        return "No variable of yours holds a tensor."
    return None


def _gpu_note(holders) -> Optional[str]:
    return f"GPUs not read: {holders.problem}" if holders.problem else None


def holders_line(holders) -> str:
    note = _holders_note(holders)
    if note:
        return (f"No variable of yours holds a tensor; held elsewhere: {_elsewhere_line(holders)}"
                if holders.not_yours else note)
    top = ", ".join(f"{h.name} {size(h.nbytes)}" for h in holders.holders[:3])
    elsewhere = f"; held by no variable: {_elsewhere_line(holders)}" if holders.not_yours else ""
    if len(holders.holders) == 1:
        return f"1 variable holds tensors: {top}{elsewhere}"
    return f"{len(holders.holders)} variables hold tensors; the most: {top}{elsewhere}"


def _elsewhere_line(holders) -> str:
    """"cpu 11.4 MiB (Out[1] 7.63 MiB, the rest cpu 3.81 MiB)": the two biggest, the rest."""
    places = [f"{place.name} {size(place.nbytes)}" for place in holders.elsewhere[:2]]
    places += [f"the rest {_rest(holders)}"] if holders.unreached else []
    return f"{_devices(holders.not_yours)} ({', '.join(places)})"


def _text_rows(rows, label_width: int = 16) -> List[str]:
    return [labelled_row(name, text, label_width) for name, text in rows]


def holders_text(holders) -> str:
    lines = ["Who holds memory (your variables, by the tensor bytes they reach):"]
    note = _holders_note(holders)
    lines += [f"  {note}"] if note else _text_rows(_holder_rows(holders))
    if holders.not_yours:
        lines.append(_elsewhere_title(holders))
        lines += _text_rows(_elsewhere_rows(holders))
    if holders.outside_torch:
        lines.append("Outside torch:")
        lines += _text_rows(_outside_rows(holders))
    gpu_note = _gpu_note(holders)
    if gpu_note:
        lines.append(fold(gpu_note, len("GPUs not read: ")))
    return "\n".join(lines)


def report_line(report) -> str:
    amounts = [f"{what} {size(n)}" for what, n in _changes(report, report.before, report.after) if n > 0]
    freed = "freed " + ", ".join(amounts) if amounts else "nothing freed"
    top = report.holders.holders[0] if report.holders.holders else None
    held = f"; biggest holder: {top.name} {size(top.nbytes)}" if top and top.nbytes else ""
    deleted = f"; deleted {', '.join(report.deleted)}" if report.deleted else ""
    deleted += "".join(f"; NumPy array {name} keeps {size(n)} of that (the deleted tensors lay "
                       f"on its memory)" for name, n in report.kept_by_arrays)
    failed = "".join(f"; {step.name} step failed: {step.error}" for step in report.steps if step.error)
    # what no variable holds is what clearing could not free: the line must not hide it
    elsewhere = f"; held by no variable: {_elsewhere_line(report.holders)}" if report.holders.not_yours else ""
    return f"clear_cache: {freed}{deleted}{failed}{held}{elsewhere}"


def report_text(report) -> str:
    lines = [fold_items(report_line(report), len("clear_cache: "))]
    lines += _text_rows(_device_lines(report))
    lines.append("Steps:")
    lines += _text_rows(_step_rows(report), 22)
    if not report.cuda_initialized:
        lines.append("  CUDA is not initialized: torch's CUDA cache was left alone.")
    lines.append(holders_text(report.holders))
    return "\n".join(lines)


def _html_rows(rows) -> str:
    return rows_table([(name, escape(text)) for name, text in rows])


def _holders_body(holders) -> str:
    note = _holders_note(holders)
    parts = ["<h4>Who holds memory</h4>",
             f"<p>{escape(note)}</p>" if note else _html_rows(_holder_rows(holders))]
    if holders.not_yours:
        parts += [f"<h4>{escape(_elsewhere_title(holders))}</h4>", _html_rows(_elsewhere_rows(holders))]
    if holders.outside_torch:
        parts += ["<h4>Outside torch</h4>", _html_rows(_outside_rows(holders))]
    gpu_note = _gpu_note(holders)
    if gpu_note:
        parts.append(f"<p class='cgpu-muted'>{escape(gpu_note)}</p>")
    return "".join(parts)


def holders_html(holders) -> str:
    return unbroken_units(f'{STYLE}<div class="cgpu-card">{_holders_body(holders)}</div>')


def report_html(report) -> str:
    cuda = "" if report.cuda_initialized else (
        "<p class='cgpu-muted'>CUDA is not initialized: torch's CUDA cache was left alone.</p>")
    return unbroken_units(f'{STYLE}<div class="cgpu-card"><div><b>{escape(report_line(report))}</b></div>'
                          f"{_html_rows(_device_lines(report))}<h4>Steps</h4>{_html_rows(_step_rows(report))}"
                          f"{cuda}{_holders_body(report.holders)}</div>")
