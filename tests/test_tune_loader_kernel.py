"""%tune_loader in a real Jupyter kernel (ipykernel through nbclient), the dataset class defined
in a notebook cell: forked workers run it; workers started by spawn cannot import it, and the
result says how to move it into a module instead of timing a loader that cannot start."""
from __future__ import annotations

import re

import pytest

from kernel import bundles, run_cells, stream

pytest.importorskip("nbclient")

pytestmark = pytest.mark.kernel

DATASET = """import io, os
import numpy as np, torch
from PIL import Image, ImageFilter
from torch.utils.data import Dataset, DataLoader

class CellImages(Dataset):
    '''JPEG images decoded, rotated and blurred on every access: a few ms of CPU an item.'''
    def __init__(self, count=96, side=96):
        rng = np.random.default_rng(0)
        self.blobs = []
        for _ in range(count):
            buffer = io.BytesIO()
            Image.fromarray((rng.random((side, side, 3)) * 255).astype(np.uint8)).save(buffer, format="JPEG")
            self.blobs.append(buffer.getvalue())
    def __len__(self):
        return len(self.blobs)
    def __getitem__(self, index):
        image = Image.open(io.BytesIO(self.blobs[index])).convert("RGB")
        image = image.rotate(17).filter(ImageFilter.GaussianBlur(2))
        return torch.from_numpy(np.asarray(image, dtype=np.float32)), index

def children():
    '''This kernel's live child processes, from /proc.'''
    found = []
    for entry in os.listdir('/proc'):
        try:
            fields = open(f'/proc/{entry}/stat').read().rsplit(')', 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == os.getpid() and fields[0] != 'Z':
            found.append(int(entry))
    return found

ds = CellImages()
torch.manual_seed(0)
train_loader = DataLoader(ds, batch_size=8, shuffle=True)
before = children()
"""
TUNE = "%tune_loader train_loader --seconds 0.15 --repeats 2 --max-workers 2 --apply"
AFTER = """print('workers', train_loader.num_workers, type(train_loader.dataset).__name__)
print('left behind', sorted(set(children()) - set(before)))
print('items', sum(len(batch[1]) for batch in train_loader))  # the new loader's workers run the cell's class
"""
SPAWN = """import colab_gpu
spawned = DataLoader(ds, batch_size=8, num_workers=1, multiprocessing_context='spawn')
result = colab_gpu.tune_loader(spawned, seconds=0.1, repeats=1, progress=False)
print(result.summary())
print('timed', [m.setting.num_workers for m in result.measurements if m.rates])
print(result.hints[0])
"""


def test_a_dataset_class_from_a_cell_is_tuned_applied_and_leaves_no_worker():
    notebook = run_cells(["%load_ext colab_gpu", DATASET, TUNE, AFTER, SPAWN], timeout=240)
    tuned = notebook.cells[2]
    (card,) = bundles(tuned)
    assert card["text/plain"].startswith("train_loader: "), card["text/plain"]
    assert "<table>" in card["text/html"] and "data:image/png;base64," in card["text/html"]
    printed = stream(tuned)
    assert printed.startswith("colab_gpu: timing train_loader with 3 settings")
    assert stream(tuned, "stderr") == ""
    answer = re.search(r"train_loader = DataLoader\(ds, batch_size=8, shuffle=True, num_workers=(\d+)",
                       printed + card["text/plain"])
    assert answer, printed + card["text/plain"]
    after = stream(notebook.cells[3])
    assert f"workers {answer.group(1)} CellImages" in after
    if answer.group(1) != "0":
        assert "colab_gpu: train_loader is now a new DataLoader with num_workers=" in printed
    assert "left behind []" in after and "items 96" in after

    spawned = stream(notebook.cells[4])
    assert "loader: its own num_workers=1 failed; num_workers=0 delivers" in spawned
    assert "timed [0]" in spawned
    assert "start by 'spawn'" in spawned and "the dataset's class CellImages" in spawned
    assert "%%writefile mydata.py" in spawned
