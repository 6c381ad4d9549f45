"""colab_gpu: see and tune the GPU inside a notebook.

``%load_ext colab_gpu`` adds ``%gpu_status``, ``%alloc_conf``, ``%clear_cache``,
``%%find_batch``, ``%tune_loader``, ``%explain_oom`` (and its card under every cell that
runs out of memory) and ``%%distributed``. Each is a thin layer over the plain functions
exported here, which scripts and tests use directly. Importing this package is cheap: torch, matplotlib,
ipywidgets and even IPython are imported only when a feature needs them, and nothing here
ever initializes CUDA.
"""
from __future__ import annotations

import importlib

__version__ = "0.1.0"

# Public name -> module that defines it, imported on first use (PEP 562).
_LAZY = {
    "status": "colab_gpu.gpu_status",
    "Status": "colab_gpu.torch_view",
    "detect_runtime": "colab_gpu.runtime",
    "open_source": "colab_gpu.devices",
    "clear_cache": "colab_gpu.memory",
    "memory_holders": "colab_gpu.memory",
    "ClearReport": "colab_gpu.memory",
    "Holders": "colab_gpu.memory",
    "alloc_conf": "colab_gpu.allocator",
    "AllocConfResult": "colab_gpu.allocator",
    "AllocConfError": "colab_gpu.allocator",
    "history": "colab_gpu.live",
    "live_url": "colab_gpu.live",
    "find_batch": "colab_gpu.batch",
    "BatchResult": "colab_gpu.batch",
    "plan_batch": "colab_gpu.batch",
    "Plan": "colab_gpu.batch",
    "tune_loader": "colab_gpu.loader",
    "LoaderTuning": "colab_gpu.loader",
    "is_out_of_memory": "colab_gpu.oom",
    "launch": "colab_gpu.distributed",
    "RankError": "colab_gpu.distributed",
    "UserError": "colab_gpu.errors",
    "explain_oom": "colab_gpu.doctor",
    "OomReport": "colab_gpu.doctor",
}

# Subpackages a hint tells a script to use (colab_gpu.live.start(demo=True) on the status card,
# colab_gpu.allocator.KEYS): reachable after a plain `import colab_gpu`, imported on first use.
_SUBPACKAGES = ("allocator", "live")

__all__ = sorted(_LAZY) + ["load_ipython_extension", "unload_ipython_extension"]


def __getattr__(name: str):
    if name in _SUBPACKAGES:
        return importlib.import_module(f"{__name__}.{name}")  # which also sets it here
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'colab_gpu' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    """What completes after ``colab_gpu.``: the API, and the subpackages its hints name
    (``colab_gpu.live.start(demo=True)``), which __all__ leaves out."""
    return sorted(__all__ + list(_SUBPACKAGES) + ["__version__"])


def _check_shell(shell, function: str) -> None:
    """``colab_gpu.load_ipython_extension(get_ipython())`` in a plain ``python`` passes None:
    say what to do instead of "'NoneType' object has no attribute 'magics_manager'"."""
    if not hasattr(shell, "magics_manager"):
        raise TypeError(f"colab_gpu.{function}() takes the running IPython shell (get_ipython()), "
                        f"not {shell!r}: in IPython or a notebook run %load_ext colab_gpu; without "
                        f"IPython call colab_gpu.status(), colab_gpu.alloc_conf(), "
                        f"colab_gpu.clear_cache() or colab_gpu.find_batch() directly")


def load_ipython_extension(shell) -> None:
    """Register the magics; loading twice keeps the first registration.

    At the first load in a process it also applies the allocator setting saved with
    ``%alloc_conf --save`` (only before CUDA starts) and prints a line saying so, or why not.

    Parameters
    ----------
    shell : InteractiveShell
        The running IPython shell (``get_ipython()``); ``%load_ext colab_gpu`` passes it.

    Raises
    ------
    TypeError
        ``shell`` is no IPython shell (None in a plain ``python``).
    """
    _check_shell(shell, "load_ipython_extension")
    from .allocator import apply_saved
    from .magics import register
    from .magics.doctor import watch
    from .spelling import as_magic

    register(shell)
    watch(shell)  # the out-of-memory card under a failed cell
    with as_magic():  # %load_ext's message names %alloc_conf's options
        message = apply_saved()  # a setting saved with `%alloc_conf --save`, before CUDA starts
    if message:
        print(message)


def unload_ipython_extension(shell) -> None:
    """Remove every magic, hook and thread the extension added.

    Parameters
    ----------
    shell : InteractiveShell
        The running IPython shell (``get_ipython()``); ``%unload_ext colab_gpu`` passes it.

    Raises
    ------
    TypeError
        ``shell`` is no IPython shell (None in a plain ``python``).
    """
    _check_shell(shell, "unload_ipython_extension")
    from .magics import unregister
    from .magics.doctor import unwatch

    unwatch(shell)
    unregister(shell)
