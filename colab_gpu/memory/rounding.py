"""An emulation of CUDA's caching allocator's block sizes (CUDACachingAllocator.cpp: round_size,
should_split, get_free_block), under the allocator settings torch runs with: how much of
torch's allocated memory the storages reached can account for, so that the rest (memory no
variable, output nor error reaches) is a lower bound. Apart because it follows torch's
allocator and its settings (allocator/), not the user's objects.
"""
from __future__ import annotations

import os
from typing import Dict, Iterable, List, Mapping, Optional, Tuple

from ..torch_allocator.schema import ROUNDUP_INTERVALS
from .readings import Reading

__all__ = ["LARGE_BUFFER", "LOWEST_SPLIT_LIMIT", "MIN_BLOCK", "UNSPLIT_REMAINDER", "block_size", "unreached_bytes"]

MIN_BLOCK = 512  # kMinBlockSize: every request is rounded up to a multiple of it
UNSPLIT_REMAINDER = 1024 ** 2  # CUDA's caching allocator splits a large block only for more left over
LARGE_BUFFER = 20 * 1024 ** 2  # kLargeBuffer: the segment for a request of 1-10 MiB, and how much larger an unsplit oversize block may be
# The lowest max_split_size_mb any torch takes: 21 before 2.10, 20 in 2.10, and from 2.11
# large_segment_size_mb, which must be over 10 (see torch_allocator/schema.py).
LOWEST_SPLIT_LIMIT = 11 * 1024 ** 2


def _split_limit(torch, device: str) -> Optional[int]:
    """The size from which CUDA's caching allocator never splits a block (``max_split_size_mb``),
    or None where it splits every size. torch's statistics give the limit it started with; an
    oversize allocation under no such limit means a later setting made one, which may be as
    low as LOWEST_SPLIT_LIMIT: any block that large may be oversize."""
    try:
        stats = torch.cuda.memory_stats(device)
    except Exception:
        return None
    limit = stats.get("max_split_size", -1)  # -1 (SIZE_MAX) when unset
    if 0 < limit < 2 ** 62:
        return limit
    return LOWEST_SPLIT_LIMIT if stats.get("oversize_allocations.current", 0) > 0 else None


def _allocator_settings(torch) -> Tuple[Optional[Dict[str, str]], Dict[str, str]]:
    """What CUDA's allocator runs with: torch's own report of its last settings string
    (torch_allocator.installed.reported_settings: None where torch cannot say; asked only once CUDA
    runs, so asking changes nothing), and the environment, which %alloc_conf keeps in step: the
    variable torch reads (a ROCm build's PYTORCH_HIP_ALLOC_CONF too). What cannot be read is empty."""
    from ..torch_allocator.installed import current_settings, installed_env_names, reported_settings
    from ..torch_allocator.parse import parse

    try:
        text = reported_settings({"torch": torch})
        reported = None if text is None else dict(parse(text))
    except Exception:  # a string torch took and the parser here does not read
        reported = {}
    try:
        environment = dict(current_settings(os.environ, installed_env_names({"torch": torch}))[1])
    except Exception:
        environment = {}
    return reported, environment


def _rounding(torch) -> Tuple[List[int], int]:
    """The divisions per interval (see allocator.roundup_table) and the most an unsplit oversize
    block may exceed its request (``max_non_split_rounding_mb``, 20 MiB by default; from
    2.11 by default ``large_segment_size_mb``'s, which the allocator schema knows).

    Each settings string resets roundup_power2_divisions, so torch's last one tells it all.
    max_non_split_rounding_mb keeps its value from an earlier string up to 2.10; from 2.11
    each string puts it back to large_segment_size_mb's value, which does keep its own. So
    the larger of what torch's last string and the environment say is taken: the rest stays
    a lower bound."""
    from ..torch_allocator.installed import installed_torch_version
    from ..torch_allocator.parse import AllocConfError, roundup_table, version_of
    from ..torch_allocator.schema import BY_NAME

    reported, environment = _allocator_settings(torch)
    try:
        divisions = roundup_table((reported if reported is not None else environment)
                                  .get("roundup_power2_divisions"),
                                  version_of(installed_torch_version({"torch": torch})))
    except AllocConfError:  # unreadable: no rounding
        divisions = [0] * ROUNDUP_INTERVALS
    rounding, key = LARGE_BUFFER, BY_NAME["max_non_split_rounding_mb"]
    for settings in (reported or {}, environment):
        try:
            rounding = max(rounding, int(settings.get(key.name, key.default_in(settings))) * 1024 ** 2)
        except ValueError:
            pass
    return divisions, rounding


def _rounded(nbytes: int, divisions: List[int]) -> int:
    """The size CUDA's allocator makes of a request (CUDACachingAllocator.cpp: round_size):
    512 B steps, or with N divisions for its size a step of 1/N of the power of two below it
    (1.1 GiB -> 1.25 GiB with 4)."""
    log = nbytes.bit_length() - 1
    split = divisions[min(max(log - 20, 0), ROUNDUP_INTERVALS - 1)]
    step = MIN_BLOCK
    if split > 1 and nbytes > MIN_BLOCK * split:
        step = max((1 << log) >> (split.bit_length() - 1), 1)  # a power of two stays as it is
    return max(-(-nbytes // step) * step, MIN_BLOCK)


def block_size(nbytes: int, divisions: Optional[List[int]] = None) -> int:
    """The block CUDA's caching allocator gives a request of ``nbytes`` under the
    ``roundup_power2_divisions`` ``divisions`` (None: torch's default, 512 B steps)."""
    return _rounded(nbytes, divisions or [0] * ROUNDUP_INTERVALS)


def unreached_bytes(readings: Iterable[Reading], union: Mapping[Tuple[str, int], int],
               torch=None) -> Tuple[Tuple[str, int], ...]:
    """Per device, the bytes of the memory reading (live CPU tensors, torch's allocated) that
    no variable, output or error reaches: a library's cache, a thread, a reference cycle.
    A GPU's reading counts each storage as the block its allocator gave it: rounded up to
    512 B (under ``roundup_power2_divisions``, to the next of its steps), and a block of the
    large pool (over 1 MiB) is not split for a remainder of 1 MiB or less, which it then
    counts as allocated too; under ``max_split_size_mb`` a block of that size or more is never
    split, and a cached one is reused for a request up to 20 MiB smaller (or
    ``max_non_split_rounding_mb``, by default ``large_segment_size_mb``) (CUDACachingAllocator.cpp: round_size, should_split,
    get_free_block). The storages reached
    are counted at the most their blocks can hold, so that what is left is memory no rounding
    explains: a lower bound. Less than 1 MiB is not worth a line."""
    reached: Dict[str, int] = {}
    limits: Dict[str, Optional[int]] = {}
    rounding: Optional[Tuple[List[int], int]] = None
    for (device, _), nbytes in union.items():
        if device == "cpu":
            blocks = nbytes
        else:
            if device not in limits:
                limits[device] = _split_limit(torch, device) if torch is not None else None
            if rounding is None:
                rounding = _rounding(torch) if torch is not None else ([0] * ROUNDUP_INTERVALS, LARGE_BUFFER)
            limit, blocks = limits[device], _rounded(nbytes, rounding[0])
            blocks += (rounding[1] if limit is not None and blocks >= limit else
                       UNSPLIT_REMAINDER if nbytes > UNSPLIT_REMAINDER else 0)
        reached[device] = reached.get(device, 0) + blocks
    rest = ((reading.device, reading.allocated - reached.get(reading.device, 0))
            for reading in readings if reading.allocated is not None)
    return tuple((device, n) for device, n in rest if n >= 1024 ** 2)
