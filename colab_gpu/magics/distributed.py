"""%%distributed: the cell's code run on every rank by ``colab_gpu.launch``.

The ranks are forked from the kernel, so the cell sees the notebook's names as they are when
it starts; what it assigns stays in the ranks. Its last expression, if it ends with one, is
each rank's value: the cell's result is their list, in rank order (none when every rank's is None).
"""
from __future__ import annotations

import ast
from typing import Any, Callable, List, Optional

from .cell import syntax_error


def cell_on_every_rank(shell, line: str, cell: str) -> Callable[[], Any]:
    """The function a rank runs: the cell (its magics and ``!`` lines turned into Python, as
    IPython does) executed in the notebook's namespace, the value of its last expression.
    Compiled here, so that a syntax error is one line before any process starts; registered as
    %%find_batch registers its cell, so that a rank's traceback shows the cell's lines,
    numbered as in the cell (the %%distributed line is line 1)."""
    source = shell.transform_cell(cell)
    cell_number = getattr(shell.displayhook, "prompt_count", shell.execution_count)
    filename = shell.compile.cache(f"%%distributed {line}\n{source}", cell_number)
    try:
        tree = ast.parse("\n" + source, filename)
        last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
        body = compile(tree, filename, "exec")
        result = compile(ast.Expression(last.value), filename, "eval") if last is not None else None
    except SyntaxError as error:
        raise syntax_error(error, "\n" + source) from None
    namespace = shell.user_ns

    def run_cell():
        __tracebackhide__ = True  # a rank's traceback starts at the cell's line
        exec(body, namespace)
        return eval(result, namespace) if result is not None else None

    return run_cell


def run_distributed(shell, line: str, cell: str, args) -> Optional[List[Any]]:
    """Launch the cell on ``args.nprocs`` ranks; the ranks' values, or None when all are None."""
    from ..distributed import launch

    __tracebackhide__ = True
    values = launch(cell_on_every_rank(shell, line, cell), nprocs=args.nprocs, backend=args.backend,
                    timeout=args.timeout)
    return None if all(value is None for value in values) else values
