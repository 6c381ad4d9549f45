"""Every out-of-memory wording reads to the numbers written in it.

The recorded messages are tests/data/oom_messages.jsonl (real texts quoted from public issues,
see PROVENANCE.md): each must read to the sizes it writes, field by field, in the bytes its units
mean. The wordings no recording holds (MPS, XPU, HIP, torch 2.x's per-process cap and private
pools, the CPU allocator's as this torch raises it) are built from the format strings of
PyTorch's sources, or raised for real.
"""
from __future__ import annotations

import json

import pytest

from conftest import DATA
from colab_gpu.doctor import parse_message

MESSAGES = [json.loads(line) for line in (DATA / "oom_messages.jsonl").read_text().splitlines()]
UNIT = {"bytes": 1, "KiB": 2 ** 10, "MiB": 2 ** 20, "GiB": 2 ** 30, "KB": 2 ** 10, "MB": 2 ** 20, "GB": 2 ** 30}
FIELDS = ("requested", "capacity", "free", "allocated", "reserved", "unallocated", "allowed",
          "this_process", "non_torch", "private_pools")


def written(text: str) -> int:
    """'2.56 GiB' -> bytes, as written (rounded to the byte)."""
    number, unit = text.split()
    return round(float(number) * UNIT[unit])


# What each recorded message writes, in its own words; "reserved" where the message writes
# allocated + unallocated (2.1+) or allocated + cached (1.0-1.3) is their sum.
EXPECTED = [
    dict(kind="CUDA", device="cuda:0", wording="PyTorch 1.0-1.3", requested="2.56 GiB", capacity="15.90 GiB",
         allocated="10.38 GiB", free="1.83 GiB", unallocated="2.99 GiB", reserved=("10.38 GiB", "2.99 GiB")),
    dict(kind="CUDA", device="cuda:0", wording="PyTorch 1.0-1.3", requested="1024.00 KiB", capacity="11.17 GiB",
         allocated="10.90 GiB", free="576.00 KiB", unallocated="30.96 MiB", reserved=("10.90 GiB", "30.96 MiB")),
    dict(kind="CUDA", device="cuda:0", wording="PyTorch 1.4-2.0", requested="78.00 MiB", capacity="15.90 GiB",
         allocated="14.84 GiB", free="65.88 MiB", reserved="15.02 GiB"),
    dict(kind="CUDA", device="cuda:0", wording="PyTorch 1.4-2.0", requested="72.00 MiB", capacity="1024.00 MiB",
         allocated="378.05 MiB", free="0 bytes", reserved="418.00 MiB"),
    dict(kind="CUDA", device="cuda:0", wording="PyTorch 1.4-2.0", requested="246.00 MiB", capacity="31.75 GiB",
         allocated="26.00 GiB", free="460.38 MiB", reserved="27.88 GiB"),
    dict(kind="CUDA", device="cuda:0", wording="PyTorch 1.4-2.0", requested="502.00 MiB", capacity="15.90 GiB",
         allocated="14.32 GiB", free="75.75 MiB", reserved="14.77 GiB"),
    dict(kind="CUDA", device="cuda:0", wording="PyTorch 1.4-2.0", requested="14.48 GiB", capacity="14.76 GiB",
         allocated="6.23 GiB", free="7.27 GiB", reserved="6.45 GiB"),
    dict(kind="CUDA", device="cuda:4", wording="PyTorch 1.4-2.0", requested="432.00 MiB", capacity="39.56 GiB",
         allocated="36.19 GiB", free="326.56 MiB", reserved="37.90 GiB"),
    dict(kind="CUDA", device="cuda:0", wording="PyTorch 2.1", requested="1.70 GiB", capacity="6.00 GiB",
         free="0 bytes", allocated="2.93 GiB", unallocated="2.30 GiB", reserved=("2.93 GiB", "2.30 GiB")),
    dict(kind="CUDA", device="cuda:0", wording="PyTorch 2.2 or later", requested="36.00 GiB", capacity="14.56 GiB",
         free="10.22 GiB", this_process="4.11 GiB", processes=((17435, "240.00 MiB"),), allocated="3.72 GiB",
         unallocated="264.21 MiB", reserved=("3.72 GiB", "264.21 MiB")),
    dict(kind="CUDA", device="cuda:0", wording="PyTorch 2.2 or later", requested="226.00 MiB", capacity="15.70 GiB",
         free="210.38 MiB", this_process="15.48 GiB", allocated="14.81 GiB", unallocated="336.73 MiB",
         reserved=("14.81 GiB", "336.73 MiB")),
    dict(kind="CUDA runtime"),
    dict(kind="cuBLAS"),
    dict(kind="cuDNN"),
    dict(kind="cuDNN", uncertain=True),  # CUDNN_STATUS_EXECUTION_FAILED: often, not always, memory
    dict(kind="TensorFlow", device="GPU:0", requested=str(100 * 128 * 112 * 112 * 4) + " bytes"),
    dict(kind="TensorFlow", requested="33554432 bytes"),
]


def _bytes(value) -> int:
    return sum(written(part) for part in value) if isinstance(value, tuple) else written(value)


def check(text: str, expected: dict) -> None:
    parsed = parse_message(text)
    assert parsed is not None, text
    numbers = {field: _bytes(expected[field]) for field in FIELDS if field in expected}
    if "unallocated" not in numbers and "reserved" in numbers and "allocated" in numbers:
        numbers["unallocated"] = numbers["reserved"] - numbers["allocated"]  # 1.4-2.0 write the total
    for field in FIELDS:
        assert getattr(parsed, field) == numbers.get(field), (field, text)
    assert parsed.kind == expected["kind"] and parsed.device == expected.get("device")
    assert parsed.wording == expected.get("wording") and parsed.uncertain == expected.get("uncertain", False)
    assert parsed.processes == tuple((pid, written(size)) for pid, size in expected.get("processes", ()))


def test_every_recorded_message_has_its_expected_numbers_here():
    assert len(MESSAGES) == len(EXPECTED)
    assert [message["kind"].split("_")[0] for message in MESSAGES] == \
        ["torch"] * 11 + ["cuda", "cublas", "cudnn", "cudnn", "tf", "tf"]


@pytest.mark.parametrize("index", range(len(MESSAGES)), ids=[message["kind"] for message in MESSAGES])
def test_each_recorded_message_reads_to_the_numbers_written_in_it(index):
    check(MESSAGES[index]["text"], EXPECTED[index])


@pytest.mark.parametrize("index", range(11))
def test_a_torch_message_reads_the_same_wrapped_in_a_traceback_or_behind_a_rank(index):
    text = MESSAGES[index]["text"]
    wrapped = ("Traceback (most recent call last):\n  File \"train.py\", line 12, in <module>\n    loss = model(x)\n"
               f"[rank3]: {text}\n")
    assert parse_message(wrapped).line.startswith("[rank3]: ")
    check(wrapped, EXPECTED[index])


# Built from the format strings of PyTorch's sources (c10/cuda/CUDACachingAllocator.cpp,
# aten/src/ATen/mps/MPSAllocator.mm, c10/xpu/XPUCachingAllocator.cpp), which no recording holds.
BUILT = [
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of "
     "79.19 GiB of which 58.31 GiB is free. Including non-PyTorch memory, this process has 20.87 GiB memory in use. "
     "16.00 GiB allowed; Of the allocated memory 15.98 GiB is allocated by PyTorch, with 1.00 GiB allocated in "
     "private pools (e.g., CUDA Graphs), and 3.79 MiB is reserved by PyTorch but unallocated. If reserved but "
     "unallocated memory is large try setting PYTORCH_ALLOC_CONF=expandable_segments:True to avoid fragmentation.",
     dict(kind="CUDA", device="cuda:0", wording="PyTorch 2.2 or later", requested="20.00 MiB", capacity="79.19 GiB",
          free="58.31 GiB", this_process="20.87 GiB", allowed="16.00 GiB", allocated="15.98 GiB",
          private_pools="1.00 GiB", unallocated="3.79 MiB", reserved=("15.98 GiB", "3.79 MiB"))),
    ("torch.OutOfMemoryError: HIP out of memory. Tried to allocate 1.95 GiB. GPU 1 has a total capacity of "
     "23.98 GiB of which 1.22 GiB is free. Of the allocated memory 21.34 GiB is allocated by PyTorch, and "
     "996.47 MiB is reserved by PyTorch but unallocated.",
     dict(kind="HIP", device="cuda:1", wording="PyTorch 2.1 or later", requested="1.95 GiB", capacity="23.98 GiB",
          free="1.22 GiB", allocated="21.34 GiB", unallocated="996.47 MiB", reserved=("21.34 GiB", "996.47 MiB"))),
    ("XPU out of memory. Tried to allocate 512.00 MiB. GPU 0 has a total capacity of 15.11 GiB of which "
     "402.00 MiB is free. Of the allocated memory 14.20 GiB is allocated by PyTorch, and 120.00 MiB is reserved "
     "by PyTorch but unallocated. Please use `empty_cache` to release all unoccupied cached memory.",
     dict(kind="XPU", device="xpu:0", wording="PyTorch 2.1 or later", requested="512.00 MiB", capacity="15.11 GiB",
          free="402.00 MiB", allocated="14.20 GiB", unallocated="120.00 MiB", reserved=("14.20 GiB", "120.00 MiB"))),
    ("RuntimeError: MPS backend out of memory (MPS allocated: 18.04 GB, other allocations: 94.99 MB, max allowed: "
     "18.13 GB). Tried to allocate 80.00 MB on private pool. Use PYTORCH_MPS_HIGH_WATERMARK_RATIO=0.0 to disable "
     "upper limit for memory allocations (may cause system failure).",
     dict(kind="MPS", device="mps", requested="80.00 MB", allocated="18.04 GB", non_torch="94.99 MB",
          capacity="18.13 GB")),
    ("RuntimeError: MPS backend out of memory (MPS allocated: 7.64 GiB, other allocations: 68.91 GiB). Tried to "
     "allocate 33.92 GiB on shared pool.",
     dict(kind="MPS", device="mps", requested="33.92 GiB", allocated="7.64 GiB", non_torch="68.91 GiB")),
    ("RuntimeError: [enforce fail at CPUAllocator.cpp:64] . DefaultCPUAllocator: can't allocate memory: you tried "
     "to allocate 4000000000 bytes. Error code 12 (Cannot allocate memory)",
     dict(kind="CPU", device="cpu", requested="4000000000 bytes")),
    ("numpy.core._exceptions._ArrayMemoryError: Unable to allocate 8.00 GiB for an array with shape (8589934592,) "
     "and data type uint8",
     dict(kind="NumPy", device="cpu", requested="8.00 GiB")),
    ("RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 7.93 GiB total capacity; "
     "2.00 GiB already allocated; 5.50 GiB free; 2.00 GiB allowed; 2.01 GiB reserved in total by PyTorch)",
     dict(kind="CUDA", device="cuda:0", wording="PyTorch 1.4-2.0", requested="20.00 MiB", capacity="7.93 GiB",
          allocated="2.00 GiB", free="5.50 GiB", allowed="2.00 GiB", reserved="2.01 GiB")),
]


@pytest.mark.parametrize("text, expected", BUILT, ids=["2.x cap and private pools", "HIP", "XPU", "MPS 2.0",
                                                        "MPS GiB no cap", "CPU 1.x", "NumPy", "1.x cap"])
def test_each_wording_from_pytorchs_sources_reads_to_its_numbers(text, expected):
    check(text, expected)


def test_the_cpu_allocators_own_message_as_this_torch_raises_it():
    torch = pytest.importorskip("torch")
    with pytest.raises(RuntimeError) as raised:
        torch.empty(2 ** 62, dtype=torch.uint8)
    parsed = parse_message(str(raised.value))
    assert parsed.kind == "CPU" and parsed.device == "cpu" and parsed.requested == 2 ** 62


def test_text_without_an_out_of_memory_reads_as_none():
    assert parse_message("ValueError: shapes (3,) and (4,) not aligned") is None
    assert parse_message("") is None
    assert parse_message("RuntimeError: CUDA error: an illegal memory access was encountered") is None
