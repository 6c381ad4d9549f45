"""CUDA's caching allocator replayed on a list of allocations and frees, without a GPU: what
a planned step (plan.py) reserves on a GPU of a given size, and whether it runs out of memory.

Follows CUDACachingAllocator.cpp with its default settings: requests rounded up to 512 B
(memory/rounding.py's rule); a small pool (requests up to 1 MiB, carved from 2 MiB segments)
and a large one (under 10 MiB from 20 MiB segments, larger ones from segments rounded up to
2 MiB); the best-fitting free block of the pool is split when more than 512 B (small) or 1 MiB
(large) is left; a freed block merges with free neighbours of its segment; when a new segment
would pass the limit, every wholly free segment is given back first (as torch does before it
raises out of memory). One stream, no expandable segments. A request marked optional (a cuDNN
workspace, plan.py) that finds no room is skipped, not out of memory: torch then runs an
algorithm that needs none.
"""
from __future__ import annotations

import bisect
import dataclasses
from typing import AbstractSet, Dict, Iterable, List, Optional, Tuple

from ..memory.rounding import LARGE_BUFFER, MIN_BLOCK, UNSPLIT_REMAINDER, block_size

__all__ = ["Replay", "replay"]

SMALL_SIZE = UNSPLIT_REMAINDER  # kSmallSize: the small pool's largest request
SMALL_BUFFER = 2 * 1024 ** 2  # kSmallBuffer: the small pool's segments
MIN_LARGE_ALLOC = 10 * 1024 ** 2  # kMinLargeAlloc
ROUND_LARGE = 2 * 1024 ** 2  # kRoundLarge: larger segments are rounded up to this

# An event: (serial, bytes) allocates storage ``serial``; (serial, None) frees it.
Event = Tuple[int, Optional[int]]


@dataclasses.dataclass
class _Block:
    address: int
    size: int
    segment: int
    small: bool
    free: bool = True
    before: Optional["_Block"] = None
    after: Optional["_Block"] = None


@dataclasses.dataclass(frozen=True)
class Replay:
    """What the allocator did: the peaks of memory handed out (``allocated``) and held from
    CUDA (``reserved``), and whether a request found no room under the limit (``out_of_memory``:
    the replay stopped there)."""

    allocated: int
    reserved: int
    out_of_memory: bool


class _Allocator:
    def __init__(self, limit: Optional[int]):
        self.limit = limit
        self.pools: Dict[bool, List[Tuple[int, int]]] = {True: [], False: []}  # (size, address)
        self.blocks: Dict[int, _Block] = {}  # by address
        self.segments: Dict[int, int] = {}  # segment base -> size
        self.next_address = 0
        self.allocated = self.reserved = 0
        self.peak_allocated = self.peak_reserved = 0

    def _insert(self, block: _Block) -> None:
        bisect.insort(self.pools[block.small], (block.size, block.address))

    def _remove(self, block: _Block) -> None:
        pool = self.pools[block.small]
        del pool[bisect.bisect_left(pool, (block.size, block.address))]

    def _new_segment(self, size: int, small: bool) -> Optional[_Block]:
        if self.limit is not None and self.reserved + size > self.limit:
            self._release_free_segments()
            if self.reserved + size > self.limit:
                return None
        address, self.next_address = self.next_address, self.next_address + size
        block = _Block(address, size, address, small)
        self.blocks[address] = block
        self.segments[address] = size
        self.reserved += size
        self.peak_reserved = max(self.peak_reserved, self.reserved)
        return block

    def _release_free_segments(self) -> None:
        for base, size in list(self.segments.items()):
            block = self.blocks[base]
            if block.free and block.size == size:  # the whole segment is one free block
                self._remove(block)
                del self.blocks[base], self.segments[base]
                self.reserved -= size

    def malloc(self, nbytes: int) -> Optional[_Block]:
        size = block_size(nbytes)
        small = size <= SMALL_SIZE
        pool = self.pools[small]
        found = bisect.bisect_left(pool, (size, -1))
        if found < len(pool):
            block = self.blocks[pool[found][1]]
            self._remove(block)
        else:
            segment = (SMALL_BUFFER if small else LARGE_BUFFER if size < MIN_LARGE_ALLOC
                       else -(-size // ROUND_LARGE) * ROUND_LARGE)
            new = self._new_segment(segment, small)
            if new is None:
                return None
            block = new
        left = block.size - size
        if left >= MIN_BLOCK if small else left > SMALL_SIZE:
            rest = _Block(block.address + size, left, block.segment, small, True, block, block.after)
            if block.after is not None:
                block.after.before = rest
            block.after, block.size = rest, size
            self.blocks[rest.address] = rest
            self._insert(rest)
        block.free = False
        self.allocated += block.size
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        return block

    def release(self, block: _Block) -> None:
        block.free = True
        self.allocated -= block.size
        for neighbour in (block.before, block.after):
            if neighbour is not None and neighbour.free and neighbour is not block:
                self._remove(neighbour)
                del self.blocks[max(block.address, neighbour.address)]
                if neighbour is block.before:
                    neighbour.size += block.size
                    neighbour.after = block.after
                    if block.after is not None:
                        block.after.before = neighbour
                    block = neighbour
                else:
                    block.size += neighbour.size
                    block.after = neighbour.after
                    if neighbour.after is not None:
                        neighbour.after.before = block
        self._insert(block)


def replay(events: Iterable[Event], limit: Optional[int] = None, optional: AbstractSet[int] = frozenset()) -> Replay:
    """Replay ``events`` on an allocator that may hold at most ``limit`` bytes (None: any).
    The storages whose serials are in ``optional`` are left out where they find no room."""
    allocator = _Allocator(limit)
    live: Dict[int, _Block] = {}
    for serial, nbytes in events:
        if nbytes is None:
            block = live.pop(serial, None)
            if block is not None:
                allocator.release(block)
            continue
        if nbytes == 0:  # an empty storage takes no block
            continue
        got = allocator.malloc(nbytes)
        if got is None and serial in optional:
            continue
        if got is None:
            return Replay(allocator.peak_allocated, allocator.peak_reserved, True)
        live[serial] = got
    return Replay(allocator.peak_allocated, allocator.peak_reserved, False)
