"""What would help where loader settings cannot, read from what was measured (pure)."""
from __future__ import annotations

import multiprocessing
from typing import List, Optional, Sequence

from ..words import duration
from .measure import Split
from .result import Measurement, StepTiming

__all__ = ["cheaper_batches", "notebook_workers", "hints", "CHEAP"]

CHEAP = 0.002  # seconds: a batch this cheap costs about as much to pass from a worker process


def _percent(share: float) -> str:
    return f"{share * 100:.0f} %"


def cheaper_batches(split: Split, device: Optional[str]) -> str:
    """What makes each batch cheaper, for the part of a batch's time that dominates."""
    parts = [("fetch", split.share("fetch")), ("collate", split.share("collate")),
             ("transfer", split.share("transfer"))]
    part, share = max(parts, key=lambda each: each[1])
    if part == "transfer":
        return (f"the copy to {device} takes {_percent(share)} of a batch's time: pin_memory=True with "
                f".to(device, non_blocking=True) in the loop, or keep the dataset on the GPU if it fits")
    if part == "collate":
        return (f"collate_fn takes {_percent(share)} of a batch's time: have items arrive as arrays a "
                f"batch stacks without conversion, or build whole batches in the dataset's __getitems__")
    per_item = split.fetch / split.items if split.items else split.fetch
    return (f"__getitem__ takes {_percent(share)} of a batch's time ({duration(per_item)} an item): "
            f"cache decoded samples (decode once, keep the arrays in memory or in .npy files), use a "
            f"lighter transform (resize before augmenting), or augment whole batches on the GPU")


def notebook_workers(parts: Sequence[str], method: str) -> str:
    """Why workers cannot start here, and how to let them: a cell's classes are in no file a
    spawned worker can import."""
    fork = ", or on Linux pass multiprocessing_context='fork'" \
        if "fork" in multiprocessing.get_all_start_methods() else ""
    return (f"worker processes start by {method!r} here (the default on macOS and Windows) and import "
            f"what they run by name, but {', '.join(parts)} was defined in a notebook cell, which no "
            f"worker can import: save it in a module (%%writefile mydata.py in a cell of its own, then "
            f"from mydata import ...) and build the loader from there{fork}; "
            f"only num_workers=0 was measured")


def hints(*, cores: int, cores_how: str, zero: Optional[Measurement], answer: Measurement,
          split: Split, device: Optional[str], step: Optional[StepTiming], still_bound: bool,
          notebook: Sequence[str], method: str, workers_failed: bool, load: Optional[float]) -> List[str]:
    """What would help, each a sentence: workers that cannot start from a notebook; workers
    that failed; one usable core; workers that gained nothing; a loader that still bounds the
    step; items that wait on storage rather than compute."""
    said: List[str] = []
    cheaper = cheaper_batches(split, device)
    if notebook:
        said.append(notebook_workers(notebook, method))
    if workers_failed:
        said.append("every setting with workers failed in a worker (the traceback is below) while this "
                    "process reads the same items: state that does not survive the start of a process "
                    "(an open file or connection, CUDA) is best opened in __getitem__ or worker_init_fn")
    elif cores == 1:
        said.append(f"one usable core ({cores_how}): worker processes would take turns on it with the "
                    f"training loop, so more workers cannot help; make each batch cheaper: {cheaper}")
    elif not notebook and zero is not None and zero.batches_per_second and answer.setting.num_workers == 0 \
            and (step is None or still_bound):
        if load is not None and load >= cores:
            why = (f"the cores were busy with other work (load average {load:.1f} on {cores}), so workers "
                   f"found no idle core")
        elif split.total < CHEAP:
            why = f"a batch costs only {duration(split.total)} to make, about what passing it from a worker costs"
        else:
            why = (f"a batch costs {duration(split.total)} in one process, yet workers made no more: its work "
                   f"may already use every core (threaded decoding, torch's own threads) or wait on one "
                   f"shared resource")
        serial = ("; without workers each batch is made in the training loop's own thread, between two steps"
                  if step is not None else "")
        said.append(f"more workers did not help on {cores} cores: {why}{serial}; make each batch cheaper: {cheaper}")
    elif still_bound:
        said.append(f"even with {answer.setting.label()} the loader bounds training: {cheaper}")
    one = split.collate_one_thread
    if one is not None and one < split.collate / 3:
        said.append(f"collate_fn takes {duration(split.collate)} a batch with torch's threads but "
                    f"{duration(one)} with one: on a busy machine they wait for each other; "
                    f"torch.set_num_threads(1) in the training process helps, and so do workers, which "
                    f"run torch on one thread each")
    if split.fetch_blocked is not None and split.fetch_blocked >= 0.5 and split.share("fetch") > 0.3:
        said.append(f"items wait {_percent(split.fetch_blocked)} of their fetch time "
                    f"(on storage or the network) rather than compute: workers past the core count "
                    f"help; copying the data to local disk or caching it in memory helps more")
    return said
