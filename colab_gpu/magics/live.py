"""%gpu_status --live and --stop: the options that go together, then the monitor started (or
reused) and shown in this front end; stopped on --stop and when the extension unloads.

The monitor is ``colab_gpu.live``'s, which checks the interval, the history and the source
(an empty --from, --from with --demo) for the magic and the Python API alike.
"""
from __future__ import annotations

import sys
import time
from typing import Callable

from IPython.core.error import UsageError


def stop_and_show(show: Callable[[object], None]) -> None:
    """--stop: the summary of the whole run, or a line saying there is none."""
    from .. import live

    record = live.stop("%gpu_status --stop")
    if record is None:
        print("colab_gpu: the live monitor is not running")
    else:
        show(record)


def check_combination(args) -> None:
    """The options that do not go with --live or --stop, refused before anything starts."""
    if args.stop:
        if args.live or args.json or args.demo or args.cells or args.path is not None or args.interval is not None:
            raise UsageError("--stop takes no other option: %gpu_status --stop")
    elif args.json:
        raise UsageError("--json does not go with --live; colab_gpu.history() gives the samples")


def start_and_show(magics, args) -> None:
    """--live: start a monitor (or reuse the running one, as colab_gpu.live.start() decides)
    and show it as GPUMagics.live_display says. ``magics``: the GPUMagics instance, for its
    settings, its shell and its LiveSession."""
    from .. import live

    ended = live.stopped_by_itself()
    if ended is not None:  # the new run replaces it: its summary now or never
        print(f"colab_gpu: the last live run stopped by itself at "
              f"{time.strftime('%H:%M:%S', time.localtime(ended.stopped_at))}; its summary:")
        magics.show(ended)
    # GPUMagics.live_interval and live_history are for a new monitor: a running one is shown
    # again as it is; an explicit other --interval is refused as another source is.
    new = live.running() is None
    interval = magics.live_interval if args.interval is None and new else args.interval
    try:
        sampler, started = live.start(path=args.path, demo=args.demo, interval=interval,
                                      history=magics.live_history if new else None)
    except live.SourceError as error:  # no driver, a bad recording: said with what to try instead
        raise live.SourceError(f"cannot start the live monitor: {error}"
                               f"{_instead(magics.shell, args)}") from None
    session = magics.live_session()
    if not started:
        print("colab_gpu: " + live.running_words(sampler, "is already running"))
    hooked = args.cells and session.watch_cells()
    try:
        session.show(sampler, magics.live_display, magics.live_lines, started)
    except BaseException:
        if started:  # no monitor left running without its display
            live.stop()
        elif hooked:  # nor the --cells lines of a failed --live on a running one
            session.unwatch_cells()
        raise


def _instead(shell, args) -> str:
    """What to try when the live GPUs cannot be read: the demo, and on a Colab runtime without
    a GPU the menu that gives one (the card's own advice, in short)."""
    if args.demo or args.path is not None:
        return ""
    hint = "; %gpu_status --live --demo replays a recorded trace"
    if _colab_without_gpu(shell):
        from ..advice import COLAB_GPU_MENU

        hint = f"; for a GPU: {COLAB_GPU_MENU}" + hint
    return hint


def _colab_without_gpu(shell) -> bool:
    """A Colab runtime with no NVIDIA driver: a CPU or TPU runtime, where a GPU is a menu away."""
    from ..devices.nvml import nvidia_driver_present
    from ..runtime import COLAB, detect_platform

    return detect_platform(shell) == COLAB and not nvidia_driver_present()


def stop_on_unload(show: Callable[[object], None]) -> None:
    """%unload_ext / %reload_ext end the monitor: show the summary --stop would have shown.
    Also one a script started with colab_gpu.live.start(), which made no LiveSession; never
    imported, the live package has no monitor to stop."""
    live = sys.modules.get(f"{__package__.rpartition('.')[0]}.live")
    record = live.stop("%unload_ext or %reload_ext colab_gpu") if live is not None else None
    if record is not None:
        show(record)
