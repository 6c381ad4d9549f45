"""The package's structural rules, read from its source (every .py of colab_gpu/ and tests/):

1. No module uses another module's ``_private`` name: a name a sibling uses is public and in
   its module's ``__all__``. Checked: ``from x import _y``, ``import x._y``, ``x._y`` on a
   module of the project (read or assigned), and ``getattr``/``setattr``/``monkeypatch.setattr``
   of a module and ``"_y"`` (or of ``"colab_gpu.x._y"``).
2. Layers: the shared core knows no feature; a feature uses the core, never another feature;
   the top layer (the magics and the package's ``__init__``) may use anything.
3. What the kernel keeps between calls is a field of ``colab_gpu.state.session``; no module
   rebinds a global of its own.

Imports inside functions and under ``if TYPE_CHECKING:`` count as any other.
"""
from __future__ import annotations

import ast
import dataclasses
import pathlib
import threading
from typing import Dict, Iterator, List, NamedTuple, Optional

from conftest import ROOT

# The layers, written down once: each entry is a module or subpackage of colab_gpu/.
# Core: what several features share and none owns. memory/ is core because %clear_cache and
# the out-of-memory doctor both rank its holders; torch_view is torch's numbering and memory
# of the GPUs (the card, the live monitor, the readings); torch_allocator/ is what torch's
# allocator accepts and runs with (%alloc_conf, the advice, memory/'s block rounding); oom
# tells an out-of-memory error (%%find_batch, %clear_cache, the doctor); state is what the
# kernel keeps between calls, each part written by the module it belongs to.
CORE = frozenset({"errors", "words", "runtime", "devices", "cuda", "cuda_order", "torch_view", "oom",
                  "torch_allocator", "memory", "advice", "render", "spelling", "host", "data", "state"})
FEATURES = frozenset({"gpu_status", "allocator", "batch", "live", "doctor", "loader", "distributed"})
TOP = frozenset({"__init__", "magics"})

PACKAGE = ROOT / "colab_gpu"
TESTS = ROOT / "tests"


def module_name(path: pathlib.Path) -> str:
    """colab_gpu/memory/clear.py -> colab_gpu.memory.clear; tests/conftest.py -> conftest."""
    parts = list(path.relative_to(TESTS if path.is_relative_to(TESTS) else ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


SOURCES = sorted(PACKAGE.rglob("*.py")) + sorted(TESTS.rglob("*.py"))
MODULES = {module_name(path) for path in SOURCES}  # the project's: colab_gpu's and the tests' own


def is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def layer_entry(module: str) -> str:
    """colab_gpu.memory.clear -> memory; colab_gpu -> __init__."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


class Import(NamedTuple):
    line: int
    module: str  # the project module imported, or imported from
    name: Optional[str]  # the name imported from it; None where a module itself is imported
    bound: str  # the local name the import binds
    bound_to: Optional[str]  # the module that name is, if a module


def imports(path: pathlib.Path, tree: ast.AST) -> Iterator[Import]:
    """Every import of a project module in the file. A name that is itself a submodule
    (``from .. import live``) is an import of that module."""
    here = module_name(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in MODULES:
                    top = alias.name.partition(".")[0]
                    yield Import(node.lineno, alias.name, None, alias.asname or top,
                                 alias.name if alias.asname else top)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if source not in MODULES:
                continue
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                if submodule in MODULES:
                    yield Import(node.lineno, submodule, None, alias.asname or alias.name, submodule)
                else:
                    yield Import(node.lineno, source, alias.name, alias.asname or alias.name, None)


def private_uses(path: pathlib.Path, text: Optional[str] = None) -> List[str]:
    """Where the file at ``path`` (or ``text`` standing for it) uses another module's private name."""
    tree = ast.parse(path.read_text() if text is None else text, str(path))
    where = path.relative_to(ROOT)
    found = []
    bound: Dict[str, str] = {}
    for each in imports(path, tree):
        if any(is_private(part) for part in each.module.split(".")):
            found.append(f"{where}:{each.line}: import of private module {each.module}")
        if each.name is not None and is_private(each.name):
            found.append(f"{where}:{each.line}: from {each.module} import {each.name}")
        if each.bound_to is not None:
            bound[each.bound] = each.bound_to

    def module_of(node: ast.AST) -> Optional[str]:
        """The project module an expression names (``colab_gpu.devices``, ``nvml``), if any."""
        if isinstance(node, ast.Name):
            return bound.get(node.id)
        if isinstance(node, ast.Attribute):
            outer = module_of(node.value)
            if outer is not None and f"{outer}.{node.attr}" in MODULES:
                return f"{outer}.{node.attr}"
        return None

    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and is_private(node.attr):
            module = module_of(node.value)
            if module is not None:
                found.append(f"{where}:{node.lineno}: {module}.{node.attr}")
        elif isinstance(node, ast.Call) and len(node.args) >= 2:
            function = node.func
            called = function.id if isinstance(function, ast.Name) else getattr(function, "attr", None)
            if called not in ("getattr", "setattr", "delattr", "hasattr"):
                continue
            target, attribute = node.args[0], node.args[1]
            if isinstance(target, ast.Constant) and isinstance(target.value, str):  # setattr("x._y", v)
                module, _, name = target.value.rpartition(".")
                if module in MODULES and is_private(name):
                    found.append(f"{where}:{node.lineno}: {called}({target.value!r})")
            elif isinstance(attribute, ast.Constant) and isinstance(attribute.value, str) \
                    and is_private(attribute.value):
                module = module_of(target)
                if module is not None:
                    found.append(f"{where}:{node.lineno}: {called}({module}, {attribute.value!r})")
    return sorted(set(found), key=found.index)


def test_the_layers_name_every_part_of_the_package():
    """A new module or subpackage is put in a layer; a renamed one is renamed in the lists above."""
    parts = {layer_entry(module_name(path)) for path in PACKAGE.rglob("*.py")}
    assert parts - (CORE | FEATURES | TOP) == set()
    assert not CORE & FEATURES and not (CORE | FEATURES) & TOP


def test_no_module_uses_another_modules_private_names():
    found = [use for path in SOURCES for use in private_uses(path)]
    assert found == [], "private names used from another module:\n" + "\n".join(found)


def test_the_core_knows_no_feature_and_no_feature_another():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        importer = layer_entry(module_name(path))
        if importer in TOP:
            continue
        for line, module in sorted({(each.line, each.module) for each in imports(path, ast.parse(path.read_text()))}):
            imported = layer_entry(module)
            if imported != importer and imported not in CORE:
                layer = "core" if importer in CORE else "feature"
                found.append(f"{path.relative_to(ROOT)}:{line}: {layer} {importer} imports {module}")
    assert found == [], "imports across layers:\n" + "\n".join(found)


def test_what_the_kernel_keeps_is_in_the_session_alone():
    """State kept between calls is a field of colab_gpu.state.session, which a test resets,
    never a module global a function rebinds; reset() makes each field a fresh import's."""
    from colab_gpu.state import Session

    rebound = [f"{path.relative_to(ROOT)}:{node.lineno}: global {', '.join(node.names)}"
               for path in sorted(PACKAGE.rglob("*.py")) for node in ast.walk(ast.parse(path.read_text()))
               if isinstance(node, ast.Global)]
    assert rebound == [], "module globals rebound:\n" + "\n".join(rebound)
    used, fresh = Session(), Session()
    used.driver_answers[("0", "PCI_BUS_ID", frozenset())] = ((), None)
    used.visible_seen["before"], used.given_to_torch, used.live_shown = "0", "expandable_segments:True", (1, 2)
    used.live_cleanups.append(print)
    lock = used.live_lock
    used.reset("visible_seen")
    assert used.visible_seen == {} and used.given_to_torch == "expandable_segments:True"
    used.reset()
    lock_type = type(threading.Lock())
    for field in dataclasses.fields(Session):
        now, new = getattr(used, field.name), getattr(fresh, field.name)
        if isinstance(new, lock_type):
            assert isinstance(now, lock_type) and not now.locked(), field.name
        else:
            assert now == new, field.name
    assert used.live_lock is not lock


def test_the_private_name_check_sees_each_form_it_names():
    """In a test file of the project, each form of use is found; a class's attribute is not."""
    text = ("import colab_gpu.memory\nfrom colab_gpu import devices\nfrom colab_gpu.devices import nvml as n\n"
            "from colab_gpu.memory.walk import _LEAVES\n"
            "def f(monkeypatch):\n"
            "    from colab_gpu.devices import _default_source\n"
            "    colab_gpu.memory.walk._FRAME_LOCALS\n    devices._default_source = None\n"
            "    monkeypatch.setattr(n, '_driver_loaded', True)\n"
            "    monkeypatch.setattr('colab_gpu.devices._default_source', None)\n"
            "    colab_gpu.memory.Holders._render\n")  # a class's attribute: no module's name
    found = private_uses(TESTS / "test_sample.py", text)
    assert sorted(use.split(": ", 1)[1] for use in found) == sorted([
        "from colab_gpu.memory.walk import _LEAVES", "from colab_gpu.devices import _default_source",
        "colab_gpu.memory.walk._FRAME_LOCALS", "colab_gpu.devices._default_source",
        "setattr(colab_gpu.devices.nvml, '_driver_loaded')", "setattr('colab_gpu.devices._default_source')"])
