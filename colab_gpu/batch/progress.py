"""Progress while the search runs: a line per trial in a terminal, one updating table in a notebook.

IPython is imported only when it is already running (a notebook or a terminal shell); the
table is updated in the foreground through a display id, which works on IPython 7.34 too.
"""
from __future__ import annotations

import sys

from .render import render_html, trial_line


def in_notebook() -> bool:
    if "IPython" not in sys.modules:
        return False
    from IPython import get_ipython

    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


class TerminalProgress:
    def __call__(self, search) -> None:
        print(trial_line(search.trials[-1], search.variable, len(search.trials)), flush=True)

    def finish(self, result) -> None:
        pass


class NotebookProgress:
    def __init__(self):
        self.handle = None

    def __call__(self, search) -> None:
        from IPython.display import HTML, display

        html = HTML(render_html(search.result()))
        if self.handle is None:
            self.handle = display(html, display_id=True)
        else:
            self.handle.update(html)

    def finish(self, result) -> None:
        """Replace the progress table by the final report."""
        if self.handle is not None:
            from IPython.display import HTML

            self.handle.update(HTML(render_html(result)))


def reporter():
    return NotebookProgress() if in_notebook() else TerminalProgress()
