"""How close colab_gpu.plan_batch comes to what really fitted, on recordings of real GPUs.

1. timm (shared/data/batch-size/timm/benchmark-train-amp-nchw-pt112-cu113-rtx3090.csv): the
   largest training batch that fitted on an RTX 3090 (24 GiB) with AMP, per model, found by
   timm's benchmark.py stepping down its ladder 512, 384, 256, 192, 128, ... after each
   out-of-memory error (512 is where it started: a cap, not a limit). A random sample (fixed
   seed) of the models is built by timm without weights and planned with timm's step (SGD with
   Nesterov momentum, float16 autocast, cross-entropy, gradients zeroed, not freed, as torch
   1.12 did); the plan's answer is put on the ladder. Reported: the share planned exactly,
   within one ladder step, and too high (the plan would run out of memory).
2. milabench (shared/data/batch-size/milabench/H100.yaml): recorded memory against batch size
   of resnet50 and convnext_large (built by timm: the same architectures as torchvision's);
   planned peak against recorded memory at each recorded size: median and worst error.

Measured (torch 2.13 CPU, timm 1.0.29, a shared 2-core machine), with cuDNN's NCHW-to-NHWC
workspaces counted and 3 % of the usable memory kept spare for the plan's own error (its worst
shortfall on milabench's H100 curves, below): timm, 64 models (the default), seed 0: exact 98 %,
within one step 100 %, too high 0 %; seed 1: exact 95 %, within one step 100 %, too high 2 %
(resnetrs200, one step); median 13.3 and 13.7 s a plan. Before the spare: seed 0 exact 95 %, too
high 5 % (resnest50d_1s4x24d, crossvit_base_240, fbnetv3_g), seed 1 exact 92 %, too high 6 %
(resnetrs200, resnest50d_1s4x24d, cs3se_edgenet_x, coat_tiny), each 0 to 586 MiB short of
running out at the size above (``--margins``). milabench H100, 28 points (the spare changes no
peak): median error 1 %, worst 25 % (batch 1: the context estimate), resnet50 -1 to -3 %,
convnext_large within 6 % from batch 64 up.

Needs timm (``pip install timm``; it imports torchvision). Where torchvision's compiled ops
cannot load (a CUDA torchvision beside a CPU torch), the two op schemas its Python code
registers fakes for are declared first, so that its pure-Python models import.

    python benchmarks/plan_vs_measured.py [--models 64] [--seed 0] [--only NAME,...] [--margins]

``--margins`` adds, per model, the planned peak against the RTX 3090's memory at the recorded
ladder size and the next one up (what the plan would need to gain or lose to move a step).
"""
from __future__ import annotations

import argparse
import csv
import pathlib
import random
import re
import statistics
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's colab_gpu, whatever else is installed

# shared/data beside the checkout (../shared from the main one, ../../shared from a worktree)
DATA = next((parent / "shared" / "data" / "batch-size" for parent in pathlib.Path(__file__).resolve().parents
             if (parent / "shared" / "data" / "batch-size").is_dir()), pathlib.Path("shared/data/batch-size"))
LADDER = [512, 384, 256, 192, 128, 96, 64, 48, 32, 24, 16, 12, 8, 6, 4, 3, 2, 1]
MiB = 1024 ** 2


def import_timm():
    import os

    import torch

    # timm computed attention explicitly when these were recorded (torch 1.12 had no fused
    # attention); timm 1.0 fuses it unless told, which takes far less memory.
    os.environ.setdefault("TIMM_FUSED_ATTN", "0")

    try:
        import timm
    except RuntimeError as error:  # torchvision's compiled ops did not load
        if "does not exist" not in str(error):
            raise
        for module in [name for name in sys.modules if name.startswith(("torchvision", "timm"))]:
            del sys.modules[module]
        library = torch.library.Library("torchvision", "DEF")
        for op in ("nms", "qnms"):
            library.define(f"{op}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        import_timm.library = library  # kept: the schemas live as long as it does
        import timm
    return timm


def on_ladder(size: int) -> int:
    return next(step for step in LADDER if step <= size)


def timm_step(model, image: int, amp: bool = True, nesterov: bool = True):
    import torch

    opt = torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.9, nesterov=nesterov)
    model.train()

    def step(n):
        x = torch.randn(n, 3, image, image, device="cuda")
        y = torch.randint(0, 1000, (n,), device="cuda")
        with torch.autocast("cuda", dtype=torch.float16, enabled=amp):
            loss = torch.nn.functional.cross_entropy(model.to("cuda")(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=False)  # torch 1.12's default, which timm's benchmark ran with

    return step, opt


def margins(step, opt, model, measured: int) -> str:
    """The planned peak against the RTX 3090's memory at the recorded ladder size and the next
    one up: how near the plan came to its answer on each side (negative: over)."""
    from colab_gpu.batch.gpus import gpu_named
    from colab_gpu.batch.plan import plan_step

    total = gpu_named("RTX3090").total
    parts = []
    for size in (measured, LADDER[max(LADDER.index(measured) - 1, 0)]):
        peak = plan_step(step, "RTX3090", start=size, maximum=size, objects=[model, opt]).sizes[0].peak
        parts.append(f"{size}: {peak / MiB:.0f} MiB ({(total - peak) / MiB:+.0f})")
    return "  margins " + ", ".join(parts)


def timm_part(count: int, seed: int, max_params: float, only=(), show_margins: bool = False) -> None:
    from colab_gpu.batch.plan import plan_step

    timm = import_timm()
    rows = list(csv.DictReader(open(DATA / "timm" / "benchmark-train-amp-nchw-pt112-cu113-rtx3090.csv")))
    available = set(timm.list_models())
    rows = [row for row in rows if row["model"] in available and float(row["param_count"]) <= max_params]
    sample = random.Random(seed).sample(rows, min(count, len(rows)))
    if only:
        sample = [row for row in sample if row["model"] in only]
    exact = within = high = 0
    done, seconds = 0, []
    print(f"{'model':40} {'img':>4} {'measured':>8} {'planned':>8}  plan(s)")
    for row in sample:
        name, image, measured = row["model"], int(row["train_img_size"]), int(row["train_batch_size"])
        try:
            model = timm.create_model(name, pretrained=False)
        except Exception as error:  # a model this timm builds differently, or not at all
            print(f"{name:40} skipped: {type(error).__name__}: {error}"[:120])
            continue
        step, opt = timm_step(model, image)
        began = time.perf_counter()
        try:
            plan = plan_step(step, "RTX3090", start=2, maximum=512, objects=[model, opt])
        except Exception as error:
            print(f"{name:40} failed: {type(error).__name__}: {error}"[:120])
            continue
        seconds.append(time.perf_counter() - began)
        planned = on_ladder(plan.answer) if plan.answer else 0
        done += 1
        exact += planned == measured
        index = LADDER.index(measured)
        within += planned in LADDER[max(index - 1, 0):index + 2]
        high += planned > measured
        mark = "" if planned == measured else "  HIGH" if planned > measured else "  low"
        if show_margins:
            mark += margins(step, opt, model, measured)
        print(f"{name:40} {image:4} {measured:8} {planned:8}  {seconds[-1]:6.1f}{mark}", flush=True)
    if done:
        print(f"\ntimm, RTX 3090: {done} models planned; exact {exact / done:.0%}, within one ladder step "
              f"{within / done:.0%}, too high {high / done:.0%}; median {statistics.median(seconds):.1f} s a plan")


def milabench_curves(path: pathlib.Path):
    curves, name = {}, None
    for line in path.read_text().splitlines():
        header = re.match(r"^([A-Za-z0-9_.+-]+):\s*$", line)
        if header:
            name = header.group(1)
            continue
        point = re.match(r"^\s+- \{batch_size: (\d+),.*memory: ([0-9.]+) MiB", line)
        if point and name:
            curves.setdefault(name, {})[int(point.group(1))] = float(point.group(2)) * MiB
    return curves


def milabench_part() -> None:
    from colab_gpu.batch.plan import plan_step

    timm = import_timm()
    curves = milabench_curves(DATA / "milabench" / "H100.yaml")
    errors = []
    for bench, model_name, amp in (("resnet50", "resnet50", True), ("convnext_large-fp16", "convnext_large", True),
                                   ("convnext_large-fp32", "convnext_large", False)):
        model = timm.create_model(model_name)
        step, opt = timm_step(model, 224, amp=amp, nesterov=False)
        for size, measured in sorted(curves[bench].items()):
            plan = plan_step(step, "H100", start=size, maximum=size, objects=[model, opt])
            predicted = plan.sizes[0].peak
            errors.append((predicted - measured) / measured)
            print(f"{bench:22} {size:5}  measured {measured / MiB:8.0f} MiB  planned {predicted / MiB:8.0f} MiB  "
                  f"{errors[-1]:+.0%}", flush=True)
        del model, opt
    absolute = [abs(error) for error in errors]
    print(f"\nmilabench, H100: {len(errors)} points; median error {statistics.median(absolute):.0%}, "
          f"worst {max(absolute):.0%}, median signed {statistics.median(errors):+.0%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-params", type=float, default=150.0, help="millions; larger models are left out")
    parser.add_argument("--part", choices=["timm", "milabench", "both"], default="both")
    parser.add_argument("--only", default="", help="NAME,...: only these models of the sample")
    parser.add_argument("--margins", action="store_true",
                        help="also the planned peak against the memory at the recorded size and the next up")
    args = parser.parse_args()
    if args.part in ("timm", "both"):
        only = {name for name in args.only.split(",") if name}
        timm_part(args.models, args.seed, args.max_params, only, args.margins)
    if args.part in ("milabench", "both"):
        milabench_part()


if __name__ == "__main__":
    main()
