"""The live monitor inside IPython: the display that really updates in this front end, and
the per-cell peak lines hooked on IPython's cell events."""
from __future__ import annotations

import uuid
from typing import Callable, Optional, Tuple

from ..render import count, fold, fold_items
from . import live_url, on_stop, page_server, record_of, running, stop
from .panel import display_text, running_words, stop_command


class LiveSession:
    """What ``%gpu_status --live`` adds to one shell; the live package's ``stop()`` removes
    all of it (its --cells hooks through on_stop)."""

    def __init__(self, shell, show: Callable[[object], None]):
        self.shell = shell
        self._show = show  # how the magics display a result (honours GPUMagics.output)
        self._hooks: Optional[Tuple[Callable[..., None], Callable[..., None]]] = None  # (pre, post) while --cells is on
        self._display: Optional[Tuple[object, str]] = None  # (sampler, display id) of what the stop freezes

    def show(self, sampler, kind: str, lines: int = 0, started: bool = True) -> None:
        """Show the running sampler as ``kind``: "auto", "widgets", "page" or "terminal".
        ``started``: by this --live; the end of a terminal's lines (Ctrl-C) then stops it, else
        only the display ends: showing a script's monitor again must not end it."""
        from ..runtime import COLAB, PLAIN_PYTHON, TERMINAL, detect_platform, in_notebook

        platform = detect_platform(self.shell)
        if kind == "auto":
            # The front end, not the machine: an IPython in a terminal on Binder, Kaggle or Colab
            # (their variables set) has no kernel, and showed a widget's text or a page's address.
            front_end = platform if in_notebook(self.shell) else TERMINAL
            kind = {COLAB: "page", TERMINAL: "terminal", PLAIN_PYTHON: "terminal"}.get(front_end, "widgets")
        colab_output = _colab_output() if kind == "page" and platform == COLAB else None
        if colab_output is not None:
            # Colab renders no widget updates sent from a thread (colabtools#3373); a page
            # served from the kernel's machine keeps moving, as TensorBoard's does.
            colab_output.serve_kernel_port_as_iframe(page_server().port, height="440")
        elif kind == "page":
            self._show_until_stopped(sampler, _page_frame(sampler, live_url()))
        elif kind == "terminal" and self._hooks is not None:
            # A line per sample holds the prompt until Ctrl-C, which stops the monitor: no
            # later cell would ever run to get its --cells line. Sample in the background.
            print(fold_items("colab_gpu: " + running_words(sampler, "samples in the background",
                                                           ": a line after each cell; "), 2))
        elif kind == "terminal":
            from .terminal import watch

            print(fold_items(f"colab_gpu: a line every {sampler.interval:g} s; {_ctrl_c_words(started, lines)}", 2))
            reason = None
            try:
                watch(sampler, print, lines)
            except KeyboardInterrupt:
                reason = "Ctrl-C"
            if not started and sampler.running:
                print(fold_items("colab_gpu: " + running_words(sampler, "goes on sampling in the background"), 2))
                return
            record = stop(reason)
            if record is not None:
                self._show(record)
        else:
            from .widget import live_widget

            self._show_until_stopped(sampler, live_widget(sampler))

    def _show_until_stopped(self, sampler, view) -> None:
        """Display ``view`` (the widget, the page's IFrame) so that the run's end replaces it
        with its last state as static HTML and a PNG (render.stopped_view): a notebook saved
        with the widget's view showed "Error displaying widget: model not found" when reopened,
        and an IFrame of a page long gone. Every display of one run shares one display id."""
        from IPython.display import display

        from ..runtime import in_notebook

        if not in_notebook(self.shell):  # a terminal printed the text, and keeps nothing to replace
            display(view)
            return
        if self._display is None or self._display[0] is not sampler:
            self._display = (sampler, f"colab-gpu-live-{uuid.uuid4().hex}")
            display_id = self._display[1]
            on_stop(lambda: _freeze(sampler, display_id))  # also a script's colab_gpu.live.stop()
            # A run that stops by itself (a lost GPU) is frozen at once: a notebook saved
            # before the next stop() must not keep a widget either.
            sampler.add_listener(lambda current: _freeze(current, display_id) if current.error else None)
        display(view, display_id=self._display[1])
        if sampler.error:  # it stopped by itself before the listener was added
            _freeze(sampler, self._display[1])

    def watch_cells(self) -> bool:
        """After each cell, print one line with its peak GPU memory and change, if known;
        whether the hooks were added now (False: already on)."""
        if self._hooks is not None:
            return False
        from .cells import CellPeaks

        peaks = CellPeaks(running)

        def pre(*args) -> None:  # IPython >= 8.17 passes an ExecutionInfo; older ones vary
            peaks.before()

        def post(*args) -> None:
            line = peaks.after()
            if line:  # folded as the reports are: a terminal breaks a longer line mid-word
                print(fold_items(line, 2))

        self.shell.events.register("pre_run_cell", pre)
        self.shell.events.register("post_run_cell", post)
        self._hooks = (pre, post)
        on_stop(self.unwatch_cells)  # also when a script calls colab_gpu.live.stop()
        return True

    def unwatch_cells(self) -> None:
        if self._hooks is not None:
            pre, post = self._hooks
            self.shell.events.unregister("pre_run_cell", pre)
            self.shell.events.unregister("post_run_cell", post)
            self._hooks = None


def _freeze(sampler, display_id: str) -> None:
    """Replace every display of ``sampler`` by its stopped view."""
    from IPython.display import update_display

    from .render import stopped_view

    update_display(stopped_view(sampler, record_of(sampler)), raw=True, display_id=display_id)


def _ctrl_c_words(started: bool, lines: int) -> str:
    """How the terminal's lines end: Ctrl-C (or GPUMagics.live_lines) stops the monitor this
    --live started; one shown again (a script's) goes on without them."""
    if not lines:
        return "Ctrl-C stops it" if started else "Ctrl-C ends the lines, not the monitor"
    return (f"it stops after {count(lines, 'line')} or at Ctrl-C" if started
            else f"{count(lines, 'line')} or Ctrl-C end them, not the monitor")


def _page_frame(sampler, url: str):
    """The live page in an IFrame whose text says where the page is, as the widget's names the
    monitor: with live_display 'page', a terminal showed only the IFrame's text,
    "<IPython.lib.display.IFrame at 0x...>"."""
    from IPython.display import IFrame

    stop = stop_command()  # here, in the magic: the IFrame's text may be drawn elsewhere

    class LivePage(IFrame):
        def __repr__(self) -> str:
            return fold(display_text(sampler, stop, url), 2)

    return LivePage(url, width="100%", height=440)


def _colab_output():
    """google.colab's output module, or None where Colab's variables are set without it (an
    IPython from another environment on a Colab machine): the page is then a plain IFrame,
    not an ImportError that would advise "pip install google", an unrelated package."""
    try:
        from google.colab import output
    except ImportError:
        return None
    return output
