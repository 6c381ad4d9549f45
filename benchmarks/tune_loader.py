"""tune_loader's answer against num_workers=0 and num_workers=os.cpu_count(), side by side on
the same data, in one run.

    python benchmarks/tune_loader.py [--images N] [--rounds R] [--seconds S]

The data: N JPEG images (tests/image_data.py), decoded, rotated and blurred by Pillow on every
access, batches of 16. First tune_loader runs on a num_workers=0 loader (its own time is
reported: what asking costs). Then three loaders over the same dataset and sampler, the
answer, num_workers=0 and num_workers=os.cpu_count(), each run for whole epochs, start-up
included, as training sees them, in R interleaved rounds (so that a machine's changing load
weighs on all three alike): medians of epoch seconds and batches/s, and each one's ratio to
num_workers=0. Prints a table and one JSON line.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import sys
import time
import warnings

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]


def epoch_seconds(loader, epochs: int = 2) -> float:
    """Seconds for ``epochs`` whole epochs, each iterator's start-up included, divided by epochs."""
    began = time.perf_counter()
    for _ in range(epochs):
        for _batch in loader:
            pass
    return (time.perf_counter() - began) / epochs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=0.5, help="tune_loader's timing window")
    options = parser.parse_args()

    import torch
    from torch.utils.data import DataLoader

    import colab_gpu
    from colab_gpu.loader.settings import Setting, rebuilt
    from image_data import GeneratedImages, child_pids

    load = os.getloadavg()[0]
    data = GeneratedImages(count=options.images, side=128)
    torch.manual_seed(0)
    loader = DataLoader(data, batch_size=16, shuffle=True)
    before = child_pids()
    began = time.perf_counter()
    result = colab_gpu.tune_loader(loader, seconds=options.seconds, progress=False)
    asked = time.perf_counter() - began
    print(result)
    print(f"\ntune_loader took {asked:.1f} s\n")

    contenders = {"tune_loader's answer": result.answer, "num_workers=0": Setting(0),
                  f"num_workers=os.cpu_count()={os.cpu_count()}": Setting(0).with_(num_workers=os.cpu_count())}
    times = {name: [] for name in contenders}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"This DataLoader will create")  # more workers than cores
        for _ in range(options.rounds):
            for name, setting in contenders.items():
                times[name].append(epoch_seconds(rebuilt(loader, setting)))
    zero = statistics.median(times["num_workers=0"])
    batches = len(loader)
    rows = []
    print(f"{'loader':<34} {'setting':<44} {'epoch s':>8} {'batches/s':>10} {'vs 0':>6}")
    for name, setting in contenders.items():
        seconds = statistics.median(times[name])
        rows.append({"loader": name, "setting": setting.label(), "epoch_seconds": round(seconds, 3),
                     "epoch_seconds_rounds": [round(each, 3) for each in times[name]],
                     "batches_per_second": round(batches / seconds, 2), "vs_zero": round(zero / seconds, 2)})
        print(f"{name:<34} {setting.label():<44} {seconds:>8.2f} {batches / seconds:>10.1f} "
              f"{zero / seconds:>5.2f}x")
    left = sorted(child_pids() - before)
    print(f"\nload average before: {load:.1f} on {os.cpu_count()} cores ({result.cores} usable); "
          f"worker processes left behind: {left or 'none'}")
    print(json.dumps({"images": options.images, "batch_size": 16, "load_before": load, "cpu_count": os.cpu_count(),
                      "usable": result.cores, "tune_seconds": round(asked, 1), "factor_reported": result.factor,
                      "rows": rows, "left_behind": left}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
