"""%clear_cache in the real IPython shell: real tensors, real references, checked with weakrefs."""
from __future__ import annotations

import contextlib
import dataclasses
import gc
import itertools
import os
import sys
import types
from xml.etree import ElementTree

import pytest
import torch
from IPython.core.error import UsageError

from conftest import DATA

from colab_gpu.devices import GPU, GiB, GPUProcess, MiB, Snapshot
from colab_gpu.cuda import empty_cuda_cache
from colab_gpu.memory import ClearReport, drop_exception

SIZE = 16_000_000  # float32 elements: 61 MiB, far above anything else the shell holds


def run(shell, code: str):
    """Run a cell as a user would (numbered, in the history)."""
    return shell.run_cell(code, store_history=True)


def alive(shell, name: str = "ref") -> bool:
    return shell.user_ns[name]() is not None


def user_bindings(shell) -> dict:
    """Every name in the user namespace -> id of its object, IPython's output names aside."""
    from colab_gpu.memory.namespace import OUTPUT_NAME

    return {name: id(value) for name, value in shell.user_ns.items() if not OUTPUT_NAME.match(name)}


FAILING_CELL = f"""
import torch, weakref
def train_step():
    activations = torch.ones({SIZE})
    global ref
    ref = weakref.ref(activations)
    raise RuntimeError("simulated failure inside the step")
train_step()
"""


def test_failed_cell_tensor_is_alive_until_clear_cache(shell, capsys):
    assert run(shell, FAILING_CELL).error_in_exec is not None
    gc.collect()
    assert alive(shell), "the failed cell's traceback should keep its frame's tensor alive"
    before = user_bindings(shell)
    capsys.readouterr()
    shell.run_line_magic("clear_cache", "--quiet")
    assert not alive(shell)
    line = capsys.readouterr().out.strip()
    assert line.startswith("clear_cache: freed cpu tensors") and "\n" not in line
    assert user_bindings(shell) == before


def keep_only(shell, holder: str) -> None:
    """Drop every reference to the last error, then put back ``holder`` ("sys.last_value") alone."""
    owner_name, attribute = holder.rsplit(".", 1)
    owner = {"sys": sys, "shell": shell, "shell.InteractiveTB": shell.InteractiveTB}[owner_name]
    # sys.last_exc is set by Python 3.12+ (and IPython there); on older Pythons set it as they do.
    kept = getattr(owner, attribute, None) if attribute != "last_exc" else sys.last_value
    drop_exception(shell)
    setattr(owner, attribute, kept)
    del kept
    gc.collect()


@pytest.mark.parametrize("holder", ["sys.last_value", "sys.last_traceback", "sys.last_exc",
                                    "shell.last_execution_result", "shell.InteractiveTB.tb"])
def test_each_exception_reference_alone_keeps_the_frames_and_is_dropped(shell, holder):
    assert run(shell, FAILING_CELL).error_in_exec is not None
    keep_only(shell, holder)
    assert alive(shell), f"{holder} alone should keep the failed frame alive"
    shell.run_line_magic("clear_cache", "--quiet")
    assert not alive(shell)


def test_debug_and_tb_say_there_is_nothing_after_clear_cache(shell, capsys):
    assert run(shell, FAILING_CELL).error_in_exec is not None
    shell.run_line_magic("clear_cache", "--quiet")
    capsys.readouterr()
    for magic in ("debug", "tb"):
        result = run(shell, f"%{magic}")
        assert result.error_in_exec is None, f"%{magic} failed: {result.error_in_exec!r}"
    assert not hasattr(sys, "last_traceback")  # how IPython and pdb.pm() know nothing failed


def test_the_debugger_of_a_past_debug_session_lets_go_of_the_frames(shell, monkeypatch):
    import io

    assert run(shell, FAILING_CELL).error_in_exec is not None
    monkeypatch.setattr(sys, "stdin", io.StringIO("p activations.shape\nq\n"))
    assert run(shell, "%debug").error_in_exec is None
    shell.run_line_magic("clear_cache", "--quiet")
    assert not alive(shell), "the debugger kept the failed frame (its botframe) alive"
    monkeypatch.setattr(sys, "stdin", io.StringIO("q\n"))
    assert run(shell, FAILING_CELL).error_in_exec is not None
    assert run(shell, "%debug").error_in_exec is None  # IPython made a new debugger
    shell.run_line_magic("clear_cache", "--quiet")


def test_tensor_kept_by_output_history(shell, capsys):
    run(shell, f"import torch, weakref\nshown = torch.ones({SIZE})\nref = weakref.ref(shown)\nshown")
    number = shell.execution_count - 1
    run(shell, "del shown")
    run(shell, "21 * 2")  # an output without tensors, which must stay
    gc.collect()
    assert alive(shell), "Out, _N and _ should keep the displayed tensor alive"
    assert shell.user_ns[f"_{number}"] is shell.user_ns["Out"][number]
    before = user_bindings(shell)
    capsys.readouterr()
    shell.run_line_magic("clear_cache", "")
    assert not alive(shell)
    out = shell.user_ns["Out"]
    assert number not in out and f"_{number}" not in shell.user_ns
    assert 42 in out.values() and shell.user_ns["_"] == 42
    assert user_bindings(shell) == before
    text = capsys.readouterr().out
    assert f"cleared Out[{number}]" in text and "Who holds memory" in text


def test_history_option_clears_every_output(shell):
    run(shell, "'a string output'")
    number = shell.execution_count - 1
    shell.run_line_magic("clear_cache", "--history --quiet")
    assert not shell.user_ns["Out"]
    assert f"_{number}" not in shell.user_ns and shell.user_ns["_"] == ""


def test_history_step_counts_outputs_in_english(shell):
    import colab_gpu

    shell.run_line_magic("clear_cache", "--history --quiet")
    run(shell, "'one output'")
    report = colab_gpu.clear_cache(history=True, shell=shell)
    assert report.steps[1].done == "cleared the whole output history (1 output)"
    report = colab_gpu.clear_cache(history=True, shell=shell)
    assert report.steps[1].done == "cleared the whole output history (0 outputs)"


def test_named_variable_is_deleted_and_no_other(shell):
    run(shell, f"import torch, weakref\nvictim = torch.ones({SIZE})\nref = weakref.ref(victim)\n"
               f"alias = [victim]\nbystander = torch.ones(4)\nvictim")
    number = shell.execution_count - 1
    run(shell, "alias.clear()")
    before = user_bindings(shell)
    shell.run_line_magic("clear_cache", "victim --quiet")
    assert not alive(shell)
    assert "victim" not in shell.user_ns and number not in shell.user_ns["Out"]
    before.pop("victim")
    assert user_bindings(shell) == before


def test_an_object_that_raises_on_any_attribute_is_deleted_by_name(shell):
    run(shell, "class Refusing:\n    def __getattribute__(self, name):\n        raise RuntimeError(name)\n"
               "refusing = Refusing()")
    shell.run_line_magic("clear_cache", "refusing --quiet")
    assert "refusing" not in shell.user_ns
    run(shell, "del Refusing")


def test_a_name_given_twice_is_reported_once(shell, capsys):
    run(shell, "import torch\ntwice = torch.ones(4)")
    capsys.readouterr()
    shell.run_line_magic("clear_cache", "twice twice --quiet")
    assert "twice" not in shell.user_ns
    out = capsys.readouterr().out
    assert "; deleted twice" in out and "twice, twice" not in out


def test_underscore_assigned_by_the_user_is_their_variable(shell):
    import colab_gpu

    run(shell, "'an output'")
    with pytest.raises(UsageError, match="'_' is IPython's own name"):
        shell.run_line_magic("clear_cache", "_")
    run(shell, f"import torch, weakref\n_, index = torch.ones({SIZE // 2}, 2).max(1)\nref = weakref.ref(_)")
    names = [holder.name for holder in colab_gpu.memory_holders(shell=shell).holders]
    assert names[:2] == ["index", "_"], "IPython no longer updates _: it is the user's"
    shell.run_line_magic("clear_cache", "_ --quiet")
    assert not alive(shell) and "_" not in shell.user_ns
    run(shell, "__ = index")
    assert "__" in [holder.name for holder in colab_gpu.memory_holders(shell=shell).holders]
    run(shell, "del index, __\n'next output'")
    assert shell.user_ns["_"] == "next output"  # IPython's own again


def test_underscore_the_user_bound_to_a_shown_output_stays_bound(shell):
    run(shell, "import torch\nshown_model = torch.nn.Linear(8, 8)\nshown_model")
    number = shell.execution_count - 1
    run(shell, "1 + 1")
    run(shell, "_ = shown_model.eval()")  # the idiom that hides the repr: `_` is now the user's
    shell.run_line_magic("clear_cache", "--quiet")
    assert number not in shell.user_ns["Out"]
    assert shell.user_ns["_"] is shell.user_ns["shown_model"]
    run(shell, "del _, shown_model")


def test_named_variable_also_bound_elsewhere_stays_bound_there(shell):
    run(shell, f"import torch, weakref\nfirst = torch.ones({SIZE})\nsecond = first\nref = weakref.ref(first)")
    shell.run_line_magic("clear_cache", "first --quiet")
    assert "first" not in shell.user_ns
    assert shell.user_ns["second"] is shell.user_ns["ref"]()  # IPython's del_var would delete it too
    report = __import__("colab_gpu").memory_holders(shell=shell)
    assert report.holders[0].name == "second"
    run(shell, "del second")


def test_bad_names_are_refused_before_anything_changes(shell):
    assert run(shell, FAILING_CELL).error_in_exec is not None
    run(shell, "kept = 1")
    with pytest.raises(UsageError, match="no variable named 'missing'"):
        shell.run_line_magic("clear_cache", "kept missing")
    with pytest.raises(UsageError, match=r"no variable named 'print' \(it is a Python builtin\)"):
        shell.run_line_magic("clear_cache", "print")
    with pytest.raises(UsageError, match="IPython's own name, not a variable of yours; use --history"):
        shell.run_line_magic("clear_cache", "Out")
    for name in ("In", "get_ipython", "exit"):  # no output history: --history would not help
        with pytest.raises(UsageError, match=f"^'{name}' is IPython's own name, not a variable of yours$"):
            shell.run_line_magic("clear_cache", name)
    with pytest.raises(UsageError, match="'__name__' is Python's own name"):
        shell.run_line_magic("clear_cache", "__name__")
    run(shell, "import torch")
    with pytest.raises(UsageError, match="'torch' is a module: deleting its name frees no memory"):
        shell.run_line_magic("clear_cache", "torch")
    assert "torch" in shell.user_ns
    with pytest.raises(UsageError, match="--vars only shows"):
        shell.run_line_magic("clear_cache", "--vars kept")
    with pytest.raises(UsageError, match=r"unrecognized arguments: -h \(usage: %clear_cache "
                                         r"\[--history\] \[--vars\] \[--quiet\] \[NAME \.\.\.\]; "
                                         r"%clear_cache\? explains each option\)"):
        shell.run_line_magic("clear_cache", "-h")
    assert shell.user_ns["kept"] == 1
    assert alive(shell), "a refused request must not have dropped the exception either"
    shell.run_line_magic("clear_cache", "--quiet")


def test_vars_only_ranks_and_frees_nothing(shell, capsys):
    assert run(shell, FAILING_CELL).error_in_exec is not None
    run(shell, f"import torch\nbig_one = torch.ones({SIZE})\nsmall_one = torch.ones(1000)")
    capsys.readouterr()
    shell.run_line_magic("clear_cache", "--vars")
    text = capsys.readouterr().out
    assert alive(shell), "--vars must free nothing"
    assert "Steps" not in text
    lines = text.splitlines()
    assert lines[1].split()[0] == "big_one"
    assert any(line.split()[0] == "small_one" for line in lines[2:])
    run(shell, "del big_one, small_one")
    shell.run_line_magic("clear_cache", "--quiet")


def rows(text: str, heading: str) -> dict:
    """The rows of one section of a text report: label -> its value, folded lines joined."""
    section = text.split(heading, 1)[1].splitlines()[1:]
    found, label = {}, None
    for line in itertools.takewhile(lambda line: line.startswith("  "), section):
        if line[2] != " ":
            label, value = line[2:18].strip(), line[19:]
            found[label] = value
        else:
            found[label] += " " + line.strip()
    return found


def test_vars_names_the_output_and_the_error_that_hold_what_no_variable_does(shell, capsys):
    """An output and a failed cell's traceback held 92 MiB and --vars said "No variable of
    yours holds a tensor", pointing nowhere."""
    from colab_gpu.render import size

    run(shell, f"import torch\ntorch.ones({SIZE // 2})")
    number = shell.execution_count - 1
    assert run(shell, FAILING_CELL).error_in_exec is not None
    try:
        capsys.readouterr()
        shell.run_line_magic("clear_cache", "--vars")
        text = capsys.readouterr().out
        assert "Held by none of your variables: cpu " in text
        found = rows(text, "Held by none of your variables")
        assert found[f"Out[{number}]"] == f"cpu {size(2 * SIZE)} in 1 tensor - %clear_cache clears it"
        assert found["the last error"] == (f"cpu {size(4 * SIZE)} in 1 tensor - its traceback's "
                                           f"frames; %clear_cache drops it")
        assert alive(shell), "--vars must free nothing, and keep no tensor"
        html = __import__("colab_gpu").memory_holders(shell=shell)._repr_html_()
        assert f"Out[{number}]</td><td>cpu {size(2 * SIZE)}".replace(" MiB", "&nbsp;MiB") in html
        assert "the last error</td>" in html
        assert "colab_gpu.clear_cache() clears it" in html  # a script reads the call, not the magic
        shell.run_line_magic("clear_cache", "--vars --quiet")
        line = capsys.readouterr().out
        assert f"(the last error {size(4 * SIZE)}, Out[{number}] {size(2 * SIZE)}" in line
    finally:
        shell.run_line_magic("clear_cache", "--quiet")
    assert not alive(shell)


def test_a_kept_exception_is_named_with_the_locals_of_the_functions_that_called_its_catcher(shell, capsys):
    """A step that stored its error (`errors.append(e)`) kept train()'s 61 MiB alive through
    the frame that caught it, and --vars said no variable holds a tensor."""
    from colab_gpu.render import size

    run(shell, f"""
import torch, weakref
def step(errors):
    try:
        raise ValueError("bad batch")
    except ValueError as error:
        errors.append(error)
def train():
    weights = torch.ones({SIZE})
    global ref
    ref = weakref.ref(weights)
    errors = []
    step(errors)
    return errors
errs = train()
""")
    gc.collect()
    assert alive(shell), "the caught exception's frame should keep train()'s frame alive"
    capsys.readouterr()
    shell.run_line_magic("clear_cache", "--vars")
    found = rows(capsys.readouterr().out, "Who holds memory")
    assert found["errs"].startswith(f"{size(4 * SIZE)} in 1 tensor")
    shell.run_line_magic("clear_cache", "errs --quiet")
    assert not alive(shell)


@pytest.mark.parametrize("holder", ["sys.last_value", "sys.last_traceback", "sys.last_exc",
                                    "shell.last_execution_result", "shell.InteractiveTB.tb",
                                    "shell.InteractiveTB.pdb"])
def test_each_reference_to_the_last_error_alone_is_named(shell, capsys, monkeypatch, holder):
    import io

    from colab_gpu.render import size

    assert run(shell, FAILING_CELL).error_in_exec is not None
    if holder.endswith("pdb"):  # a %debug session, then its debugger alone
        monkeypatch.setattr(sys, "stdin", io.StringIO("p activations.shape\nq\n"))
        assert run(shell, "%debug").error_in_exec is None
    keep_only(shell, holder)
    capsys.readouterr()
    try:
        shell.run_line_magic("clear_cache", "--vars")
        found = rows(capsys.readouterr().out, "Held by none of your variables")
        assert found["the last error"].startswith(f"cpu {size(4 * SIZE)} in 1 tensor")
    finally:
        shell.run_line_magic("clear_cache", "--quiet")
    assert not alive(shell)


@pytest.mark.parametrize("keeper", ["a library's cache", "a thread"])
def test_memory_no_variable_output_or_error_reaches_is_said_to_be_the_rest(shell, capsys, keeper):
    """What a module-level cache or a running thread keeps is in no namespace: the report
    summed it nowhere; it now gives the rest, what the reading holds beyond every root."""
    import colab_gpu
    from colab_gpu.render import size

    shell.run_line_magic("clear_cache", "--quiet")
    before = dict(colab_gpu.memory_holders(shell=shell).unreached).get("cpu", 0)
    run(shell, "import torch, sys, types, threading\nstop = threading.Event()")
    cell = (f"sys.modules['hunt_cache'] = types.SimpleNamespace(cache=[torch.ones({SIZE})])"
            if keeper == "a library's cache" else
            f"def work(started=threading.Event()):\n    kept = torch.ones({SIZE})\n    started.set()\n"
            f"    stop.wait()\nworker = threading.Thread(target=work)\nworker.start()\n"
            f"work.__defaults__[0].wait()\ndel work, worker")
    run(shell, cell)
    try:
        capsys.readouterr()
        shell.run_line_magic("clear_cache", "")
        found = rows(capsys.readouterr().out, "Held by none of your variables")
        assert found["the rest"] == (f"cpu {size(before + 4 * SIZE)} that no variable, output or "
                                     f"error reaches; held by a library's cache, a thread or a "
                                     f"reference cycle")
    finally:
        shell.user_ns["stop"].set()
        sys.modules.pop("hunt_cache", None)
        run(shell, "del stop")


def test_a_paused_generator_is_named_as_a_holder(shell, capsys):
    """A generator was left out of the ranking: after `del first` its 61 MiB stayed, and no
    variable said it held them."""
    run(shell, f"import torch\ndef batches():\n    data = torch.ones({SIZE})\n    yield data[:8]\n"
               f"gen = batches()\nfirst = next(gen)")
    try:
        shell.run_line_magic("clear_cache", "first --quiet")
        assert capsys.readouterr().out == "clear_cache: nothing freed; deleted first; biggest holder: gen 61 MiB\n"
    finally:
        run(shell, "del gen, batches")


def test_a_loss_is_named_with_the_activations_its_graph_saved(shell):
    """`loss` (kept without .item()) holds every activation its graph saved for backward();
    the ranking said 4 B, the loss's own storage, and pointed at nothing."""
    import colab_gpu

    run(shell, f"import torch\nweights = torch.ones({SIZE}, requires_grad=True)\n"
               f"loss = weights.relu().sum()")  # relu saves its output: SIZE floats
    try:
        loss = {h.name: h for h in colab_gpu.memory_holders(shell=shell).holders}["loss"]
        assert loss.unique == 4 * SIZE + 4, "relu's saved output and the loss itself"
        assert loss.nbytes == 2 * 4 * SIZE + 4, "and the leaf, which weights holds too"
        run(shell, "loss.backward()")  # frees what the graph saved
        loss = {h.name: h for h in colab_gpu.memory_holders(shell=shell).holders}["loss"]
        assert loss.unique == 4
        # An unpack hook may copy to the GPU or recompute a checkpointed forward: never run it.
        run(shell, "unpacked = []\nwith torch.autograd.graph.saved_tensors_hooks(\n"
                   "        lambda t: t, lambda t: unpacked.append(t) or t):\n"
                   "    hooked = weights.relu().sum()")
        hooked = {h.name: h for h in colab_gpu.memory_holders(shell=shell).holders}["hooked"]
        assert hooked.unique == 4 * SIZE + 4 and shell.user_ns["unpacked"] == []
    finally:
        run(shell, "del weights, loss, hooked, unpacked")


def test_a_loss_after_backward_is_named_with_what_a_custom_functions_ctx_keeps(shell):
    """After backward() a custom Function's saved tensors raise on reading, and the walk gave
    up on its node there: a tensor kept as a ctx attribute (``ctx.mask = ...``), alive until
    `loss` goes, was left out of what `loss` holds."""
    import colab_gpu

    run(shell, f"import torch\n"
               f"class Masked(torch.autograd.Function):\n"
               f"    @staticmethod\n"
               f"    def forward(ctx, x):\n"
               f"        ctx.mask = torch.ones({SIZE})\n"
               f"        ctx.save_for_backward(x)\n"
               f"        return x * 2\n"
               f"    @staticmethod\n"
               f"    def backward(ctx, grad):\n"
               f"        return grad * 2\n"
               f"weights = torch.ones(4, requires_grad=True)\n"
               f"loss = Masked.apply(weights).sum()\n"
               f"loss.backward()")
    try:
        loss = {h.name: h for h in colab_gpu.memory_holders(shell=shell).holders}["loss"]
        assert loss.unique == 4 * SIZE + 4, "the ctx's mask and the loss itself"
    finally:
        run(shell, "del weights, loss, Masked")


def test_freed_counts_the_activations_a_deleted_loss_kept(shell):
    """relu's saved output has no Python object once `.sum()` ran: `%clear_cache loss` freed
    its 61 MiB and the report said 4 B."""
    import colab_gpu

    run(shell, f"import torch\nweights = torch.ones({SIZE}, requires_grad=True)\n"
               f"loss = weights.relu().sum()")
    try:
        report = colab_gpu.clear_cache("loss", shell=shell)
        assert report.freed("cpu") == 4 * SIZE + 4
    finally:
        run(shell, "del weights")


def test_freed_counts_a_deleted_sparse_tensors_indices_and_values(shell, capsys):
    """A sparse tensor's memory is in its indices and values, which have no Python object:
    `%clear_cache sp` freed its 61 MiB and the report said "nothing freed; cpu tensors 0 B -> 0 B"."""
    from colab_gpu.render import size

    run(shell, f"import torch\nsp = torch.ones({SIZE // 3}).to_sparse()")  # int64 indices, float values
    shell.run_line_magic("clear_cache", "sp")
    out = capsys.readouterr().out
    assert out.startswith(f"clear_cache: freed cpu tensors {size(SIZE // 3 * 12)}; deleted sp")


def test_vars_counts_a_sparse_tensor_once(shell, capsys):
    """`%clear_cache --vars` said a coalesced sparse COO tensor (or a CSR one) was held "in 4
    tensors": its indices and values counted as tensors of the user's, who has one."""
    from colab_gpu.render import size

    run(shell, f"import torch\nsp = torch.ones({SIZE // 3}).to_sparse()\ncsr = torch.eye(64).to_sparse_csr()")
    capsys.readouterr()
    try:
        shell.run_line_magic("clear_cache", "--vars")
        lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[1:] if line.strip()}
        assert f"{size(SIZE // 3 * 12)} in 1 tensor" in lines["sp"]  # int64 indices, float values
        assert " in 1 tensor" in lines["csr"]
    finally:
        run(shell, "del sp, csr")


def test_vars_names_the_numpy_array_a_tensor_lies_on(shell, capsys):
    """`t = torch.from_numpy(arr)`: --vars said t held 61 MiB alone and did not list arr, which
    owns that memory; `del t` would have freed nothing."""
    from colab_gpu.render import size

    run(shell, f"import numpy, torch\narr = numpy.zeros({SIZE}, dtype=numpy.float32)\nt = torch.from_numpy(arr)")
    capsys.readouterr()
    try:
        shell.run_line_magic("clear_cache", "--vars")
        text = " ".join(capsys.readouterr().out.split())
        assert (f"arr {size(4 * SIZE)} in 1 NumPy array (cpu {size(4 * SIZE)}); all shared with other "
                f"variables - ndarray") in text
        assert f"t {size(4 * SIZE)} in 1 tensor (cpu {size(4 * SIZE)}); all shared with other variables" in text
        assert f"all variables cpu {size(4 * SIZE)} (each storage counted once)" in text
    finally:
        run(shell, "del arr, t")


def test_deleting_a_tensor_made_from_numpy_says_the_array_keeps_its_memory(shell):
    """`%clear_cache t` for t = torch.from_numpy(arr) said "freed cpu tensors 61 MiB" and no
    more, though not a byte went back: arr owns it. A plain tensor deleted beside it is freed."""
    import colab_gpu
    from colab_gpu.render import size

    run(shell, f"import numpy, torch\narr = numpy.zeros({SIZE}, dtype=numpy.float32)\n"
               f"t = torch.from_numpy(arr[1000:])\nplain = torch.ones({SIZE // 2})")
    try:
        report = colab_gpu.clear_cache("t", "plain", shell=shell)
        assert report.kept_by_arrays == ((("arr", 4 * (SIZE - 1000))),)
        assert (f"deleted t, plain; NumPy array arr keeps {size(4 * (SIZE - 1000))} of that (the "
                f"deleted tensors lay on its memory)") in report.summary()
        assert "arr" in shell.user_ns
        report = colab_gpu.clear_cache("arr", shell=shell)  # no tensor lay on it: nothing said
        assert report.kept_by_arrays == () and "NumPy" not in report.summary()
    finally:
        run(shell, "arr = t = plain = None")


def test_python_api_returns_the_report(shell):
    import colab_gpu

    assert run(shell, FAILING_CELL).error_in_exec is not None
    report = colab_gpu.clear_cache(shell=shell)
    assert isinstance(report, ClearReport)
    assert not alive(shell)
    assert report.freed("cpu") >= SIZE * 4
    names = [step.name for step in report.steps]
    assert names == ["exception", "output history", "garbage collection"]
    assert "sys.last_traceback" in report.steps[0].done
    assert not report.cuda_initialized and not torch.cuda.is_initialized()
    assert repr(report).startswith("<ClearReport clear_cache: freed cpu tensors")
    # print(): the report opens with the line, folded as the text report folds its rows
    assert " ".join(str(report).split()).startswith(" ".join(report.summary().split()))
    assert "Steps:" in str(report)
    html = report._repr_html_()
    assert "cgpu-card" in html and "Steps" in html


@pytest.mark.parametrize("wrong", [["kept"], 0])
def test_python_api_says_names_are_strings(shell, wrong):
    import colab_gpu

    run(shell, "kept = 1")
    with pytest.raises(TypeError, match=r"strings, one per argument, e\.g\. clear_cache\('model', 'optimizer'\)"):
        colab_gpu.clear_cache(wrong, shell=shell)
    assert shell.user_ns["kept"] == 1


def test_html_escapes_names(shell):
    import colab_gpu

    run(shell, "import torch\nclass Odd:\n    pass\nodd = Odd()\nodd.t = torch.ones(8)")
    shell.user_ns["odd"].__class__.__qualname__ = "<b>Odd</b>"
    html = colab_gpu.memory_holders(shell=shell)._repr_html_()
    assert "&lt;b&gt;Odd&lt;/b&gt;" in html and "<b>Odd</b>" not in html
    run(shell, "del odd, Odd")


def mib(text: str) -> int:
    return int(text.split()[0]) * MiB


class RecordedT4:
    """The hardware boundary: the Tesla T4 of tests/data/nvidia-smi-xml/tesla-t4.xml (a real
    recording), its python process given this test's pid so that it counts as this process."""

    label = "replay of tesla-t4.xml"

    def snapshot(self) -> Snapshot:
        gpu = ElementTree.parse(DATA / "nvidia-smi-xml" / "tesla-t4.xml").find("gpu")
        memory = gpu.find("fb_memory_usage")
        processes = tuple(
            GPUProcess(pid=os.getpid() if p.findtext("process_name") == "python" else int(p.findtext("pid")),
                       name=p.findtext("process_name"), used_memory=mib(p.findtext("used_memory")))
            for p in gpu.find("processes"))
        return Snapshot(source=self.label, gpus=(GPU(
            index=0, name=gpu.findtext("product_name"), uuid=gpu.findtext("uuid"),
            memory_total=mib(memory.findtext("total")), memory_reserved=mib(memory.findtext("reserved")),
            memory_used=mib(memory.findtext("used")), memory_free=mib(memory.findtext("free")),
            processes=processes),))

    def close(self) -> None:
        pass


def test_memory_outside_torch_from_a_recorded_gpu(shell, clean_env):
    import colab_gpu

    holders = colab_gpu.memory_holders(shell=shell, source=RecordedT4())
    (part,) = holders.outside_torch
    assert part.other_processes == 22 * MiB
    assert part.context_and_non_torch == (1032 - 22) * MiB  # CUDA is not initialized here
    report = colab_gpu.clear_cache(shell=shell, source=RecordedT4())
    gpu = [reading for reading in report.after if reading.device == "cuda:0"]
    assert gpu and gpu[0].nvml_used == 1032 * MiB and gpu[0].allocated is None
    text = __import__("IPython").lib.pretty.pretty(report)
    assert "other processes 22 MiB" in text and "NVML used 1.01 GiB -> 1.01 GiB" in text


def test_memory_outside_torch_in_a_container_is_not_put_on_this_process(shell, clean_env):
    """In a container NVML lists the host's process ids, none of them this one's: the T4's
    recorded processes (Xorg, a python holding 1 GiB) were all "this process (CUDA context
    and other libraries)", though this process had not even started CUDA."""
    class Container(RecordedT4):
        def snapshot(self):
            snapshot = super().snapshot()
            gpu = snapshot.gpus[0]
            processes = tuple(dataclasses.replace(p, pid=p.pid + 10 ** 6) for p in gpu.processes)
            return dataclasses.replace(snapshot, gpus=(dataclasses.replace(gpu, processes=processes),))

    import colab_gpu

    text = " ".join(str(colab_gpu.memory_holders(shell=shell, source=Container())).split())
    assert "other processes and this one 1.01 GiB (NVML lists no process under this one's id" in text
    assert "this process 1010 MiB" not in text and "unknown" not in text


@pytest.mark.parametrize("others, text, legend", [
    (2 * GiB, "other processes 2.00 GiB, CUDA context and non-torch 1.00 GiB, torch cache",
     "CUDA context and non-torch 1.00 GiB"),
    (None, "every process's CUDA context and non-torch 1.00 GiB (NVML lists no process under this one's id",
     "every process&#x27;s CUDA context and non-torch 1.00 GiB"),
])
def test_the_status_cards_breakdown_says_what_it_cannot_split(others, text, legend):
    """The card's "where" row had "other processes unknown, CUDA context and non-torch 3 GiB"
    in a container: the 3 GiB were every process's, not this one's context."""
    from colab_gpu.torch_view import MemoryBreakdown
    from colab_gpu.render import breakdown_summary
    from colab_gpu.render.html import breakdown_bar

    part = MemoryBreakdown(nvml_index=0, total=15 * GiB, driver_reserved=None, other_processes=others,
                           context_and_non_torch=GiB, torch_cache=GiB, torch_tensors=4 * GiB, free=7 * GiB)
    assert text in breakdown_summary(part) and "unknown" not in breakdown_summary(part)
    assert legend in breakdown_bar(part)


def test_clear_cache_reads_the_gpus_once_per_reading(shell, clean_env):
    # Before, after each step, and nothing more: the ranking of who holds memory outside
    # torch uses the last step's reading, not a read of its own a moment later.
    class Counted(RecordedT4):
        reads = 0

        def snapshot(self):
            self.reads += 1
            return super().snapshot()

    source = Counted()
    report = __import__("colab_gpu").clear_cache(shell=shell, source=source)
    assert source.reads == 1 + len(report.steps), (source.reads, report.steps)
    (part,) = report.holders.outside_torch
    assert part.other_processes == 22 * MiB


class FakeCuda:
    """The CUDA device boundary: two GPUs, only the first with a context; records the calls."""

    def __init__(self):
        self.calls = []
        self.cuda = types.SimpleNamespace(
            device_count=lambda: 2,
            synchronize=lambda device: self.calls.append(("synchronize", device)),
            empty_cache=lambda: self.calls.append(("empty_cache",)),
            ipc_collect=lambda: self.calls.append(("ipc_collect",)),
            memory_stats=lambda device: {"reserved_bytes.all.peak": 2 * MiB if device == 0 else 0},
            current_device=lambda: 0,
            device=self._device,
        )
        self._C = types.SimpleNamespace()

    @contextlib.contextmanager
    def _device(self, index):
        self.calls.append(("current device", index))
        yield
        self.calls.append(("current device back", 0))


def test_empty_cuda_cache_never_touches_a_device_without_a_context():
    fake = FakeCuda()
    assert empty_cuda_cache(fake) == ["cuda:0"]
    assert fake.calls == [("synchronize", 0), ("empty_cache",), ("ipc_collect",)]
    fake = FakeCuda()
    fake._C._cuda_clearCublasWorkspaces = lambda: fake.calls.append(("clear cuBLAS workspaces",))
    empty_cuda_cache(fake)
    assert fake.calls[1] == ("clear cuBLAS workspaces",), "before empty_cache, which can then free them"
    fake = FakeCuda()
    fake._C._cuda_hasPrimaryContext = lambda device: device == 1
    assert empty_cuda_cache(fake) == ["cuda:1"]


def test_empty_cuda_cache_runs_on_a_device_in_use_not_on_a_current_device_without_a_context():
    """A model on cuda:1 leaves the current device at 0; empty_cache() there would create a
    context on GPU 0 (pytorch#144025), on a shared box maybe another user's full GPU."""
    fake = FakeCuda()
    fake._C._cuda_hasPrimaryContext = lambda device: device == 1
    empty_cuda_cache(fake)
    assert fake.calls == [("synchronize", 1), ("current device", 1), ("empty_cache",), ("ipc_collect",),
                          ("current device back", 0)]


PLAIN_PYTHON = """
import code, sys, __main__
import colab_gpu
report = colab_gpu.clear_cache()
assert "torch" not in sys.modules, "clear_cache imported torch"
print("without torch:", report.summary(), "|", report.holders.summary())
console = code.InteractiveInterpreter(__main__.__dict__)  # the plain REPL's own machinery
console.runsource("import torch, weakref")
console.runsource("def step():\\n    x = torch.ones(%d)\\n    global ref\\n    ref = weakref.ref(x)\\n    1 / 0\\n", symbol="exec")
console.runsource("step()")
assert ref() is not None and sys.last_traceback is not None
report = colab_gpu.clear_cache()
print("alive after clear_cache:", ref() is not None)
print(report.summary())
""" % SIZE


def test_plain_python_without_ipython_or_torch():
    import subprocess

    from conftest import ROOT

    done = subprocess.run([sys.executable, "-c", PLAIN_PYTHON], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "without torch: clear_cache: nothing freed | torch is not imported: no tensor is held."
    assert lines[1] == "alive after clear_cache: False"
    assert lines[2].startswith("clear_cache: freed cpu tensors 61 MiB")


def test_torch_view_is_read_when_nvml_is_missing(monkeypatch):
    """On a GPU machine without a usable NVML (no pynvml) torch's own numbers must still show.
    This machine has no NVIDIA driver, so the real NVML source fails for real; the CUDA device
    is the faked boundary."""
    from colab_gpu.devices.nvml import NvmlSource
    from colab_gpu.memory import read_memory

    snapshot = NvmlSource().snapshot()
    assert not snapshot.ok
    stats = {"allocated_bytes.all.current": 3 * MiB, "reserved_bytes.all.current": 8 * MiB}
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "memory_stats", lambda device: stats)
    readings = {reading.device: reading for reading in read_memory(torch, snapshot)}
    assert readings["cuda:0"].allocated == 3 * MiB and readings["cuda:0"].reserved == 8 * MiB
    assert readings["cuda:0"].nvml_used is None and "cpu" in readings


DEVICE_SIDE_ASSERT = ("CUDA error: device-side assert triggered\nCUDA kernel errors might be asynchronously "
                      "reported at some other API call, so the stacktrace below might be incorrect.\n"
                      "For debugging consider passing CUDA_LAUNCH_BLOCKING=1\n")


@pytest.fixture
def cuda_after_a_device_side_assert(monkeypatch):
    """CUDA runs on cuda:0 (the faked boundary), and every CUDA call fails as after a
    device-side assert: the error is sticky, so synchronize() is the first to raise it."""
    stats = {"allocated_bytes.all.current": 3 * MiB, "reserved_bytes.all.current": 8 * MiB}
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "memory_stats", lambda device: stats)
    monkeypatch.setattr(torch._C, "_cuda_hasPrimaryContext", lambda device: True, raising=False)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    error = getattr(torch, "AcceleratorError", RuntimeError)  # what torch 2.8+ raises for a CUDA error

    def broken(*args):
        raise error(DEVICE_SIDE_ASSERT)

    for name in ("synchronize", "empty_cache", "ipc_collect"):
        monkeypatch.setattr(torch.cuda, name, broken)


def test_a_cuda_error_in_the_last_step_is_reported_not_raised(shell, capsys, cuda_after_a_device_side_assert):
    """After a device-side assert, %clear_cache left a traceback of torch.cuda.synchronize()
    and no report, though it had already dropped the failed cell's references."""
    import colab_gpu

    assert run(shell, FAILING_CELL).error_in_exec is not None
    capsys.readouterr()
    result = run(shell, "%clear_cache --quiet")
    assert result.error_in_exec is None, repr(result.error_in_exec)
    out = capsys.readouterr()
    assert "Traceback" not in out.out + out.err
    assert not alive(shell), "the steps before the failing one still ran"
    line = " ".join(out.out.split())
    assert line.startswith("clear_cache: freed cpu tensors 61 MiB; CUDA cache step failed: ")
    assert ("Error: CUDA error: device-side assert triggered (the CUDA context is broken: nothing on the "
            "GPU can be freed until the runtime restarts)") in line and "CUDA_LAUNCH_BLOCKING" not in line
    report = colab_gpu.clear_cache(shell=shell)
    assert [step.error is not None for step in report.steps] == [False, False, False, True]
    assert report.steps[-1].done.startswith("failed: ")
    assert "4. CUDA cache          failed: " in str(report)


def test_cuda_started_by_a_query_alone_is_left_untouched(shell, monkeypatch):
    """`torch.cuda.current_device()` initializes CUDA without a context on any GPU: the last
    step still called empty_cache() and ipc_collect() on the context-less current device and
    read "; cuBLAS workspaces, empty_cache(), ipc_collect()", a sentence cut at its start."""
    fake = FakeCuda()
    fake._C._cuda_hasPrimaryContext = lambda device: False
    fake._C._cuda_clearCublasWorkspaces = lambda: fake.calls.append(("clear cuBLAS workspaces",))
    assert empty_cuda_cache(fake) == [] and fake.calls == []

    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "memory_stats", lambda device: {})
    monkeypatch.setattr(torch._C, "_cuda_hasPrimaryContext", lambda device: False, raising=False)
    for name in ("synchronize", "empty_cache", "ipc_collect", "current_device"):
        monkeypatch.setattr(torch.cuda, name, lambda *args: pytest.fail("a CUDA call without a context"))
    report = __import__("colab_gpu").clear_cache(shell=shell)
    assert report.steps[-1].done == "no GPU has a CUDA context yet: nothing is cached"


@pytest.fixture
def cuda_holding(monkeypatch):
    """CUDA runs on cuda:0 (the faked boundary) with ``stats`` as its allocator's statistics:
    what a test puts there is allocated memory no variable of the shell reaches."""
    stats = {}
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "memory_stats", lambda device=None: stats)
    monkeypatch.setattr(torch._C, "_cuda_hasPrimaryContext", lambda device: True, raising=False)
    monkeypatch.setattr(torch._C, "_cuda_clearCublasWorkspaces", lambda: None, raising=False)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    for name in ("synchronize", "empty_cache", "ipc_collect"):
        monkeypatch.setattr(torch.cuda, name, lambda *args: None)
    return stats


def test_the_quiet_line_says_what_no_variable_holds(shell, capsys, cuda_holding):
    """`%clear_cache --quiet` said "nothing freed" and nothing else while 3 GiB stayed
    allocated that no variable holds: the line must give the rest, as the report does."""
    cuda_holding.update({"allocated_bytes.all.current": 3 * GiB, "reserved_bytes.all.current": 4 * GiB})
    shell.run_line_magic("clear_cache", "")
    rest = rows(capsys.readouterr().out, "Held by none of your variables")["the rest"]
    # other tests' leftovers may be in the rest too (cpu ...), before the GPU's
    assert "at least cuda:0 3.00 GiB that no variable" in rest
    shell.run_line_magic("clear_cache", "--quiet")
    line = capsys.readouterr().out
    assert "\n" not in line.strip()
    assert "; held by no variable: " in line and "cuda:0 3.00 GiB" in line.split("held by no variable: ")[1]
    assert f"the rest {rest.split(' that ')[0]})" in line  # the report's figures


def test_an_outputs_row_counts_only_the_tensors_clearing_it_would_free(shell, capsys):
    """`(weights, torch.ones(n))` shown as Out[N] read "cpu 30.5 MiB in 2 tensors": the bytes
    were its own tensor's, the count included the variable's, which clearing it leaves alive."""
    from colab_gpu.render import size

    run(shell, f"import torch\nweights = torch.ones({SIZE // 2})")
    run(shell, f"weights, weights[:10], torch.ones({SIZE // 2})")
    number = shell.execution_count - 1
    try:
        capsys.readouterr()
        shell.run_line_magic("clear_cache", "--vars")
        found = rows(capsys.readouterr().out, "Held by none of your variables")
        assert found[f"Out[{number}]"] == (f"cpu {size(2 * SIZE)} in 1 tensor (and 2 tensors whose "
                                           f"memory a variable holds) - %clear_cache clears it")
    finally:
        run(shell, "del weights")
        shell.run_line_magic("clear_cache", "--quiet")


def test_an_output_shown_twice_is_counted_once(shell, capsys):
    """A tensor shown, then shown again by `_`, read "Out[N] 30.5 MiB" and "Out[N+1] 30.5 MiB"
    under "Held by none of your variables: cpu 30.5 MiB": the rows added up to twice the total."""
    from colab_gpu.render import size

    run(shell, f"import torch\ntorch.ones({SIZE // 2})")
    number = shell.execution_count - 1
    run(shell, "_")
    try:
        capsys.readouterr()
        shell.run_line_magic("clear_cache", "--vars")
        found = rows(capsys.readouterr().out, "Held by none of your variables")
        assert found[f"Out[{number}]"] == f"cpu {size(2 * SIZE)} in 1 tensor - %clear_cache clears it"
        assert f"Out[{number + 1}]" not in found
    finally:
        shell.run_line_magic("clear_cache", "--quiet")
