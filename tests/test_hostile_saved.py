"""Hostile allocator settings (issue #40): a saved setting file that is a FIFO, a directory, too
large or unreadable, and integers past Python's 4300-digit str->int limit or past any size_t.
Each ends in one line saying what was wrong (at %load_ext: which file, why, what to do) within a
time bound, the rest of the load done, no thread or file left behind."""
from __future__ import annotations

import os
import sys
import tempfile
import threading
import time

import pytest
from IPython.core.error import UsageError

from colab_gpu.allocator import AllocConfError, alloc_conf, apply_saved, parse, validate
from colab_gpu.runtime import TorchState
from colab_gpu.torch_allocator.installed import installed_torch
from colab_gpu.torch_allocator.schema import BY_NAME

NOT_IMPORTED = TorchState(imported=False)
HUGE = "9" * 5000  # past sys.get_int_max_str_digits() (4300): int() raised ValueError
# pinned_max_cached_size_mb came with torch 2.13: an older torch (Colab's 2.11) refuses the key first.
PINNED_CACHE_ANSWER = ("is out of range: must be >= 0 and <= 2147483647"
                       if BY_NAME["pinned_max_cached_size_mb"].available(installed_torch()[1] or (0, 0))
                       else "pinned_max_cached_size_mb needs torch >= 2.13")


def within(seconds, work):
    """``work()``'s result (or what it raised), run on a thread that must end within ``seconds``:
    a hang fails the test instead of hanging it."""
    result = {}

    def run():
        try:
            result["value"] = work()
        except BaseException as error:  # raised again below, in the test
            result["error"] = error

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still running after {seconds} s"
    if "error" in result:
        raise result["error"]
    return result["value"]


@pytest.fixture
def loading(ipython, clean_env, tmp_path, capsys):
    """``load()`` runs %load_ext colab_gpu in the real shell as a process's first load, before
    `import torch`, with the saved setting in tmp_path; it returns what was printed, and checks
    the extension loaded whole. Unloaded afterwards."""
    clean_env.delitem(sys.modules, "torch", raising=False)
    clean_env.setenv("COLAB_GPU_CONFIG_DIR", str(tmp_path))

    def load():
        result = within(10, lambda: ipython.run_cell("%load_ext colab_gpu"))
        assert result.success and result.error_in_exec is None
        assert "colab_gpu" in ipython.extension_manager.loaded  # not half-way: loaded, as IPython knows
        assert "alloc_conf" in ipython.magics_manager.magics["line"]
        return capsys.readouterr().out

    yield load
    ipython.run_line_magic("unload_ext", "colab_gpu")
    assert "gpu_status" not in ipython.magics_manager.magics["line"]


def one_line(out):
    assert out.count("\n") == 1 and out.endswith("\n"), out
    assert "Traceback" not in out
    return out


def test_a_fifo_as_the_saved_file_is_one_line_at_load_not_a_hang(loading, tmp_path):
    fifo = tmp_path / "alloc_conf.txt"
    os.mkfifo(fifo)
    try:
        out = one_line(loading())
    finally:  # had the load opened it for reading and hung, a writer lets it go on
        try:
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:  # ENXIO: nobody reads it, as it should be
            pass
    assert out == (f"colab_gpu: the saved allocator setting in {fifo} was not read, nor applied: "
                   f"it is a named pipe, not a file: remove it\n")
    assert "PYTORCH_CUDA_ALLOC_CONF" not in os.environ


def test_saving_over_a_fifo_refuses_in_one_line_and_does_not_wait_for_a_reader(tmp_path):
    env = {"COLAB_GPU_CONFIG_DIR": str(tmp_path)}
    os.mkfifo(tmp_path / "alloc_conf.txt")

    def save():
        with pytest.raises(AllocConfError) as error:
            alloc_conf(["max_split_size_mb=128"], save=True, environ=env, modules={}, state=NOT_IMPORTED)
        return str(error.value)

    message = within(10, save)
    assert message == (f"save=True: cannot write {tmp_path / 'alloc_conf.txt'} (it is a named pipe, not a "
                       f"file); nothing was changed (COLAB_GPU_CONFIG_DIR names another folder)")
    assert "PYTORCH_CUDA_ALLOC_CONF" not in env  # nothing applied either
    # --forget removes it, as the load's line says to
    alloc_conf(forget=True, environ=env, modules={}, state=NOT_IMPORTED)
    assert not os.path.lexists(tmp_path / "alloc_conf.txt")


def test_a_directory_as_the_saved_file_is_one_line_at_load(loading, tmp_path):
    (tmp_path / "alloc_conf.txt").mkdir()
    assert one_line(loading()) == (f"colab_gpu: the saved allocator setting in {tmp_path / 'alloc_conf.txt'} "
                                   f"was not read, nor applied: it is a directory, not a file: remove it\n")


def test_a_device_as_the_saved_file_is_not_read(tmp_path):
    """/dev/zero never ends: read whole, it filled the memory."""
    os.symlink("/dev/zero", tmp_path / "alloc_conf.txt")
    message = within(10, lambda: apply_saved(environ={"COLAB_GPU_CONFIG_DIR": str(tmp_path)}, modules={},
                                             state=NOT_IMPORTED))
    assert message.endswith("was not read, nor applied: it is a character device, not a file: remove it")


def test_a_saved_file_far_longer_than_a_setting_is_not_read_whole(loading, tmp_path):
    (tmp_path / "alloc_conf.txt").write_text("expandable_segments:True," * 100_000)  # 2.5 MB
    out = one_line(loading())
    assert out.endswith("was not read, nor applied: it holds over 16 KiB, and a saved setting is one "
                        "short line: %alloc_conf --forget deletes it\n")
    assert "PYTORCH_CUDA_ALLOC_CONF" not in os.environ


def test_an_unreadable_saved_file_says_so_at_load(tmp_path):
    """No permission to read it. Tests run as root, which reads anything: the load runs in a
    forked child that has become the user nobody, on a real file of mode 000."""
    folder = tempfile.mkdtemp()  # under /tmp: one nobody may enter, unlike pytest's tmp_path
    try:
        os.chmod(folder, 0o755)
        path = os.path.join(folder, "alloc_conf.txt")
        with open(path, "w") as file:
            file.write("expandable_segments:True\n")
        os.chmod(path, 0o000)
        message = _as_nobody(lambda: apply_saved(environ={"COLAB_GPU_CONFIG_DIR": folder}, modules={},
                                                 state=NOT_IMPORTED))
    finally:
        os.chmod(folder, 0o700)
        for name in os.listdir(folder):
            os.remove(os.path.join(folder, name))
        os.rmdir(folder)
    assert message == (f"colab_gpu: the saved allocator setting in {path} was not read, nor applied: "
                       f"no permission to read it: make it readable (chmod u+r) or delete it")


def _as_nobody(work):
    """``work()``'s result (a string) from a forked child running as nobody (uid 65534); in
    place where the tests do not run as root (mode 000 is enough then)."""
    if os.getuid() != 0:
        return work()
    if not hasattr(os, "fork"):
        pytest.skip("needs os.fork to drop root's right to read any file")
    reader, writer = os.pipe()
    child = os.fork()
    if child == 0:  # the child: never back into pytest
        try:
            os.setgid(65534)
            os.setuid(65534)
            os.write(writer, work().encode())
        finally:
            os._exit(0)
    os.close(writer)
    chunks = []
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        chunk = os.read(reader, 65536)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(reader)
    os.waitpid(child, 0)
    return b"".join(chunks).decode()


CUT = "9" * 40 + "… (5000 characters)"  # how a message repeats HUGE: its start and its length


@pytest.mark.parametrize("saved, expected", [
    (f"max_split_size_mb:{HUGE}", f"max_split_size_mb={CUT} is out of range: must be >= 20"),
    (f"roundup_power2_divisions:[256:{HUGE}]", f"roundup_power2_divisions=[256:{'9' * 35}… (5006 characters): the "
                                              f"divisions for 256 must be 0 (no rounding) or a power of two up to "
                                              f"1073741824, got '{CUT}'"),
    (f"large_segment_size_mb:{HUGE},max_split_size_mb:30", f"large_segment_size_mb={CUT} is out of range: must be "
                                                          f"> 10 and <= 2147483647 (%alloc_conf --forget removes it)"),
])
def test_a_saved_integer_past_4300_digits_is_one_line_at_load_and_not_applied(loading, tmp_path, saved, expected):
    (tmp_path / "alloc_conf.txt").write_text(saved + "\n")
    out = one_line(loading())
    assert out.startswith(f"colab_gpu: saved allocator setting from {tmp_path / 'alloc_conf.txt'} not applied: ")
    assert expected in out and len(out) < 400  # the number is not repeated whole
    assert "PYTORCH_CUDA_ALLOC_CONF" not in os.environ


@pytest.mark.parametrize("line, expected", [
    (f"max_split_size_mb={HUGE}", "is out of range: must be >= 20"),
    (f"roundup_power2_divisions=[256:{HUGE}]", "must be 0 (no rounding) or a power of two up to 1073741824"),
    (f"roundup_power2_divisions=[{HUGE}:4]", "each interval is a power of two in MB up to 4611686018427387904"),
    (f"roundup_power2_divisions={HUGE}", "takes a power of two (1, 2, 4, 8, ... 1073741824)"),
    (f"pinned_num_register_threads={HUGE}", "must be a power of two (1, 2, 4, ... 128)"),
    (f"garbage_collection_threshold={HUGE}.5", "is out of range: must be > 0 and < 1"),
    (f"pinned_max_cached_size_mb={HUGE}", PINNED_CACHE_ANSWER),
    (f"max_split_size_mb=0000{HUGE}", "is out of range"),
])
def test_a_typed_integer_past_4300_digits_is_the_one_line_usage_error(shell, clean_env, tmp_path, line, expected):
    clean_env.delitem(sys.modules, "torch", raising=False)
    clean_env.setenv("COLAB_GPU_CONFIG_DIR", str(tmp_path))
    with pytest.raises(UsageError) as error:
        within(10, lambda: shell.run_line_magic("alloc_conf", line))
    message = str(error.value)
    assert expected in message and "\n" not in message and len(message) < 400
    assert "PYTORCH_CUDA_ALLOC_CONF" not in os.environ


@pytest.mark.parametrize("text, expected", [
    # 2**44 MB is 2**64 bytes: past a size_t, let alone torch 1.13's stoi
    ("max_split_size_mb:17592186044416", "max_split_size_mb=17592186044416 is out of range: must be >= 20 "
                                         "(large_segment_size_mb's default; a smaller large_segment_size_mb "
                                         "allows less) and <= 2147483647"),
    ("max_split_size_mb:2147483648", "and <= 2147483647"),
    (f"expandable_segments_reserve:{HUGE}G", "or a number of GiB like 40G (below 17179869184G)"),  # float: inf
    ("pinned_reserve_segment_size_mb:18446744073709551616", "must be > 0 and <= 2147483647"),
    ("max_non_split_rounding_mb:99999999999999999999999", "<= 2147483647"),
    ("roundup_power2_divisions:[256:4294967296]", "a power of two up to 1073741824, got '4294967296'"),
    ("roundup_power2_divisions:[9223372036854775808:1]", "a power of two in MB up to 4611686018427387904"),
    ("expandable_segments_reserve:17179869184G", "(below 17179869184G)"),  # 2**64 bytes
    ("expandable_segments_reserve:16777216", "(the default reserve is 1.125; below 16777216)"),
])
def test_a_valid_but_absurd_integer_is_refused_with_the_accepted_range(text, expected):
    with pytest.raises(AllocConfError) as error:
        validate(parse(text), (2, 15))
    assert expected in str(error.value)


def test_the_largest_accepted_values_still_pass():
    assert validate(parse("max_split_size_mb:2147483647,roundup_power2_divisions:[4611686018427387904:1073741824]"),
                    (2, 13)) == (("max_split_size_mb", "2147483647"),
                                 ("roundup_power2_divisions", "[4611686018427387904:1073741824]"))
    assert validate(parse("expandable_segments_reserve:17179869183G"), (2, 15))
    assert validate(parse("expandable_segments_reserve:16777215.5"), (2, 15))
