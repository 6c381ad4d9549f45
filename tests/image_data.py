"""Datasets whose items cost real CPU work, for tests/test_tune_loader*.py and
benchmarks/tune_loader.py: JPEG images generated once (seeded noise), decoded, rotated and
blurred by Pillow on every access, a few milliseconds an item, as an image pipeline's
decode and augmentation are. The classes live in a module so that spawned workers import them.
"""
from __future__ import annotations

import io
import os
import time

import numpy as np
import torch
from PIL import Image, ImageFilter
from torch.utils.data import Dataset


class GeneratedImages(Dataset):
    """``count`` JPEG images of ``side`` pixels: item ``i`` is (a float tensor 3 x side x side,
    i), decoded and augmented anew each time (a rotation, a Gaussian blur of ``blur``), after a
    read that waits ``read`` seconds, as a file on a network drive (Colab's mounted Drive) does."""

    def __init__(self, count: int = 256, side: int = 128, blur: float = 2.0, seed: int = 0, read: float = 0.0):
        rng = np.random.default_rng(seed)
        self.blur, self.read = blur, read
        self.images = []
        for _ in range(count):
            pixels = (rng.random((side, side, 3)) * 255).astype(np.uint8)
            buffer = io.BytesIO()
            Image.fromarray(pixels).save(buffer, format="JPEG", quality=90)
            self.images.append(buffer.getvalue())

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int):
        if self.read:
            time.sleep(self.read)
        image = Image.open(io.BytesIO(self.images[index])).convert("RGB")
        image = image.rotate(17, resample=Image.BILINEAR).filter(ImageFilter.GaussianBlur(self.blur))
        return torch.from_numpy(np.asarray(image, dtype=np.float32)).permute(2, 0, 1), index


class FailsInWorkers(GeneratedImages):
    """Raises for item ``bad`` in a worker process only: the main process reads it fine, as a
    file handle opened before fork or a CUDA tensor touched in a worker would behave."""

    def __init__(self, bad: int = 5, **kwargs):
        super().__init__(**kwargs)
        self.bad = bad
        self.parent = os.getpid()

    def __getitem__(self, index: int):
        if index == self.bad and os.getpid() != self.parent:
            raise ValueError(f"item {index} cannot be decoded in a worker")
        return super().__getitem__(index)


class Sleepy(Dataset):
    """Items that wait ``seconds`` each, as a read from slow storage does: workers overlap the
    waits on any machine, however loaded its cores."""

    def __init__(self, count: int = 64, seconds: float = 0.002):
        self.count, self.seconds = count, seconds

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int):
        time.sleep(self.seconds)
        return torch.full((4,), float(index)), index


def child_pids() -> set:
    """This process's live child processes (DataLoader workers among them), from /proc."""
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as file:
                fields = file.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == os.getpid() and fields[0] != "Z":
            found.add(int(entry))
    return found
