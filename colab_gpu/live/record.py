"""The record of a whole live run: a summary per GPU and a static chart that outlives it.

``%gpu_status --stop`` displays it, so the notebook keeps an image of the run (HTML with an
embedded PNG) after the runtime is gone. matplotlib is imported only to draw that image,
through its object API (``Figure`` + the Agg canvas), never pyplot.
"""
from __future__ import annotations

import base64
import dataclasses
from html import escape
from typing import Dict, Iterator, List, Optional, Tuple

from ..render import celsius, count, fold_items, number, size
from ..render.chart import neutral_style, to_png
from ..render.html import STYLE, unbroken_units
from .panel import PALETTE, min_max_per_column
from .sampler import RunTotals, Sample, totals_of

ROW_FIELDS = ("time", "gpu", "name", "utilization", "memory_used", "memory_total", "power",
              "temperature")


def rows(samples, names: Dict[int, str]) -> Iterator[tuple]:
    """One row per GPU and sample, in ROW_FIELDS order (time in seconds since the epoch)."""
    for sample in samples:
        for reading in sample.gpus:
            yield (sample.time, reading.index, names.get(reading.index), reading.utilization,
                   reading.memory_used, reading.memory_total, reading.power, reading.temperature)


def _time_unit(span: float) -> Tuple[float, str]:
    """(seconds per unit, its name) for an x axis of ``span`` seconds: an hour-long run reads
    in minutes and a night's in hours, not as 30000 seconds."""
    if span <= 600:
        return 1.0, "seconds"
    if span <= 3 * 3600:
        return 60.0, "minutes"
    return 3600.0, "hours"


@dataclasses.dataclass(frozen=True)
class GPURunSummary:
    index: int
    name: str
    utilization_mean: Optional[float]
    utilization_peak: Optional[float]
    memory_peak: Optional[int]
    memory_total: Optional[int]
    power_peak: Optional[float]
    temperature_peak: Optional[float]
    torch_label: Optional[str] = None  # "cuda:0", "hidden from torch", as the card says
    recorded: bool = False  # replayed from a recording (Snapshot.recorded), not read from a driver

    def line(self) -> str:
        """A part a recording never held is left out, as the card leaves out its row: nanoGPT's
        log has no memory and read "memory peak n/a of n/a". From the live driver, n/a says a
        read failed, so it stays."""
        label = f" ({self.torch_label})" if self.torch_label else ""
        parts = [((self.utilization_mean, self.utilization_peak),
                  f"busy {number(self.utilization_mean, '%')} on average, peak {number(self.utilization_peak, '%')}"),
                 ((self.memory_peak, self.memory_total),
                  f"memory peak {size(self.memory_peak)} of {size(self.memory_total)}"),
                 ((self.power_peak,), f"power peak {number(self.power_peak, ' W', 1)}"),
                 ((self.temperature_peak,), f"temperature peak {celsius(self.temperature_peak)}")]
        shown = [text for values, text in parts
                 if not self.recorded or any(value is not None for value in values)]
        return f"GPU {self.index} {self.name}{label}: " + ("; ".join(shown) or "nothing recorded")


@dataclasses.dataclass(frozen=True)
class RunRecord:
    """Everything a live run saw (the buffer's last samples) and how it ended."""

    label: str
    interval: float
    samples: Tuple[Sample, ...]
    gpu_names: Dict[int, str]
    started_at: Optional[float]
    stopped_at: Optional[float]
    error: Optional[str]
    count: int  # samples taken; more than len(samples) when the buffer overflowed
    display_error: Optional[str] = None  # why a display (the widget) stopped following the run
    torch_labels: Dict[int, str] = dataclasses.field(default_factory=dict)  # panel.torch_labels
    numbering_note: Optional[str] = None  # why a label says "cuda:?" (panel.numbering_note)
    recording_note: Optional[str] = None  # how a log that does not describe itself was read
    # GPU index -> its RunTotals over every sample taken, also those the buffer dropped;
    # without them (a record built from samples alone) the summary reads the samples kept.
    totals: Dict[int, RunTotals] = dataclasses.field(default_factory=dict)
    recorded: bool = False  # replayed from a recording: what it never held is left out

    @property
    def duration(self) -> float:
        if self.started_at is None or self.stopped_at is None:
            return 0.0
        return self.stopped_at - self.started_at

    def summaries(self) -> Tuple[GPURunSummary, ...]:
        totals = self.totals or totals_of(self.samples)
        result = []
        for index in sorted(self.gpu_names):
            run = totals.get(index) or RunTotals()
            peaks = run.peaks
            result.append(GPURunSummary(
                index=index, name=self.gpu_names[index], utilization_mean=run.busy_mean,
                utilization_peak=peaks["utilization"], memory_peak=peaks["memory_used"],
                memory_total=peaks["memory_total"], power_peak=peaks["power"],
                temperature_peak=peaks["temperature"], torch_label=self.torch_labels.get(index),
                recorded=self.recorded))
        return tuple(result)

    def headline(self) -> str:
        kept = "" if self.count == len(self.samples) else f" (the last {len(self.samples)} kept)"
        text = (f"Live monitor stopped: {count(self.count, 'sample')}{kept} every {self.interval:g} s "
                f"over {self.duration:.1f} s, {self.label}")
        if self.error:
            text += f"; it had stopped by itself: {self.error}"
        if self.display_error:  # the frozen widget was not a frozen run: say why it froze
            text += f"; a display stopped updating: {self.display_error}"
        return text

    def __repr__(self) -> str:
        return f"<RunRecord {self.label}: {count(self.count, 'sample')} over {self.duration:.1f} s>"

    def facts(self) -> List[str]:
        """A line per GPU, then the notes: what the summary says under the headline."""
        return [s.line() for s in self.summaries()] + [note for note in (self.numbering_note,
                                                                          self.recording_note) if note]

    def __str__(self) -> str:
        """The summary ``%gpu_status --stop`` prints, so ``print(...)`` shows it in a script;
        folded for an 80-column terminal."""
        return "\n".join(fold_items(line, 2) for line in [self.headline(), *self.facts()])

    def _repr_pretty_(self, printer, cycle) -> None:
        printer.text(str(self))

    def _repr_html_(self) -> str:
        image = ""
        if self.samples:
            try:
                encoded = base64.b64encode(self.chart_png()).decode("ascii")
            except ImportError as error:  # matplotlib missing or broken: the summary still shows
                why = ("needs matplotlib: pip install matplotlib" if isinstance(error, ModuleNotFoundError)
                       else f"could not be drawn: {error}")
                image = f"<p class='cgpu-muted'>The chart {escape(why)}</p>"
            else:
                image = (f"<img alt='{escape(self.label)}: chart of the samples kept' "
                         f"src='data:image/png;base64,{encoded}'>")
        lines = "".join(f"<li>{escape(fact)}</li>" for fact in self.facts())
        return unbroken_units(f"{STYLE}<div class='cgpu-card'><div><b>{escape(self.headline())}</b></div>"
                              f"<ul class='cgpu-facts'>{lines}</ul>{image}</div>")

    def chart_png(self, dpi: int = 80) -> bytes:
        """The samples kept (the last live_history), on the run's time axis, as a PNG: busy %,
        memory used, power and temperature per GPU."""
        with neutral_style():  # ticks added while saving take the style's colours too
            return to_png(self._draw_chart(dpi))

    def _series(self, start: float, unit: float):
        """(x of each sample in ``unit``s since ``start``, an array [sample, GPU, field] of busy %,
        memory used in GiB, power and temperature, NaN where not reported), GPUs in index order."""
        import numpy

        positions = {index: position for position, index in enumerate(sorted(self.gpu_names))}
        rows = [(step, positions[r.index], r.utilization, r.memory_used, r.power, r.temperature)
                for step, sample in enumerate(self.samples) for r in sample.gpus if r.index in positions]
        table = numpy.array(rows, dtype=float).reshape(-1, 6)  # None becomes NaN
        values = numpy.full((len(self.samples), len(positions), 4), numpy.nan)
        values[table[:, 0].astype(int), table[:, 1].astype(int)] = table[:, 2:]
        values[:, :, 1] /= 1024 ** 3
        return (numpy.array([sample.time for sample in self.samples]) - start) / unit, values

    def chart_figure(self, dpi: int = 80):
        """The matplotlib Figure (Agg, no pyplot) that :meth:`chart_png` saves, in colours
        that read in light and dark themes."""
        with neutral_style():
            return self._draw_chart(dpi)

    def _draw_chart(self, dpi: int):
        import numpy

        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        # The run's start, not the oldest sample kept: after the buffer overflowed, the
        # x axis still reads as time since the monitor started.
        start = self.started_at or (self.samples[0].time if self.samples else 0.0)
        unit, unit_name = _time_unit(self.samples[-1].time - start if self.samples else 0.0)
        totals = [r.memory_total for sample in self.samples for r in sample.gpus if r.memory_total]
        panels = (("busy (%)", 100), ("memory used (GiB)", max(totals) / 1024 ** 3 if totals else None),
                  ("power (W)", None), ("temperature (°C)", None))
        x, values = self._series(start, unit)
        fields = list(range(len(panels)))
        if self.recorded:  # a panel a recording never held is left out, as its summary part is
            fields = [field for field in fields if not numpy.isnan(values[:, :, field]).all()] or fields
        rows = 2 if len(fields) == 4 else 1  # three panels in a row, not a 2 x 2 grid with a hole
        height = 5.0 if rows == 2 else 3.0
        figure = Figure(figsize=(10, height), dpi=dpi)
        FigureCanvasAgg(figure)
        axes_grid = figure.subplots(rows, len(fields) // rows, sharex=True, squeeze=False)
        # Fixed margins (in inches, whatever the height): a constrained layout measured every
        # tick label twice, half the drawing time.
        figure.subplots_adjust(left=0.06, right=0.86 if len(self.gpu_names) > 1 else 0.97, top=1 - 0.6 / height,
                               bottom=0.5 / height, wspace=0.2, hspace=0.3)
        span = (x[0], x[-1]) if len(x) else (0.0, 0.0)
        legend = {}  # a line per GPU, from whichever panel has one: each GPU has one colour
        for axes, field in zip(axes_grid.flat, fields):
            title, top = panels[field]
            highest, columns = 0.0, int(axes.get_position().width * figure.get_figwidth() * dpi)  # its pixels
            for position, index in enumerate(sorted(self.gpu_names)):
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
        figure.suptitle(self.label, fontsize=11)
        return figure
