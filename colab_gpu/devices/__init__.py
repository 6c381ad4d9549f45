"""The hardware boundary: what a GPU looks like to the rest of colab_gpu.

Everything above this package sees GPUs only as the dataclasses below, produced by a
:class:`DeviceSource`. Two sources exist: :class:`~colab_gpu.devices.nvml.NvmlSource` reads
the live driver through NVML (which never creates a CUDA context), and
:class:`~colab_gpu.devices.replay.ReplaySource` reads a saved ``nvidia-smi`` recording.
Sizes are bytes, power watts, clocks MHz, temperatures degrees Celsius; ``None`` means the
device or the recording does not report that field ("n/a"), or reported one that cannot be
(more memory used than the GPU has, 500 % busy): each of those is checked here, once for every
source and view, and noted in ``invalid`` instead of shown or advised on.
"""
from __future__ import annotations

import dataclasses
import math
import numbers
import os
import re
import time
from typing import FrozenSet, Iterable, List, Optional, Protocol, Sequence, Tuple, TypedDict

from ..state import session
from ..words import size

MiB = 1024 ** 2
GiB = 1024 ** 3
INDEX_LIMIT = 2 ** 32  # NVML numbers GPUs, MIG devices and their ids with an unsigned int
PID_LIMIT = 2 ** 32  # NVML's process ids are unsigned ints too
SILICON_MELTS = 1414.0  # °C: no working GPU reads hotter, none colder than absolute zero
ABSOLUTE_ZERO = -273.15


class InvalidIndex(ValueError):
    """A GPU index no GPU can have (a corrupt recording): unlike another field's impossible
    value, it cannot become n/a, since the index is how the GPU is told apart and named."""


Invalid = Tuple[Tuple[str, str], ...]  # (field, what was read there), e.g. ("memory", "1 GiB used of 100 MiB")


def _figure(value) -> str:
    """A number as read, where it may be no number a reading can be: "inf", "99999999… (400 digits)"."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, int) and value.bit_length() > 64:  # wider than any NVML counter
        if value.bit_length() > 14000:  # past what str() converts
            return "a number of thousands of digits"
        digits = str(value)
        return f"{digits[:9]}… ({len(digits.lstrip('-'))} digits)"
    return f"{value:g}" if isinstance(value, float) else str(value)


def _readable(value) -> bool:
    """A finite number within 64 bits: what NVML and nvidia-smi write."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return abs(value) < 2 ** 64 and (isinstance(value, int) or math.isfinite(value))


def _bytes_text(value) -> str:
    return size(value) if _readable(value) else f"{_figure(value)} bytes"


def _memory_problem(total, used, free, reserved) -> Optional[str]:
    """What makes a memory reading impossible ("976.56 GiB used of 100 MiB", "-100 MiB total"),
    None where it can be. Which of the numbers is wrong cannot be told, so all go together."""
    parts = (("total", total), ("used", used), ("free", free), ("reserved", reserved))
    for name, value in parts:
        if value is not None and (not _readable(value) or value < 0):
            return f"{_bytes_text(value)} {name}"
    for name, value in parts[1:]:
        if total is not None and value is not None and value > total:
            return f"{_bytes_text(value)} {name} of {_bytes_text(total)}"
    return None


def _checked_memory(reading, notes: List[Tuple[str, str]]) -> None:
    """Replace an impossible memory reading of ``reading`` (a GPU or a MIG instance) by None."""
    problem = _memory_problem(reading.memory_total, reading.memory_used, reading.memory_free,
                              reading.memory_reserved)
    if problem is not None:
        for name in ("memory_total", "memory_used", "memory_free", "memory_reserved"):
            object.__setattr__(reading, name, None)
        notes.append(("memory", problem))


# field: (what the note calls it, its unit, lowest and highest value a reading can have)
_RANGES = {
    "utilization_gpu": ("compute", "%", 0, 100),
    "utilization_memory": ("memory bus", "%", 0, 100),
    "temperature": ("temperature", " °C", ABSOLUTE_ZERO, SILICON_MELTS),
    "power_draw": ("power draw", " W", 0, math.inf),
    "power_limit": ("power limit", " W", 0, math.inf),
    "sm_clock": ("SM clock", " MHz", 0, math.inf),
    "sm_clock_max": ("SM clock maximum", " MHz", 0, math.inf),
    "memory_clock": ("memory clock", " MHz", 0, math.inf),
    "memory_clock_max": ("memory clock maximum", " MHz", 0, math.inf),
    "pcie_generation": ("PCIe generation", "", 0, math.inf),
    "pcie_generation_max": ("PCIe generation maximum", "", 0, math.inf),
    "pcie_width": ("PCIe width", "", 0, math.inf),
    "pcie_width_max": ("PCIe width maximum", "", 0, math.inf),
}


def _checked_ranges(gpu, notes: List[Tuple[str, str]]) -> None:
    for name, (label, unit, low, high) in _RANGES.items():
        value = getattr(gpu, name)
        if value is not None and not (_readable(value) and low <= value <= high):
            object.__setattr__(gpu, name, None)
            notes.append((name, f"{label} {_figure(value)}{unit}"))


def _checked_processes(gpu, notes: List[Tuple[str, str]]) -> None:
    """A process said to hold less than nothing, or more than its GPU has: its memory n/a."""
    if not gpu.processes:
        return
    kept = []
    for process in gpu.processes:
        if not _is_number(process.pid, PID_LIMIT):  # no process at all: left out of the list
            notes.append(("processes", f"a process numbered {_figure(process.pid)}: left out"))
            continue
        used = process.used_memory
        beyond = _readable(used) and gpu.memory_total is not None and used > gpu.memory_total
        if used is not None and (not _readable(used) or used < 0 or beyond):
            of = f" of {size(gpu.memory_total)}" if beyond else ""
            notes.append(("processes", f"pid {process.pid} holding {_bytes_text(used)}{of}: its memory n/a"))
            process = dataclasses.replace(process, used_memory=None)
        kept.append(process)
    object.__setattr__(gpu, "processes", tuple(kept))


def _is_number(value, limit: int) -> bool:
    """Whether ``value`` is an index or id a device has: a whole number from 0, below ``limit``."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool) and 0 <= int(value) < limit


def _checked_index(what: str, value) -> None:
    if not _is_number(value, INDEX_LIMIT):
        raise InvalidIndex(f"gives {what} {_figure(value)}, which none has (NVML numbers them from 0, "
                           f"below {INDEX_LIMIT})")


def invalid_readings(reading, fields: Iterable[str]) -> List[str]:
    """What ``reading`` (a GPU or a MIG instance) read impossibly in ``fields``, as noted."""
    wanted = set(fields)
    return [what for field, what in reading.invalid if field in wanted]


@dataclasses.dataclass(frozen=True)
class GPUProcess:
    """A process that holds memory on a GPU (host pid: inside containers it may not match)."""

    pid: int
    name: Optional[str] = None
    used_memory: Optional[int] = None
    kind: str = "compute"  # "compute" or "graphics"


def used_fraction(used: Optional[int], total: Optional[int]) -> Optional[float]:
    """used / total, or None where either is unknown."""
    if not total or used is None:
        return None
    return used / total


@dataclasses.dataclass(frozen=True)
class MigInstance:
    """One MIG instance of a GPU: the slice a process given ``CUDA_VISIBLE_DEVICES=MIG-<uuid>``
    runs on, with its own memory. NVML reports no utilization for it."""

    index: int  # the MIG device's index on its GPU, as nvidia-smi numbers it
    uuid: Optional[str] = None  # "MIG-..."; nvidia-smi's XML does not record it
    gpu_instance_id: Optional[int] = None
    compute_instance_id: Optional[int] = None
    multiprocessors: Optional[int] = None  # SMs in the instance
    memory_total: Optional[int] = None
    memory_used: Optional[int] = None
    memory_free: Optional[int] = None
    memory_reserved: Optional[int] = None
    invalid: Invalid = ()  # impossible readings, replaced by None (see GPU.invalid)

    def __post_init__(self) -> None:
        _checked_index("MIG device index", self.index)
        notes = list(self.invalid)
        _checked_memory(self, notes)
        for name in ("gpu_instance_id", "compute_instance_id", "multiprocessors"):
            value = getattr(self, name)
            if value is not None and not _is_number(value, INDEX_LIMIT):
                object.__setattr__(self, name, None)
                notes.append((name, f"{name.replace('_', ' ')} {_figure(value)}"))
        object.__setattr__(self, "invalid", tuple(notes))

    @property
    def memory_used_fraction(self) -> Optional[float]:
        return used_fraction(self.memory_used, self.memory_total)


class MemoryFields(TypedDict):
    """The memory of a GPU or a MIG device as a reader passes it to either: ``**fields``."""

    memory_total: Optional[int]
    memory_used: Optional[int]
    memory_free: Optional[int]
    memory_reserved: Optional[int]


@dataclasses.dataclass(frozen=True)
class GPU:
    """One GPU as NVML or nvidia-smi reports it, in NVML's (PCI bus) order."""

    index: int
    name: str
    uuid: Optional[str] = None
    bus_id: Optional[str] = None
    compute_capability: Optional[Tuple[int, int]] = None
    mig_enabled: Optional[bool] = None  # split into MIG instances: CUDA sees those, not this GPU
    memory_total: Optional[int] = None
    memory_used: Optional[int] = None
    memory_free: Optional[int] = None
    memory_reserved: Optional[int] = None  # by the driver; None when only memory info v1 exists
    utilization_gpu: Optional[float] = None  # percent of time a kernel ran
    utilization_memory: Optional[float] = None  # percent of time the memory bus was busy
    temperature: Optional[float] = None
    power_draw: Optional[float] = None
    power_limit: Optional[float] = None
    sm_clock: Optional[int] = None
    sm_clock_max: Optional[int] = None
    memory_clock: Optional[int] = None
    memory_clock_max: Optional[int] = None
    clock_event_reasons: Optional[Tuple[str, ...]] = None  # decoded words, () when none active
    performance_state: Optional[str] = None
    pcie_generation: Optional[int] = None
    pcie_generation_max: Optional[int] = None
    pcie_width: Optional[int] = None
    pcie_width_max: Optional[int] = None
    processes: Optional[Tuple[GPUProcess, ...]] = None
    mig_instances: Optional[Tuple[MigInstance, ...]] = None  # MIG on: its instances; else None
    error: Optional[str] = None  # set when the device itself failed (e.g. fell off the bus)
    # Readings that cannot be (a broken driver, a corrupt or edited recording), each replaced by
    # None when the GPU is built and noted here, so that no view shows them and no advice reads them.
    invalid: Invalid = ()

    def __post_init__(self) -> None:
        _checked_index("GPU index", self.index)
        notes = list(self.invalid)
        _checked_memory(self, notes)
        _checked_ranges(self, notes)
        _checked_processes(self, notes)
        object.__setattr__(self, "invalid", tuple(notes))

    @property
    def memory_used_fraction(self) -> Optional[float]:
        return used_fraction(self.memory_used, self.memory_total)


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """Every GPU a source sees at one moment, and why it saw none if so."""

    # The source's label: "NVML", "replay of <file>" (then, in parentheses, how a file that does
    # not describe itself was read), or memory.py's "none" where NVML could not be read
    source: str
    gpus: Tuple[GPU, ...] = ()
    driver_version: Optional[str] = None
    cuda_driver_version: Optional[str] = None
    problem: Optional[str] = None  # one line: why the source could not be read (no driver ...)
    recorded: bool = False  # from a recording of some other machine, not this one's driver
    timestamp: float = dataclasses.field(default_factory=time.time)

    @property
    def ok(self) -> bool:
        return self.problem is None


# Compute capability by product name (NVIDIA's CUDA GPU list), for recordings: nvidia-smi's
# XML does not record it. Checked in order; the first pattern that matches the name wins.
_CAPABILITY_BY_NAME = (
    (r"\bB[12]00\b", (10, 0)),
    # Before the GeForce names they share: Quadro RTX 3000/4000/5000 are Turing, and
    # RTX 4000/5000 Ada Generation are Ada, not an RTX 4080 or 5080.
    (r"Quadro RTX|TITAN RTX", (7, 5)),
    (r"\bAda\b", (8, 9)),
    (r"RTX 50\d0", (12, 0)),
    (r"\bG?H[12]00\b", (9, 0)),
    (r"\bL40S?\b|\bL4\b|RTX 40\d0", (8, 9)),
    (r"\bA100\b|\bA800\b|\bA30\b", (8, 0)),
    (r"\bA10G?\b|\bA40\b|\bA16\b|\bA2\b|RTX 30\d0|RTX A\d{4}", (8, 6)),
    (r"\bT4\b|RTX 20\d0|GTX 16\d0", (7, 5)),
    (r"V100|TITAN V\b", (7, 0)),
    (r"P100", (6, 0)),
    (r"GTX TITAN X\b|GTX 9[5-8]0|\bM[46]0\b", (5, 2)),  # Maxwell: the GTX TITAN X is not the Pascal one
    (r"\bP40\b|\bP4\b|GTX 10\d0|Quadro P\d+|TITAN Xp?\b", (6, 1)),
    (r"\bK80\b", (3, 7)),
)


UNKNOWN_GPU = "unknown GPU"  # the name of a GPU whose name could not be read


def gpu_models(gpus: Sequence[GPU]) -> FrozenSet[str]:
    """The models among ``gpus``; a GPU whose name could not be read (it fell off the bus, or
    NVML timed out) is none of them, so it never makes a box of identical GPUs look mixed."""
    return frozenset(gpu.name for gpu in gpus if gpu.name != UNKNOWN_GPU)


def known_compute_capability(name: str) -> Optional[Tuple[int, int]]:
    """The compute capability of a GPU known by its product name, else None."""
    for pattern, capability in _CAPABILITY_BY_NAME:
        if re.search(pattern, name):
            return capability
    return None


class DeviceSource(Protocol):
    """Anything that can take snapshots of GPUs: the live driver or a recording."""

    label: str

    def snapshot(self) -> Snapshot:
        """Read every GPU now. Never raises: a failure becomes ``Snapshot.problem``."""

    def light_snapshot(self) -> Snapshot:
        """Read only what the live monitor samples every second: each GPU's index, name,
        memory, utilization, temperature, power draw and error; any other field may be None.
        Never raises, as :meth:`snapshot`."""

    def close(self) -> None:
        """Release the library (NVML) or file; harmless to call twice."""


def open_source(path: Optional[str] = None) -> "DeviceSource":
    """The live NVML source, or a replay of the ``nvidia-smi`` recording at ``path``.

    Parameters
    ----------
    path : str, bytes or os.PathLike, optional
        An ``nvidia-smi`` recording (``-q -x`` XML, a ``--query-gpu`` CSV log or the table);
        None for this machine's GPUs through NVML.

    Returns
    -------
    DeviceSource
        Its ``snapshot()`` reads every GPU now and never raises: a driver that is missing or
        a file that is no recording becomes ``Snapshot.problem``. ``close()`` releases it.

    Raises
    ------
    TypeError
        ``path`` is not a path.
    colab_gpu.devices.replay.RecordingError
        (a ValueError) ``path`` names no regular file this process can read (missing, a
        directory, blank), or one too large to read whole.
    """
    if path is not None:
        from .replay import ReplaySource

        return ReplaySource(os.fspath(path))
    from .nvml import NvmlSource

    return NvmlSource()


def default_source() -> DeviceSource:
    """The process's one live NVML source (``session.default_source``), initialized once and
    shut down at exit."""
    if session.default_source is None:
        import atexit

        session.default_source = open_source()
        atexit.register(session.default_source.close)
    return session.default_source
