"""The HTML card shown in notebooks.

Text inherits the front end's own colour and every other colour is a mid-tone or a
translucent grey, so the card reads the same in light and dark themes of JupyterLab, Notebook,
VS Code and Colab without knowing which is active. Everything shown is escaped.

Lines break at spaces, and inside a word only where nothing else fits (``overflow-wrap:
break-word``): ``anywhere`` also shrank what a table or a narrow front end may squeeze a block
of prose to, which broke "ever|y key" and "%gpu_s|tatus" where a space was free. A table
sizes a column by its longest word, so the value cells of a label/value table (an allocator
setting of 120 characters) keep ``anywhere``: beside their label, which keeps its width, they
take the card's remaining width, and break a word only when it is longer than that.

JupyterLab styles output tables with selectors such as
``:not(.jp-RenderedMarkdown).jp-RenderedHTMLCommon td`` (right-aligned) and
``.jp-RenderedHTMLCommon ul:not(.list-inline)`` (indented): a rule here that must win is at
least as specific (``td:not([hidden])``, ``ul:not(.list-inline)``) and comes later. Every
output's <style> applies to the whole page, so a feature's own rules name its card's class
too (``.cgpu-card.cgpu-live``): a later card's STYLE must not undo them.
"""
from __future__ import annotations

import re
from html import escape
from typing import List

from . import (DRIVER_NUMBERING_NOTE, NA, allocator_summary, capability, driver_versions, outside_torch_label,
               process_name, seen_as, size, torch_summary, this_process)
from .card import gpu_rows

STYLE = """
<style>
.cgpu-card{--cgpu-muted:#808080;--cgpu-warn:#c08a00;--cgpu-line:rgba(127,127,127,.5);
 color:inherit;background:transparent;font-family:var(--jp-ui-font-family,system-ui,sans-serif);
 font-size:13px;line-height:1.4;overflow-wrap:break-word;word-break:normal;border:1px solid rgba(127,127,127,.35);border-radius:6px;padding:8px 12px;max-width:60em}
.cgpu-card td.cgpu-label+td{overflow-wrap:anywhere}
.cgpu-card h4{margin:6px 0 2px;font-size:14px;color:inherit}.cgpu-card .cgpu-muted{opacity:.7}
.cgpu-card table{border-collapse:collapse;margin:2px 0}
.cgpu-card td,.cgpu-card th,.cgpu-card tr{padding:1px 10px 1px 0;vertical-align:top;color:inherit;background:transparent!important;
 border:none}
.cgpu-card td:not([hidden]),.cgpu-card th:not([hidden]){text-align:left}
.cgpu-card td.cgpu-label{white-space:nowrap}
.cgpu-card ul.cgpu-facts li{border-left:none;padding:0;margin:1px 0}
.cgpu-card img{max-width:100%;height:auto}
.cgpu-card .cgpu-bar{display:inline-block;width:10em;height:.8em;background:rgba(127,127,127,.25);
 border-radius:3px;vertical-align:middle}
.cgpu-card .cgpu-bar>span{display:block;height:100%;background:#2da44e;border-radius:3px}
.cgpu-card ul:not(.list-inline){padding-left:0;list-style:none;margin:6px 0 2px}
.cgpu-card li{border-left:4px solid rgba(127,127,127,.5);padding:1px 0 1px 8px;margin:3px 0}
.cgpu-card li.warning{border-left-color:#d4a72c}.cgpu-card li.tip{border-left-color:#4493f8}
.cgpu-card li b{font-weight:600}
</style>
"""


# A number and its unit as the render helpers write them: "388 MiB", "26.8 W", "40 °C", "0.5 s".
_NUMBER_AND_UNIT = re.compile(r"(\d) (?=(?:[KMGT]i)?B\b|%|W\b|°C|MHz\b|[mµ]?s\b)")


def unbroken_units(html: str) -> str:
    """``html`` with every number held to its unit by a no-break space: a 600 px notebook put
    "388" at the end of one line and "MiB" on the next. The text views keep plain spaces."""
    return _NUMBER_AND_UNIT.sub("\\1&nbsp;", html)


def fraction_bar(fraction) -> str:
    """A small bar filled to ``fraction`` (0 to 1), nothing when it is unknown."""
    if fraction is None:
        return ""
    percent = max(0.0, min(1.0, fraction)) * 100
    return f'<span class="cgpu-bar" title="{percent:.0f}%"><span style="width:{percent:.0f}%"></span></span> '


def rows_table(rows) -> str:
    """A two-column table of (label, value) pairs: the label is escaped, the value is HTML."""
    return "<table>" + "".join(
        f"<tr><td class='cgpu-muted cgpu-label'>{escape(label)}</td><td>{value}</td></tr>" for label, value in rows
    ) + "</table>"


def breakdown_bar(part) -> str:
    """One stacked bar of where the memory went, with a legend, largest consumers named."""
    pieces = [("other processes", part.other_processes or 0, "#8250df"),
              (outside_torch_label(part), part.context_and_non_torch, "#9a6700"),
              ("torch cache", part.torch_cache, "#4493f8"),
              ("torch tensors", part.torch_tensors, "#2da44e")]
    bar = "".join(f'<span title="{escape(label)}: {size(value)}" style="width:{100 * value / part.total:.1f}%;'
                  f'background:{colour};display:inline-block;height:100%"></span>'
                  for label, value, colour in pieces if value and part.total)
    legend = " &middot; ".join(f'<span style="color:{colour}">&#9632;</span> {escape(label)} {size(value)}'
                               for label, value, colour in pieces if value)
    return (f'<span class="cgpu-bar" style="display:inline-flex">{bar}</span> '
            f'{legend} &middot; free {size(part.free)}')


def _gpu(status, gpu) -> str:
    title = f"GPU {gpu.index} &middot; {escape(gpu.name)}"
    if gpu.error:
        return f"<h4>{title}</h4><p>{escape(gpu.error)}</p>"
    bars = {"memory": gpu.memory_used_fraction,
            "busy": None if gpu.utilization_gpu is None else gpu.utilization_gpu / 100,
            **{f"MIG {mig.index}": mig.memory_used_fraction for mig in gpu.mig_instances or ()}}

    def cell(label, value) -> str:
        if value is None:  # the processes listed, each whole command line on hover
            return "<br>".join(f"{p.pid} <span title='{escape(p.name or NA)}'>{escape(process_name(p.name))}</span> "
                               f"&middot; {size(p.used_memory)}{this_process(status, p)}" for p in gpu.processes)
        if label == "where":
            return breakdown_bar(status.breakdown_of(gpu.index))
        return fraction_bar(bars.get(label)) + escape(value)

    rows = [(label, cell(label, value)) for label, value in gpu_rows(status, gpu)]
    return (f"<h4>{title} <span class='cgpu-muted'>{escape(seen_as(status, gpu))}, "
            f"{capability(gpu)}</span></h4>" + rows_table(rows))


def render_status(status) -> str:
    runtime, snapshot = status.runtime, status.snapshot
    torch_text = torch_summary(runtime.torch)
    parts: List[str] = [STYLE, '<div class="cgpu-card">',
                        f"<div><b>{escape(runtime.platform_name)}</b> "
                        f"<span class='cgpu-muted'>&middot; {escape(torch_text)}"]
    versions = driver_versions(snapshot, driver="driver", cuda="CUDA")
    if versions:
        parts.append(escape(f" · {versions}"))
    if snapshot.source != "NVML":
        parts.append(escape(f" · {snapshot.source}"))
    if runtime.cuda_visible_devices is not None and not snapshot.recorded:  # this machine's, not the file's
        parts.append(escape(f" · CUDA_VISIBLE_DEVICES={runtime.cuda_visible_devices!r}"))
    if status.cuda_numbering_asked:
        parts.append(escape(f" · {DRIVER_NUMBERING_NOTE}"))
    parts.append("</span></div>")
    if snapshot.problem:
        parts.append(f"<p>No GPU read: {escape(snapshot.problem)}</p>")
    elif not snapshot.gpus:
        parts.append("<p>No GPU found.</p>")
    for gpu in snapshot.gpus:
        parts.append(_gpu(status, gpu))
    if status.torch_memory_without_gpu:
        parts.append(rows_table([(f"torch cuda:{memory.torch_index}", escape(allocator_summary(memory)))
                            for memory in status.torch_memory_without_gpu]))
    if status.advice:
        parts.append("<ul>" + "".join(
            f"<li class='{advice.level}'><b>{advice.level}</b> {escape(advice.message)}</li>" for advice in status.advice) + "</ul>")
    parts.append("</div>")
    return unbroken_units("".join(parts))
