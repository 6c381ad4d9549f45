"""The out-of-memory card in a real Jupyter kernel (ipykernel through nbclient), no GPU needed.

Real CPU out-of-memory errors: the kernel lowers its own address-space limit (RLIMIT_AS), as
``ulimit -v`` does, so that torch's CPU allocator fails for real instead of the machine's OOM
killer ending the kernel. What the notebook front end receives: IPython's own traceback, then
the card (HTML for the notebook, text beside it) with the measured numbers.
"""
from __future__ import annotations

import re

import pytest

from kernel import bundles, execute, stream

pytest.importorskip("nbclient")
pytest.importorskip("torch")

pytestmark = [pytest.mark.kernel,
              pytest.mark.skipif(not __import__("sys").platform.startswith("linux"),
                                 reason="RLIMIT_AS and /proc/self/status are Linux's")]

LIMIT = """%load_ext colab_gpu
import resource, torch, weakref
def address_space():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmSize:"))
hard = resource.getrlimit(resource.RLIMIT_AS)[1]
resource.setrlimit(resource.RLIMIT_AS, (address_space() + 2 ** 30, hard))  # 1 GiB more than now
"""
TOO_LARGE = "batch_size = 512\nimages = torch.empty(batch_size, 3, 2048, 2048)  # 24 GiB"
# Each step's graph keeps its 4 MiB input; a 128 MiB scratch comes and goes, and fails first
# when the room is gone: the card still has that much room to be made in.
LEAK = """w = torch.ones(1, requires_grad=True)
total = 0
for step in range(10_000):
    x = torch.randn(2 ** 20)
    loss = (x * w).sum() + torch.zeros(2 ** 25).sum()
    total = total + loss
"""
FREED = "%clear_cache total --quiet"
KEPT = """def train_step():
    activations = torch.ones(2 ** 24)  # 64 MiB, kept by the traceback
    global ref
    ref = weakref.ref(activations)
    return torch.empty(2 ** 40)
train_step()
"""
CLEAR = "%clear_cache --quiet"
DEAD = "print('dead:', ref() is None)"


def run(cells, failing) -> list:
    """Execute ``cells`` in one fresh kernel, those numbered in ``failing`` expected to fail."""
    import nbformat

    notebook = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell(source, metadata={"tags": ["raises-exception"]} if index in failing else {})
        for index, source in enumerate(cells)])
    return execute(notebook, timeout=120).cells


def card(cell) -> dict:
    """The card's bundle; IPython's traceback must come before it."""
    kinds = [output.output_type for output in cell.outputs]
    assert kinds[0] == "error" and "display_data" in kinds, kinds
    (found,) = [bundle for bundle in bundles(cell) if "Out of memory on" in bundle.get("text/plain", "")]
    return found


def test_the_card_under_real_cpu_out_of_memory_errors_and_nothing_kept():
    cells = run([LIMIT, TOO_LARGE, LEAK, FREED, KEPT, CLEAR, DEAD], failing={1, 2, 4})
    assert all(stream(cell, "stderr") == "" for cell in cells)  # the doctor never failed

    too_large = card(cells[1])
    text = " ".join(too_large["text/plain"].split())
    assert cells[1].outputs[0].ename == "RuntimeError"
    assert text.startswith("Out of memory on cpu: the failing call asked for 24.00 GiB")
    assert re.search(r"is more than the CPU could ever give torch: [\d.]+ GiB \(the address-space limit, ulimit -v\)",
                     text), text
    assert "`%%find_batch --var batch_size` as the cell's first line" in text
    html = too_large["text/html"]
    assert "cgpu-card" in html and "<code>%%find_batch --var batch_size</code>" in html

    leak = " ".join(card(cells[2])["text/plain"].split())
    found = re.search(r"`total` keeps the autograd graphs of (\d+) steps .*?: ([\d.]+) MiB of tensors", leak)
    steps, kept = found.groups()
    assert int(steps) >= 100 and float(kept) >= 4 * (int(steps) - 1), leak  # 4 MiB a step, the last one x's too
    assert "`%clear_cache total` frees it now; then add numbers, not tensors: `total += loss.item()`" in leak
    assert stream(cells[3]).startswith("clear_cache: freed cpu tensors ")

    kept_card = " ".join(card(cells[4])["text/plain"].split())
    assert "the failing call asked for 4096.00 GiB" in kept_card  # 2 ** 40 float32
    assert ("IPython keeps 64 MiB of tensors that no variable of yours holds: the last error's traceback 64 MiB"
            in kept_card)
    assert stream(cells[6]) == "dead: True\n"  # the card held nothing of the failed cell
