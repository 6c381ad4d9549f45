"""Progress while the search runs: a line per trial in a terminal, one updating table in a notebook.

IPython is imported only when it is already running (a notebook or a terminal shell); the
table is updated in the foreground through a display id, which works on IPython 7.34 too.
"""
from __future__ import annotations

from ..runtime import current_shell, in_notebook
from .render import render_text, trial_line
from .result import ERROR

class TerminalProgress:
    def __call__(self, search) -> None:
        print(trial_line(search.trials[-1], search.variable, len(search.trials)), flush=True)

    def finish(self, result) -> None:
        """The report only when the user's error is raised next: no result is returned or
        shown then, and without it nothing says the variable kept its old value."""
        if result.trials and result.trials[-1].outcome == ERROR:
            print(render_text(result), flush=True)


class NotebookProgress:
    """One output that a display id updates in place: the table so far, then the final report.

    Each update is the result object itself, so the front end gets its HTML table and a
    plain-text report for text-only views (and the saved notebook).
    """

    def __init__(self, keep_report: bool = True):
        self.handle, self.keep_report = None, keep_report

    def __call__(self, search) -> None:
        self._show(search.result())

    def finish(self, result) -> None:
        """Replace the progress table by the final report, or empty it when the report is
        shown elsewhere (``%%find_batch -o``: the cell's Out). The user's error is raised,
        not the result returned: then the report stays, the only record of what ran."""
        if self.keep_report or (result.trials and result.trials[-1].outcome == ERROR):
            self._show(result)
        else:
            self._empty()

    def empty_if_out(self, result) -> None:
        """``colab_gpu.find_batch(...)`` as a cell's last expression shows the same report
        again as the cell's Out: then this one is emptied once the cell has ended, so the
        report (and its chart) is shown, and saved, once. Assigned, it stays."""
        shell = current_shell()
        if shell is None:  # never: a NotebookProgress runs in a shell's kernel
            return

        def at_cell_end(*args) -> None:  # IPython passes the cell's ExecutionResult
            shell.events.unregister("post_run_cell", at_cell_end)
            if args and getattr(args[0], "result", None) is result:
                self._empty()

        shell.events.register("post_run_cell", at_cell_end)

    def _empty(self) -> None:
        if self.handle is not None:
            self.handle.update({"text/plain": ""}, raw=True)

    def _show(self, result) -> None:
        if self.handle is None:
            from IPython.display import display

            self.handle = display(result, display_id=True)
        else:
            self.handle.update(result)


def reporter():
    return NotebookProgress() if in_notebook() else TerminalProgress()
