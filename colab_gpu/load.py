"""How busy the GPUs and this machine's CPUs were over a stretch of time, and what that says,
in the style of the advice rules: a condition on the figures and one line to show.

* :func:`one_gpu_busy`: one GPU works while the others idle (the live monitor's samples);
* :class:`CellLoad`: the GPU's and the CPUs' busy share during one cell (``--cells``), and
  :func:`input_pipeline_hint` when the GPU waited while the CPUs were saturated, which
  ``%gpu_status``'s advice repeats (``session.cell_load``).

The samples are the live sampler's (each with ``.time`` and ``.gpus``, readings with
``.index`` and ``.utilization`` in percent); nothing here reads a device or imports torch.
The busy shares of a cell are measured by the live monitor (live/cells.py).
"""
from __future__ import annotations

import dataclasses
import sys
from typing import Any, Collection, Iterable, List, Mapping, Optional, Sequence

from .spelling import command

__all__ = ["BUSY", "IDLE", "IDLE_SECONDS", "SATURATED", "CellLoad", "gpu_list", "one_gpu_busy",
           "TUNE", "input_pipeline_hint", "busy_words", "data_loaders"]

BUSY = 50.0  # percent: a GPU at work at least half the time
# percent: a GPU doing nothing (NVML reads 0 on an idle datacenter GPU, a few percent with a display)
IDLE = 5.0
IDLE_SECONDS = 10.0  # how long the other GPUs must have idled: not a moment between two phases
SATURATED = 0.9  # a share of the CPU time: a core (the Python thread), or all the cores, this busy


def gpu_list(indices: Sequence[int]) -> str:
    """"GPU 1", "GPUs 1-3", "GPUs 1, 3 and 5"."""
    indices = sorted(indices)
    if len(indices) == 1:
        return f"GPU {indices[0]}"
    if indices == list(range(indices[0], indices[-1] + 1)):
        return f"GPUs {indices[0]}-{indices[-1]}"
    return f"GPUs {', '.join(map(str, indices[:-1]))} and {indices[-1]}"


def one_gpu_busy(samples: Sequence, hidden: Collection[int] = (),
                 least_seconds: Optional[float] = None) -> Optional[str]:
    """The hint when, up to the newest of ``samples``, one GPU has worked (busy BUSY % on
    average) while every other one idled (at most IDLE %) for ``least_seconds`` (IDLE_SECONDS)
    or more; None otherwise. GPUs in ``hidden`` (hidden from torch by CUDA_VISIBLE_DEVICES:
    this kernel cannot use them) are left out, and so is a GPU that reports no utilization."""
    least_seconds = IDLE_SECONDS if least_seconds is None else least_seconds
    if not samples:
        return None
    newest = {r.index: r.utilization for r in samples[-1].gpus
              if r.index not in hidden and r.utilization is not None}
    if len(newest) < 2:
        return None
    busy = max(newest, key=lambda index: newest[index])  # the busiest now: the one that works
    others = sorted(index for index in newest if index != busy)
    start, total = len(samples), 0.0
    for position in range(len(samples) - 1, -1, -1):  # back while the others idled
        readings = {r.index: r.utilization for r in samples[position].gpus}
        if any(readings.get(index) is None or readings[index] > IDLE for index in others) \
                or readings.get(busy) is None:
            break
        start, total = position, total + readings[busy]
    stretch = samples[start:]
    if not stretch or stretch[-1].time - stretch[0].time < least_seconds or total / len(stretch) < BUSY:
        return None
    seconds = stretch[-1].time - stretch[0].time
    return (f"only GPU {busy} is busy: {gpu_list(others)} idle for the last {seconds:.0f} s; "
            f"torch.nn.DataParallel, or DistributedDataParallel through "
            f"{command('%%distributed', 'colab_gpu.launch()')}, would use them")


@dataclasses.dataclass(frozen=True)
class CellLoad:
    """How busy the GPUs and the CPUs were during one cell.

    ``gpu_busy``: the busiest GPU's mean utilization over the samples taken during the cell
    (percent; None without samples), ``gpu``: that GPU's index. ``process_cpu``: this
    process's CPU time over the cell's wall time, in cores (1.0: one core all the time, the
    Python thread that feeds the GPU with ``num_workers=0``); ``thread_wanted``: the share of
    the cell its main thread ran or waited for a core (on a machine shared with busier processes,
    a thread that computes without pause may run only half of it); ``workers_cpu``: with its child
    processes (DataLoader workers), as a share of all ``cores`` it may use (None where they
    cannot be read: not Linux). Other processes' use of the CPUs is not counted: on a shared
    machine it says nothing of this notebook's input pipeline.
    """

    seconds: float
    samples: int
    gpu: Optional[int]
    gpu_busy: Optional[float]
    process_cpu: Optional[float]
    workers_cpu: Optional[float]
    cores: int
    thread_wanted: Optional[float] = None

    @property
    def cpu_saturated(self) -> bool:
        """The Python thread kept (or wanted) a core busy, or the process and its workers every core."""
        return any(share is not None and share >= SATURATED
                   for share in (self.process_cpu, self.thread_wanted, self.workers_cpu))

    @property
    def input_bound(self) -> bool:
        """The GPU worked but waited (busy between IDLE and BUSY %) while the CPUs were
        saturated, over a cell long enough to be sampled twice."""
        return (self.samples >= 2 and self.gpu_busy is not None and IDLE < self.gpu_busy < BUSY
                and self.cpu_saturated)

    def cpu_percent(self) -> float:
        """The CPUs' busiest figure, in percent: of one core for the process, of all with its workers."""
        return 100 * max(min(self.process_cpu or 0.0, 1.0), min(self.thread_wanted or 0.0, 1.0),
                         self.workers_cpu or 0.0)


def busy_words(load: CellLoad) -> str:
    """"GPU 0 busy 31 %; CPU: this process 58 % of a core, its Python thread running or waiting
    for a core 99 % of the time, with its workers 64 % of 2 cores"."""
    gpu = "GPU busy n/a (no sample during the cell)" if load.gpu_busy is None else \
        f"GPU {load.gpu} busy {load.gpu_busy:.0f} %"
    parts: List[str] = []
    if load.process_cpu is not None:
        parts.append(f"this process {100 * load.process_cpu:.0f} % of a core")
    if load.thread_wanted is not None:
        parts.append(f"its Python thread running or waiting for a core {100 * min(load.thread_wanted, 1.0):.0f} % "
                     f"of the time")
    if load.workers_cpu is not None:
        parts.append(f"with its workers {100 * load.workers_cpu:.0f} % of {load.cores} "
                     f"{'core' if load.cores == 1 else 'cores'}")
    return f"{gpu}; CPU: {', '.join(parts) or 'n/a'}"


TUNE = ("%tune_loader {}", "colab_gpu.tune_loader({})")  # the command the hint names, as magic and as Python


def input_pipeline_hint(load: CellLoad, loaders: Iterable[str] = (), tune: Optional[str] = None) -> Optional[str]:
    """The hint for an input-bound cell, naming the notebook's first DataLoader; None otherwise.
    ``tune``: one of :data:`TUNE`, where the caller decided how its user runs commands (a cell
    hook runs outside the magic that set it up); by :func:`colab_gpu.spelling.command` now else."""
    if not load.input_bound:
        return None
    name = next(iter(loaders), None)
    tune = tune or command(*TUNE)
    target = tune.format(name or ("NAME" if tune == TUNE[0] else "loader"))
    return (f"GPU busy {load.gpu_busy:.0f} % while the CPUs were at {load.cpu_percent():.0f} %: "
            f"the input pipeline may be the bottleneck: try {target}")


def data_loaders(namespace: Mapping[str, Any]) -> List[str]:
    """The names of the notebook's ``torch.utils.data.DataLoader`` objects, a training one
    ("train" in its name) first: what the hint asks to tune. None before torch's data module
    is imported (no DataLoader can exist)."""
    data = sys.modules.get("torch.utils.data")
    loader = getattr(data, "DataLoader", None)
    if loader is None:
        return []
    names = [name for name, value in list(namespace.items()) if not name.startswith("_") and isinstance(value, loader)]
    return sorted(names, key=lambda name: "train" not in name.lower())
