"""The causes of an out-of-memory error, each found by a rule on measured numbers, never
guessed: a rule that lacks its evidence says nothing. Each cause carries its fix, as a command
to copy, and the memory the fix would give back; the card ranks them by that.

Adding a cause is adding one function to RULES (and a test).
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Iterable, List, Optional, Tuple, Union

from ..spelling import command
from ..runtime import COLAB, JUPYTER, KAGGLE
from ..words import count, size
from .cell import CellFacts
from .kernel import KernelScan
from .report import Cause, OomReport

__all__ = ["Evidence", "find_causes", "rank", "RULES"]

MiB = 2 ** 20
SMALLEST = 1 * MiB  # a fix that gives back less is not worth a line
CONTEXT = 1024 * MiB  # the most a CUDA context with cuDNN and cuBLAS loaded takes, about
FAST_FP16 = (7, 0)  # tensor cores: Volta and later
FAST_BF16 = (8, 0)  # Ampere and later


@dataclasses.dataclass(frozen=True)
class Evidence:
    """What was measured beyond the report's numbers."""

    live: bool = False  # this kernel was measured (not a pasted message)
    cuda_running: bool = False  # this process has started CUDA
    platform: Optional[str] = None  # runtime.COLAB, JUPYTER ...
    cell: CellFacts = CellFacts()
    scan: KernelScan = KernelScan()
    others_known: bool = False  # the other processes were told apart from this one
    compute_capability: Optional[Tuple[int, int]] = None
    graph_in_failed_call: bool = False  # the failing call was recording an autograd graph
    grad_enabled: bool = False
    expandable: Optional[bool] = None  # the torch concerned has expandable_segments


def _shrink(cell: CellFacts) -> str:
    if cell.batch_variable:
        name = cell.batch_variable
        return command(f"`%%find_batch --var {name}` as the cell's first line: it runs the cell at "
                       f"several sizes and sets {name} to the largest that fits",
                       f"`colab_gpu.find_batch(step)` on a function of the batch size returns the "
                       f"largest that fits (set {name} to it)")
    return ("make the batch, the sequence length or the image size smaller; with the batch size in a variable, "
            + command("`%%find_batch --var NAME` as the cell's first line finds the largest that fits",
                      "`colab_gpu.find_batch(step)` finds the largest that fits"))


def _room_for_torch(report: OomReport) -> Tuple[Optional[int], str]:
    """The most the device could ever give torch, and how that was reckoned."""
    if report.allowed_bytes is not None and (report.capacity_bytes is None
                                             or report.allowed_bytes < report.capacity_bytes):
        return report.allowed_bytes, ("the address-space limit, ulimit -v" if report.device == "cpu"
                                      else "torch's per-process memory fraction")  # torch's cache alone
    room, how = report.capacity_bytes, "its capacity"
    if room is not None and report.non_torch_bytes:
        room -= report.non_torch_bytes
        how += f" less this process's {size(report.non_torch_bytes)} outside torch (CUDA context, libraries)"
    return room, how


def request_too_large(report: OomReport, evidence: Evidence) -> Optional[Cause]:
    requested = report.requested_bytes
    if requested is None:
        return None
    room, how = _room_for_torch(report)
    if room is not None and requested > room:
        where = "the CPU" if report.device == "cpu" else report.device or "the device"
        return Cause("request_too_large", f"The request alone, {size(requested)}, is more than "
                     f"{where} could ever give torch: {size(room)} ({how}).",
                     _shrink(evidence.cell), decisive=True)
    held, what = _held(report, evidence.scan)
    if report.free_bytes is None or held is None or requested <= report.free_bytes + held:
        return None
    could = report.free_bytes + held
    others = report.other_processes_bytes or 0
    return Cause("request_too_large", f"The request alone, {size(requested)}, is more than torch could get "
                 f"with every tensor freed: {size(report.free_bytes)} free and {size(held)} {what}.",
                 _shrink(evidence.cell), decisive=others < requested - could)


def _held(report: OomReport, scan: KernelScan) -> Tuple[Optional[int], str]:
    """What torch could get back on the device: its cache (a GPU's), else the tensors this
    kernel holds there, once all were measured."""
    if report.reserved_bytes is not None:
        return report.reserved_bytes, "it holds"
    if report.device == "cpu" and scan.complete and scan.torch_imported:
        return scan.held_bytes, "in the tensors this kernel holds"
    return None, ""


def _stop_command(evidence: Evidence, pids: List[int]) -> str:
    platform = evidence.platform
    if not evidence.live:  # a pasted message's ids are another machine's
        return (f"on the machine that printed it, end process {', '.join(map(str, pids))} if you no longer "
                f"use it (`nvidia-smi` lists it)" if pids else "end the other processes there")
    kill = f"`!kill {' '.join(map(str, pids))}`" if pids else "end them"
    if platform == COLAB:
        return ("Runtime > Manage sessions: terminate the sessions you no longer use (an old "
                "notebook keeps its GPU memory until its session ends)")
    if platform in (JUPYTER, KAGGLE):
        return f"shut down the other notebooks' kernels (Kernel > Shut Down Kernel in each), or {kill}"
    return kill.replace("`!", "`") if pids else "end the other processes"


def other_process(report: OomReport, evidence: Evidence) -> Optional[Cause]:
    others = report.other_processes_bytes
    if not evidence.others_known or not others or others < SMALLEST:
        return None
    named = [f"{p.pid} {p.name + ' ' if p.name else ''}({size(p.nbytes)})" for p in report.processes[:3]]
    more = f" and {len(report.processes) - 3} more" if len(report.processes) > 3 else ""
    holders = count(len(report.processes), "other process") if report.processes else "Other processes"
    verb = "holds" if len(report.processes) == 1 else "hold"
    return Cause("other_process", f"{holders} {verb} {size(others)} of this GPU"
                 + (f": {', '.join(named)}{more}." if named else "."),
                 _stop_command(evidence, [p.pid for p in report.processes]), frees=others,
                 why="A second notebook or an old kernel keeps its GPU memory until it ends.")


def kept_by_ipython(report: OomReport, evidence: Evidence) -> Optional[Cause]:
    kept = report.kept_bytes
    if not evidence.live or not kept or kept < SMALLEST:
        return None
    places = ", ".join(f"{place.name} {size(place.nbytes)}" for place in report.kept[:3])
    return Cause("kept_by_ipython", f"IPython keeps {size(kept)} of tensors that no variable of yours "
                 f"holds: {places}.", "`" + command("%clear_cache", "colab_gpu.clear_cache()") + "`", frees=kept,
                 why="The last error's traceback keeps the failed cell's local tensors until the next "
                     "error, and Out keeps every output; clearing drops them and empties torch's cache.")


def autograd_graph(report: OomReport, evidence: Evidence) -> List[Cause]:
    found = []
    for graph in evidence.scan.graphs:
        if graph.nbytes < SMALLEST or graph.steps < 2:
            continue
        name = graph.name
        now = "`" + command(f"%clear_cache {name}", f"colab_gpu.clear_cache({name!r})") + "`"
        if graph.in_list:
            finding = (f"`{name}` holds {graph.steps} tensors, each keeping its autograd graph: "
                       f"{size(graph.nbytes)} of tensors saved for a backward() that never comes.")
            fix = f"{now} frees it now; then keep numbers: `{name}.append(loss.item())` (or `out.detach()`)"
        else:
            finding = (f"`{name}` keeps the autograd graphs of {graph.steps} steps (`{name} = {name} + loss` "
                       f"adds each step's graph): {size(graph.nbytes)} of tensors saved for backward().")
            fix = f"{now} frees it now; then add numbers, not tensors: `{name} += loss.item()`"
        found.append(Cause("autograd_graph", finding, fix, frees=graph.nbytes))
    return found


def _defragment(evidence: Evidence) -> Tuple[str, str]:
    """The fix for fragmentation on the torch concerned, and what it needs said."""
    setting, why = "expandable_segments=True", []
    if evidence.expandable is False:
        setting = "max_split_size_mb=128"
        why.append(("The torch that wrote this message" if not evidence.live else "This torch")
                   + " has no expandable_segments (2.1+): max_split_size_mb keeps large cached blocks whole.")
    if evidence.cuda_running:
        why.append("The segments torch holds now stay split until CUDA restarts; the saved setting is applied "
                   "at %load_ext colab_gpu, before CUDA starts.")
        return ("`" + command(f"%alloc_conf {setting} --save", f"colab_gpu.alloc_conf({setting!r}, save=True)")
                + "`, then restart the runtime and run again", " ".join(why))
    return ("`" + command(f"%alloc_conf {setting}", f"colab_gpu.alloc_conf({setting!r})")
            + "` right after `%load_ext colab_gpu`, before CUDA starts", " ".join(why))


def fragmentation(report: OomReport, evidence: Evidence) -> Optional[Cause]:
    """Torch's cache holds enough free memory for the request, in pieces: a share worth a
    restart (2% of what torch may use at least), not the few MiB a small pool keeps."""
    unallocated, reserved = report.reserved_unallocated_bytes, report.reserved_bytes
    if unallocated is None or unallocated < SMALLEST or not reserved:
        return None
    requested = report.requested_bytes
    if requested is None:
        if unallocated < reserved / 4:
            return None
    elif unallocated < requested or unallocated < (_room_for_torch(report)[0] or reserved) / 50:
        return None
    share = f"{100 * unallocated / reserved:.0f}% of the {size(reserved)} it reserved"
    pieces = f", in pieces none of which fits the {size(requested)} asked" if requested is not None else ""
    fix, why = _defragment(evidence)
    return Cause("fragmentation", f"{size(unallocated)} is reserved by torch's cache but holds no tensor "
                 f"({share}){pieces}: the cache is fragmented.", fix, frees=unallocated, why=why)


def outside_torch(report: OomReport, evidence: Evidence) -> Optional[Cause]:
    """Memory neither free nor torch's, where the other processes are not told apart: this
    process's CUDA context takes a few hundred MiB of it; more, and another process holds it."""
    capacity, free, reserved = report.capacity_bytes, report.free_bytes, report.reserved_bytes
    if evidence.others_known or capacity is None or free is None or reserved is None:
        return None
    outside = capacity - free - reserved
    if outside < min(CONTEXT, capacity / 4) or (
            report.requested_bytes is not None and outside < report.requested_bytes):
        return None
    return Cause("outside_torch", f"{size(outside)} of the device is neither free nor torch's, more than a CUDA "
                 f"context takes: this process's context and libraries (cuDNN, cuBLAS, NCCL) hold some of it, "
                 f"other processes the rest.",
                 "`" + command("%gpu_status", "colab_gpu.status()") + "` (or `!nvidia-smi`) lists the processes "
                 "that hold it; end those you no longer use")


def tensors_fill(report: OomReport, evidence: Evidence) -> Optional[Cause]:
    """From a message alone: torch's tensors fill the device (in a measured kernel the
    variables row and the causes above say which)."""
    allocated, capacity = report.allocated_bytes, report.capacity_bytes
    if evidence.live or allocated is None or not capacity or allocated < capacity / 2:
        return None
    return Cause("tensors_fill", f"torch's tensors hold {size(allocated)} of the {size(capacity)} "
                 f"({100 * allocated / capacity:.0f}%): the model, its activations and whatever the kernel "
                 f"still keeps.", "in that kernel, " + command(
                     "`%clear_cache --vars` ranks what holds them and `%clear_cache` frees",
                     "`colab_gpu.memory_holders()` ranks what holds them and `colab_gpu.clear_cache()` frees")
                 + " what no variable needs (the last error, outputs); else " + _shrink(evidence.cell))


def _activations(report: OomReport, scan: KernelScan) -> Optional[int]:
    """torch's allocated memory that no module or optimizer holds: activations, mostly."""
    if report.allocated_bytes is None or scan.model_bytes is None:
        return None
    return max(0, report.allocated_bytes - scan.model_bytes)


def mixed_precision(report: OomReport, evidence: Evidence) -> Optional[Cause]:
    cell, scan, capability = evidence.cell, evidence.scan, evidence.compute_capability
    if (not evidence.cuda_running or not cell.calls_backward or cell.uses_autocast
            or not scan.float32_modules or capability is None or capability < FAST_FP16):
        return None
    activations = _activations(report, scan)
    names = ", ".join(f"`{name}`" for name in scan.float32_modules[:3])
    if capability >= FAST_BF16:
        fix = "run the forward pass and the loss under `with torch.autocast('cuda', dtype=torch.bfloat16):`"
    else:
        fix = ("run the forward pass and the loss under `with torch.autocast('cuda', dtype=torch.float16):` "
               "and scale the backward: `scaler = torch.amp.GradScaler()`, `scaler.scale(loss).backward()`, "
               "`scaler.step(optimizer)`, `scaler.update()`")
    why = ""
    if activations is not None and report.allocated_bytes and activations >= report.allocated_bytes / 2:
        why = (f"Activations take {size(activations)} of the {size(report.allocated_bytes)} allocated: "
               f"torch.utils.checkpoint.checkpoint on the largest blocks recomputes them in backward() "
               f"instead of keeping them.")
    return Cause("mixed_precision", f"{names} train{'s' if len(scan.float32_modules) == 1 else ''} in float32 "
                 f"on a GPU with fast {'bfloat16' if capability >= FAST_BF16 else 'float16'} "
                 f"(compute capability {capability[0]}.{capability[1]}).", fix,
                 frees=activations // 2 if activations else None, why=why)


def eval_graph(report: OomReport, evidence: Evidence) -> Optional[Cause]:
    cell, scan = evidence.cell, evidence.scan
    if (not evidence.live or not cell.known or cell.calls_backward or cell.uses_no_grad
            or not evidence.grad_enabled or not (scan.modules_in_eval or cell.calls_eval)):
        return None
    bound = [graph for graph in scan.graphs if graph.name in cell.assigned and graph.nbytes >= SMALLEST]
    if not bound and not evidence.graph_in_failed_call:
        return None
    held = f": `{bound[0].name}` keeps {size(bound[0].nbytes)} of it" if bound else ""
    return Cause("eval_graph", "The cell evaluates (no backward(), the model in eval mode) yet records an "
                 f"autograd graph, keeping every layer's activations for a backward pass that never comes{held}.",
                 "run it under `with torch.no_grad():` (or `torch.inference_mode()`)",
                 frees=bound[0].nbytes if bound else None)


_LIBRARY = {
    "cuBLAS": ("cuBLAS could not allocate the workspace of its first matrix product on this GPU: the "
               "GPU was already full."),
    "cuDNN": ("cuDNN found no algorithm whose workspace fits in the memory left: the GPU is nearly full "
              "(cuDNN says so in its own words)."),
    "CUDA runtime": ("CUDA itself could not allocate (a context, a library's memory outside torch's "
                     "cache): the GPU is full, often held by another process."),
    "TensorFlow": ("TensorFlow's allocator ran out; by default it takes the whole GPU when it starts, "
                   "leaving nothing to torch or another notebook."),
}


def library(report: OomReport, evidence: Evidence) -> Optional[Cause]:
    """What a message without numbers means, said as the message says it."""
    meaning = _LIBRARY.get(report.kind)
    if meaning is None:
        return None
    if report.kind == "TensorFlow":
        fix = "a smaller batch; `tf.config.experimental.set_memory_growth(gpu, True)` before TensorFlow starts"
    else:
        fix = command("`%gpu_status` shows who holds the GPU; `%clear_cache` frees what this kernel no longer "
                      "needs", "`colab_gpu.status()` shows who holds the GPU; `colab_gpu.clear_cache()` frees "
                      "what this kernel no longer needs")
    return Cause("library", meaning, fix)


RULES: Tuple[Callable[[OomReport, Evidence], Union[Optional[Cause], List[Cause]]], ...] = (
    request_too_large, other_process, outside_torch, kept_by_ipython, autograd_graph, fragmentation,
    tensors_fill, mixed_precision, eval_graph, library)


def rank(causes: Iterable[Cause]) -> Tuple[Cause, ...]:
    """Largest give-back first; a decisive cause (nothing else can make room) before all."""
    return tuple(sorted(causes, key=lambda cause: (not cause.decisive, cause.frees is None, -(cause.frees or 0))))


def find_causes(report: OomReport, evidence: Evidence) -> Tuple[Cause, ...]:
    found: List[Cause] = []
    for rule in RULES:
        result = rule(report, evidence)
        if isinstance(result, list):
            found.extend(result)
        elif result is not None:
            found.append(result)
    return rank(found)
