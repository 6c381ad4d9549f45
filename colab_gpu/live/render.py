"""Views of a live run's record: its one line, the summary ``%gpu_status --stop`` prints, and
the HTML that a notebook keeps after the runtime is gone, with a static chart of the samples
(an embedded PNG). matplotlib is imported only to draw that chart, through its object API
(``Figure`` + the Agg canvas), never pyplot.
"""
from __future__ import annotations

import base64
from html import escape
from typing import Any, Dict, Tuple

from ..render import count, fold_items
from ..render.chart import neutral_style, to_png
from ..render.html import STYLE, unbroken_units
from .panel import PALETTE, min_max_per_column

__all__ = ["chart_figure", "chart_png", "render_html", "render_line", "render_text"]


def render_line(record) -> str:
    """"NVML: 120 samples over 119.8 s": the record's one line (its repr)."""
    return f"{record.label}: {count(record.count, 'sample')} over {record.duration:.1f} s"


def render_text(record) -> str:
    """The summary ``%gpu_status --stop`` prints; folded for an 80-column terminal."""
    return "\n".join(fold_items(line, 2) for line in [record.headline(), *record.facts()])


def render_html(record) -> str:
    """The summary, then the chart of the samples kept, or why it could not be drawn."""
    image = ""
    if record.samples:
        try:
            encoded = base64.b64encode(chart_png(record)).decode("ascii")
        except ImportError as error:  # matplotlib missing or broken: the summary still shows
            why = ("needs matplotlib: pip install matplotlib" if isinstance(error, ModuleNotFoundError)
                   else f"could not be drawn: {error}")
            image = f"<p class='cgpu-muted'>The chart {escape(why)}</p>"
        else:
            image = (f"<img alt='{escape(record.label)}: chart of the samples kept' "
                     f"src='data:image/png;base64,{encoded}'>")
    lines = "".join(f"<li>{escape(fact)}</li>" for fact in record.facts())
    return unbroken_units(f"{STYLE}<div class='cgpu-card'><div><b>{escape(record.headline())}</b></div>"
                          f"<ul class='cgpu-facts'>{lines}</ul>{image}</div>")


def chart_png(record, dpi: int = 80) -> bytes:
    """The samples kept (the last live_history), on the run's time axis, as a PNG: busy %,
    memory used, power and temperature per GPU."""
    with neutral_style():  # ticks added while saving take the style's colours too
        return to_png(_draw_chart(record, dpi))


def chart_figure(record, dpi: int = 80):
    """The matplotlib Figure (Agg, no pyplot) that :func:`chart_png` saves, in colours
    that read in light and dark themes."""
    with neutral_style():
        return _draw_chart(record, dpi)


def _time_unit(span: float) -> Tuple[float, str]:
    """(seconds per unit, its name) for an x axis of ``span`` seconds: an hour-long run reads
    in minutes and a night's in hours, not as 30000 seconds."""
    if span <= 600:
        return 1.0, "seconds"
    if span <= 3 * 3600:
        return 60.0, "minutes"
    return 3600.0, "hours"


def _series(record, start: float, unit: float):
    """(x of each sample in ``unit``s since ``start``, an array [sample, GPU, field] of busy %,
    memory used in GiB, power and temperature, NaN where not reported), GPUs in index order."""
    import numpy

    positions = {index: position for position, index in enumerate(sorted(record.gpu_names))}
    rows = [(step, positions[r.index], r.utilization, r.memory_used, r.power, r.temperature)
            for step, sample in enumerate(record.samples) for r in sample.gpus if r.index in positions]
    table = numpy.array(rows, dtype=float).reshape(-1, 6)  # None becomes NaN
    values = numpy.full((len(record.samples), len(positions), 4), numpy.nan)
    values[table[:, 0].astype(int), table[:, 1].astype(int)] = table[:, 2:]
    values[:, :, 1] /= 1024 ** 3
    return (numpy.array([sample.time for sample in record.samples]) - start) / unit, values


def _draw_chart(record, dpi: int):
    import numpy

    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    # The run's start, not the oldest sample kept: after the buffer overflowed, the
    # x axis still reads as time since the monitor started.
    start = record.started_at or (record.samples[0].time if record.samples else 0.0)
    unit, unit_name = _time_unit(record.samples[-1].time - start if record.samples else 0.0)
    totals = [r.memory_total for sample in record.samples for r in sample.gpus if r.memory_total]
    panels = (("busy (%)", 100), ("memory used (GiB)", max(totals) / 1024 ** 3 if totals else None),
              ("power (W)", None), ("temperature (°C)", None))
    x, values = _series(record, start, unit)
    fields = list(range(len(panels)))
    if record.recorded:  # a panel a recording never held is left out, as its summary part is
        fields = [field for field in fields if not numpy.isnan(values[:, :, field]).all()] or fields
    rows = 2 if len(fields) == 4 else 1  # three panels in a row, not a 2 x 2 grid with a hole
    height = 5.0 if rows == 2 else 3.0
    figure = Figure(figsize=(10, height), dpi=dpi)
    FigureCanvasAgg(figure)
    axes_grid = figure.subplots(rows, len(fields) // rows, sharex=True, squeeze=False)
    # Fixed margins (in inches, whatever the height): a constrained layout measured every
    # tick label twice, half the drawing time.
    figure.subplots_adjust(left=0.06, right=0.86 if len(record.gpu_names) > 1 else 0.97, top=1 - 0.6 / height,
                           bottom=0.5 / height, wspace=0.2, hspace=0.3)
    span = (x[0], x[-1]) if len(x) else (0.0, 0.0)
    legend: Dict[int, Any] = {}  # a line per GPU, from whichever panel has one: each GPU has one colour
    for axes, field in zip(axes_grid.flat, fields):
        title, top = panels[field]
        highest, columns = 0.0, int(axes.get_position().width * figure.get_figwidth() * dpi)  # its pixels
        for position, index in enumerate(sorted(record.gpu_names)):
            y = values[:, position, field]
            known = ~numpy.isnan(y)
            if known.any():
                drawn_x, drawn_y = x[known], y[known]
                kept = min_max_per_column(drawn_x, drawn_y, columns, span)
                line, = axes.plot(drawn_x[kept], drawn_y[kept],
                                  label=f"GPU {index}", linewidth=1.2, color=PALETTE[index % len(PALETTE)])
                legend.setdefault(index, line)
                highest = max(highest, float(y[known].max()))
        if not axes.lines:
            axes.text(0.5, 0.5, "not reported", ha="center", va="center", transform=axes.transAxes)
            axes.set_yticks([])  # no 0 to 1 scale for values that do not exist
        top = top or (highest * 1.1 or 1)
        # A little room past 0 and the top: a GPU busy 100% (or idle at 0) is drawn
        # inside the panel, not hidden under its frame.
        axes.set_ylim(-0.03 * top, 1.05 * top)
        axes.set_title(title, fontsize=10)
        axes.grid(alpha=0.3)
    for axes in axes_grid[-1]:
        axes.set_xlabel(f"{unit_name} since start")
    if len(legend) > 1:  # beside the panels, never over the lines (or empty: a warning)
        axes_grid[0][-1].legend([legend[i] for i in sorted(legend)], [f"GPU {i}" for i in sorted(legend)],
                               fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    figure.suptitle(record.label, fontsize=11)
    return figure
