"""What the live monitor's light read saves against a full snapshot, per sample, through NVML's code.

NvmlSource runs over the pynvml stand-in of the tests (tests/nvml_recording.py), fed by real
recordings: Kaggle's two T4s (tesla-t4.xml twice, with its processes) and the A100 in MIG mode
(a100-sxm4-v12.xml, four instances). Both reads are timed interleaved (full, light, full, ...)
in one run and compared by their medians, with the NVML calls each makes.

The stand-in answers each call in Python (a few microseconds, more where it raises NVML's
NotSupported); a real driver's calls cost what the driver spends, which differs per call, and
the process listing grows with the processes (one name lookup each). So the call counts carry
over to a real GPU; the times measure this Python side only.

    python benchmarks/light_read.py [--reads 2000] [--repeats 7]
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]

from colab_gpu.devices.nvml import NvmlSource  # noqa: E402
from colab_gpu.devices.replay import ReplaySource  # noqa: E402
from nvml_recording import RecordedNvml  # noqa: E402

DATA = os.path.join(ROOT, "tests", "data", "nvidia-smi-xml")


def two_t4s():
    snapshot = ReplaySource(os.path.join(DATA, "tesla-t4.xml")).snapshot()
    (gpu,) = snapshot.gpus
    second = dataclasses.replace(gpu, index=1, uuid="GPU-00000000-0000-0000-0000-000000000001")
    return dataclasses.replace(snapshot, gpus=(gpu, second))


def a100_mig():
    return ReplaySource(os.path.join(DATA, "a100-sxm4-v12.xml")).snapshot()


def per_read(read, reads: int) -> float:
    started = time.perf_counter()
    for _ in range(reads):
        read()
    return (time.perf_counter() - started) / reads


def calls_per_read(nvml, read) -> int:
    nvml.calls.clear()
    read()
    return len(nvml.calls)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reads", type=int, default=2000, help="reads per timing")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    print(f"light read vs full snapshot, NvmlSource over the NVML stand-in; {args.repeats} interleaved "
          f"repeats of {args.reads} reads each, medians")
    for name, recording in (("two T4s (tesla-t4.xml)", two_t4s()), ("A100, MIG (a100-sxm4-v12.xml)", a100_mig())):
        nvml = RecordedNvml(recording)
        source = NvmlSource(nvml=nvml)
        source.snapshot()  # the fixed fields, read once, as the sampler's first read does
        reads = {"full": source.snapshot, "light": source.light_snapshot}
        times = {kind: [] for kind in reads}
        for _ in range(args.repeats):
            for kind, read in reads.items():
                times[kind].append(per_read(read, args.reads))
        calls = {kind: calls_per_read(nvml, read) for kind, read in reads.items()}
        full, light = (statistics.median(times[kind]) for kind in ("full", "light"))
        paired = statistics.median(lt / ft for lt, ft in zip(times["light"], times["full"]))
        print(f"  {name}: full {1e6 * full:.1f} us ({calls['full']} NVML calls), light {1e6 * light:.1f} us "
              f"({calls['light']} calls); light / full: {light / full:.3f} (paired median {paired:.3f}), "
              f"calls {calls['light'] / calls['full']:.3f}")


if __name__ == "__main__":
    main()
