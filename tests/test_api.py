"""The plain Python API as a script author uses it: ``import colab_gpu`` and calls, no magics."""
from __future__ import annotations

import functools
import importlib
import os
import random
import re
import signal
import subprocess
import sys

import pytest

import colab_gpu

from conftest import ROOT

T4_XML = os.path.join(os.path.dirname(colab_gpu.__file__), "data", "tesla-t4.xml")


def _step(batch_size):
    pass


@pytest.mark.parametrize("options, message", [
    (dict(headroom="12x"), "headroom='12x': give bytes like 512MiB"),
    (dict(headroom=-1), "headroom=-1: headroom cannot be negative"),
    (dict(headroom=0.5), "headroom=0.5: a number without a unit is bytes"),
    (dict(start=2.5), "start=2.5: give a whole number >= 1"),
    (dict(multiple_of=0), "multiple_of=0: give a whole number >= 1"),
    (dict(steps=0), "steps=0: give a whole number >= 1"),
    (dict(start=8, max=4), "max=4 is below start=8"),
    (dict(mode="fast"), "mode='fast': use one of max, throughput"),
    (dict(device="tpu"), "device='tpu': use auto, cpu, cuda or cuda:N"),
    (dict(variable="1abc"), "variable='1abc': give a Python variable name"),
    (dict(restore=3), "restore: an int has no state_dict() / load_state_dict(); restore takes the "
                      "objects themselves (one, a list or a dict): models, optimizers"),
    (dict(restore=[random.Random(0), "model"]), "restore[1]: a str ('model') has no state_dict()"),
    (dict(restore={"lr": 0.1}), "restore['lr']: a float has no state_dict()"),
])
def test_find_batch_errors_name_the_keyword_the_caller_wrote(options, message):
    """find_batch(fn, headroom='12x') said "--headroom '12x': ...", an option of the magic the
    script author never typed."""
    with pytest.raises(ValueError) as raised:
        colab_gpu.find_batch(_step, progress=False, **options)
    assert str(raised.value).startswith(message) and "--" not in str(raised.value)


def test_alloc_conf_errors_name_the_keyword_the_caller_wrote(tmp_path):
    environ = {"COLAB_GPU_CONFIG_DIR": str(tmp_path)}
    with pytest.raises(colab_gpu.AllocConfError, match=r"^save=True and forget=True contradict"):
        colab_gpu.alloc_conf(save=True, forget=True, environ=environ, modules={})
    with pytest.raises(colab_gpu.AllocConfError, match=r"^check only validates its string .* without "
                                                      r"settings, unset, reset, preset, save or forget$"):
        colab_gpu.alloc_conf(check="expandable_segments:True", reset=True, environ=environ, modules={})
    environ["PYTORCH_CUDA_ALLOC_CONF"] = "max_split_size_mb:10"  # torch refuses it
    shown = colab_gpu.alloc_conf(environ=environ, modules={})
    assert shown.warnings[0].endswith("remove it with unset='KEY' or reset=True")


def test_clear_cache_error_names_the_keyword_the_caller_wrote(ipython):
    with pytest.raises(ValueError, match=r"use history=True to clear the output history$"):
        colab_gpu.clear_cache("Out", shell=ipython)


def test_the_magics_keep_their_options_spelling(shell):
    """The same checks through the magics still name --headroom, --save, --history."""
    from IPython.core.error import UsageError

    for magic, line, cell, message in [
        ("find_batch", "--headroom 12x", "batch_size", "^--headroom '12x': give bytes"),
        ("find_batch", "--start 8 --max 4", "batch_size", "^--max 4 is below --start 8$"),
        ("alloc_conf", "--save --forget", None, "^--save and --forget contradict each other: --save"),
        ("clear_cache", "Out", None, "use --history to clear the output history$"),
    ]:
        with pytest.raises(UsageError, match=message):
            if cell is None:
                shell.run_line_magic(magic, line)
            else:
                shell.run_cell_magic(magic, line, cell)


def _user_errors():
    """Every UserError subclass, once each package that defines one is imported."""
    from colab_gpu.errors import UserError

    for package in ("allocator", "batch", "devices.replay", "distributed", "live", "memory"):  # their errors
        importlib.import_module(f"colab_gpu.{package}")

    found, todo = [], [UserError]
    while todo:
        for kind in todo.pop().__subclasses__():
            found.append(kind)
            todo.append(kind)
    return found


def test_every_error_in_what_the_user_asked_for_is_a_user_error_and_still_a_value_error():
    """One base the magics translate; the names and ValueError that callers catch are kept."""
    names = {kind.__name__ for kind in _user_errors()}
    assert {"AllocConfError", "RecordingError", "SourceError", "LiveOptionError", "AlreadyRunning",
            "SearchError", "RestoreError", "ClearCacheError", "LaunchOptionError", "LaunchRefused"} <= names
    assert all(issubclass(kind, ValueError) for kind in _user_errors())
    assert colab_gpu.AllocConfError in _user_errors()


# Each magic, and the API function it hands its work to (looked up at the call, so patched here).
MAGIC_CALLS = [("gpu_status", "", None, "colab_gpu.gpu_status.status"),
               ("alloc_conf", "", None, "colab_gpu.allocator.alloc_conf"),
               ("clear_cache", "", None, "colab_gpu.memory.clear_cache"),
               ("find_batch", "", "x = batch_size", "colab_gpu.batch.search_batch"),
               ("distributed", "-n 2", "x = 1", "colab_gpu.distributed.launch")]


@pytest.mark.parametrize("kind", _user_errors(), ids=lambda kind: kind.__name__)
@pytest.mark.parametrize("magic, line, cell, target", MAGIC_CALLS, ids=[call[0] for call in MAGIC_CALLS])
def test_every_user_error_from_an_api_is_one_usage_error_line_in_every_magic(shell, monkeypatch, capsys, kind,
                                                                             magic, line, cell, target):
    """Seven sites translated seven classes by hand, and an error of another class (RecordingError
    of an empty --from in status()) would have been a traceback: one place now turns any
    UserError into a UsageError of one line, its message as the API wrote it."""
    from IPython.core.error import UsageError

    def refuse(*args, **kwargs):
        raise kind("what was wrong,\nand what is accepted")

    monkeypatch.setattr(target, refuse)
    with pytest.raises(UsageError) as refused:
        if cell is None:
            shell.run_line_magic(magic, line)
        else:
            shell.run_cell_magic(magic, line, cell)
    assert str(refused.value) == "what was wrong, and what is accepted"
    assert refused.value.__cause__ is None and refused.value.__suppress_context__
    assert "Traceback" not in capsys.readouterr().err


def test_a_user_error_the_cell_raises_itself_stays_its_own(shell):
    """%%find_batch runs the user's cell: a SearchError of its own (its own find_batch() call) is
    the user's error with its traceback, not a line as if %%find_batch's options were wrong."""
    from colab_gpu.batch import SearchError

    with pytest.raises(SearchError, match="^the cell's own$"):
        shell.run_cell_magic("find_batch", "--max 4", "from colab_gpu.batch import SearchError\n"
                                                       "raise SearchError(\"the cell's own\")  # batch_size")


@pytest.mark.parametrize("fn", [42, None, "train_step"])
def test_find_batch_refuses_what_is_not_a_function_before_any_trial(fn):
    """find_batch(train_step(64)) ran a search whose every trial failed, then raised "'NoneType'
    object is not callable" from inside the search, a traceback through colab_gpu's frames."""
    with pytest.raises(TypeError, match=r"^find_batch\(\) takes a function that runs one step at a "
                                        r"batch size, fn\(batch_size\), not "):
        colab_gpu.find_batch(fn, progress=False)


async def _async_step(batch_size):
    raise AssertionError("never awaited")


def _generator_step(batch_size):
    yield batch_size


class _AsyncStep:
    async def __call__(self, batch_size):
        raise AssertionError("never awaited")


@pytest.mark.parametrize("fn, what", [
    (_async_step, "_async_step is an async function: _async_step(batch_size) only creates a coroutine"),
    (functools.partial(_async_step), "fn is an async function: fn(batch_size) only creates a coroutine"),
    (_AsyncStep(), "fn is an async function"),
    (_generator_step, "_generator_step is a generator function: _generator_step(batch_size) only "
                      "creates a generator"),
])
def test_find_batch_refuses_a_step_whose_call_runs_nothing(fn, what, recwarn):
    """An ``async def`` step (or one with ``yield``) only made a coroutine at each call: every
    trial "fitted" in microseconds and find_batch answered batch_size = 65536, with nothing run."""
    with pytest.raises(TypeError) as raised:
        colab_gpu.find_batch(fn, progress=False)
    assert str(raised.value).startswith("find_batch() takes a function that runs one step at a batch "
                                        "size; " + what)
    assert str(raised.value).endswith("runs none of the step, so every size would fit; define it "
                                      "with a plain def")
    assert not [warning for warning in recwarn if "never awaited" in str(warning.message)]


def test_a_step_may_refuse_a_size_with_its_own_out_of_memory_error():
    """As is_out_of_memory() says: the message decides, so a budget check of the user's own
    counts as a size that does not fit, not as an error that stops the search."""
    def step(batch_size):
        if batch_size > 16:
            raise ValueError(f"{batch_size} rows ran out of memory budget")

    result = colab_gpu.find_batch(step, progress=False)
    assert result.answer == 16 and colab_gpu.is_out_of_memory(ValueError("ran out of memory budget"))
    refused = [trial for trial in result.trials if trial.size > 16]
    assert refused and {trial.outcome for trial in refused} == {"out of memory"}
    assert refused[-1].error == f"ValueError: {refused[-1].size} rows ran out of memory budget"


class _PressesCtrlC:
    """A --restore object whose second restore gets Ctrl-C: pressed between two trials."""

    def __init__(self):
        self.restores = 0

    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        self.restores += 1
        if self.restores == 2:
            os.kill(os.getpid(), signal.SIGINT)


def test_ctrl_c_between_trials_reads_as_interrupted():
    """Held until the state was restored, Ctrl-C cut no trial short: result.interrupted was
    False while result.stopped said "interrupted (Ctrl-C); the best size so far is the answer"."""
    result = colab_gpu.find_batch(lambda batch_size: None, restore=_PressesCtrlC(), progress=False)
    assert [trial.outcome for trial in result.trials] == ["fits", "fits"] and result.answer == 16
    assert result.stopped == "interrupted (Ctrl-C); the best size so far is the answer"
    assert result.interrupted


def test_find_batch_takes_numpy_and_torch_integers_as_sizes():
    """max=np.int64(8) (a size computed with NumPy) was refused with "give a whole number >= 1"."""
    import numpy as np
    import torch

    sizes = []
    result = colab_gpu.find_batch(sizes.append, start=torch.tensor(4), max=np.int64(8),
                                  multiple_of=np.int32(2), steps=np.int64(2), progress=False)
    assert result.answer == 8 and type(result.answer) is int
    assert sizes == [4, 4, 8, 8] and all(type(size) is int for size in sizes)
    with pytest.raises(ValueError, match=r"^start=tensor\(4\.\): give a whole number >= 1$"):
        colab_gpu.find_batch(sizes.append, start=torch.tensor(4.0), progress=False)


def test_clear_cache_in_a_script_says_a_functions_variable_is_not_among_those_it_deletes(tmp_path):
    """In a script, clear_cache("model") called where model is a function's local variable said
    "no variable named 'model'", which the author could see was there."""
    import os
    import subprocess
    import sys

    script = tmp_path / "train.py"
    script.write_text("import colab_gpu\n"
                      "def main():\n"
                      "    model = [1.0] * 10\n"
                      "    colab_gpu.clear_cache('model')\n"
                      "main()\n")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ran = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": root})
    assert ran.stderr.strip().splitlines()[-1] == (
        "colab_gpu.memory.ClearCacheError: no variable named 'model' among the script's global "
        "variables (__main__), the only ones clear_cache() can delete; del a function's own "
        "variables inside it")


def test_status_names_a_wrong_path_and_refuses_a_path_it_would_ignore():
    """status(path=3) failed inside os.fspath ("expected str, bytes or os.PathLike object, not
    int"); status(source, path=...) showed the source and dropped the path without a word."""
    accepted = ("status() takes a recording's path (str, bytes or os.PathLike) or a DeviceSource "
                "(colab_gpu.open_source()), not ")
    with pytest.raises(TypeError, match=re.escape(accepted + "3") + "$"):
        colab_gpu.status(path=3)
    recording = colab_gpu.open_source(T4_XML)
    with pytest.raises(TypeError, match=re.escape(accepted + "both") + "$"):
        colab_gpu.status(recording, path=T4_XML)
    assert [gpu.name for gpu in colab_gpu.status(path=T4_XML).snapshot.gpus] == ["Tesla T4"]
    # A source given as path= is a source, as a path given first is a path (it failed in os.fspath).
    assert [gpu.name for gpu in colab_gpu.status(path=recording).snapshot.gpus] == ["Tesla T4"]


def _message(call):
    """What ``call`` says: the error it raises, or the text of the report it returns."""
    try:
        said = call()
    except Exception as error:
        return str(error)
    return " ".join(str(said).split())  # the text report folds at 80 columns


def _torch_module(version):
    import types

    torch = types.ModuleType("torch")
    torch.__version__, torch.version = version, types.SimpleNamespace(cuda="12.1", hip=None)
    return {"torch": torch}


def _saved_then(config, **call):
    colab_gpu.alloc_conf(["max_split_size_mb=128"], save=True, environ=config, modules={})
    return colab_gpu.alloc_conf(environ=config, modules={}, **call)


def _saved_then_loaded(config):
    colab_gpu.alloc_conf(["max_split_size_mb=128"], save=True, environ=config, modules={})
    return colab_gpu.allocator.apply_saved(environ=dict(config), modules={})


def _module_named(ipython, monkeypatch):
    monkeypatch.setitem(ipython.user_ns, "a_module", re)
    return colab_gpu.clear_cache("a_module", shell=ipython)


def _layer_replaced():
    import torch

    head = torch.nn.Sequential(torch.nn.Linear(4, 2))

    def step(batch_size):
        head[0] = torch.nn.Linear(4, 3)
    return colab_gpu.find_batch(step, restore={"head": head}, max=8, progress=False)


@pytest.mark.parametrize("call, python, magic", [
    (lambda config, **_: colab_gpu.alloc_conf(["max_split=1"], environ=config, modules={}),
     "colab_gpu.allocator.KEYS lists every key", "%alloc_conf --keys lists every key"),
    (lambda config, **_: colab_gpu.alloc_conf(environ=dict(config, PYTORCH_ALLOC_CONF="max_split_size_mb:512"),
                                              modules=_torch_module("2.9.1")).warnings[0],
     "any change with colab_gpu.alloc_conf() writes them to every variable",
     "any change with %alloc_conf writes them to every variable"),
    (lambda config, **_: colab_gpu.alloc_conf(environ=dict(config, PYTORCH_ALLOC_CONF="max_split_size_mb:512",
                                                           PYTORCH_CUDA_ALLOC_CONF="max_split_size_mb:128"),
                                              modules=_torch_module("2.13.0")).warnings[0],
     "any change with colab_gpu.alloc_conf() replaces it", "any change with %alloc_conf replaces it"),
    (lambda config, **_: _saved_then(config),
     "applied by colab_gpu.allocator.apply_saved() before CUDA starts; colab_gpu.alloc_conf(forget=True) "
     "removes it", "applied by %load_ext colab_gpu before CUDA starts; %alloc_conf --forget removes it"),
    (lambda config, **_: _saved_then(config, forget=True),
     "colab_gpu.allocator.apply_saved() no longer applies it", "%load_ext colab_gpu no longer applies it"),
    (lambda config, **_: _saved_then_loaded(config),  # a script restoring the setting itself
     "(colab_gpu.alloc_conf(forget=True) removes it)", "(%alloc_conf --forget removes it)"),
    (lambda ipython, monkeypatch, **_: _module_named(ipython, monkeypatch),
     "colab_gpu.clear_cache() alone empties torch's CUDA cache", "%clear_cache alone empties torch's CUDA cache"),
    (lambda **_: _layer_replaced(),
     "do that before calling colab_gpu.find_batch()", "do that in a cell before %%find_batch"),
    (lambda **_: colab_gpu.live_url(),
     "start it with colab_gpu.live.start()", "start it with %gpu_status --live"),
])
def test_hints_name_the_command_as_the_caller_runs_it(call, python, magic, ipython, monkeypatch, tmp_path):
    """A script author calling the plain API was sent to magics they never used ("%alloc_conf
    --keys lists every key"); the magics' own messages keep naming the magic."""
    from colab_gpu.spelling import as_magic

    config = {"COLAB_GPU_CONFIG_DIR": str(tmp_path / "python")}
    said = _message(lambda: call(config=config, ipython=ipython, monkeypatch=monkeypatch))
    assert python in said and "%" not in said
    config = {"COLAB_GPU_CONFIG_DIR": str(tmp_path / "magic")}
    with as_magic():  # as every magic runs the API
        said = _message(lambda: call(config=config, ipython=ipython, monkeypatch=monkeypatch))
    assert magic in said


def test_a_script_can_make_the_live_call_the_status_card_advises():
    """Without a GPU the card says "colab_gpu.live.start(demo=True) runs the monitor on a recorded
    GPU trace"; in a script that had only run `import colab_gpu`, that call raised
    "AttributeError: module 'colab_gpu' has no attribute 'live'" (so did colab_gpu.allocator.KEYS)."""
    script = ("import colab_gpu\n"
              "sampler, started = colab_gpu.live.start(demo=True, interval=0.1)\n"
              "sampler.wait(2, timeout=10)\n"
              "print(repr(colab_gpu.live.stop()).startswith('<RunRecord replay of'), started)\n"
              "print(len(colab_gpu.allocator.KEYS) > 0)\n")
    done = subprocess.run([sys.executable, "-c", script], env=dict(os.environ, PYTHONPATH=str(ROOT)),
                          capture_output=True, text=True, timeout=120)
    assert done.stderr == "" and done.stdout == "True True\nTrue\n"


def test_the_search_leaves_no_reference_cycle_holding_the_step_and_the_restored_objects():
    """The search's trial runner and the search referred to each other: after find_batch()
    returned, the step (the cell, and what it closes over) and the CPU copies of the restore=
    objects stayed alive until Python's next garbage collection, shown by %clear_cache --vars
    as "the rest ... a reference cycle"."""
    import gc
    import weakref

    import torch

    from colab_gpu import find_batch

    class Step:
        def __call__(self, size):
            torch.zeros(size)

    model = torch.nn.Linear(64, 64)
    step = Step()
    step_ref = weakref.ref(step)
    gc.collect()
    gc.disable()
    try:
        result = find_batch(step, max=8, restore=model, progress=False, device="cpu")
        del step
        assert result.answer == 8 and step_ref() is None
    finally:
        gc.enable()
