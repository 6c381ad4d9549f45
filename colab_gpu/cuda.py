"""CUDA calls shared by clear_cache() and %%find_batch: which devices already have a CUDA
context, the device the user's code works on, and emptying torch's cache without creating a
context anywhere. Shared core, so that batch/ (a feature) needs nothing of memory/; also how many CUDA devices
torch can use, counted without starting CUDA (%%find_batch's --device check, colab_gpu.launch's
one rank per GPU).
"""
from __future__ import annotations

import contextlib
import os
from typing import List, Optional

from .runtime import cuda_torch


def cuda_devices_in_use(torch) -> List[int]:
    """The CUDA devices with a context (CUDA already initialized); asking creates none."""
    has_context = getattr(torch._C, "_cuda_hasPrimaryContext", None)
    return [device for device in range(torch.cuda.device_count())
            if (has_context(device) if has_context is not None
                else torch.cuda.memory_stats(device).get("reserved_bytes.all.peak", 0) > 0)]


def working_device(current: int, in_use: List[int]) -> int:
    """The device the user's code runs on: the current one, unless only others have a context
    (a model moved to cuda:1 leaves the current device at 0, and working there would create a
    context on a GPU the user never touched)."""
    return current if not in_use or current in in_use else in_use[0]


def empty_cuda_cache(torch) -> List[str]:
    """synchronize() each device CUDA already runs on, free cuBLAS's workspaces, then
    empty_cache() and ipc_collect().

    Only devices with a context are synchronized: touching another would create one (CUDA 12's
    cudaSetDevice does). cuBLAS keeps a workspace per handle and stream (32 MiB on a Hopper
    GPU) as allocated blocks of the caching allocator, which empty_cache() leaves alone; torch
    frees them with the private ``_cuda_clearCublasWorkspaces()`` (its own leak checks do) and
    makes them again at the next matrix product. ``empty_cache()`` then releases the unused
    cached blocks of every device. It runs with a device in use as the current one: called
    while the current device has no context (a model on cuda:1, the current device still 0)
    it creates one there (pytorch#25752, #144025), hundreds of MiB on a GPU that may be
    another user's. Where no device has a context yet (CUDA initialized by a query such as
    ``torch.cuda.current_device()``) nothing can be cached, and nothing is called.
    """
    in_use = cuda_devices_in_use(torch)
    if not in_use:
        return []
    for device in in_use:
        torch.cuda.synchronize(device)
    current = torch.cuda.current_device()
    working = working_device(current, in_use)
    # leaving torch.cuda.device sets no device without a context
    with torch.cuda.device(working) if working != current else contextlib.nullcontext():
        clear_workspaces = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
        if clear_workspaces is not None:
            clear_workspaces()
        torch.cuda.empty_cache()
        torch.cuda.ipc_collect()
    return [f"cuda:{device}" for device in in_use]


def visible_cuda_devices() -> Optional[int]:
    """CUDA devices torch can use, counted through NVML so that the check never starts CUDA
    (torch.cuda.device_count() would, before ``%alloc_conf`` has had its say, and would keep a
    forked process from using the GPU). None when NVML cannot tell: MIG instances in
    CUDA_VISIBLE_DEVICES are not among NVML's GPUs, and a driver is here but NVML cannot be
    read (pynvml not installed, no permission)."""
    torch = cuda_torch()
    if torch is not None:
        return torch.cuda.device_count()
    from .devices import default_source
    from .devices.nvml import DRIVER_PRESENT_PROBLEMS
    from .runtime import names_mig_instances, torch_indices

    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if names_mig_instances(visible):
        return None
    snapshot = default_source().snapshot()
    if snapshot.problem in DRIVER_PRESENT_PROBLEMS:
        return None
    return len(torch_indices(visible, snapshot.gpus))
