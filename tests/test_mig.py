"""MIG instances: an A100 split into slices, as a researcher on a shared cluster sees it.

The GPU is the real recording a100-sxm4-v12.xml (an A100-SXM4-80GB in MIG mode, four
1g.20gb-sized instances: GPU instances 3-6, 14 SMs and 19968 MiB each). It is replayed as
a file, and through the NVML stand-in (tests/nvml_recording.py) whose MIG answers come from
that recording. nvidia-smi's XML holds no MIG UUIDs: tests that pick an instance with
CUDA_VISIBLE_DEVICES=MIG-<uuid> give the instances UUIDs in code (a variant, not new data).
"""
from __future__ import annotations

import dataclasses
import json

import pynvml
import pytest
from IPython.utils.capture import capture_output

import colab_gpu
import colab_gpu.gpu_status
from colab_gpu.devices import MiB
from colab_gpu.devices.nvml import NvmlSource
from colab_gpu.devices.replay import ReplaySource
from colab_gpu.runtime import mig_torch_indices
from conftest import DATA
from nvml_recording import RecordedNvml

A100 = DATA / "nvidia-smi-xml" / "a100-sxm4-v12.xml"
T4 = DATA / "nvidia-smi-xml" / "tesla-t4.xml"
UUIDS = ("MIG-1d4f6a0e-2b7c-5e3a-9f1d-0a6b3c8e7d21", "MIG-5c2e9b7a-8d1f-5a4e-b3c6-7e0f2a9d4b18",
         "MIG-9a7b3c1d-4e6f-5b2a-8c0d-1f3e5a7b9c02", "MIG-e3f1a2b4-c5d6-5e7f-a8b9-c0d1e2f3a4b5")


def recorded_a100():
    return ReplaySource(A100).snapshot()


def with_instances(snapshot, change=lambda mig: mig):
    """The recording with each instance given its UUID (and ``change`` applied)."""
    (gpu,) = snapshot.gpus
    instances = tuple(change(dataclasses.replace(mig, uuid=UUIDS[mig.index])) for mig in gpu.mig_instances)
    return dataclasses.replace(snapshot, gpus=(dataclasses.replace(gpu, mig_instances=instances),))


def filled(index):
    """A variant where instance ``index`` has 95 % of its recorded memory in use."""
    def change(mig):
        if mig.index != index:
            return mig
        used = round(mig.memory_total * 0.95)
        return dataclasses.replace(mig, memory_used=used, memory_free=mig.memory_total - used)
    return change


def live(snapshot, monkeypatch):
    """%gpu_status reads this snapshot through NvmlSource and the NVML stand-in."""
    source = NvmlSource(nvml=RecordedNvml(snapshot))
    monkeypatch.setattr(colab_gpu.gpu_status, "default_source", lambda: source)
    return source


@pytest.fixture
def shown(shell, monkeypatch):
    """What %gpu_status displays, text and HTML: the terminal shell is made to format HTML too,
    as a notebook's does."""
    formatter = shell.display_formatter
    monkeypatch.setattr(formatter, "active_types", formatter.active_types + ["text/html"])
    monkeypatch.setattr(formatter.formatters["text/html"], "enabled", True)

    def show(line=""):
        with capture_output() as captured:
            shell.run_line_magic("gpu_status", line)
        (output,) = captured.outputs
        return output.data["text/plain"], output.data["text/html"]
    return show


# --- the device layer --------------------------------------------------------------------


def test_the_replay_reads_the_four_instances_of_the_real_recording():
    (gpu,) = recorded_a100().gpus
    assert gpu.mig_enabled is True
    ids = [(mig.index, mig.gpu_instance_id, mig.compute_instance_id, mig.multiprocessors) for mig in gpu.mig_instances]
    assert ids == [(0, 3, 0, 14), (1, 4, 0, 14), (2, 5, 0, 14), (3, 6, 0, 14)]
    assert {(mig.memory_total, mig.memory_used, mig.memory_free, mig.memory_reserved) for mig in gpu.mig_instances} \
        == {(19968 * MiB, 12 * MiB, 19955 * MiB, 0)}
    assert {mig.uuid for mig in gpu.mig_instances} == {None}  # the XML does not record them
    (t4,) = ReplaySource(T4).snapshot().gpus
    assert t4.mig_instances is None  # MIG N/A: no instances, not "zero instances"


def test_nvml_enumerates_the_instances_as_the_recording_has_them():
    """Seven slots on an A100: four instances, three empty (NotFound); UUIDs come from NVML."""
    recorded = with_instances(recorded_a100())
    nvml = RecordedNvml(recorded)
    (gpu,) = NvmlSource(nvml=nvml).snapshot().gpus
    assert gpu.mig_instances == recorded.gpus[0].mig_instances
    assert [mig.uuid for mig in gpu.mig_instances] == list(UUIDS)
    assert nvml.calls.count("nvmlDeviceGetMigDeviceHandleByIndex") == 7
    assert "nvmlDeviceGetUtilizationRates on MIG" not in nvml.calls  # NVML has none per instance


def test_nvml_reads_no_instances_on_a_gpu_without_mig():
    nvml = RecordedNvml.from_recording(T4)
    (gpu,) = NvmlSource(nvml=nvml).snapshot().gpus
    assert gpu.mig_instances is None and "nvmlDeviceGetMaxMigDeviceCount" not in nvml.calls


@pytest.mark.parametrize("function, code, expected", [
    # an old driver or pynvml without the MIG calls: the GPU is shown, its instances n/a
    ("nvmlDeviceGetMaxMigDeviceCount", pynvml.NVML_ERROR_FUNCTION_NOT_FOUND, None),
    ("nvmlDeviceGetMaxMigDeviceCount", pynvml.NVML_ERROR_NOT_SUPPORTED, None),
    # no permission to open the instances: none listed, no traceback
    ("nvmlDeviceGetMigDeviceHandleByIndex", pynvml.NVML_ERROR_NO_PERMISSION, ()),
])
def test_a_failing_mig_call_leaves_the_gpu_readable(function, code, expected):
    nvml = RecordedNvml(with_instances(recorded_a100())).fail(function, code)
    (gpu,) = NvmlSource(nvml=nvml).snapshot().gpus
    assert gpu.error is None and gpu.memory_total == 81920 * MiB
    assert gpu.mig_instances == expected


@pytest.mark.parametrize("function", ["nvmlDeviceGetAttributes", "nvmlDeviceGetGpuInstanceId"])
def test_an_unsupported_instance_field_is_n_a(function):
    nvml = RecordedNvml(with_instances(recorded_a100())).fail(function, pynvml.NVML_ERROR_NOT_SUPPORTED)
    (gpu,) = NvmlSource(nvml=nvml).snapshot().gpus
    field = "multiprocessors" if function == "nvmlDeviceGetAttributes" else "gpu_instance_id"
    assert {getattr(mig, field) for mig in gpu.mig_instances} == {None}
    assert [mig.memory_used for mig in gpu.mig_instances] == [12 * MiB] * 4


def test_a_gpu_lost_while_reading_its_instances_is_marked_lost():
    nvml = RecordedNvml(with_instances(recorded_a100())).fail("nvmlDeviceGetMigDeviceHandleByIndex",
                                                              pynvml.NVML_ERROR_GPU_IS_LOST)
    (gpu,) = NvmlSource(nvml=nvml).snapshot().gpus
    assert gpu.error and "fell off the bus" in gpu.error


# --- which instance CUDA sees ------------------------------------------------------------


def test_cuda_visible_devices_maps_mig_uuids_and_prefixes_to_torch_indices():
    gpus = with_instances(recorded_a100()).gpus
    # CUDA enumerates one MIG instance only, the first named (CUDA Programming Guide)
    assert mig_torch_indices(f"{UUIDS[2]},{UUIDS[0][:12]}", gpus) == {(0, 2): 0}
    assert mig_torch_indices(UUIDS[0][:12], gpus) == {(0, 0): 0}
    assert mig_torch_indices(f"{UUIDS[1]},MIG-00000000,{UUIDS[3]}", gpus) == {(0, 1): 0}  # CUDA stops there
    assert mig_torch_indices("0", gpus) == {} and mig_torch_indices(None, gpus) == {}
    # torch reads a list in its first entry's form: a MIG UUID after an ordinal or a GPU's is not read
    assert mig_torch_indices(f"0,{UUIDS[1]}", gpus) == {} and mig_torch_indices(f"GPU-0,{UUIDS[1]}", gpus) == {}
    assert mig_torch_indices(f"{UUIDS[1]},{UUIDS[1]}", gpus) == {}  # named twice: none
    assert mig_torch_indices(UUIDS[1], recorded_a100().gpus) == {}  # no UUIDs known: no match


# --- the card ----------------------------------------------------------------------------


def instance_rows(text: str) -> list:
    """The card's "  MIG N" rows, each with the lines it is folded onto (80 columns) joined back."""
    rows = []
    for line in text.splitlines():
        if line.startswith("  MIG "):
            rows.append(line)
        elif rows and rows[-1] is not None and line.startswith(" " * 14):
            rows[-1] += " " + line.strip()
        elif rows and rows[-1] is not None:
            rows.append(None)  # the instance rows have ended
    return [row for row in rows if row is not None]


def test_gpu_status_from_the_recording_shows_one_row_per_instance(shown, clean_env):
    text, html = shown(f"--from {A100}")
    rows = instance_rows(text)
    assert rows == [f"  MIG {index}       12 MiB used / 19.50 GiB, GPU instance {gi}, compute instance 0, 14 SMs"
                    for index, gi in enumerate((3, 4, 5, 6))]
    assert html.count("MIG ") >= 4 and \
        "12&nbsp;MiB used / 19.50&nbsp;GiB, GPU instance 6, compute instance 0, 14 SMs" in html
    assert "uuid" not in "".join(rows)  # nvidia-smi's XML has none: not a row of n/a


def test_gpu_status_marks_the_instance_cuda_visible_devices_names(shown, clean_env, monkeypatch):
    live(with_instances(recorded_a100()), monkeypatch)
    clean_env.setenv("CUDA_VISIBLE_DEVICES", UUIDS[2])
    text, html = shown()
    assert "GPU 0  NVIDIA A100-SXM4-80GB  (torch runs on its MIG instance 2,\n       compute capability 8.0, MIG on)" in text
    rows = {line.split()[1]: line for line in instance_rows(text)}
    assert rows["2"].endswith("uuid MIG-9a7b3c1d, cuda:0 of this process (CUDA_VISIBLE_DEVICES)")
    assert [key for key, row in rows.items() if "cuda:" in row] == ["2"]
    assert "uuid MIG-1d4f6a0e" in rows["0"]
    assert "torch runs on its MIG instance 2" in html and html.count("cuda:0 of this process") == 1


def test_two_mig_instances_named_give_torch_the_first_only(shown, clean_env, monkeypatch):
    """CUDA_VISIBLE_DEVICES=MIG-<a>,MIG-<b> (a pod given two slices): CUDA enumerates a single
    MIG instance (NVIDIA's CUDA Programming Guide), so torch has cuda:0 and no cuda:1, but the
    card called the second slice "cuda:1 of this process"."""
    live(with_instances(recorded_a100()), monkeypatch)
    clean_env.setenv("CUDA_VISIBLE_DEVICES", f"{UUIDS[2]},{UUIDS[0]}")
    text, html = shown()
    rows = {line.split()[1]: line for line in instance_rows(text)}
    assert rows["2"].endswith("cuda:0 of this process (CUDA_VISIBLE_DEVICES)")
    assert "cuda:1" not in text and "cuda:1" not in html
    assert "(torch runs on its MIG instance 2," in text


def test_json_holds_the_instances_and_which_one_torch_sees(shell, clean_env, monkeypatch, capsys):
    live(with_instances(recorded_a100()), monkeypatch)
    clean_env.setenv("CUDA_VISIBLE_DEVICES", UUIDS[2])
    shell.run_line_magic("gpu_status", "--json")
    data = json.loads(capsys.readouterr().out)
    assert data["mig_torch_index_of"] == {"0:2": 0}
    instances = data["snapshot"]["gpus"][0]["mig_instances"]
    assert [mig["uuid"] for mig in instances] == list(UUIDS) and instances[3]["gpu_instance_id"] == 6


def test_a_mig_uuid_on_no_instance_of_this_gpu_hides_it(shown, clean_env, monkeypatch):
    """Every instance's UUID is known and none is the one named: torch cannot run here."""
    live(with_instances(recorded_a100()), monkeypatch)
    clean_env.setenv("CUDA_VISIBLE_DEVICES", "MIG-77777777-0000-5000-8000-000000000000")
    text, _ = shown()
    assert "GPU 0  NVIDIA A100-SXM4-80GB  (hidden from torch, compute capability 8.0,\n       MIG on)" in text
    assert "cuda:0 of this process" not in text


# --- advice ------------------------------------------------------------------------------


def test_a_full_instance_named_by_cuda_visible_devices_is_advised_on(shown, clean_env, monkeypatch):
    """The parent A100 is nearly empty (50 MiB of 80 GiB); the slice this kernel runs on is full."""
    live(with_instances(recorded_a100(), filled(1)), monkeypatch)
    clean_env.setenv("CUDA_VISIBLE_DEVICES", UUIDS[1])
    text, html = shown()
    advice = ("tip: MIG instance 1 of GPU 0 is 95% full, not by torch in this kernel (it has not started "
              "CUDA): other processes hold it. Stop them")
    assert advice in " ".join(text.split()) and "MIG instance 1 of GPU 0 is 95% full" in html  # text folds advice


def test_a_full_instance_of_another_user_is_not_advised_on(shown, clean_env, monkeypatch):
    live(with_instances(recorded_a100(), filled(3)), monkeypatch)
    clean_env.setenv("CUDA_VISIBLE_DEVICES", UUIDS[1])
    text, _ = shown()
    assert "  MIG 3       18.53 GiB used / 19.50 GiB" in text  # read, and not this kernel's slice
    assert "full" not in text


def test_a_recording_with_a_full_instance_is_advised_on(shown, clean_env, tmp_path):
    """From a file every instance is judged, and the full one is named (the parent's 50 MiB
    of 80 GiB said nothing). The file is the recording with instance 3's memory filled. It is
    another machine's: the advice was "%clear_cache --vars shows which variables hold the
    memory", which lists this kernel's variables, none of which hold the recorded memory."""
    text = A100.read_text()
    fourth = text.index("<mig_device>", text.index("<index>3</index>") - 60)
    full = text[fourth:].replace("<used>12 MiB</used>", "<used>18970 MiB</used>", 1) \
                        .replace("<free>19955 MiB</free>", "<free>998 MiB</free>", 1)
    (tmp_path / "full.xml").write_text(text[:fourth] + full)
    out, html = shown(f"--from {tmp_path / 'full.xml'}")
    assert ("tip: MIG instance 3 of GPU 0 was 95% full when recorded: on that machine little more fits "
            "until the processes holding it free memory or stop.") in " ".join(out.split())  # folded at 80
    assert "%clear_cache" not in out and "%clear_cache" not in html
    assert "  MIG 3       18.53 GiB used / 19.50 GiB" in out and "MIG instance 3 of GPU 0 was 95% full" in html
