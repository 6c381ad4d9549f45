"""cuDNN's convolution workspace in a plan: the NCHW-to-NHWC transforms of a convolution on
tensor cores, counted where they have room and skipped where they do not (as torch falls back to
an algorithm that needs none). Real small conv nets under plan_batch, arithmetic by hand."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

from colab_gpu import plan_batch  # noqa: E402
from colab_gpu.batch.caching import replay  # noqa: E402
from colab_gpu.batch.gpus import GPUS, Gpu  # noqa: E402
from colab_gpu.batch.plan import ERROR_MARGIN  # noqa: E402

MiB = 1024 ** 2


def _blocks(nbytes: int) -> int:
    return -(-nbytes // 512) * 512


def _conv_inference(channels_last: bool):
    """A float16 3x3 convolution, 64 to 64 channels on 32x32 images, without autograd."""
    conv = nn.Conv2d(64, 64, 3, padding=1).half()

    def step(n):
        x = torch.randn(n, 64, 32, 32, device="cuda", dtype=torch.float16)
        if channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        with torch.no_grad():
            conv.to("cuda")(x)

    return conv, step


def test_a_float16_nchw_convolution_counts_its_operands_transformed_once_more():
    """The peak is the weights, the input, the output and the workspace holding all three in
    NHWC; from channels-last tensors cuDNN transforms nothing, so the same step lacks exactly
    the workspace."""
    n = 16
    tensor = n * 64 * 32 * 32 * 2
    weight, bias = 64 * 64 * 9 * 2, 64 * 2
    peaks = {}
    for channels_last in (False, True):
        _, step = _conv_inference(channels_last)
        (row,) = plan_batch(step, "T4", start=n, max=n).sizes
        peaks[channels_last] = row.allocated
    held = _blocks(weight) + _blocks(bias) + 2 * _blocks(tensor)
    assert peaks[True] == held
    assert peaks[False] == held + _blocks(2 * tensor + weight)


def test_a_training_step_counts_the_forward_and_both_gradients_workspaces():
    """Under autocast on an RTX 3090: the step's peak grows by the modelled workspace, which
    the same step from channels-last tensors, and the same float32 step on a T4 (no tensor cores
    for float32 before Ampere), does not take."""
    def conv_step(dtype_autocast: bool, channels_last: bool):
        model = nn.Sequential(nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(), nn.Conv2d(64, 64, 3, padding=1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

        def step(n):
            x = torch.randn(n, 64, 32, 32, device="cuda")
            if channels_last:
                x = x.contiguous(memory_format=torch.channels_last)
            with torch.autocast("cuda", dtype=torch.float16, enabled=dtype_autocast):
                loss = model.to("cuda")(x).float().sum()
            loss.backward()
            opt.step()
            opt.zero_grad()

        return step

    n = 32
    nchw = plan_batch(conv_step(True, False), "RTX3090", start=n, max=n).sizes[0].allocated
    nhwc = plan_batch(conv_step(True, True), "RTX3090", start=n, max=n).sizes[0].allocated
    activation = n * 64 * 32 * 32 * 2  # one float16 activation
    # the workspace lands where the step's tensors leave free room, but never all of it does
    assert activation <= nchw - nhwc <= 3 * activation + MiB  # at most one call's operands at once
    t4 = [plan_batch(conv_step(False, channels_last), "T4", start=n, max=n).sizes[0].allocated
          for channels_last in (False, True)]
    assert t4[0] == t4[1]


def test_a_workspace_without_room_is_skipped_not_out_of_memory():
    """A GPU with room for the step's tensors but not for the workspace beside them: the size
    still fits (torch runs an algorithm needing no workspace), and its peak is the tensors'."""
    n = 64
    _, step = _conv_inference(False)
    roomy = plan_batch(step, "T4", start=n, max=n).sizes[0]
    _, without = _conv_inference(True)
    tensors = plan_batch(without, "T4", start=n, max=n).sizes[0]
    assert roomy.peak > tensors.peak  # the workspace took a segment of its own
    context = GPUS["T4"].context
    tight = Gpu("tight T4", round((tensors.peak + MiB) / (1 - ERROR_MARGIN)), context, (7, 5))  # less its spare
    (row,) = plan_batch(step, tight, start=n, max=n).sizes
    assert row.fits and row.peak == tensors.peak


def test_an_optional_request_without_room_is_left_out_and_a_tensor_is_not():
    events = [(0, 6 * MiB), (1, 20 * MiB), (1, None), (2, 10 * MiB)]
    assert replay(events, 24 * MiB).out_of_memory
    kept = replay(events, 24 * MiB, optional={1})
    assert not kept.out_of_memory and kept.allocated == 16 * MiB
    assert replay(events, 24 * MiB, optional={2}).out_of_memory  # the 20 MiB request is a tensor
    assert replay(events, 48 * MiB, optional={1}).allocated == 26 * MiB  # with room, it counts


@pytest.mark.parametrize("gpu, dtype, tf32, expected", [
    ("T4", "float16", True, True), ("T4", "float32", True, False), ("T4", "bfloat16", True, False),
    ("A100-40GB", "float32", True, True), ("A100-40GB", "float32", False, False),
    ("RTX3090", "bfloat16", True, True), ("H100", "float64", True, False),
])
def test_which_convolutions_run_on_tensor_cores(gpu, dtype, tf32, expected):
    assert GPUS[gpu].tensor_cores(dtype, tf32) is expected
