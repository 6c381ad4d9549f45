"""What this kernel holds on the failing device, measured within a time budget.

First what IPython keeps that no variable holds (the last error's traceback, the outputs):
what ``%clear_cache`` frees. Then the variables, those that keep an autograd graph first, by
the tensor bytes each reaches. The walk is the memory ranking's (colab_gpu.memory): it never
runs the user's code and keeps no tensor once it returns. Past the deadline each walk stops
and the scan says it was cut short: the card must come within half a second even in a
notebook of 100,000 tensors; ``%clear_cache --vars`` ranks everything without a limit.
"""
from __future__ import annotations

import collections
import dataclasses
import itertools
import time
from typing import Any, Dict, Iterable, List, Optional, Set, Tuple

from ..memory.holders import other_roots
from ..memory.namespace import namespaces, user_variables
from ..memory.walk import imported_torch, walk_from
from .report import Graph, Place

__all__ = ["KernelScan", "scan_kernel", "graph_tensors", "accumulated_steps", "failed_call_builds_graph"]

TOP = 5  # variables named on the card
LIST_CHECKED = 10_000  # elements of a list looked at for tensors that keep a graph
CHAIN_LIMIT = 100_000  # nodes followed along a chain of additions

Storages = Dict[Tuple[str, int], int]


@dataclasses.dataclass(frozen=True)
class KernelScan:
    """Bytes on one device: kept by IPython alone, held by the variables, kept by graphs."""

    kept: Tuple[Place, ...] = ()
    variables: Tuple[Place, ...] = ()
    graphs: Tuple[Graph, ...] = ()
    model_bytes: Optional[int] = None  # the modules' and optimizers' tensors, once all were walked
    float32_modules: Tuple[str, ...] = ()  # modules whose parameters are float32 on the device
    modules_in_eval: Optional[bool] = None  # every module on the device is in eval mode (None: none)
    held_bytes: int = 0  # every storage on the device the variables and IPython's references reach
    walked: int = 0  # variables walked
    total: int = 0  # variables there are
    complete: bool = True  # nothing was cut short by the deadline
    torch_imported: bool = True


def _has_graph(value: Any, tensor_types: Dict[type, bool], torch) -> bool:
    """A tensor with an autograd graph. Types are tested with type(), never the object's own
    __class__ (a proxy's is user code), and each once: Tensor's metaclass makes that slow."""
    kind = type(value)
    is_tensor = tensor_types.get(kind)
    if is_tensor is None:
        is_tensor = tensor_types[kind] = issubclass(kind, torch.Tensor)
    try:
        return is_tensor and value.grad_fn is not None
    except Exception:  # a tensor subclass's __torch_function__ may raise on any attribute
        return False


def graph_tensors(value: Any, torch) -> Tuple[List[Any], bool]:
    """The tensors with an autograd graph that ``value`` holds at its top: itself, or the
    elements of a list, tuple or dict (a list of losses); and whether it is such a container."""
    tensor_types: Dict[type, bool] = {}
    if _has_graph(value, tensor_types, torch):
        return [value], False
    kind = type(value)
    if issubclass(kind, dict):
        items: Iterable[Any] = dict.values(value)
    elif issubclass(kind, (list, tuple)):
        items = list.__iter__(value) if issubclass(kind, list) else tuple.__iter__(value)
    else:
        return [], False
    return [item for item in itertools.islice(items, LIST_CHECKED) if _has_graph(item, tensor_types, torch)], True


def accumulated_steps(tensor) -> int:
    """How many additions of a graph onto itself ``tensor`` holds: ``total = total + loss`` run
    120 times leaves a chain of 120 AddBackward nodes, each over the one before (its left
    operand), down to the ``0 + loss`` the sum started from (an operand without a graph)."""
    node, steps = tensor.grad_fn, 0
    while type(node).__name__.startswith("AddBackward") and steps < CHAIN_LIMIT:
        steps += 1
        operands = [child for child, _ in node.next_functions]
        if len(operands) < 2 or None in operands:  # tensor + a number: where the sum started
            break
        node = operands[0]
    return max(steps, 1)


def _is_model(value: Any, torch) -> bool:
    return issubclass(type(value), (torch.nn.Module, torch.optim.Optimizer))


def _module_on(value: Any, torch, device: str):
    """A module's first parameter, where the module is on ``device``; else None."""
    if not issubclass(type(value), torch.nn.Module):
        return None
    try:
        parameter = next(value.parameters())
    except Exception:  # StopIteration: a module without parameters
        return None
    return parameter if str(parameter.device) == device else None


def _on(storages: Storages, device: str) -> int:
    return sum(nbytes for (where, _), nbytes in storages.items() if where == device)


def _own_storages(tensors: List[Any]) -> Set[Tuple[str, int]]:
    keys = set()
    for tensor in tensors:
        try:
            keys.add((str(tensor.device), tensor.untyped_storage().data_ptr()))
        except Exception:
            continue
    return keys


def _priority(item: Tuple[str, Any], torch) -> int:
    """Graphs first (the classic leak), then modules and optimizers, then the rest."""
    value = item[1]
    if graph_tensors(value, torch)[0]:
        return 0
    return 1 if _is_model(value, torch) else 2


class _Walks:
    """The variables' walks, each storage's owners, and what was cut short."""

    def __init__(self, torch, skip: Set[int], deadline: float):
        self.torch, self.skip, self.deadline = torch, skip, deadline
        self.reaches: List[Tuple[str, str, Storages, bool]] = []  # name, type, storages, is model
        self.graphs: List[Tuple[str, Set[Tuple[str, int]], int, bool]] = []
        self.float32: List[str] = []
        self.training: List[bool] = []  # of each module on the device
        self.truncated = False

    def add(self, name: str, value: Any, device: str) -> None:
        torch = self.torch
        tensors, in_list = graph_tensors(value, torch)
        if tensors:
            steps = len(tensors) if in_list else accumulated_steps(tensors[0])
            self.graphs.append((name, _own_storages(tensors), steps, in_list))
        parameter = _module_on(value, torch, device)
        if parameter is not None:
            self.training.append(bool(value.training))
            if parameter.dtype == torch.float32:
                self.float32.append(name)
        reach = walk_from(value, torch, self.skip, deadline=self.deadline)
        self.truncated |= reach.truncated
        self.reaches.append((name, type(value).__qualname__, reach.storages, _is_model(value, torch)))

    def owners(self) -> collections.Counter:
        return collections.Counter(key for _, _, storages, _ in self.reaches for key in storages)


def _kept(roots: List[Tuple[str, Storages]], union: Storages, device: str) -> Tuple[Place, ...]:
    """Each output and the last error by the bytes on ``device`` it alone keeps (each storage
    counted once, in the first place that reaches it)."""
    counted: Set[Tuple[str, int]] = set()
    places = []
    for name, storages in roots:
        own = {key: n for key, n in storages.items() if key not in union and key not in counted}
        counted.update(own)
        if _on(own, device):
            places.append(Place("the last error's traceback" if name == "the last error" else name, _on(own, device)))
    return tuple(sorted(places, key=lambda place: -place.nbytes))


def _graphs(walks: _Walks, owners: collections.Counter, device: str) -> Tuple[Graph, ...]:
    """Each graph's bytes: what the variable alone reaches on the device, less its tensors'
    own storages (a scalar loss's four bytes, the outputs themselves)."""
    by_name = {name: storages for name, _, storages, _ in walks.reaches}
    found = []
    for name, own, steps, in_list in walks.graphs:
        storages = by_name.get(name, {})
        alone = {key: n for key, n in storages.items() if owners[key] == 1 and key not in own}
        found.append(Graph(name, _on(alone, device), steps, in_list))
    return tuple(sorted(found, key=lambda graph: -graph.nbytes))


def scan_kernel(shell: Any, device: Optional[str], deadline: float) -> KernelScan:
    """Measure what the kernel holds on ``device`` (a storage's device name, "cuda:0", "cpu")
    until ``deadline`` (a ``time.perf_counter()`` value)."""
    torch = imported_torch()
    if torch is None or device is None:
        return KernelScan(torch_imported=torch is not None)
    namespace, hidden = namespaces(shell)
    skip = {id(namespace), id(hidden), id(shell)}
    roots = []
    for name, root in other_roots(shell, namespace, hidden):
        reach = walk_from(root, torch, skip, deadline=deadline)
        roots.append((name, reach.storages, reach.truncated))
        del root
    walks = _Walks(torch, skip, deadline)
    variables = sorted(user_variables(shell), key=lambda item: _priority(item, torch))
    for name, value in variables:
        if time.perf_counter() > deadline:
            break
        walks.add(name, value, device)
    return _scan(walks, roots, device, left=len(variables) - len(walks.reaches))


def _scan(walks: _Walks, roots: list, device: str, left: int) -> KernelScan:
    owners = walks.owners()
    union: Storages = {key: n for _, _, storages, _ in walks.reaches for key, n in storages.items()}
    complete = not left and not walks.truncated and not any(truncated for _, _, truncated in roots)
    places = sorted((Place(name, _on(storages, device), type_name) for name, type_name, storages, _ in walks.reaches),
                    key=lambda place: -place.nbytes)
    model: Storages = {key: n for _, _, storages, is_model in walks.reaches if is_model for key, n in storages.items()}
    kept = _kept([(name, storages) for name, storages, _ in roots], union, device)
    return KernelScan(
        kept=kept, held_bytes=_on(union, device) + sum(place.nbytes for place in kept),
        variables=tuple(place for place in places[:TOP] if place.nbytes),
        graphs=_graphs(walks, owners, device), model_bytes=_on(model, device) if complete else None,
        float32_modules=tuple(walks.float32), modules_in_eval=not any(walks.training) if walks.training else None,
        walked=len(walks.reaches), total=len(walks.reaches) + left,
        complete=complete)


def failed_call_builds_graph(error: BaseException, torch) -> bool:
    """Whether a frame of the failed call held a tensor with an autograd graph: the forward
    pass was recording one for a backward() when memory ran out. Reads each frame's local
    variables (not what they contain) and keeps none."""
    traceback = error.__traceback__
    tensor_types: Dict[type, bool] = {}
    for _ in range(500):
        if traceback is None:
            return False
        frame = traceback.tb_frame
        if frame.f_locals is not frame.f_globals:  # a cell's module frame: its names are variables
            if any(_has_graph(value, tensor_types, torch) for value in list(frame.f_locals.values())):
                return True
        traceback = traceback.tb_next
    return False
