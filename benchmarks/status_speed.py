"""How cheap colab_gpu is to import and to ask for a status, measured side by side in one run.

    python benchmarks/status_speed.py [--runs N]

(a) ``import IPython; import colab_gpu`` against a bare ``import IPython``, each in fresh
    interpreters, alternating, medians of the import time measured inside each process
    (target: at most 1.2x); also checks that torch, matplotlib and ipywidgets stayed unimported.
(b) one NVML status snapshot against one ``nvidia-smi --query-gpu ... --format=csv``
    subprocess (target: at least 20x faster); only where an NVIDIA driver answers.
(c) the replay path, everywhere: one snapshot of a recorded Tesla T4 XML against one
    subprocess doing the same (``nvidia-smi -q -x`` where it exists, otherwise a
    ``python -c`` that parses the same file, labelled as such).
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
T4 = ROOT / "tests" / "data" / "nvidia-smi-xml" / "tesla-t4.xml"
QUERY = ("index,name,uuid,pci.bus_id,memory.total,memory.used,memory.free,utilization.gpu,"
         "utilization.memory,temperature.gpu,power.draw,enforced.power.limit,clocks.sm,clocks.max.sm,"
         "clocks.mem,clocks.max.mem,clocks_event_reasons.active,pstate,pcie.link.gen.current,"
         "pcie.link.width.current")
HEAVY = ("torch", "matplotlib", "ipywidgets")

IMPORT_PROBE = """
import json, sys, time
start = time.perf_counter()
{imports}
elapsed = time.perf_counter() - start
print(json.dumps({{"seconds": elapsed, "heavy": [m for m in {heavy!r} if m in sys.modules]}}))
"""


def median_seconds(run, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def probe_import(imports: str) -> dict:
    path = [str(ROOT), os.environ.get("PYTHONPATH", "")]  # ours first, the caller's kept
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, path)))
    output = subprocess.run([sys.executable, "-c", IMPORT_PROBE.format(imports=imports, heavy=HEAVY)],
                            env=env, check=True, capture_output=True, text=True).stdout
    return json.loads(output)


def import_cost(runs: int) -> None:
    print("(a) import cost, fresh interpreter each time, alternating, medians of %d runs" % runs)
    bare, with_package, heavy = [], [], set()
    probe_import("import IPython; import colab_gpu")  # warm the file cache for both
    for _ in range(runs):
        bare.append(probe_import("import IPython")["seconds"])
        result = probe_import("import IPython; import colab_gpu")
        with_package.append(result["seconds"])
        heavy.update(result["heavy"])
    base, ours = statistics.median(bare), statistics.median(with_package)
    print(f"    import IPython                   {base * 1000:8.1f} ms")
    print(f"    import IPython; import colab_gpu {ours * 1000:8.1f} ms")
    print(f"    ratio {ours / base:.3f}x (target <= 1.2x): {'PASS' if ours / base <= 1.2 else 'FAIL'}")
    print(f"    heavy modules imported by colab_gpu: {sorted(heavy) or 'none'} "
          f"({'PASS' if not heavy else 'FAIL'}: torch, matplotlib, ipywidgets must stay unimported)")


def nvml_against_nvidia_smi(repeats: int) -> None:
    print("(b) NVML snapshot vs one nvidia-smi --query-gpu subprocess")
    from colab_gpu.devices.nvml import NvmlSource

    smi = shutil.which("nvidia-smi")
    source = NvmlSource()
    first = time.perf_counter()
    snapshot = source.snapshot()
    first = time.perf_counter() - first
    if not snapshot.ok or smi is None:
        why = snapshot.problem or "nvidia-smi is not on PATH"
        print(f"    skipped: no NVIDIA driver ({why})")
        return
    nvml = median_seconds(source.snapshot, repeats)
    command = [smi, f"--query-gpu={QUERY}", "--format=csv"]
    subprocess.run(command, check=True, capture_output=True)
    smi_time = median_seconds(lambda: subprocess.run(command, check=True, capture_output=True), repeats)
    source.close()
    print(f"    {len(snapshot.gpus)} GPU(s): {', '.join(gpu.name for gpu in snapshot.gpus)}")
    print(f"    NVML snapshot (first, with nvmlInit) {first * 1000:8.2f} ms")
    print(f"    NVML snapshot (median of {repeats})      {nvml * 1000:8.2f} ms")
    print(f"    nvidia-smi --query-gpu (median)      {smi_time * 1000:8.2f} ms")
    print(f"    speed-up {smi_time / nvml:.1f}x (target >= 20x): {'PASS' if smi_time / nvml >= 20 else 'FAIL'}")


def replay_against_subprocess(repeats: int) -> None:
    print(f"(c) replay of {T4.name} vs a subprocess doing the same")
    import colab_gpu
    from colab_gpu.devices.replay import ReplaySource

    replay = median_seconds(lambda: ReplaySource(T4).snapshot(), repeats)
    status = median_seconds(lambda: colab_gpu.status(path=str(T4)), repeats)
    smi = shutil.which("nvidia-smi")
    if smi is not None:
        label, command = "nvidia-smi -q -x subprocess (the live tool)", [smi, "-q", "-x"]
    else:
        label = "python -c parsing the same XML (nvidia-smi is absent: a stand-in, not nvidia-smi)"
        command = [sys.executable, "-S", "-c",
                   f"import xml.etree.ElementTree as E; E.parse({str(T4)!r}).getroot().find('gpu')"]
    subprocess.run(command, check=True, capture_output=True)
    other = median_seconds(lambda: subprocess.run(command, check=True, capture_output=True), repeats)
    print(f"    ReplaySource(...).snapshot() (read + parse)  {replay * 1000:8.3f} ms")
    print(f"    colab_gpu.status(path=...) (with advice)     {status * 1000:8.3f} ms")
    print(f"    {label}  {other * 1000:8.3f} ms")
    print(f"    speed-up of the replay snapshot {other / replay:.1f}x, of the whole status {other / status:.1f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=21, help="fresh interpreters per import variant")
    parser.add_argument("--repeats", type=int, default=51, help="repetitions of each in-process timing")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    print(f"python {sys.version.split()[0]} at {sys.executable}")
    import_cost(args.runs)
    nvml_against_nvidia_smi(args.repeats)
    replay_against_subprocess(args.repeats)


if __name__ == "__main__":
    main()
