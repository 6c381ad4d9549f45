"""The GPUs a plan can be made for: what CUDA gives torch on each, and what the process holds
outside torch's allocator there (the CUDA context with cuBLAS's and cuDNN's handles).

``total``: nvidia-smi's total less its reserve, which is torch's ``total_memory`` (T4: 15360 -
451 MiB on Colab's driver 550+, torch's "14.56 GiB" in shared/data/oom-messages; H100: 81559 -
479 MiB in shared/data/nvidia-smi-captures; RTX 3090: 24576 - 316 MiB in nvidia-smi-xml; A100s
and the V100 as their out-of-memory messages print it; L4: 23034 MiB less a T4-like reserve).
``context``: what the process holds outside the allocator. H100: checked against milabench's
batch-1 recordings (shared/data/batch-size/milabench/H100.yaml: resnet50 within 2 %); RTX 3090:
the larger context of CUDA 11.3 without lazy module loading, which timm's recordings ran on,
checked only through benchmarks/plan_vs_measured.py's ladder; the others: the driver's usual size
for the generation, from the T4 and 16 GB out-of-memory messages in shared/data (135 to 350 MiB
besides torch's own memory), rounded up. None was fitted to the benchmarks' answers.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Optional, Tuple

from .search import BYTE_UNITS, SearchError

__all__ = ["Gpu", "GPUS", "GpuError", "gpu_named", "accepted", "names_this"]

MiB = 1024 ** 2


class GpuError(SearchError):
    """A --plan value naming no GPU the plan knows; the message lists what is accepted."""


@dataclasses.dataclass(frozen=True)
class Gpu:
    """A GPU as a plan sees it: bytes torch can have in all, and those the process holds
    outside torch's allocator. ``cublas_workspace``: each cuBLAS handle's workspace, which
    torch takes from its allocator (8 MiB and 128 KiB before Hopper, 32 MiB on it)."""

    name: str
    total: int
    context: int
    capability: Optional[Tuple[int, int]] = None
    measured: bool = False  # context checked against real recordings of this GPU

    @property
    def cublas_workspace(self) -> int:
        hopper = self.capability is not None and self.capability >= (9, 0)
        return 32 * MiB if hopper else 8 * MiB + 128 * 1024

    def tensor_cores(self, dtype: str, tf32: bool = True) -> bool:
        """Whether cuDNN runs a convolution in ``dtype`` ("float16", "bfloat16", "float32") on
        tensor cores here: float16 from Volta (7.0), bfloat16 and TF32 (float32, unless
        ``torch.backends.cudnn.allow_tf32`` is off) from Ampere (8.0). A GPU given by its
        capacity alone is taken for a recent one."""
        capability = self.capability or (8, 0)
        if dtype == "float16":
            return capability >= (7, 0)
        return capability >= (8, 0) and (dtype == "bfloat16" or (dtype == "float32" and tf32))

    @property
    def usable(self) -> int:
        """What torch's allocator may reserve: the total less the context."""
        return self.total - self.context


GPUS = {gpu.name: gpu for gpu in (
    Gpu("T4", 14909 * MiB, 350 * MiB, (7, 5)),
    Gpu("L4", 22584 * MiB, 450 * MiB, (8, 9)),
    Gpu("V100-16GB", 16148 * MiB, 350 * MiB, (7, 0)),
    Gpu("A100-40GB", 40336 * MiB, 450 * MiB, (8, 0)),
    Gpu("A100-80GB", 81050 * MiB, 450 * MiB, (8, 0)),
    Gpu("H100", 81080 * MiB, 1100 * MiB, (9, 0), measured=True),
    Gpu("RTX3090", 24260 * MiB, 1200 * MiB, (8, 6)),
)}
GENERIC_CONTEXT = 450 * MiB  # a capacity given as a number: a context like an A100's


def accepted(this: bool = True) -> str:
    """What --plan takes, for a refusal (``this`` left out where no GPU is here)."""
    named = f"{', '.join(GPUS)}, {'' if this else 'or '}a capacity like 15GiB"
    return f"{named}, or this (the GPU here)" if this else named


def names_this(spec: str) -> bool:
    """Whether a --plan value names the GPU here (``this``, any case)."""
    return str(spec).strip().lower() == "this"


def gpu_named(spec: str) -> Gpu:
    """The Gpu ``spec`` names: a table entry (any case), a capacity (``15GiB``, ``16000MiB``),
    or ``this``, read through NVML (no CUDA context is made); else GpuError."""
    text = str(spec).strip()
    for name, gpu in GPUS.items():
        if text.lower() == name.lower():
            return gpu
    match = re.fullmatch(r"([0-9]*\.?[0-9]+)\s*(gib|gb|mib|mb)", text.lower())
    if match:
        total = int(float(match.group(1)) * BYTE_UNITS[match.group(2)])
        if total <= GENERIC_CONTEXT:
            raise GpuError(f"--plan {spec}: a GPU that small holds no more than a CUDA context; "
                           f"give {accepted()}")
        return Gpu(text, total, GENERIC_CONTEXT)
    if names_this(text):
        return _this_gpu(spec)
    raise GpuError(f"--plan {spec}: give {accepted()}")


def _this_gpu(spec: str) -> Gpu:
    """The first GPU of this machine, read through NVML; its table entry's context where its
    name says which it is."""
    from ..devices import known_compute_capability, open_source

    source = open_source()
    try:
        snapshot = source.snapshot()
    finally:
        source.close()
    gpus = [gpu for gpu in getattr(snapshot, "gpus", ()) if getattr(gpu, "memory_total", None)]
    if not gpus:
        why = getattr(snapshot, "problem", None) or "NVML sees no GPU"
        raise GpuError(f"--plan {spec}: no GPU here to plan for ({why}); give {accepted(this=False)}")
    gpu = gpus[0]
    total = gpu.memory_total - (getattr(gpu, "memory_reserved", None) or 0)
    known = [entry for key, entry in GPUS.items()
             if key.split("-")[0].lower() in gpu.name.lower().replace(" ", "")]
    context = known[0].context if known else GENERIC_CONTEXT
    return Gpu(gpu.name, total, context, known_compute_capability(gpu.name))
