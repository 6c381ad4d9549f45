"""What IPython keeps in and around the user namespace: its own names (``Out``, ``_``, ``_12``,
``_i3``), the user's variables among them, the output history and every reference to the last
exception. Apart because the ranking (who holds memory) and the clearing (what to drop or
refuse to delete) must agree on which names are the user's; IPython is never imported here,
its objects come in as ``shell`` and are used by duck typing.
"""
from __future__ import annotations

import bdb
import re
import sys
import types
from typing import Any, Dict, List, Mapping, Optional, Tuple

from .walk import OPAQUE

__all__ = ["MISSING", "OUTPUT_NAME", "exception_references", "is_dunder", "is_ipython_name", "namespaces",
           "output_history", "user_variables"]

# IPython's own names in the user namespace: the output and input history and its helpers.
OUTPUT_NAME = re.compile(r"_(\d+|_{0,2})\Z")  # _, __, ___, _12
_INPUT_NAME = re.compile(r"_i(\d+|i{0,2})\Z")  # _i, _ii, _iii, _i12
_IPYTHON_NAMES = frozenset({"In", "Out", "_oh", "_ih", "_dh", "get_ipython", "exit", "quit",
                            "_exit_code"})

MISSING = object()


def is_dunder(name: str) -> bool:
    """``__name__``, ``__builtins__``: Python's names for the namespace, never the user's."""
    return len(name) > 4 and name[:2] == name[-2:] == "__"  # not IPython's __ or ___


def is_ipython_name(name: str, value: Any, shell: Any, hidden: Mapping[str, Any]) -> bool:
    """Whether ``name`` is IPython's: its history and helpers, and ``_``, ``__``, ``___`` while
    they hold its last outputs. Once the user assigns one (``_, index = scores.max(1)``) it is
    theirs, as IPython sees it too: its displayhook stops updating them."""
    if name in ("_", "__", "___"):
        displayhook = getattr(shell, "displayhook", None)
        return value is getattr(displayhook, name, MISSING) or value is hidden.get(name, MISSING)
    return name in _IPYTHON_NAMES or bool(OUTPUT_NAME.match(name) or _INPUT_NAME.match(name))


def user_variables(shell: Any) -> List[Tuple[str, Any]]:
    """The user's own variables: not IPython's names, modules or classes."""
    namespace, hidden = namespaces(shell)
    result = []
    for name, value in list(namespace.items()):
        if (is_dunder(name) or is_ipython_name(name, value, shell, hidden)
                or hidden.get(name, MISSING) is value or issubclass(type(value), OPAQUE)):
            continue
        result.append((name, value))
    return result


def namespaces(shell: Any) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """The user namespace and IPython's hidden one (empty in plain Python)."""
    if shell is None:
        return sys.modules["__main__"].__dict__, {}
    return shell.user_ns, getattr(shell, "user_ns_hidden", {})


def exception_references(shell: Any) -> List[Tuple[Any, str, str]]:
    """(owner, attribute, name) of each reference IPython and ``sys`` keep to the last exception."""
    found: List[Tuple[Any, str, str]] = [(sys, name, f"sys.{name}") for name in ("last_type", "last_value", "last_traceback", "last_exc")
             if hasattr(sys, name)]  # last_exc exists on Python 3.12+ only
    if shell is None:
        return found
    result = getattr(shell, "last_execution_result", None)
    if result is not None and (getattr(result, "error_in_exec", None) is not None
                               or getattr(result, "error_before_exec", None) is not None):
        found.append((shell, "last_execution_result", "shell.last_execution_result"))
    for holder in ("InteractiveTB", "SyntaxTB"):
        tools = getattr(shell, holder, None)
        for attribute, value in list(getattr(tools, "__dict__", {}).items()):
            # the debugger of a past %debug still holds its frames; IPython makes a new one
            if (isinstance(value, (types.TracebackType, BaseException))
                    or isinstance(value, bdb.Bdb) and getattr(value, "botframe", None) is not None):
                found.append((tools, attribute, f"shell.{holder}.{attribute}"))
    return found


def output_history(shell: Any, namespace: Mapping[str, Any]) -> Optional[Dict[int, Any]]:
    history = getattr(getattr(shell, "history_manager", None), "output_hist", None)
    if isinstance(history, dict):
        return history
    out = namespace.get("Out")
    return out if isinstance(out, dict) else None
