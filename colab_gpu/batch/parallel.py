"""find_batch on several GPUs: a ``torch.nn.DataParallel`` model's batch is split across its
GPUs, and the ranks of a ``torch.distributed`` process group (``colab_gpu.launch``,
``%%distributed``, torchrun) each search on their own device, then agree on one answer.

The ranks agree on the smallest of their answers, with one all-reduce (MIN): a rank that
used a larger size than its own answer would run out of memory later, in the middle of
training, and DistributedDataParallel needs every rank at the same size.
"""
from __future__ import annotations

import dataclasses
import sys
from typing import Any, Iterable, List, Optional

from ..words import count
from .result import BatchResult

__all__ = ["across_devices", "agree_across_ranks", "data_parallel_note", "split_sizes"]


def split_sizes(batch: int, devices: int) -> List[int]:
    """The sizes DataParallel gives each GPU of a batch: torch scatters it with
    ``tensor.chunk(devices)``, chunks of ceil(batch / devices), the last one smaller, and
    fewer chunks than devices when the batch is small (a GPU then gets nothing)."""
    chunk = -(-batch // devices)
    return [min(chunk, batch - start) for start in range(0, batch, chunk)]


def _data_parallel(objects: Iterable[Any]) -> Optional[Any]:
    """The first ``torch.nn.DataParallel`` over more than one GPU among ``objects``."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    return next((obj for obj in objects if isinstance(obj, torch.nn.DataParallel)
                 and len(obj.device_ids or ()) > 1), None)


def data_parallel_note(result: BatchResult, model: Any) -> str:
    """What the answer means for a DataParallel ``model``: the whole batch, split across its GPUs."""
    devices = [f"cuda:{index}" for index in model.device_ids]
    where = f"torch.nn.DataParallel over {len(devices)} GPUs ({', '.join(devices)})"
    if result.answer is None:
        return f"the model is {where}: each size tried was the whole batch, split across them"
    shares = split_sizes(result.answer, len(devices))
    if len(set(shares)) == 1 and len(shares) == len(devices):
        split = f"each GPU gets {shares[0]} of it"
    else:
        split = (f"torch splits it with chunk() into {', '.join(map(str, shares))} "
                 f"(a multiple of {len(devices)}, multiple_of={len(devices)}, splits it evenly)")
    return (f"the model is {where}: {result.variable} = {result.answer} is the whole batch; {split}; "
            f"{devices[0]} also gathers the outputs and holds the model, so it fills first and its "
            f"memory is what is measured")


def agree_across_ranks(result: BatchResult) -> BatchResult:
    """``result`` with the smallest answer of every rank, where a torch.distributed process
    group of several ranks is initialized (one all-reduce, MIN; each rank must call this);
    ``result`` itself elsewhere. No answer on a rank (nothing fitted) is no answer for all."""
    torch: Any = sys.modules.get("torch")
    distributed = getattr(torch, "distributed", None)
    if distributed is None or not distributed.is_available() or not distributed.is_initialized():
        return result
    ranks = distributed.get_world_size()
    if ranks < 2:
        return result
    device = "cpu"
    if distributed.get_backend() == "nccl":  # NCCL reduces CUDA tensors only, on this rank's device
        device = f"cuda:{torch.cuda.current_device()}"
    answer = torch.tensor([result.answer or 0], dtype=torch.int64, device=device)  # 0: none fitted
    distributed.all_reduce(answer, op=distributed.ReduceOp.MIN)
    agreed = int(answer.item()) or None
    rank = distributed.get_rank()
    own = "nothing fitted" if result.answer is None else f"it found {result.answer}"
    if agreed is None:
        note = (f"rank {rank} of {ranks}: a rank found no size that fits, so the ranks agree on none "
                f"({own} here)")
    else:
        note = (f"rank {rank} of {ranks}: the {count(ranks, 'rank')} agreed on {result.variable} = {agreed}, "
                f"the smallest of their answers (torch.distributed all-reduce, MIN), so that no rank runs "
                f"out of memory later; {own} on this rank alone")
    return dataclasses.replace(result, answer=agreed, notes=result.notes + (note,))


def across_devices(result: BatchResult, objects: Iterable[Any] = ()) -> BatchResult:
    """``result`` as it holds across devices: agreed by the ranks of a process group, and
    said as the whole batch of a DataParallel model among ``objects`` (what the step uses)."""
    result = agree_across_ranks(result)
    model = _data_parallel(objects)
    if model is not None:
        result = dataclasses.replace(result, notes=result.notes + (data_parallel_note(result, model),))
    return result
