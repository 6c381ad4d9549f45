"""GPU check for %%find_batch (run on a machine with a CUDA GPU; under 5 minutes).

Emulates a 15 GiB Tesla T4 with torch.cuda.set_per_process_memory_fraction, finds the
largest batch for a real model built in code (a ResNet-style CNN, AdamW, AMP; no
downloads), runs 50 training steps at the found size without OOM, and shows that memory is
back at its baseline after the search.
    python gpu_checks/find_batch.py
"""
from __future__ import annotations

import sys
import time

T4_BYTES = 15 * 1024 ** 3


def main() -> int:
    import torch

    if not torch.cuda.is_available():
        print("gpu_checks/find_batch.py: no CUDA device here; run it on a machine with a GPU.")
        return 2
    from colab_gpu import find_batch

    began = time.perf_counter()
    total = torch.cuda.get_device_properties(0).total_memory
    fraction = min(1.0, T4_BYTES / total)
    torch.cuda.set_per_process_memory_fraction(fraction, 0)
    print(f"{torch.cuda.get_device_name(0)}: {total / 1024 ** 3:.1f} GiB, limited to "
          f"{fraction * total / 1024 ** 3:.2f} GiB (a T4)")
    torch.manual_seed(0)

    def block(channels_in, channels_out):
        return torch.nn.Sequential(
            torch.nn.Conv2d(channels_in, channels_out, 3, padding=1, bias=False),
            torch.nn.BatchNorm2d(channels_out), torch.nn.ReLU(inplace=True),
            torch.nn.Conv2d(channels_out, channels_out, 3, padding=1, bias=False),
            torch.nn.BatchNorm2d(channels_out), torch.nn.ReLU(inplace=True), torch.nn.MaxPool2d(2))

    model = torch.nn.Sequential(block(3, 64), block(64, 128), block(128, 256), block(256, 512),
                                torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
                                torch.nn.Linear(512, 1000)).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cuda")

    def step(batch_size: int) -> None:
        images = torch.randn(batch_size, 3, 128, 128, device="cuda")
        labels = torch.randint(0, 1000, (batch_size,), device="cuda")
        with torch.autocast("cuda", dtype=torch.float16):
            loss = torch.nn.functional.cross_entropy(model(images), labels)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)

    torch.cuda.synchronize()
    baseline = torch.cuda.memory_allocated()
    result = find_batch(step, restore=[model, optimizer, scaler], multiple_of=8)
    from IPython.lib.pretty import pretty

    print(pretty(result))
    after = torch.cuda.memory_allocated()
    print(f"allocated before the search {baseline / 1024 ** 2:.1f} MiB, after {after / 1024 ** 2:.1f} MiB; "
          f"reserved after {torch.cuda.memory_reserved() / 1024 ** 2:.1f} MiB")
    ok = after <= baseline + 1024 ** 2
    print(("OK" if ok else "FAIL") + ": memory back at its baseline after the search")
    for index in range(50):
        step(result.answer)
    torch.cuda.synchronize()
    print(f"OK: 50 training steps at batch_size={result.answer}, peak "
          f"{torch.cuda.max_memory_allocated() / 1024 ** 3:.2f} GiB of {fraction * total / 1024 ** 3:.2f} GiB; "
          f"{time.perf_counter() - began:.0f} s in all")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
