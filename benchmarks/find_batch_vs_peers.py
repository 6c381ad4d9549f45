"""colab_gpu.find_batch against Lightning's Tuner.scale_batch_size (binsearch) and
accelerate's find_executable_batch_size, side by side in one run.

1. The CPU problem of issue 6: an MLP 1024-4096-1024 training step (SGD, 3 steps a trial)
   under an address-space limit, so torch's CPU allocator raises its real out-of-memory
   error at a real boundary. Each tool runs in its own fresh subprocess under the same limit
   (ROOM MiB above the address space the process uses after one warm-up step); the true
   largest size is found by bisection with real runs in another one. glibc's mmap threshold
   is fixed (MALLOC_MMAP_THRESHOLD_) in every subprocess: with the default dynamic one,
   freed blocks stay in the heap and the boundary moves by about 10 % from one attempt to
   the next, so "the largest size that runs" would not be well defined. colab_gpu runs from
   its default start and from 65536, accelerate's start.
2. The memory-fit path on milabench's measured memory curves (tests/milabench_replay.py):
   colab_gpu and accelerate on a device that fails exactly where the real curve crosses
   capacity (Lightning needs a real Trainer and data loader, so it is left out there), each
   from its default start and from 3x the true answer (accelerate only shrinks: its own use),
   at the four capacities the search was tuned on and, held out, at every 2 GiB from 12 to 80 but those.
   Under each table, the same curves on a device where going past capacity kills the process
   (the CPU without ulimit -v): how often colab_gpu ran a size past it, with its default
   --headroom there and with none.

Needs: pip install torch==2.13.0 lightning accelerate (a separate venv; see the report).
Run: python benchmarks/find_batch_vs_peers.py [--room MIB] [--skip-cpu]
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
WIDTH, HIDDEN, STEPS = 1024, 4096, 3


def _problem(room_mib: int):
    """The model, its step (counting samples into the log), the limit set (inside a worker)."""
    from tests.rlimit_mlp import mlp_under_limit

    log = {"sizes": [], "oom": 0, "samples": 0}
    model, optimizer, step = mlp_under_limit(room_mib, WIDTH, HIDDEN,
                                             on_batch=lambda size: log.update(samples=log["samples"] + size))
    return model, optimizer, step, log


def _trial_counter(step, log):
    """Wrap a step so every batch (a trial = a new size) and every OOM is counted."""

    def counted(batch_size: int, x=None):
        if not log["sizes"] or log["sizes"][-1] != batch_size:
            log["sizes"].append(batch_size)
        try:
            return step(batch_size, x)
        except RuntimeError:
            log["oom"] += 1
            raise

    return counted


def start_in(tool: str) -> int | None:
    """The start a tool's name gives ("accelerate:128" -> 128), or None for the tool's default."""
    return int(tool.split(":")[1]) if ":" in tool else None


def worker(tool: str, room_mib: int) -> dict:
    model, optimizer, step, log = _problem(room_mib)
    began = time.perf_counter()
    if tool == "truth":
        from tests.rlimit_mlp import largest_that_runs

        found = largest_that_runs(step, STEPS, 2, 400)  # the warm-up step ran size 2
        return {"found": found, "seconds": time.perf_counter() - began}
    if tool.startswith("colab_gpu"):
        from colab_gpu import find_batch

        result = find_batch(step, restore=[model, optimizer], steps=STEPS, progress=False,
                            start=start_in(tool), measure_memory=tool != "colab_gpu (no memory fit)")
        return {"found": result.answer, "trials": len(result.trials), "oom": result.out_of_memory_count,
                "samples": result.samples_computed, "seconds": time.perf_counter() - began}
    counted = _trial_counter(step, log)
    if tool.startswith("accelerate"):
        from accelerate.utils import find_executable_batch_size

        @find_executable_batch_size(starting_batch_size=start_in(tool))
        def train(batch_size):
            for _ in range(STEPS):
                counted(batch_size)
            return batch_size

        found = train()
    else:
        found = _lightning(model, optimizer, counted, tool)
    return {"found": found, "trials": len(log["sizes"]), "oom": log["oom"], "samples": log["samples"],
            "seconds": time.perf_counter() - began, "sizes": log["sizes"]}


def _lightning(model, optimizer, counted, tool: str):
    import lightning as L
    import torch
    from lightning.pytorch.tuner import Tuner

    class Rows(torch.utils.data.Dataset):
        def __len__(self):
            return 1 << 22

        def __getitem__(self, index):
            return torch.randn(WIDTH)

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.batch_size = 2
            self.net = model

        def train_dataloader(self):
            return torch.utils.data.DataLoader(Rows(), batch_size=self.batch_size)

        def training_step(self, batch, index):
            counted(batch.shape[0], batch)  # the same step, on Lightning's batch
            return None  # the step already updated the weights

        def configure_optimizers(self):
            return optimizer

    trainer = L.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, max_epochs=1)
    kwargs = {"mode": "binsearch"}
    if tool == "lightning:max_val=65536":
        kwargs["max_val"] = 65536
    return Tuner(trainer).scale_batch_size(Module(), **kwargs)


def run_worker(tool: str, room_mib: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MALLOC_MMAP_THRESHOLD_": "65536",
           "PYTHONWARNINGS": "ignore"}
    done = subprocess.run([sys.executable, __file__, "--worker", tool, "--room", str(room_mib)],
                          capture_output=True, text=True, env=env)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        return {"error": f"exit {done.returncode}: {(done.stderr.strip().splitlines() or [''])[-1][:120]}"}
    return json.loads(lines[-1])


def cpu_problem(room_mib: int, tools) -> None:
    print(f"== CPU problem: MLP {WIDTH}-{HIDDEN}-{WIDTH}, SGD, {STEPS} steps a trial, "
          f"address space limited to {room_mib} MiB above the warmed-up process")
    truth = run_worker("truth", room_mib)
    largest = truth["found"]
    print(f"true largest size that runs: {largest} (bisection with real runs, {truth['seconds']:.0f} s)")
    print(f"{'tool':<28}{'trials':>7}{'OOMs':>6}{'samples':>11}{'wall s':>8}{'found':>8}{'% of largest':>14}  ran?")
    for tool in tools:
        row = run_worker(tool, room_mib)
        if "error" in row:
            print(f"{tool:<28} failed: {row['error']}")
            continue
        ran = "yes" if tool.startswith("colab_gpu") or row["found"] in row.get("sizes", []) else "NO"
        print(f"{tool:<28}{row['trials']:>7}{row['oom']:>6}{row['samples']:>11}{row['seconds']:>8.1f}"
              f"{row['found']:>8}{100 * row['found'] / largest:>13.1f}%  {ran}")


def milabench_problems() -> None:
    sys.path.insert(0, str(ROOT))
    from tests.milabench_replay import CAPACITIES_GIB, HELD_OUT_GIB

    print("\n== memory fit on milabench's measured curves (device fails where the curve crosses capacity)")
    print_fit_table(CAPACITIES_GIB, f"{', '.join(map(str, CAPACITIES_GIB))} GiB, the capacities the "
                    f"search's constants were chosen on",
                    ("colab_gpu", "accelerate:128", "colab_gpu from 3x", "accelerate from 3x"))
    # Only colab_gpu here: the peers have no constants to hold out, and accelerate's gc.collect()
    # after every failure (0.15 s in this process) would take a quarter of an hour more.
    print_fit_table(HELD_OUT_GIB, f"held out: every 2 GiB from {HELD_OUT_GIB[0]} to {HELD_OUT_GIB[-1]} "
                    f"but those, capacities the constants never saw",
                    ("colab_gpu", "colab_gpu from 3x"))


def print_fit_table(capacities_gib, about: str, tools) -> None:
    """One row per tool over every fit problem at these capacities (``about`` names them)."""
    from accelerate.utils import find_executable_batch_size

    from colab_gpu.batch.search import Search
    from tests.milabench_replay import ReplayDevice, fit_problems

    rows = {tool: [] for tool in tools}
    for _, curve, capacity, largest in fit_problems(capacities_gib):
        for name in tools:  # "tool", "tool:START" or "tool from 3x" (the true answer)
            start = 3 * largest if name.endswith("from 3x") else start_in(name)
            replay = ReplayDevice(curve, capacity)
            if name.startswith("colab_gpu"):
                result = Search(replay, start=start).run()
                rows[name].append((len(result.trials), result.out_of_memory_count, result.answer / largest))
                continue

            @find_executable_batch_size(starting_batch_size=start)
            def shrink(batch_size):
                if not replay(batch_size).fits:
                    raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
                return batch_size

            found = shrink()
            rows[name].append((len(replay.sizes_run), len(replay.sizes_run) - 1, found / largest))
    print(f"\n{len(rows[tools[0]])} problems (curve x capacity: {about}; true largest >= 20)")
    print(f"{'tool':<20}{'median trials':>14}{'<= 4 trials':>12}{'mean OOMs':>10}"
          f"{'median %':>10}{'worst %':>9}{'>= 95%':>8}{'>= 95% in <= 4 trials':>23}")
    for tool, data in rows.items():
        trials = [t for t, _, _ in data]
        ratios = [r for _, _, r in data]
        both = sum(t <= 4 and r >= 0.95 for t, _, r in data)
        print(f"{tool:<20}{statistics.median(trials):>14}{sum(t <= 4 for t in trials):>12}"
              f"{statistics.mean(o for _, o, _ in data):>10.2f}{100 * statistics.median(ratios):>9.1f}%"
              f"{100 * min(ratios):>8.1f}%{sum(r >= 0.95 for r in ratios):>8}{both:>23}")
    print_past_memory(capacities_gib)


def print_past_memory(capacities_gib) -> None:
    """Where going past memory kills the process instead of raising (the CPU without ulimit -v):
    on how many problems a trial went past capacity, with the default headroom and with none."""
    import dataclasses

    from colab_gpu.batch.search import KILL_HEADROOM, Search
    from tests.milabench_replay import ReplayDevice, fit_problems

    problems = list(fit_problems(capacities_gib))
    past = {}
    for headroom in (None, "0"):
        past[headroom] = 0
        for _, curve, capacity, _ in problems:
            replay = ReplayDevice(curve, capacity)
            Search(lambda size: dataclasses.replace(replay(size), capacity_kills=True),
                   headroom=headroom).run()
            past[headroom] += any(curve(size) > capacity for size in replay.sizes_run)
    print(f"where going past memory kills (the CPU without ulimit -v): a trial went past capacity "
          f"on {past[None]} of {len(problems)} problems with the default --headroom "
          f"{KILL_HEADROOM.spec}, on {past['0']} with --headroom 0")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker")
    parser.add_argument("--room", type=int, default=640,
                        help="MiB of address space above the warmed-up process (default 640: about "
                             "1.5 GiB in all on torch 2.13 CPU)")
    parser.add_argument("--skip-cpu", action="store_true")
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.room)))
        return
    if not args.skip_cpu:
        cpu_problem(args.room, ["colab_gpu", "colab_gpu (no memory fit)", "colab_gpu:65536",
                                "lightning:defaults", "lightning:max_val=65536", "accelerate:65536",
                                "accelerate:128"])
    milabench_problems()


if __name__ == "__main__":
    main()
