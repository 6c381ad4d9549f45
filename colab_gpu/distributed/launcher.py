"""``launch``: the notebook's process forks the ranks, shows what they print, and collects what
they return or how the first one failed.

Fork, not spawn: a spawned process starts a new interpreter and must import the function by
name, which a function defined in a notebook cell does not have. The parent does all its work
in the calling thread: it reads the ranks' pipes and writes to ``sys.stdout``/``sys.stderr`` as
the cell's own prints do (Jupyter and Colab capture them there, a terminal shows them), and a
Ctrl-C lands where it can stop every rank. Each rank leads its own process group, so stopping
it stops what it forked (DataLoader workers), and dies with the parent (``PR_SET_PDEATHSIG``),
so a kernel killed by a restart leaves no rank holding a GPU.
"""
from __future__ import annotations

import contextlib
import datetime
import numbers
import os
import pickle
import selectors
import signal
import socket
import sys
import threading
import time
import warnings
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from ..runtime import torch_state
from ..spelling import option
from .cuda_state import cuda_started
from .failures import LaunchOptionError, LaunchRefused, LaunchTimeout, RankError, RankTraceback
from .output import RankLines
from .rank import FAILED, HEADER, OK, Rank, run_rank

__all__ = ["launch", "BACKENDS", "GRACE", "plan", "distributed_here", "check_nccl", "gpu_count", "free_port",
           "launched_already", "run_here", "has_memory", "Ranks"]

BACKENDS = ("nccl", "gloo")
POLL = 0.05  # seconds between two looks at the ranks' processes
GRACE = 2.0  # seconds a rank being stopped gets after SIGTERM before SIGKILL
# Seconds between the first failure seen and the choice of the one to report: a rank killed
# (out of memory) sends nothing, and its peers' "connection closed" errors can arrive before
# its death is seen; they are its consequence, not the cause.
SETTLE = 0.3
REAP = 5.0  # seconds to wait for a SIGKILLed process (one in the GPU driver can take a moment)


def launch(fn: Callable, *args, nprocs: Optional[int] = None, backend: Optional[str] = None,
           timeout: Optional[float] = None, **kwargs) -> List[Any]:
    """Run ``fn(*args, **kwargs)`` once per GPU, with torch.distributed set up in each process.

    The processes (ranks) are forked from this one, so the functions and data defined in the
    notebook are there as they are now. What a rank prints appears here as it happens,
    prefixed with ``[rank N]``. The first rank to fail stops the others; Ctrl-C stops every
    rank. CUDA must not have started in this process before a launch on GPUs
    (``torch.cuda.device_count()`` and ``%gpu_status`` do not start it;
    ``torch.cuda.is_available()`` does). In a process that is already a rank (``RANK`` and
    ``WORLD_SIZE`` set, as under torchrun, or a process group initialized), ``fn`` runs here,
    in that process group, and every rank gets the list (``all_gather_object``).

    Parameters
    ----------
    fn : callable
        The function each rank runs; ``torch.distributed`` is initialized (``RANK``,
        ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``/``MASTER_PORT``: 127.0.0.1 and a free
        port) and, with NCCL, rank N runs on ``cuda:N``.
    *args : any
        Given to ``fn``.
    nprocs : int, optional
        How many ranks: one per visible GPU by default (needed where there is no GPU).
    backend : {"nccl", "gloo"}, optional
        NCCL (one GPU per rank) or Gloo (the CPU); by default NCCL where there are GPUs.
    timeout : float, optional
        Seconds the whole run may take, and the process group's timeout; None waits until
        the ranks end.
    **kwargs : any
        Given to ``fn`` (any name but ``nprocs``, ``backend`` and ``timeout``).

    Returns
    -------
    list
        Each rank's return value, in rank order, pickled back (tensors moved to the CPU:
        unpickled here, a CUDA tensor would start CUDA in this process).

    Raises
    ------
    colab_gpu.RankError
        A rank raised, or its process ended without returning (killed, crashed); its
        traceback is the cause, and the other ranks were stopped.
    colab_gpu.distributed.LaunchTimeout
        (a TimeoutError) The ranks still ran after ``timeout`` seconds; all were stopped.
    colab_gpu.distributed.LaunchOptionError
        (a ValueError) An ``nprocs``, ``backend`` or ``timeout`` that cannot run here.
    colab_gpu.distributed.LaunchRefused
        (a ValueError) CUDA already started in this process, no fork (Windows), or no
        torch.distributed or backend in this torch.
    TypeError
        ``fn`` is not callable.
    """
    __tracebackhide__ = True  # IPython shows the cell's line and the rank's error, not these frames
    if not callable(fn):
        raise TypeError(f"launch runs a function: launch(train, nprocs=2), not {fn!r}")
    timeout = checked_timeout(timeout)
    if launched_already():
        return run_here(fn, args, kwargs, backend, timeout)
    nprocs, backend = plan(nprocs, backend)
    try:
        return Ranks(nprocs, backend, timeout).run(fn, args, kwargs)
    except (RankError, LaunchTimeout) as error:
        # raised from here: the rank's own traceback is the cause, the watching frames say nothing
        raise error.with_traceback(None) from error.__cause__


def checked_timeout(timeout) -> Optional[float]:
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real) or not 0 < float(timeout) < float("inf"):
        raise LaunchOptionError(f"{option('timeout', timeout)}: give a positive number of seconds, or None "
                                f"to wait until the ranks end")
    return float(timeout)


def launched_already(environ=os.environ, modules=sys.modules) -> bool:
    """Whether this process is already a rank: torchrun's variables, or a process group."""
    if "RANK" in environ and "WORLD_SIZE" in environ:
        return True
    dist = getattr(modules.get("torch"), "distributed", None)
    try:
        return bool(dist is not None and dist.is_available() and dist.is_initialized())
    except Exception:
        return False


def run_here(fn: Callable, args: tuple, kwargs: dict, backend: Optional[str], timeout: Optional[float]) -> list:
    """``fn`` in this process, a rank already (torchrun): the process group used or set up from
    the environment, every rank's value gathered on every rank."""
    import torch
    import torch.distributed as dist

    created = not dist.is_initialized()
    if created:
        if backend is None:
            backend = "nccl" if torch.cuda.is_available() else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        options: Dict[str, Any] = {} if timeout is None else {"timeout": datetime.timedelta(seconds=timeout)}
        dist.init_process_group(backend, **options)
    try:
        value = fn(*args, **kwargs)
        values: List[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(values, value)
        return values
    finally:
        if created:
            dist.destroy_process_group()


def plan(nprocs: Optional[int], backend: Optional[str]) -> Tuple[int, str]:
    """(processes, backend) for what was asked, or a one-line refusal."""
    if nprocs is not None and (isinstance(nprocs, bool) or not isinstance(nprocs, numbers.Integral) or nprocs < 1):
        raise LaunchOptionError(f"{option('nprocs', nprocs)}: give a whole number of processes, 1 or more")
    if backend is not None and backend not in BACKENDS:
        raise LaunchOptionError(f"{option('backend', backend)}: use 'nccl' (one GPU per rank) or 'gloo' "
                                f"(the CPU); without it NCCL is used where there are GPUs")
    dist = distributed_here()
    gpus = gpu_count()  # None: NVML could not tell
    if backend is None:
        if gpus is None:
            raise LaunchOptionError(f"the GPUs could not be counted (NVML cannot be read here): give "
                                    f"{option('backend', 'nccl')} and {option('nprocs')}, or "
                                    f"{option('backend', 'gloo')} for the CPU")
        backend = "nccl" if gpus else "gloo"
    if nprocs is None:
        if not gpus:
            seen = "no GPU is visible here" if gpus == 0 else "the GPUs could not be counted"
            raise LaunchOptionError(f"{seen}: give {option('nprocs', 2)} to run 2 processes "
                                    f"{'with NCCL' if backend == 'nccl' else 'on the CPU with Gloo'}")
        nprocs = gpus
    if backend == "nccl":
        check_nccl(dist, int(nprocs), gpus)
    elif not dist.is_gloo_available():
        raise LaunchRefused("this torch has no Gloo backend: give backend='nccl' on GPUs")
    return int(nprocs), backend


def distributed_here():
    """torch.distributed, where this system forks and this torch has it; else a refusal."""
    if not hasattr(os, "fork"):
        raise LaunchRefused("launch forks this process, and this system has no fork (Windows): put the "
                            "function in a script and run it with torchrun, which launch also works under")
    try:
        import torch.distributed as dist
    except ImportError as error:
        raise LaunchRefused(f"torch.distributed cannot be imported ({error}): launch needs torch") from None
    if not dist.is_available():
        raise LaunchRefused("this torch was built without torch.distributed: launch needs a build with it "
                            "(the Linux wheels of pytorch.org and PyPI have it)")
    return dist


def check_nccl(dist, nprocs: int, gpus: Optional[int]) -> None:
    """A GPU per rank, NCCL in this torch, and CUDA not started here (a forked rank could not use it)."""
    if gpus == 0:
        raise LaunchOptionError(f"{option('backend', 'nccl')} needs a GPU per rank, and no GPU is visible "
                                f"here: {option('backend', 'gloo')} runs the ranks on the CPU")
    if gpus is not None and nprocs > gpus:
        raise LaunchOptionError(f"{option('nprocs', nprocs)} with NCCL needs {nprocs} GPUs (one per rank); "
                                f"{gpus} {'is' if gpus == 1 else 'are'} visible: give {option('nprocs', gpus)}, "
                                f"or {option('backend', 'gloo')} for more ranks than GPUs")
    if not dist.is_nccl_available():
        raise LaunchRefused("this torch has no NCCL (a CPU or macOS build): "
                            f"{option('backend', 'gloo')} runs the ranks on the CPU")
    started = cuda_started()
    if started is not None:
        raise LaunchRefused(f"CUDA already started in this process ({started}), and processes forked "
                            f"from it cannot use the GPU: restart the kernel and launch before anything "
                            f"starts CUDA (torch.cuda.device_count() and %gpu_status do not; "
                            f"torch.cuda.is_available() does)")


def gpu_count() -> Optional[int]:
    """The CUDA devices a rank's torch can use, counted without starting CUDA; None: unknown."""
    from ..cuda import visible_cuda_devices

    build = torch_state().build
    if build in ("cpu", "mps"):
        return 0  # NVML may see GPUs that this torch cannot use
    if build == "rocm":
        return None  # NVML sees no AMD GPU
    return visible_cuda_devices()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now: rank 0's rendezvous. A fixed port
    (accelerate's 29500) is taken by a run still going, or left behind, in another notebook."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class RankProcess:
    """One forked rank as the parent sees it: its pipes, what it sent, how it ended."""

    def __init__(self, rank: int, pid: int, stdout: int, stderr: int, result: int):
        self.rank, self.pid = rank, pid
        self.streams = {stdout: "stdout", stderr: "stderr", result: "result"}
        self.lines = {stdout: RankLines(rank), stderr: RankLines(rank)}
        self.received = bytearray()
        self.status: Optional[int] = None  # the exit code once reaped (negative: the signal)
        self.stopped = False  # stopped by the parent (another rank failed, Ctrl-C, the timeout)
        self.reaped = False
        self.alive_at = time.monotonic()  # when it was last seen running: a death sends no time
        self.dying = False  # its memory is gone: killed, and still closing its files
        self._failure: Optional[tuple] = None

    @property
    def sent(self) -> Optional[bytes]:
        """The kind of what the rank sent back (OK, FAILED) once it is whole, else None."""
        if len(self.received) < HEADER.size:
            return None
        (length,) = HEADER.unpack_from(self.received)
        return bytes(self.received[HEADER.size:HEADER.size + 1]) if len(self.received) >= HEADER.size + length else None

    def payload(self) -> bytes:
        """The pickle the rank sent after its kind."""
        return bytes(memoryview(self.received)[HEADER.size + 1:])

    def failure(self) -> Optional[tuple]:
        """(when, summary, traceback, exception pickled, during set-up) if the rank sent a failure."""
        if self._failure is None and self.sent == FAILED:
            self._failure = pickle.loads(self.payload())
        return self._failure


class Ranks:
    """The run: fork every rank, watch them, stop them all however it ends."""

    def __init__(self, nprocs: int, backend: str, timeout: Optional[float]):
        self.nprocs, self.backend, self.timeout = nprocs, backend, timeout
        self.processes: List[RankProcess] = []
        self.selector = selectors.DefaultSelector()
        self.owner: Dict[int, RankProcess] = {}  # pipe -> its rank
        self.wrote = False

    def run(self, fn: Callable, args: tuple, kwargs: dict) -> List[Any]:
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        try:
            self.start(fn, args, kwargs)
            failed = self.watch(deadline)
        except KeyboardInterrupt:
            with deferred_interrupt():
                self.stop(range(self.nprocs))
            raise KeyboardInterrupt(f"colab_gpu.launch stopped every rank ({self.nprocs} processes)") from None
        finally:
            with deferred_interrupt():
                self.stop(range(len(self.processes)))
                self.close()
        if failed is not None:
            raise self.rank_error(failed)
        if deadline is not None and any(process.status is None or process.stopped for process in self.processes):
            raise LaunchTimeout(f"the ranks were still running after timeout={self.timeout:g} s; every one was "
                                f"stopped")
        return self.values()

    def start(self, fn: Callable, args: tuple, kwargs: dict) -> None:
        libc = _libc()
        port = free_port()
        parent = os.getpid()
        for stream in (sys.stdout, sys.stderr):  # what the children would otherwise print again
            with contextlib.suppress(Exception):
                stream.flush()
        if libc is not None:
            libc.fflush(None)
        for rank in range(self.nprocs):
            (out_read, out_write), (err_read, err_write), (result_read, result_write) = os.pipe(), os.pipe(), os.pipe()
            close = [out_read, err_read, result_read] + list(self.owner)
            with forking():
                pid = os.fork()
            if pid == 0:
                run_rank(Rank(rank, self.nprocs, port, self.backend, self.timeout, parent, out_write, err_write,
                              result_write, libc), fn, args, kwargs, close)
            for descriptor in (out_write, err_write, result_write):
                os.close(descriptor)
            with contextlib.suppress(OSError):  # as the child does: whichever runs first
                os.setpgid(pid, pid)
            process = RankProcess(rank, pid, out_read, err_read, result_read)
            self.processes.append(process)
            for descriptor in process.streams:
                os.set_blocking(descriptor, False)
                self.selector.register(descriptor, selectors.EVENT_READ)
                self.owner[descriptor] = process

    def watch(self, deadline: Optional[float]) -> Optional[RankProcess]:
        """Until every rank ended, one failed or the deadline passed; the rank that failed first."""
        settled: Optional[float] = None
        while True:
            self.read(POLL)
            self.reap()
            if settled is None and self.first_failure() is not None:
                settled = time.monotonic() + SETTLE
            if settled is not None and (time.monotonic() > settled or all(p.reaped for p in self.processes)):
                failed = self.first_failure()
                self.stop([process.rank for process in self.processes if process is not failed])
                return failed
            if all(process.reaped for process in self.processes):
                return None
            if deadline is not None and time.monotonic() > deadline:
                return None

    def read(self, wait: float) -> None:
        """Read what the ranks wrote within ``wait`` seconds; their lines to this cell's output."""
        if not self.owner:
            time.sleep(wait)
            return
        for key, _ in self.selector.select(wait):
            self.drain(key.fd)
        self.flush()

    def drain(self, descriptor: int) -> None:
        process = self.owner[descriptor]
        kind = process.streams[descriptor]
        while True:
            try:
                data = os.read(descriptor, 1 << 16)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                self.forget(descriptor)
                return
            if kind == "result":
                process.received += data
            else:
                self.write(kind, process.lines[descriptor].feed(data))

    def write(self, kind: str, text: str) -> None:
        if text:
            with contextlib.suppress(Exception):  # a closed or broken output must not stop the run
                (sys.stdout if kind == "stdout" else sys.stderr).write(text)
                self.wrote = True

    def flush(self) -> None:
        if self.wrote:
            self.wrote = False
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(Exception):
                    stream.flush()

    def forget(self, descriptor: int) -> None:
        """Stop reading a pipe: its end, or its rank's (a process it forked may hold it open)."""
        process = self.owner.pop(descriptor)
        self.selector.unregister(descriptor)
        os.close(descriptor)
        if descriptor in process.lines:
            self.write(process.streams[descriptor], process.lines[descriptor].end())

    def reap(self) -> None:
        """Note the ranks whose process ended, and take the rest of what they wrote."""
        for process in self.processes:
            if process.reaped:
                continue
            try:
                pid, status = os.waitpid(process.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere (a SIGCHLD handler): its status is lost
                pid, status = process.pid, 255 << 8
            if pid == 0:
                if has_memory(process.pid):
                    process.alive_at = time.monotonic()
                else:
                    process.dying = True
                continue
            process.reaped = True
            process.status = os.waitstatus_to_exitcode(status)
            for descriptor in [descriptor for descriptor, owner in self.owner.items() if owner is process]:
                self.drain(descriptor)
                if descriptor in self.owner:  # held open by a process the rank forked
                    self.forget(descriptor)
        self.flush()

    def first_failure(self) -> Optional[RankProcess]:
        """The rank that failed first: by the time it said so, or for one that died without a
        word, the last time it was seen running (the earliest it can have died)."""
        failed = []
        for process in self.processes:
            sent = process.failure()
            if sent is not None:  # also from a rank stopped since: it said so first
                failed.append((sent[0], process))
            elif (process.reaped or process.dying) and not process.stopped and process.sent is None:
                failed.append((process.alive_at, process))  # ended without a word: killed, crashed, os._exit
        return min(failed, key=lambda pair: pair[0])[1] if failed else None

    def _await_reaped(self, chosen, seconds: float) -> None:
        """Read their output and reap them until all have ended or ``seconds`` have passed."""
        ends = time.monotonic() + seconds
        while any(not process.reaped for process in chosen) and time.monotonic() < ends:
            self.read(POLL)
            self.reap()

    def stop(self, ranks) -> None:
        """SIGTERM to these ranks' process groups, SIGKILL after GRACE; every one reaped, and what
        they forked killed. What they print meanwhile is still shown."""
        chosen = [self.processes[rank] for rank in ranks if rank < len(self.processes)]
        for process in chosen:
            if not process.reaped:
                process.stopped = process.sent is None  # one that has sent its value is ending anyway
                _signal_group(process.pid, signal.SIGTERM)
        self._await_reaped(chosen, GRACE)
        for process in chosen:
            if not process.reaped:
                _signal_group(process.pid, signal.SIGKILL)
        self._await_reaped(chosen, REAP)
        for process in chosen:
            _signal_group(process.pid, signal.SIGKILL)  # what it forked, still in its group

    def close(self) -> None:
        for descriptor in list(self.owner):
            self.forget(descriptor)
        self.selector.close()
        self.flush()

    def rank_error(self, failed: RankProcess) -> RankError:
        """The first failure, in one line; the rank's traceback as its cause."""
        unfinished = sorted(process.rank for process in self.processes  # stopped, or failed after it
                            if process is not failed and process.sent != OK)
        others = (f"; {'rank' if len(unfinished) == 1 else 'ranks'} {', '.join(map(str, unfinished))} "
                  f"did not finish") if unfinished else ""
        sent = failed.failure()
        where = f"rank {failed.rank} of {self.nprocs}"
        if sent is None:
            what = _ended(failed.status)
            error = RankError(f"{where} failed: {what}{others}", failed.rank, exit_code=failed.status)
            return error
        _, summary, text, pickled, setup = sent
        exception = None
        if pickled is not None:
            with contextlib.suppress(Exception):
                exception = pickle.loads(pickled)
        during = " while joining the process group" if setup else ""
        hint = ""
        if "re-initialize CUDA in forked subprocess" in text:
            hint = (" (CUDA had started in this process before the launch: restart the kernel and launch "
                    "before anything starts CUDA)")
        error = RankError(f"{where} failed{during}: {summary}{hint}{others}", failed.rank, text, exception)
        error.__cause__ = RankTraceback(f"rank {failed.rank}'s traceback:\n{text.rstrip()}")
        return error

    def values(self) -> List[Any]:
        values = []
        for process in self.processes:
            try:
                value = pickle.loads(process.payload())
            except Exception as error:  # a class the rank made, that this process does not have
                raise RankError(f"rank {process.rank}'s return value cannot be read here: "
                                f"{type(error).__name__}: {error}", process.rank) from error
            values.append(value)
        return values


def _ended(status: Optional[int]) -> str:
    """How a rank's process ended without sending anything back."""
    if status is not None and status < 0:
        name = signal.Signals(-status).name if -status in signal.valid_signals() else f"signal {-status}"
        cause = " (the system's out-of-memory killer sends it)" if -status == signal.SIGKILL else ""
        return f"its process was killed by {name}{cause}"
    if status == 0:
        return "its process ended without returning (os._exit(0) in the function?)"
    return f"its process exited with code {status} without returning"


def has_memory(pid: int) -> bool:
    """Whether a process not yet ended still has its memory. A killed process frees it first,
    then closes its files: its peers see their connections close (and fail) before its end
    can be seen, and its death must be dated before their failures (Linux; True elsewhere)."""
    try:
        with open(f"/proc/{pid}/statm") as statm:
            return statm.read().split()[0] != "0"
    except (OSError, IndexError):
        return True


def _signal_group(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signum)


def _libc():
    """The C library, for fflush and prctl: loaded here, before the fork (POSIX only)."""
    if os.name != "posix":
        return None
    import ctypes

    try:
        return ctypes.CDLL(None)
    except OSError:
        return None


@contextlib.contextmanager
def forking() -> Iterator[None]:
    """os.fork without Python 3.12's warning that this process has threads: the kernel always
    has them, and the rank touches nothing they hold (see rank.py)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*use of fork\(\) may lead to deadlocks", category=DeprecationWarning)
        yield


@contextlib.contextmanager
def deferred_interrupt() -> Iterator[None]:
    """A Ctrl-C while the ranks are being stopped waits until they are: cut short, the stop
    would leave processes behind. Raised at the end, unless an error is already on its way."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    interrupted = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: interrupted.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if interrupted and sys.exc_info()[0] is None:
        raise KeyboardInterrupt
