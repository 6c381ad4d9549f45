"""``tune_loader``: how fast a DataLoader delivers batches, which settings would deliver them
faster on this machine, and whether the loader or the training step bounds training.

Layers: ``settings`` (a DataLoader's parts, the settings worth trying, copies built from the
same parts), ``measure`` (timing a copy; the user's loader, its iterator and the random state
untouched), ``choose`` (the answer from the rates, pure), ``hints`` (what would help where
settings cannot), ``result`` and ``render`` (the views). torch is imported inside functions:
whoever holds a DataLoader has imported it.
"""
from __future__ import annotations

import multiprocessing
import os
import re
import statistics
import sys
import warnings
from typing import Any, Callable, Dict, List, Mapping, Optional

from ..host import usable_cores
from ..runtime import cuda_torch
from ..spelling import option
from ..words import duration, significant
from .choose import choose
from .hints import hints as what_would_help
from .measure import (Split, error_text, mover, random_state_kept, restart_seconds, split_batch,
                      step_seconds, time_window)
from .result import LoaderTuning, Measurement, StepTiming, waiting
from .settings import (LoaderError, NotALoader, Setting, batches_per_epoch, check_loader, constructor_call,
                       is_iterable, notebook_parts, rebuilt, setting_of, start_method, worker_counts)

__all__ = ["tune_loader", "LoaderTuning", "LoaderError", "NotALoader", "Setting", "resolve_device"]

PREFETCH_TRIED = 4  # besides torch's 2: a deeper queue smooths items of uneven cost
# persistent_workers=True is recommended where the workers' start-up is at least this share of
# an epoch: below it, keeping the processes (and their memory) between epochs gains nothing visible.
STARTUP_SHARE = 0.02
_DEVICE = re.compile(r"auto|cpu|cuda(:[0-9]+)?")


def resolve_device(device) -> Optional[str]:
    """Where batches are copied while timed: None for the CPU (they stay where the loader
    puts them), or "cuda:N". ``auto``: the current CUDA device once the user's code has started
    CUDA, else the CPU, so that nothing here starts CUDA unasked."""
    spec = f"cuda:{device}" if isinstance(device, int) and not isinstance(device, bool) \
        else "auto" if device is None else str(device)
    if not _DEVICE.fullmatch(spec):
        raise LoaderError(f"{option('device', device)}: use auto, cpu, cuda or cuda:N")
    if spec == "cpu":
        return None
    if spec == "auto":
        torch = cuda_torch()
        return None if torch is None else f"cuda:{torch.cuda.current_device()}"
    import torch

    available = torch.cuda.device_count() if torch.cuda.is_available() else 0
    index = int(spec.partition(":")[2] or 0)
    if index >= available:
        seen = f"{available} CUDA device{'s' if available != 1 else ''}" if available else "no CUDA device"
        raise LoaderError(f"{option('device', device, plain=True)}: torch sees {seen} here; use "
                          f"{option('device', 'auto', plain=True)} or {option('device', 'cpu', plain=True)}")
    return spec if ":" in spec else f"cuda:{torch.cuda.current_device()}"


def _whole(name: str, value, least: int, most: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not least <= value <= most:
        raise LoaderError(f"{option(name, value)}: give a whole number from {least} to {most}")
    return value


def _seconds(value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.01 <= value <= 600:
        raise LoaderError(f"{option('seconds', value)}: give the seconds each timing lasts, from 0.01 to 600")
    return float(value)


def _step_from_search(result, batch_size: Optional[float]) -> StepTiming:
    """The step's time for one of this loader's batches from a %%find_batch result: its trial
    at this batch size where it ran one, else its answer's samples/s scaled to the batch."""
    timed = [trial for trial in getattr(result, "trials", ()) if trial.fits and trial.seconds_per_step]
    if not timed:
        raise LoaderError(f"{option('step')}: the %%find_batch result has no timed size that fitted")
    variable = getattr(result, "variable", "batch_size")
    same = [trial for trial in timed if batch_size is not None and trial.size == batch_size]
    if same:
        trial = same[-1]
        return StepTiming(trial.seconds_per_step, f"%%find_batch's {variable}={trial.size}")
    answer = [trial for trial in timed if trial.size == getattr(result, "answer", None)]
    trial = answer[-1] if answer else max(timed, key=lambda each: each.samples_per_second)
    if batch_size is None:
        raise LoaderError(f"{option('step')}: the loader's batch size is unknown, so the %%find_batch "
                          f"result's {variable}={trial.size} cannot be scaled to it; give a function step(batch)")
    seconds = batch_size / trial.samples_per_second
    return StepTiming(seconds, f"%%find_batch's {variable}={trial.size} at {significant(trial.samples_per_second)} "
                               f"samples/s, scaled to this loader's {significant(batch_size)} a batch")


def _checked_step(step) -> Any:
    if step is None or callable(step) or hasattr(step, "trials"):
        return step
    raise LoaderError(f"{option('step')} takes a function that runs one training step on a batch, "
                      f"step(batch), or a %%find_batch --mode throughput result, not {type(step).__name__}")


class _Rounds:
    """Rates of several settings measured round after round, each round in a rotated order so
    that a machine's load drifting during a round weighs on every setting alike."""

    def __init__(self, loader, seconds: float, deliver, wait):
        self.loader, self.seconds, self.deliver, self.wait = loader, seconds, deliver, wait
        self.rates: Dict[Setting, List[float]] = {}
        self.startups: Dict[Setting, List[float]] = {}
        self.samples: Dict[Setting, List[float]] = {}
        self.with_startup: Dict[Setting, bool] = {}
        self.errors: Dict[Setting, str] = {}
        self.first_error: Dict[Setting, BaseException] = {}
        self.rounds: List[Dict[Setting, float]] = []

    def measure(self, setting: Setting) -> Optional[float]:
        """One timing of the loader alone, kept among ``setting``'s rates; None where a batch
        raised (the dataset's error, a worker's), the error kept with its traceback."""
        try:
            window = time_window(rebuilt(self.loader, setting), self.seconds, self.deliver, self.wait)
        except LoaderError:
            raise
        except Exception as error:
            self.errors[setting] = error_text(error)
            self.first_error.setdefault(setting, error)
            return None
        self.rates.setdefault(setting, []).append(window.rate)
        self.startups.setdefault(setting, []).append(window.startup)
        if window.samples is not None:
            self.samples.setdefault(setting, []).append(window.samples / window.batches)
        self.with_startup[setting] = self.with_startup.get(setting, False) or window.with_startup
        return window.rate

    def run(self, settings: List[Setting], least: int, most: int, done: Callable[[], bool]) -> None:
        """At least ``least`` rounds of ``settings``, up to ``most`` until ``done()``."""
        for number in range(most):
            live = [setting for setting in settings if setting not in self.errors]
            if not live:
                return
            shift = number % len(live)
            measured = {}
            for setting in live[shift:] + live[:shift]:
                rate = self.measure(setting)
                if rate is not None:
                    measured[setting] = rate
            self.rounds.append(measured)
            if number + 1 >= least and done():
                return

    def measured(self, settings) -> Dict[Setting, List[float]]:
        return {setting: self.rates[setting] for setting in settings if self.rates.get(setting)}

    def result(self, setting: Setting, restart: Optional[float] = None) -> Measurement:
        samples = self.samples.get(setting)
        return Measurement(setting, tuple(self.rates.get(setting, ())), tuple(self.startups.get(setting, ())),
                           statistics.mean(samples) if samples else None, self.with_startup.get(setting, False),
                           self.errors.get(setting), restart)


def _namespace_names(namespace: Optional[Mapping[str, Any]]) -> Dict[int, str]:
    """id -> the first public name bound to it, for the constructor call."""
    names: Dict[int, str] = {}
    for key, value in (namespace or {}).items():
        if not key.startswith("_"):
            names.setdefault(id(value), key)
    return names


def _sync(device: Optional[str], step) -> Callable[[], None]:
    """Waits for the device's queued work: where batches go to CUDA, or a step may run there."""
    torch = cuda_torch()
    if device is None and (step is None or torch is None):
        return lambda: None
    import torch as imported

    return imported.cuda.synchronize


def tune_loader(loader, *, step=None, device="auto", seconds: float = 0.5, repeats: int = 3,
                max_workers: Optional[int] = None, name: Optional[str] = None,
                namespace: Optional[Mapping[str, Any]] = None, progress: bool = True) -> LoaderTuning:
    """Measure ``loader`` (a torch DataLoader) with its own settings and with the settings worth
    trying on this machine, and answer the smallest within 5 % of the best batches/s.

    Each setting is timed on a new DataLoader over the same dataset, sampler, batch size,
    collate_fn, drop_last and generator, for ``seconds`` after its workers' start-up (reported
    apart), in ``repeats`` rounds or more (up to twice as many, until the answer is told apart
    from the smaller settings). num_workers goes from 0 to the usable cores and a little past
    (at most ``max_workers``); then prefetch_factor, pin_memory where batches go to CUDA
    (``device``: auto, cpu, cuda or cuda:N; auto copies them to CUDA only once your code has
    started it) and persistent_workers. Your loader, its iterator and the random generators it
    draws from are left as they were; every worker started is stopped before this returns.

    Parameters
    ----------
    loader : torch.utils.data.DataLoader
        The loader to measure; never iterated itself.
    step : callable or BatchResult, optional
        A function running one training step on a batch as the loader yields it (run on one
        batch for ``seconds``, then in the loop with two settings: pass one without side
        effects you mind), or a %%find_batch --mode throughput result; the result then says
        whether the loader or the step bounds training.
    device : str or int, default "auto"
        Where batches are copied while timed: auto, cpu, cuda or cuda:N (auto: CUDA only once
        your code has started it).
    seconds : float, default 0.5
        Each timing's window, after the workers' start-up.
    repeats : int, default 3
        Rounds of timings, 1 to 20 (more are added, up to twice as many, until the answer is
        told apart from the smaller settings).
    max_workers : int, optional
        The most workers tried; by default the usable cores and a little past.
    name : str, optional
        The loader's name in the constructor call to paste.
    namespace : mapping, optional
        Your globals(), to name the loader's parts in that call.
    progress : bool, default True
        Print one line first.

    Returns
    -------
    LoaderTuning
        Every setting's rate, the answer and the constructor call for it.

    Raises
    ------
    LoaderError
        (a UserError) a loader, device or option this cannot work with.
    """
    check_loader(loader)
    step = _checked_step(step)
    seconds = _seconds(seconds)
    repeats = _whole("repeats", repeats, 1, 20)
    if max_workers is not None:
        max_workers = _whole("max_workers", max_workers, 0, 1024)
    target = resolve_device(device)
    names = _namespace_names(namespace)
    name = name or names.get(id(loader), "loader")
    cores, cores_how = usable_cores()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    method = start_method(loader)
    notebook = notebook_parts(loader) if method != "fork" else []
    current = setting_of(loader)
    notes: List[str] = []
    measured_current = current
    if current.pin_memory and target is None:
        measured_current = current.with_(pin_memory=False)
        notes.append("pin_memory=True was timed as False and is kept as it is: pinning matters only for "
                     "batches going to CUDA, which this process has not started (pass "
                     f"{option('device', 'cuda', plain=True)} to time it)")
    counts = [0] if notebook else worker_counts(cores, current.num_workers, max_workers)
    base = Setting(0, pin_memory=target is not None)
    first = _unique([measured_current] + [base.with_(num_workers=count) for count in counts])
    wait = _sync(target, step)
    deliver = mover(target, non_blocking=True) if target is not None else None
    if progress:
        print(f"colab_gpu: timing {name} with {len(first)} settings, {repeats} rounds of {seconds:g} s each "
              f"after its start-up (more rounds where the rates vary); Ctrl-C stops with what was measured",
              flush=True)

    interrupted = False
    timing: Optional[StepTiming] = None
    restart: Optional[float] = None
    with random_state_kept(loader), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*pin_memory.*")  # no accelerator: torch ignores it
        # more workers than cores, which is what "a little past" them tries
        warnings.filterwarnings("ignore", message=r"This DataLoader will create")
        # Python 3.12+ on each fork from a threaded process (a kernel is one): the loader's own choice
        warnings.filterwarnings("ignore", message=r".*use of fork\(\) may lead to deadlocks")
        # Main-process split first: a dataset that raises does so here, with its own traceback.
        split, sample_batch = split_batch(loader, seconds, deliver if target is not None else None, wait)
        timing = _step_timing(step, loader, split, sample_batch, seconds, wait)
        step_time = None if timing is None else timing.seconds_per_batch
        rounds = _Rounds(loader, seconds, deliver, wait)
        if notebook and measured_current.num_workers:  # its workers would fail to start: said, not tried
            rounds.errors[measured_current] = (f"not timed: its workers would start by {method!r} and could "
                                               f"not import {', '.join(notebook)} (see what would help)")
        try:
            _run_phases(rounds, first, repeats, step_time, measured_current, target)
        except KeyboardInterrupt:
            interrupted = True
        every = _unique(first + [setting for setting in rounds.rates if setting not in first])
        rates = rounds.measured(every)
        if not rates:
            if measured_current in rounds.first_error:
                raise rounds.first_error[measured_current]
            raise KeyboardInterrupt if interrupted else LoaderError("no setting could be timed")
        if measured_current not in rates and not rounds.errors.get(measured_current):
            raise KeyboardInterrupt  # interrupted before the loader's own setting was timed
        choice = choose(rates, step_time)
        answer = choice.answer
        if not interrupted and answer.num_workers:
            try:
                restart = _restart_seconds(loader, answer)
            except KeyboardInterrupt:
                interrupted = True
        if callable(step) and timing is not None and not interrupted:
            together = []
            try:
                for setting in _unique([measured_current, answer]):
                    if setting in rates:  # an error here is the step's own: raised as it is
                        window = time_window(rebuilt(loader, setting), seconds, step, wait)
                        together.append((setting, (window.rate,)))
            except KeyboardInterrupt:
                interrupted = True
            timing = StepTiming(timing.seconds_per_batch, timing.source, tuple(together))
    # Every worker has been shut down; this also reaps their process entries.
    multiprocessing.active_children()
    return _result(loader, name, names, current, measured_current, answer, choice, rounds, rates, every,
                   restart, seconds, cores, cores_how, load, method, target, split, timing, notebook,
                   notes, interrupted)


def _step_timing(step, loader, split: Split, sample_batch, seconds: float, wait) -> Optional[StepTiming]:
    """The step's time a batch: timed on one batch where ``step`` is a function, else taken
    from a %%find_batch result; None without a step."""
    if callable(step):
        per_step, runs = step_seconds(step, sample_batch, seconds, wait)
        return StepTiming(per_step, f"step(batch) on one batch, {runs} runs timed")
    if step is not None:
        return _step_from_search(step, loader.batch_size or split.items)
    return None


def _run_phases(rounds: _Rounds, first: List[Setting], repeats: int, step_time: Optional[float],
                measured_current: Setting, target: Optional[str]) -> None:
    """Phase one times ``first`` (the worker counts); phase two the variants around its answer."""
    def settled(settings) -> Callable[[], bool]:
        def done() -> bool:
            rates = rounds.measured(settings)
            return not rates or not choose(rates, step_time).unresolved
        return done

    rounds.run(first, repeats, 2 * repeats, settled(first))
    rates = rounds.measured(first)
    if rates:
        chosen = choose(rates, step_time).answer
        second = _unique([measured_current, chosen] + _variants(chosen, target))
        if len(second) > len(_unique([measured_current, chosen])):  # variants to try
            rounds.run(second, repeats, 2 * repeats, settled(second))


def _restart_seconds(loader, answer: Setting) -> Optional[float]:
    """A new epoch's wait for its first batch with the answer's workers kept alive; Ctrl-C
    passes through."""
    try:
        return restart_seconds(rebuilt(loader, answer.with_(persistent_workers=True)))
    except Exception:  # a restart is what the timed rounds just did without error
        return None


def _variants(chosen: Setting, target: Optional[str]) -> List[Setting]:
    """The settings tried around phase one's answer: a deeper prefetch queue, and pinned memory
    toggled where batches go to CUDA."""
    variants = []
    if chosen.num_workers:
        variants.append(chosen.with_(prefetch_factor=PREFETCH_TRIED))
    if target is not None:
        variants.append(chosen.with_(pin_memory=not chosen.pin_memory))
    return variants


def _unique(settings: List[Setting]) -> List[Setting]:
    seen: List[Setting] = []
    for setting in settings:
        if setting not in seen:
            seen.append(setting)
    return seen


def _result(loader, name, names, current, measured_current, answer, choice, rounds, rates, every, restart,
            seconds, cores, cores_how, load, method, target, split: Split, timing, notebook, notes,
            interrupted) -> LoaderTuning:
    epoch = batches_per_epoch(loader)
    answer_rate = statistics.median(rates[answer])
    final = answer
    startup = statistics.median(rounds.startups[answer])
    if answer.num_workers and epoch:
        epoch_seconds = epoch / answer_rate
        if current.persistent_workers or startup >= STARTUP_SHARE * epoch_seconds:
            final = final.with_(persistent_workers=True)
            if not current.persistent_workers:
                then = f"; a new epoch then waits {duration(restart)} for its first batch" if restart else ""
                notes.append(f"persistent_workers=True: the workers start once ({duration(startup)}), not "
                             f"every epoch, where they cost {startup / epoch_seconds * 100:.0f} % of an "
                             f"epoch's {duration(epoch_seconds)}{then}")
    if answer.num_workers > cores:
        notes.append(f"num_workers={answer.num_workers} is more than the {cores} usable cores (torch warns of "
                     f"it as each epoch starts): it was measured faster here, where items wait on storage or "
                     f"other processes share the cores")
    if target is None and current.pin_memory:
        final = final.with_(pin_memory=True)
    measurements = [rounds.result(setting, restart if setting == answer else None) for setting in every]
    factors = tuple(each[answer] / each[measured_current] for each in rounds.rounds
                    if answer in each and measured_current in each and each[measured_current] > 0)
    if is_iterable(loader) and any(m.rates for m in measurements if m.setting.num_workers):
        notes.append("an iterable dataset gives each worker the whole stream unless its __iter__ splits it "
                     "(torch.utils.data.get_worker_info()): otherwise more workers repeat items rather "
                     "than deliver more of them")
    if measured_current in rounds.errors:
        notes.append(f"the loader's own {measured_current.label()} failed; the answer is among the others")
    if any(measurement.with_startup for measurement in measurements):
        notes.append("an epoch is too short to time past its workers' first round of batches: "
                     "rates marked * include the start-up")
    if interrupted:
        notes.append("interrupted (Ctrl-C): the answer is from what was measured so far")
    zero = next((m for m in measurements if m.setting.num_workers == 0 and m.rates), None)
    answer_measurement = next(m for m in measurements if m.setting == answer)
    still_bound = timing is not None and waiting(answer_rate, timing.seconds_per_batch, answer.num_workers,
                                                 timing.together_rate(answer))[0]
    advice = what_would_help(cores=cores, cores_how=cores_how, zero=zero, answer=answer_measurement,
                             split=split, device=target, step=timing, still_bound=still_bound,
                             notebook=notebook, method=method,
                             workers_failed=any(m.error for m in measurements if m.setting.num_workers)
                             and not any(m.rates for m in measurements if m.setting.num_workers), load=load)
    call = constructor_call(loader, final, name, names,
                            "DataLoader" if _is_torch_loader_class(names) else "torch.utils.data.DataLoader")
    if type(loader).__name__ != "DataLoader" or type(loader).__module__ != "torch.utils.data.dataloader":
        notes.append(f"{name} is a {type(loader).__name__}; the loaders timed and built here are torch "
                     f"DataLoaders over its parts")
    return LoaderTuning(
        name=name, current=current, answer=final, measured_answer=answer, best=choice.best,
        measurements=tuple(measurements), factors=factors, rounds=len(rounds.rounds), seconds=seconds,
        cores=cores, cores_how=cores_how, load=load, start_method=method, device=target, batch_size=loader.batch_size,
        batches_per_epoch=epoch, split=split, step=timing, keeps_up=choice.keeps_up,
        unresolved=choice.unresolved, hints=tuple(advice), notes=tuple(notes), call=call,
        interrupted=interrupted, source=loader)


def _is_torch_loader_class(names: Mapping[int, str]) -> bool:
    """Whether the namespace calls torch's DataLoader ``DataLoader`` (``from torch.utils.data
    import DataLoader``), so the call to paste can say so."""
    data = sys.modules.get("torch.utils.data")
    return data is not None and names.get(id(data.DataLoader)) == "DataLoader"
