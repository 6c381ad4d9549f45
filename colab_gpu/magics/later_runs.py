"""%%find_batch's later runs of the cell: what they print, log, display, run with ``!cmd``
or draw is hidden; the user sees the first run's output only."""
from __future__ import annotations

import contextlib
import io
import sys
from typing import Dict, List, Optional

from IPython.core.interactiveshell import InteractiveShell


class LaterRuns:
    """Drops what the cell prints or displays after its first run, counting the runs that did.

    Entered by the search outside the timed region (a fixed cost per run would make larger
    sizes look faster in throughput mode); one display publisher serves every run all the
    same: IPython's ``capture_output`` builds one per run (a traitlets object, 50-90 µs).
    ``piped``: whether later runs may run the cell's ``!cmd`` lines piped (pipes_its_commands).
    """

    def __init__(self, shell, piped: bool = True):
        from IPython.core.displaypub import CapturingDisplayPublisher

        self.shell, self.publisher, self.piped = shell, CapturingDisplayPublisher(), piped
        self.first_done, self.with_output = False, 0
        self.handlers: Optional[Dict] = None  # logging's, found at the first later run: the first may set them up

    def around_run(self):
        """Nothing for the first run, whose output the user sees; silenced() for the others."""
        if self.first_done:
            return self.silenced()
        self.first_done = True
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def silenced(self):
        """Each output channel set aside for the run and put back after it; then what the run
        printed is counted, or shown when its error stops the search."""
        from ..batch.trial import stops_the_search

        out, err, publisher = io.StringIO(), io.StringIO(), self.shell.display_pub
        opened: List[int] = []  # the numbers of the figures the run opened
        if self.handlers is None:
            self.handlers = _logging_handlers((sys.stdout, sys.stderr))
        try:
            with contextlib.ExitStack() as channels:
                channels.enter_context(_logging_to(self.handlers, (out, err)))
                channels.enter_context(contextlib.redirect_stdout(out))
                channels.enter_context(contextlib.redirect_stderr(err))
                channels.enter_context(_displays_to(self.shell, self.publisher))
                if self.piped:
                    channels.enter_context(_commands_piped(self.shell))
                channels.enter_context(_figures_of_its_own(opened))
                yield
        finally:
            if stops_the_search(sys.exc_info()[1]):  # what it printed leads up to the error shown next
                sys.stdout.write(out.getvalue())
                sys.stderr.write(err.getvalue())
                for output in self.publisher.outputs:
                    publisher.publish(**output)
            else:
                self.with_output += bool(out.getvalue() or err.getvalue() or self.publisher.outputs or opened)
            self.publisher.outputs.clear()


@contextlib.contextmanager
def _logging_to(handlers: Dict, captures):
    """``handlers`` (see _logging_handlers) write to ``captures``, stdout's and stderr's, as
    the streams they hold are stdout or stderr. A handler the run made holds its capture
    (``logging.basicConfig()`` takes the ``sys.stderr`` of the moment): it is given the real
    stream back and joins ``handlers``. Kept, the user's records after the search went into
    the run's buffer, shown nowhere."""
    streams = sys.stdout, sys.stderr
    for handler, stream in handlers.items():
        handler.setStream(_counterpart(stream, streams, captures))
    try:
        yield
    finally:
        handlers.update((handler, _counterpart(capture, captures, streams))
                        for handler, capture in _logging_handlers(captures).items())
        for handler, stream in handlers.items():
            handler.setStream(stream)


def _counterpart(stream, streams, others):
    """The stream of ``others`` (stdout's, stderr's) in the place ``stream`` has in ``streams``."""
    return others[1] if stream is streams[1] else others[0]


@contextlib.contextmanager
def _displays_to(shell, publisher):
    """``display()`` publishes to ``publisher``, which keeps the outputs."""
    shown, shell.display_pub = shell.display_pub, publisher
    try:
        yield
    finally:
        shell.display_pub = shown


@contextlib.contextmanager
def _commands_piped(shell):
    """``!cmd`` runs with ``system_piped``, which writes its output to ``sys.stdout`` as a
    kernel's ``!cmd`` does, where the shell (a terminal IPython) runs it with ``system_raw``,
    whose command writes to the terminal itself, past ``sys.stdout``."""
    if getattr(shell.system, "__func__", None) is not InteractiveShell.system_raw:
        yield
        return
    # a bound method, called from the cell's frame: IPython expands {name} there
    system = vars(shell).get("system")  # None: the class's
    shell.system = shell.system_piped
    try:
        yield
    finally:
        if system is None:
            del shell.system
        else:
            shell.system = system


def _logging_handlers(streams) -> Dict:
    """logging's handlers that write to one of ``streams`` (the cell's output), with the stream
    each holds: ``logging.basicConfig(stream=sys.stderr)`` or a library's own handler
    (transformers, Lightning) keeps the stream it was given, and later runs' records went to
    the notebook. Every logger is walked once at the first later run, and after each later run
    for the handlers it made (outside the timed region)."""
    import logging

    loggers = [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
    return {handler: handler.stream for logger in loggers for handler in getattr(logger, "handlers", ())
            if isinstance(handler, logging.StreamHandler)
            and any(getattr(handler, "stream", None) is stream for stream in streams)}


@contextlib.contextmanager
def _figures_of_its_own(opened: List[int]):
    """pyplot's figures set aside while the run draws; those it opened are closed and their
    numbers put in ``opened``. Nothing before the user imported pyplot.

    A figure pyplot opened is shown when the cell ends (the inline backend), not published
    now: kept, every later run added its own under the report. And ``plt.plot(losses)``
    draws on the current figure: every run added its line to the one figure the user then
    saw. Each run now draws on figures of its own; the user's, and which is current, stay."""
    helpers = sys.modules.get("matplotlib._pylab_helpers")
    if helpers is None or "matplotlib.pyplot" not in sys.modules:
        yield
        return
    figures = helpers.Gcf.figs
    kept = dict(figures)  # in order: the last one is the current figure
    figures.clear()
    try:
        yield
    finally:
        opened.extend(figures)
        if opened:
            sys.modules["matplotlib.pyplot"].close("all")  # only the run's: the user's are aside
        figures.update(kept)
