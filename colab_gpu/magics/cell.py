"""%%find_batch's reading of the cell before the search: the batch-size variable's value,
syntax errors, the names the cell binds and reads, its ``!cmd`` and ``%magic`` lines."""
from __future__ import annotations

import ast
import numbers
import re
from collections.abc import Iterator
from typing import List, Set, Tuple

from IPython.core.error import UsageError


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
        called = getattr(node, "func", None)
        if isinstance(called, ast.Attribute) and isinstance(called.value, ast.Call) \
                and getattr(called.value.func, "id", None) == "get_ipython":
            yield called.attr, [arg.value for arg in node.args
                                if isinstance(arg, ast.Constant) and isinstance(arg.value, str)]


def pipes_its_commands(tree: ast.AST) -> bool:
    """Whether later runs may run the cell's ``!cmd`` lines piped: none runs in the background,
    which IPython's piped ``system`` refuses (a terminal's own runs it)."""
    return not any(method == "system" and any(line.rstrip().endswith("&") for line in lines)
                   for method, lines in _ipython_lines(tree))
