"""The notebook display (Jupyter, JupyterLab, VS Code): one ipywidgets HTML widget.

It holds the live panel (bars per GPU and the rolling SVG chart) and is updated from the
sampler thread after each sample. ``ipywidgets.HTML`` exists with the same meaning in 7.x and
8.x, and swapping its HTML redraws without a flicker.
"""
from __future__ import annotations

from .panel import render_panel
from .sampler import Sampler


def live_widget(sampler: Sampler):
    """A widget that follows ``sampler`` until it stops (its last state stays shown)."""
    import ipywidgets

    widget = ipywidgets.HTML(value=render_panel(sampler))

    def update(current: Sampler) -> None:
        widget.value = render_panel(current)

    sampler.add_listener(update)
    return widget
