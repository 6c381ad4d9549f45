"""How busy the GPUs and the CPUs were, and what it says: one GPU working while the others
idle (replayed from real multi-GPU rows), and a GPU waiting on a saturated CPU during a cell
(the live monitor's --cells over the NVML stand-in of a real light-load V100S, a real
CPU-bound DataLoader in the cell), repeated by %gpu_status's advice while the monitor runs."""
from __future__ import annotations

import csv
import multiprocessing
import time

import pytest

import colab_gpu.devices
import colab_gpu.gpu_status
from colab_gpu import live, load
from colab_gpu.devices.nvml import NvmlSource
from colab_gpu.devices.replay import ReplaySource, load_frames
from colab_gpu.host import process_cpu
from colab_gpu.live.panel import render_panel
from colab_gpu.live.sampler import Sample, Sampler, reading_of
from colab_gpu.live.terminal import watch
from colab_gpu.load import CellLoad, busy_words, gpu_list, input_pipeline_hint, one_gpu_busy
from colab_gpu.state import session
from conftest import DATA
from nvml_recording import RecordedNvml

CSV = DATA / "nvidia-smi-csv"
NANOGPT = CSV / "8gpu-training_nanogpt-pr643.csv"  # 8 GPUs at 100 %, every ~0.3 s
IDLE_8GPU = CSV / "8gpu-80gb-idle_gpu-glasses.csv"  # 8 GPUs idle (its 3rd column is the utilization)
V100 = CSV / "v100s-pcie-32gb_miris.csv"  # a V100S idle, then under a light load (1-19 %)


def one_busy_three_idle(path, steps=120):
    """A 4-GPU log from real rows: GPU 0's as nanoGPT's training recorded it, GPUs 1-3's from
    the idle 8-GPU box's rows (temperature, utilization, power), one per time step."""
    with open(NANOGPT) as file:
        busy = [row for row in csv.DictReader(file, skipinitialspace=True) if row["gpu_index"] == "0"][:steps]
    with open(IDLE_8GPU) as file:
        idle = [row for row in csv.reader(file, skipinitialspace=True)][1:]
    idle_of = {index: [row for row in idle if row[1] == str(index)] for index in (1, 2, 3)}
    with open(path, "w", newline="") as file:
        out = csv.writer(file)
        out.writerow(["timestamp", "gpu_index", "temperature_C", "utilization_gpu_percent", "power_W"])
        for step, row in enumerate(busy):
            out.writerow([row["timestamp"], 0, row["temperature_C"], row["utilization_gpu_percent"], row["power_W"]])
            for index, rows in idle_of.items():
                quiet = rows[step % len(rows)]
                out.writerow([row["timestamp"], index, quiet[6], quiet[2], quiet[5]])
    return path


def samples_of(path, steps=None):
    """The recording's time steps as the live sampler's samples, at the times recorded."""
    frames = load_frames(path)[:steps]
    return [Sample(frame.timestamp, tuple(reading_of(gpu) for gpu in frame.gpus)) for frame in frames]


def test_gpu_lists_read_as_a_person_writes_them():
    assert [gpu_list(indices) for indices in ([2], [1, 2, 3], [3, 1, 5])] == ["GPU 2", "GPUs 1-3", "GPUs 1, 3 and 5"]


def test_one_gpu_busy_while_three_idle_is_said_with_how_long(tmp_path):
    samples = samples_of(one_busy_three_idle(tmp_path / "one-busy.csv"))
    seconds = samples[-1].time - samples[0].time
    assert seconds > 30  # ~0.3 s a step
    assert one_gpu_busy(samples) == (
        f"only GPU 0 is busy: GPUs 1-3 idle for the last {seconds:.0f} s; torch.nn.DataParallel, or "
        f"DistributedDataParallel through colab_gpu.launch(), would use them")
    assert one_gpu_busy(samples[:10]) is None  # 3 s: a moment, not a pattern
    assert one_gpu_busy(samples, hidden={1, 2, 3}) is None  # hidden from torch: not this kernel's to use


def test_every_gpu_busy_or_every_gpu_idle_gives_no_hint():
    assert one_gpu_busy(samples_of(NANOGPT, steps=8 * 150)) is None  # all 8 train
    assert one_gpu_busy(samples_of(IDLE_8GPU)) is None


def test_the_live_panel_and_terminal_say_it_while_it_holds(tmp_path, monkeypatch):
    monkeypatch.setattr(load, "IDLE_SECONDS", 0.3)
    sampler = Sampler(ReplaySource(one_busy_three_idle(tmp_path / "one-busy.csv"), follow=True),
                      interval=0.02, close_source=True).start()
    try:
        lines = []
        watch(sampler, lines.append, max_lines=40, width=400)
        told = [line for line in lines if line.startswith("only GPU 0 is busy: GPUs 1-3 idle for the last")]
        assert len(told) == 1  # once, not under every line
        assert "only GPU 0 is busy: GPUs 1-3 idle" in render_panel(sampler)
    finally:
        sampler.stop()


def burn(seconds):
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def test_the_cpu_time_of_a_worker_counts_whether_it_runs_or_ended():
    """A DataLoader worker is a child process: its CPU time counts while it runs (read from
    /proc) and once it has ended and been waited for (os.times)."""
    context = multiprocessing.get_context("fork")
    own, tree, _ = process_cpu()
    started = context.Event()
    worker = context.Process(target=lambda: (burn(0.3), started.set(), time.sleep(5)))
    worker.start()
    started.wait(10)
    running = process_cpu()
    worker.terminate()
    worker.join()
    ended = process_cpu()
    assert running[1] - tree >= 0.25 and ended[1] - tree >= 0.25
    assert running[0] - own < 0.2  # not this process's own time


def a_load(**changes):
    figures = dict(seconds=12.0, samples=12, gpu=0, gpu_busy=31.0, process_cpu=0.99, workers_cpu=0.55, cores=2)
    figures.update(changes)
    return CellLoad(**figures)


@pytest.mark.parametrize("changes, bound", [
    ({}, True), ({"process_cpu": 0.3, "workers_cpu": 0.95}, True),  # the Python thread, or the workers
    ({"process_cpu": 0.45, "thread_wanted": 0.97}, True),  # a thread computing without pause on a shared machine
    ({"gpu_busy": 80.0}, False), ({"gpu_busy": 0.0}, False),  # the GPU is the bound; the cell used none
    ({"process_cpu": 0.4}, False), ({"samples": 1}, False), ({"gpu_busy": None}, False)])
def test_input_bound_is_a_waiting_gpu_beside_saturated_cpus(changes, bound):
    assert a_load(**changes).input_bound is bound


def test_the_hint_names_the_notebooks_loader():
    assert busy_words(a_load()) == "GPU 0 busy 31 %; CPU: this process 99 % of a core, with its workers 55 % of 2 cores"
    assert input_pipeline_hint(a_load(), ["train_loader"]) == (
        "GPU busy 31 % while the CPUs were at 99 %: the input pipeline may be the bottleneck: "
        "try colab_gpu.tune_loader(train_loader)")
    assert input_pipeline_hint(a_load(), []).endswith("try colab_gpu.tune_loader(loader)")
    assert input_pipeline_hint(a_load(gpu_busy=90.0), ["train_loader"]) is None


@pytest.fixture
def light_load_v100(monkeypatch):
    """%gpu_status and --live read a V100S as NVML answers for it at its busiest recorded step
    under light load (19 %): a GPU that works a little and waits."""
    frame = max(load_frames(V100), key=lambda frame: frame.gpus[0].utilization_gpu)
    assert frame.gpus[0].utilization_gpu == 19
    source = NvmlSource(nvml=RecordedNvml(frame))
    for module in (colab_gpu.devices, colab_gpu.gpu_status):
        monkeypatch.setattr(module, "default_source", lambda: source)
    session.reset("cell_load", "cell_loaders")
    yield source
    live.stop()
    source.close()
    session.reset("cell_load", "cell_loaders")


def unfolded(text):
    """Printed lines, those folded for an 80-column terminal joined again."""
    return text.replace("\n  ", " ")


def test_cells_say_how_busy_the_gpu_and_cpus_were_and_the_advice_repeats_an_input_bound_cell(
        shell, capsys, light_load_v100, fast_live_sampling):
    shell.run_cell("import time, torch\n"
                   "class Decoded(torch.utils.data.Dataset):\n"
                   "    def __len__(self):\n"
                   "        return 48\n"
                   "    def __getitem__(self, index):  # decoding and augmenting, in Python\n"
                   "        end = time.process_time() + 0.01\n"
                   "        while time.process_time() < end:\n"
                   "            pass\n"
                   "        return torch.full((3,), float(index))\n"
                   "train_loader = torch.utils.data.DataLoader(Decoded(), batch_size=8)\n")
    try:
        for name, value in (("live_display", "widgets"), ("live_interval", 0.05)):
            shell.run_line_magic("config", f"GPUMagics.{name} = {value!r}")
        shell.run_line_magic("gpu_status", "--live --cells")
        capsys.readouterr()
        shell.run_cell("for batch in train_loader:\n    pass\n").raise_error()
        lines = unfolded(capsys.readouterr().out).strip().splitlines()
        assert len(lines) == 3, lines  # the load, the memory, the hint
        assert lines[0].startswith("cell load: GPU 0 busy 19 %; CPU: this process ")
        assert lines[1].startswith("cell GPU memory (NVML, all processes")
        assert lines[2].startswith("GPU busy 19 % while the CPUs were at ") and lines[2].endswith(
            " %: the input pipeline may be the bottleneck: try %tune_loader train_loader")
        shell.run_line_magic("gpu_status", "")
        card = " ".join(capsys.readouterr().out.split())
        assert "tip: In the last cell the live monitor measured (" in card
        assert "the input pipeline may be the bottleneck: try %tune_loader train_loader." in card

        shell.run_cell("time.sleep(0.3)")  # the CPUs idle: no bound, and the advice follows the last cell
        out = unfolded(capsys.readouterr().out)
        assert out.startswith("cell load: GPU 0 busy 19 %") and "input pipeline" not in out
        shell.run_line_magic("gpu_status", "")
        assert "input pipeline" not in capsys.readouterr().out
    finally:
        shell.run_line_magic("gpu_status", "--stop")
        for name, value in (("live_display", "auto"), ("live_interval", 1.0)):
            shell.run_line_magic("config", f"GPUMagics.{name} = {value!r}")
