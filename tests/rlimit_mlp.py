"""A real MLP training step on the CPU under an address-space limit, so torch's allocator
fails for real. Run in a subprocess by test_find_batch.py; benchmarks/find_batch_vs_peers.py
imports the problem and the bisection for the largest size that runs.

Usage: python rlimit_mlp.py ROOM_MIB INPUT HIDDEN STEPS
Prints one JSON line: the search's trials and answer, whether the answer runs again, and
the largest size that runs (bisection with real runs under the same limit, same process).
"""
import json
import resource
import sys
import time
from typing import Callable

import torch

from colab_gpu.batch import find_batch, is_out_of_memory
from colab_gpu.host import process_status


def mlp_under_limit(room_mib: int, width: int, hidden: int,
                    on_batch: Callable[[int], None] = lambda size: None):
    """A seeded MLP 'width-hidden-width' and its SGD training step, with the address space
    limited to ``room_mib`` MiB above the process once it has run one step. ``step(size, x)``
    trains on ``x`` when given (Lightning's batches) and reports each batch that completed to
    ``on_batch``, as ``BatchResult.samples_computed`` counts them."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(width, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, width))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def step(batch_size: int, x=None) -> None:
        x = torch.randn(batch_size, width) if x is None else x
        model(x).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        on_batch(batch_size)

    step(2)  # threads and allocator pools exist before the limit is measured against
    limit = process_status()["VmSize"] + room_mib * 1024 ** 2
    resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))
    return model, optimizer, step


def runs(step, size: int, steps: int) -> bool:
    """Whether ``steps`` steps at ``size`` run; an out-of-memory error is False, others raise."""
    try:
        for _ in range(steps):
            step(size)
        return True
    except RuntimeError as error:
        if not is_out_of_memory(error):
            raise
    return False  # outside the except block: the failed step's frames are gone


def largest_that_runs(step, steps: int, low: int, divisor: int) -> int:
    """The largest size that runs, by doubling from ``low`` (taken to run) then bisecting
    until the bracket is within 1/``divisor`` of it (or one sample)."""
    high = low * 2
    while runs(step, high, steps):
        low, high = high, high * 2
    while high - low > max(1, low // divisor):
        middle = (low + high) // 2
        low, high = (middle, high) if runs(step, middle, steps) else (low, middle)
    return low


def main(room_mib: int, width: int, hidden: int, steps: int) -> None:
    model, optimizer, step = mlp_under_limit(room_mib, width, hidden)
    began = time.perf_counter()
    result = find_batch(step, restore=[model, optimizer], steps=steps, progress=False)
    seconds = time.perf_counter() - began
    answer_runs = runs(step, result.answer, steps)
    largest = largest_that_runs(step, steps, result.answer, 100)
    print(json.dumps({
        "answer": result.answer, "answer_runs": answer_runs, "largest": largest,
        "trials": [[t.size, t.outcome] for t in result.trials], "oom": result.out_of_memory_count,
        "samples": result.samples_computed, "seconds": seconds, "stopped": result.stopped,
        "notes": result.notes,
    }))


if __name__ == "__main__":
    main(*map(int, sys.argv[1:5]))
