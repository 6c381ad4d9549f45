"""GPU check for the out-of-memory card: the first four causes, each caused for real.

Run on a machine with an NVIDIA GPU and a CUDA build of torch (under 5 minutes; a helper
process at most 60 s):

    python gpu_checks/oom_doctor.py

In a real IPython shell with the extension loaded, each cell below fails with a real CUDA
out-of-memory error, and the card made under it (the OomReport the hook keeps) must name the
cause, with numbers that agree with torch.cuda.memory_stats() and NVML (read here through
pynvml directly):

1. another process holds the GPU: a helper process takes all but 1 GiB of it, a 2 GiB tensor
   fails; the card names the helper's pid and NVML's bytes for it (in a container, where NVML's
   pids are the host's, it names the memory outside torch instead);
2. the last error's traceback keeps a failed function's 1 GiB: the card says so, and after
   %clear_cache a weakref to that tensor is dead;
3. `total = total + loss` keeps every step's graph until a step fails: the card names `total`
   and the bytes its graph alone keeps, which is what `%clear_cache total` then frees;
4. fragmentation: torch's cache cut into holes of 20 MiB, none of which fits a 100 MiB tensor:
   the card gives the unallocated bytes of memory_stats() and the %alloc_conf fix.

Causes 2-4 run under torch.cuda.set_per_process_memory_fraction (4 GiB). Also: a card after a
CPU MemoryError leaves CUDA uninitialized. Exit status: 0 all checks passed, 1 a check failed,
2 no CUDA GPU here (nothing checked).
"""
from __future__ import annotations

import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # this checkout's colab_gpu

GiB, MiB = 1024 ** 3, 1024 ** 2
LIMIT = 4 * GiB  # torch's cap for causes 2-4
failures = []


def check(ok: bool, what: str) -> None:
    print(("PASS " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


def near(a, b, tolerance: int) -> bool:
    return a is not None and b is not None and abs(a - b) <= tolerance


class Shell:
    """A real IPython shell with the extension loaded, and the card of its last cell."""

    def __init__(self):
        from IPython.testing.globalipapp import start_ipython

        from colab_gpu.magics.doctor import doctor_of

        self.shell = start_ipython()
        self.shell.run_line_magic("load_ext", "colab_gpu")
        self.doctor = doctor_of(self.shell)

    def fail(self, code: str, what: str):
        """Run a cell that must fail with a CUDA out-of-memory error; its report."""
        self.doctor.last = None
        result = self.shell.run_cell(code, store_history=True)
        error = result.error_in_exec
        ok = error is not None and "out of memory" in str(error)
        first = str(error).splitlines()[0][:110] if error else None
        check(ok, f"{what}: the cell failed with {type(error).__name__}: {first}")
        del result, error
        report = self.doctor.last
        check(report is not None, f"{what}: the card was made (in {report.seconds if report else 0:.2f} s)")
        return report

    def run(self, code: str):
        result = self.shell.run_cell(code, store_history=True)
        if result.error_in_exec is not None:
            check(False, f"{code.splitlines()[0]!r} ran: {result.error_in_exec!r}")

    def __getitem__(self, name):
        return self.shell.user_ns[name]


def cause(report, kind: str):
    return next((found for found in (report.causes if report else ()) if found.kind == kind), None)


def nvml_memory():
    """(free bytes, {pid: used bytes}) of GPU 0, read through pynvml itself."""
    import pynvml

    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    processes = {p.pid: p.usedGpuMemory or 0 for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)}
    return pynvml.nvmlDeviceGetMemoryInfo(handle).free, processes


def agrees_with_torch(report, what: str) -> None:
    import torch

    stats = torch.cuda.memory_stats(0)
    check(report.allocated_bytes == stats["allocated_bytes.all.current"]
          and report.reserved_bytes == stats["reserved_bytes.all.current"],
          f"{what}: allocated {report.allocated_bytes} and reserved {report.reserved_bytes} are memory_stats()'s "
          f"({stats['allocated_bytes.all.current']}, {stats['reserved_bytes.all.current']})")
    free, _ = nvml_memory()
    check(near(report.free_bytes, free, 64 * MiB), f"{what}: free {report.free_bytes} is NVML's ({free})")
    total = torch.cuda.get_device_properties(0).total_memory
    check(near(report.capacity_bytes, total, 10 * MiB),
          f"{what}: capacity {report.capacity_bytes} is torch's ({total})")


HELPER = """
import sys, time, torch
free, _ = torch.cuda.mem_get_info(0)
hold = torch.empty(max(0, free - int(sys.argv[1])), dtype=torch.uint8, device="cuda")
print("ready", flush=True)
time.sleep(60)
"""


def another_process(shell: Shell) -> None:
    """Cause 1, with the whole GPU: a helper takes all but 1 GiB."""
    import torch

    torch.cuda.set_per_process_memory_fraction(1.0, 0)
    shell.run("warm = torch.zeros(1, device='cuda')")  # this process's context, before the helper fills the GPU
    helper = subprocess.Popen([sys.executable, "-c", HELPER, str(GiB)], stdout=subprocess.PIPE, text=True)
    try:
        ready = helper.stdout.readline().strip() == "ready"
        check(ready, f"a helper process {helper.pid} holds all but 1 GiB of the GPU")
        report = shell.fail("big = torch.empty(2 * 2 ** 30, dtype=torch.uint8, device='cuda')", "another process")
        _, processes = nvml_memory()
        if report is None:
            return
        print(str(report))
        found = cause(report, "other_process")
        if os.getpid() in processes:  # NVML's pids are this machine's
            check(found is not None and str(helper.pid) in found.finding,
                  f"the card names the helper: {found.finding if found else report.causes}")
            others = sum(used for pid, used in processes.items() if pid != os.getpid())
            check(report.other_processes_bytes == others, f"its bytes are NVML's: {report.other_processes_bytes}")
        else:  # a container: the memory outside torch, with no pid to name
            check(cause(report, "outside_torch") is not None,
                  f"in a container the card names the memory outside torch: {[c.kind for c in report.causes]}")
        agrees_with_torch(report, "another process")
    finally:
        helper.kill()
        helper.wait()
    time.sleep(1)  # the driver takes the helper's memory back


def kept_by_the_traceback(shell: Shell) -> None:
    report = shell.fail("""
def train_step():
    activations = torch.empty(2 ** 30, dtype=torch.uint8, device='cuda')
    global ref
    ref = weakref.ref(activations)
    return torch.empty(8 * 2 ** 30, dtype=torch.uint8, device='cuda')
train_step()
""", "the last error")
    if report is None:
        return
    print(str(report))
    found = cause(report, "kept_by_ipython")
    check(found is not None and found.frees == GiB, f"the card says the traceback keeps 1 GiB: {found}")
    check(report.requested_bytes == 8 * GiB, f"the request is the message's: {report.requested_bytes}")
    agrees_with_torch(report, "the last error")
    shell.run("%clear_cache --quiet")
    check(shell["ref"]() is None, "after %clear_cache the failed function's tensor is dead: the card kept nothing")


def graph_kept_by_total(shell: Shell) -> None:
    import torch

    shell.run("model = torch.nn.Linear(4096, 4096).cuda()")
    report = shell.fail("""
total = 0
for step in range(1000):
    x = torch.randn(8192, 4096, device='cuda')  # 128 MiB, and 128 MiB of relu output kept per step
    loss = model(x).relu().mean()
    total = total + loss
""", "a total of losses")
    if report is None:
        return
    print(str(report))
    found = cause(report, "autograd_graph")
    check(found is not None and "`total`" in found.finding, f"the card names total: {found}")
    before = torch.cuda.memory_allocated(0)
    shell.run("%clear_cache total --quiet")
    freed = before - torch.cuda.memory_allocated(0)
    check(found is not None and near(found.frees, freed, 8 * MiB),
          f"the bytes it gives for total's graph ({found.frees if found else None}) are what deleting it "
          f"freed ({freed})")
    shell.run("del model, x, loss")
    shell.run("%clear_cache --quiet")


def fragmentation(shell: Shell) -> None:
    import torch

    shell.run("""
torch.cuda.empty_cache()
room = torch.cuda.get_per_process_memory_fraction(0) * torch.cuda.get_device_properties(0).total_memory \\
    if hasattr(torch.cuda, "get_per_process_memory_fraction") else 4 * 2 ** 30
count = int(room - torch.cuda.memory_reserved(0) - 64 * 2 ** 20) // (20 * 2 ** 20)
whole = torch.empty(count * 20 * 2 ** 20, dtype=torch.uint8, device='cuda')  # one segment, all but 64 MiB
del whole  # its segment stays in torch's cache, and the blocks below are cut out of it, filling it
blocks = [torch.empty(20 * 2 ** 20, dtype=torch.uint8, device='cuda') for _ in range(count)]
del blocks[::2]  # holes of 20 MiB in a segment still in use: the cache cannot give them back
""")
    report = shell.fail("wide = torch.empty(100 * 2 ** 20, dtype=torch.uint8, device='cuda')", "fragmentation")
    if report is None:
        return
    print(str(report))
    found = cause(report, "fragmentation")
    stats = torch.cuda.memory_stats(0)
    unallocated = stats["reserved_bytes.all.current"] - stats["allocated_bytes.all.current"]
    check(found is not None and found.frees == unallocated and unallocated >= 100 * MiB,
          f"the card gives memory_stats()'s unallocated bytes ({unallocated}): {found}")
    check(found is not None and "expandable_segments=True --save" in found.fix,
          f"and the fix: {found.fix if found else None}")
    agrees_with_torch(report, "fragmentation")
    shell.run("del blocks")
    shell.run("%clear_cache --quiet")


NO_CUDA = """
from IPython.testing.globalipapp import start_ipython
shell = start_ipython()
shell.run_line_magic("load_ext", "colab_gpu")
shell.run_cell("import torch\\nraise MemoryError()")
import torch
from colab_gpu.magics.doctor import doctor_of
assert doctor_of(shell).last is not None, "no card"
assert not torch.cuda.is_initialized(), "the card initialized CUDA"
print("a card after a CPU MemoryError, CUDA not initialized")
"""


def main() -> int:
    for name in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):  # torch's default: no expandable segments
        os.environ.pop(name, None)
    import torch

    if not torch.cuda.is_available():
        print("gpu_checks/oom_doctor.py: no CUDA GPU here (torch.cuda.is_available() is False, "
              f"torch {torch.__version__}, CUDA build {torch.version.cuda}); nothing was checked.")
        return 2
    began = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", NO_CUDA], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")})
    check(done.returncode == 0, (done.stdout.strip() or done.stderr.strip()[-500:]))
    import pynvml

    pynvml.nvmlInit()
    total = torch.cuda.get_device_properties(0).total_memory
    print(f"{torch.cuda.get_device_name(0)}: {total / GiB:.1f} GiB, torch {torch.__version__}; "
          f"{torch.cuda.device_count()} CUDA device(s), GPU 0 checked")
    shell = Shell()
    shell.run("import torch, weakref")
    another_process(shell)
    torch.cuda.set_per_process_memory_fraction(LIMIT / total, 0)
    print(f"torch limited to {LIMIT / GiB:.0f} GiB with set_per_process_memory_fraction")
    for step in (kept_by_the_traceback, graph_kept_by_total, fragmentation):
        step(shell)
    print(f"{len(failures)} failed, in {time.perf_counter() - began:.1f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
