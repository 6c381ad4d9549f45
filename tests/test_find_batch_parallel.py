"""find_batch on several devices: two Gloo ranks (colab_gpu.launch, %%distributed) that each
search with a real step on this CPU and agree on the smallest answer, and a DataParallel
model whose answer is the whole batch, split across its GPUs."""
from __future__ import annotations

import dataclasses

import pytest
import torch

import colab_gpu
from colab_gpu.batch import find_batch
from colab_gpu.batch.parallel import across_devices, split_sizes

LIMIT = 120  # seconds a launch may take before it fails as hung


def search_with_a_per_rank_limit():
    """Each rank searches with a real step; rank 1's limit (max) is smaller, as a GPU with less
    memory free would be."""
    import torch.distributed as dist

    rank = dist.get_rank()
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def step(batch_size):
        optimizer.zero_grad()
        model(torch.randn(batch_size, 32)).sum().backward()
        optimizer.step()

    result = find_batch(step, max=64 if rank == 0 else 24, device="cpu", progress=False)
    return rank, result.answer, result.largest_fitting, result.notes[-1]


def test_every_rank_searches_and_the_ranks_agree_on_the_smallest_answer():
    (rank0, answer0, own0, note0), (rank1, answer1, own1, note1) = colab_gpu.launch(
        search_with_a_per_rank_limit, nprocs=2, backend="gloo", timeout=LIMIT)
    assert (rank0, rank1) == (0, 1)
    assert (own0, own1) == (64, 24)  # what each found alone
    assert answer0 == answer1 == 24  # the smallest: rank 0 at 64 would not fit on rank 1
    assert note0.startswith("rank 0 of 2: the 2 ranks agreed on batch_size = 24, the smallest of their answers")
    assert note0.endswith("it found 64 on this rank alone") and "it found 24 on this rank alone" in note1


def test_a_rank_where_nothing_fits_leaves_no_answer_for_any(shell):
    """%%distributed runs find_batch on every rank; on rank 1 every size fails."""
    shell.run_cell("import torch, torch.distributed as dist\n"
                   "from colab_gpu import find_batch\n"
                   "def step(batch_size):\n"
                   "    if dist.get_rank() == 1:\n"
                   "        raise torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 2.00 GiB')\n"
                   "    torch.randn(batch_size, 8).sum()\n")
    result = shell.run_cell("%%distributed -n 2 --backend gloo --timeout 120\n"
                            "found = find_batch(step, max=16, device='cpu', progress=False)\n"
                            "found.answer, found.largest_fitting, found.notes[-1]\n")
    result.raise_error()
    (answer0, own0, note0), (answer1, own1, note1) = result.result
    assert (answer0, answer1, own0, own1) == (None, None, 16, None)
    assert note0 == "rank 0 of 2: a rank found no size that fits, so the ranks agree on none (it found 16 here)"
    assert note1.endswith("(nothing fitted here)")


def test_one_process_keeps_its_own_answer():
    result = find_batch(lambda size: torch.randn(size, 4).sum(), max=8, device="cpu", progress=False)
    assert result.answer == 8 and not any("rank" in note for note in result.notes)


@pytest.mark.parametrize("batch, devices, shares", [
    (64, 2, [32, 32]), (100, 3, [34, 34, 32]), (5, 4, [2, 2, 1]), (1, 2, [1])])
def test_the_split_is_torchs_chunk(batch, devices, shares):
    assert split_sizes(batch, devices) == shares
    assert split_sizes(batch, devices) == [len(part) for part in torch.arange(batch).chunk(devices)]


def data_parallel_over(*device_ids):
    """A DataParallel model as torch builds it on a machine with these GPUs: without CUDA here,
    torch leaves device_ids empty, so they are set as DataParallel sets them there."""
    model = torch.nn.DataParallel(torch.nn.Linear(4, 2))
    model.device_ids = list(device_ids)
    return model


def test_with_data_parallel_the_answer_is_the_whole_batch_and_the_note_gives_each_gpus_share():
    result = find_batch(lambda size: torch.randn(size, 4).sum(), max=64, device="cpu", progress=False)
    note = across_devices(result, [data_parallel_over(0, 1)]).notes[-1]
    assert note.startswith("the model is torch.nn.DataParallel over 2 GPUs (cuda:0, cuda:1): "
                           "batch_size = 64 is the whole batch; each GPU gets 32 of it; cuda:0 also gathers")
    uneven = across_devices(dataclasses.replace(result, answer=100), [data_parallel_over(0, 1, 2)]).notes[-1]
    assert "torch splits it with chunk() into 34, 34, 32 (a multiple of 3, multiple_of=3, splits it evenly)" in uneven
    # One GPU, or none (DataParallel on a CPU machine): nothing is split.
    assert across_devices(result, [data_parallel_over(0), torch.nn.DataParallel(torch.nn.Linear(4, 2))]) == result


def test_find_batch_finds_the_data_parallel_model_its_step_uses():
    model = data_parallel_over(0, 1)

    def step(batch_size):
        model.module(torch.randn(batch_size, 4)).sum().backward()  # the module itself: no CUDA here

    result = find_batch(step, max=16, device="cpu", progress=False)
    assert result.answer == 16 and "batch_size = 16 is the whole batch; each GPU gets 8 of it" in result.notes[-1]
