"""The magics' options as argparse reads them: no abbreviations, and numbers refused in words.

argparse took ``--jso`` for ``--json`` (an abbreviation silently changes meaning when an option
starting the same way is added later), and answered ``--headroom -10%`` with "expected one
argument" because "-10%" looked like an option to it. Each is now one UsageError line naming
the option and saying what is accepted, on IPython 7.34 and the newest alike, and nothing runs.
"""
from __future__ import annotations

import contextlib
import io
import os
import re

import pytest
from IPython.core.error import UsageError

CELL = "ran.append(batch_size)\n"


@pytest.fixture
def magic(shell, clean_env, tmp_path):
    """Run a line (or, for find_batch, cell) magic; returns its one-line UsageError message,
    after checking that the cell never ran and the allocator setting (which --rese, --unse KEY
    or --forge would change) was left as it was."""
    clean_env.setenv("COLAB_GPU_CONFIG_DIR", str(tmp_path))
    clean_env.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    shell.user_ns.update(batch_size=4, ran=[])

    def allocator_setting():
        return {name: value for name, value in os.environ.items() if name.startswith("PYTORCH_")}

    before = allocator_setting()

    def refused(name: str, line: str) -> str:
        with pytest.raises(UsageError) as error:
            if name == "find_batch":
                shell.run_cell_magic(name, line, CELL)
            else:
                shell.run_line_magic(name, line)
        message = str(error.value)
        assert "\n" not in message
        assert shell.user_ns["ran"] == [] and shell.user_ns["batch_size"] == 4 and allocator_setting() == before
        return message

    yield refused
    for name in ("batch_size", "ran"):
        shell.user_ns.pop(name, None)


def long_options(shell, name: str) -> list:
    """The magic's options, read from its usage line as %magic? shows it."""
    method = shell.find_cell_magic(name) if name == "find_batch" else shell.find_line_magic(name)
    return sorted(set(re.findall(r"--[a-z][\w-]*", method.parser.format_usage())))


@pytest.mark.parametrize("name", ["gpu_status", "alloc_conf", "clear_cache", "find_batch"])
def test_an_abbreviated_option_is_refused_and_named(shell, magic, name):
    options = long_options(shell, name)
    assert len(options) >= 3
    for option in options:
        abbreviation = option[:-1]
        assert abbreviation not in options
        assert magic(name, abbreviation).startswith(f"unrecognized arguments: {abbreviation} (usage: ")


def test_json_abbreviated_is_refused_naming_it(magic):
    assert magic("gpu_status", "--jso").startswith("unrecognized arguments: --jso (usage: %gpu_status [--json]")


@pytest.mark.parametrize("headroom", ["-10%", "-512MiB", "-5", "-.5%"])
def test_a_negative_headroom_says_it_cannot_be_negative_and_what_is_accepted(magic, headroom):
    assert magic("find_batch", f"--headroom {headroom}") == (
        f"--headroom '{headroom}': headroom cannot be negative; give bytes like 512MiB or a "
        f"percentage of device memory like 10%")


@pytest.mark.parametrize("name, line, message", [
    ("find_batch", "--start -4", "--start -4: give a whole number >= 1"),
    ("find_batch", "--max -1", "--max -1: give a whole number >= 1"),
    ("find_batch", "--steps -2", "--steps -2: give a whole number >= 1"),
    ("find_batch", "--multiple-of -8", "--multiple-of -8: give a whole number >= 1"),
    ("find_batch", "--max -1e3", "argument --max: '-1e3' is not a whole number (usage: %%find_batch "),
    ("find_batch", "--start 2.5", "argument --start: '2.5' is not a whole number (usage: %%find_batch "),
    ("find_batch", "--multiple -8", "unrecognized arguments: --multiple -8 (usage: "),  # as typed
    ("gpu_status", "--interval -1", "--interval must be a number of seconds from 0.1 (NVML's counters "
                                    "change every 1/6 s to 1 s) to 3600 (an hour), e.g. 1 or 0.5; not -1"),
    ("gpu_status", "--live --interval -1e-3", "--interval must be a number of seconds from 0.1 (NVML's "
                                              "counters change every 1/6 s to 1 s) to 3600 (an hour), e.g. 1 "
                                              "or 0.5; not -0.001"),
    ("gpu_status", "--live --demo --interval 1e-7", "--interval must be a number of seconds from 0.1 (NVML's "
                                                    "counters change every 1/6 s to 1 s) to 3600 (an hour), e.g. "
                                                    "1 or 0.5; not 1e-07"),
    ("gpu_status", "--live --interval abc", "argument --interval: 'abc' is not a number of seconds (usage: "),
    ("alloc_conf", "max_split_size_mb=-1", "max_split_size_mb=-1: takes a whole number, >= 20 (large_segment_size_mb's default; a "
     "smaller large_segment_size_mb allows less) and <= "),
    ("alloc_conf", "--check garbage_collection_threshold:-0.5",
     "garbage_collection_threshold=-0.5: takes a decimal number like 0.5, > 0 and < 1"),
    ("alloc_conf", "--unset -1", "unknown allocator key '-1'"),
])
def test_every_numeric_option_says_what_is_wrong_with_its_value(magic, name, line, message):
    assert magic(name, line).startswith(message)


def value_options(shell, name: str) -> list:
    """(option, two different values it accepts) for every option of the magic that takes one value."""
    method = shell.find_cell_magic(name) if name == "find_batch" else shell.find_line_magic(name)
    options = []
    for action in method.parser._actions:
        if (not action.option_strings or action.nargs is not None or action.const is not None
                or isinstance(action.default, list)):
            continue  # a positional, a flag, an option taking several values (--restore) or repeatable (--unset)
        values = (list(action.choices)[:2] if action.choices
                  else ["2", "3"] if action.type is not None else ["a", "b"])
        options.append((action.option_strings[0], values))
    return options


@pytest.mark.parametrize("name", ["gpu_status", "alloc_conf", "clear_cache", "find_batch"])
def test_an_option_given_twice_with_two_values_is_refused_naming_both(shell, magic, name):
    """argparse kept the last value: --preset fragmentation --preset reclaim applied reclaim
    alone and dropped fragmentation without a word."""
    for option, (first, second) in value_options(shell, name):
        message = magic(name, f"{option} {first} {option}={second}")
        assert re.match(rf"argument {option}: given twice \({first}\S* and {second}\S*\); give it once \(usage: ",
                        message), message


def test_every_magic_has_options_that_take_one_value(shell):
    assert {name: len(value_options(shell, name)) for name in ("gpu_status", "alloc_conf", "find_batch")} == {
        "gpu_status": 2, "alloc_conf": 2, "find_batch": 9}  # --plan GPU joined them


def test_the_same_value_twice_is_accepted(shell, clean_env):
    shell.run_line_magic("alloc_conf", "--preset fragmentation --preset=fragmentation")
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"


def test_nan_given_twice_is_one_value_checked_as_usual(magic):
    """nan != nan: '--interval nan --interval nan' was 'given twice (nan and nan)', two values that
    are the same, instead of the interval's own rule, as for one nan."""
    assert magic("gpu_status", "--live --interval nan --interval nan") == magic("gpu_status", "--live --interval nan")
    assert magic("gpu_status", "--live --interval nan").startswith("--interval must be a number of seconds from 0.1")
    assert "given twice (nan and 2)" in magic("gpu_status", "--live --interval nan --interval 2")  # as typed


def test_restore_given_twice_restores_both(shell):
    """--restore a --restore m kept only m: the cell's changes to a stayed, and the user's tensor
    was left as the last trial made it."""
    torch = pytest.importorskip("torch")
    shell.user_ns.update(a=torch.zeros(2), m=torch.zeros(3), batch_size=2)
    try:
        shell.run_cell_magic("find_batch", "--restore a --restore m --max 8 --device cpu",
                             "a.add_(1); m.add_(batch_size)")
        assert shell.user_ns["a"].tolist() == [0, 0] and shell.user_ns["m"].tolist() == [0, 0, 0]
        assert shell.user_ns["batch_size"] == 8
    finally:
        for name in ("a", "m", "batch_size"):
            shell.user_ns.pop(name, None)


def test_names_and_settings_may_follow_an_option(shell, clean_env, capsys):
    """argparse stopped reading NAME ... at the first option: `%clear_cache a --quiet b` said
    'unrecognized arguments: b', a variable like a, and deleted neither."""
    shell.user_ns.update(a=[1], b=[2])
    shell.run_line_magic("clear_cache", "a --quiet b")
    assert "a" not in shell.user_ns and "b" not in shell.user_ns
    assert "; deleted a, b" in capsys.readouterr().out.splitlines()[-1]  # then the biggest holder, if any
    shell.run_line_magic("alloc_conf", "max_split_size_mb=128 --json expandable_segments=True")
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:128,expandable_segments:True"


def test_a_trailing_comment_is_left_out_as_in_python(shell, clean_env, capsys):
    """A comment after a magic was read as arguments: '#' was 'not a variable name' to
    %clear_cache, a 'malformed setting' to %alloc_conf, and an apostrophe in it ('# don't')
    was 'no closing quotation'."""
    shell.user_ns.update(a=[1], batch_size=1, ran=[])
    try:
        shell.run_line_magic("clear_cache", "a --quiet  # don't need it any more")
        assert "a" not in shell.user_ns
        shell.run_line_magic("alloc_conf", "expandable_segments=True  # fragmentation's fix")
        assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
        shell.run_cell_magic("find_batch", "--max 4 --device cpu  # a small one", "ran.append(batch_size)")
        assert shell.user_ns["batch_size"] == 4 and shell.user_ns["ran"][0] == 2
        with pytest.raises(UsageError, match="^cannot replay run#2.csv: no such file$"):
            shell.run_line_magic("gpu_status", "--from run#2.csv  # a '#' inside a word stays")
    finally:
        for name in ("batch_size", "ran"):
            shell.user_ns.pop(name, None)


def test_a_quoted_hash_stays(magic):
    assert magic("alloc_conf", '--check "max_split_size_mb:128 # x"').startswith("malformed setting ")


@pytest.mark.parametrize("name, line", [("alloc_conf", "--check=--"), ("alloc_conf", "--unset=--"),
                                        ("gpu_status", "--from=--"), ("gpu_status", "--interval=--"),
                                        ("find_batch", "--start=--")])
def test_a_double_dash_as_an_option_s_value_is_refused_in_one_line(magic, name, line):
    """argparse handed ``--check=--`` to the option as an empty list, and the magic's own check
    raised TypeError ("takes check as a string ... got list") as a traceback."""
    option = line.split("=")[0]
    assert magic(name, line).startswith(f"argument {option}: expected one argument, not -- (usage: %{'%' if name == 'find_batch' else ''}{name} ")


@pytest.mark.parametrize("line", ['--from ""', "--from=", "--from ' ' --json", '--from "" --live --demo'])
def test_an_empty_from_is_refused_saying_what_is_accepted(magic, shell, capsys, line):
    """`--from ""` showed a card whose source was 'replay of ' ('cannot replay : no such file'),
    and with --live --demo the empty path was ignored and the bundled trace replayed."""
    from colab_gpu.magics import GPUMagics

    shell.magics_manager.registry[GPUMagics.__name__].live_lines = 1  # the old code's replay ends
    assert re.match(r"--from '\s*': give the recording's file name; accepted: an `nvidia-smi -q -x` XML",
                    magic("gpu_status", line))
    shell.run_line_magic("gpu_status", "--stop")
    assert capsys.readouterr().out == "colab_gpu: the live monitor is not running\n"  # none started


@pytest.mark.parametrize("line", ["--from /tmp/rec dir/my t4.xml", "--from /tmp/rec dir/my t4.xml --json",
                                  "--from=/tmp/rec dir/my t4.xml"])
def test_a_path_cut_at_its_spaces_is_told_to_go_in_quotes(magic, line):
    """An unquoted path with spaces was "unrecognized arguments: dir/my t4.xml", which did not
    say that --from had taken only /tmp/rec, nor how to give the whole path."""
    assert magic("gpu_status", line).startswith(
        'unrecognized arguments: dir/my t4.xml; a path with spaces goes in quotes: --from "/tmp/rec dir/my t4.xml"')
    assert "quotes" not in magic("gpu_status", "--json extra")  # no path to quote


WORDS = ["--json", "--demo", "--cells", "--interval", "--from", "--unset", "--reset", "--check", "--preset",
         "--keys", "--history", "--vars", "--quiet", "--var", "--start", "--max", "--steps", "--headroom",
         "--multiple-of", "--mode", "--restore", "--device", "-o", "-h", "--", "-", "=", "#", "'", '"', "$x",
         "0", "-1", "2.5", "1e400", "nan", "10%", "-10%", "512MiB", "throughput", "cpu", "cuda:1", "t",
         "batch_size", "ran", "torch", "In", "_", "print", "ünï", "\u200b", "max_split_size_mb=128",
         "expandable_segments:True", "backend=cudaMallocAsync", "fragmentation", "a,b", ":", "--from=", "--var="]


def test_any_line_works_or_is_one_usage_line_and_changes_nothing(shell, clean_env):
    """Hostile and sloppy lines for every magic: a traceback never escapes, and a refused line
    leaves the allocator setting, the variables and the cell as they were."""
    from hypothesis import HealthCheck, given, settings, strategies as st

    torch = pytest.importorskip("torch")

    @settings(max_examples=150, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(st.sampled_from(["gpu_status", "alloc_conf", "clear_cache", "find_batch"]),
           st.lists(st.sampled_from(WORDS), max_size=5), st.booleans())
    def check(name, words, attached):
        line = " ".join(words)
        if attached:
            line = re.sub(r"(--[a-z-]+) ", r"\1=", line)
        shell.user_ns.update(batch_size=4, ran=[], t=torch.zeros(3))
        before = (dict(os.environ), set(shell.user_ns))
        try:
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                if name == "find_batch":
                    shell.run_cell_magic(name, line + " --device cpu --max 8", "ran.append(batch_size)")
                else:
                    shell.run_line_magic(name, line)
        except UsageError as error:
            assert "\n" not in str(error), (name, line)
            assert (dict(os.environ), set(shell.user_ns)) == before and shell.user_ns["ran"] == [], (name, line)

    try:
        check()
    finally:
        for name in ("batch_size", "ran", "t"):
            shell.user_ns.pop(name, None)
