"""GPU check for %gpu_status: run on a machine with an NVIDIA GPU and a CUDA build of torch.

    python gpu_checks/gpu_status.py

In a real IPython shell it loads the extension, imports torch and runs ``%gpu_status``, then
checks that (1) the GPU torch calls cuda:0 is shown, under its NVML name; (2) CUDA was not
initialized by it; (3) the memory it showed agrees with ``torch.cuda.mem_get_info()`` taken
afterwards, within the size of the CUDA context that call created (measured by NVML);
(4) once CUDA is running, ``%gpu_status`` adds torch's allocator view; (5) the CUDA driver,
asked in a child process (colab_gpu.cuda_order), names and numbers the GPUs as the card does,
and asking loads nothing into this process. Prints its findings;
exit status 0 when every check passes, 1 when one fails, 2 when this machine has no CUDA GPU.
Takes well under a minute.
"""
from __future__ import annotations

import json
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
MiB = 2 ** 20
SLACK = 64 * MiB  # other processes and the driver move a little memory between two reads


def run_magic(shell, line: str):
    """Run ``%gpu_status line`` in the shell; (everything it showed as text, stderr)."""
    from IPython.utils.capture import capture_output

    with capture_output() as captured:
        shell.run_line_magic("gpu_status", line)
    shown = captured.stdout + "".join(output.data.get("text/plain", "") for output in captured.outputs)
    return shown, captured.stderr


def status_json(shell) -> dict:
    shown, errors = run_magic(shell, "--json")
    if errors.strip():
        print(f"  %gpu_status --json wrote to stderr: {errors.strip()}")
    return json.loads(shown)


def gpu_of_cuda0(data: dict) -> dict:
    """The NVML GPU that torch calls cuda:0 (CUDA_VISIBLE_DEVICES may reorder or hide GPUs)."""
    nvml_index = next(int(nvml) for nvml, torch_index in data["torch_index_of"].items() if torch_index == 0)
    return next(gpu for gpu in data["snapshot"]["gpus"] if gpu["index"] == nvml_index)


def shows_torch_memory(text: str, amount: str) -> bool:
    """The card's ``torch`` row says ``allocated <amount>`` and its ``where`` row ``torch tensors
    <amount>``. The ``where`` row starts with "other processes" only where NVML lists this
    process under its own id; in a container or a sandbox it lists the host's, and the row
    then begins "every process's CUDA context": either way the tensors are what it must show."""
    found = []  # [label, value] of each row; a value goes on under it, folded at 80 columns
    for line in text.splitlines():
        if line.startswith("  ") and not line.startswith("   "):
            label, _, value = line.strip().partition(" ")
            found.append([label, value.strip()])
        elif line.startswith("   ") and found:
            found[-1][1] += " " + line.strip()
        else:
            found.append(["", line])
    rows = {}
    for label, value in found:
        rows.setdefault(label, value)  # the first GPU's: the only one on the lent machine
    return (rows.get("torch", "").startswith(f"allocated {amount} ")
            and f"torch tensors {amount}," in rows.get("where", ""))


def libcuda_mapped() -> bool:
    with open("/proc/self/maps") as maps:
        return any("libcuda" in line for line in maps)


def check_driver_numbering(check, snapshot, card: dict) -> None:
    """(5) The real CUDA driver, asked in a child process as on a box of different GPUs, names
    NVML's GPUs (bus ids, UUIDs and ctypes calls as colab_gpu.cuda_order reads them), numbers
    them as the card does, and asking it loads nothing into this process."""
    import os

    from colab_gpu import cuda_order
    from colab_gpu.runtime import cuda_device_order

    mapped_before = libcuda_mapped()
    started = time.perf_counter()
    devices = cuda_order.ask_driver(os.environ.get("CUDA_VISIBLE_DEVICES"), cuda_device_order(os.environ))
    seconds = time.perf_counter() - started
    index_of = cuda_order.match_devices(devices, snapshot.gpus) if devices is not None else None
    print(f"  the CUDA driver, asked in a child process in {seconds * 1000:.0f} ms, lists {devices}")
    check(bool(devices) and index_of is not None, "the driver's devices are NVML's GPUs, found by UUID or bus id")
    card_numbers = {int(nvml): torch_index for nvml, torch_index in card["torch_index_of"].items()}
    check(index_of == card_numbers, f"the driver numbers them as the card does ({index_of} vs {card_numbers})")
    check(libcuda_mapped() == mapped_before, f"asking loaded nothing into this process (libcuda mapped: {mapped_before})")


def main() -> int:
    started = time.perf_counter()
    from colab_gpu.devices.nvml import NvmlSource
    from colab_gpu.runtime import cpu_only_build

    probe = NvmlSource()
    snapshot = probe.snapshot()
    probe.close()
    if not snapshot.ok or not snapshot.gpus:
        print(f"SKIPPED: no NVIDIA GPU here ({snapshot.problem or 'NVML lists no GPU'}); "
              f"this check needs a machine with a GPU and a CUDA build of torch.")
        return 2

    from IPython.testing.globalipapp import start_ipython

    shell = start_ipython()
    shell.run_line_magic("load_ext", "colab_gpu")
    shell.run_cell("import torch", store_history=False)
    torch = shell.user_ns["torch"]
    if torch.version.cuda is None:
        print("SKIPPED: " + cpu_only_build(f"torch {torch.__version__}", ";", " to run this check."))
        return 2

    failures = []

    def check(ok: bool, finding: str) -> None:
        print(f"  {'ok  ' if ok else 'FAIL'} {finding}")
        if not ok:
            failures.append(finding)

    print(f"torch {torch.__version__} (CUDA {torch.version.cuda}); driver {snapshot.driver_version}; "
          f"{len(snapshot.gpus)} GPU(s) by NVML: {', '.join(gpu.name for gpu in snapshot.gpus)}")
    text, errors = run_magic(shell, "")
    before = status_json(shell)
    print("%gpu_status showed:\n" + "\n".join("    " + line for line in text.splitlines()))
    check(not errors.strip() and "Traceback" not in text, f"%gpu_status ran without errors {errors.strip()!r}")
    check(not torch.cuda.is_initialized(), "CUDA not initialized by %gpu_status (torch.cuda.is_initialized() is False)")
    gpu = gpu_of_cuda0(before)
    check(f"GPU {gpu['index']}  {gpu['name']}  (cuda:0" in text, f"cuda:0 shown as GPU {gpu['index']} {gpu['name']}")
    check_driver_numbering(check, snapshot, before)

    free_torch, total_torch = torch.cuda.mem_get_info(0)  # this creates the CUDA context
    torch_name = torch.cuda.get_device_name(0)
    after = gpu_of_cuda0(status_json(shell))
    context = after["memory_used"] - gpu["memory_used"]
    print(f"  NVML before CUDA: total {gpu['memory_total'] / MiB:.0f} MiB, used {gpu['memory_used'] / MiB:.0f} MiB, "
          f"free {gpu['memory_free'] / MiB:.0f} MiB, reserved by the driver "
          f"{(gpu['memory_reserved'] or 0) / MiB:.0f} MiB")
    print(f"  torch.cuda.mem_get_info() after: free {free_torch / MiB:.0f} MiB of {total_torch / MiB:.0f} MiB; "
          f"the CUDA context took {context / MiB:.0f} MiB (NVML used after - before)")
    check(torch_name == gpu["name"], f"torch names cuda:0 {torch_name!r}, NVML {gpu['name']!r}")
    gap = gpu["memory_free"] - free_torch
    check(-SLACK <= gap <= context + SLACK,
          f"free memory shown ({gpu['memory_free'] / MiB:.0f} MiB) minus torch's free afterwards "
          f"({free_torch / MiB:.0f} MiB) = {gap / MiB:.0f} MiB, within the context's {context / MiB:.0f} MiB "
          f"(+/- {SLACK // MiB} MiB)")
    check(abs(gpu["memory_total"] - (gpu["memory_reserved"] or 0) - total_torch) <= context + SLACK,
          f"total shown minus the driver's reserve ({(gpu['memory_total'] - (gpu['memory_reserved'] or 0)) / MiB:.0f} MiB) "
          f"agrees with torch's total ({total_torch / MiB:.0f} MiB) within the context's size")
    check(0 < context < 4096 * MiB, f"the CUDA context is a plausible size ({context / MiB:.0f} MiB)")

    x = torch.ones(64 * MiB // 4, device="cuda")  # 64 MiB of tensors: the allocator view must show them
    shell.user_ns["x"] = x
    with_torch, _ = run_magic(shell, "")
    print("%gpu_status once CUDA runs:\n" + "\n".join("    " + line for line in with_torch.splitlines()))
    check(shows_torch_memory(with_torch, "64 MiB"),
          "once CUDA runs, %gpu_status adds torch's allocator (allocated 64 MiB) and where memory went "
          "(torch tensors 64 MiB)")
    shell.run_line_magic("unload_ext", "colab_gpu")

    elapsed = time.perf_counter() - started
    print(f"{'PASSED' if not failures else 'FAILED'}: {len(failures)} failure(s) in {elapsed:.1f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
