"""Is this error an out-of-memory, a broken device, or something else? And the error in one line.

Shared core: %%find_batch retries with a smaller batch only after a real out-of-memory, and
stops at an error that leaves the CUDA context broken (illegal memory access, device-side
assert): every later trial would fail too, or hide the bug; anything else is the user's own
error. clear_cache() says when a step failed on a broken device. Classes are looked up by
name with ``getattr`` because they moved between torch versions, and the message is checked
along ``__cause__`` / ``__context__`` because user code often re-raises with its own wrapper.
"""
from __future__ import annotations

import enum
import re
import sys
from typing import Iterator, Optional, Union

__all__ = ["OOM_FRAGMENTS", "BROKEN_FRAGMENTS", "ONEDNN_PRIMITIVE", "OOM_CLASSES", "ErrorKind", "error_chain",
           "message", "address_space_limited", "classify", "is_out_of_memory", "describe"]

# Lower-case fragments of every known out-of-memory wording (PyTorch CUDA / HIP / XPU / MPS /
# CPU, the CUDA runtime, cuBLAS, cuDNN; TensorFlow's too, since a message is a message).
OOM_FRAGMENTS = (
    "out of memory",                      # CUDA/HIP/XPU allocator, "CUDA error: out of memory", MPS
    "cublas_status_alloc_failed",
    "cudnn_status_alloc_failed",
    "cudnn_status_not_supported",         # cuDNN's usual disguise for a failed workspace allocation
    "unable to find a valid cudnn algorithm",
    "unable to find an engine",           # "FIND was unable to find an engine to execute this computation"
    "can't allocate memory",              # "DefaultCPUAllocator: can't allocate memory"
    "resource_exhausted: oom when allocating",  # TensorFlow
    "cuda_error_out_of_memory",           # the driver API's name, as TensorFlow logs it
)
BROKEN_FRAGMENTS = (
    "illegal memory access",
    "device-side assert triggered",  # not "enable device-side assertions", a hint in every CUDA error
    "unspecified launch failure",
    "misaligned address",
)
# oneDNN (torch's CPU convolutions) making a primitive whose descriptor it already made, so the
# CPU supports it: under an address-space limit (ulimit -v) that fails where the mmap of the
# kernel's JIT code buffer (256 KiB) is refused, so a smaller size runs. Without a limit the same
# words mean a CPU without the instructions or a forked process, and no size would run: out of
# memory only where the address space is limited. "... primitive descriptor" is never memory.
ONEDNN_PRIMITIVE = re.compile(r"could not create a primitive(?! descriptor)")
# Class names (looked up on torch, torch.cuda, torch.mps, torch.xpu) that mean "out of memory".
OOM_CLASSES = ("OutOfMemoryError",)


class ErrorKind(enum.Enum):
    """Each kind's value says it in words, as the outcome of a %%find_batch trial that raised it."""

    OUT_OF_MEMORY = "out of memory"
    DEVICE_BROKEN = "device broken"
    OTHER = "error"


def error_chain(error: BaseException) -> Iterator[BaseException]:
    """The error and every error it was raised from or during, each once."""
    seen = set()
    link: Optional[BaseException] = error
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        yield link
        link = link.__cause__ or link.__context__


def message(error: BaseException) -> str:
    """``str(error)``, or "" where the error's own ``__str__`` raises (Python's traceback shows
    "<exception str() failed>"): raised in the search, it replaced the user's error and left
    their objects unrestored."""
    try:
        return str(error)
    except Exception:
        return ""


def _oom_classes() -> tuple:
    torch = sys.modules.get("torch")
    if torch is None:
        return ()
    found = []
    for namespace in (torch, getattr(torch, "cuda", None), getattr(torch, "mps", None),
                      getattr(torch, "xpu", None)):
        for name in OOM_CLASSES:
            cls = getattr(namespace, name, None)
            if isinstance(cls, type) and cls not in found:
                found.append(cls)
    return tuple(found)


def address_space_limited() -> bool:
    """Whether this process runs under an address-space limit (``ulimit -v``, RLIMIT_AS)."""
    try:
        import resource
    except ImportError:  # Windows
        return False
    return resource.getrlimit(resource.RLIMIT_AS)[0] != resource.RLIM_INFINITY


def classify(error: Optional[BaseException]) -> Optional[ErrorKind]:
    """What an error means: out of memory, a broken device, or another error (None for no error).

    A broken device wins over out-of-memory anywhere in the chain: retrying on a broken
    context only produces more errors.
    """
    if error is None:
        return None
    classes = _oom_classes()
    kind = ErrorKind.OTHER
    for link in error_chain(error):
        text = message(link).lower()
        if any(fragment in text for fragment in BROKEN_FRAGMENTS):
            return ErrorKind.DEVICE_BROKEN
        if isinstance(link, MemoryError) or (classes and isinstance(link, classes)) \
                or any(fragment in text for fragment in OOM_FRAGMENTS) \
                or (ONEDNN_PRIMITIVE.search(text) is not None and address_space_limited()):
            kind = ErrorKind.OUT_OF_MEMORY  # unless a later link says the device is broken
    return kind


def is_out_of_memory(error: Union[BaseException, str]) -> bool:
    """True when ``error`` (or one it was raised from) says the device ran out of memory.

    Recognises ``torch.OutOfMemoryError`` / ``torch.cuda.OutOfMemoryError`` and the
    messages of every variant: CUDA / HIP / XPU / MPS "out of memory", "CUDA error: out of
    memory", CUBLAS_STATUS_ALLOC_FAILED, CUDNN_STATUS_ALLOC_FAILED / NOT_SUPPORTED, cuDNN
    "unable to find an engine" / "valid cuDNN algorithm", and the CPU allocator's
    "DefaultCPUAllocator: can't allocate memory", oneDNN's "could not create a primitive" under
    an address-space limit (``ulimit -v``), and Python's own ``MemoryError`` (NumPy's
    "Unable to allocate ..."). Errors that break the device (illegal memory access,
    device-side assert) are not out-of-memory errors. A message (a string) may be given
    instead of an error. The message decides, whatever the error's type: your own
    ``ValueError("ran out of memory budget")`` is one too, so a step may raise one to mark a
    size as too large, and ``find_batch`` tries a smaller one.

    Parameters
    ----------
    error : BaseException or str
        The error caught, or its message.

    Returns
    -------
    bool
        Whether it, or an error it was raised from or during (``__cause__``,
        ``__context__``), says out of memory, and none of them says the device broke.

    Raises
    ------
    TypeError
        ``error`` is neither an exception nor a string.
    """
    if isinstance(error, str):
        error = RuntimeError(error)
    if not isinstance(error, BaseException):
        raise TypeError(f"is_out_of_memory() takes an exception or its message, not {error!r}")
    return classify(error) is ErrorKind.OUT_OF_MEMORY


def describe(error: BaseException) -> str:
    """``Type: message`` in one line: the first line and, after a heading ending in a colon
    (torch's "Error(s) in loading state_dict for Linear:"), the line that says what went wrong."""
    lines = [line.strip() for line in message(error).strip().splitlines()]
    text = " ".join(lines[:2]) if len(lines) > 1 and lines[0].endswith(":") else (lines[0] if lines else "")
    return f"{type(error).__name__}: {text}" if text else type(error).__name__  # Ctrl-C has no message
