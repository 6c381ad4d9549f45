"""What asking the CUDA driver how it numbers a box of different GPUs costs, side by side in one run.

    python benchmarks/cuda_order_cost.py [--repeats N]

On a box of different GPUs numbered fastest first, the first card (or live monitor, or
%clear_cache) of a process spawns one child process that asks the CUDA driver; later ones
reuse its answer. Medians of:
(a) one resolution (one child): with the stand-in driver library the tests use
    (tests/fake_libcuda.c, built here with gcc), and with this machine's own library path
    (the real libcuda.so.1 where one loads, else the failure path every mixed box without a
    driver library pays once);
(b) status() of the tests' two-GPU mixed box (NVML stand-in) that must ask the driver again,
    against status() with the answer remembered: what the first card costs over later ones.
"""
from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent


def median_ms(run, repeats: int, before=lambda: None) -> float:
    times = []
    for _ in range(repeats):
        before()
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=21, help="repetitions of each timing")
    args = parser.parse_args()
    sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
    from colab_gpu import cuda_order
    from colab_gpu.gpu_status import status
    from colab_gpu.state import session
    from test_cuda_order import GTX_1660_TI, RTX_3090, driver_devices, mixed_box_source

    print(f"python {sys.version.split()[0]} at {sys.executable}, {os.cpu_count()} CPUs")
    own_path = os.environ.get("LD_LIBRARY_PATH")
    answer = cuda_order.ask_driver(None, "FASTEST_FIRST")
    own = f"this machine's driver answered {answer}" if answer is not None else "no driver library answered"
    own_ms = median_ms(lambda: cuda_order.ask_driver(None, "FASTEST_FIRST"), args.repeats)

    folder = tempfile.mkdtemp(prefix="fake_libcuda")
    try:
        gcc = shutil.which("gcc")
        if gcc is None:
            sys.exit("gcc is needed to build the stand-in driver library (tests/fake_libcuda.c)")
        subprocess.run([gcc, "-shared", "-fPIC", "-O1", "-o", os.path.join(folder, "libcuda.so.1"),
                        str(ROOT / "tests" / "fake_libcuda.c")], check=True)
        os.environ["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [folder, own_path]))
        os.environ["FAKE_CUDA_DEVICES"] = driver_devices(RTX_3090, GTX_1660_TI)
        assert cuda_order.ask_driver(None, "FASTEST_FIRST") is not None, "the stand-in did not answer"
        fake_ms = median_ms(lambda: cuda_order.ask_driver(None, "FASTEST_FIRST"), args.repeats)

        source = mixed_box_source()
        os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        os.environ.pop("CUDA_DEVICE_ORDER", None)
        assert status(source).cuda_numbering_asked, "the mixed box was not numbered by the driver"
        asking_ms = median_ms(lambda: status(source), args.repeats, before=session.driver_answers.clear)
        status(source)
        cached_ms = median_ms(lambda: status(source), args.repeats)
        source.close()
    finally:
        shutil.rmtree(folder, ignore_errors=True)

    print(f"(a) one resolution (a child process), medians of {args.repeats}")
    print(f"    stand-in libcuda.so.1 (2 GPUs)         {fake_ms:8.1f} ms")
    print(f"    this machine's library path            {own_ms:8.1f} ms  ({own})")
    print(f"(b) status() of the mixed box, medians of {args.repeats}")
    print(f"    asking the driver (first card)         {asking_ms:8.1f} ms")
    print(f"    answer remembered (every later one)    {cached_ms:8.1f} ms")
    print(f"    ratio first / later                    {asking_ms / cached_ms:8.1f}x")


if __name__ == "__main__":
    main()
