"""The HTML card shown in notebooks.

Colours come from the front end's own theme variables (JupyterLab's ``--jp-*``, VS Code's
``--vscode-*``) with light fallbacks and a ``prefers-color-scheme: dark`` override, so the
card is readable in light and dark themes alike. Everything shown is escaped.
"""
from __future__ import annotations

from html import escape
from typing import List

from . import NA, allocator_summary, breakdown_summary, number, ratio, size, torch_summary, words

STYLE = """
<style>
.cgpu-card{--cgpu-fg:var(--jp-ui-font-color0,var(--vscode-editor-foreground,#1f2328));
 --cgpu-muted:var(--jp-ui-font-color2,#57606a);--cgpu-bg:var(--jp-layout-color1,transparent);
 --cgpu-line:var(--jp-border-color2,#d0d7de);--cgpu-bar:#2da44e;--cgpu-bar-bg:rgba(127,127,127,.2);
 --cgpu-warn:#9a6700;--cgpu-tip:#0969da;
 font-family:var(--jp-ui-font-family,system-ui,sans-serif);font-size:13px;color:var(--cgpu-fg);
 background:var(--cgpu-bg);border:1px solid var(--cgpu-line);border-radius:6px;padding:8px 12px;max-width:60em}
@media (prefers-color-scheme: dark){.cgpu-card{--cgpu-fg:var(--jp-ui-font-color0,#e6edf3);
 --cgpu-muted:var(--jp-ui-font-color2,#9198a1);--cgpu-line:var(--jp-border-color2,#3d444d);
 --cgpu-warn:#d29922;--cgpu-tip:#4493f8}}
body[data-jp-theme-light="false"] .cgpu-card,body.vscode-dark .cgpu-card{--cgpu-warn:#d29922;--cgpu-tip:#4493f8}
.cgpu-card h4{margin:4px 0;font-size:14px}.cgpu-card .cgpu-muted{color:var(--cgpu-muted)}
.cgpu-card table{border-collapse:collapse;margin:4px 0}
.cgpu-card td{padding:1px 10px 1px 0;vertical-align:top;color:var(--cgpu-fg);background:transparent;text-align:left}
.cgpu-card .cgpu-bar{display:inline-block;width:10em;height:.8em;background:var(--cgpu-bar-bg);border-radius:3px;vertical-align:middle}
.cgpu-card .cgpu-bar>span{display:block;height:100%;background:var(--cgpu-bar);border-radius:3px}
.cgpu-card li.warning{color:var(--cgpu-warn)}.cgpu-card li.tip{color:var(--cgpu-tip)}
</style>
"""


def _bar(fraction) -> str:
    if fraction is None:
        return ""
    percent = max(0.0, min(1.0, fraction)) * 100
    return f'<span class="cgpu-bar" title="{percent:.0f}%"><span style="width:{percent:.0f}%"></span></span> '


def _rows(rows) -> str:
    return "<table>" + "".join(
        f"<tr><td class='cgpu-muted'>{escape(label)}</td><td>{value}</td></tr>" for label, value in rows
    ) + "</table>"


def _gpu(gpu, torch_index) -> str:
    title = f"GPU {gpu.index} &middot; {escape(gpu.name)}"
    if gpu.error:
        return f"<h4>{title}</h4><p>{escape(gpu.error)}</p>"
    seen_as = f"cuda:{torch_index}" if torch_index is not None else "hidden from torch"
    cc = ".".join(map(str, gpu.compute_capability)) if gpu.compute_capability else NA
    busy = None if gpu.utilization_gpu is None else gpu.utilization_gpu / 100
    processes = NA if gpu.processes is None else (
        "<br>".join(f"{p.pid} {escape(p.name or NA)} &middot; {size(p.used_memory)}" for p in gpu.processes)
        or "none visible")
    rows = [
        ("memory", _bar(gpu.memory_used_fraction) + escape(
            f"{size(gpu.memory_used)} used of {size(gpu.memory_total)} ({size(gpu.memory_free)} free, "
            f"{size(gpu.memory_reserved)} reserved by the driver)")),
        ("busy", _bar(busy) + escape(f"{number(gpu.utilization_gpu, '%')} compute, "
                                     f"{number(gpu.utilization_memory, '%')} memory bus")),
        ("power", escape(f"{number(gpu.power_draw, ' W', 1)} of {number(gpu.power_limit, ' W')}, "
                         f"{number(gpu.temperature, ' °C')}, {gpu.performance_state or NA}")),
        ("clocks", escape(f"SM {ratio(gpu.sm_clock, gpu.sm_clock_max, 'MHz')}, memory "
                          f"{ratio(gpu.memory_clock, gpu.memory_clock_max, 'MHz')}; slowed by "
                          f"{words(gpu.clock_event_reasons)}")),
        ("PCIe", escape(f"gen {number(gpu.pcie_generation)} of {number(gpu.pcie_generation_max)}, "
                        f"x{number(gpu.pcie_width)} of x{number(gpu.pcie_width_max)}; bus {gpu.bus_id or NA}")),
        ("processes", processes),
    ]
    return (f"<h4>{title} <span class='cgpu-muted'>{escape(seen_as)}, compute capability {cc}</span></h4>"
            + _rows(rows))


def render_status(status) -> str:
    runtime, snapshot = status.runtime, status.snapshot
    torch_text = torch_summary(runtime.torch)
    parts: List[str] = [STYLE, '<div class="cgpu-card">',
                        f"<div><b>{escape(runtime.platform_name)}</b> "
                        f"<span class='cgpu-muted'>&middot; {escape(torch_text)}"]
    if snapshot.driver_version:
        parts.append(escape(f" · driver {snapshot.driver_version}, CUDA {snapshot.cuda_driver_version or NA}"))
    if snapshot.source != "NVML":
        parts.append(escape(f" · {snapshot.source}"))
    parts.append("</span></div>")
    if snapshot.problem:
        parts.append(f"<p>No GPU read: {escape(snapshot.problem)}</p>")
    elif not snapshot.gpus:
        parts.append("<p>No GPU found.</p>")
    for gpu in snapshot.gpus:
        parts.append(_gpu(gpu, status.torch_index_of.get(gpu.index)))
    parts += [_rows([(f"torch cuda:{memory.torch_index}", escape(allocator_summary(memory)))])
              for memory in status.torch_memory]
    parts += [_rows([(f"GPU {part.nvml_index} memory", escape(breakdown_summary(part)))])
              for part in status.breakdown]
    if status.advice:
        parts.append("<ul>" + "".join(
            f"<li class='{advice.level}'>{escape(advice.message)}</li>" for advice in status.advice) + "</ul>")
    parts.append("</div>")
    return "".join(parts)
