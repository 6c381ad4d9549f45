"""GPU check for %%find_batch (run on a machine with a CUDA GPU; under 5 minutes).

Emulates a 15 GiB Tesla T4 with torch.cuda.set_per_process_memory_fraction, finds the
largest batch for a real model built in code (a ResNet-style CNN, AdamW, AMP; no
downloads), runs 50 training steps at the found size without OOM, and shows that memory is
back at its baseline after the search. Also: a search started 4x above the answer (real CUDA
out-of-memory errors, recovered from), the same from a cell that catches its own (the result
says its answer ran with OOMs caught inside it), and %%find_batch --mode throughput in a real IPython shell (the
answer set, the cell's names and the CUDA generator put back), a trained optimizer's state
restored without a second host copy of its GPU tensors, and the CUDA generator as
torch.manual_seed left it where the cell is what starts CUDA. Two more shapes, a small CNN
on 64x64 images and a 4-layer transformer encoder at sequence 256 (AMP both): each search
ends in at most 10 trials and 3 out-of-memory errors on a sentence its trials back ("within
X %" only with a failure at most X % above the answer), and its answer runs in a fresh process.
    python gpu_checks/find_batch.py
    python gpu_checks/find_batch.py --fresh cnn 512   # exit 0: 3 steps at 512 ran; 3: out of memory
"""
from __future__ import annotations

import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # this checkout's colab_gpu

T4_BYTES = 15 * 1024 ** 3
SHAPES = ("cnn", "transformer")  # searched beside the ResNet, each checked in a fresh process
FRESH_STEPS = 3


def build(name: str, device: str):
    """(model, optimizer, scaler, step) for one of the check's models on ``device``, seeded:
    ``resnet`` (128x128 images, 1000 classes), ``cnn`` (64x64 images, 10 classes) or
    ``transformer`` (4 encoder layers, d_model 512, sequence 256). AMP (float16 and a
    GradScaler) on CUDA; on the CPU the same step in float32, to check it runs anywhere."""
    import torch
    from torch import nn

    cuda = device.startswith("cuda")

    def block(channels_in, channels_out):
        return nn.Sequential(
            nn.Conv2d(channels_in, channels_out, 3, padding=1, bias=False),
            nn.BatchNorm2d(channels_out), nn.ReLU(inplace=True),
            nn.Conv2d(channels_out, channels_out, 3, padding=1, bias=False),
            nn.BatchNorm2d(channels_out), nn.ReLU(inplace=True), nn.MaxPool2d(2))

    if name == "resnet":
        model = nn.Sequential(block(3, 64), block(64, 128), block(128, 256), block(256, 512),
                              nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, 1000))
        shape, classes = (3, 128, 128), 1000
    elif name == "cnn":
        model = nn.Sequential(block(3, 32), block(32, 64), block(64, 128), nn.AdaptiveAvgPool2d(1),
                              nn.Flatten(), nn.Linear(128, 10))
        shape, classes = (3, 64, 64), 10
    elif name == "transformer":
        layer = nn.TransformerEncoderLayer(512, nhead=8, dim_feedforward=2048, batch_first=True)
        model = nn.TransformerEncoder(layer, num_layers=4, enable_nested_tensor=False)
        shape, classes = (256, 512), None
    else:
        raise ValueError(f"no model {name!r}: resnet, cnn or transformer")
    model = model.to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cuda", enabled=cuda)

    def step(batch_size: int) -> None:
        inputs = torch.randn(batch_size, *shape, device=device)
        with torch.autocast("cuda", dtype=torch.float16, enabled=cuda):
            outputs = model(inputs)
            if classes is None:  # the encoder: a regression on its own output
                loss = outputs.float().square().mean()
            else:
                labels = torch.randint(0, classes, (batch_size,), device=device)
                loss = nn.functional.cross_entropy(outputs, labels)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)

    return model, optimizer, scaler, step


def limit_to_a_t4(torch) -> float:
    """The share of device 0 a T4's 15 GiB is (1 on a smaller GPU), set as this process's limit."""
    total = torch.cuda.get_device_properties(0).total_memory
    fraction = min(1.0, T4_BYTES / total)
    torch.cuda.set_per_process_memory_fraction(fraction, 0)
    return fraction


def run_fresh(name: str, size: int) -> int:
    """In this (fresh) process, under the same limit: 0 when FRESH_STEPS steps at ``size`` ran,
    3 when they ran out of memory."""
    import torch

    from colab_gpu import is_out_of_memory

    limit_to_a_t4(torch)
    torch.manual_seed(0)
    step = build(name, "cuda")[3]
    try:
        for _ in range(FRESH_STEPS):
            step(size)
        torch.cuda.synchronize()
    except Exception as error:  # noqa: BLE001 (an out-of-memory error is the answer; others are raised)
        if not is_out_of_memory(error):
            raise
        return 3
    return 0


def main() -> int:
    import torch

    if not torch.cuda.is_available():
        print("gpu_checks/find_batch.py: no CUDA device here; run it on a machine with a GPU.")
        return 2
    from colab_gpu import find_batch

    began = time.perf_counter()
    total = torch.cuda.get_device_properties(0).total_memory
    fraction = limit_to_a_t4(torch)
    print(f"{torch.cuda.get_device_name(0)}: {total / 1024 ** 3:.1f} GiB, limited to "
          f"{fraction * total / 1024 ** 3:.2f} GiB (a T4)")
    torch.manual_seed(0)
    model, optimizer, scaler, step = build("resnet", "cuda")

    failures = []

    def check(ok: bool, finding: str) -> None:
        print(("OK: " if ok else "FAIL: ") + finding)
        if not ok:
            failures.append(finding)

    def back_at(baseline: int, when: str) -> None:
        after = torch.cuda.memory_allocated()
        check(after <= baseline + 1024 ** 2,
              f"memory back at its baseline {when}: allocated {baseline / 1024 ** 2:.1f} MiB before, "
              f"{after / 1024 ** 2:.1f} MiB after (reserved {torch.cuda.memory_reserved() / 1024 ** 2:.1f} MiB)")
        if after > baseline + 1024 ** 2:  # name what is left: block sizes of the live allocations
            blocks = [b["size"] for s in torch.cuda.memory_snapshot() for b in s["blocks"]
                      if b["state"] == "active_allocated"]
            print(f"   live blocks: {sorted(blocks, reverse=True)[:12]}; optimizer state for "
                  f"{len(optimizer.state)} parameters")

    from IPython.lib.pretty import pretty

    torch.cuda.synchronize()
    baseline = torch.cuda.memory_allocated()
    result = find_batch(step, restore=[model, optimizer, scaler], multiple_of=8)
    print(pretty(result))
    back_at(baseline, "after the search")
    if result.answer is None:  # every check below starts from the answer
        print(f"FAIL: the search found no batch size ({result.stopped}); the other checks need one")
        return 1
    check(len(optimizer.state) == 0, "the optimizer has no state after the search, as before it")

    # Starting above what fits: real CUDA out-of-memory errors, recovered from within the search.
    from_above = find_batch(step, start=4 * result.answer, restore=[model, optimizer, scaler],
                            multiple_of=8, progress=False)
    ooms = sum(trial.outcome == "out of memory" for trial in from_above.trials)
    check(ooms >= 1 and (from_above.answer or 0) >= 0.95 * result.answer,
          f"from start={4 * result.answer}: {len(from_above.trials)} trials, {ooms} out of memory, "
          f"answer {from_above.answer} (first search: {result.answer})")
    back_at(baseline, "after a search with out-of-memory errors")

    def skips_on_oom(batch_size: int) -> None:  # the "skip this batch on OOM" loop
        try:
            step(batch_size)
        except torch.cuda.OutOfMemoryError:
            optimizer.zero_grad(set_to_none=True)

    # How often cuDNN catches its own OOM (falling back to a smaller workspace) near the answer:
    # what a search that failed such sizes would lose. Printed, for the record.
    print(f"   OOMs caught inside the step in the first search (size, count): "
          f"{[(t.size, t.caught_ooms) for t in result.trials if t.caught_ooms] or 'none'}")
    skipping = find_batch(skips_on_oom, start=4 * result.answer, restore=[model, optimizer, scaler],
                          multiple_of=8, progress=False)
    answered = next((trial for trial in skipping.trials if trial.size == skipping.answer), None)
    caught = answered.caught_ooms if answered is not None else 0
    # The substance of the note, not its wording: it names the answer and how many were caught.
    said = [note for note in skipping.notes if f"={skipping.answer} " in note and str(caught) in note]
    check(caught > 0 and bool(said),
          f"a cell skipping its batch on OOM, from {4 * result.answer}: answer {skipping.answer} with "
          f"{caught} OOMs caught inside it, and the result says so ({said[0][:60] if said else 'no note'}...)")

    # The cell magic in a real IPython shell, throughput mode: the answer is set, the cell's own
    # names and the CUDA generator are put back, and memory is back at its baseline.
    from IPython.testing.globalipapp import start_ipython

    shell = start_ipython()
    shell.run_line_magic("load_ext", "colab_gpu")
    shell.user_ns.update(torch=torch, step=step, model=model, optimizer=optimizer, scaler=scaler,
                         images="the user's own images")
    generator = torch.cuda.get_rng_state()
    shell.run_cell("%%find_batch --mode throughput --restore model optimizer scaler --multiple-of 8\n"
                   "images = torch.randn(batch_size, 3, 128, 128, device='cuda')\n"
                   "step(batch_size)\n", store_history=False)
    chosen = shell.user_ns.get("batch_size")
    # Max mode's answer is within 5 % of the largest that fits; throughput mode bisects up to a
    # failure too, so its answer may lie a little above max mode's, never above the largest.
    check(isinstance(chosen, int) and 0 < chosen <= result.answer / 0.95 and chosen % 8 == 0,
          f"%%find_batch --mode throughput set batch_size={chosen} (max mode's answer: {result.answer})")
    check(shell.user_ns["images"] == "the user's own images", "the cell's name `images` is the user's again")
    check(torch.equal(torch.cuda.get_rng_state(), generator), "the CUDA random generator is restored")
    back_at(baseline, "after %%find_batch")

    for index in range(50):
        step(result.answer)
    torch.cuda.synchronize()
    check(True, f"50 training steps at batch_size={result.answer}, peak "
                f"{torch.cuda.max_memory_allocated() / 1024 ** 3:.2f} GiB of {fraction * total / 1024 ** 3:.2f} GiB")

    # Other shapes: every search ends on a sentence its trials back, in few trials, and its
    # answer runs in a fresh process (which has no ResNet beside it: at least as much room).
    import subprocess

    from tests.milabench_replay import claim_backed

    for name in SHAPES:
        shape_model, shape_optimizer, shape_scaler, shape_step = build(name, "cuda")
        searched = find_batch(shape_step, restore=[shape_model, shape_optimizer, shape_scaler],
                              multiple_of=8, progress=False)
        trials = [(trial.size, trial.outcome) for trial in searched.trials]
        sizes = " ".join(f"{size}{'' if outcome == 'fits' else 'x'}" for size, outcome in trials)
        check(searched.answer is not None and claim_backed(searched.stopped, searched.answer, trials)
              and len(trials) <= 10 and searched.out_of_memory_count <= 3,
              f"{name}: batch_size={searched.answer} in {len(trials)} trials ({sizes}), "
              f"{searched.out_of_memory_count} out of memory; stopped: {searched.stopped}")
        del shape_model, shape_optimizer, shape_scaler, shape_step
        torch.cuda.empty_cache()
        if searched.answer is None:
            continue
        try:
            ran = subprocess.run([sys.executable, __file__, "--fresh", name, str(searched.answer)],
                                 capture_output=True, text=True, timeout=90,
                                 env={**os.environ, "PYTHONPATH": ROOT}).returncode
        except subprocess.TimeoutExpired:
            ran = "timed out after 90 s"
        check(ran == 0, f"{name}: {FRESH_STEPS} steps at batch_size={searched.answer} in a fresh process "
                        f"({'ran' if ran == 0 else 'out of memory' if ran == 3 else ran})")

    # A trained optimizer (AdamW's moments on the GPU, its step counts on the CPU) comes back as
    # it was, and its GPU state is given to load_state_dict without a second host copy.
    import copy

    from colab_gpu.batch.state import RestorePoint

    trained = copy.deepcopy(optimizer.state_dict())
    find_batch(step, restore=[model, optimizer, scaler], multiple_of=8, max=result.answer // 2,
               progress=False)
    now = optimizer.state_dict()["state"]
    check(all(torch.equal(now[index][name].cpu(), value.cpu())
              for index, state in trained["state"].items() for name, value in state.items()),
          "a trained optimizer's state (moments, step counts) is as before a search")
    restore_point, given = RestorePoint(objects={"optimizer": optimizer}), []
    saved, load = restore_point.objects[0].saved["state"][0], optimizer.load_state_dict
    optimizer.load_state_dict = lambda state: given.append(state["state"][0]) or load(state)
    restore_point.restore()
    del optimizer.load_state_dict
    check(given[0]["exp_avg"] is saved["exp_avg"] and given[0]["step"] is not saved["step"],
          "a restore gives the GPU's state as saved and the CPU's step counts as a fresh copy")

    # A cell that starts CUDA itself: in a fresh process, the user's first CUDA draw after the
    # search is the one torch.manual_seed(0) gives without it.
    starts_cuda = ("import torch; from colab_gpu import find_batch; torch.manual_seed(0); "
                   "find_batch(lambda size: torch.randn(size, device='cuda'), max=64, progress=False); "
                   "seeded = torch.Generator('cuda').manual_seed(0); "
                   "print(torch.equal(torch.randn(8, device='cuda'), "
                   "torch.randn(8, device='cuda', generator=seeded)))")
    try:  # within run_all.sh's limit for this whole script, so that the summary line is printed
        fresh = subprocess.run([sys.executable, "-c", starts_cuda], capture_output=True, text=True,
                               timeout=60, env={**os.environ, "PYTHONPATH": ROOT})
        said = fresh.stdout.strip() or fresh.stderr[-300:]
    except subprocess.TimeoutExpired:
        fresh, said = None, "timed out after 60 s"
    check(fresh is not None and fresh.stdout.strip() == "True",
          f"a cell that starts CUDA leaves the CUDA generator as torch.manual_seed(0) left it ({said})")
    print(f"{len(failures)} failed, {time.perf_counter() - began:.0f} s in all")
    return 1 if failures else 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--fresh"]:
        sys.exit(run_fresh(sys.argv[2], int(sys.argv[3])))
    sys.exit(main())
