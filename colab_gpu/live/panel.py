"""The live panel: a header, a bar row per GPU and a rolling SVG chart, as one HTML fragment.

The same fragment is the ipywidgets display (Jupyter, JupyterLab, VS Code) and the body of
the local live page (Colab), so both show the same thing. SVG keeps it light: no image
encoding per update, and the front end swaps it in without a flicker.
"""
from __future__ import annotations

import math
import time
from html import escape
from typing import Callable, Dict, Iterable, List, NamedTuple, Optional, Sequence, Tuple

from ..devices import used_fraction
from ..devices.replay import LABEL_PREFIX, ReplaySource, replay_label
from ..spelling import command
from ..render import FASTEST_FIRST_NOTE, NA, celsius, count, number, seen_as
from ..render.html import STYLE, fraction_bar, unbroken_units
from .sampler import GPUReading, Sample

CHART_SECONDS = 300  # the rolling chart's time span; history() has every sample kept
PALETTE = ("#2da44e", "#0969da", "#cf222e", "#bf8700", "#8250df", "#1b7c83", "#e16f24", "#6e7781")
GiB = 2 ** 30
# Read from the back of a classroom, in light and dark themes alike: text in the theme's own
# colour (currentColor), lines and frames a translucent grey, numbers in fixed-width boxes
# (tabular digits, right-aligned) so that no column moves as its values change width.
EXTRA_STYLE = """
<style>
.cgpu-card.cgpu-live{max-width:72em;font-size:14px;font-variant-numeric:tabular-nums}
.cgpu-live .cgpu-replay{color:var(--cgpu-warn);font-weight:600}
.cgpu-live .cgpu-num{display:inline-block;text-align:right;white-space:nowrap}
.cgpu-live svg{display:inline-block;margin:6px 12px 0 0;max-width:100%;height:auto;overflow:visible}
.cgpu-live svg text{fill:currentColor;font-size:13px;font-variant-numeric:tabular-nums}
.cgpu-live svg .cgpu-title{font-size:14px;font-weight:600}
.cgpu-live svg .cgpu-axis{stroke:currentColor;stroke-opacity:.55;fill:none}
.cgpu-live svg .cgpu-grid{stroke:currentColor;stroke-opacity:.18}
.cgpu-live .cgpu-error{color:var(--cgpu-warn)}
.cgpu-live td{white-space:nowrap;overflow-wrap:normal}.cgpu-live td:first-child{white-space:normal}.cgpu-card.cgpu-live .cgpu-bar{width:6em}
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


def _number_box(text: str, digits: int) -> str:
    """``text`` right-aligned in a box ``digits`` characters wide: "5%" and "100%" end at the
    same place, so a column no longer shifts as its values change width."""
    return f"<span class='cgpu-num' style='min-width:{digits}ch'>{escape(text)}</span>"


def _gib(value: Optional[int]) -> str:
    return NA if value is None else f"{value / GiB:.2f}"


def _memory_cell(used: Optional[int], total: Optional[int]) -> str:
    """"1.07 / 32.00 GiB" (in GiB, as the chart draws it), "1.07 GiB" without the total."""
    if used is None:
        return _number_box(NA, 5)
    return _number_box(_gib(used), 5) + (f" / {_gib(total)} GiB" if total is not None else " GiB")


def _gpu_row(index: int, name: str, label: Optional[str], reading, colour: str, shown: Sequence[str]) -> str:
    named = f"GPU&nbsp;{index} <span class='cgpu-muted'>{escape(name)}{f' &middot; {escape(label)}' if label else ''}</span>"
    if reading is None:
        return f"<tr><td>{named}</td><td colspan='{len(shown)}'>not in the latest sample</td></tr>"
    busy = None if reading.utilization is None else reading.utilization / 100
    used = used_fraction(reading.memory_used, reading.memory_total)
    cells = {"busy": fraction_bar(busy) + _number_box(number(reading.utilization, '%'), 4),
             "memory used": fraction_bar(used) + _memory_cell(reading.memory_used, reading.memory_total),
             "power": _number_box(number(reading.power, ' W', 1), 7),
             "temperature": _number_box(celsius(reading.temperature), 6)}
    return (f"<tr><td><b style='color:{colour}'>&#9632;</b> {named}</td>"
            + "".join(f"<td>{cells[column]}</td>" for column in shown) + "</tr>")


class ChartPanel(NamedTuple):
    """One chart, drawn alike live (SVG, :func:`chart_svg`) and after the stop (the PNG of
    live/render.py): the same title, unit, scale and colours, so the two read as one."""

    column: str  # the table column it belongs to: a recording that never held it leaves both out
    title: str
    value: Callable[[GPUReading], Optional[float]]  # in the title's unit; None where not reported
    top: Callable[[Sequence[GPUReading]], Optional[float]]  # a fixed scale's top, else None


def _busy(reading: GPUReading) -> Optional[float]:
    return reading.utilization


def _memory_used(reading: GPUReading) -> Optional[float]:
    return None if reading.memory_used is None else reading.memory_used / GiB


def _power(reading: GPUReading) -> Optional[float]:
    return reading.power


def _temperature(reading: GPUReading) -> Optional[float]:
    return reading.temperature


def _percent_scale(readings: Sequence[GPUReading]) -> float:
    return 100.0


def _largest_memory(readings: Sequence[GPUReading]) -> Optional[float]:
    """The largest GPU's memory, in GiB: a line at the top is a GPU full."""
    totals = [reading.memory_total for reading in readings if reading.memory_total]
    return max(totals) / GiB if totals else None


def _from_the_values(readings: Sequence[GPUReading]) -> None:
    return None


CHART_PANELS = (ChartPanel("busy", "busy (%)", _busy, _percent_scale),
                ChartPanel("memory used", "memory used (GiB)", _memory_used, _largest_memory),
                ChartPanel("power", "power (W)", _power, _from_the_values),
                ChartPanel("temperature", "temperature (°C)", _temperature, _from_the_values))


def chart_top(panel: ChartPanel, readings: Sequence[GPUReading]) -> float:
    """The top of ``panel``'s scale over ``readings``: its fixed one, else a tenth above the
    highest value (1 when there is none), so that the highest line is never on the frame."""
    top = panel.top(readings)
    if top is None:
        highest = max((value for value in map(panel.value, readings) if value is not None), default=0.0)
        top = highest * 1.1
    return top or 1.0


def time_unit(span: float) -> Tuple[float, str]:
    """(seconds per unit, its name) for a time axis reaching ``span`` seconds since the start:
    an hour-long run reads in minutes and a night's in hours, not as 30000 seconds."""
    if span <= 600:
        return 1.0, "seconds"
    if span <= 3 * 3600:
        return 60.0, "minutes"
    return 3600.0, "hours"


def _tick_step(span: float, most: int = 5) -> float:
    """The smallest of 1, 2, 5, 10, 20, 50 ... (and their tenths) that marks ``span`` with at
    most ``most`` ticks: 0, 50, 100 %; 0, 200, 400 W; 0, 5, 10 s."""
    raw = max(span, 1e-9) / (most - 1)
    scale = 10.0 ** math.floor(math.log10(raw))
    return next(step * scale for step in (1, 2, 5, 10) if step * scale >= raw)


# The rolling chart's geometry in pixels: the plot, and room for the title above, the
# values' labels on the left and the time axis below.
PLOT_WIDTH, PLOT_HEIGHT, LEFT, TITLE, BELOW = 256, 110, 40, 24, 40


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


def chart_svg(samples: Sequence[Sample], panel: ChartPanel, started: Optional[float] = None,
              seconds: float = CHART_SECONDS, width: int = PLOT_WIDTH, height: int = PLOT_HEIGHT) -> str:
    """One panel: a line per GPU over the last ``seconds`` of ``samples``, on a time axis of
    the time since ``started`` (the monitor's start; the first sample's when None).

    A line has at most two points per pixel column (:func:`min_max_per_column`): at
    ``--interval 0.1`` the window holds 3000 samples, and redrawing them all after every
    sample cost the sampler thread more time than the interval.
    """
    end = samples[-1].time if samples else time.time()
    start = max(samples[0].time, end - seconds) if samples else end
    origin = started if started is not None else (samples[0].time if samples else end)
    span = max(end - start, 1.0)  # the axis grows until it spans ``seconds``
    lines: Dict[int, Tuple[List[float], List[float]]] = {}  # GPU index -> (x in pixels, values)
    readings = [reading for sample in samples if sample.time >= start for reading in sample.gpus]
    for sample in samples:
        if sample.time < start:
            continue
        for reading in sample.gpus:
            value = panel.value(reading)
            if value is not None:
                xs, ys = lines.setdefault(reading.index, ([], []))
                xs.append((sample.time - start) / span * width)
                ys.append(value)
    top = chart_top(panel, readings)
    inset = 2.0  # a GPU busy 100 % (or idle at 0) is a line of its own, not hidden in the frame

    def y(value: float) -> float:
        return inset + (1.0 - max(0.0, min(top, value)) / top) * (height - 2 * inset)

    body = "".join(
        f"<polyline points='{' '.join(f'{xs[i]:.0f},{y(ys[i]):.1f}' for i in min_max_per_column(xs, ys, width, (0, width)))}' "
        f"fill='none' stroke='{PALETTE[index % len(PALETTE)]}' stroke-width='2'/>"
        for index, (xs, ys) in sorted(lines.items()))
    if samples and not lines:  # NVML could not read it (a recording leaves the chart out): say so
        body = f"<text x='{width / 2:g}' y='{height / 2:g}' text-anchor='middle'>not reported</text>"
    level = _tick_step(top)
    values = "".join(  # no scale for values that do not exist
        f"<line class='cgpu-grid' x1='0' x2='{width}' y1='{y(value):.1f}' y2='{y(value):.1f}'/>"
        f"<text x='-6' y='{y(value) + 4:.1f}' text-anchor='end'>{round(value, 6):g}</text>"
        for value in (k * level for k in range(math.floor(top / level + 1e-6) + 1) if lines))
    unit, unit_name = time_unit(start + span - origin)
    low, high = (start - origin) / unit, (start + span - origin) / unit  # the axis, in units since the start
    step = _tick_step(high - low)
    # A tick a hundredth of a step outside is drawn at the edge: 0 s is the first sample's time.
    ticks = [k * step for k in range(math.ceil(low / step - 0.01), math.floor(high / step + 0.01) + 1)]
    times = "".join(
        f"<line class='cgpu-axis' x1='{x:.1f}' x2='{x:.1f}' y1='{height}' y2='{height + 4}'/>"
        f"<text x='{x:.1f}' y='{height + 18}' text-anchor='middle'>{round(tick, 6):g}</text>"
        for tick in ticks for x in [(tick * unit + origin - start) / span * width])
    return (
        f"<svg class='cgpu-chart' width='{LEFT + width + 12}' height='{TITLE + height + BELOW}' "
        f"viewBox='{-LEFT} {-TITLE} {LEFT + width + 12} {TITLE + height + BELOW}' role='img' "
        f"aria-label='{escape(panel.title)}'>"
        f"<text class='cgpu-title' x='{-LEFT}' y='-8'>{escape(panel.title)}</text>{values}"
        f"<rect class='cgpu-axis' x='0' y='0' width='{width}' height='{height}'/>{times}"
        f"<text x='{width / 2:g}' y='{height + 35}' text-anchor='middle'>{unit_name} since start</text>"
        f"{body}</svg>"
    )


def render_panel(sampler, now: Optional[float] = None, charts: Optional[str] = None) -> str:
    """The whole live display for ``sampler``'s current state, as an HTML fragment; ``charts``:
    HTML drawn instead of the rolling SVG charts (the stopped run's static chart)."""
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
    if charts is None:
        # Ten samples at least: at --interval 600 a 300 s window held one point, no line at all.
        seconds = max(CHART_SECONDS, 10 * sampler.interval)
        charts = "".join(chart_svg(samples, panel, sampler.started_at, seconds)
                         for panel in CHART_PANELS if panel.column not in left_out)
    parts.append(f"{charts}</div>")
    return unbroken_units("".join(parts))
