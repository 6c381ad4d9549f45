"""Each advice rule: it fires where it should and stays quiet where it should not."""
import dataclasses
import re

import pytest

from colab_gpu.advice import RULES, advise
from colab_gpu.devices import GPU, GPUProcess, GiB, MiB, Snapshot
from colab_gpu.devices.nvml import NO_PYNVML
from colab_gpu.runtime import Runtime, TorchState
from colab_gpu.torch_view import MemoryBreakdown, Status, TorchMemory

# Values of the real Tesla T4 recording (shared/data/nvidia-smi-xml/tesla-t4.xml).
T4 = GPU(index=0, name="Tesla T4", uuid="GPU-t4", compute_capability=(7, 5), memory_total=15360 * MiB,
         memory_used=1032 * MiB, memory_free=13939 * MiB, memory_reserved=388 * MiB, clock_event_reasons=())
A100 = GPU(index=0, name="NVIDIA A100-SXM4-80GB", uuid="GPU-a100", compute_capability=(8, 0),
           memory_total=81920 * MiB, memory_used=1 * MiB, memory_free=81000 * MiB, clock_event_reasons=())
P100 = GPU(index=0, name="Tesla P100-PCIE-16GB", compute_capability=(6, 0))
NO_TORCH = TorchState(imported=False)
CUDA_TORCH = TorchState(imported=True, version="2.11.0+cu128", cuda_version="12.8", cuda_initialized=True)


def make_status(gpus=(), platform="jupyter", torch=CUDA_TORCH, tpu=None, visible=None, order="FASTEST_FIRST",
                problem=None, memory=(), parts=(), recorded=False, hint=None):
    runtime = Runtime(platform=platform, accelerator_hint=hint, tpu_type=tpu, torch=torch,
                      cuda_visible_devices=visible, cuda_device_order=order)
    # A recording is another machine's: this one's CUDA_VISIBLE_DEVICES hides none of its GPUs (torch_view).
    index_of = {} if visible == "" and not recorded else {gpu.index: i for i, gpu in enumerate(gpus)}
    return Status(runtime=runtime, snapshot=Snapshot(source="test", gpus=tuple(gpus), problem=problem, recorded=recorded),
                  torch_index_of=index_of, torch_memory=tuple(memory), breakdown=tuple(parts))


def fired(status):
    """The advice as %gpu_status shows it (inside the magic, which names the magics)."""
    from colab_gpu.spelling import as_magic

    with as_magic():
        return {advice.rule: advice.message for advice in advise(status)}


def test_every_rule_has_a_test_below():
    tested = {name[len("test_"):].split("__")[0] for name in globals() if name.startswith("test_")}
    assert {rule.name for rule in RULES} <= tested


def test_colab_no_gpu():
    message = fired(make_status(platform="colab", problem="the NVIDIA driver is not loaded"))["colab_no_gpu"]
    assert "Runtime > Change runtime type > T4 GPU" in message
    assert "colab_no_gpu" not in fired(make_status([T4], platform="colab"))


def test_colab_no_gpu__on_a_gpu_runtime_is_not_told_to_pick_a_gpu():
    """COLAB_GPU=1: Colab gave this runtime a GPU, so "change the runtime type" cannot help."""
    from colab_gpu.devices.nvml import NO_PYNVML

    driver = fired(make_status(platform="colab", hint="gpu", problem="the NVIDIA driver is not loaded"))
    assert "Change runtime type" not in driver["colab_no_gpu"]
    assert "COLAB_GPU=1" in driver["colab_no_gpu"] and "Disconnect and delete runtime" in driver["colab_no_gpu"]
    lost = dataclasses.replace(T4, error="a GPU fell off the bus: restart the runtime or the machine")
    assert "Disconnect and delete runtime" in fired(make_status([lost], platform="colab", hint="gpu"))["colab_no_gpu"]
    module = fired(make_status(platform="colab", hint="gpu", problem=NO_PYNVML))["colab_no_gpu"]
    assert "pip install nvidia-ml-py" in module and "Disconnect" not in module
    assert "colab_no_gpu" not in fired(make_status([T4, lost], platform="colab", hint="gpu"))
    cpu = fired(make_status(platform="colab", hint="none"))["colab_no_gpu"]
    assert "Change runtime type" in cpu and "usage limit" in cpu


def test_kaggle_no_gpu():
    assert "GPU T4 x2" in fired(make_status(platform="kaggle"))["kaggle_no_gpu"]
    assert "kaggle_no_gpu" not in fired(make_status([T4, dataclasses.replace(T4, index=1)], platform="kaggle"))


def test_no_gpu_found():
    message = fired(make_status(problem="the NVML library (libnvidia-ml.so) was not found"))["no_gpu_found"]
    assert "CPU" in message and "libnvidia-ml.so" not in message  # the status says why, once
    assert "no_gpu_found" not in fired(make_status(platform="colab"))  # Colab's own rule speaks there
    assert "no_gpu_found" not in fired(make_status([T4]))


def test_tpu_runtime():
    status = fired(make_status(platform="colab", tpu="v2-8"))
    assert "torch_xla" in status["tpu_runtime"]
    assert "colab_no_gpu" not in status


def test_visible_devices_hide_all():
    assert "CUDA_VISIBLE_DEVICES=''" in fired(make_status([T4], visible=""))["visible_devices_hide_all"]
    assert "visible_devices_hide_all" not in fired(make_status([T4], visible="0"))


def test_device_order_differs():
    mixed = [A100, dataclasses.replace(T4, index=1)]
    assert "PCI_BUS_ID" in fired(make_status(mixed))["device_order_differs"]
    assert "device_order_differs" not in fired(make_status(mixed, order="PCI_BUS_ID"))
    assert "device_order_differs" not in fired(make_status([T4, dataclasses.replace(T4, index=1)]))


def test_cpu_torch_on_gpu_machine():
    cpu_torch = TorchState(imported=True, version="2.13.0+cpu")
    assert "CPU-only" in fired(make_status([T4], torch=cpu_torch))["cpu_torch_on_gpu_machine"]
    assert "cpu_torch_on_gpu_machine" not in fired(make_status([T4]))
    assert "cpu_torch_on_gpu_machine" not in fired(make_status([], torch=cpu_torch))
    rocm_torch = TorchState(imported=True, version="2.5.1+rocm6.2", hip_version="6.2.41133-dd7f95766")
    assert "cpu_torch_on_gpu_machine" not in fired(make_status([T4], torch=rocm_torch))  # not a CPU-only build


@pytest.mark.parametrize("installed, fires", [("2.13.0+cpu", True), ("2.11.0+cu128", False)])
def test_cpu_torch_on_gpu_machine__from_installed_metadata_without_importing(tmp_path, monkeypatch, installed, fires):
    """torch is not imported in this status, so the rule reads the installed distribution's
    version from its metadata (here a dist-info found first on sys.path) instead of importing torch."""
    info = tmp_path / f"torch-{installed}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: torch\nVersion: {installed}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert ("cpu_torch_on_gpu_machine" in fired(make_status([T4], torch=NO_TORCH))) is fires


def memory(**changes):
    values = dict(torch_index=0, nvml_index=0, allocated=4 * GiB, reserved=5 * GiB, peak_allocated=6 * GiB,
                  peak_reserved=7 * GiB, inactive_split=0, num_ooms=0, num_alloc_retries=0)
    values.update(changes)
    return TorchMemory(**values)


def test_had_oom():
    assert "%clear_cache" in fired(make_status([T4], memory=[memory(num_ooms=2)]))["had_oom"]
    assert "ran out of memory 1 time:" in fired(make_status([T4], memory=[memory(num_ooms=1)]))["had_oom"]
    assert "had_oom" not in fired(make_status([T4], memory=[memory()]))


def test_fragmentation():
    fragmented = memory(allocated=2 * GiB, reserved=6 * GiB)
    assert "expandable_segments=True" in fired(make_status([T4], memory=[fragmented]))["fragmentation"]
    assert "fragmentation" in fired(make_status([T4], memory=[memory(num_alloc_retries=3)]))
    assert "unallocated, 1 cache flush): after" in fired(make_status([T4], memory=[memory(num_alloc_retries=1)]))[
        "fragmentation"]
    assert "fragmentation" not in fired(make_status([T4], memory=[memory()]))  # 1 GiB of 5 cached: normal


def test_fragmentation__with_expandable_segments_already_on_is_not_told_to_restart_for_it(monkeypatch):
    """Colab: %alloc_conf expandable_segments=True (saved, or run once CUDA ran), and still
    fragmented: the tip said to restart the runtime and set what was already set."""
    fragmented = [memory(allocated=2 * GiB, reserved=6 * GiB, num_alloc_retries=3)]
    for name in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PYTORCH_ALLOC_CONF", "max_split_size_mb:128,expandable_segments:True")
    message = fired(make_status([T4], platform="colab", memory=fragmented))["fragmentation"]
    assert message == ("cuda:0 is fragmented (4.0 GiB reserved but unallocated, 3 cache flushes), with "
                       "expandable_segments already on (PYTORCH_ALLOC_CONF): %clear_cache gives back "
                       "the cached memory no tensor uses.")
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:False")  # torch reads this one first
    assert "after a runtime restart run %alloc_conf expandable_segments=True" in fired(
        make_status([T4], platform="colab", memory=fragmented))["fragmentation"]


def test_fragmentation__on_rocm_reads_expandable_segments_where_rocm_torch_reads_it(monkeypatch):
    """A ROCm torch 2.9 with expandable_segments:True in PYTORCH_HIP_ALLOC_CONF, the variable
    it reads: the tip said to restart the runtime and set what was already set."""
    import torch

    fragmented = [memory(allocated=2 * GiB, reserved=6 * GiB, num_alloc_retries=3)]
    for name in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PYTORCH_HIP_ALLOC_CONF", "expandable_segments:True")
    monkeypatch.setattr(torch.version, "hip", "6.4.43482")
    monkeypatch.setattr(torch.version, "cuda", None)  # as a ROCm build has, whatever the installed one's
    monkeypatch.setattr(torch, "__version__", "2.9.1+rocm6.4")
    assert "already on (PYTORCH_HIP_ALLOC_CONF)" in fired(make_status([T4], memory=fragmented))["fragmentation"]
    monkeypatch.setattr(torch.version, "hip", None)  # a CUDA build never reads it
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(torch, "__version__", "2.9.1+cu128")
    assert "already on" not in fired(make_status([T4], memory=fragmented))["fragmentation"]


def test_the_torch_row_says_1_oom_and_1_cache_flush():
    from colab_gpu.render import allocator_summary

    assert allocator_summary(memory(num_ooms=1, num_alloc_retries=1)).endswith("; 1 OOM, 1 cache flush")
    assert allocator_summary(memory(num_ooms=2, num_alloc_retries=3)).endswith("; 2 OOMs, 3 cache flushes")


def test_memory_nearly_full():
    full = dataclasses.replace(T4, memory_used=14900 * MiB, memory_free=72 * MiB)
    assert "%clear_cache --vars" in fired(make_status([full]))["memory_nearly_full"]
    assert "memory_nearly_full" not in fired(make_status([T4]))


def test_memory_nearly_full__held_by_another_process_when_this_kernel_has_not_started_cuda():
    """No variable of this kernel can hold GPU memory before CUDA starts: %clear_cache --vars
    would list nothing; the holder is another process."""
    held = dataclasses.replace(T4, memory_used=14900 * MiB, memory_free=72 * MiB,
                               processes=(GPUProcess(pid=999, name="python3", used_memory=14800 * MiB),))
    message = fired(make_status([held], torch=NO_TORCH))["memory_nearly_full"]
    assert "%clear_cache" not in message
    assert "not by torch in this kernel" in message and "pid 999 python3, 14.45 GiB" in message


def test_memory_nearly_full__a_gpu_this_kernel_does_not_use_is_not_blamed_on_its_variables():
    """A shared box: another user's job fills GPU 0. With CUDA_VISIBLE_DEVICES=1 this kernel
    cannot even see it; without, torch runs on cuda:1 and holds nothing on cuda:0. Either way
    %clear_cache --vars would list nothing."""
    full = dataclasses.replace(T4, memory_used=14900 * MiB, memory_free=72 * MiB,
                               processes=(GPUProcess(pid=4242, name="python3", used_memory=14000 * MiB),))
    mine = dataclasses.replace(T4, index=1, uuid="GPU-t4-1")
    hidden = make_status([full, mine], visible="1",
                         memory=[TorchMemory(0, 1, GiB, 2 * GiB, GiB, 2 * GiB, 0, 0, 0)])
    hidden = dataclasses.replace(hidden, torch_index_of={1: 0})
    assert "memory_nearly_full" not in fired(hidden)
    unused = make_status([full, mine], memory=[TorchMemory(0, 0, 0, 0, 0, 0, 0, 0, 0),
                                               TorchMemory(1, 1, GiB, 2 * GiB, GiB, 2 * GiB, 0, 0, 0)])
    message = fired(unused)["memory_nearly_full"]
    assert "%clear_cache" not in message
    assert "not by torch in this kernel (it holds nothing on cuda:0)" in message and "pid 4242" in message
    used = make_status([full, mine], memory=[TorchMemory(0, 0, GiB, 13 * GiB, GiB, 13 * GiB, 0, 0, 0)])
    assert "%clear_cache --vars" in fired(used)["memory_nearly_full"]


def test_memory_nearly_full__a_recording_names_its_holder_not_this_kernels_variables():
    """%gpu_status --from someone's capture of a full T4 advised "%clear_cache --vars", which lists
    this kernel's variables (or "torch is not imported yet"), none of which hold the recorded memory."""
    held = dataclasses.replace(T4, memory_used=14900 * MiB, memory_free=72 * MiB,
                               processes=(GPUProcess(pid=999, name="python3", used_memory=14800 * MiB),))
    for torch in (CUDA_TORCH, NO_TORCH):
        message = fired(make_status([held], torch=torch, recorded=True))["memory_nearly_full"]
        assert "%clear_cache" not in message and "this kernel" not in message
        assert message.startswith("GPU 0 was 97% full when recorded (largest: pid 999 python3, 14.45 GiB)")


def test_other_processes():
    part = MemoryBreakdown(nvml_index=0, total=15 * GiB, driver_reserved=None, other_processes=3 * GiB,
                           context_and_non_torch=300 * MiB, torch_cache=0, torch_tensors=0, free=11 * GiB)
    assert "3.0 GiB" in fired(make_status([T4], parts=[part]))["other_processes"]
    quiet = dataclasses.replace(part, other_processes=None)
    assert "other_processes" not in fired(make_status([T4], parts=[quiet]))


def test_throttled():
    hot = dataclasses.replace(T4, clock_event_reasons=("power cap", "thermal (hardware)"))
    assert "power cap" in fired(make_status([hot]))["throttled"]
    idle = dataclasses.replace(T4, clock_event_reasons=("idle",))
    assert "throttled" not in fired(make_status([idle]))


def test_throttled__every_slowed_gpu_of_a_server_is_named():
    """8 GPUs, 3 and 6 held back: naming GPU 3 alone hid the other one pacing the whole run."""
    reasons = {3: ("power cap",), 6: ("thermal (software)", "power cap")}
    gpus = [dataclasses.replace(T4, index=i, clock_event_reasons=reasons.get(i, ())) for i in range(8)]
    assert fired(make_status(gpus))["throttled"] == (
        "GPUs 3 (power cap), 6 (power cap, thermal (software)) are slowing their clocks: "
        "expect lower throughput than their peak.")


def test_throttled__not_said_of_a_gpu_hidden_from_torch():
    """A shared pair of T4s, this kernel on GPU 1 (CUDA_VISIBLE_DEVICES=1), another user's job
    holding GPU 0 at its power cap: the card told the user to expect lower throughput, though
    nothing of theirs runs on GPU 0."""
    capped = dataclasses.replace(T4, clock_event_reasons=("power cap",))
    mine = dataclasses.replace(T4, index=1, uuid="GPU-t4-1")
    shared = dataclasses.replace(make_status([capped, mine], visible="1"), torch_index_of={1: 0})
    assert "throttled" not in fired(shared)
    assert "throttled" not in fired(make_status([capped], visible=""))  # torch sees no GPU at all
    assert fired(make_status([capped, mine]))["throttled"].startswith("GPU 0 is slowing its clocks (power cap)")


def test_had_oom__on_each_gpu_that_ran_out():
    memories = [memory(num_ooms=2), dataclasses.replace(memory(num_ooms=1), torch_index=1, nvml_index=1)]
    assert fired(make_status([T4, dataclasses.replace(T4, index=1)], memory=memories))["had_oom"].startswith(
        "cuda:0 ran out of memory 2 times, cuda:1 ran out of memory 1 time: ")


def test_several_gpus():
    """Kaggle's "GPU T4 x2": torch uses the second T4 only when told to."""
    two = [T4, dataclasses.replace(T4, index=1, uuid="GPU-t4-2")]
    message = fired(make_status(two, platform="kaggle"))["several_gpus"]
    assert "torch sees 2 GPUs" in message and "DataParallel" in message and "notebook_launcher" in message
    assert "several_gpus" not in fired(make_status([T4]))
    assert "several_gpus" not in fired(make_status(two, recorded=True))  # another machine's run
    lost = dataclasses.replace(two[1], error="a GPU fell off the bus")
    assert "several_gpus" not in fired(make_status([T4, lost]))


def test_mig_mode():
    """The real A100 recording is in MIG mode: 80 GiB shown, but a process gets one instance."""
    message = fired(make_status([dataclasses.replace(A100, mig_enabled=True)]))["mig_mode"]
    assert "CUDA_VISIBLE_DEVICES=MIG-<uuid>" in message and "not the whole 80 GiB" in message
    assert "mig_mode" not in fired(make_status([A100]))


def test_visible_devices_changed():
    """Set after CUDA started: says which value torch keeps, and that a restart takes the new one."""
    status = dataclasses.replace(make_status([T4, T4], visible="1"), visible_devices_changed=(None, True))
    message = fired(status)["visible_devices_changed"]
    assert message.startswith("CUDA_VISIBLE_DEVICES is unset now, but CUDA started under '1'")
    assert "restart the kernel" in message
    assert "visible_devices_changed" not in fired(make_status([T4, T4], visible="1"))
    assert "visible_devices_changed" not in fired(dataclasses.replace(status, snapshot=dataclasses.replace(
        status.snapshot, recorded=True)))


def test_visible_devices_hide_all__not_said_of_mig_instances():
    """CUDA_VISIBLE_DEVICES=MIG-<uuid> names an instance, which NVML's GPU list does not hold."""
    mig = dataclasses.replace(A100, mig_enabled=True)
    visible = "MIG-6cbb7a6c-9f2b-5b5e-8d4b-5c0a1f8e2d10"
    status = dataclasses.replace(make_status([mig], visible=visible), torch_index_of={})
    assert "visible_devices_hide_all" not in fired(status)


def test_turing_fp16():
    message = fired(make_status([T4]))["turing_fp16"]
    assert "float16" in message and "GradScaler" in message and "not bf16" in message
    assert "turing_fp16" not in fired(make_status([A100]))


def test_ampere_bf16():
    assert "bfloat16" in fired(make_status([A100]))["ampere_bf16"]
    assert "ampere_bf16" not in fired(make_status([A100, dataclasses.replace(T4, index=1)]))


def test_pre_volta():
    cu126 = dataclasses.replace(CUDA_TORCH, version="2.11.0+cu126", cuda_version="12.6")  # has sm_60 kernels
    assert "tensor cores" in fired(make_status([P100], torch=cu126))["pre_volta"]
    assert "pre_volta" not in fired(make_status([T4]))


@pytest.mark.parametrize("visible", ["", "-1", "GPU-00000000-0000-0000-0000-000000000000"])
def test_turing_fp16__not_for_a_t4_cuda_visible_devices_hides_from_torch(clean_env, visible):
    """The real T4 recording under CUDA_VISIBLE_DEVICES="" (or -1, or a UUID of no GPU here):
    torch sees no GPU, yet the card told the user to train with autocast in float16 on it.
    What matters there is the warning that torch sees none."""
    from colab_gpu.devices.nvml import NvmlSource
    from colab_gpu.gpu_status import status
    from conftest import DATA
    from nvml_recording import RecordedNvml

    def advice():
        source = NvmlSource(nvml=RecordedNvml.from_recording(DATA / "nvidia-smi-xml" / "tesla-t4.xml"))
        return {advice.rule: advice.message for advice in status(source).advice}

    assert "turing_fp16" in advice()  # every GPU visible: the tip stands
    clean_env.setenv("CUDA_VISIBLE_DEVICES", visible)
    hidden = advice()
    assert not {"turing_fp16", "ampere_bf16", "pre_volta"} & set(hidden)
    assert hidden["visible_devices_hide_all"].startswith(f"CUDA_VISIBLE_DEVICES={visible!r} hides every GPU from torch")


def test_ampere_bf16__speaks_of_the_gpu_torch_sees_not_a_hidden_one():
    """An A100 and a T4, CUDA_VISIBLE_DEVICES=0 (PCI order): torch runs on the A100 only, where bf16 is right."""
    box = [A100, dataclasses.replace(T4, index=1)]
    status = dataclasses.replace(make_status(box, visible="0", order="PCI_BUS_ID"), torch_index_of={0: 0})
    advice = fired(status)
    assert "bfloat16" in advice["ampere_bf16"] and "turing_fp16" not in advice


KAGGLE_TORCH = TorchState(imported=True, version="2.11.0+cu128", cuda_version="12.8")  # Colab's image, Kaggle's too


def test_torch_lacks_kernels():
    """Kaggle's GPU P100 (6.0) under the torch of Colab's image (cu128, kernels from 7.0): the
    card said only that mixed precision gains little speed there; torch cannot run on it at all."""
    advice = fired(make_status([P100], platform="kaggle", torch=KAGGLE_TORCH))
    message = advice["torch_lacks_kernels"]
    assert message.startswith("torch 2.11.0+cu128 has no kernels for GPU 0 (Tesla P100-PCIE-16GB, "
                              "compute capability 6.0): PyTorch's CUDA 12.8 builds start at compute capability 7.0")
    assert "no kernel image is available" in message and "Settings > Accelerator > GPU T4 x2" in message
    assert not {"pre_volta", "turing_fp16", "ampere_bf16"} & set(advice)  # no tip for a GPU torch cannot use
    local = fired(make_status([P100], torch=KAGGLE_TORCH))["torch_lacks_kernels"]
    assert "pip install torch==2.11.0 --index-url https://download.pytorch.org/whl/cu126" in local
    v100 = dataclasses.replace(P100, name="Tesla V100-SXM2-16GB", compute_capability=(7, 0))
    cu130 = TorchState(imported=True, version="2.13.0+cu130", cuda_version="13.0")
    assert "CUDA 13.0 builds start at compute capability 7.5" in fired(make_status([v100], torch=cu130))["torch_lacks_kernels"]
    for quiet in (make_status([T4], platform="kaggle", torch=KAGGLE_TORCH),
                  make_status([v100], torch=KAGGLE_TORCH),
                  make_status([P100], torch=dataclasses.replace(KAGGLE_TORCH, version="2.11.0+cu126")),
                  make_status([P100], torch=dataclasses.replace(KAGGLE_TORCH, version="2.7.1+cu128")),  # not judged
                  make_status([P100], torch=dataclasses.replace(KAGGLE_TORCH, version="2.11.0")),  # conda-forge's
                  dataclasses.replace(make_status([P100, dataclasses.replace(T4, index=1)], torch=KAGGLE_TORCH,
                                                  visible="1", order="PCI_BUS_ID"), torch_index_of={1: 0}),
                  make_status([P100], torch=KAGGLE_TORCH, recorded=True)):
        assert "torch_lacks_kernels" not in fired(quiet)


def test_cuda_not_started():
    assert "%alloc_conf" in fired(make_status([T4], torch=NO_TORCH))["cuda_not_started"]
    assert "cuda_not_started" not in fired(make_status([T4]))


def test_cuda_not_started__after_import_torch_does_not_promise_the_backend():
    """torch imported, CUDA not started: the card promised "every allocator setting", and
    %alloc_conf backend=... then refused it (torch reads backend at import)."""
    imported = dataclasses.replace(CUDA_TORCH, cuda_initialized=False)
    message = fired(make_status([T4], torch=imported))["cuda_not_started"]
    assert message.endswith("every allocator setting but backend, which torch fixed when it was imported.")


def test_a_recording_gets_no_advice_about_this_machine():
    """A pasted nvidia-smi file says nothing about the local torch, variables or runtime."""
    recorded = fired(make_status([T4], torch=NO_TORCH, visible="", recorded=True))
    assert "turing_fp16" in recorded
    assert not {"cpu_torch_on_gpu_machine", "cuda_not_started", "visible_devices_hide_all"} & set(recorded)
    assert "colab_no_gpu" not in fired(make_status(platform="colab", recorded=True))


FULL_T4 = dataclasses.replace(T4, memory_used=14900 * MiB, memory_free=72 * MiB)


@pytest.mark.parametrize("rule, status, python, magic", [
    ("colab_no_gpu", dict(platform="colab", hint="gpu", problem=NO_PYNVML),
     "then run colab_gpu.status() again.", "then run %gpu_status again."),
    ("no_gpu_found", dict(problem="the NVML library (libnvidia-ml.so) was not found"),
     "colab_gpu.live.start(demo=True) runs the monitor", "%gpu_status --live --demo shows the monitor"),
    ("fragmentation", dict(gpus=[T4], memory=[memory(allocated=2 * GiB, reserved=6 * GiB)]),
     "run colab_gpu.alloc_conf('expandable_segments=True') before", "run %alloc_conf expandable_segments=True before"),
    ("had_oom", dict(gpus=[T4], memory=[memory(num_ooms=2)]),
     "colab_gpu.clear_cache() frees what the failed cell still holds; colab_gpu.find_batch() finds",
     "%clear_cache frees what the failed cell still holds; %%find_batch finds"),
    ("memory_nearly_full", dict(gpus=[FULL_T4]), "colab_gpu.memory_holders() shows", "%clear_cache --vars shows"),
    ("cuda_not_started", dict(gpus=[T4], torch=NO_TORCH), "colab_gpu.alloc_conf() can still change",
     "%alloc_conf can still change"),
])
def test_advice_names_the_command_as_the_caller_runs_it(rule, status, python, magic, monkeypatch):
    """print(colab_gpu.status()) in a script advised "%clear_cache --vars", a magic the author
    never used; %gpu_status still names the magics."""
    for name in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):  # expandable_segments not on yet
        monkeypatch.delenv(name, raising=False)
    said = {advice.rule: advice.message for advice in advise(make_status(**status))}[rule]
    assert python in said and not re.search(r"%[a-z]", said)
    assert magic in fired(make_status(**status))[rule]
