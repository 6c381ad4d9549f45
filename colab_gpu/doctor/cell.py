"""What the failed cell's code says: its batch-size variable, whether it trains (calls
backward()), and whether it already uses autocast or no_grad. Read from its source only:
nothing of the cell is run again.
"""
from __future__ import annotations

import ast
import dataclasses
import re
from typing import Any, List, Mapping, Optional, Tuple

__all__ = ["CellFacts", "read_cell", "BATCH_NAME"]

# Names a batch size goes by: batch_size, bs, bsz, BATCH_SIZE, train_batch_size, micro_batch ...
BATCH_NAME = re.compile(r"(?i)(\w+_)?(batch_?size|bs|bsz|micro_?batch(_size)?|mini_?batch(_size)?)")
_NO_GRAD = re.compile(r"no_grad|inference_mode|set_grad_enabled\(\s*False")


@dataclasses.dataclass(frozen=True)
class CellFacts:
    batch_variable: Optional[str] = None  # the variable the cell reads its batch size from
    calls_backward: bool = False
    uses_autocast: bool = False
    uses_no_grad: bool = False
    calls_eval: bool = False  # model.eval(): the cell evaluates
    assigned: Tuple[str, ...] = ()  # the names the cell binds
    known: bool = False  # the cell's source was there to read


def _whole_number(value: Any) -> bool:
    return type(value) is int and value > 0


def _names(source: str) -> Tuple[Tuple[str, ...], Tuple[str, ...]]:
    """(names read, names bound) by the cell; a cell Python cannot parse (a magic IPython did
    not turn into code) is read word by word."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        words = tuple(dict.fromkeys(re.findall(r"[A-Za-z_]\w*", source)))
        return words, ()
    read: List[str] = []
    bound: List[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (bound if isinstance(node.ctx, ast.Store) else read).append(node.id)
    return tuple(dict.fromkeys(read)), tuple(dict.fromkeys(bound))


def read_cell(source: Optional[str], namespace: Mapping[str, Any]) -> CellFacts:
    """The facts of ``source`` (None: unknown), its names looked up in ``namespace``."""
    if not source:
        return CellFacts()
    read, bound = _names(source)
    batch = [name for name in read if BATCH_NAME.fullmatch(name) and _whole_number(namespace.get(name))]
    batch.sort(key=lambda name: name != "batch_size")  # the usual name first, else the first read
    return CellFacts(batch_variable=batch[0] if batch else None,
                     calls_backward=bool(re.search(r"\.backward\s*\(|autograd\.backward\s*\(", source)),
                     uses_autocast="autocast" in source, uses_no_grad=bool(_NO_GRAD.search(source)),
                     calls_eval=bool(re.search(r"\.eval\s*\(\s*\)", source)),
                     assigned=bound, known=True)
