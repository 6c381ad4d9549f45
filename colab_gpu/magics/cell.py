"""%%find_batch's handling of the cell: read and checked before the search (the batch-size
variable's value, syntax errors, the names the cell binds and reads, its ``!cmd`` and
``%magic`` lines), then run at each size tried; what later runs print is later_runs.py's."""
from __future__ import annotations

import ast
import dataclasses
import numbers
import re
import sys
import types
from collections.abc import Iterator
from typing import Any, Dict, List, Set, Tuple

from IPython.core.error import UsageError

from ..spelling import as_magic
from .later_runs import LaterRuns


def run_cell(code, namespace: dict) -> None:
    """The user's cell, run by %%find_batch: its errors are its own (see raised_in_cell)."""
    __tracebackhide__ = True
    exec(code, namespace)


def raised_in_cell(error: BaseException) -> bool:
    """Whether ``error`` came out of the user's cell (its own ``import``, its own NVML call)."""
    frame = error.__traceback__
    while frame is not None and frame.tb_frame.f_code is not run_cell.__code__:
        frame = frame.tb_next
    return frame is not None


@dataclasses.dataclass(frozen=True)
class Prepared:
    """A %%find_batch cell checked and compiled, with what its search needs."""

    code: types.CodeType
    variable: str  # the batch-size variable, --var
    options: Dict[str, Any]  # search_batch's keywords, checked
    restore_point: Any  # the notebook, the --restore objects and those the cell uses, as they were (batch.state.RestorePoint)
    piped: bool  # later runs may run its ``!cmd`` lines piped (pipes_its_commands)
    warnings: Tuple[str, ...]


def prepare(shell, line: str, cell: str, args) -> Prepared:
    """Every check before anything runs, each a one-line refusal: the variable and the
    --restore names, the cell's syntax and names, the search's options (SearchError and
    RestoreError from colab_gpu.batch, which the magics show as a UsageError)."""
    from ..batch import check_options
    from ..batch.search import check_variable
    from ..batch.state import RestorePoint, stateful_objects

    check_variable(args.var)  # before the hints below, which name it
    namespace = shell.user_ns
    _check_namespace(namespace, args.var, args.restore)
    source = shell.transform_cell(cell)
    try:
        tree = ast.parse(source)  # once: the checks below all read this tree
    except SyntaxError as error:
        raise syntax_error(error, source, below=1) from None
    if not tree.body:  # comments only: every trial would time nothing
        raise UsageError("the cell has no code: put one training step under %%find_batch, "
                         "using the batch-size variable")
    # Registered with IPython like a cell, and one line down for the %%find_batch line:
    # a traceback of the user's error shows their line, numbered as in the cell. The cell's
    # number is the display hook's: IPython 9.8+ counts execution_count up before the cell runs.
    cell_number = getattr(shell.displayhook, "prompt_count", shell.execution_count)
    filename = shell.compile.cache(f"%%find_batch {line}\n{source}", cell_number)
    try:
        code = compile("\n" + source, filename, "exec")
    except SyntaxError as error:  # what only the compiler sees: a return outside a function
        raise syntax_error(error, source) from None
    warnings = checked_names(tree, args.var, namespace)
    options = dict(variable=args.var, mode=args.mode, start=args.start, maximum=args.maximum,
                   steps=args.steps, headroom=args.headroom, multiple_of=args.multiple_of,
                   device=args.device)
    check_options(**options)  # a bad option or --restore object is one line, not after the warnings
    found = {} if args.no_restore else stateful_objects(
        [(name, namespace[name]) for name in read_names(tree) if name in namespace and name != args.var],
        home=[namespace])
    restore_point = RestorePoint(namespace, {name: namespace[name] for name in args.restore}, found)
    return Prepared(code, args.var, options, restore_point, pipes_its_commands(tree), tuple(warnings))


def _check_namespace(namespace: dict, variable: str, restore: List[str]) -> None:
    """Refuses a --var that holds something other than a number, and --restore names that
    name nothing."""
    from ..words import with_article

    held = namespace.get(variable)
    if held is not None and not a_number(held):
        # The answer is written over it: a model or a tensor named by --var would be lost.
        raise UsageError(f"--var {variable}: {variable} holds {with_article(type(held).__name__)}, not a "
                         f"batch size, and the search would replace it with a number; name "
                         f"another variable, like "
                         + " or ".join(f"--var {name}" for name in ("batch_size", "bs") if name != variable))
    missing = [name for name in restore if name not in namespace]
    if missing:
        raise UsageError(f"--restore: no variable named {', '.join(missing)} in the notebook")


def search_cell(shell, prepared: Prepared, progress, plan=None):
    """Run the search over the cell, the first run's output shown, the later runs' hidden
    (later_runs.py); the variable is set to the answer. ``plan``: the Plan it starts from
    (``--plan this``). The BatchResult."""
    from ..batch import search_batch
    from ..words import count

    __tracebackhide__ = True  # the user's error shows their cell's lines, not these
    namespace = shell.user_ns
    for warning in prepared.warnings:
        print(f"colab_gpu: {warning}", file=sys.stderr)
    later_runs = LaterRuns(shell, piped=prepared.piped)

    def step(size: int) -> None:
        __tracebackhide__ = True
        namespace[prepared.variable] = size
        with as_magic(False):  # the user's code is Python: its calls speak it
            run_cell(prepared.code, namespace)

    result = search_batch(step, prepared.restore_point, progress=progress, around_run=later_runs.around_run,
                          plan=plan, **prepared.options)
    if result.answer is not None:
        namespace[prepared.variable] = result.answer
    if later_runs.with_output:
        print(f"colab_gpu: the cell's output is shown for its first run; "
              f"{count(later_runs.with_output, 'later run')} had output too, hidden", file=sys.stderr)
    return result


def plan_cell(shell, prepared: Prepared, gpu: str, apply: bool):
    """Plan the cell for ``gpu`` under fake tensors (colab_gpu.batch.plan): the notebook's
    names and objects put back after, its output hidden (it runs several times, on no data);
    the variable set to the answer only with ``apply``. The Plan."""
    import contextlib
    import io

    from ..batch.plan import plan_step

    __tracebackhide__ = True
    namespace, options = shell.user_ns, prepared.options

    def step(size: int) -> None:
        __tracebackhide__ = True
        namespace[prepared.variable] = size
        with as_magic(False), contextlib.redirect_stdout(io.StringIO()):
            run_cell(prepared.code, namespace)

    objects = [state.obj for state in prepared.restore_point.objects]
    try:
        plan = plan_step(step, gpu, variable=prepared.variable, start=options["start"],
                         maximum=options["maximum"], multiple_of=options["multiple_of"],
                         headroom=options["headroom"], namespace=namespace, objects=objects)
    finally:
        prepared.restore_point.restore()
    if apply and plan.answer is not None:
        namespace[prepared.variable] = plan.answer
        plan = dataclasses.replace(plan, applied=True)
    return plan


def a_number(value) -> bool:
    """A value a batch-size variable may hold before the search writes its answer over it: a
    number other than a flag, also a torch or NumPy scalar (``torch.tensor(64)``, a 0-d array),
    which only the answer's int replaces; not a model, a tensor of many values or a string."""
    if getattr(value, "ndim", None) == 0 and callable(getattr(value, "item", None)):
        try:
            value = value.item()  # a 0-d tensor or array: the number it holds
        except Exception:  # a meta tensor has no value to read
            return False
    return isinstance(value, numbers.Number) and not isinstance(value, bool)


def syntax_error(error: SyntaxError, source: str, below: int = 0) -> UsageError:
    """The cell's syntax error in one line, numbered as in the cell (the %%find_batch line is
    line 1), instead of a traceback through the magic's insides; nothing has run."""
    line = (error.lineno or 0) + below  # in the cell; the compiler gives no text for some errors
    where = f" on line {line} of the cell" if error.lineno else ""
    lines = [""] + source.splitlines()
    text = (error.text or (lines[line - 1] if 1 < line <= len(lines) else "")).strip()
    return UsageError(f"{type(error).__name__}{where}: {error.msg}" + (f": {text}" if text else "")
                      + "; nothing ran")


def checked_names(tree: ast.AST, variable: str, namespace: dict) -> List[str]:
    """Refuses a cell that binds ``variable`` itself; the warnings for a cell that never
    mentions ``variable`` or takes items from an iterator of the notebook."""
    from ..batch.state import assigned_names, mentioned_names

    if variable in assigned_names(tree, nested=False):
        raise UsageError(f"the cell assigns {variable} itself, so every trial would run at the cell's "
                         f"value, not the size tried; remove that assignment")
    assigned, mentioned = assigned_names(tree), mentioned_names(tree) | _words_in_ipython_lines(tree)
    warnings = []
    if variable not in mentioned:
        warnings.append(f"the cell never mentions {variable}; unless a function it calls reads "
                        f"it, every size is the same work (--var names the variable)")
    shared_iterators = sorted(name for name in mentioned - assigned
                              if isinstance(namespace.get(name), Iterator))
    if shared_iterators:  # a generator, a DataLoader's iter(), a file: no state to save
        warnings.append(f"{', '.join(shared_iterators)}: every run of the cell takes items from "
                        f"this iterator and the search cannot put them back; create it again afterwards")
    return warnings


def read_names(tree: ast.AST) -> List[str]:
    """The names a cell reads, in the order it reads them (``model`` in ``model.fc = ...`` too),
    then the words of its magic and shell lines (``%time step(bs)``): where the search looks
    for the models and optimizers to restore. Not a name the cell assigns, unconditionally, on a
    line before it first reads it (``model = Net()`` ... ``model(x)``): the notebook's object of
    that name is not the one the trials change."""
    bound: Dict[str, int] = {}
    for statement in getattr(tree, "body", []):
        if isinstance(statement, (ast.Assign, ast.AnnAssign)) and statement.value is not None:
            targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
            for node in (node for target in targets for node in ast.walk(target)):
                if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                    bound.setdefault(node.id, node.lineno)
    first_read: Dict[str, int] = {}
    for line, _, name in sorted((node.lineno, node.col_offset, node.id) for node in ast.walk(tree)
                                if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)):
        first_read.setdefault(name, line)
    read = [name for name, line in first_read.items() if bound.get(name, line) >= line]
    return list(dict.fromkeys(read + sorted(_words_in_ipython_lines(tree))))


def _words_in_ipython_lines(tree: ast.AST) -> Set[str]:
    """The words of the cell's magic and shell lines, which IPython turned into calls with
    the line as a string (``%time x = f(bs)``: ``get_ipython().run_line_magic('time', 'x =
    f(bs)')``; ``!ls {path}``: ``get_ipython().system('ls {path}')``), the names they read
    among them. The magic's own name is left out."""
    words: Set[str] = set()
    for method, lines in _ipython_lines(tree):
        lines = lines[1:] if method.startswith("run_") else lines
        words.update(word for line in lines for word in re.findall(r"[^\W\d]\w*", line))
    return words


def _ipython_lines(tree: ast.AST) -> Iterator[Tuple[str, List[str]]]:
    """(the shell's method, its string arguments) of each ``get_ipython().method(...)`` call:
    ``!ls`` is ``("system", ["ls"])``, ``%time f(bs)`` ``("run_line_magic", ["time", "f(bs)"])``."""
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        called = node.func
        if isinstance(called, ast.Attribute) and isinstance(called.value, ast.Call) \
                and getattr(called.value.func, "id", None) == "get_ipython":
            yield called.attr, [arg.value for arg in node.args
                                if isinstance(arg, ast.Constant) and isinstance(arg.value, str)]


def pipes_its_commands(tree: ast.AST) -> bool:
    """Whether later runs may run the cell's ``!cmd`` lines piped: none runs in the background,
    which IPython's piped ``system`` refuses (a terminal's own runs it)."""
    return not any(method == "system" and any(line.rstrip().endswith("&") for line in lines)
                   for method, lines in _ipython_lines(tree))
