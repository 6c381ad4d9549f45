"""The one way a result shows itself: a line (``summary()``, ``repr``), the text report
(``print``, IPython's plain output) and the HTML card (a notebook).

A result class names its three views, functions of a view module taking the result; the mixin
imports that module on first use, so a data module never imports its views (which import it).
"""
from __future__ import annotations

import importlib
from typing import Any, Callable, ClassVar, Optional

__all__ = ["Shown"]


class Shown:
    """Mixin for a result: ``summary()``, ``__repr__``, ``__str__``, ``_repr_pretty_`` and
    ``_repr_html_`` from the views the class names, each ``"module:function"``. A dataclass
    using it says ``repr=False``, or its generated repr would replace the one line."""

    line_view: ClassVar[str]  # one line: what the result says first
    text_view: ClassVar[str]  # the report its magic prints
    html_view: ClassVar[str]  # the card a notebook shows; None from it leaves text/html out

    def summary(self) -> str:
        """One line: what the result says first."""
        return _view(self.line_view)(self)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.summary()}>"

    def __str__(self) -> str:
        """The report its magic prints, so ``print(result)`` shows it in a script."""
        return _view(self.text_view)(self)

    def _repr_pretty_(self, printer, cycle) -> None:
        printer.text(repr(self) if cycle else str(self))

    def _repr_html_(self) -> Optional[str]:
        return _view(self.html_view)(self)


def _view(name: str) -> Callable[[Any], Any]:
    """The function ``"module:function"`` names, its module imported if it was not yet."""
    module, _, function = name.partition(":")
    return getattr(importlib.import_module(module), function)
