"""One answer where there were two: which GPUs torch sees, how a chart line is thinned, what is a
replay, and what the live monitor reads.

GPUs are real recordings (tests/data): the A100 in MIG mode of a100-sxm4-v12.xml, the Tesla T4
of tesla-t4.xml, the V100 trace; NVML is the recording-fed stand-in of tests/nvml_recording.py,
so NvmlSource's own code runs.
"""
from __future__ import annotations

import dataclasses

import pytest

import colab_gpu
from colab_gpu.live.panel import torch_labels
from colab_gpu.live.sampler import Sampler

from test_mig import filled, live, recorded_a100, shown, with_instances  # noqa: F401 (shown: a fixture)

ELSEWHERE = "MIG-77777777-0000-5000-8000-000000000000"  # a MIG instance of no GPU here


# --- hidden from torch: the card, the advice, the live label and clear_cache agree ----------------


def without_uuids(change):
    return lambda mig: dataclasses.replace(change(mig), uuid=None)


@pytest.mark.parametrize("instances, card, maybe_this_kernels", [
    # NVML gave every instance's UUID and none is the one named: CUDA stops there, nothing is visible
    (lambda: with_instances(recorded_a100(), filled(3)), "hidden from torch", False),
    # the instances' UUIDs are unknown (as in nvidia-smi's XML): the named one may be any of them
    (lambda: with_instances(recorded_a100(), without_uuids(filled(3))),
     "hidden from torch unless the MIG instance in CUDA_VISIBLE_DEVICES is on it", True),
], ids=["uuids-not-matching", "uuids-removed"])
def test_a_mig_gpu_is_hidden_or_not_in_one_answer_everywhere(shell, shown, clean_env, monkeypatch,  # noqa: F811
                                                             instances, card, maybe_this_kernels):
    """Instance 3 is 95 % full. Before, the card said "hidden from torch" while the advice still
    sent the user after the full instance, and clear_cache read the hidden GPU as this kernel's."""
    source = live(instances(), monkeypatch)
    clean_env.setenv("CUDA_VISIBLE_DEVICES", ELSEWHERE)
    text, html = shown()
    words = " ".join(text.split())  # the text view folds advice at 80 columns
    assert f"GPU 0  NVIDIA A100-SXM4-80GB  ({card}, compute capability 8.0, MIG on)" in text
    assert ("tip: MIG instance 3 of GPU 0 is 95% full" in words) is maybe_this_kernels
    assert ("MIG instance 3 of GPU 0 is 95% full" in html) is maybe_this_kernels
    assert (f"CUDA_VISIBLE_DEVICES='{ELSEWHERE}' hides every GPU from torch" in words) is not maybe_this_kernels
    sampler = Sampler(source, interval=60).start()
    try:
        assert torch_labels(sampler) == {0: card}
    finally:
        sampler.stop()
    report = colab_gpu.clear_cache(shell=shell, source=source)
    assert ("GPU 0" in [reading.device for reading in report.before]) is maybe_this_kernels
