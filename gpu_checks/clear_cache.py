"""GPU check for %clear_cache: a real CUDA OOM in a real IPython shell, then the memory back.

Run on a machine with an NVIDIA GPU and a CUDA build of torch (a few minutes at most: the
sizes are bounded, each fresh process at 45 s):

    python gpu_checks/clear_cache.py

It allocates a tensor inside a function, fails that cell with a real CUDA out-of-memory error
(so the traceback keeps the tensor alive), runs %clear_cache and checks that
torch.cuda.memory_allocated() is back at its baseline, that NVML's used memory dropped by
about the tensor's size, and that the ranking names a variable that holds GPU memory.
Then, each in a fresh process: CUDA initialized by a query alone is left without a context,
and after a real device-side assert %clear_cache reports the failed step without a traceback.
Exit status: 0 all checks passed, 1 a check failed, 2 no CUDA GPU here (nothing checked).
"""
from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this checkout's colab_gpu

GiB = 1024 ** 3


def main() -> int:
    import torch

    if not torch.cuda.is_available():
        print("gpu_checks/clear_cache.py: no CUDA GPU here (torch.cuda.is_available() is False, "
              f"torch {torch.__version__}, CUDA build {torch.version.cuda}); nothing was checked.")
        return 2
    from IPython.lib.pretty import pretty
    from IPython.testing.globalipapp import start_ipython

    import colab_gpu

    started = time.perf_counter()
    shell = start_ipython()
    shell.run_line_magic("load_ext", "colab_gpu")
    failures = []

    def check(ok: bool, what: str) -> None:
        print(("PASS " if ok else "FAIL ") + what)
        if not ok:
            failures.append(what)

    def cell(code: str):
        return shell.run_cell(code, store_history=True)

    cell("import torch, weakref\nwarm = torch.zeros(1, device='cuda')\ntorch.cuda.synchronize()")
    baseline = torch.cuda.memory_allocated()
    free, total = torch.cuda.mem_get_info()
    big = min(free // 4, 8 * GiB)
    print(f"GPU {torch.cuda.get_device_name(0)}: {total / GiB:.1f} GiB total, {free / GiB:.1f} GiB free; "
          f"baseline allocated {baseline} bytes; the failing cell holds {big / GiB:.2f} GiB")

    result = cell(f"""
def train_step():
    activations = torch.empty({big}, dtype=torch.uint8, device='cuda')
    global ref
    ref = weakref.ref(activations)
    too_much = torch.empty({2 * total}, dtype=torch.uint8, device='cuda')  # a real CUDA OOM
train_step()
""")
    error = result.error_in_exec
    oom = getattr(torch, "OutOfMemoryError", getattr(torch.cuda, "OutOfMemoryError", RuntimeError))
    check(isinstance(error, oom), f"the cell failed with a real CUDA OOM: {type(error).__name__}: "
                                  f"{str(error).splitlines()[0][:120] if error else None}")
    del error, result
    held = torch.cuda.memory_allocated()
    check(shell.user_ns["ref"]() is not None and held >= baseline + big,
          f"after the failed cell the traceback keeps the tensor: allocated {held} bytes")

    report = colab_gpu.clear_cache(shell=shell)
    print(pretty(report))
    after = torch.cuda.memory_allocated()
    check(shell.user_ns["ref"]() is None, "the tensor is dead after clear_cache")
    check(after == baseline, f"memory_allocated() back to its baseline: {after} == {baseline}")
    check(torch.cuda.memory_reserved() < big, f"the cache was emptied: reserved {torch.cuda.memory_reserved()} bytes")
    device = [(b, a) for b, a in zip(report.before, report.after) if b.device == "cuda:0"]
    if device and device[0][0].nvml_used is not None:
        before_used, after_used = device[0][0].nvml_used, device[0][1].nvml_used
        check(before_used - after_used >= 0.9 * big,
              f"NVML used dropped by {(before_used - after_used) / GiB:.2f} GiB "
              f"({before_used / GiB:.2f} -> {after_used / GiB:.2f} GiB)")
    else:
        check(False, f"NVML read the GPU: {report.holders.problem}")
    check(report.cuda_initialized and report.steps[-1].name == "CUDA cache",
          f"the CUDA step ran: {report.steps[-1].done}")

    cell(f"kept = [torch.ones({big // 4}, dtype=torch.uint8, device='cuda')]")
    holders = colab_gpu.memory_holders(shell=shell)
    top = holders.holders[0] if holders.holders else None
    check(top is not None and top.name == "kept" and dict(top.by_device).get("cuda:0") == big // 4,
          f"the ranking names the GPU holder and its size: {top}")
    shell.run_line_magic("clear_cache", "kept --quiet")
    check(torch.cuda.memory_allocated() == baseline, "%clear_cache kept: allocated back to baseline")
    for code, what in ((QUERY_ONLY, "CUDA started by a query alone: no context created, the step says so"),
                       (DEVICE_SIDE_ASSERT, "after a real device-side assert: a report, no traceback")):
        check(_in_a_fresh_process(code), what)
    print(f"{len(failures)} failed, in {time.perf_counter() - started:.1f} s")
    return 1 if failures else 0


# Each in a process of its own: one leaves CUDA without a context, the other breaks it for good.
QUERY_ONLY = """
import torch, colab_gpu
torch.cuda.current_device()  # initializes CUDA, creates no context (lazy loading)
assert torch.cuda.is_initialized()
if torch._C._cuda_hasPrimaryContext(0):
    print("this torch made a context when CUDA started: nothing to check")
    raise SystemExit(0)
report = colab_gpu.clear_cache()
step = report.steps[-1]
print(step.name, "step:", step.done)
assert step.name == "CUDA cache" and step.error is None, (step.name, step.error)
assert not torch._C._cuda_hasPrimaryContext(0), "clear_cache created a context"
"""
DEVICE_SIDE_ASSERT = """
from IPython.testing.globalipapp import start_ipython
shell = start_ipython()
shell.run_line_magic("load_ext", "colab_gpu")
failed = shell.run_cell("import torch\\nx = torch.zeros(4, device='cuda')\\n"
                        "y = x[torch.tensor([40], device='cuda')]\\ntorch.cuda.synchronize()")
print("the cell failed with:", repr(failed.error_in_exec)[:200])
print("=== %clear_cache --quiet:")  # IPython printed the failed cell's traceback above
result = shell.run_cell("%clear_cache --quiet")
print("=== end")
assert result.error_in_exec is None, repr(result.error_in_exec)
import colab_gpu
step = colab_gpu.clear_cache(shell=shell).steps[-1]  # what the line said, as data
print("the", step.name, "step failed:", step.error)
assert step.name == "CUDA cache" and step.error, (step.name, step.error)
"""


def _in_a_fresh_process(code: str) -> bool:
    import subprocess

    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
           + os.pathsep + os.environ.get("PYTHONPATH", "")}
    try:
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                              timeout=45)
    except subprocess.TimeoutExpired:
        print("  (timed out after 45 s)")
        return False
    print(done.stdout + done.stderr[-2000:])
    ok = done.returncode == 0
    if code is DEVICE_SIDE_ASSERT:
        line = done.stdout.partition("=== %clear_cache --quiet:")[2].partition("=== end")[0]
        ok = ok and bool(line.strip()) and "Traceback" not in line
    return ok


if __name__ == "__main__":
    sys.exit(main())
