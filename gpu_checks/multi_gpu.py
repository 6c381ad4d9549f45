"""GPU check for #37/#38's multi-GPU and input-pipeline parts (a machine with a CUDA GPU; under
two minutes). Never run yet on a GPU when written: read its first failure as possibly its own.

* The card's interconnect line from the real NVML (NVLink or PCIe between every pair; none on one GPU).
* find_batch in every rank of colab_gpu.launch (NCCL, a rank per GPU; on one GPU, two Gloo ranks
  sharing it), each rank with its own limit: every rank gets the smallest answer.
* find_batch on a DataParallel model over every GPU: the note gives each GPU's share (none on one GPU).
* --cells' load line over the real NVML sampler: a CPU-heavy loader beside a light GPU step is
  named input-bound, a heavy GPU step is not.
    python gpu_checks/multi_gpu.py
"""
from __future__ import annotations

import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # this checkout's colab_gpu


def search_on_own_device():
    import torch
    import torch.distributed as dist

    from colab_gpu.batch import find_batch

    rank = dist.get_rank()
    device = f"cuda:{torch.cuda.current_device() if dist.get_backend() == 'nccl' else 0}"
    model = torch.nn.Linear(1024, 1024).to(device)

    def step(batch_size):
        model(torch.randn(batch_size, 1024, device=device)).sum().backward()

    result = find_batch(step, max=256 if rank == 0 else 96, device=device, progress=False)
    return result.answer, result.largest_fitting


def main() -> int:
    import torch

    import colab_gpu
    from colab_gpu.distributed.launcher import gpu_count
    from colab_gpu.live.cells import CellPeaks

    gpus = gpu_count()
    if not gpus:
        print("gpu_checks/multi_gpu.py: no CUDA device here; run it on a machine with a GPU.")
        return 2
    failures = []

    def check(ok: bool, finding: str) -> None:
        print(("OK: " if ok else "FAIL: ") + finding, flush=True)
        if not ok:
            failures.append(finding)

    status = colab_gpu.status()
    links = status.snapshot.topology
    if gpus > 1:
        check(links is not None and len(links) == gpus * (gpus - 1) // 2 and all(link.path for link in links),
              f"NVML says how every pair is linked: {links}")
    check(("Interconnect" in str(status)) == (gpus > 1), "the card has an interconnect line only on several GPUs")

    started = time.perf_counter()
    nprocs, backend = (gpus, "nccl") if gpus > 1 else (2, "gloo")
    answers = colab_gpu.launch(search_on_own_device, nprocs=nprocs, backend=backend, timeout=150)
    check(len({answer for answer, _ in answers}) == 1 and answers[0][0] == min(own for _, own in answers),
          f"{nprocs} {backend} ranks agree on the smallest answer: {answers} ({time.perf_counter() - started:.1f} s)")

    model = torch.nn.DataParallel(torch.nn.Linear(256, 256).cuda())
    result = colab_gpu.find_batch(lambda size: model(torch.randn(size, 256, device="cuda")).sum().backward(),
                                  max=1024, device="cuda", progress=False)
    noted = any(note.startswith("the model is torch.nn.DataParallel") for note in result.notes)
    check(noted == (gpus > 1), f"DataParallel over {gpus} GPU(s): answer {result.answer}, note: {result.notes[-1:]}")

    from colab_gpu import live

    live.start(interval=0.1)
    try:
        peaks = CellPeaks(live.running, {})
        weights = torch.randn(4096, 4096, device="cuda")

        def cell(cpu_seconds: float, gpu_steps: int) -> str:
            peaks.before()
            ends = time.monotonic() + 3
            while time.monotonic() < ends:
                burn = time.process_time() + cpu_seconds  # a batch decoded in Python
                while time.process_time() < burn:
                    pass
                for _ in range(gpu_steps):
                    weights @ weights
                torch.cuda.synchronize()
            return peaks.after() or ""

        light = cell(0.05, 3)  # ~3 ms of GPU work after each 50 ms of CPU work: busy ~10 %
        heavy = cell(0.0, 50)
        check("the input pipeline may be the bottleneck" in light, f"a CPU-bound loop is named: {light!r}")
        check("the input pipeline" not in heavy and "cell load: GPU" in heavy, f"a GPU-bound loop is not: {heavy!r}")
    finally:
        live.stop()
    print("FAILED: " + "; ".join(failures) if failures else "all passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
