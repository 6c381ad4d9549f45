"""``clear_cache()``: give memory back; ``memory_holders()``: say who still holds it.

``torch.cuda.empty_cache()`` frees nothing that is still referenced, and a notebook keeps
many references the user never wrote: the last failed cell's traceback (every frame and its
tensors), the output history (``Out``, ``_``, ``__``, ``___``, ``_N``) and the shell's last
execution result. :func:`clear_cache` drops those, deletes only the variables it is given by
name, collects garbage and, only if the user's code already initialized CUDA, empties torch's
cache. Each step is measured, so the report says what each one freed.

IPython is never imported here: its objects come in as ``shell`` and are used by duck typing,
so this works in IPython 7.34 (Colab) as in the newest, and in plain Python with no shell.
No tensor is ever referenced by a result: the ranking keeps storage addresses, not tensors.

The package's parts, each apart for its own reason: walk (from an object to the tensor storages
it keeps alive), namespace (which names are IPython's, what it keeps of outputs and errors),
readings (the memory of each device at one moment), rounding (CUDA's allocator's block sizes,
for the lower bound of what nothing reaches), holders (the ranking) and clear (the steps and
their report). The API is importable from here; what the parts share, from each part
(each one's ``__all__``).
"""
from __future__ import annotations

from .clear import (ClearCacheError, ClearReport, Step, check_names, clear_cache, clear_output_history,
                    delete_variables, drop_exception, holds_torch)
from .holders import Elsewhere, Holder, Holders, memory_holders, rank_holders
from .readings import Reading, cpu_tensor_bytes, read_memory
from .walk import MAX_OBJECTS

__all__ = ["ClearCacheError", "ClearReport", "Step", "check_names", "clear_cache", "clear_output_history",
           "delete_variables", "drop_exception", "holds_torch", "Elsewhere", "Holder", "Holders", "memory_holders",
           "rank_holders", "Reading", "cpu_tensor_bytes", "read_memory", "MAX_OBJECTS"]
