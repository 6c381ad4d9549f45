"""The live monitor: sampler, history, page server, displays, and %gpu_status --live/--stop.

Sources are real recordings: the replay source, or NVML's own code (NvmlSource) over a
recording-fed stand-in of the pynvml module (tests/live_nvml.py).
"""
from __future__ import annotations

import base64
import copy
import dataclasses
import json
import os
import re
import socket
import subprocess
import sys
import textwrap
import threading
import time
import types
import urllib.error
import urllib.request

import pytest
from IPython.core.error import UsageError
from IPython.display import IFrame

from colab_gpu import live
from colab_gpu.devices.nvml import NvmlSource
from colab_gpu.devices.replay import ReplaySource, load_frames
from colab_gpu.live.panel import render_panel
from colab_gpu.live.render import chart_figure, chart_png
from colab_gpu.live.sampler import THREAD_NAME, Sampler, SourceError
from colab_gpu.live.server import LiveServer
from colab_gpu.live.terminal import watch
from colab_gpu.state import session

from conftest import DATA, ROOT
from live_nvml import RecordedNvml

V100 = DATA / "nvidia-smi-csv" / "v100s-pcie-32gb_miris.csv"
# Replays run at up to a thousand samples a second here; the tests of the floor users get take live_floor.
pytestmark = pytest.mark.usefixtures("fast_live_sampling")
NANOGPT = DATA / "nvidia-smi-csv" / "8gpu-training_nanogpt-pr643.csv"
DEMO = "nanogpt-8gpu-training_gpus0-3.csv"  # what --demo replays: a slice of NANOGPT, 4 of its GPUs


def live_threads():
    return [t for t in threading.enumerate() if t.name.startswith("colab_gpu")]


def wait_until(condition, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


@pytest.fixture(autouse=True)
def no_monitor_left():
    """Every test starts and ends without a running monitor or one of its threads."""
    live.stop()
    yield
    live.stop()
    wait_until(lambda: not live_threads(), timeout=5)


# --- the sampler ---------------------------------------------------------------------------


def test_sampler_fills_a_bounded_buffer_with_the_recorded_steps_then_stops():
    frames = load_frames(V100)
    sampler = Sampler(ReplaySource(V100, follow=True), interval=0.005, history=10).start()
    assert [t.name for t in live_threads()] == [THREAD_NAME]
    assert sampler.wait(24, timeout=10)
    sampler.stop()
    samples = sampler.samples()
    assert sampler.count >= 25 and len(samples) == 10  # the ring buffer keeps the last 10
    first_kept = sampler.count - 10
    expected = [frames[(first_kept + i) % len(frames)].gpus[0] for i in range(10)]
    assert [s.gpus[0].memory_used for s in samples] == [g.memory_used for g in expected]
    assert [s.gpus[0].utilization for s in samples] == [g.utilization_gpu for g in expected]
    assert sampler.gpu_names == {0: "Tesla V100S-PCIE-32GB"}
    assert all(a.time < b.time for a, b in zip(samples, samples[1:]))
    assert not sampler.running and live_threads() == []
    count = sampler.count
    time.sleep(0.05)
    assert sampler.count == count  # nothing sampled after stop


def test_sampler_reads_nvml_through_its_real_code_path():
    nvml = RecordedNvml(NANOGPT)
    source = NvmlSource(nvml=nvml)
    sampler = Sampler(source, interval=0.005).start()
    sampler.wait(3, timeout=10)
    sampler.stop()
    source.close()
    latest = sampler.latest()
    assert len(latest.gpus) == 8 and all(r.utilization == 100 for r in latest.gpus)
    frame = nvml.frames[(nvml.reads - 1) % len(nvml.frames)]  # the time step of the last read
    assert [r.temperature for r in latest.gpus] == [gpu.temperature for gpu in frame.gpus]
    assert all(r.temperature for r in latest.gpus)
    assert nvml.late_calls == []


def test_a_lost_gpu_stops_the_sampler_and_its_error_is_shown_once():
    nvml = RecordedNvml(V100, lose_gpu_after=3)
    sampler = Sampler(NvmlSource(nvml=nvml), interval=0.005)
    ends = []
    sampler.add_listener(lambda s: ends.append(s.running))
    sampler.start()
    wait_until(lambda: not sampler.running)
    assert sampler.count == 3  # the good reads are kept
    assert sampler.error == "GPU 0: a GPU fell off the bus: restart the runtime or the machine"
    assert ends[-1] is False  # the displays were told it ended
    assert live_threads() == []
    assert render_panel(sampler).count("fell off the bus") == 1
    lines = []
    watch(sampler, lines.append)
    assert lines[-1] == f"stopped: {sampler.error}"
    assert sum("fell off" in line for line in lines) == 1


class ThirdReadGoesWrong:
    """A replayed V100 source whose third read is ``third()``: a third-party source breaking
    its promise not to raise, or the Snapshot contract."""

    label = "third read goes wrong"

    def __init__(self, third):
        self.replay = ReplaySource(V100, follow=True)
        self.reads, self.third = 0, third

    def snapshot(self):
        self.reads += 1
        return self.replay.snapshot() if self.reads <= 2 else self.third()

    light_snapshot = snapshot  # the sampler's reads after the first

    def close(self):
        pass


def test_a_source_that_raises_stops_the_sampler_cleanly():
    def vanish():
        raise OSError("the device node vanished")

    source = ThirdReadGoesWrong(vanish)
    sampler = Sampler(source, interval=0.005).start()
    wait_until(lambda: not sampler.running)
    assert sampler.error == "OSError: the device node vanished"
    assert source.reads == 3 and sampler.count == 2
    sampler.stop()
    assert live_threads() == []


def test_a_sampler_thread_that_dies_ends_the_run_instead_of_claiming_to_run():
    sampler = Sampler(ThirdReadGoesWrong(object), interval=0.005).start()  # not a Snapshot
    wait_until(lambda: not sampler.running, timeout=5)
    assert sampler.error.startswith("AttributeError: ") and sampler.count == 2
    assert live_threads() == []
    lines = []
    watch(sampler, lines.append)
    assert lines[-1] == f"stopped: {sampler.error}"


def test_the_terminal_line_names_a_value_it_cannot_show():
    from colab_gpu.devices import GiB, MiB
    from colab_gpu.live.sampler import GPUReading, Sample
    from colab_gpu.live.terminal import sample_line

    sample = Sample(0.0, (GPUReading(0, 19.0, 966 * MiB, 32 * GiB, None, 27.0),
                          GPUReading(1, None, 1 * MiB, 32 * GiB, 45.0, None)))
    gpus = sample_line(sample, {}).split("  ", 1)[1]
    assert gpus == ("GPU0  19% 966 MiB/32.00 GiB power n/a 27 °C | "
                    "GPU1 busy n/a 1 MiB/32.00 GiB 45.0 W temperature n/a")


def test_the_terminal_line_says_memory_is_not_recorded_instead_of_n_a_slash_n_a():
    from colab_gpu.devices import MiB
    from colab_gpu.live.sampler import GPUReading, Sample
    from colab_gpu.live.terminal import sample_line

    # nanoGPT's 8-GPU log records no memory; plato's records memory used but not the total.
    sample = Sample(0.0, (GPUReading(0, 100.0, None, None, 387.3, 38.0),
                          GPUReading(1, 0.0, 1946 * MiB, None, 11.6, 27.0)))
    gpus = sample_line(sample, {}).split("  ", 1)[1]
    assert gpus == "GPU0 100% memory n/a 387.3 W 38 °C | GPU1   0% 1.90 GiB used 11.6 W 27 °C"


def test_eight_gpus_fit_the_terminal_one_gpu_under_another():
    """An 8-GPU sample on one 370-column line wraps in an 80- or 120-column terminal, the GPUs
    cut in the middle; each line now stays within the width, the GPUs aligned under the first."""
    from colab_gpu.live.sampler import Sample, reading_of
    from colab_gpu.live.terminal import sample_line

    frame = load_frames(DATA / "nvidia-smi-csv" / "8gpu-80gb-idle_gpu-glasses.csv")[0]
    sample = Sample(0.0, tuple(reading_of(gpu) for gpu in frame.gpus))
    for width in (80, 120):
        lines = sample_line(sample, {}, replay=True, width=width).splitlines()
        assert len(lines) > 1 and all(len(line) <= width for line in lines)
        assert re.findall(r"GPU(\d)", "\n".join(lines)) == list("01234567")
        assert len({line.index("GPU") for line in lines}) == 1  # one column
    assert "\n" not in sample_line(sample, {}, replay=True)  # no width: one line, as before


def test_a_source_that_cannot_be_read_at_all_does_not_start_a_thread(tmp_path):
    empty = tmp_path / "empty.csv"  # a missing file is refused before: ReplaySource raises
    empty.write_text("")
    with pytest.raises(SourceError, match="it is empty"):
        Sampler(ReplaySource(empty, follow=True)).start()
    assert live_threads() == []


def test_a_broken_display_is_dropped_without_stopping_the_recording_and_stop_says_why_it_froze():
    sampler, _ = live.start(demo=True, interval=0.005)

    def broken(_):
        raise RuntimeError("front end went away")

    sampler.add_listener(broken)
    sampler.wait(5, timeout=10)
    assert sampler.running and sampler.listener_error == "RuntimeError: front end went away"
    record = live.stop()
    assert record.headline().endswith("; a display stopped updating: RuntimeError: front end went away")


def test_invalid_interval_and_history_are_refused():
    for interval in (0, 3600.5, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="positive number of seconds up to 3600"):
            Sampler(ReplaySource(V100), interval=interval)
    with pytest.raises(ValueError, match="at least 1 sample"):
        Sampler(ReplaySource(V100), history=0)


# --- one sampler per process, history ---------------------------------------------------------


def test_start_reuses_the_running_sampler_and_history_returns_its_samples():
    sampler, started = live.start(demo=True, interval=0.005)
    again, started_again = live.start()
    assert started and not started_again and again is sampler
    # A notebook cell ending in live.start() showed "(<colab_gpu.live.sampler.Sampler object at 0x7f...>, True)".
    assert re.fullmatch(rf"<Sampler replay of {re.escape(DEMO)}: sampling every 0\.005 s, \d+ samples?>",
                        repr(sampler))
    assert sampler.label == f"replay of {DEMO}"
    sampler.wait(5, timeout=10)
    record = live.stop()
    samples = live.history(frame=False)
    assert samples == sampler.samples() and len(samples) == record.count >= 6
    assert repr(sampler) == f"<Sampler replay of {DEMO}: stopped, {record.count} samples>"
    assert live.stop() is None  # nothing left to stop


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(interval="1"), TypeError, "interval is a number of seconds, e.g. 1 or 0.5; not '1'"),
    (dict(interval=[1]), TypeError, "interval is a number of seconds, e.g. 1 or 0.5; not [1]"),
    (dict(interval=0), ValueError, "interval must be a number of seconds from 0.1 (NVML's counters"),
    (dict(interval=1e-7), ValueError, "interval must be a number of seconds from 0.1 (NVML's counters change "
                                      "every 1/6 s to 1 s) to 3600 (an hour), e.g. 1 or 0.5; not 1e-07"),
    (dict(history=2.5), TypeError, "history is a whole number of samples, e.g. 3600; not 2.5"),
    (dict(history="10"), TypeError, "history is a whole number of samples, e.g. 3600; not '10'"),
    (dict(history=0), ValueError, "history must be at least 1 sample, not 0"),
    (dict(path=3), TypeError, "path is a recording's file name (str, bytes or os.PathLike), not 3"),
    (dict(path=""), ValueError, "path='': give the recording's file name; accepted: an `nvidia-smi -q -x`"),
])
def test_start_with_a_wrong_option_names_the_keyword(live_floor, kwargs, error, message):
    """live.start(interval="1") raised "'<' not supported between instances of 'int' and 'str'",
    history=2.5 "an integer is required": neither said which argument was wrong; then
    history=0 said "the history length", a name the caller never wrote; path=3 "expected str,
    bytes or os.PathLike object, not int", path="" "replay of : cannot replay : no such file"."""
    with pytest.raises(error) as raised:
        live.start(**{"demo": "path" not in kwargs, **kwargs})
    assert str(raised.value).startswith(message)
    assert live.running() is None


def test_history_without_pandas_is_the_samples(monkeypatch):
    sampler, _ = live.start(demo=True, interval=0.005)
    sampler.wait(3, timeout=10)
    live.stop()
    monkeypatch.setitem(sys.modules, "pandas", None)  # as if pandas were not installed
    assert live.history() == sampler.samples()
    with pytest.raises(ImportError):
        live.history(frame=True)


def test_history_as_a_dataframe():
    pandas = pytest.importorskip("pandas", reason="pandas is not installed (the test extra has it)")
    sampler, _ = live.start(path=str(NANOGPT), interval=0.005)
    sampler.wait(3, timeout=10)
    live.stop()
    frame = live.history()
    # Units in the names, as the charts say them; nanoGPT's log has no memory: no column of NaN.
    assert list(frame.columns) == ["time", "gpu", "name", "busy (%)", "power (W)", "temperature (°C)"]
    assert len(frame) == 8 * sampler.count and sorted(set(frame["gpu"])) == list(range(8))
    assert frame["busy (%)"].eq(100).all() and frame["power (W)"].between(238, 425).all()
    assert pandas.api.types.is_datetime64_any_dtype(frame["time"])
    # The moment each sample was read, unambiguous in any time zone, to the interval's
    # resolution (a millisecond at 0.005 s), not to the nanosecond.
    first = live.history(frame=False)[0].time
    expected = pandas.Timestamp(first, unit="s", tz="UTC")
    assert abs(frame["time"].iloc[0] - expected) <= pandas.Timedelta(milliseconds=0.5)
    assert (frame["time"].astype("int64") % 1_000_000 == 0).all()
    assert str(frame["time"].dt.tz) == "UTC"


def test_history_gives_memory_in_mib_and_leaves_out_what_nothing_recorded():
    """history() showed the raw bytes (1147142144) under "memory_used", an all-NaN "power"
    column for a log without power, and times to the nanosecond that wrapped in a notebook."""
    pytest.importorskip("pandas", reason="pandas is not installed (the test extra has it)")
    sampler, _ = live.start(path=str(V100), interval=0.005)
    sampler.wait(20, timeout=10)
    live.stop()
    frame = live.history()
    assert list(frame.columns) == ["time", "gpu", "name", "busy (%)", "memory used (MiB)", "memory total (MiB)",
                                   "temperature (°C)"]  # the V100S log has no power
    readings = [sample.gpus[0] for sample in live.history(frame=False)]
    assert list(frame["memory used (MiB)"]) == [reading.memory_used / 2 ** 20 for reading in readings]
    assert frame["memory total (MiB)"].eq(32768).all() and frame["memory used (MiB)"].max() == 1094
    assert [live.time_resolution(interval) for interval in (0.1, 0.25, 0.5, 1, 2.5, 60, 3600)] == \
        [0.1, 0.1, 0.1, 1, 1, 1, 1]
    assert "0000" not in frame.to_string()  # no 1147142144 bytes, no .493000000 seconds


def test_the_run_record_summarises_and_draws_the_whole_run():
    sampler, _ = live.start(path=str(NANOGPT), interval=0.005)
    sampler.wait(4, timeout=10)
    record = live.stop()
    assert len(record.summaries()) == 8
    assert record.summaries()[0].line().startswith("GPU 0 name not recorded (cuda:0): busy 100% on average")
    # what print() shows, folded for an 80-column terminal
    assert str(record).splitlines()[2:4] == record.summaries()[0].line().replace("%; ", "%;\n  ").splitlines()
    png = chart_png(record)
    assert png.startswith(b"\x89PNG")
    html = record._repr_html_()
    assert "data:image/png;base64," in html and "Live monitor stopped" in html


IDLE_8GPU = DATA / "nvidia-smi-csv" / "8gpu-80gb-idle_gpu-glasses.csv"

# What each recording never holds (its header says so): the summary and the chart leave it out.
UNRECORDED = {"20gb-noheader_plato.csv": set(), "8gpu-80gb-idle_gpu-glasses.csv": {"busy"},
              "8gpu-training_nanogpt-pr643.csv": {"memory"}, "v100s-pcie-32gb_miris.csv": {"power"}}


@pytest.mark.parametrize("name", sorted(path.name for path in (DATA / "nvidia-smi-csv").glob("*.csv")))
def test_the_summary_and_chart_of_a_recording_leave_out_what_it_never_recorded(live_config, capsys, name):
    """nanoGPT's log has no memory: --stop printed "memory peak n/a of n/a" for each of its 8
    GPUs (and the chart an empty "not reported" panel), where the card leaves the row out."""
    run_live(live_config, f"--live --from {DATA / 'nvidia-smi-csv' / name} --interval 0.005",
             live_display="widgets")
    sampler = live.running()
    sampler.wait(5, timeout=10)
    capsys.readouterr()
    run_live(live_config, "--stop")
    summary = unfolded(capsys.readouterr().out)
    left_out = UNRECORDED[name]
    gpu_lines = [line for line in summary.splitlines() if line.startswith("GPU ")]
    assert gpu_lines and "n/a" not in summary, summary
    parts = {"busy": " on average, peak ", "memory": "memory peak ", "power": "power peak ",
             "temperature": "temperature peak "}
    for part, words in parts.items():
        assert all((words in line) == (part not in left_out) for line in gpu_lines), (part, summary)
    record = live.record_of(sampler)  # what --stop showed
    titles = [axes.get_title(loc="left").split(" (")[0] for axes in chart_figure(record).axes]
    assert titles == [part for part in ("busy", "memory used", "power", "temperature")
                      if part.split()[0] not in left_out]
    if left_out:  # from the live driver, n/a says a read failed: it stays
        assert "n/a" in str(dataclasses.replace(record, recorded=False))


def test_the_final_chart_draws_a_gpu_busy_100_percent_inside_its_panel_not_on_the_frame():
    sampler, _ = live.start(path=str(NANOGPT), interval=0.005)  # 8 GPUs at 100 % busy
    sampler.wait(4, timeout=10)
    figure = chart_figure(live.stop())
    for axes in figure.axes:
        bottom, top = axes.get_ylim()
        for line in axes.get_lines():
            assert all(bottom < y < top for y in line.get_ydata()), axes.get_title()
    busy = next(axes for axes in figure.axes if axes.get_title(loc="left") == "busy (%)")
    assert max(max(line.get_ydata()) for line in busy.get_lines()) == 100


def test_the_rolling_chart_stays_small_at_a_fast_interval_and_keeps_a_short_peak():
    from colab_gpu.live.panel import CHART_PANELS, chart_svg
    from colab_gpu.live.sampler import GPUReading, Sample

    # 300 s at --interval 0.1, 8 GPUs idle but for GPU 3 busy 100 % during one sample.
    samples = [Sample(t * 0.1, tuple(GPUReading(i, 100.0 if (i, t) == (3, 1234) else 0.0, None, None, None, None)
                                     for i in range(8))) for t in range(3000)]
    svg = chart_svg(samples, CHART_PANELS[0], width=320, height=110)
    lines = re.findall(r"points='([^']*)'", svg)
    assert len(lines) == 8
    assert all(len(points.split()) <= 2 * 320 for points in lines)  # at most two per pixel column
    assert len(svg) < 30_000  # what each update sends to the front end (was ~240 kB)
    heights = [{float(point.split(",")[1]) for point in points.split()} for points in lines]
    assert len(heights[3]) == 2  # GPU 3's one-sample peak survived the per-column reduction
    assert all(len(h) == 1 and min(heights[3]) < min(h) for i, h in enumerate(heights) if i != 3)


def test_the_final_chart_of_an_overflowed_buffer_counts_seconds_from_the_runs_start():
    sampler, _ = live.start(demo=True, interval=0.01, history=5)
    sampler.wait(30, timeout=10)
    record = live.stop()
    assert record.count > 30 and len(record.samples) == 5
    first_kept = record.samples[0].time - record.started_at
    busy = chart_figure(record).axes[0]
    assert busy.get_lines()[0].get_xdata()[0] == pytest.approx(first_kept)
    assert first_kept > 0.25  # about 26 samples at 0.01 s were dropped before it


def test_the_readme_says_the_final_chart_draws_the_samples_kept():
    """The chart draws the buffer (above): the README promised "a static chart of the whole
    run", which a three-hour training run's chart (its last hour at 1 s) is not."""
    readme = (ROOT / "README.md").read_text()
    (row,) = [line for line in readme.splitlines() if line.startswith("| `--stop` |")]
    assert "chart of the whole run" not in readme and "live_history" in row, row


def test_the_summary_of_an_overflowed_buffer_gives_the_whole_runs_peaks_and_means():
    """A two-hour run kept its last hour (GPUMagics.live_history): --stop gave the peak memory
    and mean busy % of that hour as the run's, missing the early peak a user looks for."""
    from colab_gpu.render import size

    frames = load_frames(V100)  # peaks at step 17 (about 1.07 GiB, 19 % busy), then 1 MiB idle
    sampler, _ = live.start(path=str(V100), interval=0.005, history=10)
    sampler.wait(40, timeout=10)
    record = live.stop()
    taken = [frames[step % len(frames)].gpus[0] for step in range(record.count)]
    summary = record.summaries()[0]
    assert summary.memory_peak == max(gpu.memory_used for gpu in taken) == frames[17].gpus[0].memory_used
    assert summary.utilization_peak == max(gpu.utilization_gpu for gpu in taken)
    assert summary.utilization_mean == pytest.approx(sum(gpu.utilization_gpu for gpu in taken) / len(taken))
    assert f"memory peak {size(frames[17].gpus[0].memory_used)} of 32.00 GiB" in str(record)
    assert copy.deepcopy(record) == record and dataclasses.asdict(record)["totals"][0]["busy_count"] == record.count


def test_the_final_chart_of_a_long_run_counts_minutes_or_hours_not_thousands_of_seconds():
    from colab_gpu.live.record import RunRecord
    from colab_gpu.live.sampler import GPUReading, Sample

    def record(seconds, every):
        samples = tuple(Sample(1000.0 + t, (GPUReading(0, 50.0, None, None, None, None),))
                        for t in range(0, seconds + 1, every))
        return RunRecord("NVML", every, samples, {0: "Tesla T4"}, 1000.0, 1000.0 + seconds, None, len(samples))

    for seconds, every, label, last in ((120, 1, "seconds since start", 120),
                                        (3600, 10, "minutes since start", 60),
                                        (10 * 3600, 10, "hours since start", 10)):
        busy, _, power, _ = chart_figure(record(seconds, every)).axes
        assert power.get_xlabel() == label  # the bottom row carries the x axis' label
        assert busy.get_lines()[0].get_xdata()[-1] == pytest.approx(last)


def test_the_final_chart_of_an_hour_on_eight_gpus_draws_no_more_points_than_pixels_and_keeps_spikes():
    """3600 samples x 8 GPUs were drawn point by point (3.5-5 s at --stop); at most two points
    per pixel column, its lowest and highest, look the same, a one-sample spike and dip included."""
    from colab_gpu.live.record import RunRecord
    from colab_gpu.live.sampler import GPUReading, Sample

    def busy(index, t):
        return {(3, 1234): 100.0, (5, 2345): 0.0}.get((index, t), 50.0 + (t % 7))

    samples = tuple(Sample(1000.0 + t, tuple(GPUReading(i, busy(i, t), None, None, 70.0, 40.0) for i in range(8)))
                    for t in range(3600))
    record = RunRecord("NVML", 1.0, samples, {i: "Tesla T4" for i in range(8)}, 1000.0, 4600.0, None, 3600)
    figure = chart_figure(record)
    figure.canvas.draw()
    for axes in figure.axes:
        pixels = axes.get_window_extent().width
        assert all(len(line.get_xdata()) <= 2 * pixels for line in axes.get_lines()), axes.get_title()
    lines = figure.axes[0].get_lines()
    assert [line.get_label() for line in lines] == [f"GPU {i}" for i in range(8)]
    assert max(lines[3].get_ydata()) == 100 and min(lines[5].get_ydata()) == 0
    spike = lines[3].get_xdata()[list(lines[3].get_ydata()).index(100)]
    assert spike == pytest.approx(1234 / 60)  # where it happened, in minutes since the start
    assert min(lines[0].get_ydata()) == 50 and max(lines[0].get_ydata()) == 56
    assert list(lines[0].get_xdata()) == sorted(lines[0].get_xdata())  # in time order


def test_a_run_of_one_sample_says_1_sample():
    sampler, _ = live.start(demo=True, interval=60)  # the first sample, read at the start
    assert "sampling every 60&nbsp;s, 1 sample over 0.0&nbsp;s" in render_panel(sampler)  # no break in "60 s"
    record = live.stop()
    assert record.headline().startswith("Live monitor stopped: 1 sample every 60 s ")
    assert repr(record).endswith(": 1 sample over 0.0 s>")


def test_a_stopped_panel_and_the_summary_say_the_same_number_of_samples_over_the_same_time():
    sampler, _ = live.start(demo=True, interval=0.05)
    wait_until(lambda: sampler.count >= 6)  # a run of a fraction of a second or so
    record = live.stop()
    samples, seconds = re.search(r"stopped: (\d+ samples) every 0.05 s over ([0-9.]+) s", record.headline()).groups()
    assert f"{samples} over {seconds}&nbsp;s" in render_panel(sampler)  # it said "over 0 s" or "1 s"


def test_the_live_and_the_stopped_charts_read_alike_and_from_afar():
    """The live chart had 10 px grey labels (dimmer still in a dark theme), no time axis and
    memory in %, where the --stop chart said GiB; its columns shifted as values changed width."""
    sampler, _ = live.start(path=str(V100), interval=0.005)
    sampler.wait(20, timeout=10)
    panel = render_panel(sampler)
    record = live.stop()
    live_titles = re.findall(r"aria-label='([^']*)'", panel)
    stopped = chart_figure(record)
    assert live_titles == [axes.get_title(loc="left") for axes in stopped.axes] == [
        "busy (%)", "memory used (GiB)", "temperature (°C)"]  # the V100S log has no power
    assert panel.count("seconds since start") == 3 and stopped.axes[-1].get_xlabel() == "seconds since start"
    # The same scale: memory up to the GPU's 32 GiB, ticked in GiB.
    memory = re.search(r"aria-label='memory used \(GiB\)'.*?</svg>", panel).group(0)
    assert re.findall(r"text-anchor='end'>(\d+)</text>", memory) == ["0", "10", "20", "30"]
    assert stopped.axes[1].get_ylim()[1] == pytest.approx(1.05 * 32)
    # Text in the theme's own colour, large enough, digits of one width.
    assert ".cgpu-live svg text{fill:currentColor;font-size:13px" in panel and "tabular-nums" in panel
    # Each number in a right-aligned box: "5%" ends where "100%" does.
    row = re.search(r"<tr><td><b style='color:[^']*'>&#9632;</b> GPU&nbsp;0.*?</tr>", panel).group(0)
    boxes = re.findall(r"<span class='cgpu-num' style='min-width:(\d)ch'>([^<]*)</span>", row)
    assert [width for width, _ in boxes] == ["4", "5", "6"], row
    assert re.fullmatch(r"\d+%", boxes[0][1]) and re.fullmatch(r"\d+\.\d\d", boxes[1][1])
    assert "</span> / 32.00&nbsp;GiB</td>" in row  # memory in GiB, as the chart draws it


def test_the_rolling_chart_draws_100_and_0_percent_inside_its_frame():
    from colab_gpu.live.panel import CHART_PANELS, chart_svg
    from colab_gpu.live.sampler import GPUReading, Sample

    samples = [Sample(float(t), (GPUReading(0, 100.0, None, None, None, None),
                                 GPUReading(1, 0.0, None, None, None, None))) for t in range(10)]
    svg = chart_svg(samples, CHART_PANELS[0], width=320, height=110)
    busy, idle = ({float(point.split(",")[1]) for point in points.split()}
                  for points in re.findall(r"points='([^']*)'", svg))
    assert len(busy) == len(idle) == 1
    assert 0 < busy.pop() < idle.pop() < 110  # the frame's edges are y=0 and y=110


def test_the_rolling_chart_at_a_slow_interval_still_draws_a_line():
    """At --interval 600 (an overnight run kept whole in the history) the 300 s window held
    one sample: the chart drew a one-point line, nothing, for the whole run."""
    from colab_gpu.live.sampler import GPUReading, Sample

    class SlowSampler:
        label, recorded, running, error, stop_reason, torch_view = "NVML", False, True, None, None, None
        interval, count, started_at, stopped_at, gpu_names = 600.0, 6, 0.0, None, {0: "Tesla T4"}

        def samples(self):
            return tuple(Sample(600.0 * t, (GPUReading(0, 10.0 * t, t * 2 ** 30, 16 * 2 ** 30, 70.0, 60.0),))
                         for t in range(6))

    panel = render_panel(SlowSampler(), now=3000.0)
    lines = re.findall(r"points='([^']*)'", panel)
    assert len(lines) == 4 and all(len(points.split()) >= 2 for points in lines)  # busy, memory, power, temperature
    # 50 minutes shown, on the time axis the final chart has
    assert panel.count("minutes since start") == 4 and ">10</text>" in panel and ">50</text>" in panel


def test_the_rolling_chart_of_a_value_the_source_lacks_says_not_reported():
    from colab_gpu.live.panel import CHART_PANELS, chart_svg

    busy, memory = CHART_PANELS[:2]
    sampler, _ = live.start(path=str(NANOGPT), interval=60)  # nanoGPT's log has no memory
    samples = sampler.samples()
    assert ">not reported</text>" in chart_svg(samples, memory)
    assert "text-anchor='end'" not in chart_svg(samples, memory)  # no made-up 0-1 scale, as the PNG
    assert "not reported" not in chart_svg(samples, busy)
    assert "not reported" not in chart_svg((), busy)  # nothing sampled yet


@pytest.mark.parametrize("name", sorted(UNRECORDED))
def test_the_live_panel_of_a_recording_leaves_out_the_columns_and_charts_it_never_recorded(live_config, name):
    """nanoGPT's log has no memory: each GPU's row in the live widget said "n/a / n/a" beside
    an empty bar, under an empty "memory used %" chart; the card leaves the row out."""
    run_live(live_config, f"--live --from {DATA / 'nvidia-smi-csv' / name} --interval 0.005",
             live_display="widgets")
    live.running().wait(5, timeout=10)
    run_live(live_config, "--stop")  # the widget keeps its last state
    panel = session.live_shown[1].value  # the widget shown for the run
    left_out = UNRECORDED[name]
    header = re.search(r"<tr class='cgpu-muted'>(.*?)</tr>", panel).group(1)
    assert re.findall(r"<td>([a-z ]+)</td>", header) == [
        column for column in ("busy", "memory used", "power", "temperature") if column.split()[0] not in left_out]
    assert re.findall(r"aria-label='([^']*)'", panel) == [
        title for title in ("busy (%)", "memory used (GiB)", "power (W)", "temperature (°C)")
        if title.split()[0] not in left_out]
    assert "n/a" not in panel and "not reported" not in panel


def test_the_chart_names_each_gpu_when_utilization_is_not_reported(monkeypatch):
    """8 idle A100s whose log has no utilization: the legend sat on the empty "busy" panel, so
    the eight lines went unnamed and matplotlib printed "No artists with labels found"."""
    import warnings

    from matplotlib.figure import Figure

    drawn = []
    save = Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda figure, *args, **kwargs: (
        drawn.append(figure), save(figure, *args, **kwargs))[1])
    sampler, _ = live.start(path=str(IDLE_8GPU), interval=0.005)
    sampler.wait(3, timeout=10)
    record = live.stop()
    assert record.summaries()[0].utilization_peak is None  # this log has no busy %
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        chart_png(record)
    (legend,) = [axes.get_legend() for axes in drawn[0].axes if axes.get_legend() is not None]
    assert [text.get_text() for text in legend.get_texts()] == [f"GPU {index}" for index in range(8)]


def test_nvml_is_shut_down_only_after_the_sampler_thread_ended():
    """In-process: the order atexit will use (sampler.stop, then the source's close)."""
    nvml = RecordedNvml(V100, delay=0.02)
    source = NvmlSource(nvml=nvml)
    sampler = Sampler(source, interval=0.001).start()
    sampler.wait(3, timeout=10)
    nvml.on_shutdown = lambda: nvml.late_calls.extend(("sampler alive", t.name) for t in live_threads())
    sampler.stop()
    source.close()
    assert nvml.late_calls == []


EXIT_SCRIPT = textwrap.dedent("""
    import atexit, sys, threading
    # Registered first, so it runs last: what is left once every exit handler has run.
    atexit.register(lambda: print("left:", sorted(t.name for t in threading.enumerate())))
    sys.path.insert(0, {tests!r})
    from live_nvml import RecordedNvml
    import colab_gpu.devices
    from colab_gpu import live
    from colab_gpu.devices.nvml import NvmlSource

    nvml = RecordedNvml({path!r}, delay=0.02)
    colab_gpu.devices.open_source = lambda path=None: NvmlSource(nvml=nvml)
    nvml.on_shutdown = lambda: print("alive at NVML shutdown:",
        [t.name for t in threading.enumerate() if t.name.startswith("colab_gpu")])
    atexit.register(lambda: print("late NVML calls:", nvml.late_calls))
    sampler, _ = live.start(interval=0.1)
    live.page_server()
    sampler.wait(5, timeout=10)
    print("running:", sampler.running, [t.name for t in threading.enumerate() if t.name.startswith("colab_gpu")])
""")


def test_interpreter_exit_with_the_sampler_running_is_clean():
    script = EXIT_SCRIPT.format(tests=str(ROOT / "tests"), path=str(V100))
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""  # no traceback, no "exception in thread"
    out = done.stdout.splitlines()
    assert out[0] == "running: True ['colab_gpu-sampler', 'colab_gpu-live-page']"
    assert "alive at NVML shutdown: []" in out
    assert "late NVML calls: []" in out
    assert out[-1] == "left: ['MainThread']"


# --- the live page ------------------------------------------------------------------------


def fetch(url):
    with urllib.request.urlopen(url, timeout=5) as response:
        return response.status, response.headers["Content-Type"], response.read()


def test_the_page_server_listens_on_localhost_only_and_serves_only_its_paths():
    sampler = Sampler(ReplaySource(V100, follow=True), interval=0.01).start()
    server = LiveServer(sampler).start()
    try:
        host, port = server.address
        assert host == "127.0.0.1" and server.url == f"http://127.0.0.1:{port}/"
        status, kind, page = fetch(server.url)
        assert status == 200 and kind.startswith("text/html")
        assert b"<script>" in page and b"data.json" in page
        assert b"http://" not in page and b"https://" not in page  # no CDN, no network
        sampler.wait(3, timeout=10)
        status, kind, body = fetch(server.url + "data.json")
        state = json.loads(body)
        assert status == 200 and kind == "application/json"
        assert state["running"] and state["count"] >= 3 and state["error"] is None
        assert state["title"].startswith("REPLAY of a recorded trace")
        assert state["latest"]["gpus"][0]["memory_total"] == 32768 * 1024 ** 2
        assert "<svg" in state["panel"] and "polyline" in state["panel"]
        for path in ("favicon.ico", "data.json/../../etc/passwd", "index.htm", "live/page.html"):
            with pytest.raises(urllib.error.HTTPError) as error:
                fetch(server.url + path)
            assert error.value.code == 404
    finally:
        server.stop()
        sampler.stop()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2)
    assert live_threads() == []


# --- %gpu_status --live in the real IPython shell -----------------------------------------------


def unfolded(text):
    """Printed text with the lines folded for an 80-column terminal joined again."""
    return text.replace("\n  ", " ")


def run_live(shell, line, **config):
    for name, value in config.items():
        shell.run_line_magic("config", f"GPUMagics.{name} = {value!r}")
    return shell.run_line_magic("gpu_status", line)


@pytest.fixture
def live_config(shell):
    yield shell
    for name, value in (("live_lines", 0), ("live_display", "auto"), ("live_interval", 1.0),
                        ("live_history", 3600)):
        shell.run_line_magic("config", f"GPUMagics.{name} = {value!r}")


def test_start_refuses_a_path_and_the_demo_together():
    """live.start(path=..., demo=True) replayed the bundled trace and dropped the user's file
    without a word; the magic refuses --from with --demo."""
    with pytest.raises(ValueError, match="give one"):
        live.start(path=str(NANOGPT), demo=True)
    assert live.running() is None


def test_a_start_from_another_source_while_one_runs_is_refused_not_answered_with_the_old_one(
        live_config, capsys):
    """start(path=other) and --live --from other.csv returned the running demo without a word:
    the user read the demo's numbers as their recording's. The same source or none reuses it."""
    run_live(live_config, "--live --demo --interval 0.02", live_display="widgets")
    demo = live.running()
    with pytest.raises(live.AlreadyRunning) as raised:
        live.start(path=str(NANOGPT))
    assert str(raised.value) == (
        "the live monitor is already running (replay of nanogpt-8gpu-training_gpus0-3.csv, every 0.02 s), one per "
        f"kernel: colab_gpu.live.stop() ends it before path={str(NANOGPT)!r} can start")
    with pytest.raises(UsageError, match=r"^the live monitor is already running \(replay of nanogpt-8gpu-training_gpus0-3.csv, "
                       r"every 0.02 s\), one per kernel: %gpu_status --stop ends it before --from '.*nanogpt-pr643.csv' "
                       r"can start$"):
        run_live(live_config, f"--live --from {NANOGPT} --cells")
    assert cell_hooks(live_config) == []  # nothing of the refused start was left behind
    assert live.start(demo=True) == (demo, False) and live.start() == (demo, False)
    assert live.start(path=live.DEMO_TRACE) == (demo, False)
    live.stop()
    run_live(live_config, f"--live --from {NANOGPT} --interval 0.02")
    with pytest.raises(live.AlreadyRunning, match=r"ends it before demo=True can start$"):
        live.start(demo=True)
    with pytest.raises(UsageError, match=r"ends it before --demo can start$"):
        run_live(live_config, "--live --demo")
    capsys.readouterr()
    run_live(live_config, f"--live --from {NANOGPT}")
    assert "already running (replay of 8gpu-training_nanogpt-pr643.csv" in capsys.readouterr().out


def test_a_start_at_another_interval_while_one_runs_is_refused_not_ignored(live_config, capsys):
    """--live --interval 0.5 and start(interval=0.5) while a monitor sampled every 0.02 s
    returned it unchanged: the user read its samples as taken at the interval they asked for.
    No interval (or GPUMagics.live_interval, which is for a new monitor) reuses it as before."""
    run_live(live_config, "--live --demo --interval 0.02", live_display="widgets")
    demo = live.running()
    with pytest.raises(UsageError, match=r"^the live monitor is already running \(replay of nanogpt-8gpu-training_gpus0-3.csv, "
                       r"every 0.02 s\), one per kernel: %gpu_status --stop ends it before --interval 0.5 can start$"):
        run_live(live_config, "--live --interval 0.5 --cells")
    assert cell_hooks(live_config) == []
    with pytest.raises(live.AlreadyRunning, match=r"colab_gpu.live.stop\(\) ends it before interval=0.5 can start$"):
        live.start(demo=True, interval=0.5)
    with pytest.raises(live.AlreadyRunning, match=r"before interval=5 can start$"):  # as the caller wrote it
        live.start(interval=5)
    assert live.start() == (demo, False) and live.start(demo=True, interval=0.02) == (demo, False)
    capsys.readouterr()
    run_live(live_config, "--live --interval 0.02")
    run_live(live_config, "--live", live_interval=0.5)
    assert capsys.readouterr().out.count("already running (replay of nanogpt-8gpu-training_gpus0-3.csv, every 0.02 s)") == 2
    assert live.running() is demo
    live.stop()
    assert live.start(demo=True)[0].interval == 1.0  # a new monitor's default


def test_a_refused_interval_is_read_back_as_typed(live_config):
    """--live --interval 2 while a monitor ran was refused "before --interval 2.0 can start":
    the converted float, not the number the user typed."""
    run_live(live_config, "--live --demo --interval 0.02", live_display="widgets")
    with pytest.raises(UsageError, match=r"ends it before --interval 2 can start$"):
        run_live(live_config, "--live --interval 2")
    with pytest.raises(UsageError, match=r"ends it before --interval 2.0 can start$"):
        run_live(live_config, "--live --interval 2.0")
    run_live(live_config, "--live --interval 0.02")  # the same interval, however spelt, reuses it
    live.stop()


def test_a_start_with_another_history_while_one_runs_is_refused_not_ignored(live_config, capsys):
    """start(history=100) while a monitor keeps 3600 samples returned it unchanged: the user's
    charts kept an hour, not the 100 samples asked for. GPUMagics.live_history, a setting for
    the next monitor, reuses a running one, as live_interval does."""
    demo, started = live.start(demo=True, interval=0.02)
    assert started and demo.history == 3600
    with pytest.raises(live.AlreadyRunning, match=r"colab_gpu.live.stop\(\) ends it before history=100 can start$"):
        live.start(history=100)
    assert live.start(history=3600) == (demo, False)
    run_live(live_config, "--live", live_history=100, live_display="widgets")
    assert "already running (replay of nanogpt-8gpu-training_gpus0-3.csv, every 0.02 s)" in capsys.readouterr().out
    assert live.running() is demo
    live.stop()
    assert live.start(demo=True, history=100)[0].history == 100


def test_terminal_live_demo_prints_a_replay_line_per_sample(live_config, capsys):
    run_live(live_config, "--live --demo --interval 0.02", live_lines=3)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "colab_gpu: a line every 0.02 s; it stops after 3 lines or at Ctrl-C"  # said first
    samples = [line for line in lines if "REPLAY" in line]
    assert len(samples) == 3
    assert all(re.search(r"GPU0 cuda:0 +\d+% memory n/a [\d.]+ W \d+ °C", line) for line in samples)
    end = next(number for number, line in enumerate(lines) if line.startswith("Live monitor stopped: "))
    assert f"replay of {DEMO}" in " ".join(lines[end:end + 2])
    assert lines[end + 2].startswith("GPU 0 name not recorded (cuda:0): busy")
    assert live.running() is None and live_threads() == []


def test_live_from_a_file_replays_it_and_config_sets_the_defaults(live_config, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "120")  # the terminal's width: an 8-GPU sample takes several lines
    run_live(live_config, f"--live --from {NANOGPT}", live_lines=4, live_interval=0.03, live_history=2)
    lines = capsys.readouterr().out.splitlines()
    end = next(number for number, line in enumerate(lines) if line.startswith("Live monitor stopped: "))
    samples = []  # each sample: its first line (the clock) and the lines indented under it
    assert lines[0] == "colab_gpu: a line every 0.03 s; it stops after 4 lines or at Ctrl-C"
    for line in lines[1:end]:
        if re.match(r"\d\d:\d\d:\d\d  ", line):
            samples.append([line])
        else:
            assert line.startswith(" " * 10) and samples, line
            samples[-1].append(line)
    assert len(samples) == 4 and all(len(sample) > 1 for sample in samples)  # 8 GPUs need several lines
    for sample in samples:
        assert all(len(line) <= 120 for line in sample)
        text = " ".join(sample)
        assert re.findall(r"GPU(\d) cuda:\1 100% ", text) == [str(index) for index in range(8)]
    assert "(the last 2 kept) every 0.03 s" in lines[end]
    assert len(live.history(frame=False)) == 2


def card_labels(card: str) -> dict:
    """GPU -> how the static card names it: "GPU 1  Tesla T4  (cuda:0, compute capability ..."."""
    return {int(index): label for index, label in re.findall(r"^GPU (\d+)  .+?  \((.+?), compute capability", card, re.M)}


def line_labels(text: str) -> dict:
    """GPU -> its label in the live terminal lines: "GPU1 cuda:0  19% ..."."""
    return {int(index): label for index, label in re.findall(r"GPU(\d+) (cuda:\d+|cuda:\?|hidden from torch) ", text)}


def panel_labels(panel: str) -> dict:
    """GPU -> its label in a live panel row: "GPU&nbsp;1 <span ...>Tesla T4 &middot; cuda:0</span>"."""
    return {int(index): label for index, label in re.findall(r"GPU&nbsp;(\d+) <span class='cgpu-muted'>[^<]*? &middot; ([^<]+)</span>", panel)}


def test_a_replay_labels_its_gpus_as_the_card_does_whatever_this_machines_cuda_visible_devices(
        live_config, capsys, monkeypatch):
    """The live views said GPU0..GPU7 where the card of the same recording says cuda:0..cuda:7;
    a recording is another machine's, so CUDA_VISIBLE_DEVICES here hides none of its GPUs, on
    the card or in the live views."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    monkeypatch.setenv("COLUMNS", "400")
    live_config.run_line_magic("gpu_status", f"--from {NANOGPT}")
    card = card_labels(capsys.readouterr().out)
    assert card == {index: f"cuda:{index}" for index in range(8)}
    run_live(live_config, f"--live --from {NANOGPT}", live_lines=2, live_interval=0.02)
    out = capsys.readouterr().out
    assert line_labels(out) == card
    assert {int(i): label for i, label in re.findall(r"^GPU (\d) name not recorded \((.+?)\): busy", out, re.M)} == card
    run_live(live_config, "--live --demo --interval 0.02", live_display="widgets")  # the panel
    try:
        live_config.run_line_magic("gpu_status", f"--from {live.DEMO_TRACE}")
        assert panel_labels(render_panel(live.running())) == card_labels(capsys.readouterr().out) == {
            index: f"cuda:{index}" for index in range(4)}
    finally:
        live.stop()


@pytest.fixture
def nvml_box(monkeypatch):
    """Makes ``%gpu_status`` and ``--live`` read this NVML box (real recordings through the
    pynvml stand-in) instead of this machine's NVML."""
    import colab_gpu.devices
    import colab_gpu.gpu_status
    from test_multigpu import box

    sources = []

    def use(*recordings):
        source = box(*recordings)
        sources.append(source)
        for module in (colab_gpu.devices, colab_gpu.gpu_status):
            monkeypatch.setattr(module, "default_source", lambda: source)

    yield use
    live.stop()
    for source in sources:
        source.close()


def test_gpus_hidden_by_cuda_visible_devices_are_marked_as_the_card_marks_them(live_config, capsys, monkeypatch, nvml_box):
    """Kaggle's two T4s, this kernel on GPU 1 (CUDA_VISIBLE_DEVICES=1): the card says GPU 0 is
    hidden from torch and GPU 1 is cuda:0; the live panel, lines, --cells and summary said
    "GPU 0" and "GPU 1" as if both were this kernel's."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    nvml_box("tesla-t4.xml", "tesla-t4.xml")
    live_config.run_line_magic("gpu_status", "")
    card = card_labels(capsys.readouterr().out)
    assert card == {0: "hidden from torch", 1: "cuda:0"}
    run_live(live_config, "--live", live_lines=2, live_interval=0.02)
    out = capsys.readouterr().out
    assert line_labels(out) == card and "REPLAY" not in out
    assert "GPU 0 Tesla T4 (hidden from torch): busy" in out and "GPU 1 Tesla T4 (cuda:0): busy" in out
    run_live(live_config, "--live --cells", live_display="widgets", live_interval=0.02)
    assert panel_labels(render_panel(live.running())) == card
    capsys.readouterr()
    live_config.run_cell("import time; time.sleep(0.2)")
    cell_line = unfolded(capsys.readouterr().out).strip().splitlines()[-1]
    assert "GPU 0 (hidden from torch) peak " in cell_line and "GPU 1 (cuda:0) peak " in cell_line


def test_a_mixed_box_numbered_fastest_first_says_cuda_unknown_and_why_as_the_card_does(
        live_config, capsys, monkeypatch, nvml_box):
    """An RTX 3060 and a 3090, CUDA_DEVICE_ORDER unset: the card cannot tell which is cuda:0."""
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    nvml_box("rtx-3060-v12.xml", "rtx-3090-v12.xml")
    live_config.run_line_magic("gpu_status", "")
    out = capsys.readouterr().out
    why = "cuda:? - CUDA numbers these different GPUs fastest first"
    assert card_labels(out) == {0: "cuda:?", 1: "cuda:?"} and out.count(why) == 1  # the why once
    run_live(live_config, "--live", live_lines=1, live_interval=0.02)
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "colab_gpu: a line every 0.02 s; it stops after 1 line or at Ctrl-C"
    assert out[1] == why and line_labels("\n".join(out[2:])) == {0: "cuda:?", 1: "cuda:?"}  # the why once
    assert sum(why in line for line in out) == 2  # ... and once under the summary
    run_live(live_config, "--live", live_display="widgets", live_interval=0.02)
    panel = render_panel(live.running())
    assert panel_labels(panel) == {0: "cuda:?", 1: "cuda:?"} and panel.count(why) == 1
    assert str(live.stop()).splitlines()[-1] == why


def test_live_from_a_path_under_the_home_folder_written_with_a_tilde(live_config, capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "gpu.csv").write_bytes(V100.read_bytes())
    run_live(live_config, "--live --from ~/gpu.csv", live_lines=1, live_interval=0.03)
    assert "REPLAY  GPU0 " in capsys.readouterr().out
    live_config.run_line_magic("gpu_status", "--from ~/gpu.csv")
    assert "Tesla V100S-PCIE-32GB" in capsys.readouterr().out


def test_ctrl_c_ends_the_terminal_display_and_stops_the_monitor(live_config, capsys):
    import _thread

    def press_ctrl_c_once_lines_show():  # not before: it would stop the magic's start instead
        try:
            wait_until(lambda: getattr(live.running(), "count", 0) >= 4)
        finally:  # always: the display would wait for it forever
            _thread.interrupt_main()

    presser = threading.Thread(target=press_ctrl_c_once_lines_show, daemon=True)
    presser.start()
    run_live(live_config, "--live --demo --interval 0.05")
    presser.join()
    out = capsys.readouterr().out
    assert out.count("REPLAY") >= 3 and "Live monitor stopped" in out
    assert live.running() is None and live_threads() == []


def test_ctrl_c_on_a_monitor_shown_again_in_a_terminal_ends_the_display_not_the_monitor(live_config, capsys):
    """--live in a terminal on a monitor a script started with live.start() printed its lines;
    Ctrl-C (or GPUMagics.live_lines reached) then stopped the script's monitor too."""
    import _thread

    sampler, _ = live.start(demo=True, interval=0.02)
    run_live(live_config, "--live", live_lines=2)
    out = capsys.readouterr().out
    assert out.count("REPLAY") == 2 and "Live monitor stopped" not in out
    assert "\ncolab_gpu: a line every 0.02 s; 2 lines or Ctrl-C end them, not the monitor\n" in out
    assert unfolded(out).endswith("colab_gpu: the live monitor goes on sampling in the background (replay of "
                                  "nanogpt-8gpu-training_gpus0-3.csv, every 0.02 s); %gpu_status --stop ends it\n")
    assert live.running() is sampler

    def press_ctrl_c_once_lines_show(after=sampler.count + 4):
        try:
            wait_until(lambda: sampler.count >= after)
        finally:
            _thread.interrupt_main()

    presser = threading.Thread(target=press_ctrl_c_once_lines_show, daemon=True)
    presser.start()
    run_live(live_config, "--live", live_lines=0)
    presser.join()
    out = capsys.readouterr().out
    assert "\ncolab_gpu: a line every 0.02 s; Ctrl-C ends the lines, not the monitor\n" in out
    assert "goes on sampling in the background" in out and "Live monitor stopped" not in out
    assert live.running() is sampler
    run_live(live_config, "--stop")
    assert capsys.readouterr().out.startswith("Live monitor stopped: ")


def test_the_terminal_says_ctrl_c_stops_the_monitor_when_it_starts(live_config, capsys):
    """A student in a terminal saw lines scroll with no word of how to end them."""
    run_live(live_config, "--live --demo --interval 0.02", live_lines=1)
    assert capsys.readouterr().out.startswith("colab_gpu: a line every 0.02 s; it stops after 1 line or at Ctrl-C\n")
    session = live_config.magics_manager.registry["GPUMagics"].live_session()
    with pytest.MonkeyPatch.context() as patch:  # no limit: Ctrl-C is the only way out
        patch.setattr("colab_gpu.live.terminal.watch", lambda *args: 0)
        session.show(live.start(demo=True, interval=0.02)[0], "terminal", 0, started=True)
    assert capsys.readouterr().out.startswith("colab_gpu: a line every 0.02 s; Ctrl-C stops it\n")


@pytest.fixture
def notebook_shell(live_config, monkeypatch):
    """The shell as a notebook's kernel runs it: (the shell, what it displayed, what it
    updated), each a list of (object, keyword arguments)."""
    shown, updated = [], []
    monkeypatch.setattr(live_config, "kernel", object(), raising=False)  # a notebook, not a terminal
    monkeypatch.setattr("IPython.display.display", lambda *objects, **kwargs: shown.extend(
        (shown_object, kwargs) for shown_object in objects))
    monkeypatch.setattr("IPython.display.update_display", lambda data, **kwargs: updated.append((data, kwargs)))
    return live_config, shown, updated


def stopped_bundle(updated, display_id):
    """The one update of the display ``display_id``: what a saved notebook keeps of it."""
    (bundle, kwargs), = [(data, kwargs) for data, kwargs in updated if kwargs["display_id"] == display_id]
    assert kwargs == {"raw": True, "display_id": display_id}
    return bundle


@pytest.mark.parametrize("kind", ["widgets", "page"])
def test_in_a_notebook_the_stop_turns_the_live_display_into_html_and_a_png(notebook_shell, kind):
    """A notebook saved with the live widget showed "Error displaying widget: model not found"
    where the monitor had run, once reopened (JupyterLab, Notebook 7, even after --stop): a
    widget's view needs its kernel. The stop replaces every display of the run (each --live
    shows it again) by its last state, static HTML with the run's chart, and the PNG alone."""
    shell, shown, updated = notebook_shell
    run_live(shell, "--live --demo --interval 0.02", live_display=kind)
    run_live(shell, "--live")  # shown again: replaced alike
    displays = [kwargs.get("display_id") for _, kwargs in shown]
    assert len(displays) == 2 and displays[0] == displays[1] and displays[0].startswith("colab-gpu-live-")
    sampler = live.running()
    sampler.wait(5, timeout=10)
    assert updated == []  # while it runs, the display moves on its own
    run_live(shell, "--stop")
    bundle = stopped_bundle(updated, displays[0])
    assert sorted(bundle) == ["image/png", "text/html", "text/plain"]  # no widget view, no IFrame
    assert re.fullmatch(rf"Live GPU monitor \(replay of {re.escape(DEMO)}\): stopped at \d\d:\d\d:\d\d by "
                        rf"%gpu_status --stop, {sampler.count} samples over [\d.]+ s", bundle["text/plain"])
    html = bundle["text/html"]
    assert "REPLAY of a recorded trace" in html and "GPU&nbsp;3" in html  # the panel's last state
    assert "<svg" not in html and f"src='data:image/png;base64,{bundle['image/png']}'" in html
    assert base64.b64decode(bundle["image/png"]).startswith(b"\x89PNG")
    (stop_card,) = [shown_object for shown_object, _ in shown[2:]]
    assert isinstance(stop_card, live.RunRecord)  # --stop's summary, as before
    run_live(shell, "--live --demo --interval 0.02", live_display=kind)
    assert shown[-1][1]["display_id"] != displays[0]  # a new run: a display of its own
    live.stop()
    assert len(updated) == 2


def test_a_run_that_stops_by_itself_turns_its_display_static_at_once(notebook_shell, monkeypatch):
    """A lost GPU ends the run without a stop(): a notebook saved then kept the widget."""
    import colab_gpu.devices

    shell, shown, updated = notebook_shell
    source = NvmlSource(nvml=RecordedNvml(V100, lose_gpu_after=3))
    monkeypatch.setattr(colab_gpu.devices, "default_source", lambda: source)
    try:
        run_live(shell, "--live --interval 0.01", live_display="widgets")
        wait_until(lambda: updated)  # the GPU fell off the bus, and no stop() came
        assert live.running() is None
        bundle = stopped_bundle(updated, shown[0][1]["display_id"])
        assert "stopped by itself" in bundle["text/plain"] and "fell off the bus" in bundle["text/html"]
    finally:
        live.stop()
        source.close()


def test_in_a_terminal_the_live_display_is_printed_and_nothing_is_replaced(live_config, monkeypatch, capsys):
    updated = []
    monkeypatch.setattr("IPython.display.update_display", lambda data, **kwargs: updated.append(data))
    run_live(live_config, "--live --demo --interval 0.02", live_display="widgets")
    run_live(live_config, "--stop")
    assert updated == [] and capsys.readouterr().out.count("Live GPU monitor") == 1


def test_widgets_follow_the_sampler_and_stop_leaves_a_chart(live_config, capsys):
    run_live(live_config, "--live --demo --interval 0.02", live_display="widgets")
    sampler = live.running()
    assert sampler is not None and sampler.interval == 0.02
    assert "Live GPU monitor (replay of nanogpt-8gpu-training_gpus0-3.csv)" in capsys.readouterr().out  # its text form in a terminal
    run_live(live_config, "--live")
    assert live.running() is sampler
    assert "already running (replay of nanogpt-8gpu-training_gpus0-3.csv, every 0.02 s)" in capsys.readouterr().out
    sampler.wait(5, timeout=10)
    run_live(live_config, "--stop")
    out = capsys.readouterr().out
    assert out.startswith("Live monitor stopped: ") and live.running() is None
    run_live(live_config, "--stop")
    assert capsys.readouterr().out == "colab_gpu: the live monitor is not running\n"


def test_running_the_live_cell_again_draws_the_panel_once_per_update_not_once_per_run_of_the_cell(
        live_config, capsys, monkeypatch):
    """Each --live in a notebook added a widget that the sampler thread redrew after every
    sample until --stop: re-running the cell five times drew the panel five times per update,
    holding the GIL against the training loop five times as long."""
    from colab_gpu.live import widget

    drawn = []
    monkeypatch.setattr(widget, "render_panel", lambda sampler: drawn.append(sampler.count) or "")
    for _ in range(5):
        run_live(live_config, "--live --demo --interval 0.02", live_display="widgets")
    sampler = live.running()
    drawn.clear()
    sampler.wait(sampler.count + 3, timeout=10)
    live.stop()
    assert len(drawn) == len(set(drawn))  # no sample's state drawn twice
    assert f"Live GPU monitor (replay of {DEMO})" in capsys.readouterr().out  # each run still shows it


def test_the_widget_value_changes_as_samples_arrive():
    from colab_gpu.live.widget import live_widget

    sampler, _ = live.start(path=str(NANOGPT), interval=0.01)
    widget = live_widget(sampler)
    first = widget.value
    assert "REPLAY of a recorded trace" in first and first.count("<svg") == 3  # the log has no memory
    sampler.wait(sampler.count + 3, timeout=10)
    wait_until(lambda: widget.value != first)
    live.stop()
    wait_until(lambda: re.search(r"stopped at \d\d:\d\d:\d\d, \d+ samples", widget.value))


def test_the_widget_redraws_at_most_twice_a_second_at_a_fast_interval_and_draws_the_end():
    from colab_gpu.live.widget import live_widget

    sampler, _ = live.start(path=str(NANOGPT), interval=0.002)
    widget = live_widget(sampler)
    values = []
    widget.observe(lambda change: values.append(change["new"]), names="value")
    started = time.monotonic()
    sampler.wait(sampler.count + 150, timeout=10)
    live.stop()
    elapsed = time.monotonic() - started
    assert len(values) <= elapsed / 0.5 + 2  # not one redraw per sample (150 of them)
    assert "stopped at " in values[-1]  # the end of the run is always drawn


def test_a_display_that_cannot_be_shown_leaves_no_monitor_running(live_config, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ipywidgets", None)  # as if ipywidgets were not installed
    run_live(live_config, "--live --demo --cells", live_display="widgets")
    assert "colab_gpu: ipywidgets could not be imported" in capsys.readouterr().err
    assert live.running() is None and live_threads() == []
    assert cell_hooks(live_config) == []


def test_a_display_that_cannot_be_shown_on_a_running_monitor_leaves_no_cells_lines(live_config, monkeypatch, capsys):
    """--live --cells on a monitor a script had started, where the display failed (no
    ipywidgets): the error said nothing was shown, yet every later cell printed its line and,
    with CUDA started, reset torch's peak counters. The running monitor itself goes on."""
    sampler, _ = live.start(demo=True, interval=0.02)
    monkeypatch.setitem(sys.modules, "ipywidgets", None)
    run_live(live_config, "--live --cells", live_display="widgets")
    assert "colab_gpu: ipywidgets could not be imported" in capsys.readouterr().err
    assert cell_hooks(live_config) == [] and live.running() is sampler
    run_live(live_config, "--live --cells", live_display="terminal")  # one that shows it stays on
    assert len(cell_hooks(live_config)) == 2 and live.running() is sampler
    live.stop()
    assert cell_hooks(live_config) == []


def test_unload_ext_stops_the_monitor_and_shows_its_summary(live_config, capsys):
    run_live(live_config, "--live --demo --interval 0.02", live_display="widgets")
    sampler = live.running()
    sampler.wait(3, timeout=10)
    capsys.readouterr()
    live_config.run_line_magic("unload_ext", "colab_gpu")
    try:
        assert live.running() is None and live_threads() == []
        out = capsys.readouterr().out.splitlines()
        assert out[0].startswith(f"Live monitor stopped: {sampler.count} samples every 0.02 s")
        assert out[1] == "  replay of nanogpt-8gpu-training_gpus0-3.csv"  # the headline, folded at 80 columns
        assert out[2].startswith("GPU 0 name not recorded (cuda:0): busy")
        assert len(live.history(frame=False)) == sampler.count  # the samples stay
    finally:
        live_config.run_line_magic("load_ext", "colab_gpu")


def test_reload_ext_shows_the_summary_of_the_run_it_stopped(live_config, capsys):
    run_live(live_config, "--live --demo --interval 0.02", live_display="widgets")
    live.running().wait(3, timeout=10)
    capsys.readouterr()
    live_config.run_line_magic("reload_ext", "colab_gpu")
    assert live.running() is None
    assert capsys.readouterr().out.startswith("Live monitor stopped: ")
    run_live(live_config, "--stop")  # the reloaded extension has nothing left to stop
    assert capsys.readouterr().out == "colab_gpu: the live monitor is not running\n"


def test_unload_ext_stops_a_monitor_a_script_started_and_shows_its_summary(live_config, capsys):
    """A monitor started with colab_gpu.live.start() (no %gpu_status --live before) went on
    sampling after %unload_ext and %reload_ext, which README says stop it."""
    for magic in ("unload_ext", "reload_ext"):
        sampler, _ = live.start(demo=True, interval=0.02)
        sampler.wait(3, timeout=10)
        capsys.readouterr()
        live_config.run_line_magic(magic, "colab_gpu")
        if magic == "unload_ext":
            live_config.run_line_magic("load_ext", "colab_gpu")
        assert live.running() is None and live_threads() == []
        assert capsys.readouterr().out.startswith(f"Live monitor stopped: {sampler.count} samples every 0.02 s")
        assert sampler.stop_reason == "%unload_ext or %reload_ext colab_gpu"  # what its page says


def test_colab_shows_the_live_page_through_the_kernel_port(live_config, monkeypatch, capsys):
    served = []
    output = types.ModuleType("google.colab.output")
    output.serve_kernel_port_as_iframe = lambda port, **kwargs: served.append(port)
    monkeypatch.setitem(sys.modules, "google.colab.output", output)
    monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    monkeypatch.setitem(sys.modules, "google", types.ModuleType("google"))
    sys.modules["google.colab"].output = output
    sys.modules["google"].colab = sys.modules["google.colab"]
    monkeypatch.setenv("COLAB_RELEASE_TAG", "release-colab-20260801")
    monkeypatch.setattr(live_config, "kernel", object(), raising=False)  # Colab's notebook, not a terminal
    run_live(live_config, "--live --demo --interval 0.02")
    assert len(served) == 1
    status, _, body = fetch(f"http://127.0.0.1:{served[0]}/data.json")
    assert json.loads(body)["label"] == "replay of nanogpt-8gpu-training_gpus0-3.csv"
    run_live(live_config, "--stop")
    assert live.running() is None
    wait_until(lambda: refused(served[0]), timeout=live.FINAL_STATE_SECONDS + 5)  # a few seconds later


def test_colab_variables_without_google_colab_show_the_page_in_an_iframe(live_config, monkeypatch, capsys):
    """An IPython from another environment on a Colab machine: COLAB_RELEASE_TAG is set, but
    google.colab cannot be imported; --live said "pip install google", an unrelated package."""
    monkeypatch.setitem(sys.modules, "google", None)
    monkeypatch.setenv("COLAB_RELEASE_TAG", "release-colab-20260801")
    monkeypatch.setattr(live_config, "kernel", object(), raising=False)  # a notebook's kernel
    shown = []
    monkeypatch.setattr("IPython.display.display", lambda *objects, **kwargs: shown.extend(objects))
    run_live(live_config, "--live --demo --interval 0.02")
    (frame,) = shown
    assert isinstance(frame, IFrame) and "pip install" not in capsys.readouterr().err
    assert json.loads(fetch(frame.src.rstrip("/") + "/data.json")[2])["label"].startswith("replay of")
    run_live(live_config, "--stop")


@pytest.mark.parametrize("variable", ["COLAB_RELEASE_TAG", "KAGGLE_KERNEL_RUN_TYPE", "BINDER_SERVICE_HOST"])
def test_ipython_in_a_terminal_on_a_notebook_platform_prints_a_line_per_sample(live_config, monkeypatch, capsys,
                                                                              variable):
    """`ipython` in a Binder, Kaggle or Colab terminal: --live showed a widget's one line of text
    (Binder, Kaggle) or a page's address for a browser on a machine the user is not at (Colab),
    and the monitor ran on unseen; README: a terminal gets a compact line per sample."""
    monkeypatch.setenv(variable, "1")
    shown = []
    monkeypatch.setattr("IPython.display.display", lambda *objects, **kwargs: shown.extend(objects))
    run_live(live_config, "--live --demo --interval 0.02", live_lines=2)
    assert capsys.readouterr().out.count("REPLAY") == 2
    assert [type(shown).__name__ for shown in shown] == ["RunRecord"]  # the summary; no widget, no page
    assert live.running() is None


def test_the_live_page_says_its_address_where_the_iframe_cannot_be_drawn(live_config, monkeypatch):
    """GPUMagics.live_display = 'page' in a terminal: IPython showed the IFrame's text,
    "<IPython.lib.display.IFrame at 0x7f3344222e50>", not where the page is."""
    shown = []
    monkeypatch.setattr("IPython.display.display", lambda *objects, **kwargs: shown.extend(objects))
    run_live(live_config, "--live --demo --interval 0.02", live_display="page")
    (frame,) = shown
    text = live_config.display_formatter.format(frame)[0]["text/plain"]
    assert " ".join(text.split()) == (
        f"Live GPU monitor (replay of nanogpt-8gpu-training_gpus0-3.csv) at {live.live_url()}, for a browser "
        f"on this machine; %gpu_status --stop leaves its summary and chart")
    assert all(len(line) <= 80 for line in text.splitlines()), text
    assert isinstance(frame, IFrame) and frame.src == live.live_url()  # the notebook's view
    assert f'src="{live.live_url()}"' in frame._repr_html_()
    run_live(live_config, "--stop")



def in_a_thread(make):
    """What ``make()`` returns when called from a fresh thread, as the sampler's and the page's
    threads draw: no context variable of the caller (as_magic) is set there."""
    made = []
    thread = threading.Thread(target=lambda: made.append(make()))
    thread.start()
    thread.join()
    return made[0]


def test_a_script_that_started_the_monitor_is_told_the_python_call_that_stops_it(live_config, monkeypatch):
    """colab_gpu.live.start() from Python: the widget's text and the cell lines said
    "%gpu_status --stop" to a caller that never used the magics; the magic's texts stay."""
    from colab_gpu.live.cells import CellPeaks
    from colab_gpu.live.widget import live_widget

    sampler, _ = live.start(demo=True, interval=0.02)
    text = " ".join(in_a_thread(lambda: repr(live_widget(sampler))).split())
    assert text == ("Live GPU monitor (replay of nanogpt-8gpu-training_gpus0-3.csv); colab_gpu.live.stop() "
                    "leaves its summary and chart")
    peaks = CellPeaks(live.running)
    live.stop()
    peaks.before()
    assert in_a_thread(peaks.after) == ("cell GPU memory: CUDA not started by this process and the "
                                        "live monitor has stopped; colab_gpu.live.stop() says why")
    shown = []
    monkeypatch.setattr("IPython.display.display", lambda *objects, **kwargs: shown.extend(objects))
    run_live(live_config, "--live --demo --interval 0.02", live_display="widgets")
    assert in_a_thread(lambda: repr(shown[0])).endswith("; %gpu_status --stop leaves its summary and chart")
    run_live(live_config, "--stop")

def test_the_stop_hint_names_the_way_the_one_shown_the_monitor_stops_it(live_config, monkeypatch, capsys):
    """A monitor a script started with colab_gpu.live.start(), then shown by %gpu_status
    --live, told the notebook user "colab_gpu.live.stop()" (the hint was fixed when the
    monitor started); one the magic started, shown by a script, told it "%gpu_status --stop"."""
    from colab_gpu.live.widget import live_widget

    shown = []
    monkeypatch.setattr("IPython.display.display", lambda *objects, **kwargs: shown.extend(objects))
    live.start(demo=True, interval=0.02)
    run_live(live_config, "--live --cells", live_display="terminal")
    assert unfolded(capsys.readouterr().out).endswith("%gpu_status --stop ends it\n")
    run_live(live_config, "--live", live_display="widgets")
    assert repr(shown[-1]).endswith("; %gpu_status --stop leaves its summary and chart")
    run_live(live_config, "--live", live_display="page")
    assert " ".join(repr(shown[-1]).split()).endswith("; %gpu_status --stop leaves its summary and chart")
    live.stop()
    run_live(live_config, "--live --demo --interval 0.02", live_display="widgets")
    assert repr(live_widget(live.running())).endswith("; colab_gpu.live.stop() leaves its summary and chart")
    run_live(live_config, "--stop")


def live_port(url: str) -> int:
    return int(url.rstrip("/").rsplit(":", 1)[1])


def refused(port) -> bool:
    """Whether 127.0.0.1:``port`` refuses connections (its server has closed)."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except OSError:
        return True
    return False


def test_after_stop_the_live_page_says_when_and_why_the_run_stopped(live_config, monkeypatch, capsys):
    """The page kept the last "sampling every 0.02 s" header after --stop: its server closed
    before the page could poll the end of the run."""
    monkeypatch.setattr(live, "FINAL_STATE_SECONDS", 0.5, raising=False)
    run_live(live_config, "--live --demo --interval 0.02", live_display="page")
    url = live.page_server().url
    assert not refused(live_port(url))
    state = json.loads(fetch(url + "data.json")[2])
    assert state["running"] and "sampling every 0.02&nbsp;s" in state["panel"]
    live.running().wait(3, timeout=10)
    run_live(live_config, "--stop")
    summary = capsys.readouterr().out
    state = json.loads(fetch(url + "data.json")[2])  # what the page's next poll gets
    assert not state["running"] and "sampling" not in state["panel"]
    header = re.search(r"stopped at (\d\d:\d\d:\d\d) by %gpu_status --stop, (\d+) samples", state["panel"])
    assert header, state["panel"]
    assert abs(time.time() - time.mktime(time.strptime(time.strftime("%Y-%m-%d ") + header[1], "%Y-%m-%d %H:%M:%S"))) < 5
    assert f"Live monitor stopped: {header[2]} samples" in summary  # the same run --stop summarised
    wait_until(lambda: refused(live_port(url)), timeout=5)  # then the server goes


def cell_hooks(shell):
    return [f for event in ("pre_run_cell", "post_run_cell") for f in shell.events.callbacks[event]
            if getattr(f, "__qualname__", "").startswith("LiveSession.watch_cells")]


def test_cells_prints_one_line_per_cell_and_stop_removes_the_hooks(live_config, capsys):
    run_live(live_config, f"--live --from {V100} --cells --interval 0.02", live_display="widgets")
    assert len(cell_hooks(live_config)) == 2
    capsys.readouterr()
    live_config.run_cell("import time; time.sleep(0.3)")
    line = unfolded(capsys.readouterr().out).strip().splitlines()[-1]
    # A replay's numbers are a recording's: the line never passes them off as this cell's GPU.
    assert line.startswith("cell GPU memory (REPLAY of a recorded trace (v100s-pcie-32gb_miris.csv), "
                           "not this machine's GPU, ")
    assert "GPU 0 (cuda:0) peak " in line and "NVML" not in line
    live_config.run_cell("%gpu_status --stop")
    capsys.readouterr()
    live_config.run_cell("x = 1")
    assert "cell GPU memory" not in capsys.readouterr().out
    assert cell_hooks(live_config) == []


def test_cells_line_from_nvml_says_it_is_the_whole_gpu(live_config, monkeypatch, capsys):
    import colab_gpu.devices

    source = NvmlSource(nvml=RecordedNvml(V100))
    monkeypatch.setattr(colab_gpu.devices, "default_source", lambda: source)
    try:
        run_live(live_config, "--live --cells --interval 0.02", live_display="widgets")
        capsys.readouterr()
        live_config.run_cell("import time; time.sleep(0.3)")
        line = unfolded(capsys.readouterr().out).strip().splitlines()[-1]
        assert line.startswith("cell GPU memory (NVML, all processes, ")
        assert "GPU 0 (cuda:0) peak " in line and "CUDA not started by this process" in line
    finally:
        live.stop()
        source.close()


def test_cells_lines_in_a_terminal_fit_80_columns_on_an_nvml_box(live_config, monkeypatch, capsys):
    """A real GPU's line ("cell GPU memory (NVML, all processes, 12 samples; CUDA not started
    by this process): GPU 0 (cuda:0) peak ...") ran past 120 columns after every cell, and the
    terminal broke it mid-word; so did the line saying the monitor samples in the background."""
    import colab_gpu.devices

    source = NvmlSource(nvml=RecordedNvml(V100))
    monkeypatch.setattr(colab_gpu.devices, "default_source", lambda: source)
    try:
        run_live(live_config, "--live --cells --interval 0.02", live_display="terminal")
        live_config.run_cell("import time; time.sleep(0.3)")
        out = capsys.readouterr().out
        assert [line for line in out.splitlines() if len(line) > 80] == [], out
        said = unfolded(out).splitlines()
        assert said[0].startswith("colab_gpu: the live monitor samples in the background (")
        assert said[-1].startswith("cell GPU memory (NVML, all processes, ") and "GPU 0 (cuda:0) peak " in said[-1]
    finally:
        live.stop()
        source.close()


class MemoryLevels:
    """The V100 recording with its memory used set by the test: ``level`` bytes, or the next
    of ``queue`` while it lasts (a cell's short peak)."""

    label = "memory levels"

    def __init__(self, level):
        self.replay = ReplaySource(V100, follow=True)
        self.level, self.queue = level, []

    def snapshot(self):
        import dataclasses

        used = self.queue.pop(0) if self.queue else self.level
        snapshot = self.replay.snapshot()
        return dataclasses.replace(snapshot, gpus=tuple(dataclasses.replace(gpu, memory_used=used)
                                                        for gpu in snapshot.gpus))

    light_snapshot = snapshot

    def close(self):
        self.replay.close()


def test_cells_line_of_a_cell_longer_than_the_history_gives_its_whole_peak_and_change(
        live_config, monkeypatch, capsys):
    """A training cell longer than GPUMagics.live_history samples (an hour at 1 s): its line
    took the peak, the change and the count from the samples the buffer still held, the last
    hour's, and measured the change from the first of them instead of from the cell's start."""
    import colab_gpu.devices
    from colab_gpu.devices import GiB

    source = MemoryLevels(2 * GiB)
    monkeypatch.setattr(colab_gpu.devices, "default_source", lambda: source)
    run_live(live_config, "--live --cells --interval 0.005", live_display="widgets", live_history=5)
    sampler = live.running()
    live_config.user_ns.update(source=source, sampler=sampler, GiB=GiB)
    capsys.readouterr()
    # The cell peaks at 20 GiB for three samples, then holds 4 GiB for thirty more.
    live_config.run_cell("source.queue, source.level = [20 * GiB] * 3, 4 * GiB\n"
                         "sampler.wait(sampler.count + 33, timeout=10)")
    line = capsys.readouterr().out.strip().splitlines()[-1]
    taken = int(re.search(r"(\d+) samples", line)[1])
    assert taken >= 33
    assert line.endswith("GPU 0 (cuda:0) peak 20.00 GiB used (+2.00 GiB)")


@pytest.mark.parametrize("reads", [1, 2, 3, 4])
def test_a_cells_line_read_while_the_sampler_thread_tallies_a_sample_is_whole(reads):
    """The sampler thread tallies the sample taken as a cell ends while the main thread builds
    the cell's line (removing the listener does not wait for it): the line raised KeyError
    when it landed between the tally's peak and last, or named no GPU between its count and
    its peak. Here the line is built at the ``reads``-th read of the sample's memory."""
    from colab_gpu.live.cells import CellPeaks

    lines = []

    class Reading:
        index, seen = 0, 0

        @property
        def memory_used(self):
            Reading.seen += 1
            if Reading.seen == reads:  # the main thread runs here, as after a GIL switch
                lines.append(peaks.after())
            return 3 * 2 ** 30

    class Sampler:
        count, recorded, label, torch_view, listeners = 0, True, "replay of a trace", None, []

        def latest(self):
            return type("Sample", (), {"gpus": (Reading(),)})() if self.count else None

        add_listener, remove_listener = listeners.append, listeners.remove

    sampler = Sampler()
    peaks = CellPeaks(lambda: sampler)
    peaks.before()
    (tally,) = sampler.listeners
    sampler.count = 1
    tally(sampler)
    if not lines:  # the tally read the memory fewer times: the line comes after it
        lines.append(peaks.after())
    assert lines in ([None], ["cell GPU memory (REPLAY of a recorded trace (a trace), not this "
                              "machine's GPU, 1 sample): GPU 0 peak 3.00 GiB used (+0 B)"]), lines


def test_cells_in_a_terminal_samples_in_the_background_so_later_cells_get_their_line(live_config, capsys):
    run_live(live_config, "--live --demo --cells --interval 0.02", live_display="terminal", live_lines=3)
    out = capsys.readouterr().out
    assert "REPLAY" not in out and "Live monitor stopped" not in out  # the prompt came back at once
    assert "samples in the background" in out and live.running() is not None
    live_config.run_cell("import time; time.sleep(0.3)")
    assert unfolded(capsys.readouterr().out).strip().splitlines()[-1].startswith("cell GPU memory (REPLAY")
    live_config.run_cell("%gpu_status --stop")
    assert "Live monitor stopped" in capsys.readouterr().out and cell_hooks(live_config) == []


def test_cells_says_once_that_the_monitor_stopped_by_itself(live_config, monkeypatch, capsys):
    import colab_gpu.devices

    source = NvmlSource(nvml=RecordedNvml(V100, lose_gpu_after=3))
    monkeypatch.setattr(colab_gpu.devices, "default_source", lambda: source)
    try:
        run_live(live_config, "--live --cells --interval 0.01", live_display="widgets")
        wait_until(lambda: live.running() is None)  # the GPU fell off the bus
        capsys.readouterr()
        for cell in ("x = 1", "y = 2", "z = 3"):
            live_config.run_cell(cell)
        lines = [line for line in unfolded(capsys.readouterr().out).splitlines()
                 if line.startswith("cell GPU memory")]
        assert lines == ["cell GPU memory: CUDA not started by this process and the live monitor has "
                         "stopped; %gpu_status --stop shows why and ends these lines"]
        live_config.run_cell("%gpu_status --stop")
        assert "fell off the bus" in capsys.readouterr().out
    finally:
        live.stop()
        source.close()


def test_a_new_live_start_first_shows_the_summary_of_the_run_that_stopped_by_itself(
        live_config, monkeypatch, capsys):
    """After a lost GPU, the next --live replaced the run unseen: its summary was never shown
    and --stop then summarised the new run only."""
    import colab_gpu.devices

    source = NvmlSource(nvml=RecordedNvml(V100, lose_gpu_after=3))
    monkeypatch.setattr(colab_gpu.devices, "default_source", lambda: source)
    try:
        run_live(live_config, "--live --interval 0.01", live_display="widgets")
        wait_until(lambda: live.running() is None)  # the GPU fell off the bus
        lost = session.live_sampler  # stopped, still kept for history()
        capsys.readouterr()
        run_live(live_config, "--live --demo --interval 0.01")
        out = unfolded(capsys.readouterr().out)
        clock = time.strftime("%H:%M:%S", time.localtime(lost.stopped_at))
        assert f"colab_gpu: the last live run stopped by itself at {clock}; its summary:" in out
        assert "samples every 0.01 s over" in out and "NVML; it had stopped by itself: GPU 0: a GPU fell off the bus" in out
        assert lost.closed and live.running() is not None
        run_live(live_config, "--stop")
        out = unfolded(capsys.readouterr().out)
        assert f"replay of {DEMO}" in out and "fell off the bus" not in out
    finally:
        live.stop()
        source.close()


def test_a_new_start_after_a_lost_gpu_ends_that_runs_cells_lines(live_config, monkeypatch, capsys):
    """--live --cells, the GPU lost, then --live (or a script's live.start()) without --cells:
    the old run's summary was shown, yet its cell hooks stayed on into the new run, printing a
    line after every cell and resetting torch's peak counters, as no --stop had ended them."""
    import colab_gpu.devices

    for restart in (lambda: run_live(live_config, "--live --demo --interval 0.01"),
                    lambda: live.start(demo=True, interval=0.01)):
        source = NvmlSource(nvml=RecordedNvml(V100, lose_gpu_after=3))
        monkeypatch.setattr(colab_gpu.devices, "default_source", lambda: source)
        try:
            run_live(live_config, "--live --cells --interval 0.01", live_display="widgets")
            wait_until(lambda: live.running() is None)  # the GPU fell off the bus
            assert len(cell_hooks(live_config)) == 2
            restart()
            assert live.running() is not None and cell_hooks(live_config) == []
            live_config.run_cell("import time; time.sleep(0.1)")
            assert "cell GPU memory" not in capsys.readouterr().out
        finally:
            live.stop()
            source.close()


def test_cells_on_a_recording_without_memory_says_so_once_not_an_empty_line_per_cell(live_config, capsys):
    """nanoGPT's log has utilization, power and temperature but no memory: every cell ended
    with "cell GPU memory (REPLAY ..., 21 samples): " and nothing after the colon."""
    run_live(live_config, f"--live --from {NANOGPT} --cells --interval 0.02", live_display="widgets")
    capsys.readouterr()
    for _ in range(2):
        live_config.run_cell("import time; time.sleep(0.2)")
    lines = [line for line in unfolded(capsys.readouterr().out).splitlines() if line.startswith("cell GPU")]
    assert len(lines) == 1, lines
    assert re.fullmatch(r"cell GPU memory \(REPLAY of a recorded trace \(8gpu-training_nanogpt-pr643.csv\), "
                        r"not this machine's GPU, \d+ samples\): the recording reports no memory used; "
                        r"later cells get no line while it reports none", lines[0]), lines[0]
    run_live(live_config, "--stop")


def test_cells_stays_quiet_after_a_cell_too_short_to_be_sampled(live_config, capsys):
    run_live(live_config, "--live --demo --cells --interval 60", live_display="widgets")
    capsys.readouterr()
    live_config.run_cell('print("x")')
    assert capsys.readouterr().out == "x\n"


class FakeCuda:
    """torch.cuda after the user's code started CUDA: the device's allocator counters."""

    def __init__(self):
        self.allocated, self.peak, self.reserved = 100 * 2 ** 20, 900 * 2 ** 20, 1024 ** 3

    def is_initialized(self):
        return True

    def device_count(self):
        return 1

    def reset_peak_memory_stats(self, device):
        self.peak = self.allocated

    def memory_allocated(self, device):
        return self.allocated

    def max_memory_allocated(self, device):
        return self.peak

    def max_memory_reserved(self, device):
        return self.reserved


def test_a_scripts_live_stop_also_ends_the_cells_lines_and_their_peak_resets(live_config, monkeypatch, capsys):
    """colab_gpu.live.stop() left the --cells hooks registered: every later cell still printed
    a line and reset torch's peak counters, so the user's own max_memory_allocated() read
    per cell, long after the monitor was stopped."""
    cuda = FakeCuda()
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=cuda))
    run_live(live_config, "--live --demo --cells --interval 0.02", live_display="widgets")
    live_config.run_cell("x = 1")
    assert "cell GPU memory (torch)" in capsys.readouterr().out
    assert "Live monitor stopped" in str(live.stop())
    assert cell_hooks(live_config) == []
    cuda.peak = 5 * 2 ** 30  # the user's training step peaked at 5 GiB
    for cell in ("y = 2", "z = 3"):
        live_config.run_cell(cell)
    assert "cell GPU memory" not in capsys.readouterr().out
    assert cuda.peak == 5 * 2 ** 30  # still theirs to read
    run_live(live_config, "--live --demo --cells --interval 0.02")  # turned on again: one pair of hooks
    assert len(cell_hooks(live_config)) == 2
    run_live(live_config, "--stop")
    assert cell_hooks(live_config) == []


def test_cells_uses_torchs_own_peak_counters_once_cuda_is_initialized(monkeypatch):
    from colab_gpu.live.cells import CellPeaks

    cuda = FakeCuda()
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=cuda))
    peaks = CellPeaks(lambda: None)
    peaks.before()
    assert cuda.peak == cuda.allocated  # reset: the peak is this cell's
    cuda.peak, cuda.allocated = 700 * 2 ** 20, 300 * 2 ** 20
    assert peaks.after() == ("cell GPU memory (torch): cuda:0 peak 700 MiB allocated "
                             "(+200 MiB kept), 1.00 GiB reserved")


class EightFakeCudas(FakeCuda):
    """8 GPUs; the user's model lives on cuda:2 only."""

    def device_count(self):
        return 8

    def memory_allocated(self, device):
        return self.allocated if device == 2 else 0

    def max_memory_allocated(self, device):
        return self.peak if device == 2 else 0

    def max_memory_reserved(self, device):
        return self.reserved if device == 2 else 0


def test_cells_on_eight_gpus_names_only_those_that_held_memory(monkeypatch):
    from colab_gpu.live.cells import CellPeaks

    cuda = EightFakeCudas()
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=cuda))
    peaks = CellPeaks(lambda: None)
    peaks.before()
    cuda.peak, cuda.allocated = 700 * 2 ** 20, 300 * 2 ** 20
    assert peaks.after() == ("cell GPU memory (torch): cuda:2 peak 700 MiB allocated "
                             "(+200 MiB kept), 1.00 GiB reserved")
    cuda.reserved = cuda.allocated = 0
    peaks.before()
    assert peaks.after() == "cell GPU memory (torch): nothing held on any of the 8 GPUs"


@pytest.mark.parametrize("line, message", [
    ("--demo", "--interval, --demo and --cells go with --live"),
    ("--live --interval 0", "--interval must be a number of seconds from 0.1"),
    ("--live --interval -1", "--interval must be a number of seconds from 0.1"),
    ("--live --demo --interval 0.05", "--interval must be a number of seconds from 0.1 (NVML's counters change "
                                      "every 1/6 s to 1 s) to 3600 (an hour), e.g. 1 or 0.5; not 0.05"),
    ("--live --demo --from x.csv", "give one"),
    ("--stop --live", "--stop takes no other option"),
    ("--live --json", "--json does not go with --live"),
    ("--live --from /nonexistent/trace.csv", "cannot start the live monitor: "
                                             "cannot replay /nonexistent/trace.csv: no such file"),
])
def test_bad_live_options_are_one_line_usage_errors(shell, live_floor, line, message):
    with pytest.raises(UsageError, match=re.escape(message)) as error:
        shell.run_line_magic("gpu_status", line)
    assert "\n" not in str(error.value)
    assert live.running() is None and live_threads() == []


def test_live_on_a_colab_runtime_without_a_gpu_says_how_to_get_one(shell, clean_env):
    """A Colab CPU runtime (no driver, no pynvml): the card advises Runtime > Change runtime
    type, --live only said that no driver is installed."""
    import colab_gpu.devices
    from colab_gpu.devices import nvml

    clean_env.setenv("COLAB_RELEASE_TAG", "release-colab-20261120-060000-RC00")
    clean_env.setattr(nvml, "nvidia_driver_present", lambda: False)
    clean_env.setitem(sys.modules, "pynvml", None)
    clean_env.setattr(colab_gpu.devices, "default_source", lambda: NvmlSource())
    with pytest.raises(UsageError) as error:
        shell.run_line_magic("gpu_status", "--live")
    assert str(error.value).startswith("cannot start the live monitor: NVML: no NVIDIA driver is installed")
    assert str(error.value).endswith("; for a GPU: Runtime > Change runtime type > T4 GPU; "
                                     "%gpu_status --live --demo replays a recorded trace")


INTERVAL_RULE = ("must be a number of seconds from 0.1 (NVML's counters change every 1/6 s to 1 s) to 3600 "
                 "(an hour), e.g. 1 or 0.5; not ")


@pytest.mark.parametrize("value", ["1e10", "inf", "nan"])
def test_an_interval_beyond_an_hour_is_refused_and_leaves_no_monitor_behind(live_config, live_floor, capsys, value):
    """A huge interval used to kill the sampler thread (OverflowError) and leave a monitor that
    --live called running and --stop called stopped."""
    live_config.run_line_magic("config", "GPUMagics.live_lines = 2")
    with pytest.raises(UsageError) as error:
        live_config.run_line_magic("gpu_status", f"--live --demo --interval {value}")
    assert str(error.value) == f"--interval {INTERVAL_RULE}{float(value):g}"
    assert live.running() is None and live_threads() == []
    run_live(live_config, "--live --demo --interval 0.1")
    out = capsys.readouterr().out
    assert "already running" not in out and out.count("REPLAY") == 2


def test_config_refuses_the_live_settings_the_monitor_would_refuse(live_config, live_floor, caplog):
    magics = live_config.magics_manager.registry["GPUMagics"]
    for setting, message in [
        ("live_interval = -5", f"GPUMagics.live_interval {INTERVAL_RULE}-5"),
        ("live_interval = 1e10", f"GPUMagics.live_interval {INTERVAL_RULE}1e+10"),
        ("live_interval = 1e-7", f"GPUMagics.live_interval {INTERVAL_RULE}1e-07"),  # the floor, at %config
        ("live_history = 0", "'live_history' trait of a GPUMagics instance should not be less than 1"),
        ("live_lines = -1", "'live_lines' trait of a GPUMagics instance should not be less than 0"),
    ]:
        caplog.clear()
        live_config.run_line_magic("config", f"GPUMagics.{setting}")
        assert message in caplog.text  # %config's own one-line error
    assert (magics.live_interval, magics.live_history, magics.live_lines) == (1.0, 3600, 0)


def test_config_refuses_a_history_of_true_that_the_next_live_failed_on(live_config, caplog, capsys):
    """traitlets' Int takes a bool: `%config GPUMagics.live_history = True` was accepted, and the
    next %gpu_status --live ended in a traceback (TypeError: history is a whole number of samples)."""
    live_config.run_line_magic("config", "GPUMagics.live_history = True")
    assert "GPUMagics.live_history is a whole number of samples, e.g. 3600; not True" in caplog.text
    assert live_config.magics_manager.registry["GPUMagics"].live_history == 3600
    run_live(live_config, "--live --demo --interval 0.02", live_lines=1)  # one line, then its summary
    out = capsys.readouterr().out
    assert out.count("REPLAY") == 1 and "Live monitor stopped: 1 sample" in out


def test_importing_the_package_and_loading_the_extension_stay_light():
    script = textwrap.dedent("""
        import sys
        from IPython.testing.globalipapp import start_ipython
        shell = start_ipython()
        before = set(sys.modules)
        import colab_gpu
        shell.run_line_magic('load_ext', 'colab_gpu')
        print("imported by the extension:", sorted(m for m in set(sys.modules) - before
                     if m.split('.')[0] in ('matplotlib', 'ipywidgets', 'torch', 'pandas')
                     or m.startswith('colab_gpu.live')))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert done.stdout.rstrip().endswith("imported by the extension: []"), done.stdout + done.stderr


def _interrupted_at(event_number, run, counted_from):
    """Run ``run()`` in a thread that raises KeyboardInterrupt at the ``event_number``-th call
    or return in the live monitor's code or threading's, counted from the first call of the
    function ``counted_from``: where CPython runs a signal's handler (entering a function,
    after a call). (None, what it raised), or ("hung", None): in a thread, so that a
    deadlock fails the test instead of hanging the run."""
    import atexit

    seen, outcome = [0], [None, None]
    started = threading.Event()

    def counted(frame):
        path = frame.f_code.co_filename
        if started.is_set() and (path == threading.__file__ or f"{os.sep}live{os.sep}" in path):
            seen[0] += 1
            if seen[0] == event_number:
                raise KeyboardInterrupt

    def local(frame, event, arg):
        if event == "return":
            counted(frame)
        return local

    def trace(frame, event, arg):
        if frame.f_code is counted_from.__code__:
            started.set()
        counted(frame)
        return local

    def target():
        sys.settrace(trace)
        try:
            run()
        except BaseException as error:
            outcome[1] = error
        finally:
            sys.settrace(None)

    worker = threading.Thread(target=target, daemon=True)
    worker.start()
    worker.join(20)
    if worker.is_alive():  # deadlocked: leave nothing whose stop would hang this process
        sampler, session.live_sampler = session.live_sampler, None
        if sampler is not None:
            atexit.unregister(sampler.stop)
        if session.live_lock.locked():  # held by the stuck thread (a Lock: any thread may release it)
            session.live_lock.release()
        return "hung", None
    return outcome


@pytest.mark.parametrize("event_number", range(1, 61))
def test_ctrl_c_anywhere_in_the_terminal_display_stops_the_monitor_and_never_hangs(
        live_config, capsys, event_number):
    """A Ctrl-C lands wherever the main thread is. One that landed just after Condition's
    __enter__ (Python code in CPython) took the lock (the sampler thread then waited on it
    forever) and stop() joined that thread: the kernel hung."""
    live_config.run_line_magic("config", "GPUMagics.live_interval = 0.01")
    hung, raised = _interrupted_at(
        event_number, lambda: live_config.run_line_magic("gpu_status", "--live --demo"), watch)
    assert hung is None, f"the Ctrl-C at event {event_number} hung the display"
    assert raised is None and "Live monitor stopped" in capsys.readouterr().out
    assert live.running() is None
    wait_until(lambda: not live_threads(), timeout=5)


@pytest.mark.parametrize("event_number", range(1, 41))
def test_ctrl_c_anywhere_in_a_stop_never_hangs_and_a_second_stop_ends_the_monitor(
        live_config, capsys, event_number):
    run_live(live_config, "--live --demo --interval 0.01", live_display="widgets")
    sampler = live.running()
    sampler.wait(3, timeout=10)
    hung, raised = _interrupted_at(
        event_number, lambda: live_config.run_line_magic("gpu_status", "--stop"), live.stop)
    assert hung is None, f"the Ctrl-C at event {event_number} of the stop hung it"
    if raised is not None:  # the Ctrl-C reached the user: the stop they type next ends it all
        assert isinstance(raised, KeyboardInterrupt)
        cut_short, _ = sampler.closed is False, capsys.readouterr()
        hung, raised = _interrupted_at(0, lambda: live_config.run_line_magic("gpu_status", "--stop"),
                                       live.stop)  # event 0: no Ctrl-C this time
        assert hung is None and raised is None, "the stop after a Ctrl-C'd stop hung or failed"
        if cut_short:  # ... and shows the run's summary the first did not get to
            assert capsys.readouterr().out.startswith("Live monitor stopped: ")
    assert live.running() is None and not sampler.running
    wait_until(lambda: not live_threads(), timeout=5)


def test_a_stop_cut_short_by_ctrl_c_is_not_called_a_run_that_stopped_by_itself(live_config, monkeypatch, capsys):
    """A Ctrl-C in --stop after the sampler thread ended (waiting for it, closing the source)
    left a run that was not running and not closed: the next --live printed "the last live run
    stopped by itself", as after a lost GPU, though the user had stopped it."""
    run_live(live_config, "--live --demo --cells --interval 0.01", live_display="widgets")
    sampler = live.running()
    sampler.wait(3, timeout=10)
    close = sampler.source.close

    def interrupted_close():  # the Ctrl-C lands while the stop closes the recording
        monkeypatch.setattr(sampler.source, "close", close)
        raise KeyboardInterrupt

    monkeypatch.setattr(sampler.source, "close", interrupted_close)
    with pytest.raises(KeyboardInterrupt):
        run_live(live_config, "--stop")
    assert not sampler.running and not sampler.closed
    capsys.readouterr()
    run_live(live_config, "--live --demo --interval 0.01")
    out = unfolded(capsys.readouterr().out)
    assert "stopped by itself" not in out and "Live monitor stopped" not in out, out
    assert sampler.closed and cell_hooks(live_config) == []  # the cut-short stop was finished
    assert live.running() is not sampler
    run_live(live_config, "--stop")


def test_a_stop_cut_short_after_the_sampler_closed_ends_its_cells_lines_before_the_next_run(
        live_config, monkeypatch, capsys):
    """A Ctrl-C in --stop once the sampler had closed (while the summary was read) left the
    --cells hooks on: the next --live, without --cells, still printed a line after each cell."""
    run_live(live_config, "--live --demo --cells --interval 0.01", live_display="widgets")
    sampler = live.running()
    sampler.wait(3, timeout=10)
    record_of = live.record_of

    def interrupted(sampler):  # the Ctrl-C lands while the stop reads the run's record
        monkeypatch.setattr(live, "record_of", record_of)
        raise KeyboardInterrupt

    monkeypatch.setattr(live, "record_of", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_live(live_config, "--stop")
    assert sampler.closed
    run_live(live_config, "--live --demo --interval 0.01")
    live.running().wait(3, timeout=10)
    capsys.readouterr()
    live_config.run_cell("import time; time.sleep(0.1)")
    assert "cell GPU memory" not in capsys.readouterr().out and cell_hooks(live_config) == []
    run_live(live_config, "--stop")


@pytest.mark.parametrize("name, note", [
    ("20gb-noheader_plato.csv", "no header: columns read from their units as timestamp, utilization.gpu"),
    ("8gpu-80gb-idle_gpu-glasses.csv", "its index column repeats within one time step, so GPUs are numbered in row order"),
])
def test_a_replay_of_a_log_that_does_not_describe_itself_says_how_it_was_read(name, note):
    """The card's source line says how a headerless log's columns were guessed, or that a log's
    index column was not GPU indices; the live views showed the same numbers without it."""
    sampler = Sampler(ReplaySource(DATA / "nvidia-smi-csv" / name, follow=True), interval=0.005).start()
    try:
        lines = []
        watch(sampler, lines.append, max_lines=1, width=80)
        assert note in " ".join(" ".join(lines).split())  # the terminal folds it at 80 columns
        assert note in render_panel(sampler)
    finally:
        sampler.stop()
    summary = str(live.record_of(sampler))
    assert note in " ".join(summary.split())  # --stop's summary too
    # A note is a sentence: it flows to 80 columns, not folded at its commas as a list of facts
    # ("... from their\n  units as timestamp,\n  utilization.gpu, ...").
    source = summary[summary.index("Source: "):].splitlines()
    assert all(60 < len(line) <= 80 for line in source[:-1]), source
