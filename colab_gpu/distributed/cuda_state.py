"""Whether CUDA has started in this process, so that processes forked from it cannot use it.

The CUDA driver does not survive a fork: once ``cuInit`` ran here, a forked rank that touches
the GPU fails ("Cannot re-initialize CUDA in forked subprocess", or CUDA's "initialization
error"). ``torch.cuda.is_initialized()`` says so only for torch's own start:
``torch.cuda.is_available()`` initializes the driver and leaves it False (accelerate#940), as do
TensorFlow, JAX, CuPy or bitsandbytes at import. So the driver itself is asked, and only if this
process already loaded it: ``cuDeviceGetCount`` answers CUDA_ERROR_NOT_INITIALIZED until
``cuInit`` ran, and starts nothing. Nothing here loads the driver or initializes CUDA.
"""
from __future__ import annotations

import ctypes
import os
import sys
from typing import Optional

from ..runtime import cuda_torch

__all__ = ["cuda_started", "loaded_driver", "driver_initialized"]

CUDA_SUCCESS = 0
_DRIVER = "libcuda.so"  # libcuda.so.1, or the file it links to: libcuda.so.550.54.15


def loaded_driver(maps: str = "/proc/self/maps") -> Optional[str]:
    """The path of the CUDA driver library this process has loaded (Linux), else None."""
    try:
        with open(maps) as lines:
            for line in lines:
                fields = line.split(maxsplit=5)  # address, perms, offset, device, inode, path
                if len(fields) == 6 and os.path.basename(fields[5].rstrip("\n")).startswith(_DRIVER):
                    return fields[5].rstrip("\n")
    except OSError:
        pass
    return None


def driver_initialized(maps: str = "/proc/self/maps") -> bool:
    """Whether this process initialized the CUDA driver (``cuInit``), whoever called it. False
    where the driver is not loaded here, or cannot be asked."""
    path = loaded_driver(maps)
    if path is None:
        return False
    try:
        # RTLD_NOLOAD: the library already in the process, or nothing: never a new load
        driver = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
        count = ctypes.c_int(0)
        return driver.cuDeviceGetCount(ctypes.byref(count)) == CUDA_SUCCESS
    except (OSError, AttributeError):
        return False


def cuda_started(modules=sys.modules) -> Optional[str]:
    """What started CUDA in this process, in words for the refusal; None if nothing did."""
    if cuda_torch(modules) is not None:
        return "torch.cuda.is_initialized() is True"
    if sys.platform.startswith("linux") and driver_initialized():
        return ("the CUDA driver is initialized (torch.cuda.is_available() does that, as do "
                "TensorFlow, JAX, CuPy and bitsandbytes)")
    return None
