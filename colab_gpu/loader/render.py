"""Text, HTML and chart views of a loader's timings (matplotlib imported only for the chart)."""
from __future__ import annotations

import base64
from html import escape
from typing import List, Optional, Tuple

from ..render import NA, count, duration, fold, significant
from ..render.chart import neutral_style, to_png
from ..render.html import STYLE, unbroken_units
from .choose import WITHIN
from .result import LoaderTuning, Measurement, waiting

HEADER = ("setting", "batches/s", "samples/s", "± rounds", "start-up", "")
NUMERIC = (False, True, True, True, True, False)


def _rate(value: Optional[float]) -> str:
    return NA if value is None else significant(value)


def _marks(result: LoaderTuning, measurement: Measurement) -> str:
    setting = measurement.setting
    marks = []
    if setting == result.current_measurement.setting:
        marks.append("yours")
    if setting == result.measured_answer:
        marks.append("answer")
    if setting == result.best and setting != result.measured_answer:
        marks.append("best")
    return ", ".join(marks)


def rows(result: LoaderTuning) -> List[Tuple[str, ...]]:
    """(setting, batches/s, samples/s, spread, start-up, marks) as text, one a setting."""
    table: List[Tuple[str, ...]] = []
    for measurement in result.measurements:
        marks = _marks(result, measurement)
        if not measurement.rates:
            table.append((measurement.setting.label(), "failed", "", "", "", marks))
            continue
        star = "*" if measurement.with_startup else ""
        spread = measurement.spread
        startup = duration(measurement.startup) if measurement.setting.num_workers else "none"
        table.append((measurement.setting.label(), _rate(measurement.batches_per_second) + star,
                      _rate(measurement.samples_per_second) + star,
                      NA if spread is None else f"{spread * 100:.0f} %", startup, marks))
    return table


def _table_text(result: LoaderTuning) -> str:
    table = [HEADER] + rows(result)
    widths = [max(len(row[i]) for row in table) for i in range(len(HEADER))]
    return "\n".join("  " + "  ".join(cell.rjust(width) if numeric else cell.ljust(width)
                                      for cell, width, numeric in zip(row, widths, NUMERIC)).rstrip()
                     for row in table)


def _times(rate: float) -> str:
    return f"{rate:.2f}x" if rate < 10 else f"{rate:.0f}x"


def render_line(result: LoaderTuning) -> str:
    """"train_loader: num_workers=2 delivers 2.87x the batches/s of its own num_workers=0 (...)"."""
    current, answer = result.current_measurement, result.measurement(result.measured_answer)
    rate = f"{_rate(None if answer is None else answer.batches_per_second)} batches/s"
    why = "the smallest that keeps the step fed" if result.keeps_up else f"within {WITHIN * 100:.0f} % of the best"
    if current.error is not None:
        return f"{result.name}: its own {result.current.label()} failed; {result.answer.label()} delivers {rate}"
    if result.unchanged:
        return f"{result.name}: its own {result.current.label()} is the answer ({rate}, {why})"
    factor = result.factor
    spread = ""
    if len(result.factors) > 1:
        spread = (f" ({_times(min(result.factors))} to {_times(max(result.factors))} over "
                  f"{count(len(result.factors), 'round')})")
    if factor is None:
        return f"{result.name}: use {result.answer.label()} ({rate})"
    return (f"{result.name}: {result.answer.label()} delivers {_times(factor)} the batches/s of its own "
            f"{result.current.label()}{spread}; {why}")


def step_sentences(result: LoaderTuning) -> List[str]:
    """Whether the loader or the step bounds training, with the loader's own setting and with
    the answer: "the GPU step takes 40 ms a batch, the loader delivers one every 95 ms: the GPU
    waits 58 % of the time"."""
    step = result.step
    if step is None:
        return []
    gpu = "GPU " if result.device else ""
    waits = "the GPU" if result.device else "the step"
    said = [f"{gpu}step: {duration(step.seconds_per_batch)} a batch ({step.source})"]
    settings = [result.current_measurement.setting]
    if result.measured_answer != settings[0]:
        settings.append(result.measured_answer)
    for setting in settings:
        measurement = result.measurement(setting)
        rate = None if measurement is None else measurement.batches_per_second
        if rate is None:  # not measured, or failed
            continue
        together = step.together_rate(setting)
        bound, share = waiting(rate, step.seconds_per_batch, setting.num_workers, together)
        whose = "its own " if setting == settings[0] else ""
        interval = duration(1 / rate)
        took = f"the {gpu}step takes {duration(step.seconds_per_batch)} a batch"
        if setting.num_workers == 0:
            delivers = f"the loader makes each batch in {interval} between two steps"
        else:
            delivers = f"the loader delivers one every {interval}"
        how = (f"measured with both in the loop, {significant(together)} batches/s" if together is not None
               else "estimated" + ("" if setting.num_workers else ": nothing loads while the step runs"))
        verdict = (f"{waits} waits {share * 100:.0f} % of the time" if bound or share >= 0.05
                   else "the step bounds training")
        said.append(f"with {whose}{setting.label()}: {took}, {delivers}: {verdict} ({how})")
    return said


def _split_line(result: LoaderTuning) -> str:
    split = result.split
    parts = [f"__getitem__ {duration(split.fetch)} ({split.share('fetch') * 100:.0f} %)",
             f"collate_fn {duration(split.collate)} ({split.share('collate') * 100:.0f} %)"]
    if split.transfer is not None:
        parts.append(f"copy to {result.device} {duration(split.transfer)} ({split.share('transfer') * 100:.0f} %)")
    items = f", {significant(split.items)} items" if split.items and split.items != 1 else ""
    blocked = "" if split.fetch_blocked is None else \
        f"; __getitem__ blocked (on storage, the network) {split.fetch_blocked * 100:.0f} % of its time"
    return f"a batch in one process: {', '.join(parts)}{items}{blocked}"


def facts(result: LoaderTuning) -> List[str]:
    """The lines under the table: machine, method, where a batch's time goes, the step, what
    to paste, what would help, notes."""
    where = f"batches copied to {result.device}" if result.device else "batches stay on the CPU"
    lines = [f"cores: {result.cores} usable ({result.cores_how}); workers start by {result.start_method}; {where}",
             f"timed: {count(result.rounds, 'round')} of {result.seconds:g} s a setting after its start-up; "
             f"rates are the rounds' medians, ± half their range",
             _split_line(result)]
    if result.load is not None and result.load >= result.cores:
        spreads = [m.spread for m in result.measurements if m.spread is not None]
        varied = f": rates varied up to ±{max(spreads) * 100:.0f} % between rounds" if spreads else ""
        lines.append(f"busy machine: load average {result.load:.1f} on {count(result.cores, 'core')} before "
                     f"timing{varied}")
    lines += step_sentences(result)
    if result.unresolved:
        lines.append(f"not told apart from the answer in {count(result.rounds, 'round')}: "
                     f"{'; '.join(setting.label() for setting in result.unresolved)} reached the bar in some "
                     f"rounds (this machine's load varies; more repeats would decide)")
    lines += [f"what would help: {hint}" for hint in result.hints]
    lines += list(result.notes)
    return lines


def _errors(result: LoaderTuning) -> List[Tuple[str, str]]:
    return [(measurement.setting.label(), measurement.error) for measurement in result.measurements
            if measurement.error is not None]


def render_text(result: LoaderTuning) -> str:
    lines = [fold(render_line(result), 2), _table_text(result)]
    lines += [fold(fact, 2) for fact in facts(result)]
    lines.append("to paste:")
    lines.append("  " + result.call)
    for label, error in _errors(result):
        lines.append(f"{label} failed:")
        lines += ["    " + line for line in error.splitlines()]
    return "\n".join(lines)


TABLE_STYLE = ("<style>.cgpu-card.cgpu-loader tr td,.cgpu-card.cgpu-loader tr th{text-align:right;"
               "font-variant-numeric:tabular-nums;white-space:nowrap}"
               + "".join(f".cgpu-card.cgpu-loader tr td:nth-child({column}),"
                         f".cgpu-card.cgpu-loader tr th:nth-child({column}){{text-align:left}}"
                         for column, numeric in enumerate(NUMERIC, 1) if not numeric)
               + ".cgpu-card.cgpu-loader tr.cgpu-answer td{font-weight:bold}"
               ".cgpu-card.cgpu-loader pre{white-space:pre-wrap;font-size:12px;margin:2px 0}</style>")


def render_html(result: LoaderTuning) -> str:
    head = "".join(f"<th>{escape(cell)}</th>" for cell in HEADER)
    body = "".join(
        "<tr" + (" class='cgpu-answer'" if measurement.setting == result.measured_answer else "") + ">"
        + "".join(f"<td>{escape(cell)}</td>" for cell in row) + "</tr>"
        for measurement, row in zip(result.measurements, rows(result)))
    items = "".join(f"<li>{escape(fact)}</li>" for fact in facts(result))
    errors = "".join(f"<p>{escape(label)} failed:</p><pre>{escape(error)}</pre>" for label, error in _errors(result))
    return unbroken_units(
        STYLE + TABLE_STYLE + f"<div class='cgpu-card cgpu-loader'><h4>{escape(render_line(result))}</h4>"
        f"<table><tr>{head}</tr>{body}</table><ul class='cgpu-muted cgpu-facts'>{items}</ul>"
        f"<p>To paste:</p><pre>{escape(result.call)}</pre>{errors}{_chart_html(result)}</div>")


def _chart_html(result: LoaderTuning) -> str:
    try:
        png = chart_png(result)
    except ImportError:  # matplotlib missing or broken: the table says it all
        return ""
    if png is None:
        return ""
    return (f"<img alt='batches/s of each setting of {escape(result.name)}' "
            f"src='data:image/png;base64,{base64.b64encode(png).decode()}'>")


def chart_png(result: LoaderTuning) -> Optional[bytes]:
    """Each setting's batches/s as a bar, the rounds' range as its whisker, the answer and the
    loader's own setting marked, the step's rate as a line: PNG bytes."""
    rated = [(measurement, measurement.batches_per_second) for measurement in result.measurements]
    timed = [(measurement, rate) for measurement, rate in rated if rate is not None]
    if not timed:
        return None
    with neutral_style():
        return to_png(_figure(result, [measurement for measurement, _ in timed], [rate for _, rate in timed]),
                      dpi=80)


def _figure(result: LoaderTuning, timed: List[Measurement], medians: List[float]):
    """``timed``: the measured settings, ``medians`` their batches/s."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(7, 1.2 + 0.35 * len(timed)))
    axes = figure.subplots()
    whiskers = [[median - min(m.rates) for median, m in zip(medians, timed)],
                [max(m.rates) - median for median, m in zip(medians, timed)]]
    colours = ["tab:green" if m.setting == result.measured_answer
               else "tab:gray" if m.setting == result.current_measurement.setting else "tab:blue" for m in timed]
    places = list(range(len(timed)))
    axes.barh(places, medians, xerr=whiskers, color=colours, ecolor="#808080", capsize=3)
    axes.set_yticks(places)
    axes.set_yticklabels([m.setting.label() + (" (yours)" if m.setting == result.current_measurement.setting
                                               else "") for m in timed], fontsize="small")
    axes.invert_yaxis()
    if result.step is None:
        axes.axvline((1 - WITHIN) * max(medians), color="tab:green", linestyle=":", label=f"best - {WITHIN:.0%}")
    else:
        axes.axvline(1 / result.step.seconds_per_batch, color="tab:red", linestyle="--", label="training step")
    axes.set(xlabel="batches/s", title=f"{result.name}: batches/s by setting (green: the answer)")
    axes.legend(fontsize="small", loc="best")
    figure.tight_layout()
    return figure
