"""Reading memory: per device, the bytes of live CPU tensors, torch's allocated and reserved
memory on each GPU this process can use and NVML's used memory, at one moment. Apart because
clear_cache() reads after every step and the ranking reads once, from the same GPU snapshot.
"""
from __future__ import annotations

import dataclasses
import gc
from typing import Dict, List, Optional, Tuple

from ..devices import DeviceSource, Snapshot
from ..torch_view import torch_memory, torch_view
from ..runtime import detect_runtime
from .walk import walk_from

__all__ = ["Reading", "cpu_tensor_bytes", "gpu_view", "read_memory", "read_snapshot"]


@dataclasses.dataclass(frozen=True)
class Reading:
    """One device's memory at one moment; ``None`` where it cannot be read."""

    device: str  # "cpu", "cuda:0", or "GPU 1" where which cuda:N it is cannot be told
    allocated: Optional[int]  # cpu: bytes of live CPU tensors; cuda: torch's memory_allocated
    reserved: Optional[int] = None  # torch's memory_reserved (cuda, once CUDA is initialized)
    nvml_used: Optional[int] = None  # the whole GPU's used memory, every process included


def cpu_tensor_bytes(torch) -> int:
    """Bytes of every live CPU tensor Python can see, each storage counted once, and of those
    their autograd graphs saved for backward(): a saved activation often has no Python object
    left (relu's, softmax's output once the next layer has run). A sparse tensor's memory is
    in its indices and values, which have none either: walked, as the ranking walks them."""
    objects = gc.get_objects()
    # Tensor's metaclass makes issubclass slow: test each type once, then filter by type.
    tensor_kinds = {kind for kind in set(map(type, objects)) if issubclass(kind, torch.Tensor)}
    storages: Dict[int, int] = {}
    walked = []  # autograd graphs and sparse tensors
    for obj in objects:
        if type(obj) in tensor_kinds:
            try:  # a tensor subclass's __torch_function__ may raise on any attribute
                if obj.grad_fn is not None:
                    walked.append(obj.grad_fn)
                if obj.layout != torch.strided:
                    walked.append(obj)
                elif obj.device.type == "cpu":
                    storage = obj.untyped_storage()
                    storages[storage.data_ptr()] = storage.nbytes()
            except Exception:
                continue
    del objects
    saved = walk_from(walked, torch, set()).storages
    storages.update((address, nbytes) for (device, address), nbytes in saved.items() if device == "cpu")
    storages.pop(0, None)
    return sum(storages.values())


def read_snapshot(source: Optional[DeviceSource]):
    if source is None:
        from ..devices import default_source

        source = default_source()
    try:
        return source.snapshot()
    except Exception:  # a source promises not to raise; never let it break the clearing
        return None


def read_memory(torch, snapshot) -> Tuple[Reading, ...]:
    """cpu (if torch is imported) and every GPU of ``snapshot`` this process can use, with
    torch's view where CUDA runs."""
    readings: List[Reading] = []
    if torch is not None:
        readings.append(Reading("cpu", cpu_tensor_bytes(torch)))
    gpus, index_of, memory = gpu_view(snapshot, torch)
    by_nvml = {m.nvml_index: m for m in memory}
    for gpu in gpus:
        torch_index = index_of.get(gpu.index)
        seen = by_nvml.get(gpu.index)
        readings.append(Reading(
            device=f"cuda:{torch_index}" if torch_index is not None else f"GPU {gpu.index}",
            allocated=seen.allocated if seen else None,
            reserved=seen.reserved if seen else None,
            nvml_used=gpu.memory_used))
    # torch's devices NVML could not match (NVML missing or failing): torch's view alone.
    readings += [Reading(f"cuda:{m.torch_index}", m.allocated, m.reserved)
                 for m in memory if m.nvml_index is None]
    return tuple(readings)


def gpu_view(snapshot, torch):
    """The GPUs this process can use (NVML's), NVML index -> torch index, and torch's
    allocator view once CUDA runs. A GPU the status card calls hidden from torch is left out:
    nothing of this process is there, and another user's job on it would read as memory
    freed or grown."""
    if snapshot is None or not snapshot.ok:
        snapshot = Snapshot(source="none")  # unreadable: torch's figures stand on their own
    view = torch_view(snapshot, detect_runtime())
    gpus = tuple(gpu for gpu in view.gpus if view.hidden_from_torch(gpu) is not True)
    # which GPU is cuda:N may be unknown (fastest first): torch's figures then stand on their own
    index_of = view.torch_index_of if view.cuda_numbering_known else {}
    memory = torch_memory(index_of) if torch is not None else ()  # () until CUDA is initialized
    return gpus, index_of, memory
