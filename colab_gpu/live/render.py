"""Views of a live run's record: its one line, the summary ``%gpu_status --stop`` prints, and
the HTML that a notebook keeps after the runtime is gone, with a static chart of the samples
(an embedded PNG). matplotlib is imported only to draw that chart, through its object API
(``Figure`` + the Agg canvas), never pyplot.
"""
from __future__ import annotations

import base64
import time
from html import escape
from typing import Any, Dict, Optional, Tuple

from ..render import count, fold_items
from ..render.chart import neutral_style, to_png
from ..render.html import STYLE, unbroken_units
from .panel import CHART_PANELS, PALETTE, chart_top, min_max_per_column, render_panel, state_words, time_unit

__all__ = ["chart_figure", "chart_parts", "chart_png", "render_html", "render_line", "render_text", "stopped_view"]

# The chart's text, as large as the live panel's at the width a notebook shows it (about
# 800 px of its 1000): 12 pt at 100 dpi is 17 px drawn, 13.5 px shown.
DPI = 100
LABEL_POINTS, TITLE_POINTS = 12, 13


def render_line(record) -> str:
    """"NVML: 120 samples over 119.8 s": the record's one line (its repr)."""
    return f"{record.label}: {count(record.count, 'sample')} over {record.duration:.1f} s"


def render_text(record) -> str:
    """The summary ``%gpu_status --stop`` prints; folded for an 80-column terminal."""
    return "\n".join(fold_items(line, 2) for line in [record.headline(), *record.facts()])


def render_html(record) -> str:
    """The summary, then the chart of the samples kept, or why it could not be drawn."""
    lines = "".join(f"<li>{escape(fact)}</li>" for fact in record.facts())
    return unbroken_units(f"{STYLE}<div class='cgpu-card'><div><b>{escape(record.headline())}</b></div>"
                          f"<ul class='cgpu-facts'>{lines}</ul>{chart_parts(record)[1]}</div>")


def chart_parts(record) -> Tuple[Optional[bytes], str]:
    """(the chart's PNG, the HTML that shows it): an <img>, or why it could not be drawn
    (None and a line); (None, "") without samples."""
    if not record.samples:
        return None, ""
    try:
        png = chart_png(record)
    except ImportError as error:  # matplotlib missing or broken: the summary still shows
        why = ("needs matplotlib: pip install matplotlib" if isinstance(error, ModuleNotFoundError)
               else f"could not be drawn: {error}")
        return None, f"<p class='cgpu-muted'>The chart {escape(why)}</p>"
    encoded = base64.b64encode(png).decode("ascii")
    return png, (f"<img alt='{escape(record.label)}: chart of the samples kept' "
                 f"src='data:image/png;base64,{encoded}'>")


def stopped_view(sampler, record) -> Dict[str, str]:
    """What the live display becomes when the run stops (a MIME bundle): its last state with
    the run's chart as a PNG, in HTML, and the PNG alone. A notebook saves it, and any viewer
    draws it without a kernel (JupyterLab, GitHub, Colab, nbconvert to HTML or PDF), where the
    widget's own view needs its kernel: "Error displaying widget: model not found"."""
    png, chart = chart_parts(record)
    bundle = {"text/plain": f"Live GPU monitor ({sampler.label}): {state_words(sampler, time.time())}",
              "text/html": render_panel(sampler, charts=chart)}
    if png is not None:
        bundle["image/png"] = base64.b64encode(png).decode("ascii")
    return bundle


def chart_png(record, dpi: int = DPI) -> bytes:
    """The samples kept (the last live_history), on the run's time axis, as a PNG: the live
    panel's charts (busy, memory used, power, temperature per GPU) for the whole run."""
    with neutral_style():  # ticks added while saving take the style's colours too
        return to_png(_draw_chart(record, dpi))


def chart_figure(record, dpi: int = DPI):
    """The matplotlib Figure (Agg, no pyplot) that :func:`chart_png` saves, in colours
    that read in light and dark themes."""
    with neutral_style():
        return _draw_chart(record, dpi)


def _series(record, start: float, unit: float):
    """(x of each sample in ``unit``s since ``start``, an array [sample, GPU, panel] of each
    CHART_PANELS value, NaN where not reported), GPUs in index order."""
    import numpy

    positions = {index: position for position, index in enumerate(sorted(record.gpu_names))}
    rows = [(step, positions[reading.index], *(panel.value(reading) for panel in CHART_PANELS))
            for step, sample in enumerate(record.samples) for reading in sample.gpus if reading.index in positions]
    table = numpy.array(rows, dtype=float).reshape(-1, 2 + len(CHART_PANELS))  # None becomes NaN
    values = numpy.full((len(record.samples), len(positions), len(CHART_PANELS)), numpy.nan)
    values[table[:, 0].astype(int), table[:, 1].astype(int)] = table[:, 2:]
    return (numpy.array([sample.time for sample in record.samples]) - start) / unit, values


def _draw_chart(record, dpi: int):
    import numpy

    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    # The run's start, not the oldest sample kept: after the buffer overflowed, the
    # x axis still reads as time since the monitor started.
    start = record.started_at or (record.samples[0].time if record.samples else 0.0)
    unit, unit_name = time_unit(record.samples[-1].time - start if record.samples else 0.0)
    x, values = _series(record, start, unit)
    fields = list(range(len(CHART_PANELS)))
    if record.recorded:  # a panel a recording never held is left out, as its summary part is
        fields = [field for field in fields if not numpy.isnan(values[:, :, field]).all()] or fields
    rows = 2 if len(fields) == 4 else 1  # three panels in a row, not a 2 x 2 grid with a hole
    height = 6.0 if rows == 2 else 3.4
    figure = Figure(figsize=(10, height), dpi=dpi)
    FigureCanvasAgg(figure)
    axes_grid = figure.subplots(rows, len(fields) // rows, sharex=True, squeeze=False)
    # Fixed margins (in inches, whatever the height): a constrained layout measured every
    # tick label twice, half the drawing time.
    figure.subplots_adjust(left=0.07, right=0.86 if len(record.gpu_names) > 1 else 0.97, top=1 - 0.75 / height,
                           bottom=0.65 / height, wspace=0.25, hspace=0.4)
    span = (x[0], x[-1]) if len(x) else (0.0, 0.0)
    readings = [reading for sample in record.samples for reading in sample.gpus]
    legend: Dict[int, Any] = {}  # a line per GPU, from whichever panel has one: each GPU has one colour
    for axes, field in zip(axes_grid.flat, fields):
        panel = CHART_PANELS[field]
        # Two points per column at most, and the line's first and last: no more than two per pixel.
        columns = int(axes.get_position().width * figure.get_figwidth() * dpi) - 1
        for position, index in enumerate(sorted(record.gpu_names)):
            y = values[:, position, field]
            known = ~numpy.isnan(y)
            if known.any():
                drawn_x, drawn_y = x[known], y[known]
                kept = min_max_per_column(drawn_x, drawn_y, columns, span)
                line, = axes.plot(drawn_x[kept], drawn_y[kept],
                                  label=f"GPU {index}", linewidth=2, color=PALETTE[index % len(PALETTE)])
                legend.setdefault(index, line)
        if not axes.lines:
            axes.text(0.5, 0.5, "not reported", ha="center", va="center", transform=axes.transAxes)
            axes.set_yticks([])  # no 0 to 1 scale for values that do not exist
        top = chart_top(panel, readings)
        # A little room past 0 and the top: a GPU busy 100% (or idle at 0) is drawn
        # inside the panel, not hidden under its frame.
        axes.set_ylim(-0.03 * top, 1.05 * top)
        axes.set_title(panel.title, fontsize=TITLE_POINTS, fontweight="bold", loc="left")
        axes.tick_params(labelsize=LABEL_POINTS)
        axes.grid(alpha=0.3)
    for axes in axes_grid[-1]:
        axes.set_xlabel(f"{unit_name} since start", fontsize=LABEL_POINTS)
    if len(legend) > 1:  # beside the panels, never over the lines (or empty: a warning)
        axes_grid[0][-1].legend([legend[i] for i in sorted(legend)], [f"GPU {i}" for i in sorted(legend)],
                               fontsize=LABEL_POINTS, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    figure.suptitle(record.label, fontsize=TITLE_POINTS)
    return figure
