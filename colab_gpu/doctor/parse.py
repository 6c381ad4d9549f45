"""Read an out-of-memory message: every number it writes, as bytes, and which library wrote it.

PyTorch's CUDA allocator changed its wording several times (1.0-1.3 "... free; X cached)",
1.4-2.0 "X reserved in total by PyTorch", 2.1 "GPU 0 has a total capacty of ... of which ... is
free. Process N has ...", 2.2+ "... expandable_segments"); HIP and XPU copy it, MPS, the CPU
allocator, NumPy, cuBLAS, cuDNN, the CUDA runtime and TensorFlow have their own. Each number is
found by a pattern of its own wherever it stands, so a message wrapped in ``RuntimeError: ``,
prefixed by a rank, cut after its numbers or pasted inside a whole traceback still reads.
Sizes are binary whatever their unit says: torch's MPS messages write "GB" for 1024**3 bytes.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Optional, Pattern, Tuple

from ..oom import is_out_of_memory

__all__ = ["OomMessage", "parse_message", "to_bytes", "UNCERTAIN_KINDS"]

_UNITS = {"": 1, "b": 1, "byte": 1, "bytes": 1, "k": 2 ** 10, "kb": 2 ** 10, "kib": 2 ** 10,
          "m": 2 ** 20, "mb": 2 ** 20, "mib": 2 ** 20, "g": 2 ** 30, "gb": 2 ** 30, "gib": 2 ** 30,
          "t": 2 ** 40, "tb": 2 ** 40, "tib": 2 ** 40}
SIZE = r"(\d+(?:\.\d+)?)\s*(bytes|byte|[KMGT]i?B|[KMGT]|B)?(?!\w)"

# Which library wrote the message: the first pattern found names it.
_KINDS = (
    ("MPS", r"MPS backend out of memory"),
    ("XPU", r"XPU out of memory"),
    ("HIP", r"HIP out of memory"),
    ("CUDA", r"CUDA out of memory"),
    ("CPU", r"DefaultCPUAllocator|can't allocate memory"),
    ("cuBLAS", r"CUBLAS_STATUS_ALLOC_FAILED"),
    ("cuDNN", r"CUDNN_STATUS|cuDNN"),
    ("NumPy", r"Unable to allocate .* for an array"),
    ("TensorFlow", r"RESOURCE_EXHAUSTED|OOM when allocating|CUDA_ERROR_OUT_OF_MEMORY"),
    ("CUDA runtime", r"CUDA error: out of memory|cuda runtime error \(2\)"),
    ("Python", r"\bMemoryError"),
)
# Out-of-memory wordings the classifier knows by their error's class only: NumPy's
# _ArrayMemoryError and Python's MemoryError, pasted as text.
_ALSO_OOM = re.compile(r"Unable to allocate .* for an array|\bMemoryError\b")
# cuDNN errors that are no out-of-memory error by themselves, though a full GPU often causes
# them: read and explained when pasted, never taken for one by the cell hook.
UNCERTAIN_KINDS = re.compile(r"CUDNN_STATUS_(EXECUTION_FAILED|INTERNAL_ERROR)")


def _re(pattern: str) -> Pattern[str]:
    return re.compile(pattern.replace("SIZE", SIZE), re.IGNORECASE)


_REQUESTED = [_re(r"Tried to allocate SIZE"), _re(r"you tried to allocate (\d+) (bytes)"),
              _re(r"Unable to allocate SIZE for an array"), _re(r"failed to allocate [^(]*\((\d+) (bytes)\)")]
_CAPACITY = [_re(r"SIZE total capacity"), _re(r"total capac(?:i)?ty of SIZE"), _re(r"max allowed: SIZE")]
_FREE = [_re(r"of which SIZE is free"), _re(r"SIZE free[;)]")]
_ALLOCATED = [_re(r"SIZE already allocated"), _re(r"Of the allocated memory SIZE is allocated by PyTorch"),
              _re(r"MPS allocated: SIZE")]
_RESERVED = [_re(r"SIZE reserved in total by PyTorch")]
_UNALLOCATED = [_re(r"SIZE is reserved by PyTorch but unallocated"), _re(r"SIZE cached\)")]
_ALLOWED = [_re(r"SIZE allowed;")]
_THIS_PROCESS = [_re(r"this process has SIZE memory in use")]
_NON_TORCH = [_re(r"other allocations: SIZE")]
_PRIVATE = [_re(r"with SIZE allocated in private pools")]
_PROCESS = _re(r"Process (\d+) has SIZE memory in use")
_DEVICE = re.compile(r"\(GPU (\d+);|\bGPU (\d+) has a total|\bDevice (\d+) has a total|device:GPU:(\d+)")
_TF_SHAPE = re.compile(r"OOM when allocating tensor with shape\[([\d,\s]*)\] and type (\w+)")
_TF_ITEM = {"float": 4, "double": 8, "half": 2, "bfloat16": 2, "int8": 1, "uint8": 1, "int16": 2,
            "int32": 4, "int64": 8, "bool": 1, "complex64": 8, "complex128": 16}
_WORDINGS = (  # (pattern, which torch printed it), the first found wins
    (r"cached\)", "PyTorch 1.0-1.3"),
    (r"reserved in total by PyTorch", "PyTorch 1.4-2.0"),
    (r"total capacty of", "PyTorch 2.1"),
    (r"total capacity of.*max_split_size_mb", "PyTorch 2.1"),
    (r"total capacity of.*expandable_segments", "PyTorch 2.2 or later"),
    (r"total capacity of", "PyTorch 2.1 or later"),
)


@dataclasses.dataclass(frozen=True)
class OomMessage:
    """The numbers an out-of-memory message writes, in bytes; None where it writes none."""

    kind: str  # the library that wrote it: CUDA, HIP, XPU, MPS, CPU, cuBLAS, cuDNN, NumPy, ...
    line: str  # the line that says it, as written
    requested: Optional[int] = None
    device: Optional[str] = None  # "cuda:0", "xpu:1", "mps", "cpu"; TensorFlow's "GPU:0"
    capacity: Optional[int] = None  # the device's total (MPS: its "max allowed")
    free: Optional[int] = None
    allocated: Optional[int] = None  # by torch's tensors
    reserved: Optional[int] = None  # by torch's caching allocator, allocated included
    unallocated: Optional[int] = None  # reserved but unallocated: the fragmentation to watch
    allowed: Optional[int] = None  # torch's cap from set_per_process_memory_fraction
    this_process: Optional[int] = None  # "Including non-PyTorch memory, this process has ..."
    processes: Tuple[Tuple[int, int], ...] = ()  # (pid, bytes) of each "Process N has ..." line
    non_torch: Optional[int] = None  # MPS's "other allocations"
    private_pools: Optional[int] = None  # CUDA graphs' pools, counted in ``allocated``
    wording: Optional[str] = None  # which PyTorch wrote it, read from its wording
    uncertain: bool = False  # a cuDNN failure that is often, not always, an out-of-memory


def to_bytes(number: str, unit: Optional[str]) -> int:
    """"2.56", "GiB" -> bytes; a size without a unit is bytes."""
    return int(round(float(number) * _UNITS[(unit or "").lower()]))


def _first(patterns, text: str) -> Optional[int]:
    for pattern in patterns:
        match = pattern.search(text)
        if match:
            return to_bytes(match.group(1), match.group(2))
    return None


def _kind(text: str) -> Optional[str]:
    return next((kind for kind, pattern in _KINDS if re.search(pattern, text)), None)


def _line(text: str) -> str:
    """The line that says it: the first naming an out-of-memory (or a cuDNN failure)."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    found = [line for line in lines if is_out_of_memory(line) or _ALSO_OOM.search(line)
             or UNCERTAIN_KINDS.search(line)]
    return (found or lines or [""])[0]


def _device(kind: str, text: str) -> Optional[str]:
    if kind == "MPS":
        return "mps"
    if kind in ("CPU", "NumPy"):
        return "cpu"
    match = _DEVICE.search(text)
    if match is None:
        return None
    index = next(group for group in match.groups() if group is not None)
    if kind == "TensorFlow":
        return f"GPU:{index}"
    return f"{'xpu' if kind == 'XPU' else 'cuda'}:{index}"  # a ROCm torch names its GPUs cuda:N


def _tensorflow_request(text: str) -> Optional[int]:
    """TensorFlow writes the shape and type it could not allocate: their product in bytes."""
    match = _TF_SHAPE.search(text)
    item = _TF_ITEM.get(match.group(2)) if match else None
    if match is None or item is None:
        return None
    count = 1
    for part in match.group(1).split(","):
        count *= int(part) if part.strip() else 1
    return item * count


def _reserved(text: str, allocated: Optional[int], unallocated: Optional[int]) -> Optional[int]:
    """1.4-2.0 write the reserved total; the others write what of it is unallocated."""
    reserved = _first(_RESERVED, text)
    if reserved is None and allocated is not None and unallocated is not None:
        return allocated + unallocated
    return reserved


def parse_message(text: str) -> Optional[OomMessage]:
    """The numbers of the out-of-memory message in ``text`` (a message, a traceback, a log),
    or None where ``text`` holds none."""
    uncertain = not (is_out_of_memory(text) or _ALSO_OOM.search(text))
    if uncertain and not UNCERTAIN_KINDS.search(text):
        return None
    kind = _kind(text) or "unknown"
    allocated, unallocated = _first(_ALLOCATED, text), _first(_UNALLOCATED, text)
    reserved = _reserved(text, allocated, unallocated)
    if unallocated is None and reserved is not None and allocated is not None:
        unallocated = max(0, reserved - allocated)
    requested = _first(_REQUESTED, text)
    return OomMessage(
        kind=kind, line=_line(text), device=_device(kind, text),
        requested=requested if requested is not None else _tensorflow_request(text),
        capacity=_first(_CAPACITY, text), free=_first(_FREE, text), allocated=allocated,
        reserved=reserved, unallocated=unallocated, allowed=_first(_ALLOWED, text),
        this_process=_first(_THIS_PROCESS, text),
        processes=tuple((int(pid), to_bytes(number, unit)) for pid, number, unit in _PROCESS.findall(text)),
        non_torch=_first(_NON_TORCH, text), private_pools=_first(_PRIVATE, text),
        wording=next((name for pattern, name in _WORDINGS if re.search(pattern, text, re.S)), None),
        uncertain=uncertain)
