"""%%find_batch and colab_gpu.find_batch: the classifier on real messages, the search on
real memory curves and on a real CPU allocator failure, and the notebook left as it was."""
from __future__ import annotations

import ast
import collections
import contextlib
import dataclasses
import json
import logging
import os
import random
import re
import signal
import statistics
import subprocess
import types
import sys
import time
import weakref

import pytest
from hypothesis import given, settings, strategies as st

from colab_gpu.batch import find_batch, is_out_of_memory
from colab_gpu.batch.result import FITS, OUT_OF_MEMORY, Trial
from colab_gpu.batch.search import Headroom, Search, SearchError
from colab_gpu.batch.state import assigned_names
from colab_gpu.oom import ErrorKind, classify
from colab_gpu.state import session
from conftest import DATA, ROOT
from milabench_replay import (CAPACITIES_GIB, HELD_OUT_GIB, Curve, ReplayDevice, claim_backed, distribution,
                              fit_problems, problems)

GiB = 1024 ** 3
MiB = 1024 ** 2

# --- the classifier on every recorded message -------------------------------------------
# What each recorded kind must be. cuDNN's EXECUTION_FAILED is a failed kernel, not a failed
# allocation: retrying smaller would hide it, so it stops the search as the user's error.
EXPECTED = {
    "cudnn_execution_failed": ErrorKind.OTHER,
}
MESSAGES = [json.loads(line) for line in (DATA / "oom_messages.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("record", MESSAGES, ids=[f"{i}-{m['kind']}" for i, m in enumerate(MESSAGES)])
def test_every_recorded_message_is_classified(record):
    expected = EXPECTED.get(record["kind"], ErrorKind.OUT_OF_MEMORY)
    if record["kind"].startswith("tf_"):
        # TensorFlow's errors cannot reach a torch search, but they are memory errors all the same.
        assert expected is ErrorKind.OUT_OF_MEMORY
    error = RuntimeError(record["text"])
    assert classify(error) is expected
    assert is_out_of_memory(error) is (expected is ErrorKind.OUT_OF_MEMORY)


def test_the_recording_covers_every_era():
    kinds = {m["kind"] for m in MESSAGES}
    assert len(MESSAGES) >= 17 and any(k.startswith("tf_") for k in kinds)
    assert {"cuda_runtime_oom_2.x", "cublas_alloc_failed", "cudnn_no_algo_oom_masked"} <= kinds


@pytest.mark.parametrize("text", [
    "cuDNN error: CUDNN_STATUS_ALLOC_FAILED", "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED. This error may appear if "
    "you passed in a non-contiguous input.", "FIND was unable to find an engine to execute this computation",
    "MPS backend out of memory (MPS allocated: 17.00 GB, other allocations: 1.2 GB, max allowed: 18.13 GB).",
    "XPU out of memory. Tried to allocate 20.00 MiB", "HIP out of memory. Tried to allocate 2.00 GiB",
    "[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you tried to "
    "allocate 197181440 bytes. Error code 12 (Cannot allocate memory)",
])
def test_other_variants_named_by_the_issue_are_oom(text):
    assert is_out_of_memory(RuntimeError(text))


# A oneDNN convolution at a shape not run before, under an address-space limit too tight for
# the 256 KiB mmap of its JIT code buffer (strace shows Xbyak::MmapAllocator::alloc refused with
# ENOMEM inside dnnl_primitive_create): the error find_batch met at CNN sizes that had run before
# a failed trial fragmented the address space.
ONEDNN_UNDER_LIMIT = """
import ctypes, resource, sys, torch
from colab_gpu.oom import classify
torch.set_num_threads(1)
libc = ctypes.CDLL(None)
libc.mallopt(-3, 64 * 1024 * 1024)  # M_MMAP_THRESHOLD: the tensors from the heap
libc.mallopt(-1, 256 * 1024 * 1024)  # M_TRIM_THRESHOLD: freed heap stays for them
torch.nn.functional.conv2d(torch.randn(2, 3, 64, 64), torch.randn(8, 3, 3, 3), padding=1)
y, w = torch.randn(2, 5, 48, 48), torch.randn(16, 5, 3, 3)  # a shape whose kernel is not made yet
spare = bytearray(32 * 1024 * 1024); del spare
with open("/proc/self/status") as status:
    size = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmSize"))
resource.setrlimit(resource.RLIMIT_AS, (size + int(sys.argv[1]) * 1024, resource.RLIM_INFINITY))
try:
    torch.nn.functional.conv2d(y, w, padding=1)
    print("ran")
except RuntimeError as error:
    print(classify(error).name, str(error))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS and glibc's mallopt are Linux's")
def test_onednn_could_not_create_a_primitive_under_an_address_space_limit_is_out_of_memory():
    import torch

    if not torch.backends.mkldnn.is_available():
        pytest.skip("this torch has no oneDNN")

    def run(room_kib):
        return subprocess.run([sys.executable, "-c", ONEDNN_UNDER_LIMIT, str(room_kib)], capture_output=True,
                              text=True, timeout=120, check=False, env={**os.environ, "PYTHONWARNINGS": "ignore"},
                              cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__)))).stdout.strip()

    assert run(64) == "OUT_OF_MEMORY could not create a primitive"  # 64 KiB: no room for the code buffer
    assert run(4096) == "ran"  # 4 MiB: the same convolution runs


def test_onednn_could_not_create_a_primitive_is_memory_only_under_an_address_space_limit(monkeypatch):
    """Without a limit the same words come from a CPU without AVX2 or a forked process: no
    smaller size would run, so the search must stop with the user's error, not halve to 1."""
    import resource

    recorded = RuntimeError("could not create a primitive")  # torch 2.13's, from the test above
    descriptor = RuntimeError("could not create a primitive descriptor for a convolution forward "
                              "propagation primitive")
    monkeypatch.setattr(resource, "getrlimit", lambda which: (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    assert classify(recorded) is classify(descriptor) is ErrorKind.OTHER
    monkeypatch.setattr(resource, "getrlimit", lambda which: (2 ** 30, resource.RLIM_INFINITY))
    assert classify(recorded) is ErrorKind.OUT_OF_MEMORY and is_out_of_memory(recorded)
    assert classify(descriptor) is ErrorKind.OTHER


def test_torch_class_and_wrapped_errors():
    import torch

    assert is_out_of_memory(torch.OutOfMemoryError("anything"))
    try:
        try:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory.")
        except RuntimeError as inner:
            raise ValueError("training failed") from inner
    except ValueError as outer:
        assert is_out_of_memory(outer)  # through __cause__
    try:
        try:
            raise RuntimeError("CUDA error: out of memory")
        except RuntimeError:
            raise KeyError("while handling")  # implicit __context__
    except KeyError as outer:
        assert is_out_of_memory(outer)
    assert not is_out_of_memory(ValueError("shapes (2,3) and (4,5) not aligned"))


def test_a_python_memory_error_is_out_of_memory_and_a_message_may_be_given():
    """NumPy's MemoryError is the CPU runtime's out-of-memory: the search must try smaller."""
    import numpy

    with pytest.raises(MemoryError) as caught:
        numpy.ones(2 ** 45, dtype=numpy.uint8)  # 32 TiB: refused by malloc, not a ValueError
    assert is_out_of_memory(caught.value)
    assert is_out_of_memory("CUDA out of memory. Tried to allocate 2.00 GiB")
    assert not is_out_of_memory("shapes (2,3) and (4,5) not aligned")
    with pytest.raises(TypeError, match="an exception or its message, not 3"):
        is_out_of_memory(3)


def test_a_cycle_in_the_chain_is_followed_once():
    """A chain user code tied into a loop (a handler re-raising the error it caught from)
    is read once round, not forever."""
    outer, inner = ValueError("training failed"), RuntimeError("CUDA error: out of memory")
    outer.__cause__, inner.__context__ = inner, outer
    assert is_out_of_memory(outer) and is_out_of_memory(inner)
    first, second = ValueError("a"), KeyError("b")
    first.__context__, second.__context__ = second, first
    assert classify(first) is ErrorKind.OTHER


@pytest.mark.parametrize("text", ["CUDA error: an illegal memory access was encountered",
                                  "CUDA error: device-side assert triggered"])
def test_broken_device_is_not_oom_even_when_wrapped_around_one(text):
    try:
        try:
            raise RuntimeError("CUDA out of memory.")
        except RuntimeError:
            raise RuntimeError(text)
    except RuntimeError as error:
        assert classify(error) is ErrorKind.DEVICE_BROKEN
        assert not is_out_of_memory(error)


# --- the pure search ---------------------------------------------------------------------
def blind(largest: int):
    """A device whose memory cannot be measured: only real failures tell."""
    sizes = []

    def run(size):
        sizes.append(size)
        return Trial(size, FITS if size <= largest else OUT_OF_MEMORY, seconds_per_step=0.01, runs=1)

    return run, sizes


@settings(max_examples=200, deadline=None)
@given(largest=st.integers(1, 50000), start=st.integers(1, 4096), multiple=st.sampled_from([1, 8, 64]))
def test_the_answer_always_ran_and_is_within_tolerance(largest, start, multiple):
    run, sizes = blind(largest)
    result = Search(run, start=start, multiple_of=multiple, maximum=100000).run()
    assert all(size % multiple == 0 for size in sizes)
    if largest < multiple:
        assert result.answer is None and "does not fit" in result.stopped
        return
    assert result.answer in sizes and result.answer <= largest
    assert result.answer >= min(0.95 * largest, largest - multiple + 1) - multiple
    assert len(set(sizes)) == len(sizes), "no size is run twice"


def test_grow_then_bisect_starts_small_and_respects_max():
    run, sizes = blind(10 ** 9)
    result = Search(run, maximum=1000).run()
    assert sizes[0] == 2 and max(sizes) == 1000 and result.answer == 1000
    assert result.stopped == "reached max=1000"


def test_samples_computed_counts_only_the_steps_that_completed():
    """A trial that ran out of memory counted size * runs samples "computed", its failed run
    included: more than the step ever finished, and not how benchmarks/find_batch_vs_peers.py
    counts the other tools' steps (once they complete)."""
    completed = collections.Counter()

    def step(batch_size):
        if batch_size > 96 or (batch_size > 48 and completed[batch_size]):  # later runs fail from 49
            raise MemoryError("out of memory")
        completed[batch_size] += 1

    result = find_batch(step, max=256, progress=False, measure_memory=False)
    assert any(t.outcome == OUT_OF_MEMORY and t.runs > 1 for t in result.trials)
    done = sum(size * runs for size, runs in completed.items())
    assert result.samples_computed == done
    assert f"{done} samples computed;" in str(result)


def test_flat_memory_refuses_the_fit_and_doubles():
    """A cell that ignores the variable: memory never grows; no fit, plain doubling to --max."""
    sizes = []

    def run(size):
        sizes.append(size)
        return Trial(size, FITS, peak_memory=3 * 1024 ** 3, capacity=16 * 1024 ** 3, seconds_per_step=0.01, runs=1)

    result = Search(run, maximum=4096).run()
    assert result.fit is None and any("did not grow" in note for note in result.notes)
    assert sizes[:4] == [2, 16, 128, 1024] and sizes[4:] == [2048, 4096]


def linear_memory(capacity: int, kills: bool, per_sample: int = 1024 ** 2):
    """A device whose memory grows by ``per_sample`` bytes a sample: what a size takes is
    known, and a size past ``capacity`` fails (or, where ``kills``, would end the process)."""
    sizes = []

    def run(size):
        sizes.append(size)
        peak = 256 * 1024 ** 2 + size * per_sample
        if peak > capacity:
            assert not kills, f"{size} went past memory where that gets the process killed"
            return Trial(size, OUT_OF_MEMORY, capacity=capacity, runs=1)
        return Trial(size, FITS, peak_memory=peak, capacity=capacity, capacity_kills=kills,
                     seconds_per_step=0.01, runs=1)

    return run, sizes


def test_on_the_cpu_without_an_address_space_limit_a_tenth_of_memory_is_kept_free():
    """Without ulimit -v, Linux overcommits and its OOM killer ends the kernel (Colab's
    "session crashed") instead of torch raising: the search aimed at 98 % of memory and went
    past it whenever the fit was short. By default 10 % stays free there, and the report says
    why; --headroom 0 still uses it all, and a GPU (which raises) keeps none by default."""
    run, sizes = linear_memory(12 * GiB, kills=True)
    result = Search(run).run()
    assert max(256 * MiB + size * MiB for size in sizes) <= 0.9 * 12 * GiB
    assert result.answer >= 0.95 * (0.9 * 12 * GiB - 256 * MiB) / MiB
    assert result.usable == int(0.9 * 12 * GiB) and "usable with headroom 10.80 GiB" in str(result)
    assert any(note.startswith("headroom='10%' by default on the CPU") for note in result.notes)

    run, sizes = linear_memory(12 * GiB, kills=False)  # a GPU, or an address-space limit
    result = Search(run).run()
    assert result.answer >= 0.95 * (12 * GiB - 256 * MiB) / MiB and result.usable == 12 * GiB
    assert not result.notes

    sizes = []
    small = Search(lambda size: sizes.append(size) or Trial(
        size, FITS, peak_memory=256 * MiB + size * 1024, capacity=12 * GiB, capacity_kills=True,
        seconds_per_step=0.01, runs=1), maximum=4096).run()
    assert small.answer == 4096 and not small.notes  # memory never bounded it: nothing to say


def test_the_cpus_default_headroom_is_named_in_throughput_mode_only_where_it_bounded_the_answer():
    """Throughput mode: where samples/s stopped paying at 8 (3 % of memory), the report said the
    10 % kept free bounded the answer; where the memory fit's top ended the search from two
    sizes a sample apart (177, 178: the fit the result shows is none), it said nothing."""
    def slow(size):  # time grows with the size: samples/s flat, memory far from full
        return Trial(size, FITS, peak_memory=256 * MiB + size * 100 * MiB, capacity=12 * GiB,
                     capacity_kills=True, seconds_per_step=size / 1000, runs=1)

    result = Search(slow, mode="throughput").run()
    assert result.answer == 2 and result.stopped.startswith("doubling to 4 and 8 gained less")
    assert not any(note.startswith("--headroom 10% by default") for note in result.notes)

    curve, capacity = next((curve, capacity) for label, curve, capacity in problems()
                           if label == "H100/convnext_large-fp16@40GiB")
    device = ReplayDevice(curve, capacity)
    result = Search(lambda size: dataclasses.replace(device(size), capacity_kills=True),
                    mode="throughput").run()
    assert result.stopped == f"the memory fit says batch_size={result.answer} is as large as fits"
    assert max(curve(size) for size in device.sizes_run) <= 0.9 * capacity
    assert any(note.startswith("headroom='10%' by default") for note in result.notes)


def test_an_explicit_headroom_replaces_the_cpus_default():
    run, _ = linear_memory(12 * GiB, kills=True)
    result = Search(run, headroom="1GiB").run()
    assert result.usable == 11 * GiB and not result.notes


def test_a_cpu_trial_says_whether_going_past_memory_kills():
    """The gauge's fact the default rests on: here (no ulimit -v) it does."""
    import resource

    from colab_gpu.batch.trial import run_trial

    trial, _ = run_trial(lambda size: None, 2, steps=1, device="cpu")
    unlimited = resource.getrlimit(resource.RLIMIT_AS)[0] == resource.RLIM_INFINITY
    assert trial.capacity and trial.capacity_kills == unlimited


def test_a_fit_that_a_failure_proved_wrong_is_not_followed_again():
    """Memory grows slowly to 100, then steeply: the fit from small sizes overshoots far. Once a
    size has failed, a success below it still yields a fit that says "far above": following it
    meant retrying one under the failure, an out-of-memory error per step. Bisect instead."""
    curve = Curve([(1, GiB), (100, 2 * GiB), (110, 16 * GiB)])
    device = ReplayDevice(curve, 8 * GiB)
    result = Search(device).run()
    failures = [t.size for t in result.trials if not t.fits]
    assert not any(size - 1 in failures for size in failures), "no retry just under a failure"
    assert result.out_of_memory_count <= 5 and len(result.trials) <= 11
    assert result.answer in device.sizes_run and result.answer >= 0.95 * curve.largest_under(8 * GiB)


def test_throughput_mode_stops_when_doubling_stops_paying():
    def run(size):  # samples/s saturates at 64
        return Trial(size, FITS, seconds_per_step=max(size, 64) / 1000, runs=3)

    result = Search(run, mode="throughput").run()
    assert [t.size for t in result.trials] == [2, 4, 8, 16, 32, 64, 128, 256]
    assert result.answer == 64
    assert result.stopped == "doubling to 128 and 256 gained less than 5% samples/s over 64"


def test_throughput_mode_answers_the_size_the_later_ones_did_not_pay_over():
    """Past 64 samples/s creep up 1 % a doubling, timing noise: the stop line said doubling to
    128 and 256 gained less than 5 % over 64, and the answer was 256, the numerically fastest,
    for four times the memory."""
    def run(size):
        creep = 1 + 0.01 * max(0, size.bit_length() - 7)  # +1 % at 128, +2 % at 256
        return Trial(size, FITS, seconds_per_step=max(size, 64) / 1000 / creep, runs=3)

    result = Search(run, mode="throughput").run()
    assert result.stopped == "doubling to 128 and 256 gained less than 5% samples/s over 64"
    assert result.answer == result.fastest == 64


def test_throughput_mode_is_not_stopped_by_one_slow_trial():
    """A scheduler hiccup or a background job slows one trial down: that is noise, not the plateau."""
    def run(size):  # saturates at 256, but the trial at 16 was slowed down to look no better than 8
        seconds = max(size, 256) / 1000 * (2 if size == 16 else 1)
        return Trial(size, FITS, seconds_per_step=seconds, runs=3)

    result = Search(run, mode="throughput").run()
    assert result.answer == 256 and [t.size for t in result.trials][-3:] == [256, 512, 1024]


def test_throughput_mode_looks_between_the_last_doubling_and_the_size_that_failed():
    """samples/s still grows when doubling 1024 runs out of memory: 1500 fits and is 19 % faster.
    The search stopped at the failure, answering 1024 as the fastest; from a --start above what
    fits it tried 2047, just under a known failure, and stopped there too. It bisects now."""
    def run(size):  # 10 ms a step plus 10 µs a sample; more than 1500 runs out of memory
        if size > 1500:
            return Trial(size, OUT_OF_MEMORY, runs=1)
        return Trial(size, FITS, seconds_per_step=0.01 + size * 1e-5, runs=3)

    for start in (None, 4096):
        result = Search(run, mode="throughput", start=start).run()
        assert 0.95 * 1500 <= result.answer <= 1500 and result.answer == result.fastest
        assert 2047 not in [t.size for t in result.trials]
        assert result.stopped == f"batch_size=1536 did not fit, and {result.answer} is within 5% of it"


def test_throughput_mode_between_sizes_keeps_the_patience_rule():
    def run(size):  # samples/s flat from 256 on; more than 700 runs out of memory
        if size > 700:
            return Trial(size, OUT_OF_MEMORY, runs=1)
        return Trial(size, FITS, seconds_per_step=max(size, 256) / 1000, runs=3)

    result = Search(run, mode="throughput").run()
    assert result.answer == 256 and [t.size for t in result.trials][-4:] == [512, 1024, 768, 640]
    assert result.stopped == "going up to 512 and 640 gained less than 5% samples/s over 256"


def test_throughput_mode_does_not_double_past_the_memory_fit_into_out_of_memory_errors():
    """convnext_large on a 40 GiB H100: the fit sends 128 to 198, its refit to 199. Two sizes a
    sample apart grow less than the noise, so no refit came, and the search doubled to 398: an
    out-of-memory error, then five more bisecting back down to 199. The fit from 199 and a size
    that used measurably less still says 199 is the top."""
    curve, capacity = next((curve, capacity) for label, curve, capacity in problems()
                           if label == "H100/convnext_large-fp16@40GiB")
    result = Search(ReplayDevice(curve, capacity), mode="throughput").run()
    assert result.out_of_memory_count == 0 and result.answer == curve.largest_under(capacity) == 199
    # the report that says "the memory fit says" shows that fit, in its facts and its chart
    assert result.stopped == "the memory fit says batch_size=199 is as large as fits"
    assert result.fit is not None and result.fit.sizes[1] == 199 and "memory fit: " in str(result)


def test_throughput_mode_on_recorded_curves_reaches_the_largest_size_when_it_is_the_fastest():
    """A step of constant time: samples/s grow with the size, so the fastest is the largest that
    fits. On milabench's curves the search stopped at the first failure (or below the fit's top)
    and answered under 95 % of it on 107 of 230 problems."""
    results = [(Search(ReplayDevice(curve, capacity), mode="throughput").run(), curve.largest_under(capacity))
               for _, curve, capacity in problems()]
    assert sum(result.answer >= 0.95 * largest for result, largest in results) >= 225
    assert max(result.out_of_memory_count for result, _ in results) <= 4
    assert statistics.mean(result.out_of_memory_count for result, _ in results) < 0.7


def test_throughput_mode_stopped_by_the_memory_fit_says_it_is_the_fit_that_says_so():
    """recursiongfn on a 16 GiB MI325: the fit from 32 and 64 puts the top at 111; 139 fits in
    truth. Nothing failed, yet the report said "reached the largest size that fits"."""
    curve, capacity = next((curve, capacity) for label, curve, capacity in problems()
                           if label == "MI325/recursiongfn@16GiB")
    result = Search(ReplayDevice(curve, capacity), mode="throughput").run()
    assert result.out_of_memory_count == 0 and result.answer < curve.largest_under(capacity)
    assert result.stopped == f"the memory fit says batch_size={result.answer} is as large as fits"


def test_throughput_mode_that_reaches_max_says_so():
    result = Search(lambda size: Trial(size, FITS, seconds_per_step=0.01, runs=3),
                    mode="throughput", maximum=16).run()
    assert result.answer == 16 and result.stopped == "reached max=16"


@pytest.mark.parametrize("options, message", [
    (dict(maximum=4, start=6), "max=4 is below start=6"),
    (dict(maximum=90, start=100, multiple_of=8), "max=90 is below start=100 (96 as a multiple of 8)"),
])
def test_a_max_below_the_first_size_names_what_set_that_size(options, message):
    with pytest.raises(SearchError, match=f"^{re.escape(message)}$"):
        Search(lambda size: Trial(size, FITS), **options)


@pytest.mark.parametrize("options, message", [
    (dict(multiple_of=99999999999),
     "multiple_of=99999999999 leaves no batch size to try up to 65536, the largest size tried without max: "
     "give multiple_of=65536 or less, or max=99999999999 or more"),
    (dict(start=3, max=4, multiple_of=8),
     "multiple_of=8 leaves no batch size to try from start=3 to max=4: give multiple_of=4 or less, or max=8 or more"),
    (dict(max=4, multiple_of=8),
     "multiple_of=8 leaves no batch size to try up to max=4: give multiple_of=4 or less, or max=8 or more"),
])
def test_a_multiple_of_above_the_largest_size_is_refused_before_anything_runs(options, message):
    """multiple_of=99999999999 ran the step at 99999999999, above the largest size tried (65536
    without max); start=3, max=4, multiple_of=8 said "max=4 is below start=3 as a multiple of 8, 8"."""
    sizes = []
    with pytest.raises(SearchError) as refused:
        find_batch(sizes.append, progress=False, **options)
    assert str(refused.value) == message and sizes == []


def test_a_multiple_of_up_to_the_largest_size_is_taken():
    assert find_batch(lambda size: None, progress=False, max=8, multiple_of=8).answer == 8
    assert find_batch(lambda size: None, progress=False, multiple_of=65536).answer == 65536


def test_a_start_or_max_between_multiples_is_rounded_and_the_report_says_so(shell, capsys):
    # --start 5 --multiple-of 4 started at 4 without a word: rounded as --max is, and said.
    result = Search(lambda size: Trial(size, FITS), start=5, maximum=30, multiple_of=4).run()
    assert result.trials[0].size == 4 and max(t.size for t in result.trials) == 28
    assert result.notes == ("start=5 is not a multiple of 4: the first size tried is 4",
                            "max=30 is not a multiple of 4: sizes go up to 28")
    shell.run_cell("%%find_batch --start 5 --max 8 --multiple-of 4\nx = [0] * batch_size")
    assert "--start 5 is not a multiple of 4: the first size tried is 4" in capsys.readouterr().out
    assert not Search(lambda size: Trial(size, FITS), start=8, maximum=32, multiple_of=4).notes


def test_a_max_below_the_default_first_size_is_the_only_size_tried():
    result = Search(lambda size: Trial(size, FITS), maximum=1).run()
    assert [t.size for t in result.trials] == [1] and result.answer == 1


def test_throughput_with_one_step_says_when_a_time_includes_the_warm_up():
    slow = find_batch(lambda size: time.sleep(0.1), mode="throughput", max=4, steps=1, progress=False)
    assert [t.runs for t in slow.trials] == [1, 1]
    assert any(note.startswith("steps=1: a step of 0.05 s or more ran once or twice") for note in slow.notes)
    assert "warm-up" in str(slow)
    fast = find_batch(lambda size: None, mode="throughput", max=8, steps=1, progress=False)
    assert not fast.notes and all(t.runs > 1 for t in fast.trials)  # many runs: the median is warm
    assert not find_batch(lambda size: None, mode="throughput", max=8, progress=False).notes


def test_throughput_times_a_fast_step_for_a_tenth_of_a_second_and_max_mode_runs_steps_only():
    """Sizes 5 % apart are compared: the median of two 100 µs runs is decided by one hiccup.
    Each run's own duration is recorded, so a loaded machine (slower sleeps) changes the count
    of runs, not the verdict: the timed runs (all but the warm-up) stop once they reach 0.1 s."""
    durations = collections.defaultdict(list)

    def step(size):
        began = time.perf_counter()
        time.sleep(0.002)
        durations[size].append(time.perf_counter() - began)

    result = find_batch(step, mode="throughput", max=8, progress=False)
    for trial in result.trials:
        timed = durations[trial.size][1:]
        assert trial.runs == len(durations[trial.size])
        # Where the machine made the timed runs disagree, they ran once more, as many of them.
        first = timed[:len(timed) // 2] if sum(timed[:-1]) >= 0.1 else timed
        assert sum(first[:-1]) < 0.1 and sum(first) > 0.09, (trial.size, timed)
        assert len(timed) in (len(first), 2 * len(first)), (trial.size, timed)
    runs = collections.Counter()
    result = find_batch(lambda size: runs.update([size]), max=8, progress=False)
    assert set(runs.values()) == {3} and [t.runs for t in result.trials] == [3, 3]
    runs.clear()
    find_batch(lambda size: runs.update([size]), mode="throughput", max=2, progress=False)
    assert runs[2] == 1000  # a step of nothing: the cap, not a tenth of a second of runs


def test_broken_device_stops_and_says_restart():
    def run(size):
        return Trial(size, "device broken" if size > 8 else FITS, seconds_per_step=0.01, runs=1,
                     error="RuntimeError: CUDA error: an illegal memory access was encountered")

    result = Search(run).run()
    assert result.answer == 8 and "restart the runtime" in result.stopped
    assert [t.size for t in result.trials] == [2, 4, 8, 16]


def test_headroom_larger_than_the_device_says_so_after_one_trial():
    device = ReplayDevice(Curve([(1, GiB), (100, 2 * GiB)]), 4 * GiB)
    result = Search(device, headroom="1000GiB").run()
    assert device.sizes_run == [2] and result.answer is None
    assert result.summary() == ("no batch_size found: headroom='1000GiB' keeps all of the "
                                "device's 4.00 GiB free: no size can fit")
    # What is left to use is nothing, not a negative amount ("usable with headroom -996.00 GiB").
    assert result.usable == 0 and "capacity: 4.00 GiB, usable with headroom 0 B" in str(result)


def test_a_headroom_that_could_not_be_applied_says_so(monkeypatch):
    """Where memory cannot be measured (macOS, measure_memory=False) the headroom was dropped
    without a word: the report read as if 10 % had been kept free."""
    result = find_batch(lambda size: None, max=8, headroom="10%", measure_memory=False, progress=False)
    assert result.answer == 8
    # measure_memory=False is why, not the machine: "could not be measured here" sent users
    # looking for what their device lacked
    assert ("headroom='10%' was not applied: measure_memory=False measures no memory, so only "
            "out-of-memory errors decided what fits") in result.notes
    assert not find_batch(lambda size: None, max=8, measure_memory=False, progress=False).notes
    from colab_gpu.batch.trial import CpuGauge

    monkeypatch.setattr(CpuGauge, "available", staticmethod(lambda: False))  # macOS
    result = find_batch(lambda size: None, max=8, headroom="10%", progress=False)
    assert ("headroom='10%' was not applied: memory could not be measured here, so only "
            "out-of-memory errors decided what fits") in result.notes


def test_the_progress_says_running_and_counts_in_english():
    seen = []
    run, _ = blind(100)
    Search(run, variable="bs", on_trial=lambda search: seen.append(search.result().summary())).run()
    assert seen[0] == "searching bs: 2 fits so far (1 trial, 0 out of memory)"
    assert seen[1] == "searching bs: 4 fits so far (2 trials, 0 out of memory)"


def test_headroom_spelling():
    assert Headroom("512MiB").usable(1024 ** 3) == 512 * 1024 ** 2
    assert Headroom("10%").usable(1000) == 900
    for bad in ("12x", "-5%", "150%"):
        with pytest.raises(SearchError, match=f"^headroom='{re.escape(bad)}': "):
            Headroom(bad)


@pytest.mark.parametrize("spec, advice", [
    ("10", r"write 10% for a share of device memory, or a unit like 512MiB or 2GiB \(10b keeps 10 bytes\)"),
    (20, "write 20% for a share"), ("1000000", r"write a unit like 512MiB or 2GiB \(1000000b keeps")])
def test_a_headroom_number_without_a_unit_below_a_mebibyte_is_refused_not_taken_as_bytes(spec, advice):
    """--headroom 10 was taken as 10 bytes, which keeps nothing free: the user meant 10% (or
    10 GiB). Bytes without a unit still work where they can mean something; 0 is none."""
    with pytest.raises(SearchError, match=f"is less than one allocation; {advice}"):
        Headroom(spec)
    assert Headroom("2097152").usable(8 * 1024 ** 2) == 6 * 1024 ** 2
    assert Headroom("10b").usable(100) == 90 and Headroom("0").is_zero


# --- the memory fit on milabench's real curves ---------------------------------------------
def search_every_real_curve(start_of=lambda largest: None, capacities_gib=CAPACITIES_GIB):
    """Search every fit problem; each answer must have run and fitted, and the sentence each
    search ended on must be backed by its trials. (trials, out-of-memory errors, answer / true
    largest) per curve."""
    outcomes = []
    for label, curve, capacity, largest in fit_problems(capacities_gib):
        device = ReplayDevice(curve, capacity)
        result = Search(device, start=start_of(largest)).run()
        assert result.answer in device.sizes_run and curve(result.answer) <= capacity, label
        assert claim_backed(result.stopped, result.answer, [(t.size, t.outcome) for t in result.trials]), \
            (label, result.stopped)
        outcomes.append((len(result.trials), result.out_of_memory_count, result.answer / largest))
    return outcomes


def test_memory_fit_on_real_milabench_curves():
    """Every answer ran, within capacity, >= 95 % of the truth, and proven: a size at most 5 %
    above it failed. The median search takes 4 trials: 2 and 16 measured, the fit's prediction,
    and the size 5 % to the other side of it. Issue #6's "at most 4 trials on every curve" is
    retired: the proof needs a trial on each side of the top (the old search ended 132 of 144
    within 4 trials by taking the fit's word for the second), and some curves jump where no fit
    from small sizes can see it (recursiongfn: 16 GiB reached at 144 where the fit from 2 and
    16 says ~490: 10 trials). The distribution is printed (-s), and recorded in the README.
    """
    trials, out_of_memory, ratios = zip(*search_every_real_curve())
    print(f"\nmilabench, {len(trials)} problems: trials {distribution(trials)}; "
          f"{statistics.mean(out_of_memory):.2f} out-of-memory errors a search")
    assert len(trials) == 144 and min(ratios) >= 0.95
    assert statistics.median(trials) <= 4 and max(trials) <= 12
    assert statistics.mean(out_of_memory) < 2  # the one that proves, and about as often one more


def test_memory_fit_holds_at_capacities_it_was_not_tuned_on():
    """Every 2 GiB from 12 to 80 but 16/24/40/80 (1129 problems): every answer >= 95 % of the
    truth and proven (the old search stopped on a local fit under 95 % on 14 of them, the worst
    at 80 %), with a median of 4 trials."""
    trials, out_of_memory, ratios = zip(*search_every_real_curve(capacities_gib=HELD_OUT_GIB))
    print(f"\nmilabench held out, {len(trials)} problems: trials {distribution(trials)}; "
          f"{statistics.mean(out_of_memory):.2f} out-of-memory errors a search")
    assert len(trials) == 1129 and min(ratios) >= 0.95
    assert statistics.median(trials) <= 4 and max(trials) <= 12
    assert statistics.mean(out_of_memory) < 2


def test_starting_above_what_fits_measures_below_instead_of_bisecting_blind():
    """--start 3x the answer: two halvings fail, the first success is measured against a size
    4x smaller, the fit places the next, and a failure at most 5 % above the answer proves it:
    6 trials on 118 of 144 curves (5 before proofs were required, the fit's word taken for the
    last step). Bisecting blind from the first success took a median of 6 trials and 3.0
    out-of-memory errors here without proving anything, and fell short of 95 % on 5 curves
    (and 8 trials, 7 of them out of memory, from 4x on a real H200)."""
    trials, out_of_memory, ratios = zip(*search_every_real_curve(start_of=lambda largest: 3 * largest))
    print(f"\nmilabench from 3x, {len(trials)} problems: trials {distribution(trials)}")
    assert min(ratios) >= 0.95
    assert statistics.median(trials) <= 6 and sum(t <= 6 for t in trials) >= 110
    assert sum(out_of_memory) <= 3.2 * len(out_of_memory)  # two halvings and the proof, mostly


# --- real allocator failures on the CPU ----------------------------------------------------
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS and /proc are Linux's")
def test_real_cpu_out_of_memory_boundary():
    """A real MLP under a real address-space limit: the answer runs and is >= 90 % of the largest."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MALLOC_MMAP_THRESHOLD_": "65536"}
    done = subprocess.run([sys.executable, str(ROOT / "tests" / "rlimit_mlp.py"), "192", "128", "512", "2"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.splitlines()[-1])
    assert found["answer_runs"]
    assert found["answer"] >= 0.9 * found["largest"], found
    assert len(found["trials"]) <= 8 and found["oom"] <= 2, found
    assert not found["notes"], found  # under a limit torch raises: no default headroom


# --- the Python API ------------------------------------------------------------------------
def test_find_batch_restores_model_optimizer_and_generators():
    import torch

    model = torch.nn.Linear(16, 16)
    optimizer = torch.optim.Adam(model.parameters())
    weights = model.weight.detach().clone()
    random.seed(5)
    torch.manual_seed(5)
    expected = (random.random(), torch.rand(1).item())
    random.seed(5)
    torch.manual_seed(5)

    def step(batch_size):
        torch.rand(1)
        random.random()
        model(torch.randn(batch_size, 16)).sum().backward()
        optimizer.step()
        if batch_size > 300:
            raise RuntimeError("CUDA out of memory. Tried to allocate 20.00 MiB")

    result = find_batch(step, restore=[model, optimizer], max=1000, progress=False)
    assert 285 <= result.answer <= 300 and result.out_of_memory_count >= 1
    assert torch.equal(model.weight, weights) and model.weight.grad is None and not optimizer.state
    assert (random.random(), torch.rand(1).item()) == expected


def test_a_cell_that_starts_cuda_leaves_the_cuda_generators_as_cuda_starts(monkeypatch):
    """torch.manual_seed(5), then a search whose cell starts CUDA and draws on it: the CUDA
    generators were left where the trials' draws took them, so the user's first CUDA draw
    after the search differed from the one without it. Only the CUDA device is faked: its
    is_initialized flag, and its generators (real torch.Generator objects, seeded as
    torch.manual_seed seeds CUDA's when CUDA starts)."""
    import torch

    started = []
    generators = (torch.Generator().manual_seed(5), torch.Generator().manual_seed(5))
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: bool(started))
    monkeypatch.setattr(torch.cuda, "default_generators", generators)
    first_draw = torch.randn(4, generator=torch.Generator().manual_seed(5))

    def step(batch_size):
        started.append(True)  # the cell's first .cuda() starts CUDA
        torch.randn(batch_size, generator=generators[0])
        torch.randn(batch_size, generator=generators[1])

    result = find_batch(step, device="cpu", max=8, progress=False)
    assert result.answer == 8 and started
    for generator in generators:
        assert torch.equal(torch.randn(4, generator=generator), first_draw)


def test_restore_none_restores_nothing():
    """find_batch(fn, restore=None) was refused: "a NoneType has no state_dict()"."""
    result = find_batch(lambda size: None, restore=None, max=4, progress=False)
    assert result.answer == 4


def test_an_optimizer_that_has_trained_and_pending_gradients_are_restored_as_they_were():
    """After a few training steps Adam holds state, and gradients may be accumulating. On the
    CPU (and for Adam's step counts anywhere) load_state_dict keeps the tensors it is given,
    and a parameter took the saved gradient itself: each trial then changed the saved state
    in place, and the user's training went on from what the trials left."""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Linear(8, 8)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    for _ in range(3):
        model(torch.randn(4, 8)).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
    model(torch.randn(4, 8)).sum().backward()  # a gradient being accumulated
    state = {key: value.clone() for key, value in optimizer.state_dict()["state"][0].items()}
    grad = model.weight.grad.clone()

    def step(batch_size):
        model(torch.randn(batch_size, 8)).sum().backward()
        optimizer.step()
        if batch_size > 20:
            raise RuntimeError("CUDA out of memory.")

    find_batch(step, restore=[model, optimizer], max=64, progress=False)
    after = optimizer.state_dict()["state"][0]
    assert {key: torch.equal(value, after[key]) for key, value in state.items()} == \
        {"step": True, "exp_avg": True, "exp_avg_sq": True}
    assert torch.equal(model.weight.grad, grad)


def test_restoring_an_optimizer_gives_it_a_fresh_copy_of_what_it_would_keep():
    """load_state_dict keeps the CPU tensors it is given (a CPU optimizer's state, Adam's step
    counts), so those get a fresh copy per restore. The GPU's state it copies to the GPU
    itself, so that is given as saved (no second host copy of it per trial): checked on a
    real GPU by gpu_checks/find_batch.py."""
    import torch

    from colab_gpu.batch.state import RestorePoint

    model = torch.nn.Linear(8, 8)
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(4, 8)).sum().backward()
    optimizer.step()
    restore_point = RestorePoint(objects={"optimizer": optimizer})
    saved = restore_point.objects[0].saved["state"][0]
    given = []
    load = optimizer.load_state_dict
    optimizer.load_state_dict = lambda state: given.append(state["state"][0]) or load(state)
    restore_point.restore()
    assert given[0]["step"] is not saved["step"] and torch.equal(given[0]["step"], saved["step"])
    assert given[0]["exp_avg"] is not saved["exp_avg"] and torch.equal(given[0]["exp_avg"], saved["exp_avg"])
    assert torch.equal(optimizer.state_dict()["state"][0]["exp_avg"], saved["exp_avg"])


def test_a_tensor_trained_by_hand_gets_its_gradient_back():
    """`w = torch.zeros(4, requires_grad=True)`, --restore w: a trial that ran out of memory
    after backward() left its gradient in w.grad, and the user's next step added to it."""
    import torch

    w = torch.zeros(4, requires_grad=True)

    def step(batch_size):
        (w * torch.ones(batch_size, 4)).sum().backward()
        if batch_size > 8:
            raise RuntimeError("CUDA out of memory.")
        w.grad = None

    find_batch(step, restore=w, max=64, progress=False)
    assert w.grad is None and w.requires_grad and torch.equal(w, torch.zeros(4))


def test_find_batch_restores_train_eval_mode_and_requires_grad():
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(), torch.nn.Linear(4, 1))
    model.eval()
    model[0].weight.requires_grad_(False)

    def step(batch_size):  # a training cell: train mode, the first layer unfrozen
        model.train()
        model[0].weight.requires_grad_(True)
        model(torch.randn(batch_size, 4)).sum().backward()

    find_batch(step, restore=model, max=8, progress=False)
    assert not any(module.training for module in model.modules())
    assert not model[0].weight.requires_grad and model[2].weight.requires_grad


def test_a_restored_scheduler_puts_back_the_rate_it_set_in_its_optimizer(shell):
    """``--restore model sched``: the scheduler was put back to its step, but its optimizer kept
    the last trial's rate (and OneCycleLR's momentum), which ExponentialLR multiplies on from."""
    shell.run_cell("import torch\n"
                   "model = torch.nn.Linear(4, 1)\n"
                   "opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)\n"
                   "sched = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.5)\n"
                   "cycle = torch.optim.lr_scheduler.OneCycleLR(torch.optim.SGD(model.parameters(), lr=0.1,"
                   " momentum=0.9), max_lr=1.0, total_steps=100)\n"
                   "before = cycle.optimizer.param_groups[0].copy()\n"
                   "batch_size = 4")
    result = shell.run_cell("%%find_batch --restore model sched cycle --max 16\n"
                            "model(torch.randn(batch_size, 4)).sum().backward(); opt.step(); sched.step()\n"
                            "cycle.optimizer.step(); cycle.step()")
    assert result.error_in_exec is None
    assert shell.ev("opt.param_groups[0]['lr']") == shell.ev("sched.get_last_lr()[0]") == 0.1
    shell.run_cell("sched.step()")
    assert shell.ev("opt.param_groups[0]['lr']") == 0.05
    assert shell.ev("cycle.optimizer.param_groups[0] == before")


def test_a_trial_that_fails_between_unscale_and_step_leaves_the_grad_scaler_ready():
    """AdamW's first step allocates its state after scaler.unscale_(): an out-of-memory error
    there must not leave the scaler believing the user's next gradients are already unscaled."""
    import torch

    def training(seed=0):
        torch.manual_seed(seed)
        model = torch.nn.Linear(4, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        return model, optimizer, torch.amp.GradScaler("cpu")

    model, optimizer, scaler = training()

    def step(size, fail_above=4):
        scaler.scale(model(torch.ones(size, 4)).sum()).backward()
        scaler.unscale_(optimizer)
        if size > fail_above:
            torch.empty(2 ** 62, dtype=torch.uint8)  # the CPU allocator's real failure
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()

    result = find_batch(step, restore=[model, optimizer, scaler], device="cpu", progress=False)
    assert result.answer == 4 and result.out_of_memory_count >= 1
    step(4)  # the user's next training step
    reference, reference_optimizer, reference_scaler = training()
    reference_scaler.scale(reference(torch.ones(4, 4)).sum()).backward()
    reference_scaler.step(reference_optimizer)
    assert torch.equal(model.weight, reference.weight) and torch.equal(model.bias, reference.bias)


def test_wrong_types_in_the_api_say_which_argument():
    import torch

    model = torch.nn.Linear(2, 2)
    weights = model.weight.detach().clone()

    def step(size):
        with torch.no_grad():
            model.weight.add_(size)

    assert find_batch(step, restore=model, max=8, progress=False).answer == 8  # one object, not a list
    assert torch.equal(model.weight, weights)
    for arguments, message in (({"max": "8"}, "max='8': give a whole number"),
                               ({"steps": "3"}, "steps='3'"), ({"max": 8.5}, "max=8.5"),
                               ({"variable": None}, "variable=None: give a Python variable name")):
        with pytest.raises(SearchError, match=message):
            find_batch(step, progress=False, **arguments)


def test_a_torch_device_or_an_index_names_the_device():
    import torch

    result = find_batch(lambda size: None, device=torch.device("cpu"), max=8, progress=False)
    assert result.answer == 8 and result.device == "cpu"
    with pytest.raises(SearchError, match="^device=0: this machine has no CUDA device; use "
                                          "device='auto' or device='cpu'$"):
        find_batch(lambda size: None, device=0, progress=False)


def test_a_mig_instance_in_cuda_visible_devices_is_not_refused_as_no_cuda_device(clean_env):
    """NVML lists an A100's GPU, not its MIG instances: a MIG-<uuid> entry matched none of
    them, and --device cuda was refused before CUDA started with "this machine has no CUDA
    device". (This machine has no NVML at all: the count comes out 0 either way.)"""
    from colab_gpu.batch import checked_device

    clean_env.setenv("CUDA_VISIBLE_DEVICES", "MIG-4f2b0b4e-6f4a-5b8e-9d4b-2b7c1a3e5f60")
    assert checked_device("cuda") == "cuda"
    clean_env.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(SearchError, match="this machine has no CUDA device"):
        checked_device("cuda")


def test_a_gpu_machine_without_pynvml_is_not_told_it_has_no_cuda_device(shell, clean_env, monkeypatch):
    """An NVIDIA driver here, the pynvml module not installed: NVML cannot count the GPUs, and
    --device cuda was refused with "this machine has no CUDA device", which %gpu_status's own
    card (a driver, pynvml missing) contradicts."""
    from IPython.core.error import UsageError

    import colab_gpu.devices
    import colab_gpu.devices.nvml as nvml_module
    from colab_gpu.devices.nvml import NO_PYNVML, NvmlSource

    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` fails: not installed
    monkeypatch.setattr(nvml_module, "driver_loaded", lambda: True)  # /proc/driver/nvidia is there
    nvml_module.nvidia_driver_present.cache_clear()
    monkeypatch.setattr(session, "default_source", NvmlSource())
    try:
        assert colab_gpu.devices.default_source().snapshot().problem == NO_PYNVML
        shell.user_ns.update(batch_size=2, ran=[])
        try:
            shell.run_cell_magic("find_batch", "--device cuda --max 4", "ran.append(batch_size)")
        except UsageError as refused:
            pytest.fail(f"refused: {refused}")
        assert shell.user_ns["ran"] and shell.user_ns["batch_size"] == 4
    finally:
        nvml_module.nvidia_driver_present.cache_clear()


def test_kaggles_two_t4s_with_a_cpu_only_torch_refuse_a_cuda_device(shell, clean_env, monkeypatch):
    """Kaggle's two T4s (NVML), a CPU-only torch imported: --device cuda:1 was taken, the cell
    ran on the CPU and the report said "largest fitting on cuda:1"."""
    import torch
    from IPython.core.error import UsageError

    from colab_gpu.devices.nvml import NvmlSource
    from nvml_recording import RecordedNvml
    from test_never_harms import two_t4s

    monkeypatch.setattr(torch.version, "cuda", None)  # a CPU-only build, whichever build tests run with
    monkeypatch.setattr(torch, "__version__", "2.13.0+cpu")
    clean_env.setenv("KAGGLE_KERNEL_RUN_TYPE", "Interactive")
    monkeypatch.setattr(session, "default_source", NvmlSource(nvml=RecordedNvml(two_t4s())))
    shell.user_ns.update(batch_size=2, ran=[])
    for device in ("cuda:1", "cuda"):
        with pytest.raises(UsageError) as refused:
            shell.run_cell_magic("find_batch", f"--device {device} --max 8", "ran.append(batch_size)")
        assert str(refused.value) == (f"--device {device}: torch {torch.__version__} is a CPU-only build, "
                                      f"which cannot use this machine's GPUs; install a CUDA build, or "
                                      f"use --device auto or --device cpu")
    assert shell.user_ns["ran"] == [] and shell.user_ns["batch_size"] == 2


def _two_t4s_with_a_context_on_cuda_1(monkeypatch, touched, initialized=lambda: True):
    """The CUDA device faked at its boundary: two T4s, a context on cuda:1 only, 3 GiB peak
    there; each call that names a device is recorded in ``touched`` as (name, index)."""
    import torch

    peaks = {0: 0, 1: 3 * GiB}

    def on(name, answer=None):
        return lambda index=None, *args: touched.append((name, index)) or answer(index)

    cuda = torch.cuda
    monkeypatch.setattr(cuda, "is_initialized", initialized)
    monkeypatch.setattr(cuda, "device_count", lambda: 2)
    monkeypatch.setattr(cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch._C, "_cuda_hasPrimaryContext", on("has_context", lambda index: index == 1),
                        raising=False)
    monkeypatch.setattr(cuda, "get_device_name", on("get_device_name", lambda index: "Tesla T4"))
    monkeypatch.setattr(cuda, "mem_get_info", on("mem_get_info", lambda index: (10 * GiB, 15 * GiB)))
    monkeypatch.setattr(cuda, "memory_reserved", on("memory_reserved", lambda index: 4 * GiB))
    monkeypatch.setattr(cuda, "get_per_process_memory_fraction", on("fraction", lambda index: 1.0))
    monkeypatch.setattr(cuda, "max_memory_allocated", on("max_memory_allocated", peaks.get))
    monkeypatch.setattr(cuda, "reset_peak_memory_stats", on("reset_peak_memory_stats", lambda index: None))
    monkeypatch.setattr(cuda, "synchronize", on("synchronize", lambda index: None))
    monkeypatch.setattr(cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(cuda, "ipc_collect", lambda: None)
    monkeypatch.setattr(cuda, "get_rng_state_all", lambda: [])
    monkeypatch.setattr(cuda, "set_rng_state_all", lambda states: None)
    monkeypatch.setattr(cuda, "device", lambda index: contextlib.nullcontext())


def test_auto_measures_the_gpu_the_model_is_on_when_that_is_not_the_current_device(monkeypatch):
    """`model.to("cuda:1")` starts CUDA on GPU 1 only; the current device stays 0."""
    touched = []
    _two_t4s_with_a_context_on_cuda_1(monkeypatch, touched)
    result = find_batch(lambda size: None, device="auto", max=4, progress=False)
    assert result.device == "cuda:1 (Tesla T4)"
    # GPU 0 is only asked whether it has a context: never read, nor given one.
    assert {index for name, index in touched if name != "has_context"} == {1}, touched
    assert result.trials[0].peak_memory == 3 * GiB and result.trials[0].capacity == 14 * GiB


def test_a_torch_whose_cuda_state_cannot_be_read_is_searched_on_the_cpu(monkeypatch):
    # The rule %gpu_status follows (a broken or half-imported torch: CUDA not started), so
    # that find_batch, clear_cache and the --cells lines never call into CUDA on a guess.
    import torch

    def broken():
        raise RuntimeError("CUDA driver initialization failed")

    monkeypatch.setattr(torch.cuda, "is_initialized", broken)
    result = find_batch(lambda size: torch.zeros(size), max=4, progress=False)
    assert result.answer == 4 and result.device == "cpu"


def test_timed_runs_do_not_ask_every_gpu_for_its_context(monkeypatch):
    # --device auto is resolved once a trial: asking each GPU inside a timed run would count
    # as the step's own time (and throughput mode runs a fast step up to 1000 times).
    from colab_gpu.batch.trial import run_trial

    asked = {}
    for steps in (3, 30):
        touched = []
        _two_t4s_with_a_context_on_cuda_1(monkeypatch, touched)
        trial, error = run_trial(lambda size: None, 8, steps=steps, device="auto")
        assert error is None and trial.runs == steps
        asked[steps] = sum(name == "has_context" for name, _ in touched)
        assert touched.count(("synchronize", 1)) == steps  # every run still waits for the GPU
    assert asked[30] == asked[3] == 2, asked  # each of the two GPUs asked once


def test_a_first_run_that_starts_cuda_is_measured_there_or_not_at_all(monkeypatch):
    from colab_gpu.batch.trial import run_trial

    for measure in (True, False):
        started, touched = [], []
        _two_t4s_with_a_context_on_cuda_1(monkeypatch, touched, initialized=lambda: bool(started))
        trial, error = run_trial(lambda size: started.append(size), 8, steps=3, device="auto",
                                 measure=measure)
        assert error is None and trial.fits and trial.runs == 3, trial
        assert touched.count(("synchronize", 1)) == 3
        assert trial.peak_memory == (3 * GiB if measure else None)


def test_an_answer_that_ran_with_out_of_memory_errors_caught_inside_it_says_so(monkeypatch, capsys):
    """The common "skip this batch on OOM" loop returns normally, so a size that does not fit
    looks like one that does; torch's allocator counted the errors (num_ooms), and so it does
    when cuDNN falls back to a smaller workspace at a size that fits. The answer is not
    changed on a guess: it says what was caught, and what to do if the cell skips batches."""
    import torch

    ooms, last = [0], [0]
    _two_t4s_with_a_context_on_cuda_1(monkeypatch, [])
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda index: last[0] * 256 * MiB)
    monkeypatch.setattr(torch.cuda, "memory_stats", lambda index: {"num_ooms": ooms[0]})

    def allocate(size):  # the CUDA allocator: above 40 the memory is fragmented away
        last[0] = size
        if size > 40:
            ooms[0] += 1
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    def step(batch_size):
        for batch in range(2):
            try:
                allocate(batch_size)
            except torch.cuda.OutOfMemoryError:
                torch.cuda.empty_cache()
                continue

    result = find_batch(step, device="auto", max=64, progress=False)
    answered = next(trial for trial in result.trials if trial.size == result.answer)
    assert result.answer > 40 and answered.caught_ooms == answered.runs * 2, result.trials
    assert all(trial.caught_ooms == 0 for trial in result.trials if trial.size <= 40)
    assert (f"batch_size={result.answer} ran with {answered.caught_ooms} out-of-memory errors caught "
            f"inside it (torch's CUDA allocator counted them)") in result.notes[-1]
    assert "let that error out of the cell and search again" in str(result)


def test_failed_trial_frames_are_dropped():
    """The failed trial's tensors are freed once the search goes on (no frames kept alive)."""
    import torch

    alive = []

    def step(batch_size):
        big = torch.zeros(batch_size, 64)
        alive.append(weakref.ref(big))
        if batch_size > 100:
            raise RuntimeError("CUDA out of memory.")

    find_batch(step, max=1000, steps=1, progress=False)
    assert all(ref() is None for ref in alive)


class StepError(Exception):
    def __str__(self):
        return f"a bug in batch {self.rows}"  # never set: the message itself raises


@pytest.mark.parametrize("error", [ZeroDivisionError("a bug in the cell"), StepError()])
def test_the_users_own_error_is_raised_after_restoring(error):
    """An error whose message itself raises (StepError) raised AttributeError from inside the
    search, reading the message to classify it: in place of the user's error, and before the
    restore, so the model kept a trial's weights."""
    import torch

    model = torch.nn.Linear(4, 4)
    weights = model.weight.detach().clone()

    def step(batch_size):
        with torch.no_grad():
            model.weight.add_(1)
        if batch_size > 16:
            raise error

    with pytest.raises(type(error)):
        find_batch(step, restore=[model], progress=False)
    assert torch.equal(model.weight, weights)


class FinishedResults:
    """A progress display that keeps the results it was finished with, and shows nothing."""

    def __init__(self):
        self.finished = []

    def __call__(self, search):
        pass

    def finish(self, result):
        self.finished.append(result)


@pytest.mark.parametrize("rate, speed", [(333, "333 samples/s"), (99_999, "99999 samples/s"),
                                         (171_000, "171k samples/s"), (999_700, "1M samples/s"),
                                         (31_500_000, "31.5M samples/s")])
def test_a_fitting_trials_progress_line_is_one_line_of_80_columns_however_fast(rate, speed):
    """A fast cell (a small model on the CPU) runs 100000 samples/s or more: its line was 81
    columns and more, so samples/s wrapped onto a second line, as it did at 94 columns."""
    from colab_gpu.batch.render import trial_line

    trial = Trial(4096, FITS, peak_memory=1023 * MiB, seconds_per_step=4096 / rate, runs=3)
    (line,) = trial_line(trial, "batch_size", 12).splitlines()
    assert len(line) <= 80 and line.endswith(f"/step  {speed}"), line


def test_the_report_of_a_search_ended_by_the_users_error_does_not_claim_an_answer(shell):
    """A notebook keeps the report above the traceback. After sizes had fitted it read
    "batch_size = 2 (largest fitting ...)", while the error left batch_size as it was."""
    from colab_gpu.batch import RestorePoint, search_batch
    from colab_gpu.batch.render import render_text

    progress = FinishedResults()

    def step(size):
        if size > 10:
            raise ValueError("a bug in the cell")

    with pytest.raises(ValueError, match="a bug"):
        search_batch(step, RestorePoint(), maximum=64, progress=progress)
    (result,) = progress.finished
    assert result.answer is None and result.largest_fitting == 2
    report = render_text(result)
    assert report.startswith("no batch_size found: batch_size=16 raised ValueError: a bug in the cell")
    assert "largest that ran: 2" in report and "batch_size = 2" not in report
    shell.run_cell("batch_size = 7")
    shell.run_cell("%%find_batch --max 64\nif batch_size > 10: raise ValueError('a bug')")
    assert shell.user_ns["batch_size"] == 7


def test_in_a_terminal_a_search_ended_by_the_users_error_says_the_variable_kept_its_value(shell, capsys):
    """The notebook keeps the report above the traceback; a terminal showed only the trial
    lines ("batch_size=2 fits") and the traceback, as if batch_size were now 2."""
    shell.run_cell("batch_size = 7")
    shell.run_cell("%%find_batch --max 64\nif batch_size > 10: raise ValueError('a bug')")
    printed = capsys.readouterr().out
    assert "no batch_size found: batch_size=16 raised ValueError: a bug" in printed, printed
    assert "largest that ran: 2" in printed
    assert printed.index("no batch_size found") < printed.index("Traceback")
    assert shell.user_ns["batch_size"] == 7


def test_the_users_own_random_generators_can_be_restored(shell):
    """A seeded generator of one's own (NumPy's default_rng, torch.Generator, random.Random) is
    not the global stream the search puts back: each trial advanced it, and --restore refused it
    as having no state_dict()."""
    import numpy as np
    import torch

    seeded = {"g": lambda: torch.Generator().manual_seed(0), "rng": lambda: np.random.default_rng(0),
              "legacy": lambda: np.random.RandomState(0), "plain": lambda: random.Random(0)}
    shell.user_ns.update({name: make() for name, make in seeded.items()})
    result = shell.run_cell("%%find_batch --max 16 --restore g rng legacy plain\nimport torch\n"
                            "x = torch.randn(batch_size, generator=g), rng.normal(size=batch_size), "
                            "legacy.rand(batch_size), [plain.random() for _ in range(batch_size)]")
    assert result.error_in_exec is None and shell.user_ns["batch_size"] == 16
    ns, fresh = shell.user_ns, {name: make() for name, make in seeded.items()}
    assert torch.equal(torch.randn(5, generator=ns["g"]), torch.randn(5, generator=fresh["g"]))
    assert ns["rng"].normal() == fresh["rng"].normal() and ns["legacy"].rand() == fresh["legacy"].rand()
    assert ns["plain"].random() == fresh["plain"].random()
    found = find_batch(lambda size: ns["rng"].normal(size=size), max=8,
                       restore=ns["rng"], progress=False)
    assert found.answer == 8 and ns["rng"].normal() == fresh["rng"].normal()


def test_importing_the_feature_imports_no_heavy_module():
    code = ("import sys, colab_gpu, colab_gpu.batch, colab_gpu.batch.search, colab_gpu.batch.trial;"
            "colab_gpu.find_batch; colab_gpu.is_out_of_memory;"
            "print([m for m in ('torch', 'IPython', 'matplotlib', 'ipywidgets') if m in sys.modules])")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.stdout.strip() == "[]", done.stderr


def test_assigned_names():
    tree = ast.parse("x = 1\nfor i in range(3): y += i\nimport numpy as np\ndef f(): z = 2\nwith a as b: pass")
    names = assigned_names(tree)
    assert {"x", "i", "y", "np", "f", "b", "z"} <= names and "a" not in names


# --- the magic in a real IPython shell -----------------------------------------------------
SETUP = """
import torch, random
torch.manual_seed(0)
model = torch.nn.Linear(32, 32)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
w0 = model.weight.detach().clone()
x = "the user's x"
"""
CELL = """%%find_batch --restore model opt --max 4000 --steps 2
x = torch.randn(batch_size, 32)
if batch_size > 1500:
    raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
model(x).sum().backward(); opt.step(); opt.zero_grad()
leftover = x
"""


def test_magic_sets_the_answer_and_leaves_the_notebook_as_it_was(shell, capsys):
    shell.run_cell(SETUP)
    shell.user_ns.pop("batch_size", None)
    shell.run_cell("random.seed(3); before = random.random(); random.seed(3)")
    result = shell.run_cell(CELL)
    assert result.error_in_exec is None
    ns = shell.user_ns
    assert 1425 <= ns["batch_size"] <= 1500
    assert ns["x"] == "the user's x" and "leftover" not in ns
    assert shell.ev("bool(torch.equal(model.weight, w0))")
    assert shell.ev("random.random()") == ns["before"]
    out = capsys.readouterr().out
    assert "trial  1: batch_size=     2  fits  peak" in out and "out of memory" in out
    assert all(len(line) <= 80 for line in out.splitlines() if line.startswith("trial ")), out
    assert re.search(r"fits  peak .* samples/s\n", out), out  # a fitting trial is one line
    assert f"batch_size = {ns['batch_size']} (largest fitting" in out


def test_magic_shows_the_users_error_and_restores(shell):
    shell.run_cell("batch_size = 7; y = 'kept'")
    result = shell.run_cell("%%find_batch\ny = batch_size\nif batch_size > 20: 1/0")
    assert isinstance(result.error_in_exec, ZeroDivisionError)
    assert shell.user_ns["batch_size"] == 7 and shell.user_ns["y"] == "kept"


def test_the_users_error_shows_their_line_not_the_magics_insides(shell, capsys):
    result = shell.run_cell('%%find_batch --max 64\nx = batch_size\nraise ValueError("my bug")\n')
    assert isinstance(result.error_in_exec, ValueError)
    shown = capsys.readouterr().out
    assert '----> 3 raise ValueError("my bug")' in shown  # numbered as in the cell
    assert "search_batch" not in shown and "run_trial" not in shown and "exec(code" not in shown
    assert "trial  1: batch_size=     2  error          (ValueError: my bug)" in shown


def test_the_users_error_names_the_cell_it_ran_in(shell, capsys):
    """IPython 9 counts a cell before running it: the traceback of In [3] said "Cell In[4]"."""
    result = shell.run_cell('%%find_batch --max 64\nx = batch_size\nraise ValueError("my bug")\n',
                            store_history=True)
    shown = re.sub(r"\x1b\[[0-9;]*m", "", capsys.readouterr().out)
    named = set(re.findall(r"Cell In\[(\d+)\]|<ipython-input-(\d+)-", shown))
    assert {int(a or b) for a, b in named} == {result.execution_count}, shown


def test_ctrl_c_keeps_the_best_so_far(shell, capsys):
    result = shell.run_cell("%%find_batch --var bs\nif bs > 100: raise KeyboardInterrupt")
    assert result.error_in_exec is None
    assert shell.user_ns["bs"] == 16
    assert "interrupted" in capsys.readouterr().out


def test_ctrl_c_before_anything_fitted_does_not_promise_a_best_size(shell, capsys):
    shell.run_cell("bs = 7")
    result = shell.run_cell("%%find_batch --var bs\nraise KeyboardInterrupt")
    assert result.error_in_exec is None and shell.user_ns["bs"] == 7
    out = capsys.readouterr().out
    assert "no bs found: interrupted (Ctrl-C) before any size fitted" in out
    assert "best size so far" not in out
    assert "trial  1: bs=     2  interrupted    (KeyboardInterrupt)\n" in out  # not "(KeyboardInterrupt:)"


def test_ctrl_c_caught_by_the_cell_still_stops_the_search(shell, capsys):
    """A training loop that ends early on Ctrl-C (``except KeyboardInterrupt``) swallowed the
    press: the search went on to the next sizes, and the cut-short trial counted as fitting."""
    shell.user_ns["presses"] = presses = []
    result = shell.run_cell(
        "%%find_batch --var bs\n"
        "import os, signal\n"
        "try:\n"
        "    if bs == 16 and not presses:\n"
        "        presses.append(bs); os.kill(os.getpid(), signal.SIGINT)\n"
        "except KeyboardInterrupt:\n"
        "    print('training stopped early')\n")
    assert result.error_in_exec is None and presses == [16]
    assert shell.user_ns["bs"] == 2  # 16 was cut short: not an answer
    out = capsys.readouterr().out
    assert "trial  2: bs=    16  interrupted" in out and "trial  3" not in out, out


class PressesCtrlCWhileRestored:
    """A --restore object during whose second restore the user presses Ctrl-C: a real SIGINT
    to this process, arriving between trials rather than inside the cell."""

    def __init__(self):
        self.restores, self.value = 0, 0

    def state_dict(self):
        return {"value": 0}

    def load_state_dict(self, saved):
        self.restores += 1
        if self.restores == 2:
            os.kill(os.getpid(), signal.SIGINT)
        self.value = saved["value"]


def test_ctrl_c_between_trials_finishes_restoring_then_stops(shell, capsys):
    shell.user_ns["state"] = state = PressesCtrlCWhileRestored()
    result = shell.run_cell("%%find_batch --var bs --restore state\nstate.value = bs")
    assert result.error_in_exec is None
    assert state.restores == 2 and state.value == 0  # restored, and no third trial
    assert shell.user_ns["bs"] == 16
    assert "interrupted (Ctrl-C)" in capsys.readouterr().out


def test_ctrl_c_works_as_before_once_the_search_ends_and_from_a_thread():
    import threading

    before = signal.getsignal(signal.SIGINT)
    find_batch(lambda size: None, max=8, progress=False)
    assert signal.getsignal(signal.SIGINT) is before
    answers = []
    worker = threading.Thread(target=lambda: answers.append(find_batch(lambda size: None, max=8,
                                                                       progress=False).answer))
    worker.start()
    worker.join()
    assert answers == [8] and signal.getsignal(signal.SIGINT) is before


def test_names_bound_out_of_sight_of_the_source_are_removed(shell):
    shell.user_ns.pop("hidden", None)
    shell.user_ns.pop("timed", None)
    shell.run_cell('%%find_batch --max 8\nexec("hidden = batch_size")\n%time timed = batch_size')
    assert "hidden" not in shell.user_ns and "timed" not in shell.user_ns


def test_names_rebound_out_of_sight_of_the_source_are_put_back(shell):
    """``%time x = ...`` and a helper's ``global`` rebind the notebook's names where the cell's
    code shows no assignment: x was left holding the last trial's tensor, a step counter
    counted every run of the search."""
    shell.run_cell("x = 'kept'; steps_done = 0\n"
                   "def train_step(size):\n    global steps_done, last\n    steps_done += 1; last = [0] * size")
    shell.user_ns.pop("last", None)
    result = shell.run_cell("%%find_batch --max 8\n%time x = [0] * batch_size\ntrain_step(batch_size)")
    assert result.error_in_exec is None and shell.user_ns["batch_size"] == 8
    assert shell.user_ns["x"] == "kept" and shell.user_ns["steps_done"] == 0
    assert "last" not in shell.user_ns


def test_a_cell_that_never_mentions_the_variable_is_pointed_out(shell, capsys):
    shell.run_cell("%%find_batch --max 8\npass")
    assert "the cell never mentions batch_size" in capsys.readouterr().err
    shell.run_cell("%%find_batch --max 8\nx = [0] * batch_size")
    assert "never mentions" not in capsys.readouterr().err


@pytest.mark.parametrize("line", ["%time x = [0] * batch_size", "!echo {batch_size} > /dev/null",
                                  "listed = !echo {batch_size}"])
def test_a_magic_or_shell_line_that_reads_the_variable_mentions_it(shell, capsys, line):
    """IPython turns such a line into a call with the line as a string: the warning said the
    cell never mentions batch_size, above a search that ran at every size it tried."""
    shell.user_ns["batch_size"] = 1
    if shell.run_cell(line).error_before_exec is not None:
        # IPython 7.34 on Python 3.13 (seen here; Colab pins both) cannot read `x = !cmd`, so a
        # plain cell refuses it: the search refuses it the same way, before any trial.
        refused = shell.run_cell(f"%%find_batch --max 4\n{line}").error_in_exec
        assert str(refused).startswith("SyntaxError on line 2 of the cell") and str(refused).endswith("nothing ran")
        assert shell.user_ns["batch_size"] == 1
        return
    assert shell.run_cell(f"%%find_batch --max 4\n{line}").error_in_exec is None
    assert "never mentions" not in capsys.readouterr().err and shell.user_ns["batch_size"] == 4
    shell.user_ns["pending"] = iter(range(100))
    shell.run_cell("%%find_batch --max 4\n%time x = [next(pending)] * batch_size")
    assert "pending: every run of the cell takes items from this iterator" in capsys.readouterr().err


def test_a_cell_of_comments_only_is_refused_before_any_trial(shell):
    from IPython.core.error import UsageError

    shell.run_cell("batch_size = 7")
    with pytest.raises(UsageError, match="the cell has no code"):
        shell.run_cell_magic("find_batch", "--max 8", "# x = model(batch_size)\n")
    assert shell.user_ns["batch_size"] == 7


def test_a_cell_that_assigns_the_variable_itself_is_refused_before_any_trial(shell):
    from IPython.core.error import UsageError

    shell.run_cell("batch_size = 7")
    with pytest.raises(UsageError, match="the cell assigns batch_size itself"):
        shell.run_cell_magic("find_batch", "--max 8", "batch_size = 4\nx = [0] * batch_size")
    assert shell.user_ns["batch_size"] == 7
    # A function's own batch_size, a loop in a comprehension: the cell's batch_size is untouched.
    cell = ("def step(n):\n    batch_size = n\n    return [0] * batch_size\n"
            "x = step(batch_size) + [b for batch_size in range(2) for b in [batch_size]]")
    result = shell.run_cell_magic("find_batch", "--max 8", cell)
    assert result is None and shell.user_ns["batch_size"] == 8


def test_a_var_naming_a_model_or_a_flag_is_refused_not_overwritten_with_the_answer(shell):
    from IPython.core.error import UsageError

    shell.run_cell("import torch; model = torch.nn.Linear(4, 4); debug = False; seen = []\n"
                   "emb = torch.nn.Embedding(4, 4)")
    model = shell.user_ns["model"]
    for name, kind in (("model", "a Linear"), ("debug", "a bool"), ("emb", "an Embedding")):
        with pytest.raises(UsageError) as refused:
            shell.run_cell_magic("find_batch", f"--var {name} --max 8", f"seen.append({name})")
        assert str(refused.value) == (f"--var {name}: {name} holds {kind}, not a batch size, and the "
                                      f"search would replace it with a number; name another variable, "
                                      f"like --var batch_size or --var bs")
    assert shell.user_ns["model"] is model and shell.user_ns["debug"] is False and shell.user_ns["seen"] == []


def test_the_default_var_holding_a_model_is_not_told_to_use_itself(shell):
    """`batch_size = model` refused: the line said "name another variable, like --var
    batch_size", the very variable it refused."""
    from IPython.core.error import UsageError

    shell.run_cell("import torch; batch_size = torch.nn.Linear(4, 4)")
    with pytest.raises(UsageError) as refused:
        shell.run_cell_magic("find_batch", "--max 8", "batch_size")
    assert str(refused.value).endswith("name another variable, like --var bs")


def test_a_var_holding_a_torch_or_numpy_scalar_is_a_batch_size_not_refused(shell):
    """`batch_size = torch.tensor(64)` or a 0-d array is a number as much as 64 is; the check
    that keeps a model from being overwritten refused it as "holds a Tensor"."""
    shell.run_cell("import numpy, torch; seen = []")
    for value in ("torch.tensor(64)", "numpy.array(64)", "numpy.int64(64)", "None"):
        shell.run_cell(f"batch_size = {value}")
        shell.run_cell_magic("find_batch", "--max 8", "seen.append(batch_size)")
        assert shell.user_ns["batch_size"] == 8, value
    for flag in ("torch.tensor(True)", "numpy.bool_(True)", "torch.ones(2)"):
        shell.run_cell(f"batch_size = {flag}")
        with pytest.raises(Exception, match="not a batch size"):
            shell.run_cell_magic("find_batch", "--max 8", "seen.append(batch_size)")


class StateDictFails:
    def state_dict(self):
        raise TypeError("cannot pickle '_thread.lock' object")

    def load_state_dict(self, saved):
        pass


def test_a_restore_object_that_cannot_be_put_back_ends_the_progress_saying_why():
    """The notebook's progress table said "still running" above the one-line error."""
    import torch

    from colab_gpu.batch import RestoreError, RestorePoint, search_batch

    head = torch.nn.Sequential(torch.nn.Linear(4, 2))
    progress = FinishedResults()

    def step(size):
        head[0] = torch.nn.Linear(4, 3)

    with pytest.raises(RestoreError, match=r"^restore\['head'\]: its state could not be put back"):
        search_batch(step, RestorePoint(objects={"head": head}), maximum=8, progress=progress)
    assert [result.stopped.split(" (")[0] for result in progress.finished] == [
        "restore['head']: its state could not be put back after a trial"]


def test_a_restore_object_whose_state_cannot_be_saved_or_put_back_is_one_line_and_the_rest_restored(shell):
    from IPython.core.error import UsageError

    shell.user_ns["odd"] = StateDictFails()
    shell.user_ns.pop("x", None)
    shell.run_cell("import random, torch\nbatch_size = 7; seen = []\nw = torch.zeros(3)\n"
                   "head = torch.nn.Sequential(torch.nn.Linear(4, 2))\n"
                   "random.seed(1); before = random.random(); random.seed(1)")
    with pytest.raises(UsageError) as refused:
        shell.run_cell_magic("find_batch", "--max 8 --restore odd", "seen.append(batch_size)")
    assert str(refused.value) == ("--restore odd: its state_dict() raised TypeError: cannot pickle "
                                  "'_thread.lock' object; nothing ran")
    assert shell.user_ns["seen"] == []
    # A cell that replaces a layer: torch's load_state_dict refuses the saved weights.
    with pytest.raises(UsageError) as refused:
        shell.run_cell_magic("find_batch", "--max 8 --restore head w",
                             "head[0] = torch.nn.Linear(4, 3)\nw += batch_size\nrandom.random()\n"
                             "x = [0] * batch_size")
    message = str(refused.value)
    assert "\n" not in message and message.startswith(
        "--restore head: its state could not be put back after a trial (RuntimeError: Error(s) in "
        "loading state_dict for Sequential: size mismatch for 0.weight:")
    assert message.endswith("so the search stopped and it may keep what that trial changed; if the "
                            "cell replaces its layers, do that in a cell before %%find_batch")
    assert shell.ev("bool((w == 0).all())") and shell.user_ns["batch_size"] == 7 and "x" not in shell.user_ns
    assert shell.ev("random.random()") == shell.user_ns["before"]


def test_a_cell_that_replaces_a_layer_with_one_of_the_same_shape_is_stopped_not_kept(shell):
    """The saved weights loaded into the new layer, so the search went on; afterwards the model
    held the last trial's layer, which the optimizer made before the search never trains."""
    from IPython.core.error import UsageError

    shell.run_cell("import torch\nmodel = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))\n"
                   "opt = torch.optim.SGD(model.parameters(), lr=0.1)\nhead = model[1]\nbatch_size = 7")
    with pytest.raises(UsageError) as refused:
        shell.run_cell_magic("find_batch", "--max 8 --restore model opt",
                             "model[1] = torch.nn.Linear(4, 2)\nmodel(torch.randn(batch_size, 4)).sum().backward()")
    assert str(refused.value).startswith("--restore model: its state could not be put back after a trial "
                                         "(RuntimeError: the cell replaced 1, 1.weight, 1.bias)")
    assert shell.user_ns["batch_size"] == 7


@pytest.mark.parametrize("cell, message", [
    ("seen.append(batch_size)\nx = (batch_size", "SyntaxError on line 3 of the cell: '(' was never "
                                                 "closed: x = (batch_size; nothing ran"),
    ("seen.append(batch_size)\nreturn batch_size", "SyntaxError on line 3 of the cell: 'return' "
                                                   "outside function: return batch_size; nothing ran"),
])
def test_a_cell_with_a_syntax_error_is_one_line_naming_its_line_not_the_magics_traceback(shell, capsys,
                                                                                          cell, message):
    shell.run_cell("batch_size = 7; seen = []")
    capsys.readouterr()
    result = shell.run_cell(f"%%find_batch --max 8\n{cell}\n")
    shown = capsys.readouterr()
    assert f"UsageError: {message}\n" in shown.out + shown.err
    assert "colab_gpu/magics" not in shown.out + shown.err
    assert shell.user_ns["batch_size"] == 7 and shell.user_ns["seen"] == [] and result.error_in_exec


def test_the_magic_parses_the_cell_once(shell, monkeypatch):
    # Its checks (no code? assigns the variable? mentions it? iterators?) read one tree.
    parsed = []
    parse = ast.parse
    monkeypatch.setattr(ast, "parse", lambda source, *args, **kwargs: parsed.append(source) or
                        parse(source, *args, **kwargs))
    shell.run_cell_magic("find_batch", "--max 8", "x = [0] * batch_size")
    assert parsed == ["x = [0] * batch_size\n"] and shell.user_ns["batch_size"] == 8


def test_dash_o_in_a_terminal_returns_the_result_and_prints_the_report_once(shell, capsys):
    shell.run_cell("%%find_batch --max 8 -o\nx = [0] * batch_size")
    out = capsys.readouterr().out
    assert type(shell.user_ns["_"]).__name__ == "BatchResult" and shell.user_ns["_"].answer == 8
    assert out.count("batch_size = 8 (largest fitting") == 1 and "Out[" in out  # IPython's Out, not ours
    shell.run_cell("%%find_batch --max 8\nx = [0] * batch_size")
    assert "Out[" not in capsys.readouterr().out  # without -o nothing is returned


def test_dash_o_with_output_text_returns_the_result_whose_out_is_plain_text(shell):
    from IPython.core.formatters import DisplayFormatter

    from colab_gpu.batch.result import BatchResult

    shell.run_line_magic("config", "GPUMagics.output = 'text'")
    try:
        result = shell.run_cell_magic("find_batch", "--max 8 -o", "x = [0] * batch_size")
    finally:
        shell.run_line_magic("config", "GPUMagics.output = 'auto'")
    # What a kernel's displayhook formats for Out: every formatter runs (a terminal shell runs
    # only text/plain's), and text was asked for.
    formats, _ = DisplayFormatter().format(result)
    assert set(formats) == {"text/plain"} and formats["text/plain"].startswith("batch_size = 8 (largest")
    assert isinstance(result, BatchResult) and result.answer == 8 and result.trials[-1].size == 8
    auto = shell.run_cell_magic("find_batch", "--max 8 -o", "x = [0] * batch_size")
    assert "<table>" in DisplayFormatter().format(auto)[0]["text/html"]


def test_a_cell_that_takes_items_from_an_iterator_says_they_are_not_put_back(shell, capsys):
    shell.run_cell("batches = iter(range(100))")
    shell.run_cell("%%find_batch --max 8\nx = [next(batches)] * batch_size")
    assert "batches: every run of the cell takes items from this iterator" in capsys.readouterr().err
    shell.run_cell("%%find_batch --max 8\nbatches = iter(range(9))\nx = [next(batches)] * batch_size")
    assert "iterator" not in capsys.readouterr().err  # a fresh one each run: nothing advanced


def test_the_cells_output_is_shown_for_its_first_run_only(shell, capsys):
    shell.run_cell("%%find_batch --max 4\nprint('loss at', batch_size)")
    shown = capsys.readouterr()
    assert shown.out.count("loss at") == 1 and "loss at 2" in shown.out
    assert "5 later runs had output too, hidden" in shown.err


def test_a_terminal_shell_commands_output_is_shown_for_its_first_run_only(shell, capfd, monkeypatch, tmp_path):
    """A terminal IPython runs `!cmd` with system_raw, whose command writes to the terminal
    itself, past sys.stdout: every later run's output was shown."""
    monkeypatch.setattr(shell, "system", shell.system_raw)  # a terminal's own, not the test shell's
    sizes = tmp_path / "sizes"
    shell.run_cell(f"%%find_batch --max 4\n!echo run {{batch_size}}\n!echo {{batch_size}} >> {sizes}")
    shown = capfd.readouterr()
    assert shown.out.count("run ") == 1 and "run 2" in shown.out
    assert "later runs had output too, hidden" in shown.err
    assert "4" in sizes.read_text().split() and set(sizes.read_text().split()) <= {"2", "3", "4"}  # expanded
    assert shell.system == shell.system_raw  # put back
    # A command in the background, which the piped way refuses, runs in every run as before.
    assert shell.run_cell("%%find_batch --max 4\n!true {batch_size} &").error_in_exec is None
    assert "Background processes" not in capfd.readouterr().err


def test_the_output_of_the_run_whose_error_stops_the_search_is_shown_with_it(shell, capsys):
    # What the run printed or displayed before its error explains it: it was hidden as a later run's.
    shell.run_cell("%%find_batch --max 8\nprint('shape', (batch_size, 3))\ndisplay('shown at', batch_size)\n"
                   "assert batch_size < 8, 'bad shape'")
    shown = capsys.readouterr().out
    assert re.findall(r"^shape .*", shown, re.M) == ["shape (2, 3)", "shape (8, 3)"] and "'shown at'\n8" in shown
    assert "later runs had output too" not in shown
    assert "batch_size=     8  error" in shown[shown.index("shape (8, 3)"):]  # before the trial's line
    # An out-of-memory error is a trial's outcome, not the user's: that run's output stays hidden.
    shell.run_cell("%%find_batch --max 8\nprint('shape', (batch_size, 3))\n"
                   "if batch_size >= 8: raise MemoryError")
    assert re.findall(r"^shape .*", capsys.readouterr().out, re.M) == ["shape (2, 3)"]


def test_the_output_before_a_sys_exit_that_stops_the_search_is_shown_with_it(shell, capsys):
    # sys.exit() in the cell stops the search as the user's error (SystemExit is no Exception):
    # what the run printed before it was kept hidden as a later run's.
    with pytest.warns(UserWarning, match="exit"):  # IPython's hint, after the cell's SystemExit
        outcome = shell.run_cell("%%find_batch --max 8\nimport sys\nprint('shape', (batch_size, 3))\n"
                                 "if batch_size >= 8: sys.exit('bad shape')")
    assert isinstance(outcome.error_in_exec, SystemExit)
    shown = capsys.readouterr()
    assert re.findall(r"^shape .*", shown.out, re.M) == ["shape (2, 3)", "shape (8, 3)"]
    assert "batch_size=     8  error" in shown.out[shown.out.index("shape (8, 3)"):]
    assert "later runs had output too" not in shown.out + shown.err


def test_a_cell_that_logs_shows_its_records_for_its_first_run_only(shell, capsys):
    # A handler made in an earlier cell keeps the stream it was given (logging.basicConfig(
    # stream=sys.stderr), transformers' and Lightning's own handlers): every run logged to it.
    shell.run_cell("import logging, sys\nlog = logging.getLogger('trainer')\nlog.propagate = False\n"
                   "log.addHandler(logging.StreamHandler(sys.stderr))\nlog.setLevel(logging.INFO)")
    try:
        shell.run_cell("%%find_batch --max 4\nlog.info('loss at %d', batch_size)")
        shown = capsys.readouterr().err
        assert shown.count("loss at") == 1 and "loss at 2" in shown
        assert "5 later runs had output too, hidden" in shown
        shell.run_cell("log.info('after the search')")  # the handler writes where it did
        assert "after the search" in capsys.readouterr().err
    finally:
        logging.getLogger("trainer").handlers.clear()


def test_a_handler_the_cell_makes_in_a_later_run_shows_the_records_after_the_search(shell, capsys):
    """A handler made by the cell in a later run (``logging.basicConfig()`` the first run did not
    reach, a handler added once) took that run's hidden buffer for sys.stderr and kept it: the
    user's records after the search were shown nowhere."""
    shell.run_cell("import logging\nlog = logging.getLogger('made_in_a_run')\nlog.propagate = False\n"
                   "log.setLevel(logging.INFO)")
    try:
        shell.run_cell("%%find_batch --max 4\nif batch_size > 2 and not log.handlers:\n"
                       "    log.addHandler(logging.StreamHandler())\nlog.info('loss at %d', batch_size)")
        assert "loss at" not in capsys.readouterr().err  # made in a later run: hidden in every one
        shell.run_cell("log.info('after the search')")
        assert "after the search" in capsys.readouterr().err
    finally:
        logging.getLogger("made_in_a_run").handlers.clear()


def test_a_cell_that_plots_on_the_current_figure_draws_on_it_once(shell, capsys):
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    pyplot = pytest.importorskip("matplotlib.pyplot")
    pyplot.close("all")
    # The user's figures: one with a line, made current again after another was opened.
    shell.run_cell("import matplotlib.pyplot as plt\nmine = plt.figure(); plt.plot([0, 1])\n"
                   "other = plt.figure(); plt.figure(mine.number)")
    try:
        result = shell.run_cell_magic("find_batch", "--max 16 -o", "plt.plot(range(batch_size))")
        mine, other = shell.user_ns["mine"], shell.user_ns["other"]
        # As after one run of the cell: its first run's line on the current figure, not one per run.
        assert [len(line.get_xdata()) for line in mine.axes[0].lines] == [2, 2]
        assert pyplot.get_fignums() == [mine.number, other.number] and not other.axes
        assert pyplot.gcf() is mine
        runs = sum(trial.runs for trial in result.trials)
        assert f"{runs - 1} later runs had output too, hidden" in capsys.readouterr().err
    finally:
        pyplot.close("all")


def test_throughput_times_the_cell_not_the_hiding_of_its_output(shell, monkeypatch):
    # Hiding a later run's output must not add a fixed cost to every timed run, or larger sizes
    # look faster than they are. On a clock of the test's own, the cell takes no time and
    # setting its output aside, or putting it back, takes one second: the time of a step is
    # the cell's alone, 0, whatever the machine's load.
    from colab_gpu.batch import trial
    from colab_gpu.magics.later_runs import LaterRuns

    now = [0.0]
    monkeypatch.setattr(trial, "time", types.SimpleNamespace(perf_counter=lambda: now[0]))
    silenced = LaterRuns.silenced

    @contextlib.contextmanager
    def taking_a_second_each_way(self):
        now[0] += 1
        with silenced(self):
            yield
        now[0] += 1

    monkeypatch.setattr(LaterRuns, "silenced", taking_a_second_each_way)
    result = shell.run_cell_magic("find_batch", "--max 8 -o", "print(batch_size)")
    assert now[0] > 0 and [tried.seconds_per_step for tried in result.trials] == [0] * len(result.trials)


def test_help_shows_a_cell_magic(shell):
    assert "%%find_batch [--var NAME]" in shell.find_cell_magic("find_batch").__doc__


@pytest.mark.parametrize("line, message", [
    ("--headroom 12x", "--headroom '12x'"), ("--mode fast", "invalid choice"),
    ("--restore nowhere", "no variable named nowhere"), ("--multiple-of 0", "--multiple-of 0"),
    ("--device tpu", "--device 'tpu'"), ("--steps 0", "--steps 0"),
    ("--device cudaX", "--device 'cudaX'"), ("--device cuda", "this machine has no CUDA device"),
    ("--device cuda:1", "--device cuda:1: this machine has no CUDA device"),
    ("--var 1abc", "--var '1abc': give a Python variable name"), ("--var class", "--var 'class'"),
    ("--headroom 0.1", "a number without a unit is bytes; for a share"), ("--max 0", "--max 0"),
    ("--start 8 --max 4", "--max 4 is below --start 8"),
    ("--multiple-of 99999999999", "^--multiple-of 99999999999 leaves no batch size to try up to 65536, the "
                                  "largest size tried without --max: give --multiple-of 65536 or less, or "
                                  "--max 99999999999 or more$"),
    ("--start 3 --max 4 --multiple-of 8", "^--multiple-of 8 leaves no batch size to try from --start 3 to --max "
                                          "4: give --multiple-of 4 or less, or --max 8 or more$"),
    ("--restore n_layers", "^--restore n_layers: an int has no state_dict.*; --restore takes the names of "
                           "variables holding models"),
])
def test_magic_bad_options_are_one_line_usage_errors(shell, capsys, line, message):
    """The one line alone: not after the warnings about the cell ("never mentions batch_size",
    an iterator of the notebook), which were printed first for an option the search refused."""
    from IPython.core.error import UsageError

    shell.user_ns.update(n_layers=4, lines=iter("ab"))
    with pytest.raises(UsageError, match=message):
        shell.run_cell_magic("find_batch", line, "x = next(lines)")
    assert capsys.readouterr() == ("", "")


def test_result_views():
    run, _ = blind(300)
    result = Search(run, variable="bs").run()
    from IPython.lib.pretty import pretty

    assert repr(result).startswith("<BatchResult bs = ")
    text = pretty(result)
    assert text.splitlines()[1].split() == ["size", "outcome", "peak", "memory", "time/step", "samples/s"]
    assert "out of memory" in text and "largest that ran: 294" in text
    assert str(result) == text  # print() in a script shows the table, not the repr
    assert "<table>" in result._repr_html_() and "cgpu-answer" in result._repr_html_()


def test_step_times_keep_their_digits_from_microseconds_to_seconds():
    from colab_gpu.batch.result import trial_row

    times = [trial_row(Trial(8, FITS, seconds_per_step=seconds, runs=3))[3]
             for seconds in (4.2e-6, 0.0123, 2.5)]
    assert times == ["4.2 µs", "12.3 ms", "2.5 s"]


def test_samples_per_second_of_a_slow_step_keep_their_digits():
    """A big model on the CPU: 2 samples in 5 s, 4 in 6 s. The column read "0" and "1", so the
    table could not show why 4 was the faster; three significant digits below 100 now."""
    from colab_gpu.batch.result import trial_row

    speeds = [trial_row(Trial(size, FITS, seconds_per_step=seconds, runs=3))[4]
              for size, seconds in ((2, 5.0), (4, 6.0), (64, 1.5), (2048, 2.5))]
    assert speeds == ["0.4", "0.667", "42.7", "819"]


def test_chart_is_a_png_with_memory_and_throughput():
    from colab_gpu.batch.render import chart_png

    device = ReplayDevice(*next((c, cap) for _, c, cap in problems()))
    png = chart_png(Search(device).run())
    assert png.startswith(b"\x89PNG")


def test_chart_draws_throughput_from_the_smallest_size_to_the_largest():
    """--start above what fits: 512 fits, then 128 is measured below it, then 673. The line
    joined them in that order, from 512 back to 128 and across to 673: it crossed itself."""
    from colab_gpu.batch.render import chart_figure
    from colab_gpu.render.chart import neutral_style

    curve = Curve([(1, 2 * GiB), (64, 9 * GiB), (512, 60 * GiB)])
    device = ReplayDevice(curve, 80 * GiB)
    result = Search(device, start=4096).run()
    fits = [t for t in result.trials if t.fits]
    assert [t.size for t in fits][:2] == [512, 128]
    with neutral_style():
        speed = chart_figure(result, fits).axes[1]
    assert list(speed.lines[0].get_xdata()) == sorted(t.size for t in fits)


def test_chart_without_memory_measured_has_no_empty_memory_panel():
    """measure_memory=False (or a CPU other than Linux's): the memory panel was drawn empty, with
    made-up ticks from -0.04 to 0.04 GiB and a legend for "peak (ran)" points that are not there."""
    from colab_gpu.batch.render import chart_figure, render_html
    from colab_gpu.render.chart import neutral_style

    result = find_batch(lambda size: None, mode="throughput", max=8, steps=1, measure_memory=False,
                        progress=False)
    with neutral_style():
        figure = chart_figure(result, [t for t in result.trials if t.fits])
    assert [axes.get_title() for axes in figure.axes] == ["throughput"]
    assert "<img alt='throughput against batch_size'" in render_html(result)


def test_chart_marks_at_the_capacity_only_the_sizes_that_ran_out_of_memory():
    """A red cross on the capacity line says "ran out of memory here". A trial over the
    headroom (its real peak is drawn), one cut short by Ctrl-C and one that raised the user's
    error never reached the capacity; they were drawn there too, with no legend entry."""
    from colab_gpu.batch.render import chart_figure
    from colab_gpu.batch.result import ERROR, INTERRUPTED, OVER_HEADROOM, BatchResult
    from colab_gpu.render.chart import neutral_style

    gib = 2 ** 30
    trials = (Trial(2, FITS, peak_memory=gib, capacity=16 * gib, seconds_per_step=0.01, runs=3),
              Trial(64, OUT_OF_MEMORY, runs=1),
              Trial(32, OVER_HEADROOM, peak_memory=15 * gib, capacity=16 * gib, seconds_per_step=0.1, runs=3),
              Trial(24, INTERRUPTED, runs=1), Trial(20, ERROR, runs=1, error="ValueError: bug"))
    result = BatchResult("bs", "max", "cuda:0 (Tesla T4)", trials, answer=2, largest_fitting=2,
                         fastest=2, capacity=16 * gib, usable=15 * gib, fit=None, stopped="interrupted")
    with neutral_style():
        memory = chart_figure(result, [trials[0]]).axes[0]
    crosses = [line for line in memory.lines if line.get_marker() == "x"]
    assert [list(line.get_xdata()) for line in crosses] == [[64]]
    assert list(crosses[0].get_ydata()) == [16]
    assert "out of memory" in [text.get_text() for text in memory.get_legend().get_texts()]


def test_throughput_with_one_step_of_two_runs_says_the_time_includes_the_warm_up():
    """--steps 1 and a 0.06 s step: two runs reach 0.1 s, and the median of two times is their
    mean, the warm-up half of it; the note said nothing then. Two steps time warm runs only."""
    one = find_batch(lambda size: time.sleep(0.06), mode="throughput", max=4, steps=1, progress=False)
    assert [t.runs for t in one.trials] == [2, 2] and any("warm-up" in note for note in one.notes)
    two = find_batch(lambda size: time.sleep(0.11), mode="throughput", max=4, steps=2, progress=False)
    assert [t.runs for t in two.trials] == [2, 2] and not two.notes


def test_the_cells_own_calls_of_the_python_api_name_its_keywords_not_the_magics_options(shell):
    """The cell ran inside the magic's spelling: a colab_gpu.alloc_conf(save=True, forget=True)
    written in a %%find_batch cell was refused with "--save and --forget contradict", options
    nobody typed. The search's own report still names --max."""
    shell.run_cell("import colab_gpu\nbatch_size = 2; said = []")
    result = shell.run_cell_magic("find_batch", "--max 4 -o",
                                  "try:\n    colab_gpu.alloc_conf(save=True, forget=True)\n"
                                  "except colab_gpu.AllocConfError as error:\n    said.append(str(error))")
    said = shell.user_ns["said"]
    assert said and all(line.startswith("save=True and forget=True contradict each other") for line in said)
    assert result.stopped == "reached --max 4"
