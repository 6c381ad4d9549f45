"""GPU check for colab_gpu.launch (run on a machine with a CUDA GPU; under a minute, 5 at most).

One rank per GPU over NCCL: an all_reduce of CUDA tensors, each rank on its own cuda:N, its
CUDA tensor returned to this process on the CPU; a small DDP training loop whose weights end
equal on every rank. With one GPU, also two Gloo ranks sharing it. A rank that fails after
taking GPU memory: RankError within seconds, its process gone and the memory given back. This
process never starts CUDA through any of it; then ``torch.cuda.is_available()`` is called
here, which initializes the CUDA driver without torch.cuda.is_initialized() saying so, and the
next launch on the GPU must be refused (the driver itself asked), as after a tensor on cuda.
    python gpu_checks/launch.py
"""
from __future__ import annotations

import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # this checkout's colab_gpu


def reduce_on_gpus():
    import torch
    import torch.distributed as dist

    rank = dist.get_rank()
    value = torch.full((4,), float(rank + 1), device="cuda")
    dist.all_reduce(value)
    print(f"on {torch.cuda.get_device_name()} as cuda:{torch.cuda.current_device()}", flush=True)
    return rank, torch.cuda.current_device(), value  # a CUDA tensor: must come back on the CPU


def ddp_steps(steps: int):
    import torch
    import torch.distributed as dist

    torch.manual_seed(0)  # the same data everywhere, split by rank below
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", torch.cuda.current_device())
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(),
                                torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(16, 10)).to(device)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
    images, labels = torch.randn(64, 3, 32, 32, device=device), torch.randint(0, 10, (64,), device=device)
    for _ in range(steps):
        optimizer.zero_grad()
        part = slice(rank * 64 // world, (rank + 1) * 64 // world)
        torch.nn.functional.cross_entropy(ddp(images[part]), labels[part]).backward()
        optimizer.step()
    return model.state_dict()


def gloo_sharing_one_gpu():
    import torch
    import torch.distributed as dist

    on_gpu = torch.ones(1024, 1024, device="cuda:0") * (dist.get_rank() + 1)
    total = on_gpu.sum().cpu()  # Gloo reduces CPU tensors; the work ran on the shared GPU
    dist.all_reduce(total)
    return total.item()


def fail_holding_memory(path: str):
    import torch
    import torch.distributed as dist

    held = torch.empty(512 * 1024 ** 2, dtype=torch.uint8, device="cuda")  # 512 MiB
    with open(path, "a") as file:
        file.write(f"{os.getpid()}\n")
    if dist.get_rank() == dist.get_world_size() - 1:
        time.sleep(1)
        raise ValueError("the last rank gives up")
    dist.barrier()
    time.sleep(600)
    return held.numel()


def main() -> int:
    import tempfile

    import torch

    import colab_gpu
    from colab_gpu.distributed import LaunchRefused, RankError
    from colab_gpu.distributed.cuda_state import cuda_started
    from colab_gpu.distributed.launcher import gpu_count

    gpus = gpu_count()  # NVML: starts no CUDA here
    if not gpus:
        print(f"gpu_checks/launch.py: no CUDA device here ({gpus!r}); run it on a machine with a GPU.")
        return 2
    began = time.perf_counter()
    failures = []

    def check(ok: bool, finding: str) -> None:
        print(("OK: " if ok else "FAIL: ") + finding, flush=True)
        if not ok:
            failures.append(finding)

    ranks = min(gpus, 8)
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {gpus} GPU(s): {ranks} NCCL rank(s)")
    started = time.perf_counter()
    results = colab_gpu.launch(reduce_on_gpus, timeout=120)
    took = time.perf_counter() - started
    expected = float(sum(range(1, len(results) + 1)))
    check(len(results) == ranks and [rank for rank, _, _ in results] == list(range(ranks))
          and [device for _, device, _ in results] == list(range(ranks)),
          f"one rank per GPU, rank N on cuda:N ({ranks}, in {took:.1f} s)")
    check(all(value.device.type == "cpu" and torch.equal(value, torch.full((4,), expected)) for _, _, value in results),
          f"the all_reduce gives {expected} on every rank; the CUDA tensors came back on the CPU")
    check(not torch.cuda.is_initialized() and cuda_started() is None,
          "this process has not started CUDA (nor the driver) through the launch")

    started = time.perf_counter()
    states = colab_gpu.launch(ddp_steps, 20, timeout=180)
    check(all(torch.equal(states[0][name], state[name]) for state in states for name in state),
          f"DDP: 20 steps, the weights equal on all {len(states)} rank(s) ({time.perf_counter() - started:.1f} s)")

    if gpus == 1:
        started = time.perf_counter()
        sums = colab_gpu.launch(gloo_sharing_one_gpu, nprocs=2, backend="gloo", timeout=120)
        check(sums == [3 * 1024 * 1024.0] * 2,
              f"two Gloo ranks sharing the one GPU: {sums} ({time.perf_counter() - started:.1f} s)")

    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "pids")
        nprocs, backend = (ranks, "nccl") if ranks > 1 else (2, "gloo")
        started = time.perf_counter()
        try:
            colab_gpu.launch(fail_holding_memory, path, nprocs=nprocs, backend=backend, timeout=120)
            check(False, "a failing rank raises RankError")
        except RankError as error:
            took = time.perf_counter() - started
            check(error.rank == nprocs - 1 and "ValueError: the last rank gives up" in str(error) and took < 30,
                  f"a failing rank ({backend}, {nprocs} ranks): {error} ({took:.1f} s)")
        pids = [int(pid) for pid in open(path).read().split()]
        ends = time.monotonic() + 10
        while any(os.path.exists(f"/proc/{pid}") for pid in pids) and time.monotonic() < ends:
            time.sleep(0.1)
        check(not any(os.path.exists(f"/proc/{pid}") for pid in pids), f"no rank left: {pids}")
        ends = time.monotonic() + 15
        while time.monotonic() < ends:
            holding = [(process.pid, process.used_memory) for gpu in colab_gpu.status().gpus
                       for process in (gpu.processes or ()) if process.pid in pids]
            if not holding:
                break
            time.sleep(0.5)
        check(not holding, f"no GPU memory held by the failed run's processes (NVML): {holding}")

    available = torch.cuda.is_available()  # initializes the CUDA driver, not torch's CUDA
    said = cuda_started()
    check(available and not torch.cuda.is_initialized() and said is not None and "driver" in said,
          f"torch.cuda.is_available() initialized the driver behind torch.cuda.is_initialized(): {said}")
    try:
        colab_gpu.launch(reduce_on_gpus, timeout=60)
        check(False, "a launch after torch.cuda.is_available() is refused")
    except LaunchRefused as error:
        check("the CUDA driver is initialized" in str(error), f"refused: {error}")
    torch.zeros(1, device="cuda")
    try:
        colab_gpu.launch(reduce_on_gpus, timeout=60)
        check(False, "a launch after a tensor on cuda is refused")
    except LaunchRefused as error:
        check("torch.cuda.is_initialized() is True" in str(error), "refused after a tensor on cuda too")
    print(f"{len(failures)} failed, {time.perf_counter() - began:.0f} s in all")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
