"""What the final chart of ``%gpu_status --stop`` costs for a long run: the old way (every
sample drawn, a constrained layout) against the new (at most two points per pixel column,
each column's lowest and highest, and fixed margins), and each change on its own.

A run of 3600 samples of 8 GPUs (an hour at the default interval, the default history) is
built from a real 8-GPU recording, its time steps repeated in order. Both ways draw the same
RunRecord to PNG (what --stop embeds in the notebook), interleaved (old, new, old, ...) so
drift in the machine hits both alike, and are compared by their medians in this one run.
"Old" is the same code with both changes switched off (the reduction replaced by the
identity, the fixed margins by matplotlib's constrained layout, as before).

    python benchmarks/live_chart.py [--repeats 5] [--samples 3600]
"""
from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
from unittest import mock

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from matplotlib.figure import Figure  # noqa: E402

from colab_gpu.devices.replay import load_frames  # noqa: E402
from colab_gpu.live import render as live_render  # noqa: E402
from colab_gpu.live.record import RunRecord  # noqa: E402
from colab_gpu.live.render import chart_figure, chart_png  # noqa: E402
from colab_gpu.live.sampler import Sample, reading_of  # noqa: E402

TRACES = ("8gpu-training_nanogpt-pr643.csv", "8gpu-80gb-idle_gpu-glasses.csv")


def long_run(path: str, samples: int) -> RunRecord:
    """``samples`` one-second samples replaying the recording's time steps, looping."""
    frames = load_frames(path)
    run = tuple(Sample(1000.0 + step, tuple(reading_of(gpu) for gpu in frames[step % len(frames)].gpus))
                for step in range(samples))
    names = {gpu.index: gpu.name for gpu in frames[0].gpus}
    return RunRecord(f"replay of {os.path.basename(path)}", 1.0, run, names, 1000.0,
                     1000.0 + samples, None, samples)


def every_sample(x, y, columns, span):
    """The old final chart: no reduction."""
    return list(range(len(x)))


def constrained_layout(figure, **margins):
    """The old final chart's layout, in place of the fixed margins."""
    figure.set_layout_engine("constrained")


WAYS = {  # name -> (draw every sample, constrained layout)
    "old: every sample, constrained layout": (True, True),
    "every sample, fixed margins": (True, False),
    "per column, constrained layout": (False, True),
    "new: per column, fixed margins": (False, False),
}


def patched(every: bool, constrained: bool) -> contextlib.ExitStack:
    stack = contextlib.ExitStack()
    if every:
        stack.enter_context(mock.patch.object(live_render, "min_max_per_column", every_sample))
    if constrained:
        stack.enter_context(mock.patch.object(Figure, "subplots_adjust", constrained_layout))
    return stack


def draw(record: RunRecord, way) -> float:
    """Seconds to draw ``record``'s chart to PNG (what --stop embeds) the ``way`` given."""
    with patched(*way):
        started = time.perf_counter()
        chart_png(record)
        return time.perf_counter() - started


def points_per_line(record: RunRecord) -> int:
    return max(len(line.get_xdata()) for axes in chart_figure(record).axes for line in axes.lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--samples", type=int, default=3600)
    args = parser.parse_args()
    import matplotlib

    print(f"final chart at --stop: {args.samples} samples x 8 GPUs, matplotlib {matplotlib.__version__}, "
          f"{args.repeats} interleaved repeats, medians")
    for trace in TRACES:
        record = long_run(os.path.join(ROOT, "tests", "data", "nvidia-smi-csv", trace), args.samples)
        draw(record, WAYS["new: per column, fixed margins"])  # warm up: imports, fonts
        times = {name: [] for name in WAYS}
        for _ in range(args.repeats):
            for name, way in WAYS.items():
                times[name].append(draw(record, way))
        old = times["old: every sample, constrained layout"]
        print(f"  {trace}")
        for name, way in WAYS.items():
            with patched(*way):
                points = points_per_line(record)
            paired = statistics.median(t / o for t, o in zip(times[name], old))
            print(f"    {name:<38} {statistics.median(times[name]):6.3f} s  (min {min(times[name]):.3f}, "
                  f"max {max(times[name]):.3f}; {points} points per line)  / old: paired median ratio "
                  f"{paired:.3f}")


if __name__ == "__main__":
    main()
