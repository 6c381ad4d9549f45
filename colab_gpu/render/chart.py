"""PNG charts that read in light and dark notebook themes alike.

matplotlib draws black text on a white figure: in a dark theme that was a white box pasted
into the notebook. Here the figure and axes are transparent and text, ticks and frames use
the cards' mid grey (STYLE's --cgpu-muted), readable on both. matplotlib is imported only
inside these functions, and only through its object API (never pyplot).
"""
from __future__ import annotations

import contextlib
import io
from typing import Any, Dict

INK = "#808080"  # the same grey as the cards' muted text, on white and on near-black
# Keyed by Any: matplotlib's stubs type rc_context's keys as a Literal of its parameter names.
NEUTRAL: Dict[Any, Any] = {"figure.facecolor": "none", "axes.facecolor": "none", "savefig.transparent": True,
           "text.color": INK, "axes.labelcolor": INK, "axes.titlecolor": INK, "axes.edgecolor": INK,
           "xtick.color": INK, "ytick.color": INK, "grid.color": INK, "legend.facecolor": "none",
           "legend.edgecolor": INK, "legend.labelcolor": INK}


@contextlib.contextmanager
def neutral_style():
    """Draw a figure inside this: its artists take their colours when they are created.
    A matplotlib that is installed but fails to import raises ImportError too, saying why."""
    try:
        import matplotlib
    except ImportError:
        raise
    except Exception as error:  # a mistyped MPLBACKEND (ValueError), a NumPy it was not built for
        raise ImportError(f"matplotlib failed to import ({type(error).__name__}: {error})",
                          name="matplotlib") from None

    with matplotlib.rc_context(NEUTRAL):
        yield


def to_png(figure, dpi=None) -> bytes:
    """The figure as PNG bytes, its background left transparent."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=dpi or figure.dpi, transparent=True)
    return buffer.getvalue()
