"""Leave the notebook as it was: names, model/optimizer state, random generators.

A restore point is taken once before the search and restored after every trial, so each trial
starts from the same weights and random stream, and nothing a trial left behind (tensors
bound to the notebook's names, gradients, optimizer state) keeps memory alive. The models,
optimizers, LR schedulers and GradScalers the step uses are found by :func:`stateful_objects`
(a search of 15 trials ran 15 optimizer steps on the notebook's model when only --restore
named what to put back); their copies go to the CPU while they fit in the RAM available.
"""
from __future__ import annotations

import ast
import functools
import itertools
import random
import sys
import types
from typing import Any, Dict, Iterable, Iterator, List, Mapping, MutableMapping, Optional, Set, Tuple

from ..errors import UserError
from ..host import ram_available
from ..oom import describe
from ..spelling import command
from ..runtime import cuda_torch
from ..words import size, with_article


class RestoreError(UserError, ValueError):
    """An object given to --restore whose state cannot be saved."""

    reason: Optional[str] = None  # why, without the object's name: said of an object found, not named


_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda, ast.ListComp, ast.SetComp,
           ast.DictComp, ast.GeneratorExp)


def _own_scope(tree: ast.AST):
    """The nodes of ``tree``'s own scope: not the bodies of the functions, classes, lambdas and
    comprehensions in it, whose names are their own (a def's own name is bound here)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        if node is tree or not isinstance(node, _SCOPES):
            stack.extend(ast.iter_child_nodes(node))


def assigned_names(tree: ast.AST, nested: bool = True) -> Set[str]:
    """Names a cell's parsed code binds (assignments, loops, imports, defs, with); with
    ``nested=False`` only in the cell's own scope, not as locals of the functions it defines."""
    names: Set[str] = set()
    for node in ast.walk(tree) if nested else _own_scope(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
    return names


def mentioned_names(tree: ast.AST) -> Set[str]:
    """Every name a cell's parsed code reads or binds."""
    return {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}


def _map_tensors(value, change):
    """``value`` (a state dict: dicts, lists and tuples of tensors) in new containers, each
    tensor replaced by ``change(tensor)``."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        return change(value)
    if isinstance(value, dict):
        return type(value)((key, _map_tensors(item, change)) for key, item in value.items())
    if isinstance(value, (list, tuple)):
        return type(value)(_map_tensors(item, change) for item in value)
    return value


def _to_cpu(value, from_cpu: Optional[Set[int]] = None):
    """A deep copy of a state dict with every tensor cloned to the CPU; ``from_cpu`` collects
    the ids of the copies whose original was on the CPU already."""
    def cloned(tensor):
        copy = tensor.detach().to("cpu", copy=True)
        if from_cpu is not None and tensor.device.type == "cpu":
            from_cpu.add(id(copy))
        return copy

    return _map_tensors(value, cloned)


def _fresh(saved, ids: Set[int]):
    """``saved`` in new containers, with a new copy of the tensors in ``ids``; the others are
    shared: a load_state_dict moves them to their GPU, a copy made there."""
    return _map_tensors(saved, lambda tensor: tensor.clone() if id(tensor) in ids else tensor)


def _random_state(obj: Any):
    """(read, write) of a random generator's state: NumPy's Generator (its bit generator's
    ``state``), torch.Generator and NumPy's RandomState (``get_state``/``set_state``),
    random.Random (``getstate``/``setstate``); None for anything else. Each read is a copy."""
    bits = getattr(obj, "bit_generator", None)
    if bits is not None and hasattr(bits, "state"):
        return (lambda: bits.state), (lambda state: setattr(bits, "state", state))
    for read, write in (("get_state", "set_state"), ("getstate", "setstate")):
        if callable(getattr(obj, read, None)) and callable(getattr(obj, write, None)):
            return getattr(obj, read), getattr(obj, write)
    return None


def _restore_name(name, flag: str = "") -> str:
    """A --restore object as its caller named it: ``model`` (``--restore model`` with ``flag``)
    in the magic; in Python ``restore`` for one object, ``restore[0]`` or ``restore['model']``
    for a list's or a dict's."""
    return command(f"{flag}{name}", "restore" + ("" if name is None else f"[{name!r}]"))


def _tensor_bytes(value) -> int:
    """Bytes of the tensors in ``value`` (a tensor, or a state dict of them): its CPU copy."""
    total = 0

    def counted(tensor):
        nonlocal total
        total += tensor.numel() * tensor.element_size()
        return tensor

    _map_tensors(value, counted)
    return total


class _ObjectState:
    """One object to restore: anything with state_dict()/load_state_dict(), a tensor, or a
    random generator of the user's own (``rng = np.random.default_rng(0)``). Made in two
    steps: what its copy would take (``nbytes``), then ``save()``, which makes it."""

    def __init__(self, label: str, obj: Any, name: Optional[str] = None):
        self.label, self.obj = label, obj  # label: in messages; name: in the list of restored ones
        self.name = label if name is None else name
        torch = sys.modules.get("torch")
        self.is_tensor = torch is not None and isinstance(obj, torch.Tensor)
        # A module copies what it loads into its own tensors; an optimizer on the CPU (and
        # Adam's step counts on any device) keeps the very tensors it is given, which the
        # next trial would change in place: those from the CPU get a fresh copy at every
        # restore. Not the GPU's: a second host copy of a large optimizer's state per trial
        # could exhaust a Colab runtime's RAM, and loading copies them to the GPU anyway.
        self.copies_in = torch is not None and isinstance(obj, torch.nn.Module)
        self.from_cpu: Set[int] = set()  # ids of the saved tensors whose original was on the CPU
        has_state_dict = all(callable(getattr(obj, name, None)) for name in ("state_dict", "load_state_dict"))
        self.random = None if self.is_tensor or has_state_dict else _random_state(obj)
        if self.is_tensor:
            self.live = obj
        elif has_state_dict:
            try:
                self.live = obj.state_dict()  # the object's own tensors, not copies yet
            except Exception as error:  # the object's own failure, before anything ran
                reason = f"its state_dict() raised {describe(error)}"
                refused = RestoreError(f"{self.label}: {reason}; nothing ran")
                refused.reason = reason
                raise refused from None
        elif self.random is not None:
            self.live = None
        else:
            kinds = "models, optimizers, schedulers, tensors or random generators"
            passed = with_article(type(obj).__name__) + (f" ({obj!r:.40})" if isinstance(obj, str) else "")
            raise RestoreError(f"{self.label}: {passed} has no state_dict() / load_state_dict(); "
                               + command(f"--restore takes the names of variables holding {kinds}",
                                         f"restore takes the objects themselves (one, a list or a dict): {kinds}"))
        parameters = getattr(obj, "parameters", None)
        self.parameters = list(parameters()) if callable(parameters) else []
        if self.is_tensor and obj.is_leaf and obj.requires_grad:  # a weight trained by hand
            self.parameters = [obj]
        self.nbytes = _tensor_bytes(self.live) + sum(_tensor_bytes(p.grad) for p in self.parameters
                                                     if p.grad is not None)

    def save(self) -> None:
        """Copy the state to the CPU, with what lies outside the state dict."""
        obj = self.obj
        if self.random is not None:  # the user's own generator: its stream is put back
            self.saved = self.random[0]()
        else:
            self.saved = _to_cpu(self.live, None if self.is_tensor else self.from_cpu)
        self.live = None
        self.grads = [(p, _to_cpu(p.grad)) for p in self.parameters]
        # Outside state_dict too: train()/eval() of every submodule and requires_grad of every
        # parameter, which a training cell often sets (model.train(), unfreezing a layer).
        modules = getattr(obj, "modules", None)
        self.modes = [(m, m.training) for m in modules()] if callable(modules) else []
        self.tree = self._tree()
        self.requires_grad = [(p, p.requires_grad) for p, _ in self.grads]
        # A GradScaler keeps each optimizer's unscale_()/step() stage outside its state_dict. A
        # trial that ran out of memory between the two leaves it half-way, and the next
        # scaler.step() would skip unscaling. Between iterations it is empty: so it is again.
        stages = getattr(obj, "_per_optimizer_states", None)
        self.empty_stages = isinstance(stages, dict) and not stages  # update() replaces the dict
        # A scheduler writes the learning rate (OneCycleLR the momentum too) into its optimizer's
        # param groups, outside its own state_dict: put back with it, or a schedule restored
        # to step 0 drives an optimizer left at the last trial's rate (which ExponentialLR and
        # StepLR multiply on from).
        self.groups = [_map_tensors({key: value for key, value in group.items() if key != "params"},
                                    lambda tensor: tensor.clone())
                       for group in self._param_groups()]

    def _tree(self) -> Dict[str, Any]:
        """A module's submodules and parameters by name; empty for anything else."""
        if not self.copies_in:
            return {}
        return {**dict(self.obj.named_modules()), **dict(self.obj.named_parameters())}

    def _param_groups(self) -> List[dict]:
        """The param groups of a scheduler's optimizer; none for anything else."""
        if self.copies_in or self.is_tensor or self.random is not None:
            return []
        groups = getattr(getattr(self.obj, "optimizer", None), "param_groups", None)
        return groups if isinstance(groups, list) else []

    def restore(self) -> None:
        if self.is_tensor:
            with sys.modules["torch"].no_grad():
                self.obj.copy_(self.saved)
        elif self.random is not None:
            self.random[1](self.saved)
        else:
            self.obj.load_state_dict(self.saved if self.copies_in else _fresh(self.saved, self.from_cpu))
        for parameter, grad in self.grads:  # a copy: backward() adds into .grad in place
            parameter.grad = None if grad is None else grad.to(parameter.device, copy=True)
        for module, training in self.modes:
            module.training = training
        for parameter, requires_grad in self.requires_grad:
            parameter.requires_grad_(requires_grad)
        if self.empty_stages:
            self.obj._per_optimizer_states.clear()
        # Clones, not the saved tensors: a scheduler fills a tensor rate in place (fill_).
        for group, saved in zip(self._param_groups(), self.groups):
            group.update(_map_tensors(saved, lambda tensor: tensor.clone()))
        # A layer the cell replaced with one of the same shapes loads the saved weights, but the
        # model would keep the last trial's layer, which the optimizer does not train.
        now = self._tree()
        replaced = [name for name, item in self.tree.items() if now.get(name) is not item]
        if replaced:
            raise RuntimeError(f"the cell replaced {', '.join(replaced[:3])}" + (", ..." if replaced[3:] else ""))


class _Generators:
    """Python's, NumPy's (if imported), torch's (if imported) and CUDA's.

    CUDA's state can only be read once CUDA has started, and reading it before would start it.
    Where a trial starts CUDA, each CUDA generator is put back to its initial seed instead: the
    state CUDA starts in (torch.manual_seed queues its seed until then), which is what the
    user's own first CUDA draw would have seen had the search not run.
    """

    def __init__(self):
        self.python = random.getstate()
        numpy = sys.modules.get("numpy")
        self.numpy = numpy.random.get_state() if numpy is not None else None
        torch: Any = sys.modules.get("torch")  # a module, or None
        # Where the cell is what imports torch, there is no state to put back, and none is
        # needed: torch seeds its CPU generator at import from the OS's entropy (initial_seed()
        # differs in every process; 67280421310721 is a torch.Generator()'s), so no user could
        # expect given numbers from it. The same holds for NumPy's global RandomState.
        self.torch = torch.get_rng_state() if torch is not None else None
        self.cuda = torch.cuda.get_rng_state_all() if cuda_torch() is not None else None

    def restore(self) -> None:
        random.setstate(self.python)
        if self.numpy is not None:
            sys.modules["numpy"].random.set_state(self.numpy)
        torch: Any = sys.modules.get("torch")  # there: imported when these states were read, or CUDA runs
        if self.torch is not None:
            torch.set_rng_state(self.torch)
        if self.cuda is not None:
            torch.cuda.set_rng_state_all(self.cuda)
        elif cuda_torch() is not None:  # a trial started CUDA
            for generator in torch.cuda.default_generators:
                generator.manual_seed(generator.initial_seed())


def _stateful_kinds(torch) -> tuple:
    """The classes whose objects a training step changes: modules, optimizers, LR schedulers
    (ReduceLROnPlateau is none of them before torch 2.2) and GradScalers (torch.cuda.amp's only,
    before torch 2.3). Read from the user's torch: none is imported here."""
    schedulers = getattr(torch.optim, "lr_scheduler", None)
    kinds = [torch.nn.Module, torch.optim.Optimizer]
    kinds += [getattr(schedulers, name) for name in ("LRScheduler", "_LRScheduler", "ReduceLROnPlateau")
              if isinstance(getattr(schedulers, name, None), type)]
    for amp in (getattr(torch, "amp", None), getattr(getattr(torch, "cuda", None), "amp", None)):
        scaler = getattr(amp, "GradScaler", None)
        if isinstance(scaler, type):
            kinds.append(scaler)
    return tuple(kinds)


# Looked at in a container: a list of a million samples is data, and no model hides at its end.
CONTAINER_ITEMS = 1000
_OPAQUE = (type, types.ModuleType, str, bytes, int, float, complex, bool, type(None))


def _one_level(label: str, value) -> Iterator[Tuple[str, Any]]:
    """What ``value`` holds, one level down: a dict's, list's or tuple's items, an object's
    attributes (its ``__dict__``: no property is run)."""
    if isinstance(value, dict):
        items = ((f"{label}[{key!r}]", item) for key, item in value.items())
    elif isinstance(value, (list, tuple)):
        items = ((f"{label}[{index}]", item) for index, item in enumerate(value))
    elif isinstance(value, _OPAQUE):
        return
    else:
        try:
            attributes = vars(value)
        except TypeError:  # no __dict__ (slots, a C type)
            return
        items = ((f"{label}.{name}", item) for name, item in attributes.items() if isinstance(name, str))
    yield from itertools.islice(items, CONTAINER_ITEMS)


def _code_names(code: types.CodeType) -> Iterator[str]:
    """The global names a function's code reads, its nested functions' and comprehensions' too."""
    yield from code.co_names
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            yield from _code_names(constant)


def _function_reads(function: types.FunctionType) -> Iterator[Tuple[str, Any]]:
    """The values a function reads from outside its body: the globals its code names, its
    closure's variables and its default arguments, each under its own name."""
    code = function.__code__
    for name in dict.fromkeys(_code_names(code)):  # once each, in order
        if name in function.__globals__:
            yield name, function.__globals__[name]
    for name, cell in zip(code.co_freevars, function.__closure__ or ()):
        try:
            yield name, cell.cell_contents
        except ValueError:  # a variable not assigned yet
            continue
    defaults = function.__defaults__ or ()
    yield from zip(code.co_varnames[:code.co_argcount][-len(defaults):] if defaults else (), defaults)
    yield from (function.__kwdefaults__ or {}).items()


def stateful_objects(roots: Iterable[Tuple[str, Any]],
                     home: Iterable[MutableMapping[str, Any]] = ()) -> Dict[str, Any]:
    """label -> object, in the order met: the modules (with parameters or buffers), optimizers,
    LR schedulers and enabled GradScalers among ``roots`` (name, value: what a cell's code
    reads) and one level inside each (``trainer.model``, ``parts['opt']``, the optimizer a
    scheduler holds). A function among them (also a bound method, a partial, a callable
    object) is followed: what it reads from outside (the globals it names, its closure, its
    defaults) is looked at the same way, and so are the functions it reads that were defined in
    ``home`` (the notebook's namespace) or beside a root function; a library's are not."""
    torch = sys.modules.get("torch")
    if torch is None:  # no torch object can exist
        return {}
    kinds = _stateful_kinds(torch)
    homes = {id(namespace) for namespace in home}
    found: Dict[int, Tuple[str, Any]] = {}
    seen: Set[int] = set()
    work = [(label, value, True) for label, value in reversed(list(roots))]  # a stack, first root on top

    def push(*items: Tuple[str, Any, bool]) -> None:
        work.extend(reversed(items))  # looked at in their order

    def look_at(label: str, value, root: bool) -> None:
        if isinstance(value, types.FunctionType):
            if root or id(value.__globals__) in homes:  # a root, or the user's own function
                homes.add(id(value.__globals__))  # the functions beside it are the user's too
                push(*((name, item, False) for name, item in _function_reads(value)))
        elif isinstance(value, types.MethodType):
            push((label, value.__func__, root), (f"{label}.__self__", value.__self__, root))
        elif isinstance(value, functools.partial):
            push((label, value.func, root),
                 *((f"{label}.args[{index}]", item, root) for index, item in enumerate(value.args)),
                 *((f"{label}.keywords[{key!r}]", item, root) for key, item in value.keywords.items()))
        else:
            for name, item in itertools.chain([(label, value)], _one_level(label, value)):
                if isinstance(item, kinds) and id(item) not in found and _has_state(item):
                    found[id(item)] = (name, item)
            call = getattr(type(value), "__call__", None)  # noqa: B004 (the method, inspected: a callable object of the user's class)
            if isinstance(call, types.FunctionType) and not isinstance(value, kinds):
                push((label, call, root))

    while work:
        label, value, root = work.pop()
        try:
            if id(value) in seen or isinstance(value, _OPAQUE):
                continue
            seen.add(id(value))
            look_at(label, value, root)
        except Exception:  # an object that breaks when looked at (a proxy, a __dict__ property): none
            continue
    return dict(found.values())


def _has_state(obj) -> bool:
    """Whether a trial can change ``obj``: not a module without parameters or buffers (a loss
    function, an activation), not a disabled GradScaler (its state_dict is empty)."""
    if callable(getattr(obj, "buffers", None)) and callable(getattr(obj, "parameters", None)):  # a module
        return any(True for _ in itertools.chain(obj.parameters(), obj.buffers()))
    enabled = getattr(obj, "is_enabled", None)
    return bool(enabled()) if callable(enabled) else True


_GONE = object()  # a name the trial deleted


# The CPU copies may take this share of the RAM available when the search starts: the rest is
# the kernel's own and the trials' (on the CPU), and Linux kills a process that runs out.
RAM_SHARE = 0.75


def _inner_modules(objects: Iterable[Any]) -> Set[int]:
    """The ids of the modules inside the modules among ``objects``, those themselves left out:
    restored with the module that holds them."""
    torch = sys.modules.get("torch")
    inner: Set[int] = set()
    for obj in objects:
        if torch is not None and isinstance(obj, torch.nn.Module):
            inner.update(id(module) for module in itertools.islice(obj.modules(), 1, None))
    return inner


class RestorePoint:
    """Everything a trial may change, saved now and put back by ``restore()``.

    ``objects``: what the caller named (name -> object: ``--restore NAME``, ``restore=``), each
    saved or the search refused before it starts. ``found``: what :func:`stateful_objects`
    found (label -> object), each saved while the copies fit in RAM_SHARE of the RAM available
    now, the others listed in ``not_restored`` with why. ``notes()`` says which is which.
    """

    def __init__(self, namespace: Optional[MutableMapping[str, Any]] = None,
                 objects: Optional[Mapping[Any, Any]] = None, found: Optional[Dict[str, Any]] = None):
        self.namespace = namespace
        # Every name, wherever the trial bound it (an assignment, exec, %time x = ..., a
        # function's global): the names it adds are deleted, those it rebinds or deletes are
        # put back. Saved by reference: a dict of the namespace's own objects costs nothing.
        self.names: Dict[str, Any] = dict(namespace) if namespace is not None else {}
        named = [_ObjectState(_restore_name(name, "--restore "), obj, _restore_name(name))
                 for name, obj in (objects or {}).items()]
        self.room = ram_available()
        budget = None if self.room is None else int(self.room * RAM_SHARE)
        used = sum(state.nbytes for state in named)
        if budget is not None and used > budget:
            labels = ", ".join(state.label for state in named)
            raise RestoreError(f"{labels}: a CPU copy of {size(used)} would not fit in the RAM available now "
                               f"({size(self.room)}, of which the copies may take {RAM_SHARE:.0%}); free "
                               f"RAM or restore less; nothing ran")
        found = {label: obj for label, obj in (found or {}).items()
                 if all(obj is not state.obj for state in named)}
        inner = _inner_modules([state.obj for state in named] + list(found.values()))
        self.found: List[_ObjectState] = []
        self.too_large: List[str] = []  # "label (its copy's size)"
        self.unreadable: List[str] = []  # "label (why)"
        for label, obj in found.items():
            if id(obj) in inner:
                continue
            try:
                state = _ObjectState(label, obj)
            except RestoreError as error:
                self.unreadable.append(f"{label} ({error.reason or error})")
                continue
            if budget is not None and used + state.nbytes > budget:
                self.too_large.append(f"{label} ({size(state.nbytes)})")
                continue
            used += state.nbytes
            self.found.append(state)
        for state in named:
            try:
                state.save()
            except Exception as error:  # a copy the RAM (or the address-space limit) refused
                raise RestoreError(f"{state.label}: its state could not be copied to the CPU "
                                   f"({describe(error)}); nothing ran") from None
        for state in list(self.found):
            try:
                state.save()
            except Exception as error:
                self.found.remove(state)
                self.unreadable.append(f"{state.label} (its copy to the CPU failed: {describe(error)})")
        self.objects: List[_ObjectState] = named + self.found
        self.generators = _Generators()

    def notes(self) -> List[str]:
        """What the report says of it: which objects are restored where some were found (the
        caller named the others), which are not and why."""
        notes = []
        if self.found:
            notes.append(f"restored after every trial: {', '.join(state.name for state in self.objects)} "
                         f"({command('--no-restore', 'restore=False')} leaves what "
                         f"{command('the cell', 'the step')} uses as the trials change it)")
        if self.too_large:
            notes.append(f"not restored, so each trial changes {'them' if self.too_large[1:] else 'it'}: "
                         f"{', '.join(self.too_large)}: a CPU copy would not fit in the RAM available now "
                         f"({size(self.room)}, of which the copies may take {RAM_SHARE:.0%})")
        if self.unreadable:
            notes.append(f"not restored, so each trial changes {'them' if self.unreadable[1:] else 'it'}: "
                         f"{', '.join(self.unreadable)}")
        return notes

    def restore(self) -> None:
        if self.namespace is not None:
            for name in set(self.namespace) - set(self.names):
                del self.namespace[name]
            for name, value in self.names.items():
                if self.namespace.get(name, _GONE) is not value:
                    self.namespace[name] = value
        failed = []
        for state in self.objects:  # one that cannot be put back stops the search, not the others
            try:
                state.restore()
            except Exception as error:
                failed.append(f"{state.label}: its state could not be put back after "
                              f"a trial ({describe(error)}), so the search stopped and it may keep what "
                              f"that trial changed; if the cell replaces its layers, do that "
                              + command("in a cell before %%find_batch", "before calling colab_gpu.find_batch()")
                              + (command(", or use --no-restore", ", or pass restore=False")
                                 if state in self.found else ""))
        self.generators.restore()
        if failed:
            raise RestoreError("; ".join(failed))

