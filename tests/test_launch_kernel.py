"""colab_gpu.launch in a real Jupyter kernel (ipykernel through nbclient), with functions defined
in the notebook's cells: what the front end receives from two Gloo ranks on the CPU.

The ranks are forked from the kernel, whose output goes over ZMQ from threads a fork does not
copy: their prints must still reach the cell that launched them, prefixed, and a display in a
rank must not touch the kernel's channels.
"""
from __future__ import annotations

import pathlib
import queue
import re
import tempfile
import time

import pytest

from kernel import execute, kernel_manager, stream
from test_launch import left_behind, wait_gone

nbformat = pytest.importorskip("nbformat")
pytest.importorskip("nbclient")

pytestmark = pytest.mark.kernel

SETUP = """%load_ext colab_gpu
import os, time
import torch, torch.distributed as dist
import colab_gpu
"""
DEFINE = """def add_ranks(scale):
    total = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(total)
    print(f"rank {dist.get_rank()} sees {total.item()}")
    from IPython.display import display
    display(f"displayed by rank {dist.get_rank()}")
    return total.item() * scale, os.getpid()
"""
LAUNCH = """results = colab_gpu.launch(add_ranks, 10, nprocs=2, timeout=60)
print("results", [value for value, _ in results], "pids", [pid for _, pid in results])
"""
DDP = """torch.manual_seed(0)
inputs, targets = torch.randn(32, 4), torch.randn(32, 1)
model = torch.nn.Linear(4, 1)

def fit(model, batches):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in batches:
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    return model

def ddp_train():
    rank, world = dist.get_rank(), dist.get_world_size()
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    fit(ddp, [(inputs[start + rank:start + 8:world], targets[start + rank:start + 8:world])
              for start in range(0, 32, 8)])
    return model.weight.detach().clone(), model.bias.detach().clone()

ranks = colab_gpu.launch(ddp_train, nprocs=2, timeout=60)
# the kernel's model is as it was (each rank trained its own copy): train it here on whole batches
single = fit(model, [(inputs[start:start + 8], targets[start:start + 8]) for start in range(0, 32, 8)])
print("ranks equal:", torch.equal(ranks[0][0], ranks[1][0]) and torch.equal(ranks[0][1], ranks[1][1]))
print("as one process:", torch.allclose(ranks[0][0], single.weight, atol=1e-6)
      and torch.allclose(ranks[0][1], single.bias, atol=1e-6))
"""
FAIL = """def fail_on_rank_1(path):
    with open(path, "a") as file:
        file.write(f"{os.getpid()}\\n")
    if dist.get_rank() == 1:
        time.sleep(0.5)
        raise ValueError("rank 1 gives up")
    dist.all_reduce(torch.ones(1))  # waits for rank 1 forever
    time.sleep(600)

began = time.monotonic()
try:
    colab_gpu.launch(fail_on_rank_1, PIDS, nprocs=2, timeout=60)
finally:
    took = time.monotonic() - began
"""
AFTER = 'print(f"took {took:.1f} s")'
MAGIC = """%%distributed -n 2 --timeout 60
share = torch.full((2,), float(dist.get_rank()))
dist.all_reduce(share)
print("rank", dist.get_rank(), "sum", share.tolist())
share.sum().item()
"""


def test_a_launch_from_cells_shows_the_ranks_lines_returns_their_values_and_stops_a_failure(tmp_path):
    pids = tmp_path / "pids"
    sources = [SETUP + f"PIDS = {str(pids)!r}", DEFINE, LAUNCH, DDP, FAIL, AFTER, MAGIC]
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source) for source in sources])
    notebook.cells[4].metadata["tags"] = ["raises-exception"]
    execute(notebook, timeout=180)
    setup, define, launched, ddp, failed, after, magic = notebook.cells

    out = stream(launched)
    for rank in (0, 1):
        assert f"[rank {rank}] rank {rank} sees 3.0\n" in out
        assert f"[rank {rank}] 'displayed by rank {rank}'\n" in out  # a rank's display, as text
    assert "results [30.0, 30.0] pids" in out and stream(launched, "stderr") == ""
    rank_pids = [int(pid) for pid in re.findall(r"\d+", out.split("pids")[1])]
    assert len(rank_pids) == 2 and wait_gone(rank_pids) == []

    assert stream(ddp) == "ranks equal: True\nas one process: True\n"

    (error,) = [output for output in failed.outputs if output.output_type == "error"]
    assert error.ename == "RankError"
    assert error.evalue == "rank 1 of 2 failed: ValueError: rank 1 gives up; rank 0 did not finish"
    shown = "\n".join(error.traceback)
    assert 'raise ValueError("rank 1 gives up")' in shown and "RankTraceback" in shown
    took = float(stream(after).split()[1])
    assert took < 15, took
    assert left_behind(int(pid) for pid in pids.read_text().split()) == []

    assert "[rank 0] rank 0 sum [1.0, 1.0]\n" in stream(magic) and "[rank 1] rank 1 sum [1.0, 1.0]\n" in stream(magic)
    (result,) = [output for output in magic.outputs if output.output_type == "execute_result"]
    assert result.data["text/plain"] == "[2.0, 2.0]"


WAIT = """def wait(path):
    with open(path, "a") as file:
        file.write(f"{os.getpid()}\\n")
    print("waiting", flush=True)
    time.sleep(600)

colab_gpu.launch(wait, PIDS, nprocs=2, timeout=120)
"""


def test_interrupting_the_kernel_stops_every_rank(tmp_path):
    """The stop button (an interrupt: SIGINT to the kernel) while the ranks run: the cell ends
    with KeyboardInterrupt within seconds, no rank is left, and the kernel runs the next cell."""
    pids = tmp_path / "pids"
    with tempfile.TemporaryDirectory() as folder:
        manager = kernel_manager(pathlib.Path(folder))
        manager.start_kernel(cwd=str(tmp_path))
        client = manager.client()
        client.start_channels()
        try:
            client.wait_for_ready(timeout=60)
            assert reply(client, SETUP + f"PIDS = {str(pids)!r}")[0]["status"] == "ok"
            waiting = {}

            def interrupt_once_both_wait(message):
                if message["msg_type"] == "stream" and "waiting" in message["content"]["text"]:
                    waiting[message["content"]["text"]] = True
                    if sum(text.count("waiting") for text in waiting) == 2:
                        waiting["at"] = time.monotonic()
                        manager.interrupt_kernel()

            done, shown = reply(client, WAIT, interrupt_once_both_wait)
            assert done["status"] == "error" and done["ename"] == "KeyboardInterrupt"
            assert done["evalue"] == "colab_gpu.launch stopped every rank (2 processes)"
            assert time.monotonic() - waiting["at"] < 15
            started = [int(pid) for pid in pids.read_text().split()]
            assert len(started) == 2 and wait_gone(started) == []
            assert reply(client, "print('after')")[1] == ["after\n"]
        finally:
            client.stop_channels()
            manager.shutdown_kernel(now=True)


def reply(client, code: str, on_message=None, seconds: float = 120):
    """Run ``code`` in the kernel: its execute reply and the text it printed; ``on_message`` sees
    each output message as it comes. A cell running past ``seconds`` fails the test."""
    msg_id = client.execute(code)
    printed = []
    ends = time.monotonic() + seconds
    while True:
        assert time.monotonic() < ends, f"still running after {seconds} s: {code[:60]!r}"
        try:
            message = client.get_iopub_msg(timeout=1)
        except queue.Empty:
            continue
        if message["parent_header"].get("msg_id") != msg_id:
            continue
        if on_message is not None:
            on_message(message)
        if message["msg_type"] == "stream":
            printed.append(message["content"]["text"])
        if message["msg_type"] == "status" and message["content"]["execution_state"] == "idle":
            while True:  # past replies to earlier requests (wait_for_ready's kernel_info)
                answer = client.get_shell_msg(timeout=30)
                if answer["parent_header"].get("msg_id") == msg_id:
                    return answer["content"], printed
