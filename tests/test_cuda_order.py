"""A box of different GPUs numbered fastest first: which GPU is cuda:N, asked of the CUDA driver.

The hardware is faked only at its two boundaries: NVML (the pynvml stand-in, answering from
the real recordings of an RTX 3090 and a GTX 1660 Ti, as one live box) and the CUDA driver
library (tests/fake_libcuda.c, built here with gcc, found by the child process through
LD_LIBRARY_PATH, the way a user's environment finds the real one). Everything between runs
for real: the child process, the magics in a real IPython shell, the live monitor.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time

import pytest

import colab_gpu
import colab_gpu.devices
import colab_gpu.gpu_status
from colab_gpu import cuda_order, live
from colab_gpu.devices import GiB
from colab_gpu.devices.nvml import NvmlSource
from colab_gpu.devices.replay import ReplaySource
from colab_gpu.render import FASTEST_FIRST_NOTE
from colab_gpu.state import session
from colab_gpu.torch_view import torch_view
from conftest import DATA, ROOT
from nvml_recording import RecordedNvml
from test_live import card_labels, line_labels, live_config, run_live  # noqa: F401 (a fixture)
from test_multigpu import box, cuda_on_cuda0  # noqa: F401 (a fixture)

XML = DATA / "nvidia-smi-xml"
RTX_3090 = ReplaySource(XML / "rtx-3090-v12.xml").snapshot().gpus[0]
GTX_1660_TI = ReplaySource(XML / "gtx-1660-ti.xml").snapshot().gpus[0]  # "Graphics Device" to driver 418
UNKNOWN = "cuda:?"  # in each title; FASTEST_FIRST_NOTE says why, once
ASKED = "cuda:N as the CUDA driver numbers these different GPUs, asked in a child process"


def cuda_bus_id(gpu) -> str:
    """The bus id as the CUDA driver writes it: "0000:43:00.0" where NVML writes "00000000:43:00.0"."""
    return gpu.bus_id[4:].lower()


def driver_devices(*gpus, bus_ids=True, uuids=True) -> str:
    """FAKE_CUDA_DEVICES for ``gpus`` in the driver's order: "busid/uuid,busid/uuid"."""
    return ",".join(f"{cuda_bus_id(gpu) if bus_ids else ''}/{gpu.uuid if uuids else ''}" for gpu in gpus)


@pytest.fixture(scope="module")
def fake_driver_library(tmp_path_factory):
    """A folder holding the stand-in libcuda.so.1, compiled from tests/fake_libcuda.c."""
    gcc = shutil.which("gcc")
    assert gcc, "gcc builds the stand-in for the CUDA driver library (tests/fake_libcuda.c): install it"
    folder = tmp_path_factory.mktemp("fake_libcuda")
    subprocess.run([gcc, "-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-o", str(folder / "libcuda.so.1"),
                    str(ROOT / "tests" / "fake_libcuda.c")], check=True)
    return folder


class Driver:
    """The stand-in driver as the test sets it up: where it logs each child's cuInit."""

    def __init__(self, log):
        self.log = log

    def children(self) -> list:
        """The process id of each child that called cuInit, in order."""
        return [int(line) for line in self.log.read_text().split()] if self.log.exists() else []


@pytest.fixture
def driver(fake_driver_library, clean_env, tmp_path, monkeypatch):
    """This machine's CUDA driver: the stand-in library on the library path children get,
    reporting the 3090 and the 1660 Ti fastest first; no answer remembered from earlier tests."""
    clean_env.setenv("LD_LIBRARY_PATH", str(fake_driver_library))
    clean_env.setenv("FAKE_CUDA_DEVICES", driver_devices(RTX_3090, GTX_1660_TI))
    clean_env.setenv("FAKE_CUDA_LOG", str(tmp_path / "cuinit.log"))
    monkeypatch.setattr(session, "driver_answers", {})
    return Driver(tmp_path / "cuinit.log")


def mixed_box_source() -> NvmlSource:
    """The two recorded GPUs as one live box, through the NVML stand-in. NVML lists the 1660 Ti
    as GPU 0 and the 3090 as GPU 1, their bus ids and UUIDs as recorded: which one CUDA calls
    cuda:0 can only be told by id, not by position."""
    gpus = (dataclasses.replace(GTX_1660_TI, index=0), dataclasses.replace(RTX_3090, index=1))
    recorded = ReplaySource(XML / "gtx-1660-ti.xml").snapshot()
    return NvmlSource(nvml=RecordedNvml(dataclasses.replace(recorded, gpus=gpus)))


def use_source(monkeypatch, source) -> None:
    """Make %gpu_status, --live, %clear_cache and status() read ``source`` as this machine's NVML."""
    for module in (colab_gpu.devices, colab_gpu.gpu_status):
        monkeypatch.setattr(module, "default_source", lambda: source)


@pytest.fixture
def mixed_box(monkeypatch):
    source = mixed_box_source()
    use_source(monkeypatch, source)
    yield source
    live.stop()
    source.close()


def card(shell, capsys, line="") -> str:
    shell.run_line_magic("gpu_status", line)
    out, err = capsys.readouterr()
    assert err == "" and "Traceback" not in out
    return out


def test_the_card_names_each_gpu_by_the_cuda_number_the_driver_gives(shell, capsys, driver, mixed_box):
    """NVML's GPU 0 is the 1660 Ti, but CUDA puts the faster 3090 first: the card said cuda:?
    for both; now it says what torch will call each, and once how it knows."""
    text = card(shell, capsys)
    assert card_labels(text) == {0: "cuda:1", 1: "cuda:0"}
    assert "GPU 1  NVIDIA GeForce RTX 3090  (cuda:0, " in text and "GPU 0  Graphics Device  (cuda:1, " in text
    assert text.count(ASKED) == 1 and "cuda:?" not in text
    html = colab_gpu.status()._repr_html_()
    assert html.count(ASKED) == 1 and "cuda:?" not in html
    assert "'cgpu-muted'>cuda:0, " in html.split("RTX 3090")[1].split("</h4>")[0]
    data = json.loads(card(shell, capsys, "--json"))
    assert data["torch_index_of"] == {"0": 1, "1": 0} and data["cuda_numbering_asked"] is True
    # the advice to make nvidia-smi's and torch's numbers agree still stands
    assert any("CUDA_DEVICE_ORDER=PCI_BUS_ID" in line for line in text.splitlines())


def test_the_driver_is_matched_by_bus_id_alone_and_by_uuid_alone(driver, mixed_box, monkeypatch):
    """CUDA writes bus ids "0000:43:00.0", NVML "00000000:43:00.0"; a driver that gives no
    UUID (or no bus id) still names its GPUs."""
    for only in (dict(uuids=False), dict(bus_ids=False)):
        monkeypatch.setattr(session, "driver_answers", {})
        monkeypatch.setenv("FAKE_CUDA_DEVICES", driver_devices(RTX_3090, GTX_1660_TI, **only))
        status = colab_gpu.status()
        assert status.torch_index_of == {0: 1, 1: 0} and status.cuda_numbering_asked, only


@pytest.mark.parametrize("visible, labels", [
    ("1", {0: "cuda:0", 1: "hidden from torch"}),  # CUDA's ordinal 1, fastest first: the 1660 Ti
    ("0", {0: "hidden from torch", 1: "cuda:0"}),
    ("1,0", {0: "cuda:0", 1: "cuda:1"}),
    ("0,GPU-304a277d", {0: "hidden from torch", 1: "cuda:0"}),  # an ordinal ends at a UUID (the 1660 Ti's)
    ("GPU-304a277d,0", {0: "cuda:0", 1: "hidden from torch"}),  # and a UUID list at an ordinal
    ("", {0: "hidden from torch", 1: "hidden from torch"}),  # cuInit: no device
    ("1,1", {0: "hidden from torch", 1: "hidden from torch"}),  # a GPU named twice: no device either
])
def test_cuda_visible_devices_ordinals_are_the_drivers_fastest_first_ones(shell, capsys, driver, mixed_box,
                                                                          monkeypatch, visible, labels):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    text = card(shell, capsys)
    assert card_labels(text) == labels
    assert (ASKED in text) is not visible.startswith("GPU-")  # a UUID names its GPU in any order
    assert "CUDA_DEVICE_ORDER" not in os.environ  # set for the child only


def test_the_live_monitor_labels_its_gpus_as_the_card_does(live_config, capsys, driver, mixed_box):
    run_live(live_config, "--live", live_lines=2, live_interval=0.1)
    out = capsys.readouterr().out
    assert line_labels(out) == {0: "cuda:1", 1: "cuda:0"} and "cuda:?" not in out
    assert "GPU 1 NVIDIA GeForce RTX 3090 (cuda:0)" in out


def test_memory_figures_land_on_the_gpu_the_driver_calls_cuda0(shell, capsys, driver, mixed_box, cuda_on_cuda0):
    """torch holds 10 GiB on cuda:0, which is the 3090 (NVML's GPU 1): the card's torch row and
    %clear_cache's breakdown put it there, where before they put it on no GPU."""
    text = card(shell, capsys)
    gpu0, gpu1 = text.split("GPU 1  NVIDIA GeForce RTX 3090")
    assert "torch       allocated 10.00 GiB" in gpu1 and "torch       allocated 0 B" in gpu0  # cuda:1 holds none
    assert "torch cuda:0" not in text  # no longer torch's figures on no GPU
    report = colab_gpu.clear_cache(source=mixed_box)
    assert [reading.device for reading in report.before] == ["cpu", "cuda:1", "cuda:0"]
    assert report.before[2].allocated == 10 * GiB and report.before[2].nvml_used == RTX_3090.memory_used
    assert [part.nvml_index for part in report.holders.outside_torch] == [0, 1]
    assert len(driver.children()) == 1


def broken(monkeypatch, case):
    """Break the stand-in driver the way ``case`` says."""
    if case == "a CUDA error from cuInit":
        monkeypatch.setenv("FAKE_CUDA_INIT_RESULT", "999")  # CUDA_ERROR_UNKNOWN
    elif case == "no driver library":
        monkeypatch.delenv("LD_LIBRARY_PATH")
    elif case == "a device NVML does not list":
        monkeypatch.setenv("FAKE_CUDA_DEVICES", "0000:0a:00.0/GPU-0badc0de-0000-0000-0000-000000000000,"
                           + driver_devices(RTX_3090, GTX_1660_TI))
    elif case == "a device without bus id or UUID":
        monkeypatch.setenv("FAKE_CUDA_DEVICES", "/," + driver_devices(GTX_1660_TI))
    elif case == "a cuInit that hangs":
        monkeypatch.setenv("FAKE_CUDA_INIT_SECONDS", "60")


@pytest.mark.parametrize("case", ["a CUDA error from cuInit", "no driver library", "a device NVML does not list",
                                  "a device without bus id or UUID", "a cuInit that hangs"])
def test_a_driver_that_cannot_say_leaves_cuda_unknown_and_is_asked_once(shell, capsys, driver, mixed_box,
                                                                        monkeypatch, case):
    broken(monkeypatch, case)
    start = time.monotonic()
    text = card(shell, capsys)
    first = time.monotonic() - start
    assert card_labels(text) == {0: UNKNOWN, 1: UNKNOWN} and ASKED not in text
    assert text.count(FASTEST_FIRST_NOTE) == 1
    if case == "a cuInit that hangs":
        assert cuda_order.TIMEOUT <= first < cuda_order.TIMEOUT + 3  # waited out, not hung
        (child,) = driver.children()
        with pytest.raises(ProcessLookupError):  # killed, and reaped
            os.kill(child, 0)
    else:
        assert first < cuda_order.TIMEOUT  # the failure was noticed, not waited out
    start = time.monotonic()
    assert card_labels(card(shell, capsys)) == {0: UNKNOWN, 1: UNKNOWN}
    assert time.monotonic() - start < cuda_order.TIMEOUT  # the failure is remembered
    assert len(driver.children()) == (0 if case == "no driver library" else 1)


def test_a_driver_that_timed_out_is_asked_again_once_cuda_started(shell, capsys, driver, mixed_box, monkeypatch,
                                                                 cuda_on_cuda0):
    """Without persistence mode the first card's cuInit outlasted TIMEOUT; the user's code then
    started CUDA, which keeps the GPUs initialized so cuInit answers at once: every later card
    still said cuda:?, the failure remembered for good. It is asked again once, and then kept."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr(cuda_order, "TIMEOUT", 0.5)
    broken(monkeypatch, "a cuInit that hangs")
    assert card_labels(card(shell, capsys)) == {0: UNKNOWN, 1: UNKNOWN}
    assert card_labels(card(shell, capsys)) == {0: UNKNOWN, 1: UNKNOWN}
    assert len(driver.children()) == 1  # nothing changed: not asked again
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)  # the user's code starts CUDA
    monkeypatch.delenv("FAKE_CUDA_INIT_SECONDS")  # and the driver is warm
    for _ in range(2):
        text = card(shell, capsys)
        assert card_labels(text) == {0: "cuda:1", 1: "cuda:0"} and ASKED in text
        assert "torch       allocated 10.00 GiB" in text.split("GPU 1  NVIDIA GeForce RTX 3090")[1]
    assert len(driver.children()) == 2


def test_a_driver_library_put_on_the_library_path_is_found(shell, capsys, driver, mixed_box, monkeypatch,
                                                          fake_driver_library):
    """No libcuda.so.1 on the library path at the first card; the user adds its folder to
    LD_LIBRARY_PATH (which the child gets): the next card asks again and numbers the GPUs."""
    monkeypatch.delenv("LD_LIBRARY_PATH")
    assert card_labels(card(shell, capsys)) == {0: UNKNOWN, 1: UNKNOWN}
    monkeypatch.setenv("LD_LIBRARY_PATH", str(fake_driver_library))
    assert card_labels(card(shell, capsys)) == {0: "cuda:1", 1: "cuda:0"}
    assert len(driver.children()) == 1


def test_the_driver_is_asked_once_per_setting(shell, capsys, live_config, driver, mixed_box, monkeypatch):
    """The card, its --json, status(), %clear_cache and the live monitor share one answer; a
    new CUDA_VISIBLE_DEVICES is asked about once more, and going back asks nothing."""
    for _ in range(3):
        assert card_labels(card(shell, capsys)) == {0: "cuda:1", 1: "cuda:0"}
    card(shell, capsys, "--json")
    assert colab_gpu.status().torch_index_of == {0: 1, 1: 0}
    shell.run_line_magic("clear_cache", "")
    run_live(live_config, "--live", live_lines=2, live_interval=0.1)
    capsys.readouterr()
    assert len(driver.children()) == 1
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert colab_gpu.status().torch_index_of == {0: 0}
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert colab_gpu.status().torch_index_of == {0: 1, 1: 0}
    children = driver.children()
    assert len(children) == 2 and os.getpid() not in children


def test_no_child_where_the_numbering_is_known(shell, capsys, driver, mixed_box, monkeypatch):
    """Bus order asked for, UUIDs named, identical GPUs, a recording (another machine):
    nothing to ask, and a recording's numbering is never this machine's driver's."""
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    assert card_labels(card(shell, capsys)) == {0: "cuda:0", 1: "cuda:1"}
    monkeypatch.delenv("CUDA_DEVICE_ORDER")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", f"{RTX_3090.uuid},{GTX_1660_TI.uuid}")
    assert card_labels(card(shell, capsys)) == {0: "cuda:1", 1: "cuda:0"}
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    use_source(monkeypatch, box("tesla-t4.xml", "tesla-t4.xml"))
    assert card_labels(card(shell, capsys)) == {0: "cuda:0", 1: "cuda:1"}
    recording = dataclasses.replace(mixed_box.snapshot(), recorded=True, source="replay of a mixed box")
    status = torch_view(recording, colab_gpu.detect_runtime())
    assert status.torch_index_of == {0: 0, 1: 1} and not status.cuda_numbering_asked
    from colab_gpu.memory import read_memory

    # numbered as recorded, as the card numbers a recording
    assert [reading.device for reading in read_memory(None, recording)] == ["cuda:0", "cuda:1"]
    assert driver.children() == []


def test_the_childs_answer_is_read_strictly():
    """Whatever the child printed that is not a list of [bus id, UUID] leaves the numbering unknown."""
    assert cuda_order.parse_devices(b'[["0000:43:00.0", null], [null, "GPU-1"]]\n') == (
        ("0000:43:00.0", None), (None, "GPU-1"))
    for garbage in (b"", b"\xff\xfe", b"Segmentation fault", b'{"0": 1}', b"[[null, null]]", b'[["a"]]',
                    b'[[1, "GPU-1"]]', b"[1]"):
        assert cuda_order.parse_devices(garbage) is None, garbage
    assert cuda_order.bus_key("00000000:4A:00.0") == cuda_order.bus_key("0000:4a:00.0") == (0, 0x4A, 0, 0)
    assert cuda_order.bus_key("0000:4a:00") == (0, 0x4A, 0, 0) and cuda_order.bus_key("n/a") is None


SESSION = r'''
import ctypes, json, os, sys
opened = []
real_init = ctypes.CDLL.__init__
def recording_init(self, name, *args, **kwargs):
    opened.append(str(name))
    real_init(self, name, *args, **kwargs)
ctypes.CDLL.__init__ = recording_init

from IPython.testing.globalipapp import start_ipython
import colab_gpu.devices, colab_gpu.gpu_status
from test_cuda_order import mixed_box_source

shell = start_ipython()
shell.run_line_magic("load_ext", "colab_gpu")
source = mixed_box_source()
colab_gpu.devices.default_source = colab_gpu.gpu_status.default_source = lambda: source
shell.run_line_magic("gpu_status", "")
shell.run_line_magic("clear_cache", "")
shell.run_line_magic("config", "GPUMagics.live_lines = 1")
shell.run_line_magic("gpu_status", "--live --interval 0.1")
with open("/proc/self/maps") as maps:
    mapped = [line.split()[-1] for line in maps if "libcuda" in line]
print("REPORT" + json.dumps(dict(pid=os.getpid(), mapped=mapped, opened=opened)))
'''


def test_the_notebooks_process_never_loads_the_driver_library(fake_driver_library, tmp_path):
    """A kernel started with the stand-in on its own library path (so loading it would work and
    show in /proc/self/maps): the child loads it and answers, the kernel itself never does."""
    log = tmp_path / "cuinit.log"
    env = {name: value for name, value in os.environ.items() if not name.startswith("CUDA_")}
    env.update(LD_LIBRARY_PATH=str(fake_driver_library), FAKE_CUDA_DEVICES=driver_devices(RTX_3090, GTX_1660_TI),
               FAKE_CUDA_LOG=str(log), PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests")]))
    done = subprocess.run([sys.executable, "-c", SESSION], env=env, cwd=str(ROOT), capture_output=True, text=True,
                          timeout=120)
    line = next((line for line in done.stdout.splitlines() if line.startswith("REPORT")), None)
    assert line is not None, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(line[len("REPORT"):])
    assert "GPU 1  NVIDIA GeForce RTX 3090  (cuda:0, " in done.stdout and "GPU1 cuda:0 " in done.stdout
    assert "Traceback" not in done.stdout + done.stderr
    children = [int(pid) for pid in log.read_text().split()]
    assert len(children) == 1 and children[0] != report["pid"]  # the child loaded it and called cuInit
    assert report["mapped"] == [] and not any("cuda" in name for name in report["opened"])
