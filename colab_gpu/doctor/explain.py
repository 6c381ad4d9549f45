"""``explain_oom()``: from an error (measured in this kernel) or a message (its numbers alone)
to an :class:`OomReport`.

An error is read where it is: its message's numbers (the moment it failed), the device now
(NVML; torch's counters since CUDA runs), what the kernel holds (within a time budget) and the
failed cell's code. A message pasted from elsewhere says nothing of this machine: only its
own numbers are used, and the report says so.
"""
from __future__ import annotations

import dataclasses
import sys
import time
from typing import Any, Optional

from ..oom import describe, error_chain, is_out_of_memory, message
from ..cuda import cuda_devices_in_use, working_device
from ..devices import DeviceSource
from ..spelling import command
from ..errors import UserError
from ..runtime import current_shell, cuda_torch, detect_platform
from .causes import Evidence, find_causes
from .cell import read_cell
from .device import DeviceNow, read_device
from .installed import allocator_key_available
from .kernel import KernelScan, failed_call_builds_graph, scan_kernel
from .parse import OomMessage, parse_message
from .report import PASTED, THIS_KERNEL, OomReport, OtherProcess

__all__ = ["explain_oom", "explain_error", "explain_text", "BUDGET", "NotOutOfMemory"]

BUDGET = 0.3  # seconds of measuring: the card must come within half a second of the error
_GPU_KINDS = ("CUDA", "HIP", "cuBLAS", "cuDNN", "CUDA runtime")


class NotOutOfMemory(UserError, ValueError):
    """Text given to explain that holds no out-of-memory message."""


def explain_oom(error_or_text: Any, shell: Any = None, source: Optional[DeviceSource] = None,
                cell: Optional[str] = None) -> OomReport:
    """Why did this run out of memory, and what to do: an :class:`OomReport`.

    Never initializes CUDA; the report holds numbers and names, never a tensor or a frame.

    Parameters
    ----------
    error_or_text : BaseException or str
        An exception (``sys.last_value`` after a failed cell, or one caught in a script): this
        kernel is measured (the device now through NVML, torch's counters once CUDA runs, what
        the last error and the outputs keep, which variables hold the memory and which keep
        autograd graphs). Or a message pasted from a forum or a log: explained from its
        numbers alone.
    shell : InteractiveShell, optional
        The shell whose namespace is measured; the running one by default.
    source : DeviceSource, optional
        Where the GPUs are read; NVML by default.
    cell : str, optional
        The failed cell's source, read for its batch-size variable.

    Returns
    -------
    OomReport
        The numbers, the causes found and their fixes, largest first.

    Raises
    ------
    NotOutOfMemory
        For text that holds no out-of-memory message.
    TypeError
        For anything but an exception or a str.
    """
    if isinstance(error_or_text, str):
        return explain_text(error_or_text)
    if isinstance(error_or_text, BaseException):
        return explain_error(error_or_text, shell=shell, source=source, cell=cell)
    raise TypeError(f"explain_oom() takes an exception or an error message (str), not {error_or_text!r}")


def explain_text(text: str, source: str = PASTED) -> OomReport:
    """The report of a message from elsewhere: its numbers, nothing of this machine."""
    parsed = parse_message(text)
    if parsed is None:
        shown = " ".join(text.split())
        raise NotOutOfMemory(f"no out-of-memory message in {shown[:80] + '...' if len(shown) > 80 else shown!r}: "
                         f"give the error's text, such as 'CUDA out of memory. Tried to allocate 2.00 GiB ...'")
    report = _from_message(parsed, source)
    expandable = parsed.wording.startswith("PyTorch 2") if parsed.wording else \
        allocator_key_available("expandable_segments")
    evidence = Evidence(others_known=parsed.this_process is not None, expandable=expandable)
    report = dataclasses.replace(report, causes=find_causes(report, evidence))
    notes = _message_notes(parsed) + _no_cause(report) + [
        "Explained from the message's numbers alone; `"
        + command("%explain_oom", "colab_gpu.explain_oom(sys.last_value)")
        + "` right after a failed cell also measures the kernel."]
    return dataclasses.replace(report, notes=tuple(notes))


def _from_message(parsed: OomMessage, source: str) -> OomReport:
    processes = tuple(OtherProcess(pid, nbytes) for pid, nbytes in parsed.processes)
    non_torch = parsed.non_torch
    if parsed.this_process is not None and parsed.reserved is not None:
        non_torch = max(0, parsed.this_process - parsed.reserved)
    return OomReport(
        source=source, kind=parsed.kind, error=parsed.line, device=parsed.device,
        requested_bytes=parsed.requested, capacity_bytes=parsed.capacity, free_bytes=parsed.free,
        allocated_bytes=parsed.allocated, reserved_bytes=parsed.reserved, allowed_bytes=parsed.allowed,
        # torch lists every process on the GPU where it names this one: none listed is none there
        other_processes_bytes=(sum(nbytes for _, nbytes in parsed.processes)
                               if parsed.processes or parsed.this_process is not None else None),
        non_torch_bytes=non_torch, processes=processes, wording=parsed.wording)


def _message_notes(parsed: OomMessage) -> list:
    notes = []
    if parsed.processes and parsed.this_process is None:
        notes.append("The message lists processes but not this one: in a container the ids are the host's, "
                     "so one of them may be the process that failed.")
    if parsed.uncertain:
        notes.append("This cuDNN error is no out-of-memory error by itself, but on a nearly full GPU it "
                     "often is one; with CUDA_LAUNCH_BLOCKING=1 the real error shows.")
    return notes


def _oom_link(error: BaseException) -> BaseException:
    """The error of the chain that says it ran out of memory (a wrapper's cause, often)."""
    for link in error_chain(error):
        if isinstance(link, MemoryError) or is_out_of_memory(message(link)):
            return link
    if is_out_of_memory(error):  # torch's OutOfMemoryError class, whatever its message
        return error
    raise NotOutOfMemory(f"not an out-of-memory error: {describe(error)}")


def _default_device(kind: str) -> Optional[str]:
    """The device of a message that names none: the CPU's errors, or the GPU this kernel works on."""
    if kind in ("CPU", "NumPy", "Python"):
        return "cpu"
    torch = cuda_torch()
    if kind in _GPU_KINDS and torch is not None:
        return f"cuda:{working_device(torch.cuda.current_device(), cuda_devices_in_use(torch))}"
    return None


def _parsed(link: BaseException) -> OomMessage:
    text = message(link)
    parsed = parse_message(text) if text else None
    if parsed is None:  # MemoryError(), or an out-of-memory class with a message of its own
        kind = "Python" if isinstance(link, MemoryError) else "unknown"
        parsed = OomMessage(kind=kind, line=describe(link))
    return parsed


def explain_error(error: BaseException, shell: Any = None, source: Optional[DeviceSource] = None,
                  cell: Optional[str] = None, budget: float = BUDGET) -> OomReport:
    """The report of ``error``, measured in this kernel within ``budget`` seconds or about."""
    started = time.perf_counter()
    shell = shell if shell is not None else current_shell()
    link = _oom_link(error)
    parsed = _parsed(link)
    device = parsed.device or _default_device(parsed.kind)
    now = read_device(device, source)
    scan = scan_kernel(shell, device, started + budget)
    torch = sys.modules.get("torch")
    namespace = getattr(shell, "user_ns", None) or sys.modules["__main__"].__dict__
    evidence = Evidence(
        live=True, cuda_running=cuda_torch() is not None, platform=detect_platform(shell),
        cell=read_cell(cell, namespace), scan=scan,
        others_known=now.others_known or parsed.this_process is not None,
        compute_capability=now.compute_capability,
        graph_in_failed_call=torch is not None and failed_call_builds_graph(link, torch),
        grad_enabled=bool(torch is not None and torch.is_grad_enabled()),
        expandable=allocator_key_available("expandable_segments"))
    del link, error
    report = _merged(_from_message(parsed, THIS_KERNEL), now, scan)
    notes = _message_notes(parsed) + _live_notes(now, scan, budget)
    report = dataclasses.replace(report, causes=find_causes(report, evidence))
    notes += _no_cause(report)
    return dataclasses.replace(report, notes=tuple(notes), seconds=time.perf_counter() - started)


def _no_cause(report: OomReport) -> list:
    if report.causes:
        return []
    return ["None of the causes this card knows shows in the numbers: the cell needs more memory than there "
            "is; a smaller batch, sequence or model is the way."]


def _first(*values):
    return next((value for value in values if value is not None), None)


def _merged(report: OomReport, now: DeviceNow, scan: KernelScan) -> OomReport:
    """The message's numbers (the moment it failed) completed, and where exact replaced, by
    this device's now: torch's counters and NVML's free memory are exact, the message rounds."""
    others = None
    if now.others_known:
        others = sum(process.nbytes for process in now.processes)
    return dataclasses.replace(
        report, device=report.device or (now.device if now.device != "unknown" else None), device_name=now.name,
        capacity_bytes=_first(report.capacity_bytes, now.capacity), free_bytes=_first(now.free, report.free_bytes),
        allocated_bytes=_first(now.allocated, report.allocated_bytes),
        reserved_bytes=_first(now.reserved, report.reserved_bytes),
        allowed_bytes=_first(report.allowed_bytes, now.allowed),
        other_processes_bytes=_first(others, report.other_processes_bytes),
        processes=now.processes if now.others_known else report.processes,
        non_torch_bytes=_first(now.non_torch, report.non_torch_bytes), in_use_bytes=now.in_use,
        kept=scan.kept, variables=scan.variables, graphs=scan.graphs)


def _live_notes(now: DeviceNow, scan: KernelScan, budget: float) -> list:
    notes = []
    if now.problem:
        notes.append(f"GPU not read: {now.problem}")
    if not scan.complete:
        notes.append(f"Measuring stopped after {budget:.1f} s ({scan.walked} of {scan.total} variables walked, "
                     f"the figures are lower bounds): `"
                     + command("%clear_cache --vars", "colab_gpu.memory_holders()") + "` ranks them all.")
    return notes
