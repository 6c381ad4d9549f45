"""Leave the notebook as it was: names, model/optimizer state, random generators.

A restore point is taken once before the search and restored after every trial, so each trial
starts from the same weights and random stream, and nothing a trial left behind (tensors
bound to the notebook's names, gradients, optimizer state) keeps memory alive.
"""
from __future__ import annotations

import ast
import random
import sys
from typing import Any, Dict, Hashable, List, Mapping, MutableMapping, Optional, Set

from ..errors import UserError
from ..oom import describe
from ..spelling import command
from ..runtime import cuda_torch
from ..words import with_article


class RestoreError(UserError, ValueError):
    """An object given to --restore whose state cannot be saved."""


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


def _restore_label(name) -> str:
    """A --restore object as its caller named it: ``--restore model`` in the magic; in Python
    ``restore`` for one object, ``restore[0]`` or ``restore['model']`` for a list's or a dict's."""
    return command(f"--restore {name}", "restore" + ("" if name is None else f"[{name!r}]"))


class _ObjectState:
    """One --restore object: anything with state_dict()/load_state_dict(), a tensor, or a
    random generator of the user's own (``rng = np.random.default_rng(0)``)."""

    def __init__(self, name: Hashable, obj: Any):  # as the caller keyed it (see _restore_label)
        self.label, self.obj = _restore_label(name), obj
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
            self.saved = _to_cpu(obj)
        elif has_state_dict:
            try:
                self.saved = _to_cpu(obj.state_dict(), self.from_cpu)
            except Exception as error:  # the object's own failure, before anything ran
                raise RestoreError(f"{self.label}: its state_dict() raised "
                                   f"{describe(error)}; nothing ran") from None
        elif self.random is not None:  # the user's own generator: its stream is put back
            self.saved = self.random[0]()
        else:
            kinds = "models, optimizers, schedulers, tensors or random generators"
            passed = with_article(type(obj).__name__) + (f" ({obj!r:.40})" if isinstance(obj, str) else "")
            raise RestoreError(f"{self.label}: {passed} has no state_dict() / load_state_dict(); "
                               + command(f"--restore takes the names of variables holding {kinds}",
                                         f"restore takes the objects themselves (one, a list or a dict): {kinds}"))
        parameters = getattr(obj, "parameters", None)
        self.grads = ([(p, _to_cpu(p.grad)) for p in parameters()] if callable(parameters) else [])
        if self.is_tensor and obj.is_leaf and obj.requires_grad:  # a weight trained by hand
            self.grads = [(obj, _to_cpu(obj.grad))]
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


_GONE = object()  # a name the trial deleted


class RestorePoint:
    """Everything a trial may change, saved now and put back by ``restore()``."""

    def __init__(self, namespace: Optional[MutableMapping[str, Any]] = None,
                 objects: Optional[Mapping[Any, Any]] = None):
        self.namespace = namespace
        # Every name, wherever the trial bound it (an assignment, exec, %time x = ..., a
        # function's global): the names it adds are deleted, those it rebinds or deletes are
        # put back. Saved by reference: a dict of the namespace's own objects costs nothing.
        self.names: Dict[str, Any] = dict(namespace) if namespace is not None else {}
        self.objects: List[_ObjectState] = [_ObjectState(name, obj) for name, obj in (objects or {}).items()]
        self.generators = _Generators()

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
                              + command("in a cell before %%find_batch", "before calling colab_gpu.find_batch()"))
        self.generators.restore()
        if failed:
            raise RestoreError("; ".join(failed))

