"""GPU check for %alloc_conf (issue 3): run on a CUDA machine, under a minute.

    python gpu_checks/alloc_conf.py

1. In a fresh process: alloc_conf("expandable_segments=True") before torch starts CUDA, then
   allocate and confirm torch's memory snapshot shows expandable segments (and torch's
   settings getter reports the string where it has one).
2. In another fresh process: start CUDA, then confirm ``backend`` is refused as too late and
   ``max_split_size_mb`` goes through torch's run-time setter and shows in the getter.
Prints what it found; exits 1 if a check fails, 2 when no CUDA GPU is present.
"""
from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

BEFORE_CUDA = r"""
from colab_gpu.allocator import alloc_conf
result = alloc_conf(["expandable_segments=True"])
print("applied via", result.applied_via, "env", result.env_after)
import torch
x = torch.empty(64 * 1024 * 1024, device="cuda")
segments = torch.cuda.memory_snapshot()
expandable = [s.get("is_expandable") for s in segments]
print("snapshot segments", len(segments), "is_expandable", expandable)
getter = getattr(torch._C, "_accelerator_getAllocatorSettings", None)
print("torch reports", getter() if getter else "(no getter in this torch)")
assert segments and all(expandable), "expandable_segments not in effect"
print("CHECK 1 OK")
"""

AFTER_CUDA = r"""
import torch
from colab_gpu.allocator import AllocConfError, alloc_conf
torch.empty(1, device="cuda")
assert torch.cuda.is_initialized()
try:
    alloc_conf(["backend=cudaMallocAsync"])
    raise SystemExit("backend change was not refused")
except AllocConfError as error:
    print("backend refused:", error)
result = alloc_conf(["max_split_size_mb=128"])
print("applied via", result.applied_via, "in effect", result.in_effect, "deferred", result.deferred)
assert len(result.applied_via) == 2, "the run-time setter was not called"
if result.in_effect is not None:
    assert "max_split_size_mb:128" in result.in_effect
print("CHECK 2 OK")
"""


def run(code: str) -> bool:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTORCH_")}
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    try:  # two of these within run_all.sh's 90 s for the whole script
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                              timeout=40)
    except subprocess.TimeoutExpired as error:
        said = [text.decode(errors="replace") if isinstance(text, bytes) else text
                for text in (error.stdout, error.stderr) if text]  # bytes here, whatever text= says
        print("".join(said) + "timed out after 40 s")
        return False
    print(done.stdout + done.stderr)
    return done.returncode == 0


def main() -> int:
    try:
        import pynvml

        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
    except Exception as error:  # no driver, no library: nothing to check here
        print(f"no CUDA GPU here ({error}); this check needs one")
        return 2
    if count == 0:
        print("no CUDA GPU here; this check needs one")
        return 2
    ok = run(BEFORE_CUDA) & run(AFTER_CUDA)
    print("ALL CHECKS OK" if ok else "A CHECK FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
