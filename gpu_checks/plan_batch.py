"""GPU check for colab_gpu.plan_batch / %%find_batch --plan (a CUDA GPU; under 5 minutes).

Plans, then measures, three models built in code (a ResNet-style CNN with AMP and SGD, an MLP
with Adam, a small transformer encoder with AMP and AdamW) with torch's allocator limited to
15 GiB by torch.cuda.set_per_process_memory_fraction, as a T4 leaves it. The plan runs first,
before CUDA starts, and must leave CUDA uninitialized; then, on the GPU, the planned size (put
on timm's ladder 512, 384, 256, 192, 128, ...) must run two steps and the next ladder size up
must run out of memory. Then ``%%find_batch --plan this`` on the whole GPU, in a real IPython
shell (issue #39): the search's first trial must be the planned size, and where the plan was
right (the planned size is the largest that ran) the search must end within 3 trials.

    python gpu_checks/plan_batch.py
"""
from __future__ import annotations

import dataclasses
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # this checkout's colab_gpu

LIMIT = 15 * 1024 ** 3
LADDER = [4096, 3072, 2048, 1536, 1024, 768, 512, 384, 256, 192, 128, 96, 64, 48, 32, 24, 16, 12, 8, 6, 4, 2, 1]


def models(torch):
    """name -> a step function taking the batch size, of a model built in code on the CPU."""
    nn = torch.nn

    def block(cin, cout):
        return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout),
                             nn.ReLU(inplace=True), nn.Conv2d(cout, cout, 3, padding=1, bias=False),
                             nn.BatchNorm2d(cout), nn.ReLU(inplace=True), nn.MaxPool2d(2))

    cnn = nn.Sequential(block(3, 64), block(64, 128), block(128, 256), block(256, 512),
                        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, 1000))
    mlp = nn.Sequential(nn.Linear(4096, 8192), nn.GELU(), nn.Linear(8192, 8192), nn.GELU(), nn.Linear(8192, 1000))
    layer = nn.TransformerEncoderLayer(768, 12, 3072, batch_first=True)
    transformer = nn.Sequential(nn.TransformerEncoder(layer, 6, enable_nested_tensor=False))

    def stepper(model, optimizer, make, amp):
        def step(n):
            x, y = make(n)
            with torch.autocast("cuda", dtype=torch.float16, enabled=amp):
                out = model.to("cuda")(x)
                loss = torch.nn.functional.cross_entropy(out.float().reshape(-1, out.shape[-1]), y.reshape(-1))
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        return step

    return {
        "cnn (AMP, SGD), 128x128": stepper(cnn, torch.optim.SGD(cnn.parameters(), lr=0.1, momentum=0.9), lambda n: (
            torch.randn(n, 3, 128, 128, device="cuda"), torch.randint(0, 1000, (n,), device="cuda")), True),
        "mlp (fp32, Adam)": stepper(mlp, torch.optim.Adam(mlp.parameters()), lambda n: (
            torch.randn(n, 64, 4096, device="cuda"), torch.randint(0, 1000, (n, 64), device="cuda")), False),
        "transformer (AMP, AdamW), 512 tokens": stepper(transformer, torch.optim.AdamW(transformer.parameters()),
                                                        lambda n: (torch.randn(n, 512, 768, device="cuda"),
                                                                   torch.randint(0, 768, (n, 512), device="cuda")),
                                                        True),
    }


def runs(torch, step, size: int) -> bool:
    """Whether two steps at ``size`` run on the GPU; memory freed after."""
    try:
        step(size)
        step(size)
        torch.cuda.synchronize()
        return True
    except torch.cuda.OutOfMemoryError:
        return False
    finally:
        import gc

        gc.collect()
        torch.cuda.empty_cache()


def forget(step) -> None:
    """Frees what a model's trials left on the GPU (its weights, gradients, optimizer state)
    before the next model is measured."""
    import gc

    for cell in step.__closure__ or ():
        value = cell.cell_contents
        if hasattr(value, "state") and hasattr(value, "param_groups"):
            value.state.clear()
        if hasattr(value, "to") and hasattr(value, "parameters"):
            value.to("cpu")
            for parameter in value.parameters():
                parameter.grad = None
    gc.collect()
    import torch

    torch.cuda.empty_cache()


def plan_this_then_search(torch, name: str, step) -> list:
    """``%%find_batch --plan this -o`` over ``step(batch_size)`` on the whole GPU: what went
    wrong, as failures."""
    from IPython.testing.globalipapp import start_ipython

    torch.cuda.set_per_process_memory_fraction(1.0, 0)  # the GPU as NVML, and so the plan, sees it
    shell = start_ipython()
    shell.run_line_magic("load_ext", "colab_gpu")
    shell.user_ns.update(step=step)
    try:
        result = shell.run_cell_magic("find_batch", "--plan this -o", "step(batch_size)")
    except Exception as error:  # a UsageError, or the cell's own error
        return [f"--plan this, {name}: {type(error).__name__}: {error}"]
    print(result)
    if result.plan is None:
        return [f"--plan this, {name}: no plan to start from ({'; '.join(result.notes)})"]
    planned, sizes = result.plan.size, [trial.size for trial in result.trials]
    failures = []
    if sizes[0] != planned:
        failures.append(f"--plan this, {name}: the first trial was {sizes[0]}, not the planned {planned}")
    if result.largest_fitting == planned and len(sizes) > 3:
        failures.append(f"--plan this, {name}: the plan was right, yet the search took {len(sizes)} trials: {sizes}")
    if shell.user_ns.get("batch_size") != result.answer:
        failures.append(f"--plan this, {name}: batch_size is {shell.user_ns.get('batch_size')}, not {result.answer}")
    return failures


def main() -> int:
    import torch

    from colab_gpu.batch.gpus import gpu_named
    from colab_gpu.batch.plan import plan_batch

    try:
        here = gpu_named("this")  # through NVML: no CUDA context
    except Exception as error:
        print(f"gpu_checks/plan_batch.py: no GPU here ({error}); run it on a machine with one.")
        return 2
    began = time.perf_counter()
    t4 = dataclasses.replace(here, name="15 GiB (a T4's share)", total=LIMIT + here.context)
    steps = models(torch)
    plans = {}
    for name, step in steps.items():
        plan = plan_batch(step, t4, max=LADDER[0])
        plans[name] = plan
        print(plan.summary(), f"[{name}; {plan.seconds:.1f} s]")
    failures = []
    if torch.cuda.is_initialized():
        failures.append("planning initialized CUDA")
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(LIMIT / total, 0)
    print(f"{torch.cuda.get_device_name(0)}: allocator limited to {LIMIT / 1024 ** 3:.0f} GiB of "
          f"{total / 1024 ** 3:.1f} GiB")
    for name, step in steps.items():
        answer = plans[name].answer
        if answer is None:
            failures.append(f"{name}: no plan")
            continue
        planned = next(size for size in LADDER if size <= answer)
        above = LADDER[max(LADDER.index(planned) - 1, 0)]
        ran, ran_above = runs(torch, step, planned), runs(torch, step, above) if above != planned else False
        peak = torch.cuda.max_memory_reserved()
        print(f"{name}: planned {answer} -> ladder {planned}: {'runs' if ran else 'OUT OF MEMORY'}; "
              f"{above}: {'runs (the plan was low)' if ran_above else 'out of memory'}; "
              f"max reserved {peak / 1024 ** 3:.2f} GiB")
        if not ran:
            failures.append(f"{name}: the planned {planned} ran out of memory")
        if ran_above:
            failures.append(f"{name}: {above}, one ladder step above the plan, ran too")
        forget(step)
        torch.cuda.reset_peak_memory_stats()
    name = "transformer (AMP, AdamW), 512 tokens"
    failures.extend(plan_this_then_search(torch, name, steps[name]))
    forget(steps[name])
    print(f"{time.perf_counter() - began:.0f} s; " + ("; ".join(failures) if failures else "all as planned"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
