"""%%find_batch's figures say what they are, on a busy CPU too.

Tried on a CPU notebook: neighbouring sizes timed 10x apart with no word about it, a "capacity"
that changed every run (it is the RAM available as the search ran), a peak-memory chart of
dots at zero under a 15 GiB line, a legend over the data and samples/s under a "1e7".
"""
from __future__ import annotations

import collections
import re
import time

import pytest

from colab_gpu.batch import find_batch
from colab_gpu.batch.render import chart_figure, render_html
from colab_gpu.batch.result import FITS, OUT_OF_MEMORY, BatchResult, Trial
from colab_gpu.batch.trial import run_trial
from colab_gpu.render.chart import neutral_style

GiB, MiB = 1024 ** 3, 1024 ** 2


def sleeps(*pattern):
    """A step whose n-th run at a size sleeps pattern[n] seconds (the last one after that)."""
    calls = collections.Counter()

    def step(size):
        calls[size] += 1
        time.sleep(pattern[min(calls[size], len(pattern)) - 1])
    return step, calls


def test_timed_runs_that_disagree_are_run_again_and_the_report_says_by_how_much(capsys):
    # warm-up, then 2 ms and 100 ms; run again: 2 ms and 100 ms once more (the machine stays busy)
    step, calls = sleeps(0.001, 0.002, 0.1, 0.002, 0.1)
    result = find_batch(step, max=2, progress=True)
    trial = result.trials[0]
    assert calls[2] == trial.runs == 5  # the two timed runs, once more
    fastest, slowest = trial.timing_range
    assert 0.002 <= fastest < 0.05 and 0.1 <= slowest
    line = capsys.readouterr().out.split("\nbatch_size = 2")[0]  # the progress line, folded at 80
    assert line.startswith("trial  1: batch_size=     2  fits  peak") and all(len(part) <= 80 for part in line.splitlines())
    assert re.search(r"samples/s\s+\*runs took \d.* to \d.*\(\d+x\)$", line), line
    report = str(result)
    assert "ms*" in report.splitlines()[2]  # the time in the table, marked
    assert ("* timed runs that disagreed, and again when run once more (a busy machine?), so these times "
            "and samples/s are uncertain: batch_size=2: runs took") in " ".join(report.split())
    assert "uneven timed runs" in str(chart_figure(result, list(result.trials)).axes[1].get_legend_handles_labels())


def test_a_busy_moment_that_passed_keeps_the_calm_runs_and_says_nothing():
    step, calls = sleeps(0.001, 0.002, 0.1, 0.05, 0.05)
    trial, error = run_trial(step, 2, steps=3, device="cpu")
    assert error is None and trial.runs == calls[2] == 5
    assert trial.timing_range is None and 0.05 <= trial.seconds_per_step < 0.075
    steady, calls = sleeps(0.05)
    trial, error = run_trial(steady, 2, steps=3, device="cpu")
    assert trial.runs == calls[2] == 3 and trial.timing_range is None  # agreeing runs: no rerun


def result_of(trials, device="cpu", capacity=None, usable=None):
    fits = [t.size for t in trials if t.fits]
    return BatchResult("batch_size", "max", device, tuple(trials), answer=max(fits), largest_fitting=max(fits),
                       fastest=max(fits), capacity=capacity, usable=usable or capacity, fit=None,
                       stopped="reached max=64")


def test_the_capacity_is_named_for_what_it_is():
    """On the CPU without ulimit -v it is the RAM available as the search ran (it changes from
    one run to the next); under ulimit -v the limit; on a GPU the capacity."""
    ram = [Trial(2, FITS, peak_memory=300 * MiB, capacity=15 * GiB, capacity_kills=True,
                 seconds_per_step=0.01, runs=3)]
    assert "RAM available now: 15.00 GiB" in str(result_of(ram, capacity=15 * GiB))
    limited = [Trial(2, FITS, peak_memory=300 * MiB, capacity=4 * GiB, seconds_per_step=0.01, runs=3)]
    assert "address-space limit (ulimit -v): 4.00 GiB" in str(result_of(limited, capacity=4 * GiB))
    assert "\ncapacity: 4.00 GiB" in str(result_of(limited, device="cuda:0 (Tesla T4)", capacity=4 * GiB))
    real = find_batch(lambda size: None, max=8, device="cpu", progress=False)
    if real.trials[0].capacity_kills:  # Linux, no address-space limit
        assert "RAM available now: " in str(real) and "capacity:" not in str(real)


def drawn(result):
    """The chart's figure, drawn (so tick labels and offsets are what the PNG shows)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    with neutral_style():
        figure = chart_figure(result, [t for t in result.trials if t.fits])
        FigureCanvasAgg(figure).draw()
    return figure


def test_peaks_far_below_the_ram_are_charted_on_their_own_scale_and_the_ram_named():
    trials = [Trial(size, FITS, peak_memory=(300 + size) * MiB, capacity=15 * GiB, capacity_kills=True,
                    seconds_per_step=size * 1e-8, runs=3) for size in (2, 16, 64)]
    memory = drawn(result_of(trials, capacity=15 * GiB, usable=int(13.5 * GiB))).axes[0]
    assert memory.get_ylabel() == "MiB" and 364 < memory.get_ylim()[1] < 500  # the dots fill it
    assert not [line for line in memory.lines if list(line.get_ydata()) in ([15 * 1024] * 2, [15] * 2)]
    assert [text.get_text() for text in memory.texts] == ["RAM available now: 15.00 GiB, far above this scale"]
    # Near the capacity (a size ran out of memory): the line is drawn, on the capacity's scale.
    near = [Trial(2, FITS, peak_memory=GiB, capacity=15 * GiB, seconds_per_step=0.01, runs=3),
            Trial(64, OUT_OF_MEMORY, capacity=15 * GiB, runs=1)]
    memory = drawn(result_of(near, device="cuda:0 (Tesla T4)", capacity=15 * GiB)).axes[0]
    assert memory.get_ylabel() == "GiB" and not memory.texts
    assert "capacity" in memory.get_legend_handles_labels()[1]


def test_no_axis_has_an_offset_or_a_power_of_ten_and_no_legend_covers_the_data():
    """samples/s of a fast step (4e7) read 0.5 ... 4.0 under "1e7"; the memory legend sat on the
    points. Every tick label is a plain number, every legend below its panel."""
    trials = [Trial(size, FITS, peak_memory=GiB + size * 100 * MiB, capacity=16 * GiB,
                    seconds_per_step=size / 4e7, runs=3, timing_range=(size / 5e7, size / 3e7) if size == 32 else None)
              for size in (2, 8, 32, 64)] + [Trial(128, OUT_OF_MEMORY, capacity=16 * GiB, runs=1)]
    figure = drawn(result_of(trials, device="cuda:0 (Tesla T4)", capacity=16 * GiB, usable=15 * GiB))
    for axes in figure.axes:
        for axis in (axes.xaxis, axes.yaxis):
            assert axis.get_offset_text().get_text() == ""
            labels = [label.get_text() for label in axis.get_ticklabels() if label.get_text()]
            assert labels and not any("e" in label or "×" in label for label in labels), labels
        legend = axes.get_legend()
        assert legend is not None  # memory: peak, capacity, headroom, out of memory; speed: uneven runs
        assert legend.get_window_extent().y1 <= axes.get_window_extent().y0  # wholly below the panel
    rates = [label.get_text() for label in figure.axes[1].yaxis.get_ticklabels() if label.get_text()]
    assert any(label.endswith("M") for label in rates), rates
    assert "* uneven timed runs" in figure.axes[1].get_legend_handles_labels()[1]


@pytest.mark.parametrize("measure", [True, False])
def test_a_real_cpu_search_charts_without_error(measure):
    result = find_batch(lambda size: None, max=64, device="cpu", measure_memory=measure, progress=False)
    assert "<img alt=" in render_html(result)
    assert all(t.timing_range is None or t.runs == 5 for t in result.trials)
