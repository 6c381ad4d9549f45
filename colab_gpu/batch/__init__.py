"""``find_batch``: the largest (or fastest) batch size that fits, in few trials.

Layers: ``oom`` says what an error means, ``search`` picks sizes (pure), ``trial`` runs one
size and measures it, ``plan`` predicts sizes for a GPU without one (``caching``: its
allocator, ``gpus``: its sizes), ``state`` leaves the caller's objects as they were, ``result``
holds the answer, ``parallel`` makes it hold across GPUs (DataParallel, the ranks of a process
group), ``render`` / ``progress`` show it. Nothing here imports torch or IPython at
import time.
"""
from __future__ import annotations

import contextlib
import inspect
import re
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from ..cuda import visible_cuda_devices
from ..oom import is_out_of_memory
from ..spelling import option
from ..runtime import cpu_only_build, torch_state
from ..words import count
from .parallel import across_devices
from .plan import Plan, plan_batch
from .result import DEVICE_BROKEN, BatchResult, Prior, Trial
from .search import Search, SearchError, whole_number
from .state import RestoreError, RestorePoint, stateful_objects
from .trial import CtrlC, device_label, release_memory, run_trial

__all__ = ["find_batch", "plan_batch", "is_out_of_memory", "BatchResult", "Plan", "Trial", "SearchError",
           "RestoreError"]
_DEVICE = re.compile(r"auto|cpu|cuda(:[0-9]+)?")  # torch refuses "cuda:١", which int() reads
# Throughput mode compares sizes 5 % apart: a trial's timed runs must add up to this many
# seconds, or one scheduler hiccup in a 100 µs step decides the answer.
THROUGHPUT_TIMED = 0.1


def other_devices() -> str:
    """The devices that work on any machine, as the caller spells the option."""
    return f"{option('device', 'auto', plain=True)} or {option('device', 'cpu', plain=True)}"


def checked_device(device: Union[str, int, Any, None]) -> str:
    """``auto``, ``cpu``, ``cuda`` or ``cuda:N`` (an int or a torch.device is taken too), or
    SearchError: a CUDA device that is not there would be reported as the one searched on."""
    spec = f"cuda:{device}" if isinstance(device, int) and not isinstance(device, bool) \
        else "auto" if device is None else str(device)  # "" is refused, not taken for auto
    if not _DEVICE.fullmatch(spec):
        raise SearchError(f"{option('device', device)}: use auto, cpu, cuda or cuda:N")
    torch = torch_state()
    if spec.startswith("cuda") and torch.build != "rocm":
        index, available = int(spec.partition(":")[2] or 0), visible_cuda_devices()
        if available and torch.build in ("cpu", "mps") and not torch.cuda_initialized:
            # NVML counted the machine's GPUs; the torch imported here can use none of them.
            raise SearchError(f"{option('device', device, plain=True)}: " + cpu_only_build(
                f"torch {torch.version or ''}", ", which cannot use this machine's GPUs;",
                f", or use {other_devices()}"))
        if available is not None and index >= available:
            seen = (f"{count(available, 'CUDA device')} (cuda:0 to cuda:{available - 1})"
                    if available else "no CUDA device")
            raise SearchError(f"{option('device', device, plain=True)}: this machine has {seen}; "
                              f"use {other_devices()}")
    return spec


def check_options(*, variable: str = "batch_size", mode: str = "max", start: Optional[int] = None,
                  maximum: Optional[int] = None, steps: int = 3, headroom=None, multiple_of: int = 1,
                  device: str = "auto") -> None:
    """SearchError for an option ``search_batch`` would refuse, before anything is saved or run."""
    whole_number("steps", steps)
    checked_device(device)
    Search(_never_run, variable=variable, mode=mode, start=start, maximum=maximum,
           multiple_of=multiple_of, headroom=headroom)  # its constructor checks the rest


def _never_run(size: int) -> Trial:
    raise AssertionError("check_options() builds a Search only to check its options")


def prior_of(plan: Optional[Plan], mode: str) -> Tuple[Optional[Prior], Tuple[str, ...]]:
    """The plan's answer as the search's first size and first prediction, or a note saying
    why it gave none; TypeError or SearchError for a plan the search cannot go by."""
    if plan is None:
        return None, ()
    if not isinstance(plan, Plan):
        raise TypeError(f"{option('plan')} takes the Plan that plan_batch() returns, not {plan!r:.80}")
    if mode != "max":
        raise SearchError(f"{option('plan')} predicts the largest size that fits: it goes with "
                          f"{option('mode', 'max')}, not {option('mode', mode)}")
    if plan.answer is None:
        why = (f"{', '.join(plan.unsupported)} has no fake implementation" if plan.unsupported
               else "none was predicted to fit")
        return None, (f"the plan for {plan.gpu} gave no size ({why}): the search started without it",)
    return Prior(plan.answer, plan.gpu), ()


def search_batch(step: Callable[[int], Any], restore_point: RestorePoint, *, variable: str = "batch_size",
                 mode: str = "max", start: Optional[int] = None, maximum: Optional[int] = None,
                 steps: int = 3, headroom=None, multiple_of: int = 1, device: str = "auto",
                 measure_memory: bool = True, progress=None, plan: Optional[Plan] = None,
                 around_run: Callable[[], Any] = contextlib.nullcontext) -> BatchResult:
    """Search with ``step(size)``, restoring ``restore_point`` and freeing memory after every trial.

    ``progress(search)`` is called after every trial and ``progress.finish(result)`` at the
    end. The user's own error (not an out-of-memory, not a broken device) is raised again
    once everything is restored and the progress finished, with its traceback.
    ``around_run()`` is entered around each run of ``step``, outside its timing. ``plan``: the
    search starts at its answer and goes by it until its trials fit memory (see ``prior_of``).
    """
    __tracebackhide__ = True  # IPython shows the user's frames of their error, not ours
    steps = whole_number("steps", steps)
    device = checked_device(device)
    prior, plan_notes = prior_of(plan, mode)
    errors: List[BaseException] = []
    try:
        with CtrlC() as ctrl_c:
            def run(size: int) -> Trial:
                if ctrl_c.pressed:  # held since the last trial ended: stop before the next one
                    raise KeyboardInterrupt
                trial, error = run_trial(step, size, steps, device, measure_memory, ctrl_c,
                                         min_timed=THROUGHPUT_TIMED if mode == "throughput" else 0.0,
                                         around=around_run)
                try:
                    restore_point.restore()
                finally:  # freed also when a --restore object cannot be put back
                    if trial.outcome != DEVICE_BROKEN:
                        release_memory(device)
                search.device = device_label(device)
                if error is not None:
                    errors.append(error)
                return trial

            search = Search(run, variable=variable, mode=mode, start=start, maximum=maximum,
                            multiple_of=multiple_of, headroom=headroom, prior=prior,
                            device=device_label(device), on_trial=progress or (lambda search: None))
            search.notes.extend(plan_notes + tuple(restore_point.notes()))  # what is restored: shown from the first trial on
            try:
                search.run()
            except RestoreError as error:  # it cannot go on: the progress ends saying why
                search.stopped = str(error)
                if progress is not None:
                    progress.finish(search.result())
                raise
            # With --steps 1 the first run is timed too: alone, or as half of a median of two.
            warm_up_timed = steps == 1 and any(trial.fits and trial.runs <= 2 for trial in search.trials)
            if mode == "throughput" and warm_up_timed:
                search.notes.append(f"{option('steps', 1)}: a step of {THROUGHPUT_TIMED / 2:g} s or more "
                                    f"ran once or twice, so its time includes the trial's warm-up "
                                    f"(allocation, optimizer state, autotuning), which weighs most on "
                                    f"small sizes; {option('steps', 3)} or more times warm runs only")
            if not search.headroom.is_zero and search.capacity is None and search.trials:
                why = "memory could not be measured here" if measure_memory \
                    else f"{option('measure_memory', False)} measures no memory"
                search.notes.append(f"{option('headroom', search.headroom.spec, plain=True)} was not "
                                    f"applied: {why}, so only out-of-memory errors decided what fits")
            # Every rank of a process group gets here (or fails, which stops the launch): one all-reduce.
            result = across_devices(search.result(), [state.obj for state in restore_point.objects])
            # Ctrl-C still held: the search has ended, and the final report (the chart, matplotlib's
            # first import: a second) is how it stops; raised there, it left the table "still
            # running" over a KeyboardInterrupt and the answer unassigned.
            if progress is not None:
                progress.finish(result)
    finally:
        # run() and the search refer to each other (search._run, run's `search`): kept, that
        # cycle held the step, what it closes over and the CPU copies of the restored objects
        # until Python's next garbage collection.
        search = None  # type: ignore[assignment]  # not used again: only the cycle is broken
    if errors and result.trials[-1].outcome != DEVICE_BROKEN:
        raise errors[-1]
    return result


def _lazy_kind(fn: Callable) -> Optional[Tuple[str, str]]:
    """What ``fn`` is and what calling it makes, when that runs none of its body (a coroutine
    or generator function, as a partial or an object's ``__call__`` too), else None."""
    for function in (fn, getattr(fn, "__call__", None)):  # noqa: B004 (the method, inspected: no callable test)
        if inspect.iscoroutinefunction(function):
            return "an async function", "a coroutine"
        if inspect.isasyncgenfunction(function) or inspect.isgeneratorfunction(function):
            return "a generator function", "a generator"
    return None


def find_batch(fn: Callable[[int], Any], *, variable: str = "batch_size", mode: str = "max",
               start: Optional[int] = None, max: Optional[int] = None, steps: int = 3,
               headroom: Union[str, int, None] = None, multiple_of: int = 1,
               restore: Union[str, bool, Any, Sequence[Any], Dict[str, Any], None] = "auto", device: str = "auto",
               measure_memory: bool = True, progress: bool = True, plan: Optional[Plan] = None) -> BatchResult:
    """Find the largest batch size that fits (``mode="max"``) or the fastest (``"throughput"``).

    Each trial runs ``fn`` ``steps`` times at one size, the first run untimed; in throughput
    mode a fast step runs until 0.1 s is timed. After every trial the ``restore`` objects and
    the random generators are put back and memory is freed, so each trial starts alike.
    Ctrl-C stops the search and returns the best size so far.

    Parameters
    ----------
    fn : callable
        ``fn(batch_size)`` runs one training (or inference) step.
    variable : str, default "batch_size"
        The name of the size in the report.
    mode : {"max", "throughput"}, default "max"
        The largest size that fits, or the one with the most samples per second.
    start, max : int, optional
        The first and the largest size tried: by default 2 (or ``multiple_of`` if larger,
        or ``max`` if smaller) and 65536.
    steps : int, default 3
        Runs per trial, at least 1.
    headroom : str or int, optional
        Memory to keep free: bytes (``"512MiB"``, an int) or a share (``"10%"``). None: none,
        except 10% on the CPU without an address-space limit, where going past memory gets
        the process killed. Not applied with ``measure_memory=False``.
    multiple_of : int, default 1
        Only its multiples are tried (``start`` and ``max`` rounded down to one, in a note).
    restore : "auto", object, list or dict, or None, default "auto"
        ``"auto"``: the models, optimizers, LR schedulers and GradScalers ``fn`` uses are put
        back after every trial (saved on the CPU while the copies fit in 3/4 of the RAM
        available): those ``fn`` reads as globals, from its closure or its defaults (a
        partial's arguments, a bound method's object too), one level inside each
        (``trainer.model``), and the same for the functions of yours it calls; the report
        lists them. Objects given (one, a list or a dict: tensors, random generators of your
        own such as ``np.random.default_rng``, ``torch.Generator``) are restored as well;
        ``None`` or ``False`` restores none, and the trials train the model.
    device : str, default "auto"
        ``"auto"`` (CUDA once your code has started it, else the CPU), ``"cpu"``, ``"cuda"``,
        ``"cuda:N"`` (or N, or a ``torch.device``).
    measure_memory : bool, default True
        False measures no peak memory: the search doubles, then bisects on real failures (on
        a CPU without an address-space limit there are none: the first size past memory gets
        the process killed).
    progress : bool, default True
        Show a line per trial.
    plan : Plan, optional
        A plan from :func:`plan_batch`, best made for this GPU (``gpu="this"``): the search
        starts at its answer (unless ``start`` is given) and goes by it until its own trials
        fit memory. A right plan is confirmed in two trials: the planned size runs, one 5 %
        above does not. The result says whether the trials confirmed it, and names the GPU
        planned for where it is not the device searched on. Max mode only.

    Returns
    -------
    BatchResult
        The trials and the answer, ``result.answer``: always a size that ran and fitted (None
        when none did). With a ``torch.nn.DataParallel`` model the answer is the whole batch,
        and a note gives each GPU's share. In a ``torch.distributed`` process group of several
        ranks (``colab_gpu.launch``, ``%%distributed``), where every rank calls it and searches
        on its own device, the answer is the smallest of the ranks' answers (one all-reduce).

    Raises
    ------
    TypeError
        ``fn`` is not callable, or calling it runs nothing (an async or generator function),
        or ``plan`` is not a Plan.
    colab_gpu.batch.SearchError
        (a ValueError) An option the search cannot work with (the message says what is
        accepted), a ``device`` this machine lacks, a ``multiple_of`` that leaves no size, or
        a ``plan`` with ``mode="throughput"``.
    colab_gpu.batch.RestoreError
        (a ValueError) A ``restore`` object whose state cannot be saved or put back.
    Exception
        The error ``fn`` raised, when it is neither out of memory nor a broken device: raised
        again, with its traceback, once everything is put back.
    """
    if not callable(fn):  # find_batch(train_step(64)): fail here, not as the first trial's error
        raise TypeError(f"find_batch() takes a function that runs one step at a batch size, "
                        f"fn(batch_size), not {fn!r:.80}")
    lazy = _lazy_kind(fn)
    if lazy:  # calling it runs nothing: every size would "fit", up to max
        name = getattr(fn, "__name__", "fn")
        raise TypeError(f"find_batch() takes a function that runs one step at a batch size; {name:.80} "
                        f"is {lazy[0]}: {name:.80}(batch_size) only creates {lazy[1]} and runs none of "
                        f"the step, so every size would fit; define it with a plain def")
    # Keyed as the caller passed them, which messages name: restore, restore[0], restore['model'].
    found = {} if restore is None or restore is False else stateful_objects(
        [(getattr(fn, "__name__", "fn"), fn)])
    objects: Dict[Any, Any]
    if restore is None or restore is False or (isinstance(restore, str) and restore == "auto"):
        objects = {}  # nothing but what fn uses, or nothing at all
    elif isinstance(restore, dict):
        objects = restore
    elif isinstance(restore, (list, tuple)):
        objects = dict(enumerate(restore))
    else:
        objects = {None: restore}  # one model (or tensor: iterable, but one object)
    from .progress import NotebookProgress, reporter

    shown = reporter() if progress else None
    result = search_batch(fn, RestorePoint(objects=objects, found=found), variable=variable, mode=mode, start=start,
                          maximum=max, steps=steps, headroom=headroom, multiple_of=multiple_of,
                          device=device, measure_memory=measure_memory, progress=shown, plan=plan)
    if isinstance(shown, NotebookProgress):
        shown.empty_if_out(result)
    return result
