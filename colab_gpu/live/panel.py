"""The live panel: a header, a bar row per GPU and a rolling SVG chart, as one HTML fragment.

The same fragment is the ipywidgets display (Jupyter, JupyterLab, VS Code) and the body of
the local live page (Colab), so both show the same thing. SVG keeps it light: no image
encoding per update, and the front end swaps it in without a flicker.
"""
from __future__ import annotations

import time
from html import escape
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from ..devices import used_fraction
from ..devices.replay import LABEL_PREFIX, ReplaySource, replay_label
from ..spelling import command
from ..render import FASTEST_FIRST_NOTE, celsius, count, number, seen_as, size
from ..render.html import STYLE, fraction_bar, unbroken_units
from .sampler import Sample

CHART_SECONDS = 300  # the rolling chart's time span; history() has every sample kept
PALETTE = ("#2da44e", "#0969da", "#cf222e", "#bf8700", "#8250df", "#1b7c83", "#e16f24", "#6e7781")
EXTRA_STYLE = """
<style>
.cgpu-live .cgpu-replay{color:var(--cgpu-warn);font-weight:600}
.cgpu-live svg{display:inline-block;margin:4px 16px 0 0;overflow:visible}
.cgpu-live svg text{fill:var(--cgpu-muted);font-size:10px}
.cgpu-live svg .cgpu-axis{stroke:var(--cgpu-line);fill:none}
.cgpu-live .cgpu-error{color:var(--cgpu-warn)}
.cgpu-live td{white-space:nowrap;overflow-wrap:normal}.cgpu-live td:first-child{white-space:normal}.cgpu-card.cgpu-live .cgpu-bar{width:6em}
.cgpu-card.cgpu-live{max-width:72em}
</style>
"""


def source_title(sampler) -> str:
    """The header's words for the sampler's source: a recording (``Snapshot.recorded``) never
    passes for the user's own GPU, whatever its label says."""
    if sampler.recorded:
        return (f"REPLAY of a recorded trace ({sampler.label.removeprefix(LABEL_PREFIX)}), "
                f"not this machine's GPU")
    return f"live from {sampler.label}"


def stop_command() -> str:
    """How the one told now stops the monitor: "%gpu_status --stop" in a magic, else
    "colab_gpu.live.stop()". Asked when a display is made, not when the monitor started: a
    script's monitor shown by %gpu_status --live told the notebook user the script's call."""
    return command("%gpu_status --stop", "colab_gpu.live.stop()")


def running_words(sampler, state: str, between: str = "; ", then: str = "") -> str:
    """"the live monitor <state> (<label>, every <interval> s)<between><stop_command()> ends
    it<then>": how each message about a running monitor names it and its end."""
    return (f"the live monitor {state} ({sampler.label}, every {sampler.interval:g} s){between}"
            f"{stop_command()} ends it{then}")


def display_text(sampler, stop: str, url: Optional[str] = None) -> str:
    """The live display's text/plain: all that a front end which cannot draw it shows (a
    notebook saved without its widget state on GitHub, a terminal IPython), never the object's
    own repr. ``stop``: :func:`stop_command` where the display was made (its text may be drawn
    in another thread, where as_magic() says nothing); ``url``: the live page's address, for a
    display that is that page."""
    where = f" at {url}, for a browser on this machine" if url else ""
    return f"Live GPU monitor ({sampler.label}){where}; {stop} leaves its summary and chart"


def torch_labels(sampler) -> Dict[int, str]:
    """NVML index -> how torch names that GPU, in the card's words ("cuda:0", "hidden from
    torch", "cuda:?" where :func:`numbering_note` says why)."""
    view = sampler.torch_view
    return {gpu.index: seen_as(view, gpu, short=True) for gpu in view.gpus} if view is not None else {}


def numbering_note(sampler) -> Optional[str]:
    """The card's reason for "cuda:?" (a box of different GPUs numbered fastest first), said once."""
    view = sampler.torch_view
    return FASTEST_FIRST_NOTE if view is not None and not view.cuda_numbering_known else None


def recording_note(sampler) -> Optional[str]:
    """How a recording that does not describe itself was read, as the card's source line says
    it ("no header: columns read from their units ...", "holds 1 of the machine's 4 GPUs ..."):
    the live views showed its numbers without the caveat."""
    view, source = sampler.torch_view, getattr(sampler, "source", None)
    if view is None or not isinstance(source, ReplaySource) or view.snapshot.source == replay_label(source.path):
        return None
    return f"Source: {view.snapshot.source}"


def state_words(sampler, now: float) -> str:
    """"sampling every 1 s, 42 samples over 41.0 s", or when and why it stopped: "stopped at
    12:03:04 by %gpu_status --stop, 42 samples over 41.0 s" (a lost GPU: "stopped by itself")."""
    end = sampler.stopped_at or now
    span = f"{count(sampler.count, 'sample')} over {end - (sampler.started_at or end):.1f} s"  # as the summary says it
    if sampler.running:
        return f"sampling every {sampler.interval:g} s, {span}"
    clock = time.strftime("%H:%M:%S", time.localtime(end))
    if sampler.error:
        return f"stopped by itself at {clock}, {span}"
    return f"stopped at {clock}{f' by {sampler.stop_reason}' if sampler.stop_reason else ''}, {span}"


COLUMNS = {"busy": ("utilization",), "memory used": ("memory_used", "memory_total"), "power": ("power",),
           "temperature": ("temperature",)}  # the table's columns, and the readings each shows


def unrecorded_columns(sampler) -> set:
    """The columns a recording has held nothing for over the whole run: left out, with their
    chart, as the card leaves out such a row (nanoGPT's log showed "n/a / n/a" memory beside
    an empty chart). From the live driver, n/a says a read failed, so they stay."""
    if not sampler.recorded:
        return set()
    totals = sampler.totals().values()
    return {column for column, fields in COLUMNS.items()
            if all(run.peaks[field] is None for run in totals for field in fields)}


def _gpu_row(index: int, name: str, label: Optional[str], reading, colour: str, shown: Sequence[str]) -> str:
    named = f"GPU&nbsp;{index} <span class='cgpu-muted'>{escape(name)}{f' &middot; {escape(label)}' if label else ''}</span>"
    if reading is None:
        return f"<tr><td>{named}</td><td colspan='{len(shown)}'>not in the latest sample</td></tr>"
    busy = None if reading.utilization is None else reading.utilization / 100
    used = used_fraction(reading.memory_used, reading.memory_total)
    cells = {"busy": f"{fraction_bar(busy)}<span class='cgpu-util'>{number(reading.utilization, '%')}</span>",
             "memory used": f"{fraction_bar(used)}{escape(size(reading.memory_used))} / "
                            f"{escape(size(reading.memory_total))}",
             "power": escape(number(reading.power, ' W', 1)),
             "temperature": escape(celsius(reading.temperature))}
    return (f"<tr><td><b style='color:{colour}'>&#9632;</b> {named}</td>"
            + "".join(f"<td>{cells[column]}</td>" for column in shown) + "</tr>")


def _polyline(points: List[str], colour: str, dashed: bool) -> str:
    dash = " stroke-dasharray='4 3'" if dashed else ""
    return (f"<polyline points='{' '.join(points)}' fill='none' stroke='{colour}' "
            f"stroke-width='1.5'{dash}/>")


def _y(percent: float, height: int, inset: float = 2.0) -> float:
    """The y of ``percent`` (clamped to 0-100), kept ``inset`` pixels inside the frame: a GPU
    busy 100 % (or idle at 0) is a line of its own, not hidden in the frame's border."""
    return inset + (100.0 - max(0.0, min(100.0, percent))) / 100 * (height - 2 * inset)


def min_max_per_column(x: Sequence[float], y: Sequence[float], columns: int,
                       span: Tuple[float, float]) -> Iterable[int]:
    """The positions of the points to draw of a line (``x`` ascending, within ``span``) on a
    chart ``columns`` pixels wide: at most two per pixel column, its lowest and highest, in
    the order they came (one where the column is flat), and the first and last. At that
    resolution the line looks the same, a one-sample spike or dip included; the rolling chart
    and the final one use it. numpy (matplotlib's) is imported only for a line that needs it."""
    if len(x) <= 2 * columns:
        return range(len(x))
    import numpy

    xs, ys = numpy.asarray(x, dtype=float), numpy.asarray(y, dtype=float)
    column = numpy.minimum(((xs - span[0]) / ((span[1] - span[0]) or 1.0) * columns).astype(int), columns - 1)
    order = numpy.lexsort((ys, column))  # by column, then value: each column's lowest first
    by_column = column[order]
    firsts = numpy.flatnonzero(numpy.r_[True, by_column[1:] != by_column[:-1]])
    lows, highs = order[firsts], order[numpy.r_[firsts[1:], len(order)] - 1]
    highs = highs[ys[highs] != ys[lows]]  # a flat column: its one point is enough
    kept = [lows, highs, [0, len(xs) - 1]]  # and the line starts and ends where the samples do
    return numpy.unique(numpy.concatenate(kept))  # sorted: time order


def chart_svg(samples: Sequence[Sample], title: str, value, width: int = 320,
              height: int = 110, seconds: float = CHART_SECONDS) -> str:
    """One 0-100 % panel: a line per GPU over the last ``seconds`` of ``samples``.

    ``value(reading)`` gives the percentage to draw, or None where there is none (the line
    joins the points either side). A line has at most two points per pixel column
    (:func:`min_max_per_column`): at ``--interval 0.1`` the window holds 3000 samples, and
    redrawing them all after every sample cost the sampler thread more time than the interval.
    """
    end = samples[-1].time if samples else time.time()
    start = max(samples[0].time, end - seconds) if samples else end
    span = max(end - start, 1.0)  # the axis grows until it spans ``seconds``
    lines: Dict[int, Tuple[List[float], List[float]]] = {}  # GPU index -> (x in pixels, percentages)
    for sample in samples:
        if sample.time < start:
            continue
        for reading in sample.gpus:
            percent = value(reading)
            if percent is not None:
                xs, ys = lines.setdefault(reading.index, ([], []))
                xs.append((sample.time - start) / span * width)
                ys.append(percent)
    body = "".join(
        _polyline([f"{xs[i]:.0f},{_y(ys[i], height):.1f}" for i in min_max_per_column(xs, ys, width, (0, width))],
                  PALETTE[index % len(PALETTE)], False)
        for index, (xs, ys) in sorted(lines.items()))
    if samples and not lines:  # NVML could not read it (a recording leaves the chart out): say so
        body = f"<text x='{width / 2:g}' y='{height / 2:g}' text-anchor='middle'>not reported</text>"
    return (
        f"<svg class='cgpu-chart' width='{width}' height='{height + 14}' "
        f"viewBox='0 -12 {width} {height + 26}' role='img' aria-label='{escape(title)}'>"
        f"<text x='0' y='-2'>{escape(title)}, last {f'{span / 60:.0f} min' if span >= 600 else f'{span:.0f} s'}</text>"
        f"<rect class='cgpu-axis' x='0' y='0' width='{width}' height='{height}'/>"
        f"<text x='{width + 3}' y='8'>100</text><text x='{width + 3}' y='{height}'>0</text>"
        f"{body}</svg>"
    )


def utilization(reading):
    return reading.utilization


def memory_percent(reading):
    used = used_fraction(reading.memory_used, reading.memory_total)
    return None if used is None else used * 100


def render_panel(sampler, now: Optional[float] = None) -> str:
    """The whole live display for ``sampler``'s current state, as an HTML fragment."""
    now = time.time() if now is None else now
    samples = sampler.samples()
    latest = {reading.index: reading for reading in samples[-1].gpus} if samples else {}
    label_class = "cgpu-replay" if sampler.recorded else ""
    parts = [STYLE, EXTRA_STYLE, "<div class='cgpu-card cgpu-live'>",
             f"<div><b class='{label_class}'>{escape(source_title(sampler))}</b> "
             f"<span class='cgpu-muted cgpu-state'>&middot; {escape(state_words(sampler, now))}</span></div>"]
    if sampler.error:
        parts.append(f"<p class='cgpu-error'>Stopped: {escape(sampler.error)}</p>")
    left_out = unrecorded_columns(sampler)
    shown = [column for column in COLUMNS if column not in left_out]
    parts.append("<table><tr class='cgpu-muted'><td></td>" + "".join(f"<td>{column}</td>" for column in shown)
                 + "</tr>")
    labels = torch_labels(sampler)
    for index in sorted(sampler.gpu_names):
        parts.append(_gpu_row(index, sampler.gpu_names[index], labels.get(index), latest.get(index),
                              PALETTE[index % len(PALETTE)], shown))
    parts.append("</table>")
    for note in (numbering_note(sampler), recording_note(sampler)):
        if note:
            parts.append(f"<div class='cgpu-muted'>{escape(note)}</div>")
    # Ten samples at least: at --interval 600 a 300 s window held one point, no line at all.
    seconds = max(CHART_SECONDS, 10 * sampler.interval)
    for column, title, value in (("busy", "busy %", utilization), ("memory used", "memory used %", memory_percent)):
        if column not in left_out:
            parts.append(chart_svg(samples, title, value, seconds=seconds))
    parts.append("</div>")
    return unbroken_units("".join(parts))
