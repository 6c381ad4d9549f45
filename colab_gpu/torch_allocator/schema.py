"""Every caching-allocator key from torch 1.13 to 2.15, as data.

Where each fact comes from: the released CUDA wheels of every minor version from 1.13.1 to
2.14.1 (``pip download torch==X --no-deps``): their ``include/c10/cuda/CUDAAllocatorConfig.h``
and ``include/c10/core/AllocatorConfig.h``, the parser's strings in ``lib/libc10_cuda.so`` and
``lib/libc10.so`` (a key's "Error, expecting ... value" / "Expected a single True/False
argument for ..." message, or its name in ``getKeys()``), and, from 2.9, ``libc10.so``'s own
``AcceleratorAllocatorConfig::parseArgs`` run on test strings:

- 1.13: ``c10/cuda/CUDACachingAllocator.cpp`` knows max_split_size_mb ("must be > 20"),
  roundup_power2_divisions (one power of two), roundup_bypass_threshold_mb and
  garbage_collection_threshold ("set it 0.0~1.0", both ends refused). Values go through
  ``stoi``/``stod``.
- 2.0: ``backend`` (native / cudaMallocAsync) and the ``[256:1,512:2,>:4]`` list form of
  roundup_power2_divisions arrive; roundup_bypass_threshold_mb is gone. Until 2.3 every
  divisions entry must be a power of two; 2.4 adds "or 0 to disable roundup".
- 2.1: expandable_segments. 2.2: release_lock_on_cudamalloc, pinned_use_cuda_host_register
  and pinned_num_register_threads (power of two, <= ``pinned_max_register_threads()`` = 128).
- 2.6 (absent from 2.5.1): max_non_split_rounding_mb ("must be > 20") and
  pinned_use_background_threads.
- 2.9: graph_capture_record_stream_reuse. ``c10/core/AllocatorConfig`` appears in libc10.so,
  but CUDA still parses with its own ``CUDAAllocatorConfig`` ("must be > 20", only
  PYTORCH_CUDA_ALLOC_CONF / PYTORCH_HIP_ALLOC_CONF).
- 2.10: CUDAAllocatorConfig hands the general keys to AcceleratorAllocatorConfig, whose split
  minimums are ">= 20" (``kLargeBuffer / kMB``), and reads PYTORCH_ALLOC_CONF last;
  pinned_reserve_segment_size_mb ("greater than 0") and per_process_memory_fraction ("set it
  in [0.0, 1.0]") arrive. AcceleratorAllocatorConfig's ``>`` entry of roundup_power2_divisions fills
  the intervals after the last one named (``last_index + 1``), where CUDAAllocatorConfig's
  filled that one too: ``[256:1,512:2,>:8]`` gives 512 MiB..1 GiB requests 2 divisions from
  2.10, 8 before (the installed 2.13.0+cpu's ``roundup_power2_divisions()`` called from C++,
  tests/test_allocator_torch.py).
- 2.11: large_segment_size_mb ("must be > 10 MB", ``kMinLargeAlloc / kMB``); the split
  minimums become >= large_segment_size_mb (``large_segment_size_ / kMB``, 20 by default), which
  ``parseArgs`` reads before every other key: ``large_segment_size_mb:12,max_split_size_mb:15``
  is accepted in either order (the installed 2.13.0+cpu's setter). 2.11.0 (its cu130 wheel,
  Colab's) has the run-time setter ``torch._C._accelerator_setAllocatorSettings`` but no
  ``_accelerator_getAllocatorSettings`` (2.13.0 has both); the string that getter returns,
  ``c10::CachingAllocator::getAllocatorSettings()``, is also the CUDA memory snapshot's
  ``allocator_settings["PYTORCH_CUDA_ALLOC_CONF"]`` (c10/cuda/CUDAAllocatorConfig.h,
  ``last_allocator_settings``). Both versions read the variables at torch's first settings read,
  not at ``import torch`` (the installed 2.11.0+cu130 and 2.13.0+cpu, without a GPU). 2.12: pinned_free_catch_all and
  throw_on_cudamalloc_oom. 2.13: pinned_max_round_threshold_mb and pinned_max_cached_size_mb
  (no bound; the installed 2.13.0+cpu build). 2.14.1 has the same keys as 2.13.
- 2.15.0 (its cu132 wheel): ``getKeys()`` adds expandable_segments_reserve, whose value is
  "a fraction of a device's total memory (e.g. 0.5) or an absolute number of GiB (config
  suffix 'G', e.g. 40G)" (``ExpandableSegmentReserveSpec``; "a positive, finite fraction",
  default 1.125, invalid values ignored with a warning), and
  expandable_segments_reserve_by_class, ``[class:reserve,...]`` with the same values per
  stream class (``parseExpandableSegmentsReserveByClass`` in c10/cuda/CUDAAllocatorConfig.cpp;
  a stream's class is set from C++ with ``setExpandableSegmentReserveClassForStream``). Both are
  read under a lock whenever a segment is made, so a run-time change reaches later segments.
- ROCm: since 2.2 every CUDA wheel's parser also accepts release_lock_on_hipmalloc and
  pinned_use_hip_host_register (the strings are in libc10_cuda.so; the source splits the
  CUDA spelling so that hipify leaves it alone). ``backend:hipMallocAsync`` is accepted only by
  ROCm builds (the string is in no CUDA wheel; ``PYTORCH_TOKEN2`` in CUDAAllocatorConfig.cpp),
  which also read PYTORCH_HIP_ALLOC_CONF when PYTORCH_CUDA_ALLOC_CONF is unset (from 2.8,
  ``CUDAAllocatorConfig::instance()``).
"""
from __future__ import annotations

import dataclasses
import re
from typing import Mapping, Optional, Tuple

Version = Tuple[int, int]

OLDEST: Version = (1, 13)
NEWEST: Version = (2, 15)
# torch 2.10+ reads them in this order: CUDAAllocatorConfig::instance() (CUDA's keys) and
# AcceleratorAllocatorConfig (the general ones) each parse the first one set, never both
# (2.10.0 to 2.13.0's CUDAAllocatorConfig.h and libc10.so, probed with both set). The latter also
# reads PYTORCH_HIP_ALLOC_CONF before PYTORCH_ALLOC_CONF on CUDA builds; every change writes
# PYTORCH_CUDA_ALLOC_CONF, which both read first.
ENV_NAMES = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")
# up to 2.9, CUDA reads no PYTORCH_ALLOC_CONF (2.9's CUDAAllocatorConfig ignores it, pytorch#183387)
GENERIC_ENV_SINCE: Version = (2, 10)
# ROCm builds read PYTORCH_HIP_ALLOC_CONF when PYTORCH_CUDA_ALLOC_CONF is unset (2.8+)
HIP_ENV_SINCE: Version = (2, 8)
ROCM_ENV_NAMES = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF", "PYTORCH_ALLOC_CONF")
INT_LIMIT = 2 ** 31 - 1  # old parsers read integers with stoi: keep every value within int
# What a number longer than 20 digits (past a size_t, past every bound here) reads as: not a power
# of two and out of every range, so it is refused with the range. int() of more than 4300 digits
# raised a ValueError, a traceback instead of the range.
TOO_LARGE = 10 ** 20


def whole_number(text: str) -> Optional[int]:
    """``text`` as a whole number if it is one, in ASCII digits as torch's parser takes them
    (Python's int() also takes "١٢٨"), else None; TOO_LARGE past 20 digits."""
    if not re.fullmatch(r"[0-9]+", text):
        return None
    digits = text.lstrip("0") or "0"
    return int(digits) if len(digits) <= 20 else TOO_LARGE

# roundup_power2_divisions: one value per power of two of MiB, 1 MiB to 64 GiB (kRoundUpPowerOfTwoIntervals)
ROUNDUP_INTERVALS = 16
GREATER_AFTER_LAST: Version = (2, 10)  # a '>' entry leaves the last interval named as it is

INTEGER = "integer"
FRACTION = "fraction"
BOOLEAN = "boolean"
CHOICE = "choice"
POWER_OF_TWO = "power of two"
DIVISIONS = "divisions"
RESERVE = "reserve"  # a fraction of the device's memory (0.5) or a number of GiB (40G)
RESERVE_TABLE = "reserve table"  # [class:reserve,...]: a RESERVE for each stream class


@dataclasses.dataclass(frozen=True)
class Key:
    """One allocator key: what it accepts, since when, and whether it can change later."""

    name: str
    kind: str
    meaning: str
    default: str
    added: Version
    removed: Optional[Version] = None
    # (since version, lowest value, whether the bound is open i.e. "greater than"), oldest first
    minimum: Tuple[Tuple[Version, float, bool], ...] = ()
    # (since version, key): from then on the lowest value is that key's, inclusive (its default
    # where the setting lacks it); torch reads that key first, wherever it stands in the string
    minimum_follows: Optional[Tuple[Version, str]] = None
    # a key whose value is this one's default where the setting lacks this one (see default_in)
    default_follows: Optional[str] = None
    maximum: Optional[float] = None
    high_open: bool = False
    choices: Tuple[str, ...] = ()
    rocm_choices: Tuple[str, ...] = ()  # further choices only ROCm builds accept
    aliases: Tuple[str, ...] = ()  # other spellings torch accepts for the same key (ROCm's)
    runtime: bool = True  # a run-time settings call after CUDA starts changes it
    runtime_reason: str = ""
    general: bool = False  # parsed by every build (AcceleratorAllocatorConfig), the CPU one too
    native_only: bool = False  # ignored by backend:cudaMallocAsync
    backends: str = "CUDA, ROCm"

    def lowest(self, version: Version, given: Optional[Mapping[str, str]] = None
               ) -> Optional[Tuple[float, bool]]:
        """The lower bound at ``version`` and whether it is open ("greater than"); ``given``,
        the setting's other keys, for a bound that follows another key."""
        bound = None
        for since, low, is_open in self.minimum:
            if version >= since:
                bound = (low, is_open)
        followed = self.followed(version)
        if followed is not None:
            value = self.followed_value(version, given)
            if value is None:  # not given, or refused on its own: torch would use its default
                value = whole_number(BY_NAME[followed].default)
            if value is not None:
                bound = (value, False)
        return bound

    def followed_value(self, version: Version, given: Optional[Mapping[str, str]]) -> Optional[int]:
        """The value ``given`` sets for the key this one's lower bound follows, where that key
        accepts it; None where the setting lacks it or the value is refused on its own (a
        bound of 10**20 said nothing)."""
        followed = self.followed(version)
        if followed is None:
            return None
        value = whole_number((given or {}).get(followed, ""))
        maximum = BY_NAME[followed].maximum
        return None if value is None or (maximum is not None and value > maximum) else value

    def default_in(self, given: Mapping[str, str]) -> str:
        """This key's default in a setting of the keys ``given``: where it follows another
        key, that key's value when the setting has it."""
        if self.default_follows is not None:
            return given.get(self.default_follows, self.default)
        return self.default

    def followed(self, version: Version) -> Optional[str]:
        """The key whose value is this one's lowest at ``version``, if any."""
        if self.minimum_follows is not None and version >= self.minimum_follows[0]:
            return self.minimum_follows[1]
        return None

    def available(self, version: Version) -> bool:
        return self.added <= version and (self.removed is None or version < self.removed)


def _v(text: str) -> Version:
    major, minor = text.split(".")
    return int(major), int(minor)


_ACCELERATORS = "CUDA, ROCm, XPU and other accelerators (from 2.9)"
_SPLIT_MINIMUM = ((OLDEST, 20, True), (_v("2.10"), 20, False))  # "> 20" until 2.9, then ">= 20"
_SPLIT_FOLLOWS = (_v("2.11"), "large_segment_size_mb")  # then ">= large_segment_size_mb" (20 MB default)
ZERO_DIVISIONS: Version = (2, 4)  # a list entry may be 0 (no rounding) from 2.4

KEYS: Tuple[Key, ...] = (
    Key("backend", CHOICE, "which allocator: torch's caching allocator or CUDA's own pool "
        "(cudaMallocAsync)", "native", _v("2.0"), choices=("native", "cudaMallocAsync"),
        rocm_choices=("hipMallocAsync",), runtime=False, runtime_reason="backend is chosen when torch is imported"),
    Key("max_split_size_mb", INTEGER, "cached blocks larger than this are never split, "
        "so big free blocks stay whole (fights fragmentation, may slow allocation)",
        "unlimited", OLDEST, minimum=_SPLIT_MINIMUM, minimum_follows=_SPLIT_FOLLOWS,
        maximum=INT_LIMIT, general=True, native_only=True, backends=_ACCELERATORS),
    Key("roundup_power2_divisions", DIVISIONS, "round request sizes up to one of N steps "
        "per power of two, so freed blocks fit later requests", "0 (no rounding)", OLDEST,
        general=True, native_only=True, backends=_ACCELERATORS),
    Key("roundup_bypass_threshold_mb", INTEGER, "requests above this size skip the "
        "power-of-two rounding", "unlimited", OLDEST, removed=_v("2.0"), minimum=((OLDEST, 0, False),),
        maximum=INT_LIMIT, native_only=True),
    Key("garbage_collection_threshold", FRACTION, "free unused cached blocks once this "
        "fraction of the allowed memory is in use (needs a per-process memory fraction < 1)",
        "0 (off)", OLDEST, minimum=((OLDEST, 0.0, True),), maximum=1.0,
        high_open=True, general=True, native_only=True, backends=_ACCELERATORS),
    Key("expandable_segments", BOOLEAN, "grow one segment per stream instead of allocating "
        "fixed blocks: the best cure for fragmentation (affects segments created later)",
        "False", _v("2.1"), general=True, native_only=True, backends=_ACCELERATORS),
    Key("release_lock_on_cudamalloc", BOOLEAN, "release the allocator's lock around "
        "cudaMalloc, so other threads can allocate meanwhile", "False", _v("2.2"),
        aliases=("release_lock_on_hipmalloc",)),
    Key("pinned_use_cuda_host_register", BOOLEAN, "pin host memory with malloc + "
        "cudaHostRegister instead of cudaHostAlloc (less time under lock)", "False",
        _v("2.2"), aliases=("pinned_use_hip_host_register",)),
    Key("pinned_num_register_threads", POWER_OF_TWO, "threads that register pinned memory "
        "when pinned_use_cuda_host_register is on", "1", _v("2.2"), minimum=((OLDEST, 1, False),),
        maximum=128),
    Key("max_non_split_rounding_mb", INTEGER, "a request may take a cached block up to this "
        "much larger without splitting it", "20", _v("2.6"), minimum=_SPLIT_MINIMUM,
        # parseArgs sets it to large_segment_size_ before reading it (2.11+, the key's own start)
        minimum_follows=_SPLIT_FOLLOWS, default_follows="large_segment_size_mb", maximum=INT_LIMIT, general=True, native_only=True, backends=_ACCELERATORS),
    Key("pinned_use_background_threads", BOOLEAN, "process pinned-memory events on a "
        "background thread", "False", _v("2.6"), general=True, runtime=False,
        runtime_reason="the background thread starts with the first pinned allocation",
        backends=_ACCELERATORS),
    Key("graph_capture_record_stream_reuse", BOOLEAN, "let CUDA-graph capture reuse blocks "
        "freed on other streams", "False", _v("2.9")),
    Key("pinned_reserve_segment_size_mb", INTEGER, "reserve one pinned segment of this size "
        "up front for small pinned allocations", "0 (off)", _v("2.10"), minimum=((OLDEST, 0, True),),
        maximum=INT_LIMIT, runtime=False,
        runtime_reason="the reserve segment is made with the first pinned allocation"),
    Key("per_process_memory_fraction", FRACTION, "cap this process at this fraction of the "
        "GPU's memory (like torch.cuda.set_per_process_memory_fraction)", "1.0", _v("2.10"),
        minimum=((OLDEST, 0.0, False),), maximum=1.0, runtime=False,
        runtime_reason="read when each device's allocator starts; call "
                       "torch.cuda.set_per_process_memory_fraction(fraction, device) for "
                       "each GPU in use instead"),
    Key("large_segment_size_mb", INTEGER, "size of the segments large requests are packed "
        "into (the split minimums follow it)", "20", _v("2.11"), minimum=((OLDEST, 10, True),),
        maximum=INT_LIMIT, general=True, native_only=True, runtime=False,
        runtime_reason="segments already made keep their size; set it before CUDA starts",
        backends=_ACCELERATORS),
    Key("pinned_max_round_threshold_mb", INTEGER, "pinned allocations above this size are "
        "not rounded up to a power of two", "unlimited", _v("2.13"), minimum=((OLDEST, 0, False),),
        maximum=INT_LIMIT, general=True, backends=_ACCELERATORS),
    Key("pinned_max_cached_size_mb", INTEGER, "freed pinned blocks above this size go back to "
        "the OS instead of the cache", "unlimited", _v("2.13"), minimum=((OLDEST, 0, False),),
        maximum=INT_LIMIT, general=True, backends=_ACCELERATORS),
    Key("pinned_free_catch_all", BOOLEAN, "let the pinned allocator free blocks allocated "
        "outside it", "False", _v("2.12")),
    Key("throw_on_cudamalloc_oom", BOOLEAN, "raise out-of-memory before calling cudaMalloc "
        "when the request cannot fit", "False", _v("2.12")),
    Key("expandable_segments_reserve", RESERVE, "virtual address space each expandable "
        "segment reserves: a fraction of the GPU's memory (0.5) or GiB (40G); affects "
        "segments made later", "1.125", _v("2.15"), native_only=True),
    Key("expandable_segments_reserve_by_class", RESERVE_TABLE, "the reserve for streams "
        "of a named class, [class:0.25,other:8G]; a stream's class is set from C++ "
        "(setExpandableSegmentReserveClassForStream), others use expandable_segments_reserve",
        "[] (none)", _v("2.15"), native_only=True),
)

BY_NAME = {key.name: key for key in KEYS}
ALIASES = {alias: key.name for key in KEYS for alias in key.aliases}

# Presets: settings plus the reason, so a student learns why and not only what.
PRESETS = {
    "fragmentation": (
        "expandable_segments:True",
        "When an out-of-memory message shows much memory 'reserved but unallocated', the "
        "cache is fragmented: free blocks exist but none is big enough. Expandable segments "
        "let one segment grow instead, which is what PyTorch's own OOM message recommends "
        "(torch >= 2.1)."),
    "fragmentation-old-torch": (
        "max_split_size_mb:128",
        "For torch < 2.1, which has no expandable segments: never split cached blocks above "
        "128 MB, so large free blocks stay whole for large tensors. It can slow allocation."),
    "reclaim": (
        "garbage_collection_threshold:0.8",
        "Free unused cached blocks once 80% of the allowed memory is in use, instead of "
        "waiting for an out-of-memory retry. It only acts under a per-process memory "
        "fraction below 1: call torch.cuda.set_per_process_memory_fraction(0.95, device) "
        "for each GPU in use (without device it caps the current GPU only)."),
    "async": (
        "backend:cudaMallocAsync",
        "Use CUDA's own stream-ordered pool allocator instead of torch's. It ignores the "
        "split and rounding keys and makes torch's memory snapshots meaningless; it must be "
        "set before `import torch` (torch >= 2.0)."),
}
