"""What a student reads from ``help()`` and ``%magic?``: short, true, and free of this process's state."""
from __future__ import annotations

import pydoc

import colab_gpu


def test_help_of_the_package_does_not_print_the_environment_or_the_module_table(monkeypatch):
    # A default bound to os.environ / sys.modules printed every variable (tokens included)
    # and every loaded module into help(colab_gpu.alloc_conf) and Colab's `?` pane.
    monkeypatch.setenv("COLAB_GPU_HELP_MARKER", "secret-looking-value")
    text = pydoc.render_doc(colab_gpu, renderer=pydoc.plaintext)
    assert "secret-looking-value" not in text
    assert "<module 'sys'" not in text
    for name in ("alloc_conf", "detect_runtime"):
        signature = pydoc.render_doc(getattr(colab_gpu, name), renderer=pydoc.plaintext).splitlines()[2]
        assert len(signature) < 500, signature[:200]


def test_each_magics_help_fits_an_80_column_terminal(shell):
    """``%%find_batch?`` in a terminal broke "(or fastest) that fits" as "fastest" / ") that
    fits": the docstrings, dedented, ran to 92 columns."""
    for name in ("%gpu_status", "%alloc_conf", "%clear_cache", "%%find_batch"):
        shown = shell.object_inspect_text(name)
        wide = [line for line in shown.splitlines() if len(line) > 80]
        assert wide == [], (name, wide)


def test_every_name_the_readme_says_python_returns_or_raises_is_a_name_of_the_package():
    """README: "`colab_gpu.find_batch(fn, ...)` ... returns a `BatchResult`", as status()
    returns a `Status`; `from colab_gpu import BatchResult` (to annotate or isinstance-check
    a script's result) raised ImportError while the other result types imported."""
    import pathlib
    import re

    readme = (pathlib.Path(__file__).parent.parent / "README.md").read_text()
    text = " ".join(readme.split())
    named = set(re.findall(r"(?:returns (?:the same data as )?an?|raises) `([A-Z]\w+)`", text))
    named |= set(re.findall(r"the ranking alone \(`([A-Z]\w+)`\)", text))
    assert {"Status", "AllocConfResult", "AllocConfError", "ClearReport", "Holders", "BatchResult"} <= named
    for name in sorted(named):
        assert name in colab_gpu.__all__, name
        assert getattr(colab_gpu, name).__name__ == name
    from colab_gpu import BatchResult

    assert isinstance(colab_gpu.find_batch(lambda size: None, max=4, progress=False), BatchResult)


def test_tab_completion_offers_the_subpackages_the_hints_name(ipython, monkeypatch):
    """The status card says `colab_gpu.live.start(demo=True)`, README `colab_gpu.allocator.KEYS`:
    `colab_gpu.li<TAB>` offered only live_url, and `colab_gpu.__ver<TAB>` nothing."""
    monkeypatch.setattr(ipython.Completer, "use_jedi", False)  # IPython's own completer reads dir()
    monkeypatch.setitem(ipython.user_ns, "colab_gpu", colab_gpu)
    completions = {prefix: [match.rpartition(".")[2] for match in ipython.complete(f"colab_gpu.{prefix}")[1]]
                   for prefix in ("li", "allo", "__ver")}  # IPython 8+ leaves out "colab_gpu"
    assert completions == {"li": ["live", "live_url"], "allo": ["alloc_conf", "allocator"],
                           "__ver": ["__version__"]}


def documented(doc: str, section: str) -> list:
    """The names a numpydoc ``section`` of ``doc`` lists ("save, forget : bool" names two)."""
    import re

    lines = doc.split(f"\n{section}\n{'-' * len(section)}\n", 1)[1].split("\n\n")[0].splitlines() \
        if f"\n{section}\n" in doc else []
    return [name.strip().lstrip("*") for line in lines if re.match(r"[\w*]", line) and " : " in line
            for name in line.split(" : ")[0].split(",")]


def test_help_of_each_function_and_result_lists_its_parameters_and_attributes():
    """help(colab_gpu.find_batch) names every parameter, what it returns and raises, in the
    numpydoc sections IPython's own docstrings use; a result's help names every field."""
    import dataclasses
    import inspect

    from colab_gpu import live

    api = [getattr(colab_gpu, name) for name in colab_gpu.__all__] + [live.start, live.stop, live.running]
    for function in (each for each in api if inspect.isfunction(each)):
        doc = inspect.getdoc(function)
        parameters = list(inspect.signature(function).parameters)
        assert documented(doc, "Parameters") == parameters, function.__name__
        returns = inspect.signature(function).return_annotation not in ("None", None)
        assert ("\nReturns\n-------\n" in doc) == returns, function.__name__
    for result in (each for each in api if dataclasses.is_dataclass(each)):
        fields = [field.name for field in dataclasses.fields(result) if field.repr]
        assert documented(inspect.getdoc(result), "Attributes") == fields, result.__name__
