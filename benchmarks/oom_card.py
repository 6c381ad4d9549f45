"""How long the out-of-memory card takes to appear under a failed cell, against the cell itself.

Issue #34: the card must come within half a second of the error, on a notebook with 100k tensors.
Each run is a fresh Python process with a real IPython shell, the extension loaded and a kernel
like the unit test's (100,000 small tensors, a model of 2,000 layers). Its cell runs a training
step of a small MLP, then asks the CPU allocator for an exbibyte: the step's time is the failed
cell's, and the card's is from the failure to the card displayed, text and HTML both formatted
as a notebook's front end asks (IPython's traceback, shown in between, included). "fresh" is the
first card of the process (the doctor's modules imported then); "warm" the next ones. Medians
of the runs, side by side with the failed cell's time, so the ratio holds on a loaded machine.

    python benchmarks/oom_card.py [--runs 5] [--warm 5] [--tensors 100000]
    python benchmarks/oom_card.py --profile   # where a fresh card's time goes (cProfile)
"""
from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # this checkout's colab_gpu

SETUP = """
import time
import torch
many = [torch.ones(1) for _ in range({tensors})]
model = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(2000)])
mlp = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 512))
batch = torch.randn(256, 512)
"""
# A training step, then a batch too large for any machine: the CPU allocator's out-of-memory error.
FAILING = """
mlp(batch).square().mean().backward()
failed_at = time.perf_counter()
torch.empty(2 ** 60, dtype=torch.uint8)
"""


def one_process(tensors: int, warm: int, profile: bool) -> dict:
    """Runs in the child: a fresh shell, one fresh card and ``warm`` more; the times in seconds."""
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    shell.display_formatter.active_types = ["text/plain", "text/html"]  # what a notebook asks for
    shell.run_line_magic("load_ext", "colab_gpu")
    shell.run_cell(SETUP.format(tensors=tensors))
    marks: dict = {}
    shell.events.register("pre_run_cell", lambda *args: marks.__setitem__("started", time.perf_counter()))
    # around the card's hook, which the extension registered: what comes before it is IPython's
    # (the traceback shown), what comes after is the card's
    shell.events.callbacks["post_run_cell"].insert(0, lambda *args: marks.__setitem__("hook", time.perf_counter()))
    shell.events.register("post_run_cell", lambda *args: marks.__setitem__("shown", time.perf_counter()))
    times = []
    for index in range(1 + warm):
        captured, sys.stdout = sys.stdout, io.StringIO()  # the traceback and the card
        profiler = None
        if profile and index == 0:
            import cProfile

            profiler = cProfile.Profile()
            profiler.enable()
        try:
            result = shell.run_cell(FAILING)
        finally:
            if profiler is not None:
                profiler.disable()
            shown, sys.stdout = sys.stdout.getvalue(), captured
        assert result.error_in_exec is not None and "Out of memory" in shown, shown[-2000:]
        failed_at = shell.user_ns["failed_at"]
        times.append({"cell": failed_at - marks["started"], "card": marks["shown"] - failed_at,
                      "doctor": marks["shown"] - marks["hook"]})
        if profiler is not None:
            import pstats

            stats = io.StringIO()
            pstats.Stats(profiler, stream=stats).sort_stats("cumulative").print_stats(45)
            print(stats.getvalue(), file=sys.stderr)
    return {"fresh": times[0], "warm": times[1:]}


def milliseconds(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="fresh processes (default 5)")
    parser.add_argument("--warm", type=int, default=5, help="cards after the first, per process (default 5)")
    parser.add_argument("--tensors", type=int, default=100_000)
    parser.add_argument("--profile", action="store_true", help="one process, its first card profiled")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.child:
        print(json.dumps(one_process(options.tensors, options.warm, options.profile)))
        return
    runs = 1 if options.profile else options.runs
    fresh, warm = [], []
    for _ in range(runs):
        command = [sys.executable, os.path.abspath(__file__), "--child", f"--warm={options.warm}",
                   f"--tensors={options.tensors}"] + (["--profile"] if options.profile else [])
        done = subprocess.run(command, stdout=subprocess.PIPE, stderr=None if options.profile else subprocess.PIPE,
                              text=True, check=True)
        measured = json.loads(done.stdout.strip().splitlines()[-1])
        fresh.append(measured["fresh"])
        warm.extend(measured["warm"])
    import platform

    print(f"Python {platform.python_version()}, {options.tensors:,} tensors in the kernel, "
          f"{runs} fresh processes, {len(warm)} warm cards; medians:")
    for name, cards in (("fresh", fresh), ("warm", warm)):
        if not cards:
            continue
        cell = statistics.median(times["cell"] for times in cards)
        card = statistics.median(times["card"] for times in cards)
        doctor = statistics.median(times["doctor"] for times in cards)
        before = statistics.median(times["card"] - times["doctor"] for times in cards)
        print(f"  {name}: card {milliseconds(card)} after the failure (slowest {milliseconds(max(t['card'] for t in cards))}; "
              f"the doctor's hook {milliseconds(doctor)}, IPython's traceback before it {milliseconds(before)}), "
              f"failed cell {milliseconds(cell)}, ratio {card / cell:.1f}x")


if __name__ == "__main__":
    main()
