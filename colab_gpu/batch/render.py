"""Text, HTML and chart views of a batch-size search (matplotlib imported only for the chart)."""
from __future__ import annotations

import base64
import re
from html import escape
from typing import Optional

from .. import words
from ..render import count, fold
from ..render.chart import neutral_style, to_png
from ..render.html import STYLE, unbroken_units
from ..words import duration
from .result import OUT_OF_MEMORY, RUNNING, trial_row
from .trial import CtrlC

HEADER = ("size", "outcome", "peak memory", "time/step", "samples/s")
NUMERIC = (True, False, True, True, True)  # right-aligned, so digits line up; words read from the left


def _short_rate(samples_per_second: Optional[float], exact: str) -> str:
    """At most 5 characters: 489177 samples/s reads 489k, 4891770 reads 4.89M (the table keeps
    every digit). A fast cell's 6 digits made the progress line 81 columns."""
    if samples_per_second is None or samples_per_second < 1e5:
        return exact
    if samples_per_second < 999_500:
        return f"{samples_per_second / 1e3:.0f}k"
    return f"{samples_per_second / 1e6:.3g}M"


UNEVEN_MARK = "*"  # after a time whose timed runs disagreed, also when run again


def _runs_range(trial) -> str:
    """"runs took 665 µs to 31.0 ms (47x)": how far a trial's timed runs were apart."""
    fastest, slowest = trial.timing_range
    return f"runs took {duration(fastest)} to {duration(slowest)} ({slowest / fastest:.2g}x)"


def trial_line(trial, variable: str, number: int) -> str:
    """One progress line for a terminal."""
    size, outcome, peak, step, speed = trial_row(trial)
    if trial.fits:  # unpadded after the peak: 80 columns hold it, samples/s did not fit on 94
        uneven = f"  {UNEVEN_MARK}{_runs_range(trial)}" if trial.timing_range else ""
        return fold(f"trial {number:>2}: {variable}={size:>6}  {outcome}  peak {peak:>9}  {step}/step  "
                    f"{_short_rate(trial.samples_per_second, speed)} samples/s{uneven}", 10)
    measured = f"({trial.error})" if trial.error else ""
    # folded under the trial's number: an error's message runs to 200 characters
    return fold(f"trial {number:>2}: {variable}={size:>6}  {outcome:<13}  {measured}".rstrip(), 10)


def _rows(result):
    """The table's rows, a time whose runs disagreed marked (the others padded to line up)."""
    marked = any(trial.timing_range for trial in result.trials)
    return [row[:3] + (row[3] + (UNEVEN_MARK if trial.timing_range else " "),) + row[4:] if marked else row
            for trial, row in zip(result.trials, result.rows())]


def _table_text(result) -> str:
    rows = [HEADER] + _rows(result)
    widths = [max(len(row[i]) for row in rows) for i in range(len(HEADER))]
    return "\n".join("  ".join(cell.rjust(width) if numeric else cell.ljust(width)
                                for cell, width, numeric in zip(row, widths, NUMERIC)).rstrip()
                      for row in rows)


def _facts(result):
    if result.device:
        yield f"device: {result.device}"
    if result.capacity is not None:
        usable = "" if result.usable == result.capacity else f", usable with headroom {words.size(result.usable)}"
        yield f"{capacity_label(result)}: {words.size(result.capacity)}{usable}"
    if result.fit is not None:
        yield (f"memory fit: {words.size(result.fit.intercept)} + {words.size(result.fit.slope)} per sample "
               f"(from {result.variable}={result.fit.sizes[0]} and {result.fit.sizes[1]})")
    ended = RUNNING if result.stopped == RUNNING else f"stopped: {result.stopped}"
    yield f"{result.tally()}, {count(result.samples_computed, 'sample')} computed; {ended}"
    if result.plan is not None:
        yield plan_fact(result)
    if result.largest_fitting is not None:
        yield f"largest that ran: {result.largest_fitting}"
    if result.fastest is not None:
        yield f"fastest that ran: {result.fastest}"
    uneven = [trial for trial in result.trials if trial.timing_range]
    if uneven:
        yield (f"{UNEVEN_MARK} timed runs that disagreed, and again when run once more (a busy machine?), "
               f"so these times and samples/s are uncertain: "
               + "; ".join(f"{result.variable}={trial.size}: {_runs_range(trial)}" for trial in uneven))
    yield from result.notes


def plan_fact(result) -> str:
    """What the trials said of the plan the search started from: "planned 384 for H100: 384
    ran, 403 did not fit", or too high, or too low."""
    planned = result.plan.size
    said = f"planned {result.variable}={planned} for {result.plan.gpu}"
    if not same_gpu(result.plan.gpu, result.device):
        said += f" (searched on {result.device or 'another device'})"
    ran = next((trial for trial in result.trials if trial.size == planned), None)
    if ran is None:
        return f"{said}: not tried"
    if ran.too_large:
        return f"{said}: too high, {planned} did not fit"
    if not ran.fits:
        return f"{said}: {planned} {ran.outcome}"
    if (result.largest_fitting or 0) > planned:
        return f"{said}: too low, {result.largest_fitting} ran too"
    above = [trial.size for trial in result.trials if trial.too_large and trial.size > planned]
    return f"{said}: {planned} ran" + (f", {min(above)} did not fit" if above else "")


def same_gpu(planned: str, device: str) -> bool:
    """Whether the GPU a plan names is the CUDA device searched on: its model (``A100`` of
    ``A100-40GB``, ``RTX3090``, NVML's ``NVIDIA H100 80GB HBM3``) is whole words of the
    device's label (``cuda:0 (NVIDIA GeForce RTX 3090)``), spaces aside; ``L4`` is not ``L40S``."""
    model = "".join(re.findall(r"[a-z0-9]+", planned.split("-")[0].lower()))
    words = re.findall(r"[a-z0-9]+", device.lower())
    return device.startswith("cuda") and any("".join(words[first:last]) == model
                                             for first in range(len(words)) for last in range(first + 1, len(words) + 1))


def render_line(result) -> str:
    """"bs = 16 (largest fitting on cuda:0, 3 trials, 1 out of memory)": the result's one line."""
    tally = result.tally()
    if result.stopped == RUNNING:
        best = (f"{result.largest_fitting} fits so far" if result.largest_fitting is not None
                else "nothing has fitted yet")
        return f"searching {result.variable}: {best} ({tally})"
    if result.answer is None:
        return f"no {result.variable} found: {result.stopped}"
    what = "fastest" if result.mode == "throughput" else "largest fitting"
    where = f" on {result.device}" if result.device else ""
    return f"{result.variable} = {result.answer} ({what}{where}, {tally})"


def render_text(result) -> str:
    return "\n".join([fold(render_line(result), 2), _table_text(result), *(fold(fact, 2) for fact in _facts(result))])


# Numbers right-aligned in tabular figures, words left; more specific than JupyterLab's rule
# (every cell right) and than STYLE's (every cell left), which a later card repeats. A cell
# stays on one line; a header may wrap at its space ("peak / memory"), and a table still wider
# than a narrow notebook scrolls inside the card.
TABLE_STYLE = ("<style>.cgpu-card th{color:var(--cgpu-muted)}.cgpu-card tr.cgpu-answer td{font-weight:bold}"
               ".cgpu-card.cgpu-trials tr td,.cgpu-card.cgpu-trials tr th{text-align:right;"
               "font-variant-numeric:tabular-nums;white-space:nowrap;vertical-align:bottom}"
               ".cgpu-card.cgpu-trials tr th{white-space:normal}"
               ".cgpu-card.cgpu-trials table{display:block;overflow-x:auto;max-width:100%}"
               + "".join(f".cgpu-card.cgpu-trials tr td:nth-child({column}),"
                         f".cgpu-card.cgpu-trials tr th:nth-child({column}){{text-align:left}}"
                         for column, numeric in enumerate(NUMERIC, 1) if not numeric)
               + "</style>")


def table_html(result) -> str:
    head = "".join(f"<th>{escape(cell)}</th>" for cell in HEADER)
    body = "".join(
        "<tr" + (" class='cgpu-answer'" if trial.size == result.answer and trial.fits else "") + ">"
        + "".join(f"<td>{escape(cell)}</td>" for cell in row) + "</tr>"
        for trial, row in zip(result.trials, _rows(result)))
    return f"<table><tr>{head}</tr>{body}</table>"


def render_html(result) -> Optional[str]:
    """The card: the table, the facts and, once the search has ended, the chart inside it, so
    that the one output a notebook keeps (a progress display or a cell's Out) holds all. None
    for a result the user asked to see as text (``text_only``): IPython's HTML formatter then
    leaves text/html out."""
    if result.text_only:
        return None
    facts = "".join(f"<li>{escape(fact)}</li>" for fact in _facts(result))
    return unbroken_units(
        STYLE + TABLE_STYLE + f"<div class='cgpu-card cgpu-trials'><h4>{escape(render_line(result))}</h4>"
        f"{table_html(result)}<ul class='cgpu-muted cgpu-facts'>{facts}</ul>{_chart_html(result)}</div>")


def _chart_html(result) -> str:
    if result.stopped == RUNNING:
        return ""  # a chart per trial would slow the search down for a picture nobody keeps
    try:
        # Ctrl-C held, as while the search's own report is drawn: ``%%find_batch -o`` leaves the
        # chart (matplotlib's first import, a second) to IPython's display hook, after the
        # search. Raised there, it put a traceback in place of the report and left ``_``
        # unset; inside matplotlib's import, it left matplotlib half-imported for the session.
        with CtrlC():
            png = chart_png(result)
    except ImportError:  # matplotlib missing or broken: the table says it all
        return ""
    if png is None:
        return ""
    shown = "peak memory and throughput" if _memory_shown(result) else "throughput"
    return (f"<img alt='{shown} against {escape(result.variable)}' "
            f"src='data:image/png;base64,{base64.b64encode(png).decode()}'>")


def chart_png(result) -> Optional[bytes]:
    """Peak memory (with capacity and the fit, where measured) and throughput against size, as PNG bytes."""
    fits = [t for t in result.trials if t.fits]
    if not fits:
        return None
    with neutral_style():
        return to_png(chart_figure(result, fits), dpi=80)


# Peaks all under this share of the capacity (nothing ran out of memory or over the headroom):
# the memory axis is scaled to them, and the capacity named, not drawn. On the CPU the peaks of
# a small model sat as dots on zero under a line at the machine's RAM.
FAR_BELOW = 0.25


def chart_figure(result, fits):
    """The chart's matplotlib Figure (drawn inside neutral_style): legends below their panels,
    where they cover nothing, and plain numbers on every axis, no offset or 1e7 multiplier."""
    from matplotlib.figure import Figure

    if not _memory_shown(result):  # measure_memory=False, a CPU other than Linux's
        figure = Figure(figsize=(4.5, 3.6))
        _throughput(figure.subplots(), result, fits)
        figure.tight_layout()
        return figure
    figure = Figure(figsize=(9, 3.6))
    memory, speed = figure.subplots(1, 2)
    _memory(memory, result)
    _throughput(speed, result, fits)
    figure.tight_layout()
    return figure


def _memory(memory, result) -> None:
    measured = [t for t in result.trials if t.peak_memory is not None]
    right = max(t.size for t in result.trials)
    fitted = [result.fit.memory_at(0), result.fit.memory_at(right)] if result.fit is not None else []
    top = max([t.peak_memory for t in measured] + fitted + [0])
    # An out-of-memory trial reached the capacity; one cut short by Ctrl-C, an error or the
    # headroom did not, so it has no mark there.
    out_of_memory = [t.size for t in result.trials if t.outcome == OUT_OF_MEMORY]
    near = any(t.too_large for t in result.trials)
    capacity = result.capacity
    far = capacity is not None and not near and top < FAR_BELOW * min(capacity, result.usable or capacity)
    scale = max(top, 0 if capacity is None or far else capacity)
    unit, name = (1024 ** 3, "GiB") if scale >= 1024 ** 3 else (1024 ** 2, "MiB")
    memory.plot([t.size for t in measured], [t.peak_memory / unit for t in measured], "o", label="peak (ran)")
    label = capacity_label(result)
    if capacity is not None and not far:
        memory.axhline(capacity / unit, color="tab:red", label=label)
        if out_of_memory:
            memory.plot(out_of_memory, [capacity / unit] * len(out_of_memory), "x",
                        color="tab:red", label="out of memory")
        if result.usable != capacity:
            memory.axhline(result.usable / unit, color="tab:orange", linestyle=":", label=f"{label} - headroom")
    if fitted:
        memory.plot([0, right], [value / unit for value in fitted], "--", color="tab:gray", label="fit")
    memory.set(xlabel=result.variable, ylabel=name, title="peak memory")
    if far:  # scaled to the peaks: the capacity is said, not drawn 4x and more above them
        memory.set_ylim(0, top / unit * 1.3)
        memory.text(0.02, 0.97, f"{label}: {words.size(capacity)}, far above this scale",
                    transform=memory.transAxes, va="top", fontsize="small")
    _plain_numbers(memory)
    _legend_below(memory)


def capacity_label(result) -> str:
    """What the capacity is: on the CPU without an address-space limit the RAM available as the
    trials ran, which changes from one search to the next; the limit under ``ulimit -v``; a
    GPU's memory (what torch's allocator may hold) elsewhere."""
    if any(trial.capacity_kills for trial in result.trials):
        return "RAM available now"
    return "address-space limit (ulimit -v)" if result.device == "cpu" else "capacity"


def _memory_shown(result) -> bool:
    """Whether the chart has a memory panel: not where no peak or capacity was measured (its
    axes would be empty, with a legend for points that are not there)."""
    return result.capacity is not None or any(t.peak_memory is not None for t in result.trials)


def _throughput(speed, result, fits) -> None:
    # By size, not in the order they ran: a size measured below the first success (--start
    # above what fits) drew the line back over itself.
    timed = sorted((t for t in fits if t.samples_per_second), key=lambda t: t.size)
    speed.plot([t.size for t in timed], [t.samples_per_second for t in timed], "o-", label="median run")
    uneven = [t for t in timed if t.timing_range]
    if uneven:  # the samples/s of the fastest and the slowest timed run: how uncertain the point is
        rates = [t.samples_per_second for t in uneven]
        speed.errorbar([t.size for t in uneven], rates,
                       yerr=[[rate - t.size / t.timing_range[1] for t, rate in zip(uneven, rates)],
                             [t.size / t.timing_range[0] - rate for t, rate in zip(uneven, rates)]],
                       fmt="none", ecolor="tab:orange", capsize=3, label=f"{UNEVEN_MARK} uneven timed runs")
        _legend_below(speed)
    speed.set(xlabel=result.variable, ylabel="samples/s", title="throughput")
    speed.set_ylim(bottom=0)
    _plain_numbers(speed, short=True)


def _plain_numbers(axes, short: bool = False) -> None:
    """Tick labels as plain numbers: matplotlib wrote samples/s as 0.2 ... 1.2 under a "1e7" in
    the corner. ``short``: 120k, 12M for large values (the unit is the axis's label)."""
    from matplotlib.ticker import FuncFormatter, ScalarFormatter

    for axis in (axes.xaxis, axes.yaxis):
        plain = ScalarFormatter(useOffset=False)
        plain.set_scientific(False)
        axis.set_major_formatter(plain)
    if short:
        axes.yaxis.set_major_formatter(FuncFormatter(lambda value, _: _tick(value)))


def _tick(value: float) -> str:
    for factor, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:g}{suffix}"
    return f"{value:g}"


def _legend_below(axes) -> None:
    """The legend under the panel, outside the data (inside, it sat over the points); none for
    the peaks alone, which the title names."""
    if len(axes.get_legend_handles_labels()[1]) > 1:
        axes.legend(fontsize="small", loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=2, frameon=False)
