"""``find_batch``: the largest (or fastest) batch size that fits, in few trials.

Layers: ``oom`` says what an error means, ``search`` picks sizes (pure), ``trial`` runs one
size and measures it, ``state`` leaves the caller's objects as they were, ``result`` holds
the answer, ``render`` / ``progress`` show it. Nothing here imports torch or IPython at
import time.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Iterable, Optional, Union

from .oom import is_out_of_memory
from .result import DEVICE_BROKEN, BatchResult, Trial
from .search import Search, SearchError
from .state import RestoreError, Snapshot
from .trial import device_label, release_memory, run_trial

__all__ = ["find_batch", "is_out_of_memory", "BatchResult", "Trial", "SearchError", "RestoreError"]


def search_batch(step: Callable[[int], Any], snapshot: Snapshot, *, variable: str = "batch_size",
                 mode: str = "max", start: Optional[int] = None, maximum: Optional[int] = None,
                 steps: int = 3, headroom="0", multiple_of: int = 1, device: str = "auto",
                 measure_memory: bool = True, tolerance: float = 0.05,
                 progress: Optional[Callable[[Search], None]] = None) -> BatchResult:
    """Search with ``step(size)``, restoring ``snapshot`` and freeing memory after every trial.

    The user's own error (not an out-of-memory, not a broken device) is raised again once
    everything is restored, with its traceback.
    """
    if steps < 1:
        raise SearchError(f"--steps {steps}: give a whole number >= 1")
    device = device or "auto"
    if device != "auto" and device != "cpu" and not device.startswith("cuda"):
        raise SearchError(f"--device {device!r}: use auto, cpu, cuda or cuda:N")
    errors = []

    def run(size: int) -> Trial:
        trial, error = run_trial(step, size, steps, device, measure_memory)
        snapshot.restore()
        if trial.outcome != DEVICE_BROKEN:
            release_memory(device)
        if error is not None:
            errors.append(error)
        return trial

    search = Search(run, variable=variable, mode=mode, start=start, maximum=maximum,
                    multiple_of=multiple_of, headroom=headroom, tolerance=tolerance,
                    on_trial=progress or (lambda search: None))
    result = search.run()
    result = BatchResult(**{**result.__dict__, "device": device_label(device)})
    if errors and result.trials[-1].outcome != DEVICE_BROKEN:
        raise errors[-1]
    return result


def find_batch(fn: Callable[[int], Any], *, variable: str = "batch_size", mode: str = "max",
               start: Optional[int] = None, max: Optional[int] = None, steps: int = 3,
               headroom: Union[str, int] = "0", multiple_of: int = 1,
               restore: Union[Iterable[Any], Dict[str, Any]] = (), device: str = "auto",
               measure_memory: bool = True, progress: bool = True) -> BatchResult:
    """Find the largest batch size that fits (``mode="max"``) or the fastest (``"throughput"``).

    ``fn(batch_size)`` runs one training (or inference) step. Each trial runs it ``steps``
    times, the first untimed. ``restore``: models, optimizers, schedulers or tensors whose
    state is put back after every trial (saved on the CPU). ``headroom``: memory to keep
    free, bytes (``"512MiB"``) or a share (``"10%"``). The random generators are restored
    too. Ctrl-C stops the search and returns the best size so far. The answer is always a
    size that ran and fitted.
    """
    objects = restore if isinstance(restore, dict) else {
        f"{type(obj).__name__}#{index}": obj for index, obj in enumerate(restore)}
    from .progress import reporter

    report = reporter() if progress else None
    result = search_batch(fn, Snapshot(objects=objects), variable=variable, mode=mode, start=start,
                          maximum=max, steps=steps, headroom=headroom, multiple_of=multiple_of,
                          device=device, measure_memory=measure_memory, progress=report)
    if report is not None:
        report.finish(result)
    return result
