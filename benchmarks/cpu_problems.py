"""Real CPU training steps under an address-space limit, of shapes other than the MLP, for
benchmarks/find_batch_vs_peers.py and tests/test_find_batch_claims.py.

Each problem is a seeded model, its optimizer and its training step; ``under_limit`` runs one
step at size 2 (threads and allocator pools exist), then limits the address space (RLIMIT_AS)
to ROOM MiB above what the process then uses, so torch's CPU allocator raises its real
out-of-memory error at a real boundary. glibc's allocator keeps its default settings, as a
user has them.

- ``cnn``: a small convolutional net (batch norm, 3 conv blocks) on 64x64 RGB images, SGD.
- ``transformer``: a 2-layer transformer encoder (d_model 32, 2 heads) at sequence 256, Adam.
- ``attention``: in-batch (contrastive) attention: two small encoders and a B x B matrix of
  logits, CLIP's loss, so memory grows with B squared.
- ``mlp``: the MLP of tests/rlimit_mlp.py, 128-512-128.

Run in a fresh process, it answers whether one size runs there (what "the largest size that
runs" is measured on):
    python benchmarks/cpu_problems.py PROBLEM ROOM_MIB SIZE [STEPS]
exits 0 when STEPS steps (default 3) at SIZE ran, 3 when they ran out of memory.
"""
from __future__ import annotations

import math
import pathlib
import resource
import sys
from typing import Callable, NamedTuple

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's colab_gpu and tests, run as a script or imported

STEPS = 3  # steps a trial, for every tool


class Problem(NamedTuple):
    model: object
    optimizer: object
    step: Callable  # step(batch_size, x=None): x is a batch a data loader made (Lightning's)
    shape: tuple  # of one input row, for a data loader


def _cnn():
    import torch
    from torch import nn

    def block(inputs, outputs):
        return nn.Sequential(nn.Conv2d(inputs, outputs, 3, padding=1, bias=False), nn.BatchNorm2d(outputs),
                             nn.ReLU(), nn.MaxPool2d(2))

    model = nn.Sequential(block(3, 8), block(8, 16), block(16, 32), nn.AdaptiveAvgPool2d(1),
                          nn.Flatten(), nn.Linear(32, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def loss(x):
        return nn.functional.cross_entropy(model(x), torch.zeros(len(x), dtype=torch.long))

    return model, optimizer, (3, 64, 64), loss


def _transformer():
    import torch
    from torch import nn

    width, sequence = 32, 256
    layer = nn.TransformerEncoderLayer(width, nhead=2, dim_feedforward=4 * width, batch_first=True)
    model = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)

    def loss(x):
        return model(x).square().mean()

    return model, optimizer, (sequence, width), loss


def _attention():
    import torch
    from torch import nn

    width, embedding = 64, 32

    def encoder():
        return nn.Sequential(nn.Linear(width, 128), nn.ReLU(), nn.Linear(128, embedding))

    model = nn.ModuleDict({"left": encoder(), "right": encoder()})
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def loss(x):
        left = nn.functional.normalize(model["left"](x[:, 0]), dim=1)
        right = nn.functional.normalize(model["right"](x[:, 1]), dim=1)
        logits = left @ right.T / 0.07  # B x B
        labels = torch.arange(len(x))
        return (nn.functional.cross_entropy(logits, labels) + nn.functional.cross_entropy(logits.T, labels)) / 2

    return model, optimizer, (2, width), loss  # a pair: the two views a contrastive loss matches


BUILDERS = {"cnn": _cnn, "transformer": _transformer, "attention": _attention}
# MiB of address space above the warmed-up process: boundaries a trial reaches in well under
# a second on one loaded core.
ROOMS = {"cnn": 256, "transformer": 256, "attention": 128, "mlp": 96}
ABOUT = {"cnn": "small CNN (3 conv blocks, batch norm) on 64x64 images, SGD",
         "transformer": "2-layer transformer encoder (d_model 32, 2 heads), sequence 256, Adam",
         "attention": "in-batch attention (CLIP's loss: B x B logits), SGD",
         "mlp": "MLP 128-512-128, SGD"}


def limit_address_space(room_mib: int) -> None:
    """RLIMIT_AS at the address space in use now plus ``room_mib`` MiB."""
    from colab_gpu.host import process_status

    limit = process_status()["VmSize"] + room_mib * 1024 ** 2
    resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))


def under_limit(name: str, room_mib: int, on_batch: Callable[[int], None] = lambda size: None) -> Problem:
    """Problem ``name`` with one step run at size 2 and the address space then limited;
    ``on_batch(size)`` is told of each batch whose step completed."""
    import torch

    torch.set_num_threads(1)  # two cores shared by many processes: a second thread only waits
    # Near the limit oneDNN's convolutions fail with "could not create a primitive" (the mmap of
    # a JIT kernel's code buffer refused): colab_gpu takes it for out of memory under a limit,
    # Lightning and accelerate do not and would stop on it as the user's error.
    torch.backends.mkldnn.enabled = False
    torch.manual_seed(0)
    if name == "mlp":
        from tests.rlimit_mlp import mlp_under_limit

        model, optimizer, step = mlp_under_limit(room_mib, 128, 512, on_batch)
        return Problem(model, optimizer, step, (128,))
    model, optimizer, shape, loss = BUILDERS[name]()

    def step(batch_size: int, x=None) -> None:
        x = torch.randn(batch_size, *shape) if x is None else x
        loss(x).backward()
        optimizer.step()
        optimizer.zero_grad()
        on_batch(len(x))

    step(2)  # threads and allocator pools exist before the limit is measured against
    limit_address_space(room_mib)
    return Problem(model, optimizer, step, shape)


def runs(step, size: int, steps: int = STEPS) -> bool:
    """Whether ``steps`` steps at ``size`` run; an out-of-memory error is False, others raise."""
    from colab_gpu import is_out_of_memory

    try:
        for _ in range(steps):
            step(size)
        return True
    except (RuntimeError, MemoryError) as error:
        if not is_out_of_memory(error):
            raise
    return False  # outside the except block: the failed step's frames are gone


def largest_in_fresh_processes(runs_fresh: Callable[[int], bool], low: int = 2, divisor: int = 100) -> int:
    """The largest size for which ``runs_fresh(size)`` (one fresh process a size) is True: doubling
    from ``low`` (taken to run), then bisecting until the bracket is within 1/``divisor`` of it."""
    high = low * 2
    while runs_fresh(high):
        low, high = high, high * 2
    while high - low > max(1, math.floor(low / divisor)):
        middle = (low + high) // 2
        low, high = (middle, high) if runs_fresh(middle) else (low, middle)
    return low


def main(name: str, room_mib: int, size: int, steps: int = STEPS) -> int:
    problem = under_limit(name, room_mib)
    return 0 if runs(problem.step, size, steps) else 3


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], *map(int, sys.argv[2:])))
