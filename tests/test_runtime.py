"""Runtime detection from the real signals each platform gives."""
import sys
import types

import pytest

from colab_gpu.devices import GPU
from colab_gpu.runtime import (COLAB, JUPYTER, KAGGLE, BINDER, PLAIN_PYTHON, TERMINAL, detect_platform,
                               TorchState, detect_runtime, detect_tpu, torch_indices, torch_state, wheel_build)

# A real partial env dump from a Colab GPU runtime (shared/data/colab/env-partial-dumps_servalshell.txt).
COLAB_GPU_ENV = {"COLAB_GPU": "1", "COLAB_BACKEND_VERSION": "next", "COLAB_RELEASE_TAG": "release-colab_20240626-060133_RC00"}


def shell_of(module, name):
    """An instance of a class defined in ``module``: detection reads only the class's identity."""
    return type(name, (), {"__module__": module})()


def test_colab_shell_class_is_the_strongest_sign():
    assert detect_platform(shell_of("google.colab._shell", "Shell"), {}) == COLAB


def test_colab_from_its_environment():
    assert detect_platform(None, COLAB_GPU_ENV) == COLAB


def test_kaggle_wins_over_the_colab_tag_it_inherits():
    env = dict(COLAB_GPU_ENV, KAGGLE_KERNEL_RUN_TYPE="Interactive")
    assert detect_platform(None, env) == KAGGLE


def test_binder_jupyter_terminal_and_plain_python():
    assert detect_platform(None, {"BINDER_SERVICE_HOST": "10.0.0.1"}) == BINDER
    assert detect_platform(shell_of("ipykernel.zmqshell", "ZMQInteractiveShell"), {}) == JUPYTER
    assert detect_platform(shell_of("IPython.terminal.interactiveshell", "TerminalInteractiveShell"), {}) == TERMINAL
    assert detect_platform(None, {}) == PLAIN_PYTHON


def test_the_real_test_shell_is_a_terminal(ipython, clean_env):
    assert detect_runtime(ipython).platform == TERMINAL


@pytest.mark.parametrize("env, expected", [
    ({"TPU_ACCELERATOR_TYPE": "v2-8"}, "v2-8"),
    ({"COLAB_TPU_1VM": "1"}, "TPU"),
    ({"PJRT_DEVICE": "TPU"}, "TPU"),
    ({"PJRT_DEVICE": "CUDA"}, None),
    ({}, None),
])
def test_tpu_detection(env, expected):
    assert detect_tpu(env) == expected


def test_kaggle_tpu_vm_is_a_tpu_runtime_not_a_missing_gpu(shell, clean_env, capsys):
    """Kaggle's TPU image sets ISTPUVM=1 and, since 2025-09, no TPU_ACCELERATOR_TYPE
    (Kaggle/docker-python tpu/Dockerfile, 7c24d22): the card told a user who picked the TPU that the
    notebook has no GPU and to switch the accelerator to GPU T4 x2."""
    clean_env.setenv("KAGGLE_KERNEL_RUN_TYPE", "Interactive")
    clean_env.setenv("ISTPUVM", "1")
    clean_env.setenv("TPU_PROCESS_ADDRESSES", "local")
    runtime = detect_runtime(None)
    assert (runtime.platform, runtime.tpu_type, runtime.accelerator_hint) == (KAGGLE, "TPU", "tpu")
    shell.run_line_magic("gpu_status", "")
    out = capsys.readouterr().out
    assert "This is a TPU runtime (TPU)" in out
    assert "has no GPU" not in out and "GPU T4 x2" not in out


def test_accelerator_hint_on_colab_cpu_runtime(clean_env):
    clean_env.setenv("COLAB_RELEASE_TAG", "release-colab")
    clean_env.setenv("COLAB_GPU", "0")
    runtime = detect_runtime(None)
    assert (runtime.platform, runtime.accelerator_hint) == (COLAB, "none")


def test_torch_state_without_torch_imports_nothing():
    assert torch_state({}) == torch_state({}).__class__(imported=False)


def test_torch_state_of_the_real_installed_build():
    """The test environments' torch (a CPU build, or Colab's CUDA build on a machine without a
    GPU), read without starting CUDA."""
    import torch

    state = torch_state(sys.modules)
    assert state.imported and state.version == torch.__version__
    assert state.cuda_version == torch.version.cuda and state.cuda_built is (torch.version.cuda is not None)
    assert state.cuda_initialized is False
    assert torch.cuda.is_initialized() is False


def test_torch_state_reports_initialized_cuda_from_torch_itself():
    fake_torch = types.SimpleNamespace(__version__="2.11.0+cu128", version=types.SimpleNamespace(cuda="12.8"),
                                       cuda=types.SimpleNamespace(is_initialized=lambda: True))
    state = torch_state({"torch": fake_torch})
    assert state.cuda_built and state.cuda_initialized and state.cuda_version == "12.8"


@pytest.mark.parametrize("version, build", [
    (types.SimpleNamespace(cuda="12.8", hip=None), "cuda"),
    (types.SimpleNamespace(cuda=None, hip="6.2.41133-dd7f95766"), "rocm"),
    (types.SimpleNamespace(cuda=None, hip=None), "cpu"),
])
def test_one_rule_says_which_torch_build_is_imported(version, build):
    """The card, the advice, %%find_batch --device and %alloc_conf read the build from here."""
    assert torch_state({"torch": types.SimpleNamespace(__version__="2.8.0", version=version)}).build == build
    assert torch_state({}).build is None
    assert TorchState(imported=True, mps_available=True).build == "mps"  # a Mac's torch reaching its GPU


@pytest.mark.parametrize("version, build", [("2.8.0+rocm6.4", "rocm"), ("2.5.1+cpu", "cpu"),
                                            ("2.5.1+cu121", "cuda"), ("2.5.1", None), (None, None)])
def test_the_build_of_a_torch_not_imported_is_read_from_its_version_tag(version, build):
    assert wheel_build(version) == build


GPUS = [GPU(index, "Tesla T4", uuid) for index, uuid in ((0, "GPU-aaaa-1111"), (1, "GPU-bbbb-2222"), (2, "GPU-cccc-3333"))]


@pytest.mark.parametrize("visible, expected", [
    (None, {0: 0, 1: 1, 2: 2}),
    ("", {}),
    ("-1", {}),
    ("2,0", {2: 0, 0: 1}),
    ("1, 2", {1: 0, 2: 1}),
    ("GPU-bbbb", {1: 0}),
    ("GPU-cccc-3333,0", {2: 0}),  # the first entry's form only: "Ordinals are not included in GPUid set"
    ("1,GPU-cccc", {1: 0}),  # nor UUIDs in a list of ordinals
    ("1gpu,2ampere", {1: 0, 2: 1}),  # ordinals read as strtoul reads them (torch.cuda._parse_visible_devices)
    ("+2, -0", {2: 0, 0: 1}),
    ("0,7,1", {0: 0}),  # CUDA stops at the first entry it cannot resolve
    ("0,0", {}),  # a GPU named twice: none visible (torch.cuda._parse_visible_devices)
    ("2,0,2", {}),
    ("GPU-bbbb,GPU-bbbb-2222", {}),
    ("GPU-", {}),  # ambiguous prefix
])
def test_cuda_visible_devices_mapping(visible, expected):
    assert torch_indices(visible, GPUS) == expected


def test_the_running_shell_is_found_without_being_passed(ipython, clean_env):
    """colab_gpu.status() called in a cell knows where it runs, like %gpu_status does."""
    assert detect_runtime().platform == TERMINAL


def test_no_shell_and_no_ipython_is_plain_python(clean_env):
    from colab_gpu.runtime import current_shell

    assert current_shell({}) is None


def test_a_rocm_torch_is_not_called_a_cpu_only_build(monkeypatch):
    """A ROCm build of torch (AMD GPUs, through torch.cuda) has no torch.version.cuda but a
    torch.version.hip: the card said "torch 2.5.1+rocm6.2 (CPU-only build), CUDA initialized"."""
    import torch

    import colab_gpu
    from conftest import DATA

    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setattr(torch.version, "hip", "6.2.41133-dd7f95766")
    status = colab_gpu.status(DATA / "nvidia-smi-xml" / "tesla-t4.xml")
    first_line = str(status).splitlines()[0]
    assert "(ROCm 6.2.41133-dd7f95766)" in first_line and "CPU-only" not in first_line
    assert "CPU-only" not in status._repr_html_()
    assert status.runtime.torch.hip_version == "6.2.41133-dd7f95766"  # --json says it too
