"""The magics: parse a line, call the plain API, display the result. Nothing more.

Options are declared with IPython's ``magic_arguments``, so ``%gpu_status?`` shows them;
settings that outlive one call are traitlets on :class:`GPUMagics`, set with ``%config``.
"""
from __future__ import annotations

import functools
import sys
from typing import Callable, List

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
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
        from .status import status

        args = parse_argstring(self.gpu_status, line)
        result = status(path=args.path, shell=self.shell)
        if args.json:
            print(result.to_json())
        else:
            self._show(result)

    @magic_arguments()
    @argument("--var", default="batch_size", metavar="NAME",
              help="The variable the cell reads its batch size from (default batch_size); set to the answer.")
    @argument("--start", type=int, help="First size tried (default 2, or --multiple-of).")
    @argument("--max", type=int, dest="maximum", help="Largest size tried (default 65536).")
    @argument("--steps", type=int, default=3,
              help="Runs of the cell per trial, the first not timed (default 3).")
    @argument("--headroom", default="0",
              help="Memory kept free: bytes like 512MiB, or a percentage of device memory like 10%%.")
    @argument("--multiple-of", type=int, default=1, dest="multiple_of", metavar="K",
              help="Only try multiples of K (tensor cores like multiples of 8).")
    @argument("--mode", choices=["max", "throughput"], default="max",
              help="max: the largest size that fits; throughput: the fastest size that fits.")
    @argument("--restore", nargs="+", default=[], metavar="NAME",
              help="Objects (model, optimizer, scheduler, tensor) whose state is saved to the CPU and "
                   "restored after every trial.")
    @argument("--device", default="auto",
              help="auto (CUDA once your code has started it, else CPU), cpu, cuda or cuda:N.")
    @cell_magic
    @_friendly_errors
    def find_batch(self, line: str = "", cell: str = ""):
        """Run the cell at several batch sizes; set the variable to the largest (or fastest) that fits.

        Names the cell assigns, the --restore objects and the random generators are put back
        after every trial; Ctrl-C stops and keeps the best size so far. A cell error other
        than out-of-memory stops the search and is shown.
        """
        from .batch import RestoreError, SearchError, search_batch
        from .batch.progress import NotebookProgress, TerminalProgress, in_notebook
        from .batch.render import chart_png
        from .batch.state import Snapshot, assigned_names

        args = parse_argstring(self.find_batch, line)
        namespace = self.shell.user_ns
        missing = [name for name in args.restore if name not in namespace]
        if missing:
            raise UsageError(f"--restore: no variable named {', '.join(missing)} in the notebook")
        source = self.shell.transform_cell(cell)
        code = compile(source, "<%%find_batch cell>", "exec")

        def step(size: int) -> None:
            namespace[args.var] = size
            exec(code, namespace)

        notebook = in_notebook() and self.output != "text"
        progress = NotebookProgress() if notebook else TerminalProgress()
        try:
            snapshot = Snapshot(namespace, assigned_names(source) | {args.var},
                                {name: namespace[name] for name in args.restore})
            result = search_batch(
                step, snapshot, variable=args.var, mode=args.mode, start=args.start,
                maximum=args.maximum, steps=args.steps, headroom=args.headroom,
                multiple_of=args.multiple_of, device=args.device, progress=progress)
        except (SearchError, RestoreError) as error:
            raise UsageError(str(error)) from None
        if result.answer is not None:
            namespace[args.var] = result.answer
        if notebook:
            from IPython.display import Image, display

            progress.finish(result)
            chart = chart_png(result)
            if chart is not None:
                display(Image(data=chart, format="png"))
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
