"""The ranking: the user's variables by the tensor bytes they reach (what ``del name`` would
about free), then what no variable holds: each output and the last error, the rest of the
memory reading no reference reaches, and the GPU memory held outside torch. Apart from the
walk, which it runs once per root, and from the clearing, which ends with a ranking.
"""
from __future__ import annotations

import bdb
import bisect
import collections
import dataclasses
import os
from typing import AbstractSet, Any, Dict, Iterable, Mapping, Optional, Set, Tuple

from ..devices import DeviceSource
from ..render.shown import Shown
from ..torch_view import MemoryBreakdown, breakdown
from ..runtime import current_shell
from .namespace import (OUTPUT_NAME, exception_references, is_ipython_name, namespaces,
                        output_history, user_variables)
from .readings import Reading, gpu_view, read_memory, read_snapshot
from .rounding import unreached_bytes
from .walk import MAX_OBJECTS, imported_torch, walk_from

__all__ = ["Elsewhere", "Holder", "Holders", "holders_of", "lying_on_arrays", "memory_holders", "other_roots",
           "rank_holders"]


@dataclasses.dataclass(frozen=True)
class Holder:
    """A user variable and the tensor memory it keeps alive."""

    name: str
    type_name: str
    nbytes: int  # distinct storage bytes it reaches
    unique: int  # of which no other variable reaches: about what ``del name`` would free
    by_device: Tuple[Tuple[str, int], ...]  # ("cpu", bytes), ("cuda:0", bytes)
    tensors: int
    truncated: bool = False  # the walk stopped after MAX_OBJECTS objects: a lower bound
    arrays: int = 0  # NumPy arrays it reaches whose memory a tensor lies on (torch.from_numpy)


@dataclasses.dataclass(frozen=True)
class Elsewhere:
    """IPython's reference that keeps tensor memory alive no variable of the user's reaches:
    an output (``Out[3]``, ``_``) or the last error (its traceback's frames, a ``%debug``)."""

    name: str
    nbytes: int  # distinct storage bytes it reaches and no variable, nor an output before it, does
    by_device: Tuple[Tuple[str, int], ...]
    tensors: int  # the tensors it reaches whose storage no variable reaches
    truncated: bool = False
    shared: int = 0  # the tensors it reaches whose storage a variable reaches too


@dataclasses.dataclass(frozen=True, repr=False)
class Holders(Shown):
    """Who holds memory: variables ranked by the tensor bytes they reach, and what is outside torch.

    ``print(holders)`` shows the ranking as ``%clear_cache --vars`` does.

    Attributes
    ----------
    holders : tuple of Holder
        Your variables, largest first: the bytes each reaches, those no other variable
        reaches (about what ``del`` would free), per device.
    total_by_device : tuple of (str, int)
        (device, bytes) the variables reach together, each storage counted once.
    not_yours : tuple of (str, int)
        (device, bytes) of tensor memory no variable holds: ``elsewhere`` and ``unreached``.
    elsewhere : tuple of Elsewhere
        Of that, what IPython keeps: an output (``Out[3]``, ``_``) or the last error.
    unreached : tuple of (str, int)
        (device, bytes) of the memory reading no variable, output or error reaches (a
        library's cache, a thread, a reference cycle): a lower bound.
    outside_torch : tuple of MemoryBreakdown
        Per GPU: other processes, the CUDA context and non-torch libraries.
    torch_labels : dict of int to str
        NVML index -> ``"cuda:N"``.
    torch_imported : bool
        False: torch is not imported, so nothing is ranked.
    problem : str or None
        Why the GPUs could not be read.
    numpy_arrays : dict
        ("cpu", address) -> (variable, bytes): NumPy arrays the variables reach whose memory
        a tensor lies on.
    """

    holders: Tuple[Holder, ...] = ()
    total_by_device: Tuple[Tuple[str, int], ...] = ()  # every storage counted once
    # Tensor memory no variable holds, per device: all of it, each storage once; what the
    # outputs and the last error hold of it; the rest, which none of them reaches.
    not_yours: Tuple[Tuple[str, int], ...] = ()
    elsewhere: Tuple[Elsewhere, ...] = ()
    unreached: Tuple[Tuple[str, int], ...] = ()
    outside_torch: Tuple[MemoryBreakdown, ...] = ()  # per GPU: other processes, context, others
    torch_labels: Dict[int, str] = dataclasses.field(default_factory=dict)  # NVML index -> "cuda:N"
    torch_imported: bool = True
    problem: Optional[str] = None  # why the GPUs could not be read
    # NumPy arrays' memory the variables reach, ("cpu", address) -> (variable, bytes): what a
    # deleted torch.from_numpy tensor lay on stays with the array
    numpy_arrays: Dict[Tuple[str, int], Tuple[str, int]] = dataclasses.field(default_factory=dict)

    line_view = "colab_gpu.render.memory:holders_line"
    text_view = "colab_gpu.render.memory:holders_text"
    html_view = "colab_gpu.render.memory:holders_html"


def _by_device(storages: Mapping[Tuple[str, int], int]) -> Tuple[Tuple[str, int], ...]:
    totals: Dict[str, int] = {}
    for (device, _), nbytes in storages.items():
        totals[device] = totals.get(device, 0) + nbytes
    return tuple(sorted(totals.items()))


def rank_holders(variables: Iterable[Tuple[str, Any]], torch, skip: AbstractSet[int] = frozenset(),
                 max_objects: int = MAX_OBJECTS) -> Tuple[Tuple[Holder, ...], Tuple[Tuple[str, int], ...]]:
    """Rank ``(name, value)`` pairs by the tensor bytes each reaches; also the union per device."""
    holders, union, _ = _rank(variables, torch, skip, max_objects)
    return holders, _by_device(union)


def _rank(variables: Iterable[Tuple[str, Any]], torch, skip: AbstractSet[int],
          max_objects: int) -> Tuple[Tuple[Holder, ...], Dict[Tuple[str, int], int],
                                     Dict[Tuple[str, int], Tuple[str, int]]]:
    """rank_holders() with the union of the storages reached, by (device, address), and the
    NumPy arrays' memory the variables reach: (the first variable reaching it, bytes)."""
    reaches = [(name, value, walk_from(value, torch, skip, max_objects)) for name, value in variables]
    tensor_storages = {key: n for _, _, reach in reaches for key, n in reach.storages.items()}
    arrays: Dict[Tuple[str, int], Tuple[str, int]] = {}  # by the first variable reaching each
    for name, _, reach in reaches:
        for key, nbytes in reach.arrays.items():
            arrays.setdefault(key, (name, nbytes))
    on_array = lying_on_arrays(tensor_storages, {key: n for key, (_, n) in arrays.items()})
    by_array: Dict[Tuple[str, int], list] = {}
    for storage, array in on_array.items():
        by_array.setdefault(array, []).append(storage)
    lent = {}  # `arr` holds what torch.from_numpy(arr) (or of a view of arr) lies on, as that tensor does
    for name, _, reach in reaches:
        lent[name] = {key: tensor_storages[key] for array in reach.arrays for key in by_array.get(array, ())}
        reach.storages.update(lent[name])
    owners: Dict[Tuple[str, int], int] = {}
    union: Dict[Tuple[str, int], int] = {}
    for _, _, reach in reaches:
        for key, nbytes in reach.storages.items():
            owners[key] = owners.get(key, 0) + 1
            union[key] = nbytes
    holders = [
        Holder(name=name, type_name=type(value).__qualname__,
               nbytes=sum(reach.storages.values()),
               unique=sum(n for key, n in reach.storages.items() if owners[key] == 1),
               by_device=_by_device(reach.storages), tensors=reach.tensors,
               truncated=reach.truncated, arrays=len({on_array[key] for key in lent[name]}))
        for name, value, reach in reaches if reach.storages or reach.tensors
    ]
    holders.sort(key=lambda holder: (-holder.nbytes, holder.name))
    return tuple(holders), union, arrays


def lying_on_arrays(storages: Mapping[Tuple[str, int], int],
                    arrays: Mapping[Tuple[str, int], int]) -> Dict[Tuple[str, int], Tuple[str, int]]:
    """The CPU storages that lie inside a NumPy array's memory (``torch.from_numpy`` of it or of
    a view into it), each with that array's key. Arrays owning memory never overlap."""
    spans = sorted((address, address + nbytes) for (_, address), nbytes in arrays.items())
    starts = [start for start, _ in spans]
    found = {}
    for (device, address), nbytes in storages.items():
        index = bisect.bisect_right(starts, address) - 1
        if device == "cpu" and index >= 0 and address + nbytes <= spans[index][1]:
            found[device, address] = ("cpu", spans[index][0])
    return found


def other_roots(shell: Any, namespace: Mapping[str, Any],
                 hidden: Mapping[str, Any]) -> Iterable[Tuple[str, Any]]:
    """What IPython keeps that is no variable of the user's: each output (``Out[3]``; ``_``,
    ``__``, ``_N`` only where the history has no such entry) and the last error, as one root."""
    seen: Set[int] = set()
    for number, value in list((output_history(shell, namespace) or {}).items()):
        seen.add(id(value))
        yield f"Out[{number}]", value
    for name, value in list(namespace.items()):
        if (id(value) not in seen and OUTPUT_NAME.match(name)
                and is_ipython_name(name, value, shell, hidden)):
            seen.add(id(value))
            yield name, value
    error = []
    for owner, attribute, _ in exception_references(shell):
        value = getattr(owner, attribute, None)
        if isinstance(value, bdb.Bdb):  # a %debug: the locals of the frames it showed
            frames = [frame for frame, _ in getattr(value, "stack", ())]
            value = [vars(value).get("curframe_locals")] + [
                frame.f_locals for frame in frames if frame.f_locals is not frame.f_globals]
        error.append(value)
    yield "the last error", error


def _elsewhere(shell: Any, torch, skip: AbstractSet[int], union: Dict[Tuple[str, int], int],
               max_objects: int) -> Tuple[Tuple[Elsewhere, ...], Dict[Tuple[str, int], int]]:
    """The outputs and the last error, by the storages they reach that no variable (the
    ones ``union`` lacks) nor one before them does, and those storages; ``union`` gains them.
    One walk per root."""
    not_yours: Dict[Tuple[str, int], int] = {}
    found = []
    for name, root in other_roots(shell, *namespaces(shell)):
        reach = walk_from(root, torch, skip, max_objects, known=union)
        del root
        # each storage in one row only: the rows add up to what no variable holds
        own = {key: n for key, n in reach.storages.items() if key not in union and key not in not_yours}
        not_yours.update(own)
        if own:
            found.append(Elsewhere(name, sum(own.values()), _by_device(own), reach.tensors - reach.shared,
                                   reach.truncated, reach.shared))
    union.update(not_yours)
    found.sort(key=lambda place: -place.nbytes)
    return tuple(found), not_yours


def _outside_torch(snapshot, torch) -> Dict[str, Any]:
    """Holders' fields for the GPUs this process can use: per GPU, other processes and this
    process's non-torch memory (context, other libraries), and the cuda:N torch calls it."""
    gpus, index_of, memory = gpu_view(snapshot, torch)
    labels = {nvml: f"cuda:{index}" for nvml, index in index_of.items()}
    by_nvml = {m.nvml_index: m for m in memory if m.nvml_index is not None}
    if memory and not by_nvml:
        return {}  # torch's memory cannot be told apart from the rest on any GPU
    parts = (breakdown(gpu, by_nvml.get(gpu.index), os.getpid()) for gpu in gpus)
    return dict(outside_torch=tuple(part for part in parts if part is not None), torch_labels=labels)


def memory_holders(shell: Any = None, source: Optional[DeviceSource] = None,
                   max_objects: int = MAX_OBJECTS) -> Holders:
    """What is eating my memory? The user's variables ranked by the tensor bytes they reach.

    Counts tensors, modules' parameters, buffers and gradients, optimizers' state, any
    container of these, functions' closures and defaults, partials' arguments, paused
    generators' local variables and what a tensor's autograd graph saved for backward();
    storage shared by views or by several variables is counted once per variable and once in
    the total. Then what no variable holds: what each output and the last error (its
    traceback, a ``%debug``) keep, and the rest of the memory reading, which none of these
    reaches. Also reads, through NVML, the GPU memory held outside torch. Never initializes
    CUDA and never keeps a reference to a tensor.

    Parameters
    ----------
    shell : InteractiveShell, optional
        The IPython shell whose variables are ranked; the running one when None (a script's
        ``__main__`` without IPython).
    source : DeviceSource, optional
        Where the GPUs' memory is read; the process's NVML source when None.
    max_objects : int, default 1000000
        Objects visited per variable at most, so a huge container stays fast; a variable
        whose walk was cut short is marked, its bytes a lower bound.

    Returns
    -------
    Holders
        The ranking, what no variable holds and the memory outside torch (only the last
        where torch is not imported: ``torch_imported`` is False).
    """
    return holders_of(shell if shell is not None else current_shell(), read_snapshot(source), max_objects)


def holders_of(shell: Any, snapshot, max_objects: int = MAX_OBJECTS,
               readings: Optional[Tuple[Reading, ...]] = None) -> Holders:
    """memory_holders() with the GPUs already read (``snapshot``, None when unreadable) and,
    where given, the memory (``readings``, taken after the snapshot)."""
    torch = imported_torch()
    problem = snapshot.problem if snapshot is not None else None
    if torch is None:
        return Holders(torch_imported=False, problem=problem, **_outside_torch(snapshot, None))
    namespace, hidden = namespaces(shell)
    skip = {id(namespace), id(hidden), id(shell)}
    holders, union, arrays = _rank(user_variables(shell), torch, skip, max_objects)
    total = _by_device(union)
    elsewhere, held_elsewhere = _elsewhere(shell, torch, skip, union, max_objects)
    unreached = unreached_bytes(read_memory(torch, snapshot) if readings is None else readings, union, torch)
    not_yours = collections.Counter(dict(_by_device(held_elsewhere)))
    not_yours.update(dict(unreached))
    return Holders(holders=holders, total_by_device=total, not_yours=tuple(sorted(not_yours.items())),
                   elsewhere=elsewhere, unreached=unreached, problem=problem, numpy_arrays=arrays,
                   **_outside_torch(snapshot, torch))
