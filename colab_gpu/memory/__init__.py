"""``clear_cache()``: give memory back; ``memory_holders()``: say who still holds it.

``torch.cuda.empty_cache()`` frees nothing that is still referenced, and a notebook keeps
many references the user never wrote: the last failed cell's traceback (every frame and its
tensors), the output history (``Out``, ``_``, ``__``, ``___``, ``_N``) and the shell's last
execution result. :func:`clear_cache` drops those, deletes only the variables it is given by
name, collects garbage and, only if the user's code already initialized CUDA, empties torch's
cache. Each step is measured, so the report says what each one freed.

IPython is never imported here: its objects come in as ``shell`` and are used by duck typing,
so this works in IPython 7.34 (Colab) as in the newest, and in plain Python with no shell.
No tensor is ever referenced by a result: the ranking keeps storage addresses, not tensors.
"""
from __future__ import annotations

import bdb
import builtins
import collections
import contextlib
import dataclasses
import functools
import gc
import itertools
import os
import re
import sys
import types
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Set, Tuple

from ..allocator.schema import ROUNDUP_INTERVALS
from ..devices import DeviceSource, Snapshot
from ..gpu_status import MemoryBreakdown, breakdown, torch_memory, torch_view
from ..options import command, option
from ..render import count
from ..runtime import cuda_torch, current_shell, detect_runtime

# IPython's own names in the user namespace: the output and input history and its helpers.
_OUTPUT_NAME = re.compile(r"_(\d+|_{0,2})\Z")  # _, __, ___, _12
_INPUT_NAME = re.compile(r"_i(\d+|i{0,2})\Z")  # _i, _ii, _iii, _i12
_IPYTHON_NAMES = frozenset({"In", "Out", "_oh", "_ih", "_dh", "get_ipython", "exit", "quit",
                            "_exit_code"})
# Types that hold no tensor and are not worth a visit.
_LEAVES = (type(None), bool, int, float, complex, str, bytes, bytearray, range, slice)
# Types never walked into: they lead to the whole interpreter (modules, classes' namespaces).
# A function is walked into its closure and defaults only, never its globals; a generator
# into its paused frame's local variables only.
_OPAQUE = (types.ModuleType, type, types.BuiltinFunctionType, types.CodeType, types.FrameType)
# A generator, a coroutine, an async generator -> its paused frame (None once it has finished).
_SUSPENDED = {types.GeneratorType: "gi_frame", types.CoroutineType: "cr_frame",
              types.AsyncGeneratorType: "ag_frame"}

MAX_OBJECTS = 1_000_000  # objects visited per variable: a bound so a huge container stays fast


class ClearCacheError(ValueError):
    """A request that cannot be carried out (an unknown name, IPython's own name)."""


# ----------------------------------------------------------------------------- the walk


@dataclasses.dataclass
class _Reach:
    """What one walk found: storages by (device, address), and what it stopped at."""

    storages: Dict[Tuple[str, int], int] = dataclasses.field(default_factory=dict)
    tensors: int = 0
    modules: int = 0
    truncated: bool = False
    device_names: Dict[Any, str] = dataclasses.field(default_factory=dict)  # torch.device -> "cuda:0"
    known: Mapping[Tuple[str, int], int] = dataclasses.field(default_factory=dict)  # storages held elsewhere
    shared: int = 0  # tensors whose storage is in ``known``: of ``tensors``, those not this root's alone


def _record_tensor(tensor, reach: _Reach, stack: List[Any], torch, part: bool = False) -> None:
    """``part``: a sparse tensor's indices or values, its memory but not a tensor of the user's."""
    if not part:
        reach.tensors += 1
    if tensor.layout != torch.strided:  # sparse: the memory is in the component tensors
        shared = reach.shared
        for name in ("_indices", "_values", "crow_indices", "col_indices",
                     "ccol_indices", "row_indices", "values"):
            try:
                _record_tensor(getattr(tensor, name)(), reach, stack, torch, part=True)
            except Exception:
                pass
        reach.shared = shared + (reach.shared > shared)  # shared or not, still one tensor
        return
    try:
        storage = tensor.untyped_storage()
        address, nbytes = storage.data_ptr(), storage.nbytes()
        device = tensor.device
    except Exception:  # nested, quantized or exotic tensors: nothing countable
        return
    if address and nbytes and device.type != "meta":
        name = reach.device_names.get(device)
        if name is None:
            name = reach.device_names[device] = str(device)
        key = (name, address)
        reach.storages[key] = nbytes
        if key in reach.known:
            reach.shared += 1
    if tensor.is_leaf or tensor.retains_grad:  # .grad of any other tensor only warns
        grad = tensor.grad
        if grad is not None:
            stack.append(grad)
    attributes = tensor.__dict__  # a subclass's or the user's own attributes
    if attributes:
        stack.extend(attributes.values())
    grad_fn = tensor.grad_fn  # `loss` keeps every activation its graph saved for backward()
    if grad_fn is not None:
        stack.append(grad_fn)


_CONTAINERS = (list, tuple, set, frozenset, collections.deque)
_LRU_CACHE = getattr(functools, "_lru_cache_wrapper", None)  # C's: its cache is no attribute


def _children(obj: Any, kind: type) -> Iterable[Any]:
    """What a non-tensor object refers to, as far as memory is concerned.

    Containers are read through the built-in type's own methods: a subclass's ``__iter__``,
    ``keys`` or ``values`` is the user's code, which may raise, load data or lie.
    """
    if issubclass(kind, dict):
        yield from dict.keys(obj)
        yield from dict.values(obj)
        return
    if issubclass(kind, _CONTAINERS):
        base = next(container for container in _CONTAINERS if issubclass(kind, container))
        yield from base.__iter__(obj)
        return
    if issubclass(kind, types.MethodType):
        yield obj.__self__
        return
    if issubclass(kind, types.FunctionType):  # `lambda y: y * weights` keeps weights alive
        for cell in obj.__closure__ or ():
            try:
                yield cell.cell_contents
            except ValueError:  # a cell not yet filled
                pass
        yield from obj.__defaults__ or ()
        yield from (obj.__kwdefaults__ or {}).values()
        return
    if issubclass(kind, functools.partial):  # partial(train_step, model=model) keeps model alive
        yield functools.partial.func.__get__(obj)
        yield from functools.partial.args.__get__(obj)
        yield from functools.partial.keywords.__get__(obj).values()
    if kind in _SUSPENDED:  # `data = torch.load(...)` then `yield data[i]`: data lives in the frame
        # Its local variables as the garbage collector sees them, not through the frame's
        # f_locals: Python 3.11 and 3.12 keep that dict on the frame, and with it a local the
        # generator deletes later (`del data`) until it ends. Free variables come as cells.
        if getattr(obj, _SUSPENDED[kind]) is not None:
            for referent in gc.get_referents(obj):
                if isinstance(referent, types.CellType):
                    try:
                        yield referent.cell_contents
                    except ValueError:  # a cell not yet filled
                        pass
                elif not isinstance(referent, (types.FrameType, types.CodeType, str)):
                    yield referent
        return
    if issubclass(kind, BaseException):
        yield obj.__traceback__
        yield obj.__cause__
        yield obj.__context__
    if issubclass(kind, types.TracebackType):
        # The frame that caught the exception keeps its callers' frames alive once they have
        # returned, locals and all (`errors.append(e)` in a step keeps the train() that called
        # it). Followed while they run in the same module, as a notebook's functions do, never
        # into IPython's own; a frame still running is alive anyway, and so are its callers.
        caller, running = obj.tb_frame.f_back, _running_frames()
        while (caller is not None and id(caller) not in running
               and caller.f_globals is obj.tb_frame.f_globals and caller.f_locals is not caller.f_globals):
            yield from caller.f_locals.values()
            caller = caller.f_back
        while obj is not None:
            frame = obj.tb_frame
            if frame.f_locals is not frame.f_globals:  # a module frame's locals are a namespace
                yield from frame.f_locals.values()
            obj = obj.tb_next
        return
    try:
        attributes = object.__getattribute__(obj, "__dict__")
    except Exception:
        attributes = None
    shown = isinstance(attributes, dict)  # a Python object's references are its attributes
    if shown:
        yield from attributes.values()
    for cls in kind.__mro__:
        slots = cls.__dict__.get("__slots__", ())
        for slot in (slots,) if isinstance(slots, str) else slots:
            if slot not in ("__dict__", "__weakref__"):
                shown = True
                try:
                    yield object.__getattribute__(obj, slot)
                except Exception:
                    pass
    if not shown or kind is _LRU_CACHE:
        # A built-in object keeps what no attribute shows (an iterator its list, zip its
        # iterators, an lru_cache its results): what the garbage collector sees, no user code run.
        yield from gc.get_referents(obj)


def _running_frames() -> Set[int]:
    """The ids of the frames some thread is running, and of their callers."""
    running = set()
    for frame in sys._current_frames().values():
        while frame is not None:
            running.add(id(frame))
            frame = frame.f_back
    return running


def _node_children(node: Any, saved: Tuple[str, ...]) -> Iterable[Any]:
    """What an autograd graph node keeps alive: the nodes before it, the tensors it saved for
    backward(), a leaf's AccumulateGrad its leaf, and a custom Function's ``ctx.anything``.

    Saved tensors are read raw (``_raw_saved_self``): ``_saved_self`` would run a
    saved_tensors_hooks unpack hook, which may copy to the GPU or recompute a checkpointed
    forward. A torch whose raw reads cannot tell a hook is there gets none of them read.
    """
    for next_node, _ in node.next_functions:
        yield next_node
    for name in saved:
        try:  # a custom Function's saved tensors raise once backward() has freed them
            value = getattr(node, name, None)
        except Exception:  # its ctx attributes, below, are still alive
            continue
        for raw in value if isinstance(value, (list, tuple)) else (value,):
            if name == "variable":
                yield raw
            elif hasattr(raw, "unpack_hook"):
                yield raw.data  # what was packed (a hook's own object), None once backward() ran
    attributes = getattr(node, "__dict__", None)
    if isinstance(attributes, dict):
        yield from attributes.values()


_SKIP, _TENSOR, _MODULE, _OTHER, _NODE = range(5)


def _classify(kind: type, torch) -> int:
    if issubclass(kind, _LEAVES) or issubclass(kind, _OPAQUE):
        return _SKIP
    if issubclass(kind, torch.Tensor):
        return _TENSOR
    if hasattr(kind, "next_functions"):  # an autograd graph node (SumBackward0, a Function's ctx)
        return _NODE
    return _MODULE if issubclass(kind, torch.nn.Module) else _OTHER


def _saved_attributes(kind: type) -> Tuple[str, ...]:
    """A node type's attributes that hold what it saved (``_raw_saved_self``,
    ``_raw_saved_result``, a custom Function's ``_raw_saved_tensors``), and AccumulateGrad's
    ``variable``."""
    return tuple(name for name in dir(kind) if name.startswith("_raw_saved_") or name == "variable")


def _walk(root: Any, torch, skip: Set[int], max_objects: int = MAX_OBJECTS,
          known: Optional[Mapping[Tuple[str, int], int]] = None) -> _Reach:
    """Every tensor storage ``root`` reaches, each counted once, cycles and all; its tensors
    whose storage is one of ``known`` are counted as shared."""
    reach = _Reach(known=known or {})
    kinds: Dict[type, int] = {}  # each type classified once: Tensor's metaclass makes issubclass slow
    saved: Dict[type, Tuple[str, ...]] = {}
    seen: Set[int] = set(skip)
    # A graph node and a saved tensor are new Python objects at each read: kept until the walk
    # ends, so that another one cannot take a freed one's id and be skipped as already seen.
    made: List[Any] = []
    stack = [root]
    for visit in range(max_objects):  # every object counts, ints and strings too
        if not stack:
            break
        obj = stack.pop()
        kind = type(obj)  # never obj.__class__: proxies and deprecated objects lie or warn
        verdict = kinds.get(kind)
        if verdict is None:
            verdict = kinds[kind] = _classify(kind, torch)
        if verdict == _SKIP:
            continue
        key = id(obj)
        if key in seen:
            continue
        seen.add(key)
        if verdict == _MODULE:
            reach.modules += 1
        try:
            if verdict == _TENSOR:
                made.append(obj)
                _record_tensor(obj, reach, stack, torch)
            elif verdict == _NODE:
                made.append(obj)
                names = saved.get(kind)
                if names is None:
                    names = saved[kind] = _saved_attributes(kind)
                stack.extend(itertools.islice(_node_children(obj, names), max_objects - visit))
            else:
                # no more than can still be visited (one more: a leftover marks the walk truncated)
                stack.extend(itertools.islice(_children(obj, kind), max_objects - visit))
        except Exception:  # user code ran (a tensor subclass, a dict resized by a thread): skip it
            continue
    reach.truncated = bool(stack)
    return reach


def _torch():
    """The user's torch, only if already imported (never imported here)."""
    return sys.modules.get("torch")


# ----------------------------------------------------------------------------- the ranking


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


class _Shown:
    """One line (``summary()``, ``repr``), the text report and the HTML card, from
    colab_gpu.render.memory's ``holders_*`` or ``report_*`` (as ``_renderers`` says)."""

    _renderers = ""

    def _render(self, form: str) -> str:
        from ..render import memory

        return {("holders", "line"): memory.holders_line, ("holders", "text"): memory.holders_text,
                ("holders", "html"): memory.holders_html, ("report", "line"): memory.report_line,
                ("report", "text"): memory.report_text, ("report", "html"): memory.report_html,
                }[self._renderers, form](self)

    def summary(self) -> str:
        """One line: what was freed (a report), who holds the most."""
        return self._render("line")

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.summary()}>"

    def __str__(self) -> str:
        """The report the magic prints, so ``print(...)`` shows it in a script."""
        return self._render("text")

    def _repr_pretty_(self, printer, cycle) -> None:
        printer.text(str(self))

    def _repr_html_(self) -> str:
        return self._render("html")


@dataclasses.dataclass(frozen=True, repr=False)
class Holders(_Shown):
    """Who holds memory: variables ranked by the tensor bytes they reach, and what is outside torch."""

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

    _renderers = "holders"


_MISSING = object()


def _is_dunder(name: str) -> bool:
    """``__name__``, ``__builtins__``: Python's names for the namespace, never the user's."""
    return len(name) > 4 and name[:2] == name[-2:] == "__"  # not IPython's __ or ___


def _is_ipython_name(name: str, value: Any, shell: Any, hidden: Mapping[str, Any]) -> bool:
    """Whether ``name`` is IPython's: its history and helpers, and ``_``, ``__``, ``___`` while
    they hold its last outputs. Once the user assigns one (``_, index = scores.max(1)``) it is
    theirs, as IPython sees it too: its displayhook stops updating them."""
    if name in ("_", "__", "___"):
        displayhook = getattr(shell, "displayhook", None)
        return value is getattr(displayhook, name, _MISSING) or value is hidden.get(name, _MISSING)
    return name in _IPYTHON_NAMES or bool(_OUTPUT_NAME.match(name) or _INPUT_NAME.match(name))


def _user_variables(shell: Any) -> List[Tuple[str, Any]]:
    """The user's own variables: not IPython's names, modules or classes."""
    namespace, hidden = _namespaces(shell)
    result = []
    for name, value in list(namespace.items()):
        if (_is_dunder(name) or _is_ipython_name(name, value, shell, hidden)
                or hidden.get(name, _MISSING) is value or issubclass(type(value), _OPAQUE)):
            continue
        result.append((name, value))
    return result


def _by_device(storages: Mapping[Tuple[str, int], int]) -> Tuple[Tuple[str, int], ...]:
    totals: Dict[str, int] = {}
    for (device, _), nbytes in storages.items():
        totals[device] = totals.get(device, 0) + nbytes
    return tuple(sorted(totals.items()))


def rank_holders(variables: Iterable[Tuple[str, Any]], torch, skip: Set[int] = frozenset(),
                 max_objects: int = MAX_OBJECTS) -> Tuple[Tuple[Holder, ...], Tuple[Tuple[str, int], ...]]:
    """Rank ``(name, value)`` pairs by the tensor bytes each reaches; also the union per device."""
    holders, union = _rank(variables, torch, skip, max_objects)
    return holders, _by_device(union)


def _rank(variables: Iterable[Tuple[str, Any]], torch, skip: Set[int],
          max_objects: int) -> Tuple[Tuple[Holder, ...], Dict[Tuple[str, int], int]]:
    """rank_holders() with the union of the storages reached, by (device, address)."""
    reaches = [(name, value, _walk(value, torch, skip, max_objects)) for name, value in variables]
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
               truncated=reach.truncated)
        for name, value, reach in reaches if reach.storages or reach.tensors
    ]
    holders.sort(key=lambda holder: (-holder.nbytes, holder.name))
    return tuple(holders), union


def _other_roots(shell: Any, namespace: Mapping[str, Any],
                 hidden: Mapping[str, Any]) -> Iterable[Tuple[str, Any]]:
    """What IPython keeps that is no variable of the user's: each output (``Out[3]``; ``_``,
    ``__``, ``_N`` only where the history has no such entry) and the last error, as one root."""
    seen: Set[int] = set()
    for number, value in list((_output_history(shell, namespace) or {}).items()):
        seen.add(id(value))
        yield f"Out[{number}]", value
    for name, value in list(namespace.items()):
        if (id(value) not in seen and _OUTPUT_NAME.match(name)
                and _is_ipython_name(name, value, shell, hidden)):
            seen.add(id(value))
            yield name, value
    error = []
    for owner, attribute, _ in _exception_references(shell):
        value = getattr(owner, attribute, None)
        if isinstance(value, bdb.Bdb):  # a %debug: the locals of the frames it showed
            frames = [frame for frame, _ in getattr(value, "stack", ())]
            value = [vars(value).get("curframe_locals")] + [
                frame.f_locals for frame in frames if frame.f_locals is not frame.f_globals]
        error.append(value)
    yield "the last error", error


def _elsewhere(shell: Any, torch, skip: Set[int], union: Dict[Tuple[str, int], int],
               max_objects: int) -> Tuple[Tuple[Elsewhere, ...], Dict[Tuple[str, int], int]]:
    """The outputs and the last error, by the storages they reach that no variable (the
    ones ``union`` lacks) nor one before them does, and those storages; ``union`` gains them.
    One walk per root."""
    not_yours: Dict[Tuple[str, int], int] = {}
    found = []
    for name, root in _other_roots(shell, *_namespaces(shell)):
        reach = _walk(root, torch, skip, max_objects, known=union)
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


UNSPLIT_REMAINDER = 1024 ** 2  # CUDA's caching allocator splits a large block only for more left over
LARGE_BUFFER = 20 * 1024 ** 2  # kLargeBuffer: how much larger an unsplit oversize block may be
# The lowest max_split_size_mb any torch takes: 21 before 2.10, 20 in 2.10, and from 2.11
# large_segment_size_mb, which must be over 10 (see allocator/schema.py).
LOWEST_SPLIT_LIMIT = 11 * 1024 ** 2


def _split_limit(torch, device: str) -> Optional[int]:
    """The size from which CUDA's caching allocator never splits a block (``max_split_size_mb``),
    or None where it splits every size. torch's statistics give the limit it started with; an
    oversize allocation under no such limit means a later setting made one, which may be as
    low as LOWEST_SPLIT_LIMIT: any block that large may be oversize."""
    try:
        stats = torch.cuda.memory_stats(device)
    except Exception:
        return None
    limit = stats.get("max_split_size", -1)  # -1 (SIZE_MAX) when unset
    if 0 < limit < 2 ** 62:
        return limit
    return LOWEST_SPLIT_LIMIT if stats.get("oversize_allocations.current", 0) > 0 else None


def _allocator_settings(torch) -> Tuple[Optional[Dict[str, str]], Dict[str, str]]:
    """What CUDA's allocator runs with: torch's own report of its last settings string where it
    has one (2.10+, else None; asked only once CUDA runs, so asking changes nothing), and the
    environment, which %alloc_conf keeps in step: the variable torch reads (a ROCm build's
    PYTORCH_HIP_ALLOC_CONF too). What cannot be read is empty."""
    from ..allocator.apply import current_settings, installed_env_names, runtime_setter
    from ..allocator.parse import parse

    reported = None
    setter = runtime_setter({"torch": torch})
    if setter is not None and setter.get is not None:
        try:
            text = setter.get()
            reported = dict(parse(text)) if text else {}
        except Exception:  # a string torch took and the parser here does not read
            reported = {}
    try:
        environment = dict(current_settings(os.environ, installed_env_names({"torch": torch}))[1])
    except Exception:
        environment = {}
    return reported, environment


def _rounding(torch) -> Tuple[List[int], int]:
    """The divisions per interval (see allocator.roundup_table) and the most an unsplit oversize
    block may exceed its request (``max_non_split_rounding_mb``, 20 MiB by default; from
    2.11 by default ``large_segment_size_mb``'s, which the allocator schema knows).

    Each settings string resets roundup_power2_divisions, so torch's last one tells it all.
    max_non_split_rounding_mb keeps its value from an earlier string up to 2.10; from 2.11
    each string puts it back to large_segment_size_mb's value, which does keep its own. So
    the larger of what torch's last string and the environment say is taken: the rest stays
    a lower bound."""
    from ..allocator import AllocConfError, installed_torch_version, roundup_table, version_of
    from ..allocator.schema import BY_NAME

    reported, environment = _allocator_settings(torch)
    try:
        divisions = roundup_table((reported if reported is not None else environment)
                                  .get("roundup_power2_divisions"),
                                  version_of(installed_torch_version({"torch": torch})))
    except AllocConfError:  # unreadable: no rounding
        divisions = [0] * ROUNDUP_INTERVALS
    rounding, key = LARGE_BUFFER, BY_NAME["max_non_split_rounding_mb"]
    for settings in (reported or {}, environment):
        try:
            rounding = max(rounding, int(settings.get(key.name, key.default_in(settings))) * 1024 ** 2)
        except ValueError:
            pass
    return divisions, rounding


def _rounded(nbytes: int, divisions: List[int]) -> int:
    """The size CUDA's allocator makes of a request (CUDACachingAllocator.cpp: round_size):
    512 B steps, or with N divisions for its size a step of 1/N of the power of two below it
    (1.1 GiB -> 1.25 GiB with 4)."""
    log = nbytes.bit_length() - 1
    split = divisions[min(max(log - 20, 0), ROUNDUP_INTERVALS - 1)]
    step = 512
    if split > 1 and nbytes > 512 * split:
        step = max((1 << log) >> (split.bit_length() - 1), 1)  # a power of two stays as it is
    return max(-(-nbytes // step) * step, 512)


def _unreached(readings: Iterable[Reading], union: Mapping[Tuple[str, int], int],
               torch=None) -> Tuple[Tuple[str, int], ...]:
    """Per device, the bytes of the memory reading (live CPU tensors, torch's allocated) that
    no variable, output or error reaches: a library's cache, a thread, a reference cycle.
    A GPU's reading counts each storage as the block its allocator gave it: rounded up to
    512 B (under ``roundup_power2_divisions``, to the next of its steps), and a block of the
    large pool (over 1 MiB) is not split for a remainder of 1 MiB or less, which it then
    counts as allocated too; under ``max_split_size_mb`` a block of that size or more is never
    split, and a cached one is reused for a request up to 20 MiB smaller (or
    ``max_non_split_rounding_mb``, by default ``large_segment_size_mb``) (CUDACachingAllocator.cpp: round_size, should_split,
    get_free_block). The storages reached
    are counted at the most their blocks can hold, so that what is left is memory no rounding
    explains: a lower bound. Less than 1 MiB is not worth a line."""
    reached: Dict[str, int] = {}
    limits: Dict[str, Optional[int]] = {}
    rounding: Optional[Tuple[List[int], int]] = None
    for (device, _), nbytes in union.items():
        if device == "cpu":
            blocks = nbytes
        else:
            if device not in limits:
                limits[device] = _split_limit(torch, device) if torch is not None else None
            if rounding is None:
                rounding = _rounding(torch) if torch is not None else ([0] * ROUNDUP_INTERVALS, LARGE_BUFFER)
            limit, blocks = limits[device], _rounded(nbytes, rounding[0])
            blocks += (rounding[1] if limit is not None and blocks >= limit else
                       UNSPLIT_REMAINDER if nbytes > UNSPLIT_REMAINDER else 0)
        reached[device] = reached.get(device, 0) + blocks
    rest = ((reading.device, reading.allocated - reached.get(reading.device, 0))
            for reading in readings if reading.allocated is not None)
    return tuple((device, n) for device, n in rest if n >= 1024 ** 2)


def _namespaces(shell: Any) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """The user namespace and IPython's hidden one (empty in plain Python)."""
    if shell is None:
        return sys.modules["__main__"].__dict__, {}
    return shell.user_ns, getattr(shell, "user_ns_hidden", {})


def _gpu_view(snapshot, torch):
    """The GPUs this process can use (NVML's), NVML index -> torch index, and torch's
    allocator view once CUDA runs. A GPU the status card calls hidden from torch is left out:
    nothing of this process is there, and another user's job on it would read as memory
    freed or grown."""
    if snapshot is None or not snapshot.ok:
        snapshot = Snapshot(source="none")  # unreadable: torch's figures stand on their own
    view = torch_view(snapshot, detect_runtime())
    gpus = tuple(gpu for gpu in view.gpus if view.hidden_from_torch(gpu) is not True)
    # which GPU is cuda:N may be unknown (fastest first): torch's figures then stand on their own
    index_of = view.torch_index_of if view.cuda_numbering_known else {}
    memory = torch_memory(index_of) if torch is not None else ()  # () until CUDA is initialized
    return gpus, index_of, memory


def _outside_torch(snapshot, torch) -> Dict[str, Any]:
    """Holders' fields for the GPUs this process can use: per GPU, other processes and this
    process's non-torch memory (context, other libraries), and the cuda:N torch calls it."""
    gpus, index_of, memory = _gpu_view(snapshot, torch)
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
    """
    return _holders(shell if shell is not None else current_shell(), _snapshot(source), max_objects)


def _holders(shell: Any, snapshot, max_objects: int = MAX_OBJECTS,
             readings: Optional[Tuple[Reading, ...]] = None) -> Holders:
    """memory_holders() with the GPUs already read (``snapshot``, None when unreadable) and,
    where given, the memory (``readings``, taken after the snapshot)."""
    torch = _torch()
    problem = snapshot.problem if snapshot is not None else None
    if torch is None:
        return Holders(torch_imported=False, problem=problem, **_outside_torch(snapshot, None))
    namespace, hidden = _namespaces(shell)
    skip = {id(namespace), id(hidden), id(shell)}
    holders, union = _rank(_user_variables(shell), torch, skip, max_objects)
    total = _by_device(union)
    elsewhere, not_yours = _elsewhere(shell, torch, skip, union, max_objects)
    unreached = _unreached(read_memory(torch, snapshot) if readings is None else readings, union, torch)
    not_yours = collections.Counter(dict(_by_device(not_yours)))
    not_yours.update(dict(unreached))
    return Holders(holders=holders, total_by_device=total, not_yours=tuple(sorted(not_yours.items())),
                   elsewhere=elsewhere, unreached=unreached, problem=problem,
                   **_outside_torch(snapshot, torch))


# ----------------------------------------------------------------------------- measuring


@dataclasses.dataclass(frozen=True)
class Reading:
    """One device's memory at one moment; ``None`` where it cannot be read."""

    device: str  # "cpu", "cuda:0", or "GPU 1" where which cuda:N it is cannot be told
    allocated: Optional[int]  # cpu: bytes of live CPU tensors; cuda: torch's memory_allocated
    reserved: Optional[int] = None  # torch's memory_reserved (cuda, once CUDA is initialized)
    nvml_used: Optional[int] = None  # the whole GPU's used memory, every process included


def cpu_tensor_bytes(torch) -> int:
    """Bytes of every live CPU tensor Python can see, each storage counted once, and of those
    their autograd graphs saved for backward(): a saved activation often has no Python object
    left (relu's, softmax's output once the next layer has run). A sparse tensor's memory is
    in its indices and values, which have none either: walked, as the ranking walks them."""
    objects = gc.get_objects()
    # Tensor's metaclass makes issubclass slow: test each type once, then filter by type.
    tensor_kinds = {kind for kind in set(map(type, objects)) if issubclass(kind, torch.Tensor)}
    storages: Dict[int, int] = {}
    walked = []  # autograd graphs and sparse tensors
    for obj in objects:
        if type(obj) in tensor_kinds:
            try:  # a tensor subclass's __torch_function__ may raise on any attribute
                if obj.grad_fn is not None:
                    walked.append(obj.grad_fn)
                if obj.layout != torch.strided:
                    walked.append(obj)
                elif obj.device.type == "cpu":
                    storage = obj.untyped_storage()
                    storages[storage.data_ptr()] = storage.nbytes()
            except Exception:
                continue
    del objects
    saved = _walk(walked, torch, set()).storages
    storages.update((address, nbytes) for (device, address), nbytes in saved.items() if device == "cpu")
    storages.pop(0, None)
    return sum(storages.values())


def _snapshot(source: Optional[DeviceSource]):
    if source is None:
        from ..devices import default_source

        source = default_source()
    try:
        return source.snapshot()
    except Exception:  # a source promises not to raise; never let it break the clearing
        return None


def read_memory(torch, snapshot) -> Tuple[Reading, ...]:
    """cpu (if torch is imported) and every GPU of ``snapshot`` this process can use, with
    torch's view where CUDA runs."""
    readings: List[Reading] = []
    if torch is not None:
        readings.append(Reading("cpu", cpu_tensor_bytes(torch)))
    gpus, index_of, memory = _gpu_view(snapshot, torch)
    by_nvml = {m.nvml_index: m for m in memory}
    for gpu in gpus:
        torch_index = index_of.get(gpu.index)
        seen = by_nvml.get(gpu.index)
        readings.append(Reading(
            device=f"cuda:{torch_index}" if torch_index is not None else f"GPU {gpu.index}",
            allocated=seen.allocated if seen else None,
            reserved=seen.reserved if seen else None,
            nvml_used=gpu.memory_used))
    # torch's devices NVML could not match (NVML missing or failing): torch's view alone.
    readings += [Reading(f"cuda:{m.torch_index}", m.allocated, m.reserved)
                 for m in memory if m.nvml_index is None]
    return tuple(readings)


# ----------------------------------------------------------------------------- the steps


def drop_exception(shell: Any) -> List[str]:
    """Drop every reference IPython and ``sys`` keep to the last exception; name those dropped.

    Each of them alone keeps the failed cell's frames, and so their tensors, alive, as does
    the debugger a ``%debug`` ran. The price: ``%debug`` and ``%tb`` have no last exception to
    show afterwards. The ``sys`` attributes are deleted, not set to None: that is how IPython's
    ``%debug`` and ``pdb.pm()`` know there is nothing to debug (with None they fail on it).
    """
    dropped = []
    for owner, attribute, name in _exception_references(shell):
        if owner is sys:
            delattr(sys, attribute)
        else:
            setattr(owner, attribute, None)
        dropped.append(name)
    return dropped


def _exception_references(shell: Any) -> List[Tuple[Any, str, str]]:
    """(owner, attribute, name) of each reference IPython and ``sys`` keep to the last exception."""
    found = [(sys, name, f"sys.{name}") for name in ("last_type", "last_value", "last_traceback", "last_exc")
             if hasattr(sys, name)]  # last_exc exists on Python 3.12+ only
    if shell is None:
        return found
    result = getattr(shell, "last_execution_result", None)
    if result is not None and (getattr(result, "error_in_exec", None) is not None
                               or getattr(result, "error_before_exec", None) is not None):
        found.append((shell, "last_execution_result", "shell.last_execution_result"))
    for holder in ("InteractiveTB", "SyntaxTB"):
        tools = getattr(shell, holder, None)
        for attribute, value in list(getattr(tools, "__dict__", {}).items()):
            # the debugger of a past %debug still holds its frames; IPython makes a new one
            if (isinstance(value, (types.TracebackType, BaseException))
                    or isinstance(value, bdb.Bdb) and getattr(value, "botframe", None) is not None):
                found.append((tools, attribute, f"shell.{holder}.{attribute}"))
    return found


def _output_history(shell: Any, namespace: Mapping[str, Any]) -> Optional[Dict[int, Any]]:
    history = getattr(getattr(shell, "history_manager", None), "output_hist", None)
    if isinstance(history, dict):
        return history
    out = namespace.get("Out")
    return out if isinstance(out, dict) else None


def _forget_outputs(shell: Any, namespace: Dict[str, Any], hidden: Dict[str, Any],
                    objects: List[Any]) -> None:
    """Remove IPython's other references to ``objects``: ``_N``, ``_``/``__``/``___``, the last result."""
    ids = {id(obj) for obj in objects}
    for space in (namespace, hidden):
        for name in [n for n, v in space.items() if id(v) in ids and _OUTPUT_NAME.match(n)]:
            if name.strip("_"):
                del space[name]  # _12: IPython's own name, made for that output only
            elif space is hidden or _is_ipython_name(name, space[name], shell, hidden):
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
    reach = _walk(value, torch, set())
    return bool(reach.tensors or reach.modules)


def clear_output_history(shell: Any, everything: bool = False) -> List[int]:
    """Clear the ``Out`` entries that hold tensors or modules (all with ``everything``)."""
    namespace, hidden = _namespaces(shell)
    history = _output_history(shell, namespace)
    if not history:
        return []
    torch = _torch()
    numbers = [n for n, value in history.items() if everything or holds_torch(value, torch)]
    objects = [history.pop(n) for n in numbers]
    _forget_outputs(shell, namespace, hidden, objects)
    return numbers


def check_names(names: Iterable[str], shell: Any) -> List[str]:
    """The names to delete, or :class:`ClearCacheError` naming the first bad one; deletes nothing."""
    namespace, hidden = _namespaces(shell)
    names = list(names)
    for name in names:
        if not isinstance(name, str):  # clear_cache(["model", "opt"]), clear_cache(model)
            raise TypeError(f"variable names are strings, one per argument, e.g. "
                            f"clear_cache('model', 'optimizer'); got {type(name).__name__}")
    names = list(dict.fromkeys(names))
    for name in names:
        if _is_ipython_name(name, namespace.get(name, _MISSING), shell, hidden):
            holds_outputs = name in ("Out", "_oh") or _OUTPUT_NAME.match(name)  # not In, exit
            raise ClearCacheError(f"{name!r} is IPython's own name, not a variable of yours"
                                  + (f"; use {option('history', True)} to clear the output history"
                                     if holds_outputs else ""))
        if _is_dunder(name):
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
    namespace, hidden = _namespaces(shell)
    names = check_names(names, shell)
    objects = [namespace[name] for name in names]
    for name, obj in zip(names, objects):
        del namespace[name]
        if hidden.get(name) is obj:
            del hidden[name]
    history = _output_history(shell, namespace)
    ids = {id(obj) for obj in objects}
    for number in [n for n, v in (history or {}).items() if id(v) in ids]:
        del history[number]
    _forget_outputs(shell, namespace, hidden, objects)
    return names


def cuda_devices_in_use(torch) -> List[int]:
    """The CUDA devices with a context (CUDA already initialized); asking creates none."""
    has_context = getattr(torch._C, "_cuda_hasPrimaryContext", None)
    return [device for device in range(torch.cuda.device_count())
            if (has_context(device) if has_context is not None
                else torch.cuda.memory_stats(device).get("reserved_bytes.all.peak", 0) > 0)]


def working_device(current: int, in_use: List[int]) -> int:
    """The device the user's code runs on: the current one, unless only others have a context
    (a model moved to cuda:1 leaves the current device at 0, and working there would create a
    context on a GPU the user never touched)."""
    return current if not in_use or current in in_use else in_use[0]


def empty_cuda_cache(torch) -> List[str]:
    """synchronize() each device CUDA already runs on, free cuBLAS's workspaces, then
    empty_cache() and ipc_collect().

    Only devices with a context are synchronized: touching another would create one (CUDA 12's
    cudaSetDevice does). cuBLAS keeps a workspace per handle and stream (32 MiB on a Hopper
    GPU) as allocated blocks of the caching allocator, which empty_cache() leaves alone; torch
    frees them with the private ``_cuda_clearCublasWorkspaces()`` (its own leak checks do) and
    makes them again at the next matrix product. ``empty_cache()`` then releases the unused
    cached blocks of every device. It runs with a device in use as the current one: called
    while the current device has no context (a model on cuda:1, the current device still 0)
    it creates one there (pytorch#25752, #144025), hundreds of MiB on a GPU that may be
    another user's. Where no device has a context yet (CUDA initialized by a query such as
    ``torch.cuda.current_device()``) nothing can be cached, and nothing is called.
    """
    in_use = cuda_devices_in_use(torch)
    if not in_use:
        return []
    for device in in_use:
        torch.cuda.synchronize(device)
    current = torch.cuda.current_device()
    working = working_device(current, in_use)
    # leaving torch.cuda.device sets no device without a context
    with torch.cuda.device(working) if working != current else contextlib.nullcontext():
        clear_workspaces = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
        if clear_workspaces is not None:
            clear_workspaces()
        torch.cuda.empty_cache()
        torch.cuda.ipc_collect()
    return [f"cuda:{device}" for device in in_use]


# ----------------------------------------------------------------------------- the report


@dataclasses.dataclass(frozen=True)
class Step:
    """One step of clear_cache: what it did and the memory right after it."""

    name: str
    done: str
    after: Tuple[Reading, ...]
    error: Optional[str] = None  # why the step failed, in one line; None when it did not


@dataclasses.dataclass(frozen=True, repr=False)
class ClearReport(_Shown):
    """What clear_cache did, what each step freed, and who still holds memory."""

    before: Tuple[Reading, ...]
    steps: Tuple[Step, ...]
    holders: Holders
    deleted: Tuple[str, ...] = ()
    cuda_initialized: bool = False

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

    _renderers = "report"


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
    failed, with its error, and the others still run. A bad name raises
    ``colab_gpu.memory.ClearCacheError`` (a ValueError) before anything is done.
    ``print(report)`` shows the report ``%clear_cache`` shows.
    """
    shell = shell if shell is not None else current_shell()
    names = check_names(names, shell)  # a name given twice is deleted and reported once
    torch = _torch()
    snapshot = _snapshot(source)
    readings = read_memory(torch, snapshot)
    steps: List[Step] = []

    def step(name: str, action: Callable[[], str]) -> None:
        nonlocal snapshot
        try:
            done, error = action(), None
        except Exception as failure:  # a CUDA error (a device-side assert): said, not raised
            error = _failure(failure)
            done = f"failed: {error}"
        snapshot = _snapshot(source)  # the last one also serves the ranking below
        steps.append(Step(name, done, read_memory(torch, snapshot), error))

    step("exception", lambda: _listed("dropped ", drop_exception(shell), "no exception was kept"))
    step("output history", lambda: _history_done(clear_output_history(shell, history), history))
    if names:
        step("variables", lambda: _listed("deleted ", delete_variables(shell, names), ""))
    step("garbage collection",
         lambda: f"gc.collect() found {count(gc.collect(), 'unreachable object')}")
    cuda = cuda_torch() is not None
    if cuda:
        step("CUDA cache", lambda: _cuda_done(empty_cuda_cache(torch)))
    return ClearReport(before=readings, steps=tuple(steps),
                       holders=_holders(shell, snapshot, readings=steps[-1].after), deleted=tuple(names),
                       cuda_initialized=cuda)


def _failure(error: BaseException) -> str:
    """A step's error in one line; one that breaks the device (a device-side assert, an
    illegal memory access) says that only a restart mends it."""
    from ..batch.oom import ErrorKind, classify
    from ..batch.trial import describe

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
