"""The clearing: ``clear_cache()``'s steps (drop the last exception, clear the output history,
delete the variables named, collect garbage, empty torch's CUDA cache), each measured, and
the report of what each freed, ending with the ranking of who still holds memory. Apart
because it is the one part that changes the user's namespace and IPython's state.
"""
from __future__ import annotations

import builtins
import dataclasses
import gc
import sys
import types
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from ..cuda import empty_cuda_cache
from ..devices import DeviceSource
from ..errors import UserError
from ..oom import ErrorKind, classify, describe
from ..spelling import command, option
from ..runtime import cuda_torch, current_shell
from ..words import count
from ..render.shown import Shown
from .holders import Holders, holders_of, lying_on_arrays
from .namespace import (MISSING, OUTPUT_NAME, exception_references, is_dunder, is_ipython_name,
                        namespaces, output_history)
from .readings import Reading, read_memory, read_snapshot
from .walk import imported_torch, walk_from

__all__ = ["ClearCacheError", "ClearReport", "Step", "check_names", "clear_cache", "clear_output_history",
           "delete_variables", "drop_exception", "holds_torch"]


class ClearCacheError(UserError, ValueError):
    """A request that cannot be carried out (an unknown name, IPython's own name)."""


ClearCacheError.__module__ = __package__  # as tracebacks say it and users catch it: colab_gpu.memory


def drop_exception(shell: Any) -> List[str]:
    """Drop every reference IPython and ``sys`` keep to the last exception; name those dropped.

    Each of them alone keeps the failed cell's frames, and so their tensors, alive, as does
    the debugger a ``%debug`` ran. The price: ``%debug`` and ``%tb`` have no last exception to
    show afterwards. The ``sys`` attributes are deleted, not set to None: that is how IPython's
    ``%debug`` and ``pdb.pm()`` know there is nothing to debug (with None they fail on it).
    """
    dropped = []
    for owner, attribute, name in exception_references(shell):
        if owner is sys:
            delattr(sys, attribute)
        else:
            setattr(owner, attribute, None)
        dropped.append(name)
    return dropped


def _forget_outputs(shell: Any, namespace: Dict[str, Any], hidden: Dict[str, Any],
                    objects: List[Any]) -> None:
    """Remove IPython's other references to ``objects``: ``_N``, ``_``/``__``/``___``, the last result."""
    ids = {id(obj) for obj in objects}
    for space in (namespace, hidden):
        for name in [n for n, v in space.items() if id(v) in ids and OUTPUT_NAME.match(n)]:
            if name.strip("_"):
                del space[name]  # _12: IPython's own name, made for that output only
            elif space is hidden or is_ipython_name(name, space[name], shell, hidden):
                space[name] = ""  # _, __, ___: IPython's empty value; once assigned, the user's
    displayhook = getattr(shell, "displayhook", None)
    for attribute in ("_", "__", "___"):
        if id(getattr(displayhook, attribute, None)) in ids:
            setattr(displayhook, attribute, "")
    result = getattr(shell, "last_execution_result", None)
    if result is not None and id(getattr(result, "result", None)) in ids:
        shell.last_execution_result = None


def holds_torch(value: Any, torch) -> bool:
    """Whether an output reaches any tensor or module (bounded walk)."""
    if torch is None:
        return False
    reach = walk_from(value, torch, set())
    return bool(reach.tensors or reach.modules)


def clear_output_history(shell: Any, everything: bool = False) -> List[int]:
    """Clear the ``Out`` entries that hold tensors or modules (all with ``everything``)."""
    namespace, hidden = namespaces(shell)
    history = output_history(shell, namespace)
    if not history:
        return []
    torch = imported_torch()
    numbers = [n for n, value in history.items() if everything or holds_torch(value, torch)]
    objects = [history.pop(n) for n in numbers]
    _forget_outputs(shell, namespace, hidden, objects)
    return numbers


def check_names(names: Iterable[str], shell: Any) -> List[str]:
    """The names to delete, or :class:`ClearCacheError` naming the first bad one; deletes nothing."""
    namespace, hidden = namespaces(shell)
    names = list(names)
    for name in names:
        if not isinstance(name, str):  # clear_cache(["model", "opt"]), clear_cache(model)
            raise TypeError(f"variable names are strings, one per argument, e.g. "
                            f"clear_cache('model', 'optimizer'); got {type(name).__name__}")
    names = list(dict.fromkeys(names))
    for name in names:
        if is_ipython_name(name, namespace.get(name, MISSING), shell, hidden):
            holds_outputs = name in ("Out", "_oh") or OUTPUT_NAME.match(name)  # not In, exit
            raise ClearCacheError(f"{name!r} is IPython's own name, not a variable of yours"
                                  + (f"; use {option('history', True)} to clear the output history"
                                     if holds_outputs else ""))
        if is_dunder(name):
            raise ClearCacheError(f"{name!r} is Python's own name, not a variable of yours")
        if not name.isidentifier():
            raise ClearCacheError(f"{name!r} is not a variable name; give the names of "
                                  f"variables to delete, separated by spaces")
        if name not in namespace:
            builtin = " (it is a Python builtin)" if hasattr(builtins, name) else ""
            # Without IPython the names are __main__'s: a script's function's locals are not there.
            why = (": only existing variables can be deleted" if shell is not None else
                   " among the script's global variables (__main__), the only ones clear_cache() "
                   "can delete; del a function's own variables inside it")
            raise ClearCacheError(f"no variable named {name!r}{builtin}{why}")
        if issubclass(type(namespace[name]), types.ModuleType):  # `%clear_cache torch`: the cache
            raise ClearCacheError(f"{name!r} is a module: deleting its name frees no memory (it "
                                  f"stays imported); {command('%clear_cache', 'colab_gpu.clear_cache()')} alone "
                                  f"empties torch's CUDA cache")
    return names


def delete_variables(shell: Any, names: Iterable[str]) -> List[str]:
    """Delete exactly these variables, and the output-history entries that are their objects."""
    namespace, hidden = namespaces(shell)
    names = check_names(names, shell)
    objects = [namespace[name] for name in names]
    for name, obj in zip(names, objects):
        del namespace[name]
        if hidden.get(name) is obj:
            del hidden[name]
    history = output_history(shell, namespace) or {}
    ids = {id(obj) for obj in objects}
    for number in [n for n, v in history.items() if id(v) in ids]:
        del history[number]
    _forget_outputs(shell, namespace, hidden, objects)
    return names


@dataclasses.dataclass(frozen=True)
class Step:
    """One step of clear_cache: what it did and the memory right after it."""

    name: str
    done: str
    after: Tuple[Reading, ...]
    error: Optional[str] = None  # why the step failed, in one line; None when it did not


@dataclasses.dataclass(frozen=True, repr=False)
class ClearReport(Shown):
    """What clear_cache did, what each step freed, and who still holds memory.

    ``print(report)`` is the report ``%clear_cache`` prints; ``report.freed("cuda:0")`` the
    bytes freed on a device over the whole run (None where unread).

    Attributes
    ----------
    before : tuple of Reading
        Each device's memory before the first step.
    steps : tuple of Step
        Each step run, in order: what it did (or its error) and the memory right after it.
    holders : Holders
        Who still holds memory after the last step.
    deleted : tuple of str
        The variables deleted.
    cuda_initialized : bool
        Whether CUDA had started, so the CUDA cache step ran.
    kept_by_arrays : tuple of (str, int)
        (variable, bytes): NumPy arrays that still hold the memory deleted tensors lay on
        (``torch.from_numpy``).
    """

    before: Tuple[Reading, ...]
    steps: Tuple[Step, ...]
    holders: Holders
    deleted: Tuple[str, ...] = ()
    cuda_initialized: bool = False
    # (variable, bytes): NumPy arrays that still hold the memory deleted tensors lay on
    # (torch.from_numpy): the cpu figure counts tensors, and that memory was not given back
    kept_by_arrays: Tuple[Tuple[str, int], ...] = ()

    @property
    def after(self) -> Tuple[Reading, ...]:
        return self.steps[-1].after if self.steps else self.before

    def freed(self, device: str, field: str = "allocated",
              before: Optional[Tuple[Reading, ...]] = None,
              after: Optional[Tuple[Reading, ...]] = None) -> Optional[int]:
        """Bytes of ``field`` freed on ``device`` between two readings (the whole run by default)."""
        start = _value(before if before is not None else self.before, device, field)
        end = _value(after if after is not None else self.after, device, field)
        if start is None or end is None:
            return None
        return start - end

    line_view = "colab_gpu.render.memory:report_line"
    text_view = "colab_gpu.render.memory:report_text"  # the report %clear_cache prints
    html_view = "colab_gpu.render.memory:report_html"


def _value(readings: Tuple[Reading, ...], device: str, field: str) -> Optional[int]:
    for reading in readings:
        if reading.device == device:
            return getattr(reading, field)
    return None


def clear_cache(*names: str, history: bool = False, shell: Any = None,
                source: Optional[DeviceSource] = None) -> ClearReport:
    """Free what can be freed without touching the user's variables; report who holds the rest.

    In order: drop the last exception's references, clear the output-history entries that hold
    tensors or modules (all of them with ``history=True``), delete the variables ``names`` (and
    nothing else), ``gc.collect()``, then, only where a GPU already has a CUDA context (not
    after a mere query such as ``torch.cuda.current_device()``), synchronize, free cuBLAS's
    workspaces, ``empty_cache()`` and ``ipc_collect()``. Memory is read after
    each step. A step that raises (a CUDA error after a device-side assert) is reported as
    failed, with its error, and the others still run.

    Parameters
    ----------
    *names : str
        Variables of the notebook (or of a script's ``__main__``) to delete first.
    history : bool, default False
        Clear every entry of the output history (``Out``), not only those that hold
        tensors or modules.
    shell : InteractiveShell, optional
        The IPython shell whose names are cleared; the running one when None.
    source : DeviceSource, optional
        Where the GPUs' memory is read; the process's NVML source when None.

    Returns
    -------
    ClearReport
        What each step freed and who still holds memory; ``print(report)`` shows the
        report ``%clear_cache`` shows.

    Raises
    ------
    TypeError
        A name that is not a string (``clear_cache(model)``).
    colab_gpu.memory.ClearCacheError
        (a ValueError) A name that is no variable of yours (unknown, IPython's or Python's
        own, a module, not an identifier); raised before anything is done.
    """
    shell = shell if shell is not None else current_shell()
    names = tuple(check_names(names, shell))  # a name given twice is deleted and reported once
    torch = imported_torch()
    snapshot = read_snapshot(source)
    readings = read_memory(torch, snapshot)
    steps: List[Step] = []

    def step(name: str, action: Callable[[], str]) -> None:
        nonlocal snapshot
        try:
            done, error = action(), None
        except Exception as failure:  # a CUDA error (a device-side assert): said, not raised
            error = _failure(failure)
            done = f"failed: {error}"
        snapshot = read_snapshot(source)  # the last one also serves the ranking below
        steps.append(Step(name, done, read_memory(torch, snapshot), error))

    step("exception", lambda: _listed("dropped ", drop_exception(shell), "no exception was kept"))
    step("output history", lambda: _history_done(clear_output_history(shell, history), history))
    deleted_storages = _cpu_storages(shell, names, torch)
    if names:
        step("variables", lambda: _listed("deleted ", delete_variables(shell, names), ""))
    step("garbage collection",
         lambda: f"gc.collect() found {count(gc.collect(), 'unreachable object')}")
    cuda = cuda_torch() is not None
    if cuda:
        step("CUDA cache", lambda: _cuda_done(empty_cuda_cache(torch)))
    holders = holders_of(shell, snapshot, readings=steps[-1].after)
    return ClearReport(before=readings, steps=tuple(steps), holders=holders, deleted=tuple(names),
                       cuda_initialized=cuda, kept_by_arrays=_kept_by_arrays(deleted_storages, holders))


def _cpu_storages(shell: Any, names: Sequence[str], torch) -> Dict[Tuple[str, int], int]:
    """The CPU storages the variables ``names`` reach, by address (no reference kept)."""
    if not names or torch is None:
        return {}
    namespace, hidden = namespaces(shell)
    reach = walk_from([namespace[name] for name in names], torch, {id(namespace), id(hidden), id(shell)})
    return {key: nbytes for key, nbytes in reach.storages.items() if key[0] == "cpu"}


def _kept_by_arrays(storages: Dict[Tuple[str, int], int], holders: Holders) -> Tuple[Tuple[str, int], ...]:
    """Per variable, the bytes of ``storages`` that lie in the NumPy arrays it reaches."""
    lying = lying_on_arrays(storages, {key: n for key, (_, n) in holders.numpy_arrays.items()})
    per_array: Dict[Tuple[str, int], int] = {}
    for storage, array in lying.items():  # views' storages may overlap: no more than the array
        per_array[array] = min(per_array.get(array, 0) + storages[storage], holders.numpy_arrays[array][1])
    kept: Dict[str, int] = {}
    for array, nbytes in per_array.items():
        name = holders.numpy_arrays[array][0]
        kept[name] = kept.get(name, 0) + nbytes
    return tuple(sorted(kept.items(), key=lambda item: -item[1]))


def _failure(error: BaseException) -> str:
    """A step's error in one line; one that breaks the device (a device-side assert, an
    illegal memory access) says that only a restart mends it."""
    if classify(error) is ErrorKind.DEVICE_BROKEN:
        return (f"{describe(error)} (the CUDA context is broken: nothing on the GPU can be "
                f"freed until the runtime restarts)")
    return describe(error)


def _cuda_done(synchronized: List[str]) -> str:
    if not synchronized:
        return "no GPU has a CUDA context yet: nothing is cached"
    return f"{_listed('synchronized ', synchronized, '')}; cuBLAS workspaces, empty_cache(), ipc_collect()"


def _listed(prefix: str, items: List[str], empty: str) -> str:
    return prefix + ", ".join(items) if items else empty


def _history_done(numbers: List[int], everything: bool) -> str:
    if everything:
        return f"cleared the whole output history ({count(len(numbers), 'output')})"
    if not numbers:
        return "no output holds a tensor or a module"
    return "cleared " + ", ".join(f"Out[{n}]" for n in numbers)
