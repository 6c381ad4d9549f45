"""A --query-gpu log of days: its last state read from its end, its --live replay a block at a
time, each the same as reading the whole log gives.

A 20 MB log took 17 s and 474 MiB to show its last state, 200 MB 139 s and 4.4 GiB. The real
recordings are read here by the large-log path too, with its sizes made small, so that every
layout (units, custom names, no header, an index that is no index) goes through both paths.
"""
from __future__ import annotations

import time
import tracemalloc

import pytest

from colab_gpu.devices import MiB
from colab_gpu.devices import replay
from colab_gpu.devices.replay import ACCEPTED, ReplaySource, latest, load_frames
from colab_gpu.devices.replay import csv_log

from conftest import DATA
from replay_logs import grow_log

CSV = DATA / "nvidia-smi-csv"
LOGS = sorted(CSV.glob("*.csv"))


@pytest.fixture
def small_parts(monkeypatch):
    """The large-log path for logs of a few KiB: a 1 KiB head, reads from the end of 256 bytes
    on, blocks of 1 KiB, so that steps and lines fall across every boundary."""
    monkeypatch.setattr(replay, "LARGE_FROM", 0)
    monkeypatch.setattr(replay, "HEAD", 1024)
    monkeypatch.setattr(csv_log, "TAIL_START", 256)
    monkeypatch.setattr(csv_log, "BLOCK", 1024)


def same_state(large, whole):
    assert large.problem is None and whole.problem is None
    assert (large.gpus, large.timestamp, large.driver_version) == (whole.gpus, whole.timestamp, whole.driver_version)
    assert large.gpus


@pytest.mark.parametrize("path", LOGS, ids=lambda path: path.name)
def test_the_last_state_read_from_the_end_is_the_whole_logs(path, small_parts):
    whole = load_frames(path)  # read whole: load_frames reads in parts only past WHOLE_CAP
    large = ReplaySource(path).snapshot()
    same_state(large, latest(whole))
    assert "its last state read from its last" in large.source


@pytest.mark.parametrize("path", LOGS, ids=lambda path: path.name)
def test_the_live_replay_read_a_block_at_a_time_is_every_step_then_the_first_again(path, small_parts):
    whole = load_frames(path)
    source = ReplaySource(path, follow=True)
    replayed = [source.snapshot() for _ in range(len(whole) + 2)]
    source.close()
    assert [(frame.gpus, frame.timestamp) for frame in replayed] == [
        (frame.gpus, frame.timestamp) for frame in whole + whole[:2]]
    assert all("log read as it is replayed" in frame.source for frame in replayed)


def test_gpus_told_apart_by_bus_id_or_by_nothing_keep_their_numbers(tmp_path, small_parts):
    """Without timestamps a step ends where a GPU repeats: read from the middle, the steps
    must still start at the log's first GPU, or GPU 1's row was shown as GPU 0."""
    by_bus = tmp_path / "bus.csv"
    by_bus.write_text("name, pci.bus_id, memory.used [MiB]\n" + "".join(
        f"Tesla T4, 00000000:00:0{gpu + 4}.0, {step * 10 + gpu} MiB\n" for step in range(300) for gpu in range(2))
        + "Tesla T4, 00000000:00:04.0, 5 MiB\n")  # cut off after the first GPU of a step
    nothing = tmp_path / "nothing.csv"
    nothing.write_text("memory.used [MiB]\n" + "".join(f"{step} MiB\n" for step in range(500)))
    for path in (by_bus, nothing):
        same_state(ReplaySource(path).snapshot(), latest(load_frames(path)))
    assert [gpu.memory_used // MiB for gpu in ReplaySource(by_bus).snapshot().gpus] == [5, 2991]


def test_a_log_still_being_written_ends_in_half_a_line_left_out(tmp_path, small_parts):
    text = (CSV / "v100s-pcie-32gb_miris.csv").read_text()
    path = tmp_path / "writing.csv"
    path.write_text(text + text.splitlines()[1][:30])
    large, whole = ReplaySource(path).snapshot(), latest(load_frames(path))
    same_state(large, whole)
    assert "its last line is cut off (3 of 8 values) and left out" in large.source


def test_a_broken_row_near_the_end_is_named_by_its_line_in_the_file(tmp_path, small_parts):
    """Only the log's first and last rows are read: a broken one among them is named by its
    line in the file, as when the whole log is read, not by its place in what was read."""
    lines = (CSV / "v100s-pcie-32gb_miris.csv").read_text().splitlines()
    path = tmp_path / "broken.csv"
    path.write_text("\n".join(lines[:-2] + [lines[-2].rsplit(",", 2)[0]] + lines[-1:]) + "\n")
    problem = ReplaySource(path).snapshot().problem
    assert problem == (f"cannot replay {path}: it has 6 values on line {len(lines) - 1} where the header names "
                       f"8 columns; {ACCEPTED}")
    with pytest.raises(replay.RecordingError) as whole:
        load_frames(path)
    assert str(whole.value) == problem


def test_a_gpu_missing_from_the_logs_end_is_left_out_and_said(tmp_path, small_parts, monkeypatch):
    """GPU 1 fell off the bus early in a long log: its last row lies too far back to be looked
    for; the card shows GPU 0 and says why GPU 1 is not there."""
    monkeypatch.setattr(csv_log, "TAIL_CAP", 4096)
    path = tmp_path / "lost.csv"
    path.write_text("timestamp, index, memory.used [MiB]\n" + "".join(
        f"2025/06/13 00:{step // 60:02d}:{step % 60:02d}.000, {gpu}, {step} MiB\n"
        for step in range(1000) for gpu in range(2 if step < 10 else 1)))
    snapshot = ReplaySource(path).snapshot()
    assert [(gpu.index, gpu.memory_used // MiB) for gpu in snapshot.gpus] == [(0, 999)]
    assert snapshot.source.endswith("; GPU 1 of its first rows not among them, left out)")


def test_a_20_mb_log_shows_its_last_state_and_starts_its_replay_at_once(tmp_path):
    """The sizes as shipped: a log grown from the 8-GPU nanoGPT run to 20 MB (455,000 rows)."""
    source = CSV / "8gpu-training_nanogpt-pr643.csv"
    path = tmp_path / "days.csv"
    grow_log(source, path, 20 * 10 ** 6)
    tracemalloc.start()
    started = time.monotonic()
    last = ReplaySource(path).snapshot()
    took = time.monotonic() - started
    first = ReplaySource(path, follow=True).snapshot()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert took < 3 and peak < 50 * MiB, (took, peak / MiB)  # 0.15 s and 5 MiB here; 17 s and 474 MiB before
    assert last.source == ("replay of days.csv (a 19.1 MiB log: its last state read from its last 16 KiB)")
    ending = path.parent / "ending.csv"  # the log's last lines, read whole
    lines = path.read_text().splitlines()
    ending.write_text("\n".join(lines[:1] + lines[-100:]) + "\n")
    same_state(last, latest(load_frames(ending)))
    assert (first.gpus, first.timestamp) == (load_frames(source)[0].gpus, load_frames(source)[0].timestamp)
