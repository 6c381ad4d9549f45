"""One rank: the forked process's side of ``launch``.

The child is a copy of the notebook's process with one thread: the kernel's threads (its
messaging, the live monitor's sampler) were not copied, so it must touch none of what they
served. It writes to pipes of its own (fd 1 and 2, C libraries' output too), shows displays as
text, joins the process group, runs the function and sends back what it returned or how it
failed. It always ends in ``os._exit``: never back into the kernel's code that forked it, and
without running the kernel's exit handlers (the NVML shutdown, the history database).
"""
from __future__ import annotations

import io
import os
import pickle
import signal
import struct
import sys
import time
import traceback
from typing import Any, Callable, Dict, Optional

__all__ = ["Rank", "HEADER", "OK", "FAILED", "run_rank", "send", "to_cpu_pickle"]

HEADER = struct.Struct("!Q")  # the length of the one message a rank sends back
# What the message is, its first byte: the value fn returned, or how the rank failed, pickled.
OK, FAILED = b"v", b"f"
PR_SET_PDEATHSIG = 1  # prctl(2): a signal the kernel sends this process when its parent dies


class Rank:
    """What a forked process needs to become rank ``rank``."""

    def __init__(self, rank: int, world_size: int, port: int, backend: str, timeout: Optional[float],
                 parent: int, stdout: int, stderr: int, result: int, libc: Any):
        self.rank, self.world_size, self.port, self.backend, self.timeout = rank, world_size, port, backend, timeout
        self.parent = parent  # the launching process's id
        self.stdout, self.stderr, self.result = stdout, stderr, result  # the write ends of its pipes
        self.libc = libc  # loaded before the fork: nothing is loaded in the child


def run_rank(rank: Rank, fn: Callable, args: tuple, kwargs: dict, close: list) -> None:
    """Become the rank, run ``fn(*args, **kwargs)``, send back its value or failure, and exit.
    ``close``: the descriptors of the parent's that this rank has no use for. Never returns."""
    code = 1
    try:
        _become(rank, close)
        code = _run(rank, fn, args, kwargs)
    except BaseException:  # a failure of the set-up itself: said on the rank's stderr
        try:
            traceback.print_exc()
        except BaseException:
            pass
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except BaseException:
            pass
        if rank.libc is not None:
            rank.libc.fflush(None)  # what C code printed: os._exit flushes nothing
        os._exit(code)


def _become(rank: Rank, close: list) -> None:
    """The process: its own process group (the parent stops it and whatever it forks as one,
    and a Ctrl-C in the terminal goes to the parent alone), death with its parent, its own
    output, the rendezvous variables torchrun would set."""
    try:
        os.setpgid(0, 0)
    except OSError:
        pass
    if rank.libc is not None and sys.platform.startswith("linux"):
        rank.libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != rank.parent:  # the parent died before prctl: nobody would stop this rank
        os._exit(1)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    for descriptor in close:
        try:
            os.close(descriptor)
        except OSError:
            pass
    _own_output(rank)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(rank.port), RANK=str(rank.rank),
                      WORLD_SIZE=str(rank.world_size), LOCAL_RANK=str(rank.rank),
                      LOCAL_WORLD_SIZE=str(rank.world_size))
    # Gloo finds its address through the host name, which a container may resolve to an
    # address it cannot listen on (accelerate pins it too): every rank is on this machine.
    if rank.backend == "gloo" and "GLOO_SOCKET_IFNAME" not in os.environ and _has_interface("lo"):
        os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    torch = sys.modules.get("torch")
    if torch is not None:
        # The parent's OpenMP thread pool, once a CPU op used it, was copied without its threads:
        # the rank's first parallel op would wait for them forever. One thread a rank, as torchrun
        # sets for several processes.
        torch.set_num_threads(1)


def _has_interface(name: str) -> bool:
    import socket

    try:
        return any(interface == name for _, interface in socket.if_nameindex())
    except OSError:
        return False


def _own_output(rank: Rank) -> None:
    """Standard output and error on this rank's pipes, line by line; no standard input (a
    terminal's belongs to the parent); logging handlers that wrote to the kernel's streams
    moved to these; displays printed as text (the kernel's display channel is not here)."""
    old = sys.stdout, sys.stderr
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(rank.stdout, 1)
    os.dup2(rank.stderr, 2)
    os.close(rank.stdout)
    os.close(rank.stderr)
    sys.stdin = open(0, closefd=False)
    # line by line; sys.__stdout__, the kernel's own, writes to fd 1 too: this pipe
    sys.stdout = open(1, "w", buffering=1, encoding="utf-8", errors="backslashreplace", closefd=False)
    sys.stderr = open(2, "w", buffering=1, encoding="utf-8", errors="backslashreplace", closefd=False)
    import logging

    loggers = [logging.getLogger()] + [logger for logger in logging.Logger.manager.loggerDict.values()
                                       if isinstance(logger, logging.Logger)]
    for logger in loggers:
        for handler in logger.handlers:
            if isinstance(handler, logging.StreamHandler) and handler.stream in old:
                handler.stream = sys.stdout if handler.stream is old[0] else sys.stderr
    shell = _shell()
    if shell is not None and getattr(shell, "display_pub", None) is not None:
        from IPython.core.displaypub import DisplayPublisher

        shell.display_pub = DisplayPublisher(shell=shell)  # prints each display's text/plain


def _shell():
    ipython = sys.modules.get("IPython")
    get_ipython = getattr(ipython, "get_ipython", None)
    return get_ipython() if get_ipython is not None else None


def _run(rank: Rank, fn: Callable, args: tuple, kwargs: dict) -> int:
    """Join the process group, run ``fn``, send back its value or its failure; the exit code."""
    import datetime

    import torch.distributed as dist

    if rank.backend == "nccl":
        import torch

        torch.cuda.set_device(rank.rank)
    options: Dict[str, Any] = {} if rank.timeout is None else {"timeout": datetime.timedelta(seconds=rank.timeout)}
    try:
        dist.init_process_group(rank.backend, rank=rank.rank, world_size=rank.world_size, **options)
    except BaseException as error:
        send(rank.result, _failure(error, error.__traceback__, setup=True))
        return 1
    try:
        value = fn(*args, **kwargs)
    except BaseException as error:
        tb = error.__traceback__
        send(rank.result, _failure(error, tb.tb_next if tb is not None else None))  # from fn's frame on
        return 1
    try:
        message = OK + to_cpu_pickle(value)
    except BaseException as error:
        send(rank.result, _failure(TypeError(
            f"the function returned {type(value).__name__} {_short(value)}, which cannot be sent back "
            f"to the notebook: {type(error).__name__}: {error}"), None))
        return 1
    try:
        dist.destroy_process_group()
    except BaseException:
        pass
    send(rank.result, message)
    return 0


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _failure(error: BaseException, tb, setup: bool = False) -> bytes:
    """The message for a rank that failed: when (the first failure is the cause: the others
    fail because of it), what, its traceback as text, the exception itself where it pickles."""
    while tb is not None and _hidden(tb.tb_frame):
        tb = tb.tb_next
    text = "".join(traceback.format_exception(type(error), error, tb))
    exception: Optional[bytes] = None
    try:
        pickled = pickle.dumps(error)
        pickle.loads(pickled)  # an exception class whose __init__ takes other arguments does not
        exception = pickled
    except BaseException:
        pass
    summary = traceback.format_exception_only(type(error), error)[-1].strip()
    return FAILED + pickle.dumps((time.monotonic(), summary, text, exception, setup))


def _hidden(frame) -> bool:
    """A function marked with IPython's ``__tracebackhide__`` (%%distributed's runner): its own
    local, not a name of the notebook's a cell's frame sees among its globals."""
    return "__tracebackhide__" in frame.f_code.co_varnames and bool(frame.f_locals.get("__tracebackhide__"))


def send(descriptor: int, message: bytes) -> None:
    """The rank's one message, with its length first: the parent reads it as it comes (a large
    value fills the pipe) and knows when it is whole."""
    view = memoryview(HEADER.pack(len(message)) + message)
    while view:
        view = view[os.write(descriptor, view):]


def to_cpu_pickle(value: Any) -> bytes:
    """``value`` pickled with every torch tensor in it on the CPU: unpickled in the notebook, a
    CUDA tensor would start CUDA there, and the next launch could not fork a rank that uses it."""
    buffer = io.BytesIO()
    _CpuPickler(buffer, pickle.HIGHEST_PROTOCOL).dump(value)
    return buffer.getvalue()


class _CpuPickler(pickle.Pickler):
    def reducer_override(self, obj):
        torch = sys.modules.get("torch")
        if torch is None or not isinstance(obj, torch.Tensor) or obj.device.type in ("cpu", "meta"):
            return NotImplemented
        on_cpu = obj.detach().cpu()
        if isinstance(obj, torch.nn.Parameter):
            on_cpu = torch.nn.Parameter(on_cpu, requires_grad=obj.requires_grad)
        return on_cpu.__reduce_ex__(pickle.HIGHEST_PROTOCOL)
