"""%%find_batch's later runs of the cell: what they print, log, display, run with ``!cmd``
or draw is hidden; the user sees the first run's output only."""
from __future__ import annotations

import contextlib
import io
import sys
from typing import Dict, List

from IPython.core.interactiveshell import InteractiveShell


class _LaterRuns:
    """Drops what the cell prints or displays after its first run, counting the runs that did.

    Entered by the search outside the timed region (a fixed cost per run would make larger
    sizes look faster in throughput mode); one display publisher serves every run all the
    same: IPython's ``capture_output`` builds one per run (a traitlets object, 50-90 µs).

    A terminal IPython runs ``!cmd`` with ``system_raw``, whose command writes to the terminal
    itself, past ``sys.stdout``: with ``piped``, later runs run it with ``system_piped``, which
    writes its output to ``sys.stdout``, as a kernel's ``!cmd`` does.
    """

    def __init__(self, shell, piped: bool = True):
        from IPython.core.displaypub import CapturingDisplayPublisher

        self.shell, self.publisher, self.piped = shell, CapturingDisplayPublisher(), piped
        self.first_done, self.with_output = False, 0
        self.handlers = None  # logging's, found at the first later run: the first may set them up

    def around_run(self):
        """Nothing for the first run, whose output the user sees; silenced() for the others."""
        if self.first_done:
            return self.silenced()
        self.first_done = True
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def silenced(self):
        from ..batch.trial import stops_the_search

        streams, publisher = (sys.stdout, sys.stderr), self.shell.display_pub
        if self.handlers is None:
            self.handlers = _logging_handlers(streams)
        sys.stdout, sys.stderr = out, err = io.StringIO(), io.StringIO()
        for handler, stream in self.handlers.items():
            handler.setStream(err if stream is streams[1] else out)
        self.shell.display_pub = self.publisher
        raw = self.piped and getattr(self.shell.system, "__func__", None) is InteractiveShell.system_raw
        if raw:  # a bound method, called from the cell's frame: IPython expands {name} there
            system = vars(self.shell).get("system")  # None: the class's
            self.shell.system = self.shell.system_piped
        aside = _figures_aside()
        try:
            yield
        finally:
            if raw and system is None:
                del self.shell.system
            elif raw:
                self.shell.system = system
            sys.stdout, sys.stderr = streams
            for handler, stream in self.handlers.items():
                handler.setStream(stream)
            self.shell.display_pub = publisher
            opened = _figures_back(aside)
            if stops_the_search(sys.exc_info()[1]):  # what it printed leads up to the error shown next
                sys.stdout.write(out.getvalue())
                sys.stderr.write(err.getvalue())
                for output in self.publisher.outputs:
                    publisher.publish(**output)
            else:
                self.with_output += bool(out.getvalue() or err.getvalue() or self.publisher.outputs or opened)
            self.publisher.outputs.clear()


def _logging_handlers(streams) -> Dict:
    """logging's handlers that write to one of ``streams`` (the cell's output), with the stream
    each holds: ``logging.basicConfig(stream=sys.stderr)`` or a library's own handler
    (transformers, Lightning) keeps the stream it was given, and later runs' records went to
    the notebook. Every logger is walked once per search, not once per run."""
    import logging

    loggers = [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
    return {handler: handler.stream for logger in loggers for handler in getattr(logger, "handlers", ())
            if isinstance(handler, logging.StreamHandler)
            and any(getattr(handler, "stream", None) is stream for stream in streams)}


def _figures_aside():
    """pyplot's figures set aside while a later run draws, as (pyplot's registry, the user's
    figures); None before the user imported pyplot.

    A figure pyplot opened is shown when the cell ends (the inline backend), not published
    now: kept, every later run added its own under the report. And ``plt.plot(losses)``
    draws on the current figure: every run added its line to the one figure the user then
    saw. Each run now draws on figures of its own; the user's, and which is current, stay."""
    helpers = sys.modules.get("matplotlib._pylab_helpers")
    if helpers is None or "matplotlib.pyplot" not in sys.modules:
        return None
    figures = helpers.Gcf.figs
    kept = dict(figures)  # in order: the last one is the current figure
    figures.clear()
    return figures, kept


def _figures_back(aside) -> List[int]:
    """Close the figures the run opened and put the user's back; the numbers of those closed."""
    if aside is None:
        return []
    figures, kept = aside
    opened = list(figures)
    if opened:
        sys.modules["matplotlib.pyplot"].close("all")  # only the run's: the user's are aside
    figures.update(kept)
    return opened
