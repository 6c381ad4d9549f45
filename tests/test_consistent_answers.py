"""One answer where there were two: which GPUs torch sees, how a chart line is thinned, what is a
replay, and what the live monitor reads.

GPUs are real recordings (tests/data): the A100 in MIG mode of a100-sxm4-v12.xml, the Tesla T4
of tesla-t4.xml, the V100 trace; NVML is the recording-fed stand-in of tests/nvml_recording.py,
so NvmlSource's own code runs.
"""
from __future__ import annotations

import dataclasses
import html
import re

import pytest

import colab_gpu
from colab_gpu.devices.nvml import NvmlSource
from colab_gpu.devices.replay import ReplaySource
from colab_gpu.live.panel import CHART_PANELS, chart_svg, min_max_per_column, render_panel, torch_labels
from colab_gpu.live.sampler import GPUReading, Sample, Sampler, reading_of
from colab_gpu.live.server import page_state
from colab_gpu.live.terminal import watch

from conftest import DATA
from nvml_recording import RecordedNvml
from test_mig import filled, live, recorded_a100, shown, with_instances  # noqa: F401 (shown: a fixture)
from test_never_harms import two_t4s

T4 = DATA / "nvidia-smi-xml" / "tesla-t4.xml"
V100 = DATA / "nvidia-smi-csv" / "v100s-pcie-32gb_miris.csv"
ELSEWHERE = "MIG-77777777-0000-5000-8000-000000000000"  # a MIG instance of no GPU here


# --- hidden from torch: the card, the advice, the live label and clear_cache agree ----------------


def without_uuids(change):
    return lambda mig: dataclasses.replace(change(mig), uuid=None)


@pytest.mark.parametrize("instances, card, maybe_this_kernels", [
    # NVML gave every instance's UUID and none is the one named: CUDA stops there, nothing is visible
    (lambda: with_instances(recorded_a100(), filled(3)), "hidden from torch", False),
    # the instances' UUIDs are unknown (as in nvidia-smi's XML): the named one may be any of them
    (lambda: with_instances(recorded_a100(), without_uuids(filled(3))),
     "hidden from torch unless the MIG instance in CUDA_VISIBLE_DEVICES is on it", True),
], ids=["uuids-not-matching", "uuids-removed"])
def test_a_mig_gpu_is_hidden_or_not_in_one_answer_everywhere(shell, shown, clean_env, monkeypatch,  # noqa: F811
                                                             instances, card, maybe_this_kernels):
    """Instance 3 is 95 % full. Before, the card said "hidden from torch" while the advice still
    sent the user after the full instance, and clear_cache read the hidden GPU as this kernel's."""
    source = live(instances(), monkeypatch)
    clean_env.setenv("CUDA_VISIBLE_DEVICES", ELSEWHERE)
    text, html = shown()
    words = " ".join(text.split())  # the text view folds titles and advice at 80 columns
    title = f"GPU 0 NVIDIA A100-SXM4-80GB ({card}, compute capability 8.0, MIG on)"
    assert title in words  # a MIG title is folded between its items too
    assert ("tip: MIG instance 3 of GPU 0 is 95% full" in words) is maybe_this_kernels
    assert ("MIG instance 3 of GPU 0 is 95% full" in html) is maybe_this_kernels
    assert (f"CUDA_VISIBLE_DEVICES='{ELSEWHERE}' hides every GPU from torch" in words) is not maybe_this_kernels
    sampler = Sampler(source, interval=60).start()
    try:
        assert torch_labels(sampler) == {0: card}
    finally:
        sampler.stop()
    report = colab_gpu.clear_cache(shell=shell, source=source)
    assert ("GPU 0" in [reading.device for reading in report.before]) is maybe_this_kernels


# --- one thinning of a chart line: spikes and dips survive ------------------------------------------


def test_min_max_per_column_keeps_a_one_sample_spike_and_dip_in_time_order():
    x = [float(t) for t in range(3000)]
    y = [{700: 100.0, 2100: 0.0}.get(t, 50.0 + t % 3) for t in range(3000)]
    kept = list(min_max_per_column(x, y, 100, (0.0, 2999.0)))
    assert len(kept) <= 2 * 100 + 2 and kept == sorted(set(kept))
    assert 700 in kept and 2100 in kept  # the spike and the dip
    assert kept[0] == 0 and kept[-1] == 2999  # the line spans the run
    assert {y[i] for i in kept} == {0.0, 50.0, 52.0, 100.0}  # each column's lowest and highest
    flat = list(min_max_per_column(x, [7.0] * 3000, 100, (0.0, 2999.0)))
    assert len(flat) == 100 + 1  # a flat column is one point (and the last sample ends the line)
    assert list(min_max_per_column(x[:150], y[:150], 100, (0.0, 149.0))) == list(range(150))  # few: all


def test_the_rolling_chart_keeps_a_one_sample_dip():
    """The panel kept each pixel column's highest value only: a GPU busy 100 % but for one
    sample at 0 (a stall) drew a flat line."""
    samples = [Sample(t * 0.1, (GPUReading(0, 0.0 if t == 1234 else 100.0, None, None, None, None),))
               for t in range(3000)]
    svg = chart_svg(samples, CHART_PANELS[0], width=320, height=110)  # busy
    (points,) = re.findall(r"points='([^']*)'", svg)
    heights = sorted({float(point.split(",")[1]) for point in points.split()})
    assert len(heights) == 2 and heights[-1] == pytest.approx(108.0)  # 0 % drawn at the bottom


# --- a replay is what its snapshots say, not what its label starts with ---------------------------


def test_a_recording_is_marked_as_a_replay_whatever_its_label_and_a_live_source_is_not():
    replay = ReplaySource(V100, follow=True)
    replay.label = "V100 training run"  # not "replay of ..."
    nvml = NvmlSource(nvml=RecordedNvml(ReplaySource(T4).snapshot()))
    nvml.label = "replay of my own GPU"  # a live source whose label starts with the old prefix
    for source, title, mark in ((replay, "REPLAY of a recorded trace (V100 training run), not this machine's GPU",
                                 "REPLAY  GPU0 "),
                                (nvml, "live from replay of my own GPU", None)):
        sampler = Sampler(source, interval=60).start()
        try:
            lines = []
            watch(sampler, lines.append, max_lines=1, width=200)
            panel = render_panel(sampler)
            assert page_state(sampler)["title"] == title and html.escape(title) in panel
            assert ("<b class='cgpu-replay'>" in panel) is (mark is not None)
            assert (mark in lines[0]) if mark else "REPLAY" not in lines[0] + panel
        finally:
            sampler.stop()


# --- the live monitor's light read ---------------------------------------------------------------


SAMPLED_CALLS = {"nvmlDeviceGetCount", "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetUtilizationRates",
                 "nvmlDeviceGetPowerUsage", "nvmlDeviceGetTemperature"}


def test_the_light_read_gives_what_the_monitor_keeps_and_skips_the_slow_calls():
    nvml = RecordedNvml(two_t4s())
    source = NvmlSource(nvml=nvml)
    full = source.snapshot()
    assert any(gpu.processes for gpu in full.gpus)  # the recording lists processes
    nvml.calls.clear()
    light = source.light_snapshot()
    assert set(nvml.calls) == SAMPLED_CALLS  # no processes, clocks, PCIe link or power limit
    assert [reading_of(gpu) for gpu in light.gpus] == [reading_of(gpu) for gpu in full.gpus]
    assert [gpu.name for gpu in light.gpus] == ["Tesla T4"] * 2 and light.ok and not light.recorded
    assert {gpu.processes for gpu in light.gpus} == {None}


def test_the_sampler_reads_whole_once_then_lightly():
    nvml = RecordedNvml(two_t4s())
    sampler = Sampler(NvmlSource(nvml=nvml), interval=0.005).start()
    try:
        assert "nvmlDeviceGetComputeRunningProcesses" in nvml.calls  # the first read: labels, names
        nvml.calls.clear()
        assert sampler.wait(sampler.count + 3, timeout=10)
    finally:
        sampler.stop()
    assert set(nvml.calls) == SAMPLED_CALLS
    assert sampler.latest().gpus[1].memory_used == two_t4s().gpus[1].memory_used
