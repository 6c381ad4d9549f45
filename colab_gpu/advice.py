"""What the user should do, as data: each rule is a condition on a Status and a message.

Rules are checked in order; each one that holds adds one line of advice. Adding a rule is
adding one entry to ``RULES`` (and one test).
"""
from __future__ import annotations

import dataclasses
import os
import re
import sys
from typing import TYPE_CHECKING, Callable, Optional, Tuple

from .devices import GiB, gpu_models
from .devices.nvml import DRIVER_PRESENT_PROBLEMS, NO_PYNVML
from .spelling import command
from .runtime import COLAB, KAGGLE, cpu_only_build, names_a_device_twice, wheel_build
from .words import count

if TYPE_CHECKING:
    from .torch_view import Status


@dataclasses.dataclass(frozen=True)
class Advice:
    """One line of advice in a Status: the rule that gave it, how urgent, what to do."""

    rule: str
    level: str  # "info", "tip" or "warning"
    message: str


@dataclasses.dataclass(frozen=True)
class Rule:
    name: str
    level: str  # "warning" (something is wrong), "tip" (do this), "info"
    message: Callable[["Status"], Optional[str]]  # None when the rule does not apply
    about_this_machine: bool = False  # reads this machine's torch or environment: not for recordings


def _no_gpu(status: "Status") -> bool:
    """No GPU here: none read, no TPU, and no problem that says a driver is here (pynvml
    missing, no permission ...), where "no GPU" would contradict the card's "No GPU read:" line."""
    return (not status.gpus and status.runtime.tpu_type is None
            and status.snapshot.problem not in DRIVER_PRESENT_PROBLEMS)


COLAB_GPU_MENU = "Runtime > Change runtime type > T4 GPU"  # where a Colab user gets a GPU
KAGGLE_GPU_MENU = "Settings > Accelerator > GPU T4 x2"  # where a Kaggle user gets GPUs


def colab_no_gpu(status):
    if status.runtime.platform != COLAB:
        return None
    if status.runtime.accelerator_hint != "gpu":
        if not _no_gpu(status):
            return None
        return (f"This Colab runtime has no GPU: {COLAB_GPU_MENU}, then "
                "run your cells again (the runtime restarts and variables are lost). If Colab "
                "answers that it cannot connect to a GPU backend, your GPU usage limit is "
                "reached: wait until it resets, or buy compute units.")
    # COLAB_GPU=1: Colab gave this runtime a GPU; changing the runtime type would not help.
    if any(not gpu.error for gpu in status.gpus):
        return None
    if status.snapshot.problem == NO_PYNVML:
        return ("This is a Colab GPU runtime (COLAB_GPU=1) whose nvidia-ml-py package is gone "
                "(Colab's GPU image ships it; was it uninstalled?): pip install nvidia-ml-py, "
                f"then run {command('%gpu_status', 'colab_gpu.status()')} again.")
    return ("This is a Colab GPU runtime (COLAB_GPU=1), yet its GPU cannot be read (said "
            "above): Runtime > Restart session will not bring it back; Runtime > "
            "Disconnect and delete runtime, then Connect, gives a fresh machine (variables and "
            "files outside Drive are lost).")


def kaggle_no_gpu(status):
    if _no_gpu(status) and status.runtime.platform == KAGGLE:
        return (f"This Kaggle notebook has no GPU: {KAGGLE_GPU_MENU} "
                "(your account needs phone verification).")


def no_gpu_found(status):
    if not _no_gpu(status) or status.runtime.platform in (COLAB, KAGGLE):
        return None
    # Not why: the status already says it on its "No GPU read:" line.
    demo = (command("%gpu_status --live --demo shows", "colab_gpu.live.start(demo=True) runs")
            + " the monitor on a recorded GPU trace.")
    if sys.platform != "darwin" or status.runtime.torch.mps_available is False:
        return f"No NVIDIA GPU found: torch will run on the CPU; {demo}"
    # A Mac's GPU is reached through torch's MPS backend, which NVML and these memory tools do not read.
    where = ("" if status.runtime.torch.mps_available else
             " where torch.backends.mps.is_available() says True (else on the CPU)")
    return (f"No NVIDIA GPU on a Mac, but torch runs on its GPU with model.to('mps') and tensors made "
            f"with device='mps'{where}; the CUDA memory tools here do not apply; {demo}")


def tpu_runtime(status):
    if status.runtime.tpu_type:
        return (f"This is a TPU runtime ({status.runtime.tpu_type}): torch reaches it only "
                f"through torch_xla; the CUDA memory tools here do not apply.")


def visible_devices_hide_all(status):
    if status.gpus and all(status.hidden_from_torch(gpu) is True for gpu in status.gpus):
        if names_a_device_twice(status.visible_devices, status.gpus):  # "0,0": indices, yet none
            return (f"CUDA_VISIBLE_DEVICES={status.runtime.cuda_visible_devices!r} hides every GPU from torch: "
                    f"it names the same device twice, which CUDA takes as naming none; list each "
                    f"once, or unset it, before torch starts CUDA.")
        return (f"CUDA_VISIBLE_DEVICES={status.runtime.cuda_visible_devices!r} hides every GPU from torch: "
                f"unset it or list GPU indices or UUIDs, before torch starts CUDA.")


def visible_devices_changed(status):
    if status.visible_devices_changed is None:
        return None
    now, certain = status.visible_devices_changed

    def value(visible):
        return "unset" if visible is None else repr(visible)

    started = value(status.runtime.cuda_visible_devices)
    read = (f"CUDA started under {started}" if certain else
            f"it was {started} when colab_gpu first looked, CUDA already started (the GPUs are "
            f"labelled by that, though it may have changed before)")
    return (f"CUDA_VISIBLE_DEVICES is {value(now)} now, but {read}: CUDA reads it once, at its start, "
            f"so torch's cuda:N stay as they were; restart the kernel to use the new value.")


def device_order_differs(status):
    if len(gpu_models(status.gpus)) > 1 and status.runtime.cuda_device_order != "PCI_BUS_ID":
        return ("These GPUs differ and CUDA numbers them fastest first, unlike nvidia-smi: "
                "set CUDA_DEVICE_ORDER=PCI_BUS_ID before torch starts so the indices agree.")


def several_gpus(status):
    usable = sum(1 for gpu in status.gpus if gpu.index in status.torch_index_of and not gpu.error)
    if usable > 1:
        return (f"torch sees {usable} GPUs but a model runs only on the one it is moved to (usually cuda:0): to "
                f"train on all of them from a notebook, wrap the model in torch.nn.DataParallel "
                f"(simplest) or start DistributedDataParallel with accelerate's notebook_launcher "
                f"(faster); in a script, torchrun.")


def _torch_version(status) -> Optional[str]:
    """The user's torch version: the imported one's, else the installed one's (read from its
    metadata, without importing it); None when there is none."""
    from .torch_allocator.installed import installed_torch_version

    torch = status.runtime.torch
    return torch.version if torch.imported else installed_torch_version(modules={})


CUDA13_OLDEST = (7, 5)  # the newest start of any build judged below: CUDA 13 compiles nothing under it


def _oldest_capability(version: Optional[str]) -> Optional[Tuple[int, int]]:
    """The oldest compute capability a torch of PyTorch's own CUDA builds (the ``+cuXYZ`` wheels
    Colab and Kaggle install) has kernels for, where known: CUDA 13 compiles nothing below 7.5;
    from torch 2.8 the CUDA 12.8 and 12.9 builds start at 7.0 (pytorch's
    .ci/manywheel/build_cuda.sh; torch 2.13's own table in torch/cuda/__init__.py). Other
    builds (conda-forge's, one's own, CUDA 12.6 and older) are not judged: None."""
    match = re.match(r"(\d+)\.(\d+)\b[^+]*\+cu(\d+)$", version or "")
    if not match:
        return None
    major, minor, cuda = (int(part) for part in match.groups())
    if cuda >= 130:
        return CUDA13_OLDEST
    if cuda >= 128 and (major, minor) >= (2, 8):
        return (7, 0)
    return None


def _without_kernels(status):
    """The GPUs visible to this machine's torch that it has no kernels for (never for a recording:
    the torch here is not the recorded machine's)."""
    if status.snapshot.recorded or not any(gpu.compute_capability and gpu.compute_capability < CUDA13_OLDEST
                                           for gpu in status.gpus):
        return []  # no GPU any build lacks kernels for: the installed version is not read
    oldest = _oldest_capability(_torch_version(status))
    if oldest is None:
        return []
    return [gpu for gpu in status.gpus if gpu.compute_capability and gpu.compute_capability < oldest
            and status.hidden_from_torch(gpu) is not True]


def torch_lacks_kernels(status):
    old = _without_kernels(status)
    if not old:
        return None
    version = _torch_version(status)
    oldest = _oldest_capability(version)
    if version is None or oldest is None:  # never: _without_kernels found GPUs by both
        return None
    gpus = ", ".join(f"GPU {gpu.index} ({gpu.name}, compute capability "
                     f"{gpu.compute_capability[0]}.{gpu.compute_capability[1]})" for gpu in old)
    cuda = version.rsplit("+cu", 1)[1]
    what = (f"torch {version} has no kernels for {gpus}: PyTorch's CUDA {cuda[:-1]}.{cuda[-1]} builds "
            f"start at compute capability {oldest[0]}.{oldest[1]} (torch.cuda.get_arch_list() lists yours), "
            f"so any CUDA work fails with \"no kernel image is available for execution on the device\"")
    if status.runtime.platform == KAGGLE:
        return f"{what}. {KAGGLE_GPU_MENU} gives GPUs it runs on."
    if any(gpu.compute_capability >= (5, 0) for gpu in old):  # what torch's CUDA 12.6 builds start at
        return (f"{what}. The same torch built with CUDA 12.6 has kernels from compute capability 5.0: "
                f"pip install torch=={version.split('+')[0]} --index-url "
                f"https://download.pytorch.org/whl/cu126, then restart the kernel.")
    return f"{what}."


def _capabilities(status):
    """The compute capabilities of the GPUs the precision tips speak of: not those torch has no
    kernels for (the tips would contradict torch_lacks_kernels's warning), nor those
    CUDA_VISIBLE_DEVICES hides from torch (autocast cannot run there)."""
    old = _without_kernels(status)
    return {gpu.compute_capability for gpu in status.gpus if gpu.compute_capability and gpu not in old
            and status.hidden_from_torch(gpu) is not True}


def turing_fp16(status):
    if any((7, 0) <= cc < (8, 0) for cc in _capabilities(status)):
        return ("A GPU of compute capability 7.x (a T4, a V100) runs fp16 fast but has no "
                "native bf16: train with torch.autocast('cuda', dtype=torch.float16) and a "
                "torch.amp.GradScaler, not bf16 (which runs emulated, slowly).")


def ampere_bf16(status):
    if _capabilities(status) and all(cc >= (8, 0) for cc in _capabilities(status)):
        return ("This GPU supports bf16: torch.autocast('cuda', dtype=torch.bfloat16) needs no "
                "gradient scaler, and torch.set_float32_matmul_precision('high') enables TF32.")


def pre_volta(status):
    if any(cc < (7, 0) for cc in _capabilities(status)):
        return ("This GPU predates tensor cores (compute capability below 7.0): mixed "
                "precision saves memory but gains little speed.")


def cpu_torch_on_gpu_machine(status):
    if not status.gpus:
        return None
    torch = status.runtime.torch
    build = torch.build if torch.imported else wheel_build(_torch_version(status))
    if build in ("cpu", "mps"):  # a Mac's torch has no CUDA either
        return cpu_only_build("The installed torch", ", but this machine has a GPU:",
                              " (see pytorch.org for the command matching your CUDA driver).")


def _expandable_segments_set() -> Optional[str]:
    """The variable that sets expandable_segments:True for this process (torch's own reading
    order, a ROCm build's PYTORCH_HIP_ALLOC_CONF too; %alloc_conf keeps it saying what the
    process runs with), else None."""
    from .torch_allocator.installed import current_settings, installed_env_names

    try:
        name, settings = current_settings(os.environ, installed_env_names())
    except Exception:  # unreadable: %alloc_conf says so itself
        return None
    return name if dict(settings).get("expandable_segments") == "True" else None


def fragmentation(status):
    for memory in status.torch_memory:
        waste = memory.reserved_unallocated
        if memory.num_alloc_retries or (waste > 1 * GiB and waste > 0.25 * memory.reserved):
            fragmented = (f"cuda:{memory.torch_index} is fragmented ({waste / GiB:.1f} GiB reserved "
                          f"but unallocated, {count(memory.num_alloc_retries, 'cache flush')})")
            already = _expandable_segments_set()
            if already:  # a restart to set it again would change nothing
                return (f"{fragmented}, with expandable_segments already on ({already}): "
                        f"{command('%clear_cache', 'colab_gpu.clear_cache()')} gives back the "
                        f"cached memory no tensor uses.")
            return (f"{fragmented}: after a runtime restart run "
                    + command("%alloc_conf expandable_segments=True",
                              "colab_gpu.alloc_conf('expandable_segments=True')") + " before CUDA starts.")


def had_oom(status):
    failed = [f"cuda:{memory.torch_index} ran out of memory {count(memory.num_ooms, 'time')}"
              for memory in status.torch_memory if memory.num_ooms]
    if failed:  # every device: on several GPUs each may have its own batch or model part
        return (f"{', '.join(failed)}: {command('%clear_cache', 'colab_gpu.clear_cache()')} frees what "
                f"the failed cell still holds; {command('%%find_batch', 'colab_gpu.find_batch()')} finds "
                f"a batch size that fits.")


def _largest_holder(gpu) -> str:
    """" (largest: pid 999 python3, 14.45 GiB)", or "" when no process is listed."""
    holders = [p for p in gpu.processes or () if p.used_memory]
    if not holders:
        return ""
    largest = max(holders, key=lambda p: p.used_memory)
    program = (largest.name or "").split(" ")[0]  # nvidia-smi may record a whole command line
    who = f"{largest.pid} {program}" if program else str(largest.pid)
    return f" (largest: pid {who}, {largest.used_memory / GiB:.2f} GiB)"


def _memories(status):
    """(name, fraction used, GPU, torch memory or None, hidden from torch) of each memory this
    kernel could fill: a GPU's, or on a GPU split into MIG instances each instance's (the
    parent's total means nothing to a process given one instance). Hidden is the card's
    answer (Status.hidden_from_torch); where that is unknown, the memory may be this kernel's."""
    for gpu in status.gpus:
        if not gpu.mig_instances:
            yield (f"GPU {gpu.index}", gpu.memory_used_fraction, gpu, status.torch_memory_of(gpu.index),
                   status.hidden_from_torch(gpu) is True)
            continue
        for mig in gpu.mig_instances:
            torch_index = status.mig_torch_index_of.get((gpu.index, mig.index))
            memory = next((m for m in status.torch_memory if m.torch_index == torch_index), None)
            yield (f"MIG instance {mig.index} of GPU {gpu.index}", mig.memory_used_fraction, gpu, memory,
                   status.hidden_from_torch(gpu, mig) is True)


def memory_nearly_full(status):
    for name, fraction, gpu, memory, hidden in _memories(status):
        if fraction is None or fraction <= 0.9:
            continue
        if hidden:
            continue  # hidden from torch by CUDA_VISIBLE_DEVICES: this kernel neither uses nor frees it
        # A MIG GPU's process list spans all its instances: no holder is named for one instance.
        holder = "" if gpu.mig_instances else _largest_holder(gpu)
        if status.snapshot.recorded:  # another machine's: a command run here reads this kernel, not its
            return (f"{name} was {fraction:.0%} full when recorded{holder}: on that machine little more "
                    f"fits until the processes holding it free memory or stop.")
        if not status.runtime.torch.cuda_initialized:
            why = "it has not started CUDA"  # so none of this kernel's variables hold it
        elif memory is not None and not memory.reserved:
            why = f"it holds nothing on cuda:{memory.torch_index}"  # another user's job on a shared box
        else:
            return (f"{name} is {fraction:.0%} full: "
                    f"{command('%clear_cache --vars', 'colab_gpu.memory_holders()')} shows which "
                    f"variables hold the memory.")
        return (f"{name} is {fraction:.0%} full, not by torch in this kernel ({why}): "
                f"other processes hold it{holder}. Stop them (an earlier kernel or "
                f"a background job?) or restart the runtime.")


def other_processes(status):
    for part in status.breakdown:
        if part.other_processes and part.other_processes > 256 * 1024 ** 2:
            return (f"Other processes hold {part.other_processes / GiB:.1f} GiB on GPU "
                    f"{part.nvml_index} (an earlier kernel still running?).")


def throttled(status):
    serious = {"power cap", "thermal (software)", "thermal (hardware)", "hardware slowdown", "power brake"}
    # Not a GPU hidden from torch: another user's job slows there, not this kernel's.
    slowed = [(gpu.index, ", ".join(sorted(serious.intersection(gpu.clock_event_reasons or ()))))
              for gpu in status.gpus if status.hidden_from_torch(gpu) is not True]
    slowed = [(index, reasons) for index, reasons in slowed if reasons]
    if len(slowed) == 1:
        return (f"GPU {slowed[0][0]} is slowing its clocks ({slowed[0][1]}): "
                f"expect lower throughput than its peak.")
    if slowed:  # all of them named: in a multi-GPU run the slowest GPU sets the pace
        return (f"GPUs {', '.join(f'{index} ({reasons})' for index, reasons in slowed)} are slowing "
                f"their clocks: expect lower throughput than their peak.")


def mig_mode(status):
    for gpu in status.gpus:
        if gpu.mig_enabled:
            total = f"{gpu.memory_total / GiB:.0f} GiB" if gpu.memory_total else "GPU"
            return (f"GPU {gpu.index} is split into MIG instances: a process sees only the instance it "
                    f"is given (nvidia-smi -L lists them; choose one with CUDA_VISIBLE_DEVICES=MIG-<uuid>), "
                    f"with that instance's share of memory, not the whole {total}; MIG reports no "
                    f"utilization.")


def cuda_not_started(status):
    torch = status.runtime.torch
    if status.gpus and not torch.cuda_initialized:
        change = f"CUDA is not started yet: {command('%alloc_conf', 'colab_gpu.alloc_conf()')} can still " \
                 f"change every allocator setting"
        if torch.imported:  # backend is read by `import torch`: %alloc_conf refuses to change it now
            return f"{change} but backend, which torch fixed when it was imported."
        return f"{change}."


RULES: Tuple[Rule, ...] = (
    Rule("colab_no_gpu", "warning", colab_no_gpu, about_this_machine=True),
    Rule("kaggle_no_gpu", "warning", kaggle_no_gpu, about_this_machine=True),
    Rule("no_gpu_found", "warning", no_gpu_found, about_this_machine=True),
    Rule("tpu_runtime", "info", tpu_runtime, about_this_machine=True),
    Rule("visible_devices_hide_all", "warning", visible_devices_hide_all, about_this_machine=True),
    Rule("visible_devices_changed", "warning", visible_devices_changed, about_this_machine=True),
    Rule("device_order_differs", "warning", device_order_differs, about_this_machine=True),
    Rule("cpu_torch_on_gpu_machine", "warning", cpu_torch_on_gpu_machine, about_this_machine=True),
    Rule("torch_lacks_kernels", "warning", torch_lacks_kernels, about_this_machine=True),
    Rule("several_gpus", "tip", several_gpus, about_this_machine=True),
    Rule("had_oom", "warning", had_oom),
    Rule("fragmentation", "tip", fragmentation),
    Rule("memory_nearly_full", "tip", memory_nearly_full),
    Rule("other_processes", "info", other_processes),
    Rule("throttled", "info", throttled),
    Rule("mig_mode", "info", mig_mode),
    Rule("turing_fp16", "tip", turing_fp16),
    Rule("ampere_bf16", "tip", ampere_bf16),
    Rule("pre_volta", "info", pre_volta),
    Rule("cuda_not_started", "info", cuda_not_started, about_this_machine=True),
)


def advise(status: "Status") -> Tuple[Advice, ...]:
    found = []
    for rule in RULES:
        if rule.about_this_machine and status.snapshot.recorded:
            continue
        message = rule.message(status)
        if message:
            found.append(Advice(rule.name, rule.level, message))
    return tuple(found)
