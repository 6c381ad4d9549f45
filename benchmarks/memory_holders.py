"""How fast the holder ranking walks large containers, against the least possible work.

The baseline is a bare loop that reads each tensor's storage size (what any ranking must do at
least); the ranking adds the walk, the visited set and the shared-storage bookkeeping. Both run
side by side in one process, so the printed ratios hold on a loaded machine too.

    python benchmarks/memory_holders.py
"""
from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this checkout's colab_gpu

import numpy  # noqa: E402
import torch  # noqa: E402

from colab_gpu.memory import rank_holders  # noqa: E402


def best_of(repeats: int, work) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    return min(times)


def baseline(tensors) -> int:
    return sum(t.untyped_storage().nbytes() for t in tensors)


def main() -> None:
    many = [torch.ones(2) for _ in range(100_000)]
    nested = {"layer%d" % i: {"w": torch.ones(4), "cfg": list(range(20))} for i in range(20_000)}
    ints = list(range(1_000_000))
    arrays = [numpy.ones(2, dtype=numpy.float32) for _ in range(100_000)]  # each lent to a tensor
    lent = [torch.from_numpy(array) for array in arrays]
    cases = [
        ("list of 100,000 small tensors", lambda: rank_holders([("many", many)], torch), lambda: baseline(many)),
        ("dict of 20,000 dicts (tensor + 20 ints)", lambda: rank_holders([("nested", nested)], torch),
         lambda: baseline([entry["w"] for entry in nested.values()])),
        ("list of 1,000,000 ints", lambda: rank_holders([("ints", ints)], torch), lambda: sum(ints)),
        ("100,000 NumPy arrays and the tensors made from them",
         lambda: rank_holders([("arrays", arrays), ("lent", lent)], torch), lambda: baseline(lent)),
    ]
    for name, ranking, least in cases:
        ranked, floor = best_of(3, ranking), best_of(3, least)
        print(f"{name}: ranking {ranked * 1000:.0f} ms, baseline {floor * 1000:.0f} ms, "
              f"ratio {ranked / floor:.1f}x")


if __name__ == "__main__":
    main()
