"""GPU check for the live monitor (needs a CUDA GPU; about 1-2 minutes).

1. The monitor (NVML, 1 s) watches 3 s of idle and then a training loop: the samples it saw
   are printed, and GPU utilization should rise once the loop runs.
2. Throughput of the loop with the monitor off and on at 1 s, interleaved, medians.
3. Per-cell peaks from torch's own counters (the path --cells uses once CUDA is started).
4. The script exits with the sampler still running: the exit must be clean (no segfault,
   exit code 0), because the sampler stops before NVML is shut down.

    python gpu_checks/live_monitor.py
"""
from __future__ import annotations

import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from colab_gpu import live  # noqa: E402
from colab_gpu.live.cells import CellPeaks  # noqa: E402
from colab_gpu.live.terminal import sample_line  # noqa: E402


def make_step():
    model = torch.nn.Sequential(torch.nn.Linear(4096, 8192), torch.nn.ReLU(),
                                torch.nn.Linear(8192, 8192), torch.nn.ReLU(),
                                torch.nn.Linear(8192, 1000)).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    inputs = torch.randn(2048, 4096, device="cuda")
    targets = torch.randint(0, 1000, (2048,), device="cuda")

    def step():
        optimizer.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(inputs), targets).backward()
        optimizer.step()

    return step


def throughput(step, seconds: float) -> float:
    torch.cuda.synchronize()
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        step()
        steps += 1
    torch.cuda.synchronize()
    return steps / (time.perf_counter() - start)


def main() -> int:
    if not torch.cuda.is_available():
        print("live_monitor GPU check: no CUDA device here (torch.cuda.is_available() is False); "
              "run it on a machine with an NVIDIA GPU", file=sys.stderr)
        return 2
    try:
        sampler, _ = live.start(interval=1.0)
    except live.SourceError as error:
        print(f"live_monitor GPU check: NVML cannot be read: {error}", file=sys.stderr)
        return 2
    print(f"torch {torch.__version__}, GPU: {torch.cuda.get_device_name(0)}")
    print("1. monitor at 1 s: 3 s idle, then 10 s of training")
    time.sleep(3)
    training_from = time.time()
    step = make_step()
    throughput(step, 10)
    record = live.stop()
    for sample in record.samples:
        phase = "train" if sample.time >= training_from else "idle "
        print(f"   {phase} {sample_line(sample, record.torch_labels)}")
    idle = [r.utilization for s in record.samples if s.time < training_from for r in s.gpus[:1]]
    busy = [r.utilization for s in record.samples if s.time >= training_from + 2 for r in s.gpus[:1]]
    print(f"   GPU 0 utilization: idle max {max(idle, default=None)}%, training median "
          f"{statistics.median(busy) if busy else None}% -> "
          f"{'rose' if busy and idle and statistics.median(busy) > max(idle) else 'DID NOT rise'}")

    print("2. throughput, monitor off vs on at 1 s (3 interleaved repeats of 8 s, medians)")
    rates = {"off": [], "on": []}
    for _ in range(3):
        rates["off"].append(throughput(step, 8))
        live.start(interval=1.0)
        rates["on"].append(throughput(step, 8))
        live.stop()
    off, on = statistics.median(rates["off"]), statistics.median(rates["on"])
    print(f"   off {off:.2f} steps/s {['%.2f' % r for r in rates['off']]}")
    print(f"   on  {on:.2f} steps/s {['%.2f' % r for r in rates['on']]}  ratio {on / off:.4f}, "
          f"overhead {100 * (1 - on / off):+.2f}%")

    print("3. per-cell peak from torch's counters")
    peaks = CellPeaks(live.running)
    before = torch.cuda.memory_allocated(0)
    peaks.before()
    kept = torch.empty(256 * 2 ** 20, dtype=torch.uint8, device="cuda")
    temporary = torch.empty(1024 * 2 ** 20, dtype=torch.uint8, device="cuda")
    del temporary
    expected = (before + 1280 * 2 ** 20) / 2 ** 30
    print(f"   {peaks.after()}  (expected: peak {expected:.2f} GiB allocated, +256 MiB kept)")
    del kept

    print("4. exiting with the sampler running (must exit cleanly)")
    live.start(interval=0.1)
    time.sleep(0.5)
    return 0


if __name__ == "__main__":
    sys.exit(main())
