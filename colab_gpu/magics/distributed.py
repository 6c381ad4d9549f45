"""%%distributed: the cell's code run on every rank by ``colab_gpu.launch``.

The ranks are forked from the kernel, so the cell sees the notebook's names as they are when
it starts; what it assigns stays in the ranks. Its last expression, if it ends with one, is
each rank's value: the cell's result is their list, in rank order (none when every rank's is None).
"""
from __future__ import annotations

import ast
from typing import Any, Callable, List, Optional


def cell_on_every_rank(shell, cell: str) -> Callable[[], Any]:
    """The function a rank runs: the cell (its magics and ``!`` lines turned into Python, as
    IPython does) executed in the notebook's namespace, the value of its last expression.
    Compiled here, so a syntax error is the cell's own, before any process starts; and cached
    as IPython caches a cell, so a rank's traceback shows the cell's lines."""
    code = shell.transform_cell(cell)
    filename = shell.compile.cache(code, shell.execution_count)
    tree = ast.parse(code, filename)
    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    body = compile(tree, filename, "exec")
    result = compile(ast.Expression(last.value), filename, "eval") if last is not None else None
    namespace = shell.user_ns

    def run_cell():
        __tracebackhide__ = True  # a rank's traceback starts at the cell's line
        exec(body, namespace)
        return eval(result, namespace) if result is not None else None

    return run_cell


def run_distributed(shell, args, cell: str) -> Optional[List[Any]]:
    """Launch the cell on ``args.nprocs`` ranks; the ranks' values, or None when all are None."""
    from ..distributed import launch

    __tracebackhide__ = True
    values = launch(cell_on_every_rank(shell, cell), nprocs=args.nprocs, backend=args.backend,
                    timeout=args.timeout)
    return None if all(value is None for value in values) else values
