"""What the live monitor costs a training loop: throughput with it off, on at 1 s and at 0.2 s.

A small MLP trains on the CPU with real torch. The three settings are measured side by side
in one run, interleaved (off, 1 s, 0.2 s, off, ...) so drift in the machine hits all alike,
and compared by their medians. "On" means what runs during training in a notebook: the
sampler thread plus the live widget's redraws (ipywidgets, without a front end). Where
NVML sees no GPU, the sampler replays the bundled demo trace instead, and says so.

Wall-clock throughput on a shared machine is noisy, so the monitor thread's own CPU time is
printed too (Linux thread CPU clock): the share of one core it used, independent of load.

    python benchmarks/live_overhead.py [--repeats 7] [--seconds 3] [--threads 1]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from colab_gpu import live  # noqa: E402
from colab_gpu.live.widget import live_widget  # noqa: E402


def make_step():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(),
                                torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    inputs, targets = torch.randn(128, 256), torch.randint(0, 10, (128,))

    def step():
        optimizer.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(inputs), targets)
        loss.backward()
        optimizer.step()

    return step


def throughput(step, seconds: float) -> float:
    """Training steps per second over ``seconds`` of wall-clock time."""
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        step()
        steps += 1
    return steps / (time.perf_counter() - start)


def thread_cpu_seconds(thread) -> float:
    return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))


def measure(step, interval, seconds: float, demo: bool):
    """(steps/s, samples taken, monitor CPU seconds) with the monitor off or on at ``interval``."""
    if interval is None:
        return throughput(step, seconds), 0, 0.0
    sampler, _ = live.start(demo=demo, interval=interval)
    live_widget(sampler)  # follows the sampler from its thread, as in a notebook
    thread = sampler._thread
    try:
        rate = throughput(step, seconds)
        return rate, sampler.count, thread_cpu_seconds(thread)
    finally:
        live.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--seconds", type=float, default=3.0, help="length of one measurement")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (1 keeps a shared machine's noise down)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    try:
        live.start(interval=1.0)
        live.stop()
        demo = False
        source = "NVML (this machine's GPUs)"
    except live.SourceError as error:
        demo = True
        source = f"the bundled demo trace (replay), because NVML cannot be read here: {error}"
    step = make_step()
    throughput(step, 1.0)  # warm up
    settings = {"off": None, "on, 1 s": 1.0, "on, 0.2 s": 0.2}
    results = {name: [] for name in settings}
    samples = {name: 0 for name in settings}
    cpu = {name: 0.0 for name in settings}
    for _ in range(args.repeats):
        for name, interval in settings.items():
            rate, taken, used = measure(step, interval, args.seconds, demo)
            results[name].append(rate)
            samples[name] += taken
            cpu[name] += used
    print(f"live monitor overhead: MLP 256-512-512-10, batch 128, torch {torch.__version__} on the "
          f"CPU ({torch.get_num_threads()} threads)")
    print(f"monitor source: {source}")
    print(f"{args.repeats} interleaved repeats of {args.seconds:g} s per setting; medians")
    base = statistics.median(results["off"])
    for name in settings:
        median = statistics.median(results[name])
        spread = f"min {min(results[name]):.1f}, max {max(results[name]):.1f}"
        line = f"  {name:<10} {median:8.1f} steps/s  ({spread}; {samples[name]} samples taken)"
        if name != "off":
            line += f"  ratio {median / base:.4f}, overhead {100 * (1 - median / base):+.2f}%"
        print(line)
    for name in list(settings)[1:]:
        paired = statistics.median(on / off for on, off in zip(results[name], results["off"]))
        print(f"  paired (each repeat's {name} / its own off): median ratio {paired:.4f}, "
              f"overhead {100 * (1 - paired):+.2f}%")
    for name in list(settings)[1:]:
        share = cpu[name] / (args.repeats * args.seconds)
        print(f"  monitor thread CPU at {name[4:]}: {1000 * cpu[name] / max(1, samples[name]):.2f} ms "
              f"per sample, {100 * share:.3f}% of one core")
    overhead = 100 * (1 - statistics.median(results["on, 1 s"]) / base)
    share = 100 * cpu["on, 1 s"] / (args.repeats * args.seconds)
    noise = 100 * (max(results["off"]) - min(results["off"])) / base
    print(f"target under 1% at 1 s: the monitor thread used {share:.3f}% of one core -> "
          f"{'met' if share < 1 else 'NOT met'}; throughput {overhead:+.2f}% "
          f"({'within' if abs(overhead) < noise else 'beyond'} the {noise:.1f}% spread of the "
          f"'off' runs alone on this machine)")


if __name__ == "__main__":
    main()
