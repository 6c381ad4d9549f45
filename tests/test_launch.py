"""colab_gpu.launch on this machine's CPU: two Gloo processes, real torch.distributed.

What a user checks: the collective's answer on every rank, a DDP loop's weights, each rank's
prints in the output as they happen, a failing rank's traceback within seconds and no process
left behind (its DataLoader-like grandchildren included), Ctrl-C, the timeout, a plain script,
torchrun, and the one-line refusals. Every launch has a timeout, so that a hang fails the test
instead of stalling the suite.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import torch
import torch.distributed as dist

import colab_gpu
from colab_gpu.distributed import LaunchOptionError, LaunchRefused, LaunchTimeout, RankError, RankTraceback
from colab_gpu.distributed import launcher
from colab_gpu.distributed.output import RankLines

from conftest import ROOT

LIMIT = 60  # seconds any launch here may take before it fails as hung


def process_groups() -> dict:
    """Every live process of this machine: pid -> (process group, state), from /proc."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        found[int(entry)] = (int(fields[2]), fields[0])
    return found


def left_behind(pids) -> list:
    """The processes among ``pids``, or in their process groups, still alive (zombies not counted)."""
    pids = set(pids)
    return sorted(pid for pid, (group, state) in process_groups().items()
                  if (pid in pids or group in pids) and state != "Z")


def wait_gone(pids, seconds: float = 5.0) -> list:
    ends = time.monotonic() + seconds
    while left_behind(pids) and time.monotonic() < ends:
        time.sleep(0.05)
    return left_behind(pids)


# --- what the ranks compute ---------------------------------------------------------------------

def add_ranks():
    total = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(total)
    return dist.get_rank(), dist.get_world_size(), total.item(), os.environ["MASTER_ADDR"], os.getpid()


def test_an_all_reduce_gives_the_sum_on_every_rank():
    results = colab_gpu.launch(add_ranks, nprocs=2, timeout=LIMIT)
    assert [result[:4] for result in results] == [(0, 2, 3.0, "127.0.0.1"), (1, 2, 3.0, "127.0.0.1")]
    pids = [result[4] for result in results]
    assert len(set(pids)) == 2 and os.getpid() not in pids
    assert wait_gone(pids) == []
    assert not dist.is_initialized()  # the group was the ranks', not this process's


def a_matmul_and_the_threads_it_ran_on():
    square = torch.randn(512, 512)
    return float((square @ square).sum()) == float((square @ square).sum()), torch.get_num_threads()


def test_a_rank_runs_cpu_ops_after_the_notebook_used_its_thread_pool():
    """A notebook that trained on the CPU before launching (its OpenMP pool started): a forked
    rank's first parallel op waited forever for the pool's threads, which a fork does not copy."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        a_matmul_and_the_threads_it_ran_on()  # the notebook's own CPU work, on two threads
        assert colab_gpu.launch(a_matmul_and_the_threads_it_ran_on, nprocs=2, backend="gloo",
                                timeout=LIMIT) == [(True, 1), (True, 1)]
    finally:
        torch.set_num_threads(threads)


def test_arguments_and_keywords_reach_every_rank_and_values_come_back_in_rank_order():
    def scaled(base, factor=1):
        return {"rank": dist.get_rank(), "value": base * factor + dist.get_rank(), "weights": torch.nn.Linear(2, 1)}

    first, second = colab_gpu.launch(scaled, 10, factor=3, nprocs=2, timeout=LIMIT)
    assert (first["rank"], first["value"], second["rank"], second["value"]) == (0, 30, 1, 31)
    assert isinstance(second["weights"], torch.nn.Linear)


# A DDP loop: the data and the model are made here, in the launching process, and copied into the
# ranks by the fork; each rank trains on its half of every batch (DistributedSampler).
FEATURES, SAMPLES, BATCH, EPOCHS = 3, 64, 16, 3


def regression_data():
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(SAMPLES, FEATURES, generator=generator)
    targets = inputs @ torch.tensor([[1.5], [-2.0], [0.5]]) + 0.1 * torch.randn(SAMPLES, 1, generator=generator)
    return torch.utils.data.TensorDataset(inputs, targets)


def fresh_model():
    torch.manual_seed(0)
    return torch.nn.Linear(FEATURES, 1)


def train(model, loader, optimizer, epochs, sampler=None):
    for epoch in range(epochs):
        if sampler is not None:
            sampler.set_epoch(epoch)
        for inputs, targets in loader:
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(inputs), targets).backward()
            optimizer.step()
    return model


def test_a_ddp_loop_ends_with_the_same_weights_on_every_rank_as_one_process_on_the_whole_batch():
    data, model = regression_data(), fresh_model()

    def ddp():
        ddp_model = torch.nn.parallel.DistributedDataParallel(model)
        sampler = torch.utils.data.distributed.DistributedSampler(data, shuffle=False)
        loader = torch.utils.data.DataLoader(data, batch_size=BATCH // dist.get_world_size(), sampler=sampler)
        train(ddp_model, loader, torch.optim.SGD(ddp_model.parameters(), lr=0.1), EPOCHS, sampler)
        return {name: tensor.clone() for name, tensor in model.state_dict().items()}

    ranks = colab_gpu.launch(ddp, nprocs=2, timeout=LIMIT)
    single = fresh_model()
    train(single, torch.utils.data.DataLoader(data, batch_size=BATCH), torch.optim.SGD(single.parameters(), lr=0.1),
          EPOCHS)
    assert torch.equal(ranks[0]["weight"], ranks[1]["weight"]) and torch.equal(ranks[0]["bias"], ranks[1]["bias"])
    for name, tensor in single.state_dict().items():
        torch.testing.assert_close(ranks[0][name], tensor, rtol=1e-5, atol=1e-6)
    assert not torch.equal(single.weight, fresh_model().weight)  # it trained
    assert torch.equal(model.weight, fresh_model().weight)  # the launching process's model is untouched


# --- output -------------------------------------------------------------------------------------

class Recorder:
    """A stand-in for a notebook's sys.stdout: what was written, and when."""

    def __init__(self):
        self.writes = []

    def write(self, text):
        self.writes.append((time.monotonic(), text))
        return len(text)

    def flush(self):
        pass

    @property
    def text(self):
        return "".join(text for _, text in self.writes)

    def when(self, needle):
        return next(moment for moment, text in self.writes if needle in text)


def test_each_ranks_lines_appear_prefixed_as_they_happen(monkeypatch):
    out, err = Recorder(), Recorder()
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", err)

    def talk():
        rank = dist.get_rank()
        print(f"first from {rank}")
        print(f"a warning from {rank}", file=sys.stderr)
        time.sleep(1.5)
        os.write(1, f"written by C code in {rank}\n".encode())  # fd 1 itself, as a C library writes
        subprocess.run(["echo", f"a child of {rank}"], check=True)
        print(f"no newline at the end from {rank}", end="")
        return rank

    begun = time.monotonic()
    assert colab_gpu.launch(talk, nprocs=2, timeout=LIMIT) == [0, 1]
    ended = time.monotonic()
    for rank in (0, 1):
        lines = [line for line in out.text.splitlines() if line.startswith(f"[rank {rank}] ")]
        assert lines == [f"[rank {rank}] first from {rank}", f"[rank {rank}] written by C code in {rank}",
                         f"[rank {rank}] a child of {rank}", f"[rank {rank}] no newline at the end from {rank}"]
        assert f"[rank {rank}] a warning from {rank}\n" in err.text
        # shown while the rank still ran, not when launch returned
        assert out.when(f"first from {rank}") < ended - 1.0, (out.when(f"first from {rank}") - begun, ended - begun)
    assert out.text.count("\n") == 8 and all(text.endswith("\n") for _, text in out.writes)


def test_a_line_is_passed_on_only_once_it_is_whole():
    lines = RankLines(3)
    assert lines.feed(b"hal") == ""
    assert lines.feed(b"f\nwhole\npar") == "[rank 3] half\n[rank 3] whole\n"
    assert lines.feed("t é".encode()[:-1]) == ""  # the first byte of a two-byte character
    assert lines.feed("é".encode()[1:] + b"\r") == ""  # a \r at the end may be half of \r\n
    assert lines.feed(b"\n 10%\r 20%\r") == "[rank 3] part é\r\n[rank 3]  10%\r"
    assert lines.end() == "[rank 3]  20%\r"
    assert lines.feed(b"last") == "" and lines.end() == "[rank 3] last\n" and lines.end() == ""


# --- failures ------------------------------------------------------------------------------------

def test_rank_1_raising_shows_its_traceback_within_seconds_and_leaves_no_process(tmp_path):
    pids = tmp_path / "pids"

    def fail_on_rank_1():
        # each rank starts a process of its own, as a DataLoader's workers are
        helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        with open(pids, "a") as file:
            file.write(f"{os.getpid()} {helper.pid}\n")
        if dist.get_rank() == 1:
            time.sleep(0.5)
            raise ValueError("rank 1 gives up")
        dist.all_reduce(torch.ones(1))  # rank 0 waits here for rank 1, which never comes
        time.sleep(600)

    begun = time.monotonic()
    with pytest.raises(RankError) as raised:
        colab_gpu.launch(fail_on_rank_1, nprocs=2, timeout=LIMIT)
    took = time.monotonic() - begun
    error = raised.value
    assert took < 15, took
    assert str(error) == "rank 1 of 2 failed: ValueError: rank 1 gives up; rank 0 did not finish"
    assert error.rank == 1 and isinstance(error.exception, ValueError)
    assert isinstance(error.__cause__, RankTraceback)
    cause = str(error.__cause__)
    assert cause.startswith("rank 1's traceback:\nTraceback (most recent call last):\n")
    assert 'raise ValueError("rank 1 gives up")' in cause and cause.endswith("ValueError: rank 1 gives up")
    assert "colab_gpu" not in cause  # the rank's own frames only
    started = [int(pid) for pid in pids.read_text().split()]
    assert len(started) == 4
    assert wait_gone(started) == []


def test_a_rank_killed_says_how_it_ended():
    def killed():
        if dist.get_rank() == 0:
            os.kill(os.getpid(), signal.SIGKILL)
        dist.barrier()
        time.sleep(600)

    with pytest.raises(RankError, match=r"^rank 0 of 2 failed: its process was killed by SIGKILL \(the system's "
                                        r"out-of-memory killer sends it\); rank 1 did not finish$") as raised:
        colab_gpu.launch(killed, nprocs=2, timeout=LIMIT)
    assert raised.value.exit_code == -signal.SIGKILL and raised.value.traceback is None


def test_a_value_that_cannot_come_back_is_a_failure_of_its_rank():
    def unpicklable():
        return (lambda: None) if dist.get_rank() == 1 else 1

    with pytest.raises(RankError, match=r"^rank 1 of 2 failed: TypeError: the function returned function "
                                        r"<function .*, which cannot be sent back to the notebook: "
                                        r"AttributeError: Can't (?:pickle|get) local object .*lambda"):
        colab_gpu.launch(unpicklable, nprocs=2, timeout=LIMIT)


def test_the_timeout_stops_every_rank(tmp_path):
    pids = tmp_path / "pids"

    def sleep():
        with open(pids, "a") as file:
            file.write(f"{os.getpid()}\n")
        time.sleep(600)

    begun = time.monotonic()
    with pytest.raises(LaunchTimeout, match=r"^the ranks were still running after timeout=2 s; every one was stopped$"):
        colab_gpu.launch(sleep, nprocs=2, timeout=2)
    assert time.monotonic() - begun < 2 + launcher.GRACE + 5
    assert wait_gone(int(pid) for pid in pids.read_text().split()) == []


# --- refusals ------------------------------------------------------------------------------------

@pytest.fixture
def gpus(monkeypatch):
    """Pretend this machine's torch sees ``n`` GPUs and has NCCL; CUDA not started."""
    def set_gpus(count):
        monkeypatch.setattr(launcher, "gpu_count", lambda: count)
        monkeypatch.setattr(dist, "is_nccl_available", lambda: True)
        monkeypatch.setattr(launcher, "cuda_started", lambda: None)
    return set_gpus


@pytest.mark.parametrize("count, nprocs, backend, planned", [
    (2, None, None, (2, "nccl")), (2, 1, None, (1, "nccl")), (2, None, "gloo", (2, "gloo")),
    (1, 3, "gloo", (3, "gloo")), (0, 2, None, (2, "gloo")), (None, 2, "nccl", (2, "nccl")),
    (None, 4, "gloo", (4, "gloo")),
])
def test_one_rank_per_gpu_with_nccl_by_default(gpus, count, nprocs, backend, planned):
    gpus(count)
    assert launcher.plan(nprocs, backend) == planned


@pytest.mark.parametrize("count, options, message", [
    (0, dict(), "no GPU is visible here: give nprocs=2 to run 2 processes on the CPU with Gloo"),
    (0, dict(backend="nccl", nprocs=1), "backend='nccl' needs a GPU per rank, and no GPU is visible here: "
                                        "backend='gloo' runs the ranks on the CPU"),
    (2, dict(nprocs=4), "nprocs=4 with NCCL needs 4 GPUs (one per rank); 2 are visible: give nprocs=2, or "
                        "backend='gloo' for more ranks than GPUs"),
    (None, dict(nprocs=2), "the GPUs could not be counted (NVML cannot be read here): give backend='nccl' and "
                           "nprocs, or backend='gloo' for the CPU"),
    (2, dict(backend="mpi"), "backend='mpi': use 'nccl' (one GPU per rank) or 'gloo' (the CPU); without it "
                             "NCCL is used where there are GPUs"),
    (2, dict(nprocs=0), "nprocs=0: give a whole number of processes, 1 or more"),
    (2, dict(nprocs=True), "nprocs=True: give a whole number of processes, 1 or more"),
    (2, dict(nprocs=1.5), "nprocs=1.5: give a whole number of processes, 1 or more"),
    (2, dict(timeout=0), "timeout=0: give a positive number of seconds, or None to wait until the ranks end"),
    (2, dict(timeout=float("nan")), "timeout=nan: give a positive number of seconds"),
])
def test_what_cannot_run_is_refused_in_one_line_before_any_process_starts(gpus, count, options, message):
    gpus(count)
    with pytest.raises(LaunchOptionError) as raised:
        colab_gpu.launch(add_ranks, **options)
    assert str(raised.value).startswith(message) and "\n" not in str(raised.value)
    assert isinstance(raised.value, colab_gpu.UserError) and isinstance(raised.value, ValueError)


def test_a_function_is_needed():
    with pytest.raises(TypeError, match=r"^launch runs a function: launch\(train, nprocs=2\), not 'train'$"):
        colab_gpu.launch("train", nprocs=2)


def test_nccl_is_refused_once_cuda_started_here_and_says_what_to_do(gpus, monkeypatch):
    gpus(2)
    monkeypatch.setattr(launcher, "cuda_started", lambda: "torch.cuda.is_initialized() is True")
    with pytest.raises(LaunchRefused) as raised:
        colab_gpu.launch(add_ranks)
    assert str(raised.value) == (
        "CUDA already started in this process (torch.cuda.is_initialized() is True), and processes forked from it "
        "cannot use the GPU: restart the kernel and launch before anything starts CUDA "
        "(torch.cuda.device_count() and %gpu_status do not; torch.cuda.is_available() does)")
    assert launcher.plan(2, "gloo") == (2, "gloo")  # the CPU ranks need no CUDA


def test_the_cpu_only_torch_here_counts_no_gpu():
    assert launcher.gpu_count() == 0  # whatever NVML sees: this torch cannot use a GPU


# --- the process the launch runs in -------------------------------------------------------------

SCRIPT = """
import os, sys, time
sys.path.insert(0, {root!r})
import torch, torch.distributed as dist
import colab_gpu

def gather(offset):
    value = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(value)
    sys.stdout.write(f"rank {{dist.get_rank()}} of {{dist.get_world_size()}} in {{os.getpid()}}\\n")  # one write:
    sys.stdout.flush()  # under torchrun both processes share the pipe, unbuffered with PYTHONUNBUFFERED
    return dist.get_rank() + offset, value.item(), os.getpid()

if __name__ == "__main__":
    results = colab_gpu.launch(gather, 100, nprocs=2, timeout={limit})
    sys.stdout.write(f"launcher {{os.getpid()}} results {{results}}\\n")
"""


def run_script(tmp_path, text, *command, env=None, timeout=LIMIT + 30):
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(text).format(root=str(ROOT), limit=LIMIT))
    environment = {key: value for key, value in os.environ.items()
                   if key not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    return subprocess.run([*command, str(script)], capture_output=True, text=True, timeout=timeout,
                          env={**environment, **(env or {})}, cwd=tmp_path)


def test_a_plain_script_launches_a_function_of_its_own(tmp_path):
    done = run_script(tmp_path, SCRIPT, sys.executable)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert sorted(line.split(" in ")[0] for line in lines[:2]) == ["[rank 0] rank 0 of 2", "[rank 1] rank 1 of 2"]
    launcher_pid = int(lines[2].split()[1])
    assert lines[2].startswith(f"launcher {launcher_pid} results [(100, 1.0, ") and ", (101, 1.0, " in lines[2]
    assert done.stderr == ""


def test_under_torchrun_the_function_runs_in_each_process_and_every_rank_gets_the_list(tmp_path):
    """The notebook's function exported to a script, run with torchrun: launch runs it in place."""
    done = run_script(tmp_path, SCRIPT, sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                      "--master-port", str(launcher.free_port()))
    assert done.returncode == 0, done.stderr[-3000:]
    rank_lines = sorted(line for line in done.stdout.splitlines() if line.startswith("rank "))
    finals = sorted(line for line in done.stdout.splitlines() if line.startswith("launcher "))
    assert [line.split(" in ")[0] for line in rank_lines] == ["rank 0 of 2", "rank 1 of 2"]  # no prefix: no fork
    assert len(finals) == 2
    for final, rank_line in zip(finals, sorted(rank_lines, key=lambda line: int(line.split()[-1]))):
        pid = int(final.split()[1])
        assert final.count(f", {pid})") == 1  # its own value came from itself: run in place
    assert finals[0].split(" results ")[1] == finals[1].split(" results ")[1]  # the same list on both


def test_ctrl_c_stops_every_rank(tmp_path):
    pids = tmp_path / "pids"
    text = f"""
    import os, sys, time
    sys.path.insert(0, {{root!r}})
    import colab_gpu

    def wait():
        with open({str(pids)!r}, "a") as file:
            file.write(f"{{{{os.getpid()}}}}\\n")
        print("waiting", flush=True)
        time.sleep(600)

    if __name__ == "__main__":
        colab_gpu.launch(wait, nprocs=2, timeout={{limit}})
    """
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(text).format(root=str(ROOT), limit=LIMIT))
    process = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    try:
        ends = time.monotonic() + LIMIT
        while (not pids.exists() or len(pids.read_text().split()) < 2) and time.monotonic() < ends:
            time.sleep(0.1)
        time.sleep(0.5)
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=30)
    finally:
        process.kill()
    assert process.returncode != 0
    assert "KeyboardInterrupt: colab_gpu.launch stopped every rank (2 processes)" in err, err
    assert out.count("waiting") == 2
    assert wait_gone(int(pid) for pid in pids.read_text().split()) == []


# --- %%distributed -------------------------------------------------------------------------------

def test_the_cell_magic_runs_the_cell_on_every_rank_with_the_notebooks_names(shell, capsys):
    shell.run_cell("import torch.distributed as dist\nbase = 10\ndef twice(value):\n    return 2 * value")
    result = shell.run_cell("%%distributed -n 2 --timeout 60\n"
                            "mine = twice(base) + dist.get_rank()\n"
                            "print('rank', dist.get_rank(), 'has', mine)\n"
                            "mine\n")
    result.raise_error()
    assert result.result == [20, 21]
    out = capsys.readouterr().out
    assert "[rank 0] rank 0 has 20\n" in out and "[rank 1] rank 1 has 21\n" in out
    assert "mine" not in shell.user_ns  # assigned in the ranks only
    quiet = shell.run_cell("%%distributed -n 2 --timeout 60\nprint(base)\n")
    assert quiet.result is None  # every rank's value None: no Out


def test_the_cell_magics_errors(shell, capsys):
    from IPython.core.error import UsageError

    with pytest.raises(UsageError, match=r"^--backend 'mpi': use 'nccl' \(one GPU per rank\) or 'gloo'"):
        shell.run_cell_magic("distributed", "-n 2 --backend mpi", "1")
    with pytest.raises(UsageError, match=r"^--nprocs 0: give a whole number of processes, 1 or more$"):
        shell.run_cell_magic("distributed", "-n 0", "1")
    with pytest.raises(UsageError, match=r"argument --timeout: 'soon' is not a number of seconds"):
        shell.run_cell_magic("distributed", "-n 2 --timeout soon", "1")
    result = shell.run_cell("%%distributed -n 2 --timeout 60\nimport torch.distributed as dist\n"
                            "if dist.get_rank() == 1:\n    raise KeyError('lost')\n")
    error = result.error_in_exec
    assert isinstance(error, RankError) and str(error) == "rank 1 of 2 failed: KeyError: 'lost'"  # rank 0 finished
    traceback = str(error.__cause__)
    assert "line 4, in <module>\n    raise KeyError('lost')\nKeyError: 'lost'" in traceback  # as in the cell
    with pytest.raises(UsageError, match=r"^SyntaxError on line 3 of the cell: .*: print\(\(; nothing ran$"):
        shell.run_cell_magic("distributed", "-n 2", "x = 1\nprint((\n")
    assert "colab_gpu" not in traceback  # the cell's lines, not the magic's
    capsys.readouterr()


def test_the_cell_magics_help_fits_an_80_column_terminal(shell):
    shown = shell.object_inspect_text("%%distributed")
    assert "%%distributed [-n N] [--backend NAME] [--timeout SECONDS]" in shown
    assert [line for line in shown.splitlines() if len(line) > 80] == []


# --- what a fork copies ----------------------------------------------------------------------------

CUDA_PROBE = """
import ctypes, os, sys
sys.path.insert(0, {root!r})
import torch.distributed as dist
from colab_gpu.distributed import LaunchRefused, launch, launcher
from colab_gpu.distributed.cuda_state import cuda_started, driver_initialized, loaded_driver

print("before loading:", loaded_driver(), driver_initialized(), cuda_started())
driver = ctypes.CDLL({library!r})  # as the CUDA runtime loads it
print("loaded:", loaded_driver() == os.path.realpath({library!r}), driver_initialized(), cuda_started())
print("cuInit:", driver.cuInit(0))
print("initialized:", driver_initialized(), cuda_started())
launcher.gpu_count = lambda: 2  # the stand-in's two GPUs; this CPU torch has no NCCL of its own
dist.is_nccl_available = lambda: True
try:
    launch(print)
except LaunchRefused as error:
    print("refused:", error)
print("on the CPU:", launcher.plan(2, "gloo"))
"""


def test_cuda_started_by_any_library_is_seen_without_starting_it(tmp_path):
    """torch.cuda.is_available() initializes the driver and leaves torch.cuda.is_initialized()
    False (accelerate#940): the forked ranks then fail. The driver itself is asked, through the
    stand-in libcuda (tests/fake_libcuda.c), and only once some library has loaded it."""
    folder = tmp_path / "driver"
    folder.mkdir()
    subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-o", str(folder / "libcuda.so.1"),
                    str(ROOT / "tests" / "fake_libcuda.c")], check=True)
    log = tmp_path / "cuinit.log"
    environment = {"FAKE_CUDA_DEVICES": "0000:00:04.0/GPU-1,0000:00:05.0/GPU-2", "FAKE_CUDA_LOG": str(log)}
    done = run_script(tmp_path, CUDA_PROBE.replace("{library!r}", repr(str(folder / "libcuda.so.1"))),
                      sys.executable, env=environment)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[:4] == ["before loading: None False None", "loaded: True False None", "cuInit: 0",
                         "initialized: True the CUDA driver is initialized (torch.cuda.is_available() does that, "
                         "as do TensorFlow, JAX, CuPy and bitsandbytes)"]
    assert lines[4].startswith("refused: CUDA already started in this process (the CUDA driver is initialized ")
    assert lines[5] == "on the CPU: (2, 'gloo')"
    assert len(log.read_text().split()) == 1  # the script's own cuInit: asking started nothing


def test_torchs_own_start_of_cuda_is_seen():
    class Cuda:
        @staticmethod
        def is_initialized():
            return True

    fake_torch = type(sys)("torch")
    fake_torch.cuda = Cuda
    from colab_gpu.distributed.cuda_state import cuda_started

    assert cuda_started({"torch": fake_torch}) == "torch.cuda.is_initialized() is True"


class SlowSource:
    """A device source whose read takes a while and holds a lock meanwhile, as NVML does."""

    label = "a slow stand-in for NVML"

    def __init__(self):
        from colab_gpu.devices.replay import ReplaySource

        self.recorded = ReplaySource(os.path.join(os.path.dirname(colab_gpu.__file__), "data", "tesla-t4.xml"))
        self.lock = threading.Lock()
        self.reading = threading.Event()

    def snapshot(self):
        return self.recorded.snapshot()

    def light_snapshot(self):
        with self.lock:
            self.reading.set()
            time.sleep(0.3)
            return self.recorded.snapshot()

    def close(self):
        self.recorded.close()


@pytest.mark.filterwarnings("ignore:.*use of fork\\(\\) may lead to deadlocks:DeprecationWarning")
def test_a_fork_waits_for_the_live_samplers_read_and_the_child_has_no_monitor_running(monkeypatch):
    """Forked during a read, the child had the reader's lock held forever (NVML's own, in a
    real sampler: the child's first NVML call hung) and a sampler claiming to run."""
    import colab_gpu.live  # noqa: F401  (its fork hooks, for the kernel's monitor)
    from colab_gpu.live.sampler import Sampler
    from colab_gpu.state import session

    source = SlowSource()
    sampler = Sampler(source, interval=0.01).start()
    monkeypatch.setattr(session, "live_sampler", sampler)  # the kernel's monitor, as live.start() keeps it
    try:
        source.reading.clear()
        assert source.reading.wait(5)  # a read is in flight in the sampler's thread
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                free = source.lock.acquire(timeout=2)
                code = 0 if free and not sampler.running and sampler.samples() else 2
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        count = sampler.count
        assert sampler.running and sampler.wait(count, timeout=5) and sampler.count > count  # sampling on
    finally:
        sampler.stop()


def test_the_live_monitor_keeps_running_here_and_is_stopped_in_the_ranks(fast_live_sampling):
    from colab_gpu import live

    sampler, started = live.start(demo=True, interval=0.01)
    try:
        def in_rank():
            copied = live.history(frame=False)
            return live.running() is None, len(copied) > 0

        assert colab_gpu.launch(in_rank, nprocs=2, timeout=LIMIT) == [(True, True), (True, True)]
        count = sampler.count
        assert live.running() is sampler and sampler.wait(count, timeout=5) and sampler.count > count
    finally:
        live.stop()
