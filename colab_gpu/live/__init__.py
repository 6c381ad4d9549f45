"""The live monitor: one sampler per process, its history, and the displays that follow it.

``start()`` returns the running sampler or starts one (NVML, a recording, or the bundled
demo trace); ``stop()`` ends it and returns the :class:`~colab_gpu.live.record.RunRecord` of
the whole run; ``history()`` gives the samples of the running or last run. Nothing here
imports IPython; ``notebook.LiveSession`` picks the display that updates in the front end.
"""
from __future__ import annotations

import math
import os
import threading
from typing import Callable, Optional, Tuple

from ..errors import UserError
from ..spelling import command, option
from ..state import session
from .panel import numbering_note, recording_note, running_words, torch_labels
from .record import FRAME_COLUMNS, MIB_COLUMNS, RunRecord, rows
from .sampler import (DEFAULT_HISTORY, DEFAULT_INTERVAL, LiveOptionError, Sampler, SourceError, check_history,
                      check_interval)

# The shortest interval start() takes. NVML's utilization counters are averaged over a sample
# period of 1/6 s to 1 s, depending on the product (nvidia-smi's documentation of
# utilization.gpu): at 0.1 s every new value is seen, while a shorter interval only reads the
# same values again, keeps a core busy and floods a terminal with lines (1e-7 took 756k samples
# in 5 s). A replay, one recorded step per sample, plays at most ten steps a second too.
MIN_INTERVAL = 0.1

# How long the live page is still served after a stop: an open page polls at least once a
# second, so it shows when and why the run stopped instead of "sampling" and a lost server.
FINAL_STATE_SECONDS = 3.0

# What --demo replays: a real training log with load (4 of nanoGPT's 8 GPUs, busy, with a drop
# every ~90 steps), starting just before one (colab_gpu/data/README.md says where it is from).
DEMO_TRACE = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data",
                          "nanogpt-8gpu-training_gpus0-3.csv")

# The kernel's monitor (its sampler, page server, on_stop cleanups and their lock) is kept in
# colab_gpu.state's session, as live_*.


# A fork (colab_gpu.launch, a DataLoader's workers, multiprocessing) copies only the forking
# thread. A read in flight in the sampler's thread would leave the library it reads (NVML)
# locked for ever in the child, and the child's copy of the sampler would claim to run. So a
# fork waits for that read (and holds the next one back), and in the child the monitor has ended.
def _before_fork() -> None:
    if session.live_sampler is not None:
        session.live_sampler.pause_for_fork()


def _after_fork_in_parent() -> None:
    if session.live_sampler is not None:
        session.live_sampler.resume_after_fork()


def _after_fork_in_child() -> None:
    session.live_lock = threading.Lock()  # held, maybe, by a thread the fork did not copy
    if session.live_sampler is not None:
        session.live_sampler.forked()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent,
                        after_in_child=_after_fork_in_child)


def on_stop(cleanup: Callable[[], None]) -> None:
    """Call ``cleanup()`` once at the next stop(), whoever calls it: the magic's --cells hooks
    went on after a script's ``colab_gpu.live.stop()``, a route that knows nothing of them."""
    with session.live_lock:
        session.live_cleanups.append(cleanup)


def running() -> Optional[Sampler]:
    """The process's sampler while it runs, else None.

    Returns
    -------
    Sampler or None
    """
    sampler = session.live_sampler
    return sampler if sampler is not None and sampler.running else None


class AlreadyRunning(UserError, ValueError):
    """start() was asked for another source than the running monitor's."""


def checked_interval(seconds: float, name: str = "interval") -> float:
    """``seconds`` as start() takes it: the sampler's rule, from MIN_INTERVAL up to an hour
    (LiveOptionError; TypeError for what is not a number). ``name``: as the caller wrote it."""
    return check_interval(seconds, name, MIN_INTERVAL)


def _replays(sampler: Sampler, path) -> bool:
    """Whether ``sampler`` replays the recording at ``path``; None asks for no source: any."""
    from ..devices.replay import ReplaySource

    if path is None:
        return True
    if not isinstance(sampler.source, ReplaySource):
        return False
    same = [os.path.realpath(os.path.expanduser(os.fsdecode(p))) for p in (sampler.source.path, path)]
    return same[0] == same[1]


def start(path: Optional[str] = None, demo: bool = False, interval: Optional[float] = None,
          history: Optional[int] = None) -> Tuple[Sampler, bool]:
    """Start the live monitor, one per kernel, or return the running one.

    Reads the live GPUs through NVML, or replays the recording at ``path`` (or the bundled
    demo trace) one time step per sample, looping. A running sampler is reused as it is; one
    that stopped by itself (a lost GPU) is ended and replaced (``stop()`` before returns its
    record).

    Parameters
    ----------
    path : str, bytes or os.PathLike, optional
        An ``nvidia-smi`` recording to replay instead of the live GPUs.
    demo : bool, default False
        Replay the bundled demo trace.
    interval : float, optional
        Seconds between samples, from MIN_INTERVAL (0.1) to 3600; 1 for a new monitor when
        not given.
    history : int, optional
        Samples kept for the charts; 3600 for a new monitor when not given.

    Returns
    -------
    (Sampler, bool)
        The sampler, and whether it was started now.

    Raises
    ------
    TypeError
        ``path`` is not a path, ``interval`` not a number or ``history`` not a whole number.
    LiveOptionError
        (a ValueError) ``interval`` or ``history`` out of range, or both ``path`` and ``demo``.
    colab_gpu.devices.replay.RecordingError
        (a ValueError) ``path`` is blank, or names a file that cannot be opened or is too
        large to read whole.
    SourceError
        (a ValueError) The source cannot be read at all: no NVIDIA driver, a ``path`` that
        names no regular file, or a file that is no recording.
    AlreadyRunning
        (a ValueError) The running monitor has another source, interval or history than
        asked: ``stop()`` it first.
    """
    if path is not None and not isinstance(path, (str, bytes, os.PathLike)):  # os.fspath named no argument
        raise TypeError(f"path is a recording's file name (str, bytes or os.PathLike), not {path!r}")
    if demo and path is not None and os.fsdecode(path).strip():  # a blank one is refused as such below
        # replaying the bundled trace would drop the user's file silently
        raise LiveOptionError(f"{option('demo', True)} replays the bundled trace and "
                              f"{option('path', os.fsdecode(path))} your recording: give one")
    if path is not None:  # "", a directory, a FIFO ...: refused before a running monitor is looked at
        _check_path(path)
    # Named as the caller wrote them: the sampler's own check says "the interval".
    asked_interval, asked_history = interval, history
    if interval is not None:
        interval = checked_interval(interval, option("interval"))
    if history is not None:
        history = check_history(history, "history")
    stopped_by_itself()  # ended as stop() ends it, before it is replaced
    with session.live_lock:
        current = running()
        if current is not None:
            asked = None
            if not _replays(current, DEMO_TRACE if demo else path):  # reused, it dropped the user's source unsaid
                asked = option("demo", True) if demo or path is None else option("path", os.fsdecode(path))
            elif interval is not None and interval != current.interval:  # its samples came at the old one
                asked = option("interval", asked_interval)
            elif history is not None and history != current.history:  # its charts keep the old number
                asked = option("history", asked_history)
            if asked is not None:
                raise AlreadyRunning(running_words(current, "is already running", ", one per kernel: ",
                                                  f" before {asked} can start"))
            return current, False
        interval = DEFAULT_INTERVAL if interval is None else interval
        history = DEFAULT_HISTORY if history is None else history
        if session.live_sampler is not None:  # stopped by itself: nothing may stay registered at exit
            session.live_sampler.stop()
        replay = DEMO_TRACE if demo else path
        if replay is not None:
            from ..devices.replay import ReplaySource

            sampler = Sampler(ReplaySource(replay, follow=True), interval, history, close_source=True)
        else:
            from ..devices import default_source

            # The shared NVML source (created first, so its atexit close runs after ours).
            sampler = Sampler(default_source(), interval, history)
        sampler.start()
        session.live_sampler = sampler
        return sampler, True


def _check_path(path) -> None:
    """Refuse a ``path`` that names no regular file: a blank one is a wrong option
    (RecordingError), any other a source that cannot be read (SourceError)."""
    from ..devices.replay import RecordingError, check_path

    try:
        check_path(path)
    except RecordingError as error:
        if not os.fsdecode(path).strip():
            raise
        raise SourceError(str(error)) from None


def stop(reason: Optional[str] = None) -> Optional[RunRecord]:
    """Stop the sampler, then the live page once it has shown how the run ended.

    Parameters
    ----------
    reason : str, optional
        What stopped it (``"%gpu_status --stop"``), shown on the page.

    Returns
    -------
    RunRecord or None
        The record of the whole run, also when the sampler had stopped by itself (a lost
        GPU); None when there is no run left to stop.
    """
    with session.live_lock:
        sampler, record = session.live_sampler, None
        if sampler is not None and not sampler.closed:
            sampler.stop(reason)
            record = record_of(sampler)
        if session.live_server is not None:
            session.live_server.stop_after(FINAL_STATE_SECONDS)
            session.live_server = None
        cleanups = session.live_cleanups[:]
        del session.live_cleanups[:]
    for cleanup in cleanups:
        cleanup()
    return record


def stopped_by_itself() -> Optional[RunRecord]:
    """The record of the last run if it stopped by itself (a lost GPU) and no stop() has ended
    it since, which this does now; else None. A new start() would replace that run unseen.
    A stop() that Ctrl-C cut short after the thread ended is finished here too, but that run
    was stopped on request: its sampler has no error, as its page and summary say."""
    with session.live_lock:
        sampler = session.live_sampler
        # Closed with its --cells hooks or page left: a stop cut short after the sampler's.
        if sampler is None or sampler.running or (
                sampler.closed and not session.live_cleanups and session.live_server is None):
            return None
    record = stop()  # as any end of a run: its --cells lines went on into the next run
    return record if sampler.error is not None else None


def page_server():
    """The local live page of the running sampler (127.0.0.1 only), started on first use."""
    from .server import LiveServer

    with session.live_lock:
        sampler = running()
        if sampler is None:
            raise SourceError("the live monitor is not running: start it with "
                              + command("%gpu_status --live", "colab_gpu.live.start()"))
        server = session.live_server
        if server is None or server.sampler is not sampler:
            if server is not None:
                server.stop()
            server = session.live_server = LiveServer(sampler).start()
        return server


def live_url() -> str:
    """The address of the live page (for an IFrame where the browser runs on this machine).

    Returns
    -------
    str
        ``http://127.0.0.1:PORT/`` of the page's server, started on first use.

    Raises
    ------
    SourceError
        (a ValueError) The live monitor is not running.
    """
    return page_server().url


def record_of(sampler: Sampler) -> RunRecord:
    return RunRecord(label=sampler.label, interval=sampler.interval, samples=sampler.samples(),
                     gpu_names=dict(sampler.gpu_names), started_at=sampler.started_at,
                     stopped_at=sampler.stopped_at, error=sampler.error, count=sampler.count,
                     display_error=sampler.listener_error, torch_labels=torch_labels(sampler),
                     numbering_note=numbering_note(sampler), recording_note=recording_note(sampler),
                     totals=sampler.totals(), recorded=sampler.recorded)


def history(frame: Optional[bool] = None):
    """The samples of the running or last live run: the last ``history`` of them.

    The DataFrame reads as the charts do: its columns name their unit ("busy (%)", "memory used
    (MiB)", "power (W)", "temperature (°C)"), a column nothing was recorded for is left out (a
    log without power), and the times (UTC) are rounded to the resolution of the sampling
    interval (whole seconds at 1 s), not printed to the nanosecond.

    Parameters
    ----------
    frame : bool, optional
        True: a DataFrame, False: the samples; None: a DataFrame when pandas is installed.

    Returns
    -------
    pandas.DataFrame or tuple of Sample
        One row per GPU and time (``time`` in UTC), or the
        :class:`~colab_gpu.live.sampler.Sample` objects; empty before any run.

    Raises
    ------
    ImportError
        ``frame=True`` without pandas.
    """
    sampler = session.live_sampler
    samples = sampler.samples() if sampler is not None else ()
    if frame is False:
        return samples
    try:
        import pandas
    except ImportError:
        if frame:
            raise
        return samples
    names = sampler.gpu_names if sampler is not None else {}
    data = pandas.DataFrame.from_records(list(rows(samples, names)), columns=list(FRAME_COLUMNS))
    # Aware UTC: a naive time would read as local time, hours off the terminal's lines.
    data["time"] = pandas.to_datetime(data["time"], unit="s", utc=True)
    if sampler is not None:
        data["time"] = data["time"].dt.round(pandas.Timedelta(seconds=time_resolution(sampler.interval)))
    for column in FRAME_COLUMNS[3:]:  # a field a GPU does not report: NaN, not None
        data[column] = pandas.to_numeric(data[column])
    for column in MIB_COLUMNS:
        data[column] = (data[column] / 2 ** 20).round(1)
    if len(data):  # a column of NaN only is one the source never reported
        data = data.drop(columns=[column for column in FRAME_COLUMNS[3:] if data[column].isna().all()])
    return data


def time_resolution(interval: float) -> float:
    """The seconds a sample's time is given to at ``interval``: 1 from 1 s up, 0.1 from 0.1 s."""
    return min(1.0, 10.0 ** math.floor(math.log10(interval)))
