"""Several GPUs: which one torch calls cuda:N, as a user of a mixed box reads it.

The GPUs come from real recordings through the NVML stand-in; the CUDA device is faked only
at its boundary (is_initialized, device_count, memory_stats)."""
from __future__ import annotations

import dataclasses
import os
import sys

import pytest

import colab_gpu
from colab_gpu.devices import GPUProcess, GiB, MiB
from colab_gpu.devices.nvml import NvmlSource
from colab_gpu.devices.replay import ReplaySource
from colab_gpu.state import session
from conftest import DATA
from nvml_recording import RecordedNvml

XML = DATA / "nvidia-smi-xml"


def box(*recordings, change=lambda gpu: gpu):
    """A machine of these GPUs, on consecutive PCI buses in the order given."""
    gpus = [change(dataclasses.replace(ReplaySource(XML / name).snapshot().gpus[0], index=index,
                                       uuid=f"GPU-{index:08d}-0000-0000-0000-000000000000",
                                       bus_id=f"00000000:{0x10 + index:02X}:00.0"))
            for index, name in enumerate(recordings)]
    recorded = ReplaySource(XML / recordings[0]).snapshot()
    return NvmlSource(nvml=RecordedNvml(dataclasses.replace(recorded, gpus=tuple(gpus))))


@pytest.fixture
def cuda_on_cuda0(monkeypatch):
    """torch started CUDA and holds 10 GiB on cuda:0 of two devices."""
    import torch

    stats = {0: {"allocated_bytes.all.current": 10 * GiB, "reserved_bytes.all.current": 11 * GiB}, 1: {}}
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "memory_stats", lambda device: stats[device])
    # what %clear_cache's last step calls
    monkeypatch.setattr(torch._C, "_cuda_hasPrimaryContext", lambda device: device == 0, raising=False)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    for name in ("synchronize", "empty_cache", "ipc_collect"):
        monkeypatch.setattr(torch.cuda, name, lambda *device: None)


def test_a_mixed_box_numbered_fastest_first_does_not_claim_which_gpu_is_cuda0(clean_env, cuda_on_cuda0):
    """An RTX 3060 on the first bus, a 3090 on the second: CUDA's default order makes the 3090
    cuda:0. The card said "GPU 0 RTX 3060 (cuda:0)" and put cuda:0's 10 GiB of tensors on it."""
    status = colab_gpu.status(box("rtx-3060-v12.xml", "rtx-3090-v12.xml"))
    text = str(status)
    assert "(cuda:0" not in text and "(cuda:1" not in text
    assert "GPU 0  NVIDIA GeForce RTX 3060  (cuda:?, compute capability n/a)" in text  # and why, once:
    assert text.count("cuda:? - CUDA numbers these different GPUs fastest first") == 1
    assert "torch cuda:0  allocated 10.00 GiB" in text  # torch's figures, on no NVML GPU
    assert status.breakdown == () and "where " not in text
    assert "cuda:? - CUDA numbers" in status._repr_html_()
    assert "device_order_differs" in {advice.rule for advice in status.advice}

    clean_env.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    status = colab_gpu.status(box("rtx-3060-v12.xml", "rtx-3090-v12.xml"))
    assert "GPU 0  NVIDIA GeForce RTX 3060  (cuda:0," in str(status)
    assert status.torch_memory_of(0).allocated == 10 * GiB


def test_identical_gpus_and_uuids_keep_a_known_numbering(clean_env, cuda_on_cuda0):
    """Kaggle's two T4s: identical GPUs stay in bus order. UUIDs name their GPU in any order."""
    status = colab_gpu.status(box("tesla-t4.xml", "tesla-t4.xml"))
    assert "GPU 1  Tesla T4  (cuda:1," in str(status) and status.torch_memory_of(0).allocated == 10 * GiB
    clean_env.setenv("CUDA_VISIBLE_DEVICES", "GPU-00000001,GPU-00000000")
    session.reset("visible_seen")  # another kernel, whose CUDA started under these UUIDs
    status = colab_gpu.status(box("rtx-3060-v12.xml", "rtx-3090-v12.xml"))
    assert "GPU 1  NVIDIA GeForce RTX 3090  (cuda:0," in str(status)
    assert status.torch_memory_of(1).allocated == 10 * GiB


def test_clear_cache_does_not_give_a_mixed_box_gpu_torchs_figures_of_another(clean_env, cuda_on_cuda0):
    report = colab_gpu.clear_cache(source=box("rtx-3060-v12.xml", "rtx-3090-v12.xml"))
    devices = [reading.device for reading in report.before]
    assert devices == ["cpu", "GPU 0", "GPU 1", "cuda:0", "cuda:1"]
    assert report.before[3].allocated == 10 * GiB
    assert report.holders.outside_torch == ()  # torch's share of each GPU is unknown


def test_clear_cache_does_not_count_another_users_job_on_a_hidden_gpu_as_this_process(clean_env, shell):
    """Kaggle-like pair of T4s, this kernel on GPU 1 (CUDA_VISIBLE_DEVICES=1), someone's job
    holding 14 GiB of GPU 0: "Outside torch" said this process held 14.45 GiB on GPU 0."""
    def others_on_gpu0(gpu):
        if gpu.index:
            return gpu
        return dataclasses.replace(gpu, memory_used=14800 * MiB, memory_free=560 * MiB,
                                   processes=(GPUProcess(4242, "python3", 14 * GiB),))

    clean_env.setenv("CUDA_VISIBLE_DEVICES", "1")
    holders = colab_gpu.memory_holders(shell=shell, source=box("tesla-t4.xml", "tesla-t4.xml", change=others_on_gpu0))
    assert [part.nvml_index for part in holders.outside_torch] == [1]
    assert "14.45 GiB" not in str(holders)


def test_outside_torch_names_each_gpu_as_torch_does_too(clean_env, shell):
    """Kaggle's two T4s under CUDA_VISIBLE_DEVICES=1: %clear_cache's lines call the card cuda:0
    and "Outside torch" called it only GPU 1, which a student reads as a cuda:1 that is not there."""
    clean_env.setenv("CUDA_VISIBLE_DEVICES", "1")
    text = str(colab_gpu.memory_holders(shell=shell, source=box("tesla-t4.xml", "tesla-t4.xml")))
    assert "\n  GPU 1 (cuda:0)   other processes " in text and "GPU 0" not in text


def test_the_card_marks_which_gpu_this_kernel_runs_on(clean_env):
    """A shared 2-GPU box: another user's job on GPU 0, this kernel's on GPU 1."""
    def jobs(gpu):
        pid, name = (4242, "python3") if gpu.index == 0 else (os.getpid(), "python")
        return dataclasses.replace(gpu, processes=(GPUProcess(pid, name, 2 * GiB),))

    status = colab_gpu.status(box("tesla-t4.xml", "tesla-t4.xml", change=jobs))
    gpu1 = str(status).split("GPU 1  Tesla T4")[1]
    assert str(status).count("(this process)") == 1 and f"{os.getpid()}    2.00 GiB  python (this process)" in gpu1
    assert status._repr_html_().count("(this process)") == 1


def test_a_mig_gpu_is_not_called_hidden_when_cuda_visible_devices_names_a_mig_instance(clean_env):
    """CUDA_VISIBLE_DEVICES=MIG-<uuid> is how a slice of an A100 is picked; the card called the
    A100 carrying it "hidden from torch"."""
    clean_env.setenv("CUDA_VISIBLE_DEVICES", "MIG-4f2b0b4e-6f4a-5b8e-9d4b-2b7c1a3e5f60")
    status = colab_gpu.status(box("a100-sxm4-v12.xml", "tesla-t4.xml"))
    text = " ".join(str(status).split())  # the card's 80-column folding undone
    assert "GPU 0 NVIDIA A100-SXM4-80GB (hidden from torch unless the MIG instance in CUDA_VISIBLE_DEVICES is on it," in text
    assert "GPU 1 Tesla T4 (hidden from torch," in text  # no MIG there: the instance cannot be on it
    assert "unless the MIG instance" in status._repr_html_()


class BusyNeighbour:
    """Two T4s; another user's job on GPU 0 frees 1 GiB between any two readings."""

    def __init__(self):
        self.source, self.reads = box("tesla-t4.xml", "tesla-t4.xml"), 0

    def snapshot(self):
        self.reads += 1
        snapshot = self.source.snapshot()
        gpu0 = dataclasses.replace(snapshot.gpus[0], memory_used=(12 - self.reads) * GiB)
        return dataclasses.replace(snapshot, gpus=(gpu0,) + snapshot.gpus[1:])

    def close(self):
        self.source.close()


def test_clear_cache_does_not_report_another_users_gpu_as_freed(clean_env, shell):
    """CUDA_VISIBLE_DEVICES=1: GPU 0 is not this kernel's; its neighbour freeing memory there
    read as "clear_cache: freed GPU 0 NVML used 4.00 GiB"."""
    clean_env.setenv("CUDA_VISIBLE_DEVICES", "1")
    report = colab_gpu.clear_cache(shell=shell, source=BusyNeighbour())
    assert [reading.device for reading in report.before if reading.device != "cpu"] == ["cuda:0"]
    assert "GPU 0" not in str(report)


@pytest.mark.parametrize("hidden_all", ["", "-1"])
def test_clear_cache_with_every_gpu_hidden_reports_none_of_them(clean_env, shell, hidden_all):
    """CUDA_VISIBLE_DEVICES="" or -1, the usual ways to keep a kernel on the CPU: no GPU is this
    kernel's, yet the neighbour freeing memory on GPU 0 still read as this kernel's gain."""
    clean_env.setenv("CUDA_VISIBLE_DEVICES", hidden_all)
    report = colab_gpu.clear_cache(shell=shell, source=BusyNeighbour())
    assert [reading.device for reading in report.before if reading.device != "cpu"] == []
    assert "GPU 0" not in str(report)


@pytest.mark.parametrize("visible", ["0,0", "1,0,1", "GPU-00000001,GPU-00000001-0000"])
def test_a_gpu_named_twice_hides_every_gpu_as_torch_counts_them(clean_env, monkeypatch, visible):
    """Kaggle's two T4s under CUDA_VISIBLE_DEVICES="0,0": torch sees no GPU (torch.cuda's own
    _parse_visible_devices: "Repeated ordinal results in empty set"), but the card called GPU 0
    cuda:0, warned of nothing, and %%find_batch --device cuda:0 went on to a device torch lacks."""
    from colab_gpu.batch import SearchError, checked_device

    clean_env.setenv("CUDA_VISIBLE_DEVICES", visible)
    source = box("tesla-t4.xml", "tesla-t4.xml")
    text = str(colab_gpu.status(source))
    assert "GPU 0  Tesla T4  (hidden from torch," in text and "GPU 1  Tesla T4  (hidden from torch," in text
    assert "hides every GPU from torch: it names the same device twice" in " ".join(text.split())
    monkeypatch.setattr(session, "default_source", source)
    with pytest.raises(SearchError, match="this machine has no CUDA device"):
        checked_device("cuda:0")


@pytest.mark.parametrize("visible", ["", "7", "7,0", "abc,0"])
def test_a_variable_that_names_no_gpu_here_is_not_said_to_name_one_twice(clean_env, visible):
    clean_env.setenv("CUDA_VISIBLE_DEVICES", visible)
    text = " ".join(str(colab_gpu.status(box("tesla-t4.xml", "tesla-t4.xml"))).split())
    assert "hides every GPU from torch: unset it or list GPU indices or UUIDs" in text and "twice" not in text


@pytest.mark.parametrize("visible, labels", [
    ("GPU-00000001,0", {0: "hidden from torch", 1: "cuda:0"}),
    ("1,GPU-00000000", {0: "hidden from torch", 1: "cuda:0"}),
    ("1gpu", {0: "hidden from torch", 1: "cuda:0"}),
])
def test_cuda_visible_devices_is_read_in_the_first_entrys_form_as_torch_reads_it(clean_env, monkeypatch,
                                                                                  visible, labels):
    """Kaggle's two T4s: torch reads a UUID list up to its first ordinal and an ordinal list up
    to its first UUID ("Ordinals are not included in GPUid set"), and an ordinal like strtoul
    ("1gpu2,2ampere" is 1,2). The card said "GPU 0 (cuda:1)" for the first two, a cuda:1 torch
    does not have, and "hides every GPU" for "1gpu"; --device cuda:1 went on to a missing device."""
    from colab_gpu.batch import SearchError, checked_device

    clean_env.setenv("CUDA_VISIBLE_DEVICES", visible)
    source = box("tesla-t4.xml", "tesla-t4.xml")
    text = str(colab_gpu.status(source))
    assert {index: text.split(f"GPU {index}  Tesla T4  (")[1].split(",")[0] for index in (0, 1)} == labels
    assert "hides every GPU" not in text
    monkeypatch.setattr(session, "default_source", source)
    monkeypatch.delitem(sys.modules, "torch", raising=False)  # not imported yet (or not at all here)
    assert checked_device("cuda:0") == "cuda:0"
    with pytest.raises(SearchError, match=r"this machine has 1 CUDA device \(cuda:0 to cuda:0\)"):
        checked_device("cuda:1")


def started_cuda_on_one_gpu(monkeypatch, started: bool = True) -> None:
    """torch started CUDA (or not yet) and holds 3 GiB on its one device, cuda:0."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: started)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "memory_stats", lambda device: {"allocated_bytes.all.current": 3 * GiB,
                                                                   "reserved_bytes.all.current": 3 * GiB})


def visible_changed_advice(status) -> str:
    return next(advice.message for advice in status.advice if advice.rule == "visible_devices_changed")


def test_cuda_visible_devices_set_after_cuda_started_does_not_relabel_the_gpus(clean_env):
    """CUDA started under CUDA_VISIBLE_DEVICES=1, then the user set it to 0: torch still runs on
    GPU 1 (CUDA reads the variable once, at its start), but the card called GPU 0 cuda:0 and
    GPU 1, the one torch uses, "hidden from torch", and put torch's 3 GiB on GPU 0."""
    from test_live import card_labels

    source = box("tesla-t4.xml", "tesla-t4.xml")
    clean_env.setenv("CUDA_VISIBLE_DEVICES", "1")
    started_cuda_on_one_gpu(clean_env, started=False)
    assert card_labels(str(colab_gpu.status(source))) == {0: "hidden from torch", 1: "cuda:0"}
    started_cuda_on_one_gpu(clean_env)  # the user's code starts CUDA
    assert card_labels(str(colab_gpu.status(source))) == {0: "hidden from torch", 1: "cuda:0"}
    clean_env.setenv("CUDA_VISIBLE_DEVICES", "0")
    status = colab_gpu.status(source)
    text = str(status)
    assert card_labels(text) == {0: "hidden from torch", 1: "cuda:0"}
    assert status.torch_memory_of(1).allocated == 3 * GiB and status.torch_memory_of(0) is None
    assert "CUDA_VISIBLE_DEVICES='1'" in text  # the value in effect, with the new one in the advice
    assert "CUDA_VISIBLE_DEVICES is '0' now, but CUDA started under '1'" in visible_changed_advice(status)
    clean_env.setenv("CUDA_VISIBLE_DEVICES", "1")  # set back: nothing to say
    assert "visible_devices_changed" not in {advice.rule for advice in colab_gpu.status(source).advice}


def test_a_change_after_cuda_started_before_colab_gpu_looked_is_said_uncertain(clean_env):
    """CUDA had started before colab_gpu first looked: the value it started under cannot be
    known, and the advice says the labels take the value first seen rather than claim it."""
    source = box("tesla-t4.xml", "tesla-t4.xml")
    started_cuda_on_one_gpu(clean_env)
    clean_env.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert "visible_devices_changed" not in {advice.rule for advice in colab_gpu.status(source).advice}
    clean_env.delenv("CUDA_VISIBLE_DEVICES")
    status = colab_gpu.status(source)
    assert status.torch_index_of == {1: 0}
    assert ("CUDA_VISIBLE_DEVICES is unset now, but it was '1' when colab_gpu first looked, CUDA already started"
            in visible_changed_advice(status))
