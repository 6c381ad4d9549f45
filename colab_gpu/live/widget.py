"""The notebook display (Jupyter, JupyterLab, VS Code): one ipywidgets HTML widget.

It holds the live panel (bars per GPU and the rolling SVG chart) and is updated from the
sampler thread, at most every MIN_REDRAW seconds and once at the end. ``ipywidgets.HTML``
exists with the same meaning in 7.x and 8.x, and swapping its HTML redraws without a flicker.
When the run stops, ``notebook.LiveSession`` replaces the widget's output with static HTML and
a PNG, which a saved notebook can draw without a kernel (a widget's view cannot).
"""
from __future__ import annotations

import time

from ..state import session
from .panel import display_text, render_panel, stop_command
from .sampler import Sampler

# Seconds between two redraws at least. Drawing the panel runs in the sampler thread; at
# --interval 0.1 with a full chart window and 8 GPUs it took about as long as the interval,
# holding the GIL against the user's training loop. Twice a second is as fast as one reads it.
MIN_REDRAW = 0.5


def live_widget(sampler: Sampler):
    """A widget that follows ``sampler`` until it stops (its last state drawn); the same
    one for the same sampler: a widget per run of the --live cell would each be redrawn by the
    sampler thread after every sample, however many of them were still on screen."""
    shown = session.live_shown  # (sampler, its widget)
    if shown is not None and shown[0] is sampler:
        shown[1].stop_command = stop_command()  # shown again, maybe by the other of magic and script
        return shown[1]
    import ipywidgets

    class LivePanel(ipywidgets.HTML):
        _ipython_display_ = None  # ipywidgets 7's; IPython then asks _repr_mimebundle_, as for 8

        def _repr_mimebundle_(self, **kwargs):
            """The widget's view and its whole text: ipywidgets 7 and 8 cut the text at 110
            characters, and a recording's longer name pushed the stop hint out of it."""
            view = {"version_major": 2, "version_minor": 0, "model_id": self.model_id}  # both versions'
            return {"text/plain": repr(self), "application/vnd.jupyter.widget-view+json": view}

        def __repr__(self) -> str:
            # The display's text/plain, all that a notebook saved without its widget state
            # (GitHub, nbviewer, a reopened notebook) shows: ipywidgets' own repr was the
            # panel's CSS, "HTML(value='\n<style>\n.cgpu-card{--cgpu-muted:...".
            return display_text(sampler, self.stop_command)

    widget = LivePanel(value=render_panel(sampler))
    widget.stop_command = stop_command()
    drawn_at = [time.monotonic()]

    def update(current: Sampler) -> None:
        now = time.monotonic()
        if current.running and now - drawn_at[0] < MIN_REDRAW:
            return  # the next sample, or the end of the run, draws it
        drawn_at[0] = now
        widget.value = render_panel(current)

    sampler.add_listener(update)
    session.live_shown = (sampler, widget)
    return widget
