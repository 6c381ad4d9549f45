"""What `%gpu_status --from` and `--live --from` cost on a --query-gpu log of days, against
reading the whole log.

Logs of 20 MB and 200 MB are grown from a real recording (tests/data/nvidia-smi-csv/, the
8-GPU nanoGPT run unless --recording names another): its rows again and again, each copy's
timestamps moved on by the log's span (tests/replay_logs.py). Each read runs twice, each time in
a child process of its own: once for its wall time and the child's peak resident memory
(ru_maxrss, imports included), once under tracemalloc for the peak of what Python allocated
during the read (pandas' C buffers are not counted: its RSS is the figure to compare):

* last state: ``ReplaySource(path).snapshot()``, what ``%gpu_status --from`` shows;
* live start: the first snapshot of ``ReplaySource(path, follow=True)``, the first sample of
  ``%gpu_status --live --from``;
* csv, all rows: ``csv.reader`` over every row, keeping none: the least a whole read costs;
* pandas: ``pandas.read_csv`` of the whole log, where pandas is installed;
* whole parse (with --whole-parse, minutes at 200 MB): colab_gpu's reading of every row, as
  ``--from`` did before (20 MB: 17 s and 474 MiB; 200 MB: 139 s and 4.4 GiB).

The target: the last state and the live start under 1 s and 100 MiB at both sizes.

    python benchmarks/replay_large.py [--sizes 20,200] [--recording NAME] [--whole-parse]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]

from replay_logs import grow_log  # noqa: E402

CSV = Path(ROOT, "tests", "data", "nvidia-smi-csv")
MIB = 1024 ** 2

CHILD = """
import json, resource, sys, time, tracemalloc
kind, path, traced = sys.argv[1], sys.argv[2], sys.argv[3] == "traced"
if kind == "pandas":
    import pandas
else:
    import csv
    from colab_gpu.devices.replay import ReplaySource, csv_log, latest
if traced:
    tracemalloc.start()
started = time.perf_counter()
if kind == "last":
    shown = ReplaySource(path).snapshot()
    assert shown.problem is None and shown.gpus, shown.problem
elif kind == "live":
    shown = ReplaySource(path, follow=True).snapshot()
    assert shown.problem is None and shown.gpus, shown.problem
elif kind == "csv":
    with open(path, newline="") as file:
        for row in csv.reader(file):
            pass
elif kind == "pandas":
    pandas.read_csv(path)
else:
    with open(path) as file:
        latest(csv_log.read(file.read(), "whole", 0.0))
took = time.perf_counter() - started
heap = tracemalloc.get_traced_memory()[1] if traced else 0
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
print(json.dumps({"seconds": took, "heap": heap, "rss": rss}))
"""

KINDS = {"last": "last state", "live": "live start", "csv": "csv, all rows", "pandas": "pandas.read_csv",
         "whole": "whole parse"}


def child(kind: str, path: Path, traced: bool) -> dict:
    done = subprocess.run([sys.executable, "-c", CHILD, kind, str(path), "traced" if traced else "timed"],
                          capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")))
    if done.returncode:
        raise SystemExit(f"{kind} of {path.name} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout)


def measure(kind: str, path: Path) -> dict:
    """Seconds and peak RSS of a plain run, the heap peak of a traced one."""
    timed = child(kind, path, traced=False)
    return dict(timed, heap=child(kind, path, traced=True)["heap"])


def has_pandas() -> bool:
    return subprocess.run([sys.executable, "-c", "import pandas"], capture_output=True).returncode == 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="20,200", help="log sizes in MB (10**6 bytes), comma-separated")
    parser.add_argument("--recording", default="8gpu-training_nanogpt-pr643.csv",
                        help="the log in tests/data/nvidia-smi-csv/ to grow (with a header and timestamps)")
    parser.add_argument("--whole-parse", action="store_true", help="also time colab_gpu's parse of every row")
    args = parser.parse_args()
    kinds = ["last", "live", "csv"] + (["pandas"] if has_pandas() else []) + (["whole"] if args.whole_parse else [])
    print(f"logs grown from {args.recording}; Python {sys.version.split()[0]}, {os.cpu_count()} CPUs")
    with tempfile.TemporaryDirectory() as folder:
        for megabytes in (int(size) for size in args.sizes.split(",")):
            path = Path(folder, f"{megabytes}mb.csv")
            rows = grow_log(CSV / args.recording, path, megabytes * 10 ** 6)
            print(f"\n{megabytes} MB log, {rows:,} rows ({path.stat().st_size / MIB:.1f} MiB)")
            results = {}
            for kind in kinds:
                results[kind] = measure(kind, path)
                print(f"  {KINDS[kind]:<16} {results[kind]['seconds']:>7.2f} s   heap peak "
                      f"{results[kind]['heap'] / MIB:>7.1f} MiB   RSS peak {results[kind]['rss'] / MIB:>7.1f} MiB",
                      flush=True)
            last = results["last"]
            for kind in kinds[2:]:
                heap = results[kind]["heap"] / last["heap"]
                print(f"  {KINDS[kind]} / last state: {results[kind]['seconds'] / last['seconds']:.0f}x the time"
                      + (f", {heap:.0f}x the heap" if heap >= 1 else ", keeping no row"))
            path.unlink()


if __name__ == "__main__":
    main()
