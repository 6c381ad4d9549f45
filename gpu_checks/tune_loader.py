"""GPU check for tune_loader (run on a machine with a CUDA GPU; under 2 minutes).

With a real training step on the GPU (a small CNN, AdamW, loss.item() each step as training
loops do), the bound is named both ways:

- a heavy loader (each item blurred and rotated by torch on the CPU, num_workers=0) feeding a
  light step: the loader bounds training, the GPU waits most of the time, and workers are
  recommended;
- a light loader (tensors already in memory) feeding a heavy step (8 convolutions of 256
  channels on 64 images of 96 x 96): the step bounds training,
  and the answer is the smallest setting that keeps it fed.

Batches go to the GPU, so pin_memory is tried too; no worker process is left behind.

    python gpu_checks/tune_loader.py
"""
from __future__ import annotations

import math
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # this checkout's colab_gpu


def children() -> set:
    found = set()
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as file:
                fields = file.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == os.getpid() and fields[0] != "Z":
            found.add(int(entry))
    return found


def main() -> int:
    import torch
    from torch.utils.data import DataLoader, Dataset, TensorDataset

    if not torch.cuda.is_available():
        print("gpu_checks/tune_loader.py: no CUDA device here; run it on a machine with a GPU.")
        return 2
    import colab_gpu
    from colab_gpu.loader.render import step_sentences
    from colab_gpu.loader.result import waiting

    began = time.perf_counter()
    torch.manual_seed(0)
    print(f"{torch.cuda.get_device_name(0)}, {os.cpu_count()} CPUs")

    class Augmented(Dataset):
        """A 3 x 160 x 160 image blurred (a 9 x 9 convolution) and rotated on the CPU each access."""

        def __init__(self, count: int = 512):
            self.images = torch.rand(count, 3, 160, 160)
            self.kernel = torch.full((3, 1, 9, 9), 1 / 81)
            angle = math.radians(17)
            self.theta = torch.tensor([[[math.cos(angle), -math.sin(angle), 0.0],
                                        [math.sin(angle), math.cos(angle), 0.0]]])

        def __len__(self):
            return len(self.images)

        def __getitem__(self, index):
            image = self.images[index:index + 1]
            for _ in range(3):
                image = torch.nn.functional.conv2d(image, self.kernel, padding=4, groups=3)
            grid = torch.nn.functional.affine_grid(self.theta, image.shape, align_corners=False)
            image = torch.nn.functional.grid_sample(image, grid, align_corners=False)
            return image[0], index % 10

    def model_and_step(width: int, depth: int):
        """A CNN of ``depth`` 3x3 convolutions of ``width`` channels and its training step."""
        layers = [torch.nn.Conv2d(3, width, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2)]
        for _ in range(depth):
            layers += [torch.nn.Conv2d(width, width, 3, padding=1), torch.nn.ReLU()]
        model = torch.nn.Sequential(*layers, torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
                                    torch.nn.Linear(width, 10)).cuda()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

        def step(batch):
            images, labels = batch
            images, labels = images.cuda(non_blocking=True), labels.cuda(non_blocking=True)
            loss = torch.nn.functional.cross_entropy(model(images), labels)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            loss.item()
        return step

    failures = []
    before = children()

    # Heavy loader, light step: the loader bounds training.
    heavy = DataLoader(Augmented(), batch_size=32, shuffle=True)
    light_step = model_and_step(16, 1)
    result = colab_gpu.tune_loader(heavy, step=light_step, seconds=0.3, repeats=2, max_workers=8, progress=False)
    print(result, "\n")
    current = result.current_measurement
    bound, share = waiting(current.batches_per_second, result.step.seconds_per_batch, 0,
                           result.step.together_rate(result.current))
    if result.device is None or not result.device.startswith("cuda"):
        failures.append(f"batches were not copied to the GPU: device {result.device}")
    if not bound or share < 0.5:
        failures.append(f"heavy loader: the loader should bound training (bound={bound}, waits {share:.0%})")
    if result.answer.num_workers == 0:
        failures.append("heavy loader: workers should have been recommended")
    if not any(m.setting.pin_memory for m in result.measurements):
        failures.append("pin_memory was not tried although batches go to CUDA")
    if not any("the GPU waits" in line for line in step_sentences(result)):
        failures.append("the step sentences do not say how long the GPU waits")

    # Light loader, heavy step: the step bounds training.
    light = DataLoader(TensorDataset(torch.rand(2048, 3, 96, 96), torch.randint(0, 10, (2048,))),
                       batch_size=64, shuffle=True)
    heavy_step = model_and_step(256, 8)  # about 4 TFLOP a step: 10 ms or more on any GPU
    result = colab_gpu.tune_loader(light, step=heavy_step, seconds=0.3, repeats=2, max_workers=4, progress=False)
    print(result, "\n")
    current = result.current_measurement
    bound, share = waiting(current.batches_per_second, result.step.seconds_per_batch, 0,
                           result.step.together_rate(result.current))
    if bound:
        failures.append(f"light loader: the step should bound training (the GPU waits {share:.0%})")
    if not result.keeps_up:
        failures.append("light loader: the answer should be the smallest setting that keeps the step fed")

    left = children() - before
    if left:
        failures.append(f"worker processes left behind: {sorted(left)}")
    print(f"{time.perf_counter() - began:.0f} s")
    for failure in failures:
        print("FAILED:", failure)
    print("tune_loader GPU check:", "FAILED" if failures else "passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
