"""The magics: parse a line, call the plain API, display the result. Nothing more.

Options are declared with IPython's ``magic_arguments``, so ``%gpu_status?`` shows them;
settings that outlive one call are traitlets on :class:`GPUMagics`, set with ``%config``.
"""
from __future__ import annotations

import functools
import sys
from typing import Callable, List

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring
from traitlets import Enum


def _friendly_errors(method: Callable) -> Callable:
    """Turn a missing package or an NVML failure into one line instead of a traceback."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except UsageError:
            raise
        except ImportError as error:
            print(f"colab_gpu: {error.name or 'a module'} could not be imported ({error}); "
                  f"install it with pip", file=sys.stderr)
        except Exception as error:
            if not type(error).__name__.startswith("NVMLError"):
                raise
            from .devices.nvml import describe_nvml_error

            print(f"colab_gpu: {describe_nvml_error(error)}", file=sys.stderr)

    return wrapper


@magics_class
class GPUMagics(Magics):
    """See and tune the GPU from a notebook: %gpu_status, %alloc_conf, %clear_cache, %%find_batch."""

    output = Enum(
        ["auto", "text", "html"], default_value="auto",
        help="How results are shown: 'auto' lets the front end choose (an HTML card in "
             "notebooks, text in a terminal); 'text' forces plain text everywhere.",
    ).tag(config=True)

    def __init__(self, shell=None, **kwargs):
        super().__init__(shell=shell, **kwargs)
        self._cleanups: List[Callable[[], None]] = []

    def add_cleanup(self, cleanup: Callable[[], None]) -> None:
        """Something to undo on unload (a hook, a thread); run last-added first."""
        self._cleanups.append(cleanup)

    def close(self) -> None:
        while self._cleanups:
            self._cleanups.pop()()

    def _show(self, result) -> None:
        from IPython.display import display

        if self.output == "text":
            from IPython.lib.pretty import pretty

            print(pretty(result))
        else:
            display(result)

    @magic_arguments()
    @argument("--json", action="store_true", help="Print the status as JSON, for scripts.")
    @argument("--from", dest="path", metavar="FILE",
              help="Show the status recorded in an `nvidia-smi -q -x` XML file or an "
                   "`nvidia-smi --query-gpu=... --format=csv` log instead of the live GPUs.")
    @line_magic
    @_friendly_errors
    def gpu_status(self, line: str = ""):
        """Show the runtime, every GPU, who holds its memory, and what to do about it.

        Reads the GPUs through NVML, which never initializes CUDA: running this before
        ``%alloc_conf`` is safe. torch's allocator view appears only once your own code
        has started CUDA.
        """
        from .gpu_status import status

        args = parse_argstring(self.gpu_status, line)
        result = status(path=args.path, shell=self.shell)
        if args.json:
            print(result.to_json())
        else:
            self._show(result)

    @magic_arguments()
    @argument("names", nargs="*", metavar="NAME",
              help="Variables to delete first (from your namespace and the output history); "
                   "no other variable is ever deleted.")
    @argument("--history", action="store_true",
              help="Clear the whole output history (Out, _, __, ___, _N), not only the "
                   "entries that hold tensors or modules.")
    @argument("--vars", action="store_true",
              help="Only show who holds memory (your variables ranked by the tensor bytes "
                   "they reach, and memory outside torch); free nothing.")
    @argument("--quiet", action="store_true", help="Print one line instead of the report.")
    @line_magic
    @_friendly_errors
    def clear_cache(self, line: str = ""):
        """Give memory back, and say who still holds it.

        Drops the references IPython keeps to the last exception (they keep the failed
        cell's tensors alive), clears output-history entries that hold tensors or modules,
        deletes the variables NAME..., runs gc.collect() and, only if CUDA is already
        initialized, torch.cuda.synchronize(), empty_cache() and ipc_collect(). Then ranks
        your variables by the tensor memory they still hold. Never initializes CUDA.
        """
        from .memory import ClearCacheError, clear_cache, memory_holders

        args = parse_argstring(self.clear_cache, line)
        if args.vars and (args.names or args.history):
            raise UsageError("--vars only shows who holds memory; it takes no NAME or --history")
        if args.vars:
            result = memory_holders(shell=self.shell)
        else:
            try:
                result = clear_cache(*args.names, history=args.history, shell=self.shell)
            except ClearCacheError as error:
                raise UsageError(str(error)) from None
        if args.quiet:
            print(result.summary())
        else:
            self._show(result)


    @magic_arguments()
    @argument("settings", nargs="*",
              help="Settings as key=value (max_split_size_mb=128 expandable_segments=True) or "
                   "in torch's own form (max_split_size_mb:128,expandable_segments:True); "
                   "they merge with what is already set.")
    @argument("--unset", action="append", default=[], metavar="KEY",
              help="Remove KEY from the configuration (repeatable).")
    @argument("--reset", action="store_true", help="Start from an empty configuration.")
    @argument("--check", metavar="STRING",
              help="Validate STRING against the installed torch without applying anything.")
    @argument("--preset", metavar="NAME",
              help="A named configuration with its explanation: fragmentation, "
                   "fragmentation-old-torch, reclaim, async.")
    @argument("--save", action="store_true",
              help="Also save the result; %%load_ext colab_gpu applies it after a restart, "
                   "before CUDA starts.")
    @argument("--forget", action="store_true", help="Delete the saved setting.")
    @argument("--keys", action="store_true",
              help="List every allocator key with its type, default and torch versions.")
    @argument("--json", action="store_true", help="Print the result as JSON, for scripts.")
    @line_magic
    @_friendly_errors
    def alloc_conf(self, line: str = ""):
        """Show, check or change PyTorch's CUDA caching-allocator configuration.

        Validated against the installed torch before anything changes, and applied the way
        torch's state allows: through PYTORCH_CUDA_ALLOC_CONF / PYTORCH_ALLOC_CONF before
        CUDA starts, through torch's run-time setter afterwards (listing the keys that
        cannot change any more).
        """
        from .allocator import AllocConfError, alloc_conf, installed_torch_version, version_of

        args = parse_argstring(self.alloc_conf, line)
        if args.keys:
            from .allocator.render import render_keys

            print(render_keys(version_of(installed_torch_version())))
            return
        try:
            result = alloc_conf(args.settings, unset=args.unset, reset=args.reset,
                                preset=args.preset, check=args.check, save=args.save,
                                forget=args.forget)
        except AllocConfError as error:
            raise UsageError(str(error)) from None
        if args.json:
            print(result.to_json())
        else:
            self._show(result)


def _loaded(shell) -> "GPUMagics | None":
    instance = shell.magics_manager.registry.get(GPUMagics.__name__)
    return instance if isinstance(instance, GPUMagics) else None


def register(shell) -> GPUMagics:
    """Register the magics once per shell; a second load returns the first instance."""
    instance = _loaded(shell)
    if instance is None:
        instance = GPUMagics(shell=shell)
        shell.register_magics(instance)
    return instance


def unregister(shell) -> None:
    """Remove the magics and undo every hook and thread they added."""
    instance = _loaded(shell)
    if instance is None:
        return
    instance.close()
    manager = shell.magics_manager
    for kind, names in instance.magics.items():
        table = manager.magics[kind]
        for name in names:
            if getattr(table.get(name), "__self__", None) is instance:
                del table[name]
    del manager.registry[GPUMagics.__name__]
