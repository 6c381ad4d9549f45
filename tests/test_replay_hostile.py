"""`%gpu_status --from` given what is no recording: a FIFO, a device, a directory, a file that
cannot be read or is far too large, a field or a number longer than any nvidia-smi writes.

Each is one line saying what is wrong, at once: never a hang, a read until memory runs out, or
a traceback. A path that names no file to read is refused when the source is made (the magic's
UsageError); a file whose content is no recording is the card's problem line, as before.
"""
from __future__ import annotations

import ast
import os
import pathlib
import sys
import threading

import pytest
from IPython.core.error import UsageError

import colab_gpu
from colab_gpu import live
from colab_gpu.devices import MiB
from colab_gpu.devices.replay import (ACCEPTED, FORMATS, WHOLE_CAP, RecordingError, ReplaySource, check_path,
                                      load_frames)

from conftest import DATA, ROOT

CSV = DATA / "nvidia-smi-csv"
XML = DATA / "nvidia-smi-xml"
TABLE = DATA / "nvidia-smi-text" / "Tesla-T4__drv525.105.17__captured-2023-08-09__54b991e34fdd.txt"
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux's /dev and /proc")


def within(seconds: float, call, fifo: "pathlib.Path | None" = None, raises=RecordingError):
    """call()'s error (a RecordingError unless ``raises`` says), failing (not hanging the suite) if it is still running after
    ``seconds``: a FIFO opened for reading waits for a writer, /dev/zero never ends."""
    outcome = {}

    def run():
        try:
            call()
        except BaseException as error:  # noqa: BLE001 - handed to the test's thread
            outcome["error"] = error

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive() and fifo is not None:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # the blocked reader's writer: it ends
    assert not thread.is_alive(), f"still running after {seconds} s"
    assert isinstance(outcome.get("error"), raises), outcome
    return outcome["error"]


def one_line(error: BaseException, expected: str) -> str:
    message = str(error)
    assert message == expected and "\n" not in message and "`" not in message, message
    return message


@pytest.fixture
def fifo(tmp_path):
    if not hasattr(os, "mkfifo"):
        pytest.skip("no named pipes on this platform")
    path = tmp_path / "gpu.xml"
    os.mkfifo(path)
    return path


def test_a_fifo_is_refused_at_once_by_every_entry_point(fifo):
    """`--from <(nvidia-smi -q -x)` or a FIFO named like a recording: open() waited for a writer
    and the notebook hung."""
    expected = f"cannot replay {fifo}: it is a named pipe (FIFO), not a saved recording"
    for call in (lambda: ReplaySource(fifo), lambda: ReplaySource(fifo, follow=True),
                 lambda: colab_gpu.status(path=str(fifo)), lambda: load_frames(fifo), lambda: check_path(fifo)):
        one_line(within(2, call, fifo), expected)


def test_live_from_a_fifo_starts_nothing(fifo):
    one_line(within(2, lambda: live.start(path=str(fifo), interval=0.01), fifo, live.SourceError),
             f"cannot replay {fifo}: it is a named pipe (FIFO), not a saved recording")
    assert live.running() is None


@linux_only
@pytest.mark.parametrize("device", ["/dev/zero", "/dev/urandom"])
def test_a_device_that_never_ends_is_refused_at_once(device):
    """/dev/zero was read until memory ran out."""
    one_line(within(2, lambda: ReplaySource(device)), f"cannot replay {device}: it is a character device, "
                                                      f"not a saved recording")


def test_a_directory_or_a_missing_file_is_one_raised_line(tmp_path):
    """They were a card headed 'replay of no_such_file.xml', its problem ending in the list of
    accepted formats with literal backticks."""
    one_line(within(2, lambda: ReplaySource(tmp_path)), f"cannot replay {tmp_path}: it is a directory, "
                                                        f"not a saved recording")
    missing = tmp_path / "no_such_file.xml"
    one_line(within(2, lambda: colab_gpu.status(path=str(missing))), f"cannot replay {missing}: no such file")
    one_line(within(2, lambda: ReplaySource(tmp_path / "file.xml" / "below")),
             f"cannot replay {tmp_path / 'file.xml' / 'below'}: no such file")
    one_line(within(2, lambda: colab_gpu.status(path="t4\0.xml")),
             "cannot replay 't4\\x00.xml': no file name holds a NUL character")


@linux_only
def test_a_file_whose_read_fails_is_one_raised_line(tmp_path):
    """A regular file that cannot be read: /proc/self/mem's first page is never mapped (EIO),
    as root too; a file without read permission where this user's permissions apply."""
    one_line(within(2, lambda: ReplaySource("/proc/self/mem")), "cannot replay /proc/self/mem: input/output error")
    locked = tmp_path / "locked.xml"
    locked.write_bytes((XML / "tesla-t4.xml").read_bytes())
    locked.chmod(0)
    try:
        if os.access(locked, os.R_OK):  # root reads it anyway
            assert ReplaySource(locked).snapshot().gpus[0].name == "Tesla T4"
        else:
            one_line(within(2, lambda: ReplaySource(locked)), f"cannot replay {locked}: permission denied")
    finally:
        locked.chmod(0o600)


def test_an_empty_path_is_refused_by_the_api_as_by_the_magic():
    with pytest.raises(RecordingError) as raised:
        ReplaySource("  ")
    assert str(raised.value) == f"path='  ': give the recording's file name; {ACCEPTED}"


@pytest.mark.parametrize("start", [b'<?xml version="1.0" ?>\n<nvidia_smi_log>\n', b"\xff\xfeN\0V\0"],
                         ids=["xml", "utf16-csv"])
def test_a_file_too_large_to_read_whole_says_its_size_and_the_cap(tmp_path, start):
    """A 192 MiB file (sparse: it costs no disk) that must be read whole to be parsed was read
    whole; XML, the table and UTF-16 text are refused past the cap, with both sizes."""
    path = tmp_path / "huge.xml"
    with path.open("wb") as file:
        file.write(start)
        file.truncate(3 * WHOLE_CAP)
    message = one_line(within(2, lambda: ReplaySource(path)),
                       f"cannot replay {path}: it is 192 MiB, more than the 64 MiB a recording read whole may be "
                       f"(only a --query-gpu CSV log may be larger)")
    assert WHOLE_CAP == 64 * MiB, message


def test_the_gpu_status_magic_says_a_missing_file_in_one_usage_line(shell, capsys):
    with pytest.raises(UsageError) as raised:
        shell.run_line_magic("gpu_status", "--from /no/such.xml")
    one_line(raised.value, "cannot replay /no/such.xml: no such file")
    result = shell.run_cell("%gpu_status --from /no/such.xml --json")
    assert isinstance(result.error_in_exec, UsageError)
    out = capsys.readouterr()
    assert "Traceback" not in out.out + out.err and "replay of" not in out.out + out.err


@linux_only
def test_the_live_magic_says_a_device_in_one_usage_line(shell):
    with pytest.raises(UsageError) as raised:
        shell.run_line_magic("gpu_status", "--live --from /dev/zero")
    one_line(raised.value, "cannot start the live monitor: cannot replay /dev/zero: it is a character device, "
                           "not a saved recording")
    assert live.running() is None


def test_a_field_over_the_csv_limit_is_the_problem_line_not_a_traceback(tmp_path):
    """A value of 140,000 characters ended in `_csv.Error: field larger than field limit`."""
    path = tmp_path / "long.csv"
    path.write_text("index, name, memory.used [MiB]\n0, Tesla T4, 3 MiB\n0, " + "x" * 140_000 + ", 5 MiB\n")
    snapshot = ReplaySource(path).snapshot()
    assert snapshot.problem == (f"cannot replay {path}: it is not a CSV log nvidia-smi writes: field larger than "
                                f"field limit (131072) on line 3; {ACCEPTED}")
    assert colab_gpu.status(path=str(path)).snapshot.problem == snapshot.problem  # the card's, no traceback
    capture = tmp_path / "capture.txt"  # where nvidia_gpu_exporter's captures are looked into
    capture.write_text("NVIDIA-SMI\n+----\n\n" + "x" * 140_000 + ", name\n0, T4\n")
    problem = ReplaySource(capture).snapshot().problem
    assert problem.startswith(f"cannot replay {capture}: it looks like the `nvidia-smi` table")


def test_a_number_of_400_or_5000_digits_is_an_invalid_reading(tmp_path):
    """"9" * 400 MiB overflowed a float into int(inf): OverflowError; 5000 digits passed
    Python's 4300-digit limit of int(): ValueError. No GPU has such a value: it is an invalid
    reading (n/a, and said), never a traceback; an index of 5000 digits refuses the recording
    (tests/test_hostile_readings.py)."""
    path = tmp_path / "digits.csv"
    path.write_text("index, name, memory.used [MiB], memory.total [MiB], compute_cap, temperature.gpu\n"
                    f"0, Tesla T4, {'9' * 400} MiB, 15360 MiB, {'7' * 5000}.5, {'4' * 400}\n")
    (gpu,) = ReplaySource(path).snapshot().gpus
    assert (gpu.index, gpu.memory_used, gpu.memory_total, gpu.compute_capability, gpu.temperature) == (
        0, None, None, (7, 5), None)  # which of used and total is wrong is unknown; the T4's capability by its name
    assert {field for field, _ in gpu.invalid} >= {"memory", "temperature"}
    assert "GPU 0  Tesla T4" in str(colab_gpu.status(path=str(path)))
    xml = tmp_path / "digits.xml"
    xml.write_text((XML / "tesla-t4.xml").read_text().replace("<used>1032 MiB</used>",
                                                              f"<used>{'9' * 400} MiB</used>", 1))
    (gpu,) = ReplaySource(xml).snapshot().gpus
    assert gpu.memory_used is None and gpu.invalid == (("memory", "104857599… (407 digits) bytes used"),)
    table = tmp_path / "digits.txt"
    rows = (f"|    0   N/A  N/A    {'9' * 5000}      C   python                        1000MiB |\n"
            "|    0   N/A  N/A      4242      C   python                        2000MiB |")
    table.write_text(TABLE.read_text().replace(
        "|  No running processes found                                                 |", rows))
    (gpu,) = ReplaySource(table).snapshot().gpus
    assert [(process.pid, process.used_memory) for process in gpu.processes] == [(4242, 2000 * MiB)]


def test_every_format_is_one_module_in_the_formats_tuple(tmp_path, monkeypatch):
    """A new kind of recording is a module with sniff(text) and read(text, label, time), put in
    FORMATS: the reader asks nothing else."""
    import types

    from colab_gpu.devices import Snapshot
    from colab_gpu.devices import replay

    assert all(callable(kind.sniff) and callable(kind.read) for kind in FORMATS)
    assert FORMATS[-1].sniff("anything")  # the CSV log takes what no other format claims
    new = types.SimpleNamespace(sniff=lambda text: text.startswith("GPUS:"),
                                read=lambda text, label, time: (Snapshot(source=label, recorded=True, timestamp=time),))
    monkeypatch.setattr(replay, "FORMATS", (new,) + FORMATS)
    path = tmp_path / "gpus.txt"
    path.write_text("GPUS: none\n")
    assert ReplaySource(path).snapshot() == Snapshot(source="replay of gpus.txt", recorded=True,
                                                     timestamp=path.stat().st_mtime)


def test_the_replay_modules_share_public_names_only():
    """A name one module of devices/replay/ (or a test) takes from another is public and in that
    module's __all__: the modules are read apart, and a private name may change unannounced."""
    package = ROOT / "colab_gpu" / "devices" / "replay"
    exported = {}
    for path in package.glob("*.py"):
        tree = ast.parse(path.read_text())
        names = next(node.value for node in tree.body if isinstance(node, ast.Assign)
                     and any(getattr(target, "id", None) == "__all__" for target in node.targets))
        exported[path.stem] = set(ast.literal_eval(names))
    sources = list(package.glob("*.py")) + sorted((ROOT / "tests").glob("*.py"))
    for path in sources:
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom) or not node.module:
                continue
            if path.parent == package and node.level == 1:
                module = node.module if node.module in exported else None
            elif node.module.startswith("colab_gpu.devices.replay"):
                module = node.module.rpartition(".")[2] if node.module != "colab_gpu.devices.replay" else "__init__"
            else:
                continue
            if module is None:
                continue
            for alias in node.names:  # a module of the package (csv_log) is public too
                assert alias.name in exported[module] or (module == "__init__" and alias.name in exported), \
                    f"{path.name} imports {alias.name} from {module}"
