"""Run in a subprocess by test_find_batch.py and the benchmark: a real MLP training step
on the CPU under an address-space limit, so torch's allocator fails for real.

Usage: python rlimit_mlp.py ROOM_MIB INPUT HIDDEN STEPS
Prints one JSON line: the search's trials and answer, whether the answer runs again, and
the largest size that runs (bisection with real runs under the same limit, same process).
"""
import json
import resource
import sys
import time

import torch

from colab_gpu.batch import find_batch, is_out_of_memory
from colab_gpu.batch.trial import proc_status


def main(room_mib: int, width: int, hidden: int, steps: int) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(width, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, width))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def step(batch_size: int) -> None:
        x = torch.randn(batch_size, width)
        model(x).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()

    step(2)  # threads and allocator pools exist before the limit is measured against
    limit = proc_status()["VmSize"] + room_mib * 1024 ** 2
    resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))
    began = time.perf_counter()
    result = find_batch(step, restore=[model, optimizer], steps=steps, progress=False)
    seconds = time.perf_counter() - began

    def runs(size: int) -> bool:
        try:
            for _ in range(steps):
                step(size)
            return True
        except RuntimeError as error:
            if not is_out_of_memory(error):
                raise
        return False  # outside the except block: the failed step's frames are gone

    answer_runs = runs(result.answer)
    low, high = result.answer, result.answer * 2
    while runs(high):
        low, high = high, high * 2
    while high - low > max(1, low // 100):
        middle = (low + high) // 2
        low, high = (middle, high) if runs(middle) else (low, middle)
    print(json.dumps({
        "answer": result.answer, "answer_runs": answer_runs, "largest": low,
        "trials": [[t.size, t.outcome] for t in result.trials], "oom": result.out_of_memory_count,
        "samples": result.samples_computed, "seconds": seconds, "stopped": result.stopped,
    }))


if __name__ == "__main__":
    main(*map(int, sys.argv[1:5]))
