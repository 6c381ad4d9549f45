"""The reference walk: from one object (a variable, an output, the last error) to every tensor
storage it keeps alive, through containers, objects' attributes and slots, closures, partials,
paused generators, tracebacks' frames and autograd graphs, each storage counted once, cycles
and all. Apart because the ranking, the memory reading (a CPU tensor's saved activations) and
the clearing (which outputs hold a tensor) all walk the same way, and because it is the one
part that must never run the user's code nor keep a tensor once it returns.
"""
from __future__ import annotations

import collections
import dataclasses
import functools
import gc
import itertools
import sys
import time
import types
from typing import AbstractSet, Any, Dict, Iterable, List, Mapping, Optional, Set, Tuple

__all__ = ["MAX_OBJECTS", "OPAQUE", "Reach", "imported_torch", "walk_from"]

# Types that hold no tensor and are not worth a visit.
_LEAVES = (type(None), bool, int, float, complex, str, bytes, bytearray, range, slice)
# Types never walked into: they lead to the whole interpreter (modules, classes' namespaces).
# A function is walked into its closure and defaults only, never its globals; a generator
# into its paused frame's local variables only.
OPAQUE = (types.ModuleType, type, types.BuiltinFunctionType, types.CodeType, types.FrameType)
# A generator, a coroutine, an async generator -> its paused frame (None once it has finished).
_SUSPENDED = {types.GeneratorType: "gi_frame", types.CoroutineType: "cr_frame",
              types.AsyncGeneratorType: "ag_frame"}
# A function frame's f_locals: a dict up to Python 3.12, a live view of the frame from 3.13
# (PEP 667). pdb keeps one (curframe_locals) for the frame a past %debug stopped in.
_FRAME_LOCALS = type((lambda: sys._getframe().f_locals)())

MAX_OBJECTS = 1_000_000  # objects visited per variable: a bound so a huge container stays fast


@dataclasses.dataclass
class Reach:
    """What one walk found: storages by (device, address), and what it stopped at."""

    storages: Dict[Tuple[str, int], int] = dataclasses.field(default_factory=dict)
    tensors: int = 0
    modules: int = 0
    truncated: bool = False
    device_names: Dict[Any, str] = dataclasses.field(default_factory=dict)  # torch.device -> "cuda:0"
    known: Mapping[Tuple[str, int], int] = dataclasses.field(default_factory=dict)  # storages held elsewhere
    shared: int = 0  # tensors whose storage is in ``known``: of ``tensors``, those not this root's alone
    # NumPy arrays that own their memory, by ("cpu", address): a tensor made by torch.from_numpy
    # has its storage there, and the array keeps that memory alive whatever becomes of the tensor.
    arrays: Dict[Tuple[str, int], int] = dataclasses.field(default_factory=dict)


def _record_tensor(tensor, reach: Reach, stack: List[Any], torch, part: bool = False) -> None:
    """``part``: a sparse tensor's indices or values, its memory but not a tensor of the user's."""
    if not part:
        reach.tensors += 1
    if tensor.layout != torch.strided:  # sparse: the memory is in the component tensors
        shared = reach.shared
        for component in ("_indices", "_values", "crow_indices", "col_indices",
                          "ccol_indices", "row_indices", "values"):
            try:
                _record_tensor(getattr(tensor, component)(), reach, stack, torch, part=True)
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


def _record_array(array, reach: Reach, stack: List[Any], numpy) -> None:
    """An array that views another object's memory leads to that owner (``t.numpy()``'s base is
    the tensor ``t``); one that owns its memory is noted by address, for a tensor lent it."""
    base = numpy.ndarray.base.__get__(array)  # the C getters: a subclass's properties never run
    if base is not None:
        stack.append(base)
        return
    address = numpy.ndarray.__array_interface__.__get__(array)["data"][0]
    nbytes = numpy.ndarray.nbytes.__get__(array)
    if address and nbytes:
        reach.arrays[("cpu", address)] = nbytes


def _children(obj: Any, kind: type) -> Iterable[Any]:
    """What a non-tensor object refers to, as far as memory is concerned.

    Containers are read through the built-in type's own methods: a subclass's ``__iter__``,
    ``keys`` or ``values`` is the user's code, which may raise, load data or lie.
    """
    if issubclass(kind, dict):
        yield from dict.keys(obj)
        yield from dict.values(obj)
        return
    if kind is _FRAME_LOCALS:  # the view's values are the frame's own, read without user code
        yield from _FRAME_LOCALS.values(obj)
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
        if getattr(obj, _SUSPENDED[kind]) is not None:
            yield from _paused_frame_children(obj)
        return
    if issubclass(kind, BaseException):
        yield obj.__traceback__
        yield obj.__cause__
        yield obj.__context__
    if issubclass(kind, types.TracebackType):
        yield from _traceback_children(obj)
        return
    yield from _attribute_children(obj, kind)


def _paused_frame_children(obj: Any) -> Iterable[Any]:
    """A paused generator's (coroutine's) local variables as the garbage collector sees them,
    not through the frame's f_locals: Python 3.11 and 3.12 keep that dict on the frame, and
    with it a local the generator deletes later (`del data`) until it ends. Free variables
    come as cells."""
    for referent in gc.get_referents(obj):
        if isinstance(referent, types.CellType):
            try:
                yield referent.cell_contents
            except ValueError:  # a cell not yet filled
                pass
        elif not isinstance(referent, (types.FrameType, types.CodeType, str)):
            yield referent


def _traceback_children(traceback: types.TracebackType) -> Iterable[Any]:
    """The local variables of a traceback's frames, and of the callers they keep alive.

    The frame that caught the exception keeps its callers' frames alive once they have
    returned, locals and all (`errors.append(e)` in a step keeps the train() that called
    it). Followed while they run in the same module, as a notebook's functions do, never
    into IPython's own; a frame still running is alive anyway, and so are its callers.
    """
    caller, running = traceback.tb_frame.f_back, _running_frames()
    while (caller is not None and id(caller) not in running
           and caller.f_globals is traceback.tb_frame.f_globals and caller.f_locals is not caller.f_globals):
        yield from caller.f_locals.values()
        caller = caller.f_back
    entry: Optional[types.TracebackType] = traceback
    while entry is not None:
        frame = entry.tb_frame
        if frame.f_locals is not frame.f_globals:  # a module frame's locals are a namespace
            yield from frame.f_locals.values()
        entry = entry.tb_next


def _attribute_children(obj: Any, kind: type) -> Iterable[Any]:
    """Any other object's attributes and slots; a built-in one's references as the garbage
    collector sees them."""
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
    for running_frame in sys._current_frames().values():
        frame: Optional[types.FrameType] = running_frame
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


_SKIP, _TENSOR, _MODULE, _OTHER, _NODE, _ARRAY = range(6)


def _classify(kind: type, torch) -> int:
    if issubclass(kind, _LEAVES) or issubclass(kind, OPAQUE):
        return _SKIP
    if issubclass(kind, torch.Tensor):
        return _TENSOR
    numpy = sys.modules.get("numpy")  # never imported here
    if numpy is not None and issubclass(kind, numpy.ndarray):
        return _ARRAY
    if hasattr(kind, "next_functions"):  # an autograd graph node (SumBackward0, a Function's ctx)
        return _NODE
    return _MODULE if issubclass(kind, torch.nn.Module) else _OTHER


def _saved_attributes(kind: type) -> Tuple[str, ...]:
    """A node type's attributes that hold what it saved (``_raw_saved_self``,
    ``_raw_saved_result``, a custom Function's ``_raw_saved_tensors``), and AccumulateGrad's
    ``variable``."""
    return tuple(name for name in dir(kind) if name.startswith("_raw_saved_") or name == "variable")


def walk_from(root: Any, torch, skip: AbstractSet[int], max_objects: int = MAX_OBJECTS,
              known: Optional[Mapping[Tuple[str, int], int]] = None, deadline: Optional[float] = None) -> Reach:
    """Every tensor storage ``root`` reaches, each counted once, cycles and all; its tensors
    whose storage is one of ``known`` are counted as shared. Past ``deadline`` (a
    ``time.perf_counter()`` value) the walk stops, truncated: the out-of-memory card must come
    within half a second."""
    reach = Reach(known=known or {})
    kinds: Dict[type, int] = {}  # each type classified once: Tensor's metaclass makes issubclass slow
    saved: Dict[type, Tuple[str, ...]] = {}
    seen: Set[int] = set(skip)
    # A graph node and a saved tensor are new Python objects at each read: kept until the walk
    # ends, so that another one cannot take a freed one's id and be skipped as already seen.
    made: List[Any] = []
    stack = [root]
    for visit in range(max_objects):  # every object counts, ints and strings too
        if not stack or deadline is not None and not visit & 255 and time.perf_counter() > deadline:
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
            elif verdict == _ARRAY:
                numpy = sys.modules["numpy"]
                _record_array(obj, reach, stack, numpy)
                if kind is not numpy.ndarray:  # a subclass's attributes (a masked array's mask)
                    stack.extend(itertools.islice(_children(obj, kind), max_objects - visit))
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


def imported_torch():
    """The user's torch, only if already imported (never imported here)."""
    return sys.modules.get("torch")
