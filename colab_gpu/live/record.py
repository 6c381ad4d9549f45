"""The record of a whole live run: its samples, a summary per GPU and how it ended.

``%gpu_status --stop`` displays it (views in live/render.py: the summary, and a static chart
that outlives the runtime).
"""
from __future__ import annotations

import dataclasses
from typing import Dict, Iterator, List, Optional, Tuple

from ..render import celsius, count, number, size
from ..render.shown import Shown
from .sampler import RunTotals, Sample, totals_of

ROW_FIELDS = ("time", "gpu", "name", "utilization", "memory_used", "memory_total", "power",
              "temperature")
# history()'s DataFrame columns, one per ROW_FIELDS entry: each names its unit, as the charts do.
FRAME_COLUMNS = ("time", "gpu", "name", "busy (%)", "memory used (MiB)", "memory total (MiB)", "power (W)",
                 "temperature (°C)")
MIB_COLUMNS = ("memory used (MiB)", "memory total (MiB)")  # bytes in ROW_FIELDS


def rows(samples, names: Dict[int, str]) -> Iterator[tuple]:
    """One row per GPU and sample, in ROW_FIELDS order (time in seconds since the epoch)."""
    for sample in samples:
        for reading in sample.gpus:
            yield (sample.time, reading.index, names.get(reading.index), reading.utilization,
                   reading.memory_used, reading.memory_total, reading.power, reading.temperature)


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


@dataclasses.dataclass(frozen=True, repr=False)
class RunRecord(Shown):
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

    def facts(self) -> List[str]:
        """A line per GPU, then the notes: what the summary says under the headline."""
        return [s.line() for s in self.summaries()] + [note for note in (self.numbering_note,
                                                                          self.recording_note) if note]

    line_view = "colab_gpu.live.render:render_line"
    text_view = "colab_gpu.live.render:render_text"  # the summary %gpu_status --stop prints
    html_view = "colab_gpu.live.render:render_html"  # the summary and the chart of the samples
