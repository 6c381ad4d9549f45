"""What ``explain_oom`` returns: numbers and names only, never an object of the failed cell.

A report that kept a frame or a tensor would keep the very memory it explains: everything
here is an int, a string or a tuple of them, so the report can be kept (``%explain_oom``
shows the last one again) while ``%clear_cache`` frees what the failed cell held.
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any, Dict, Optional, Tuple

from ..render.shown import Shown

__all__ = ["Cause", "OomReport", "OtherProcess", "Place", "Graph",
           "THIS_KERNEL", "PASTED"]

THIS_KERNEL = "this kernel"  # measured here, after the cell failed
PASTED = "pasted message"  # a message alone, explained from its numbers


@dataclasses.dataclass(frozen=True)
class OtherProcess:
    """Another process that holds memory on the device."""

    pid: int
    nbytes: int
    name: Optional[str] = None


@dataclasses.dataclass(frozen=True)
class Place:
    """What holds memory on the device: a variable, an output (``Out[3]``) or the last error,
    with the bytes it alone keeps there."""

    name: str
    nbytes: int
    type_name: str = ""


@dataclasses.dataclass(frozen=True)
class Graph:
    """A variable that keeps an autograd graph: the bytes the graph alone keeps alive (the
    tensors it saved for backward()), and over how many steps it grew."""

    name: str
    nbytes: int
    steps: int  # the chain of additions (`total = total + loss`), or the graphs a list holds
    in_list: bool = False  # a list (or dict, tuple) of tensors, one graph each


@dataclasses.dataclass(frozen=True)
class Cause:
    """One cause found by measurement, and its fix."""

    kind: str  # request_too_large, other_process, outside_torch, kept_by_ipython, autograd_graph,
    # fragmentation, tensors_fill, mixed_precision, eval_graph, library: causes.RULES
    finding: str  # what was measured, with its numbers
    fix: str  # what to do: a command or a line of code to copy
    frees: Optional[int] = None  # bytes the fix would give back; None where not measurable
    why: str = ""  # what else the fix needs said (a restart, the catch)
    decisive: bool = False  # nothing else can help: listed first whatever it frees


@dataclasses.dataclass(frozen=True, repr=False)
class OomReport(Shown):
    """Why a cell ran out of memory and what to do, from measurements. Sizes are bytes, None
    where neither the message nor the machine says.

    Attributes
    ----------
    source : str
        Whose numbers: this kernel's, a pasted message's alone, or "message in FILE".
    kind : str
        Which library ran out: CUDA, HIP, XPU, MPS, CPU, cuBLAS, cuDNN, NumPy, Python ...
    error : str
        The message's line that says it.
    device, device_name : str or None
        "cuda:0", "cpu" or "mps", and the GPU's name ("Tesla T4").
    requested_bytes, capacity_bytes, free_bytes : int or None
        What the failing call asked for, the device's capacity and what was free.
    allocated_bytes, reserved_bytes : int or None
        torch's tensors, and its cache with them.
    allowed_bytes : int or None
        torch's own cap (``set_per_process_memory_fraction``) or the address-space limit.
    other_processes_bytes, non_torch_bytes, in_use_bytes : int or None
        Other processes' memory, this process's outside torch (CUDA context, libraries), and on
        the CPU this process's address space or resident memory.
    processes : tuple of OtherProcess
        The other processes on the GPU, largest first.
    kept, variables : tuple of Place
        What IPython keeps (the last error, outputs) that no variable does; the variables
        holding the most on the device.
    graphs : tuple of Graph
        Variables that keep autograd graphs across steps.
    causes : tuple of Cause
        The causes found, each with its fix, the one that gives back most first.
    notes : tuple of str
        What could not be measured, and the command that finishes it.
    wording : str or None
        Which PyTorch releases wrote the message.
    seconds : float
        How long the measurements took.
    """

    source: str  # THIS_KERNEL, PASTED, or "message in FILE"
    kind: str  # which library ran out: CUDA, HIP, XPU, MPS, CPU, cuBLAS, cuDNN, NumPy, Python ...
    error: str  # the message's line that says it
    device: Optional[str] = None  # "cuda:0", "cpu", "mps"
    device_name: Optional[str] = None  # "Tesla T4"
    requested_bytes: Optional[int] = None
    capacity_bytes: Optional[int] = None
    free_bytes: Optional[int] = None
    allocated_bytes: Optional[int] = None
    reserved_bytes: Optional[int] = None
    allowed_bytes: Optional[int] = None  # torch's own cap (set_per_process_memory_fraction, RLIMIT_AS)
    other_processes_bytes: Optional[int] = None
    non_torch_bytes: Optional[int] = None  # this process's memory outside torch (CUDA context, libraries)
    in_use_bytes: Optional[int] = None  # CPU: this process's address space (or resident memory)
    processes: Tuple[OtherProcess, ...] = ()
    kept: Tuple[Place, ...] = ()  # what IPython keeps (the last error, outputs) and no variable does
    variables: Tuple[Place, ...] = ()  # the variables holding the most on the device
    graphs: Tuple[Graph, ...] = ()
    causes: Tuple[Cause, ...] = ()
    notes: Tuple[str, ...] = ()  # what could not be measured, and what finishes it
    wording: Optional[str] = None  # which PyTorch wrote the message
    seconds: float = 0.0  # how long the measurements took

    @property
    def reserved_unallocated_bytes(self) -> Optional[int]:
        """Reserved by torch's cache but holding no tensor: large, it is fragmentation."""
        if self.reserved_bytes is None or self.allocated_bytes is None:
            return None
        return max(0, self.reserved_bytes - self.allocated_bytes)

    @property
    def kept_bytes(self) -> Optional[int]:
        """What %clear_cache would free of what IPython keeps; None where nothing was measured."""
        return sum(place.nbytes for place in self.kept) if self.source == THIS_KERNEL else None

    def to_dict(self) -> Dict[str, Any]:
        data = dataclasses.asdict(self)
        data["reserved_unallocated_bytes"] = self.reserved_unallocated_bytes
        data["kept_bytes"] = self.kept_bytes
        return data

    def to_json(self, indent: Optional[int] = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    line_view = "colab_gpu.doctor.render:report_line"
    text_view = "colab_gpu.doctor.render:report_text"  # the card under a failed cell in a terminal
    html_view = "colab_gpu.doctor.render:report_html"
