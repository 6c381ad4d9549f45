"""The magics: parse a line, call the plain API, display the result. Nothing more.

Options are declared with IPython's ``magic_arguments``, so ``%gpu_status?`` shows them;
settings that outlive one call are traitlets on :class:`GPUMagics`, set with ``%config``.
How the options are read is in ``arguments.py``; %%find_batch's handling of the cell, in
``cell.py`` (checked before the search) and ``later_runs.py`` (the output of runs after the first).
"""
from __future__ import annotations

import ast
import copy
import dataclasses
import functools
import sys
import time
from typing import Callable

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument
from traitlets import Bool, Enum, Float, Int, TraitError, validate

from ..options import as_magic
from .arguments import WHOLE_NUMBER, Once, int_or_float, magic_arguments, number, parse
from .cell import a_number, checked_names, pipes_its_commands, syntax_error
from .later_runs import LaterRuns


def _run_cell(code, namespace: dict) -> None:
    """The user's cell, run by %%find_batch: its errors are its own (see _raised_in_cell)."""
    __tracebackhide__ = True
    exec(code, namespace)


def _raised_in_cell(error: BaseException) -> bool:
    """Whether ``error`` came out of the user's cell (its own ``import``, its own NVML call)."""
    frame = error.__traceback__
    while frame is not None and frame.tb_frame.f_code is not _run_cell.__code__:
        frame = frame.tb_next
    return frame is not None


def _friendly_errors(method: Callable) -> Callable:
    """Turn a missing package or an NVML failure into one line instead of a traceback; the
    messages inside spell options as the magic's. The user's cell's own errors are raised
    as they are: its traceback, not "pip install torch" for a misspelt ``from torch import``."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        __tracebackhide__ = True  # IPython hides this frame in a traceback of the user's error
        try:
            with as_magic():  # the messages name --headroom, not headroom=
                return method(self, *args, **kwargs)
        except UsageError:
            raise
        except ImportError as error:
            if _raised_in_cell(error):
                raise
            package = (error.name or "").partition(".")[0]  # matplotlib.figure: pip install matplotlib
            print(f"colab_gpu: {package or 'a module'} could not be imported ({error}); "
                  + (f"pip install {package}" if package else "install it with pip"), file=sys.stderr)
        except Exception as error:
            if not type(error).__name__.startswith("NVMLError") or _raised_in_cell(error):
                raise
            from ..devices.nvml import describe_nvml_error

            print(f"colab_gpu: {describe_nvml_error(error)}", file=sys.stderr)

    return wrapper


@magics_class
class GPUMagics(Magics):
    """See and tune the GPU from a notebook: %gpu_status, %alloc_conf, %clear_cache, %%find_batch."""

    output = Enum(
        ["auto", "text"], default_value="auto",
        help="How results are shown: 'auto' gives the front end both forms, so notebooks (Jupyter, "
             "Colab, VS Code) show the HTML card and a terminal shows text; 'text' forces plain "
             "text everywhere but in %gpu_status --live, which follows live_display.",
    ).tag(config=True)

    live_interval = Float(
        1.0, help="Seconds between two samples of %gpu_status --live (--interval overrides it), "
                  "up to 3600. NVML's counters change a few times a second at most.",
    ).tag(config=True)
    live_history = Int(
        3600, min=1, help="Samples the live monitor keeps for colab_gpu.history() and the final "
                          "chart (the oldest are dropped): an hour at one a second.",
    ).tag(config=True)
    live_display = Enum(
        ["auto", "widgets", "page", "terminal"], default_value="auto",
        help="How %gpu_status --live shows the monitor: 'auto' picks what updates in this front "
             "end (the live page in Colab, widgets in Jupyter/JupyterLab/VS Code, lines in a "
             "terminal); 'page' shows the local live page in an IFrame (the browser must run on "
             "this machine, or be Colab).",
    ).tag(config=True)
    live_lines = Int(
        0, min=0, help="In a terminal, %gpu_status --live ends its lines after this many, as "
                       "Ctrl-C does (the monitor stops only if that --live started it); 0 prints "
                       "until Ctrl-C.",
    ).tag(config=True)

    oom_doctor = Bool(
        True, help="After a cell fails with an out-of-memory error, show under its traceback why and what "
                   "to do (%explain_oom shows it again).",
    ).tag(config=True)

    @validate("live_interval")
    def _check_live_interval(self, proposal):
        """Refuse a bad value at %config, by the monitor's own rule, not at the next --live."""
        from ..live.sampler import check_interval

        try:
            return check_interval(proposal.value, "GPUMagics.live_interval")
        except ValueError as error:
            raise TraitError(str(error)) from None

    @validate("live_history")
    def _check_live_history(self, proposal):
        """traitlets' Int takes True as a whole number; the monitor refused it at the next --live."""
        from ..live.sampler import check_history

        try:
            return check_history(proposal.value, "GPUMagics.live_history")
        except (TypeError, ValueError) as error:
            raise TraitError(str(error)) from None

    def __init__(self, shell=None, **kwargs):
        super().__init__(shell=shell, **kwargs)
        self._session = None  # the LiveSession, once %gpu_status --live has run

    def close(self) -> None:
        """Undo on unload what the magics started: only the live monitor outlives a call."""
        self._stop_live_on_unload()

    def _show(self, result) -> None:
        from IPython.display import display

        if self.output == "text":
            from IPython.lib.pretty import pretty

            print(pretty(result))
        else:
            display(result)

    @magic_arguments()
    @argument("--json", action="store_true", help="Print the status as JSON, for scripts.")
    @argument("--live", action="store_true",
              help="Follow utilization, memory, power and temperature of every GPU while other "
                   "cells run: widgets in Jupyter, a live page in Colab, a line per sample in a "
                   "terminal. A second --live shows the running monitor again; one with another "
                   "--from, --demo or --interval is refused until --stop.")
    @argument("--stop", action="store_true",
              help="Stop the live monitor and show a summary of the whole run (and its chart in a notebook).")
    @argument("--interval", action=Once, type=number(int_or_float, "a number of seconds"), metavar="SECONDS",
              help="With --live: seconds between samples, up to 3600 (default: "
                   "GPUMagics.live_interval, 1).")
    @argument("--demo", action="store_true",
              help="With --live: replay a bundled real nvidia-smi trace (no GPU needed), "
                   "labelled as a replay.")
    @argument("--cells", action="store_true",
              help="With --live: after each cell, one line with its peak GPU memory and change "
                   "(none after a cell too short to be sampled). In a terminal the monitor then "
                   "samples in the background instead of printing a line per sample.")
    @argument("--from", action=Once, dest="path", metavar="FILE",
              help="Show the status recorded in an `nvidia-smi -q -x` XML file, an "
                   "`nvidia-smi --query-gpu=... --format=csv` log or a saved `nvidia-smi` table "
                   "instead of the live GPUs; "
                   "with --live, replay it one time step per sample.")
    @line_magic
    @_friendly_errors
    def gpu_status(self, line: str = ""):
        """Show the runtime, every GPU, who holds its memory, and what to do about it.

        Reads the GPUs through NVML, which never initializes CUDA: running this before
        ``%alloc_conf`` is safe. torch's allocator view appears only once your own code
        has started CUDA.
        """
        from ..gpu_status import status

        args = parse(self.gpu_status, line)
        if args.path is not None and not args.path.strip():  # `--from ""`, `--from {path}` of an empty path
            from ..devices.replay import ACCEPTED

            raise UsageError(f"--from {args.path!r}: give the recording's file name; {ACCEPTED}")
        if args.interval is not None:  # a wrong value is wrong with or without --live
            from ..live.sampler import check_interval

            try:
                check_interval(args.interval, "--interval")  # kept as typed, for start()'s messages
            except ValueError as error:
                raise UsageError(str(error)) from None
        if args.live or args.stop:
            return self._live(args)
        if args.interval is not None or args.demo or args.cells:
            raise UsageError("--interval, --demo and --cells go with --live, "
                             "e.g. %gpu_status --live --demo")
        result = status(path=args.path, shell=self.shell)
        if args.json:
            print(result.to_json())
        else:
            self._show(result)

    @magic_arguments()
    @argument("names", nargs="*", metavar="NAME",
              help="Variables to delete too (from your namespace and the output history), "
                   "before the garbage collection; no other variable is ever deleted.")
    @argument("--history", action="store_true",
              help="Clear the whole output history (Out, _, __, ___, _N), not only the "
                   "entries that hold tensors or modules.")
    @argument("--vars", action="store_true",
              help="Only show who holds memory (your variables ranked by the tensor bytes "
                   "they reach, what outputs and the last error hold beyond them, and memory "
                   "outside torch); free nothing.")
    @argument("--quiet", action="store_true",
              help="Print one line instead of the report: what was freed, the biggest holder, "
                   "and what no variable holds (outputs, the last error, the rest).")
    @line_magic
    @_friendly_errors
    def clear_cache(self, line: str = ""):
        """Give memory back, and say who still holds it.

        Drops the references IPython keeps to the last exception (they keep the failed
        cell's tensors alive), clears output-history entries that hold tensors or
        modules, deletes the variables NAME..., runs gc.collect() and, only once your
        code has put something on a GPU (a CUDA context), torch.cuda.synchronize(),
        frees cuBLAS's workspaces, empty_cache() and ipc_collect(). Then ranks your
        variables by the tensor memory they still hold. Never initializes CUDA.
        """
        from ..memory import ClearCacheError, clear_cache, memory_holders

        args = parse(self.clear_cache, line)
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
              help="Remove KEY from the configuration (repeatable, or KEY,KEY as torch separates keys).")
    @argument("--reset", action="store_true", help="Start from an empty configuration.")
    @argument("--check", action=Once, metavar="STRING",
              help="Validate STRING against the installed torch without applying anything.")
    @argument("--preset", action=Once, metavar="NAME",
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

        Validated against the installed torch before anything changes, and applied the
        way torch's state allows: through PYTORCH_CUDA_ALLOC_CONF / PYTORCH_ALLOC_CONF
        before CUDA starts, through torch's run-time setter afterwards (listing the keys
        that cannot change any more).
        """
        from ..allocator import AllocConfError, alloc_conf, installed_torch_version, version_of

        args = parse(self.alloc_conf, line)
        if args.keys:
            if any(value not in (None, False, []) for name, value in vars(args).items()
                   if name != "keys"):
                raise UsageError("--keys lists every key and takes no other option: "
                                 "%alloc_conf --keys")
            from ..allocator.render import render_keys

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

    def _live(self, args) -> None:
        """--live / --stop: check the options, then start (or reuse) and show the monitor."""
        from .. import live

        if args.stop:
            if args.live or args.json or args.demo or args.cells or args.path or args.interval is not None:
                raise UsageError("--stop takes no other option: %gpu_status --stop")
            record = live.stop("%gpu_status --stop")
            if record is None:
                print("colab_gpu: the live monitor is not running")
            else:
                self._show(record)
            return
        if args.json:
            raise UsageError("--json does not go with --live; colab_gpu.history() gives the samples")
        if args.demo and args.path:
            raise UsageError("--demo replays the bundled trace and --from FILE your recording: give one")
        ended = live.stopped_by_itself()
        if ended is not None:  # the new run replaces it: its summary now or never
            print(f"colab_gpu: the last live run stopped by itself at "
                  f"{time.strftime('%H:%M:%S', time.localtime(ended.stopped_at))}; its summary:")
            self._show(ended)
        # Both checked. GPUMagics.live_interval and live_history are for a new monitor: a running
        # one is shown again as it is; an explicit other --interval is refused as another source is.
        new = live.running() is None
        interval = self.live_interval if args.interval is None and new else args.interval
        try:
            sampler, started = live.start(path=args.path, demo=args.demo, interval=interval,
                                          history=self.live_history if new else None)
        except live.AlreadyRunning as error:
            raise UsageError(str(error)) from None
        except ValueError as error:  # the source cannot be read: no driver, a bad recording
            hint = "" if args.demo or args.path else "; %gpu_status --live --demo replays a recorded trace"
            if hint and _colab_without_gpu(self.shell):  # the card's own advice, in short
                from ..advice import COLAB_GPU_MENU

                hint = f"; for a GPU: {COLAB_GPU_MENU}" + hint
            raise UsageError(f"cannot start the live monitor: {error}{hint}") from None
        session = self._live_session()
        if not started:
            print("colab_gpu: " + live.running_words(sampler, "is already running"))
        hooked = args.cells and session.watch_cells()
        try:
            session.show(sampler, self.live_display, self.live_lines, started)
        except BaseException:
            if started:  # no monitor left running without its display
                live.stop()
            elif hooked:  # nor the --cells lines of a failed --live on a running one
                session.unwatch_cells()
            raise

    def _live_session(self):
        """This shell's live session, created once and stopped on unload."""
        if self._session is None:
            from ..live.notebook import LiveSession

            self._session = LiveSession(self.shell, self._show)
        return self._session

    def _stop_live_on_unload(self) -> None:
        """%unload_ext / %reload_ext end the monitor: show the summary --stop would have shown.
        Also one a script started with colab_gpu.live.start(), which made no LiveSession; never
        imported, the live package has no monitor to stop."""
        live = sys.modules.get(f"{__package__.rpartition('.')[0]}.live")
        record = live.stop("%unload_ext or %reload_ext colab_gpu") if live is not None else None
        if record is not None:
            self._show(record)

    @magic_arguments()
    @argument("message", nargs="*", metavar="MESSAGE",
              help="An out-of-memory message pasted from elsewhere, explained from its numbers alone "
                   "(or, with %%explain_oom, in the cell below).")
    @argument("--from", dest="path", metavar="FILE", help="Read the message from a log or traceback file.")
    @argument("--json", action="store_true", help="Print the report as JSON, for scripts.")
    @line_cell_magic
    @_friendly_errors
    def explain_oom(self, line: str = "", cell=None):
        """Why did the last cell run out of memory, and what to do? Its card again.

        With a MESSAGE (or --from FILE), explains that message from its numbers.
        """
        from .doctor import explain_oom_magic

        explain_oom_magic(self, line, cell)

    @magic_arguments("%find_batch")  # usage reads %%find_batch: it is a cell magic
    @argument("--var", action=Once, default="batch_size", metavar="NAME",
              help="The variable the cell reads its batch size from (default batch_size); set to the answer.")
    @argument("--start", action=Once, type=WHOLE_NUMBER,
              help="First size tried (default 2, or --multiple-of, or --max if smaller).")
    @argument("--max", action=Once, type=WHOLE_NUMBER, dest="maximum",
              help="Largest size tried (default 65536).")
    @argument("--steps", action=Once, type=WHOLE_NUMBER, default=3,
              help="Runs of the cell per trial, the first not timed unless it is the only one "
                   "(default 3); in throughput mode a fast cell runs until 0.1 s is timed, at "
                   "most 1000 runs.")
    @argument("--headroom", action=Once,
              help="Memory kept free: bytes like 512MiB, or a percentage of device memory like 10%% "
                   "(default: none; 10%% on the CPU without ulimit -v, where going past memory gets "
                   "the kernel killed).")
    @argument("--multiple-of", action=Once, type=WHOLE_NUMBER, default=1, dest="multiple_of", metavar="K",
              help="Only try multiples of K (tensor cores like multiples of 8).")
    @argument("--mode", action=Once, choices=["max", "throughput"], default="max",
              help="max: the largest size that fits; throughput: the fastest size that fits.")
    @argument("--restore", nargs="+", action="extend", default=[], metavar="NAME",
              help="Objects (model, optimizer, scheduler, tensor, your own random generator) whose "
                   "state is saved to the CPU and restored after every trial.")
    @argument("--device", action=Once, default="auto",
              help="auto (CUDA once your code has started it, else CPU), cpu, cuda or cuda:N.")
    @argument("-o", action="store_true", dest="return_result",
              help="Return the BatchResult (as %%timeit -o does): the report becomes the cell's "
                   "Out, and _ holds the result.")
    @cell_magic
    @_friendly_errors
    def find_batch(self, line: str = "", cell: str = ""):
        """Run the cell at several batch sizes; set the variable to the largest (or
        fastest) that fits.

        Every notebook name a trial binds, rebinds or deletes (also through %time or a
        function's global), the --restore objects and the random generators are put back
        after every trial; Ctrl-C stops and keeps the best size so far. A cell error
        other than out-of-memory stops the search and is shown.
        """
        from ..batch import RestoreError, SearchError, check_options, search_batch
        from ..batch.progress import NotebookProgress, TerminalProgress
        from ..batch.search import check_variable
        from ..batch.state import Snapshot
        from ..runtime import in_notebook
        from ..words import count, with_article

        __tracebackhide__ = True  # the user's error shows their cell's lines, not the magic's
        args = parse(self.find_batch, line)
        try:
            check_variable(args.var)  # before the hints below, which name it
        except SearchError as error:
            raise UsageError(str(error)) from None
        namespace = self.shell.user_ns
        held = namespace.get(args.var)
        if held is not None and not a_number(held):
            # The answer is written over it: a model or a tensor named by --var would be lost.
            raise UsageError(f"--var {args.var}: {args.var} holds {with_article(type(held).__name__)}, not a "
                             f"batch size, and the search would replace it with a number; name "
                             f"another variable, like "
                             + " or ".join(f"--var {name}" for name in ("batch_size", "bs") if name != args.var))
        missing = [name for name in args.restore if name not in namespace]
        if missing:
            raise UsageError(f"--restore: no variable named {', '.join(missing)} in the notebook")
        source = self.shell.transform_cell(cell)
        try:
            tree = ast.parse(source)  # once: the checks below all read this tree
        except SyntaxError as error:
            raise syntax_error(error, source, below=1) from None
        if not tree.body:  # comments only: every trial would time nothing
            raise UsageError("the cell has no code: put one training step under %%find_batch, "
                             "using the batch-size variable")
        # Registered with IPython like a cell, and one line down for the %%find_batch line:
        # a traceback of the user's error shows their line, numbered as in the cell. The cell's
        # number is the display hook's: IPython 9.8+ counts execution_count up before the cell runs.
        cell_number = getattr(self.shell.displayhook, "prompt_count", self.shell.execution_count)
        filename = self.shell.compile.cache(f"%%find_batch {line}\n{source}", cell_number)
        try:
            code = compile("\n" + source, filename, "exec")
        except SyntaxError as error:  # what only the compiler sees: a return outside a function
            raise syntax_error(error, source) from None
        warnings = checked_names(tree, args.var, namespace)
        options = dict(variable=args.var, mode=args.mode, start=args.start, maximum=args.maximum,
                       steps=args.steps, headroom=args.headroom, multiple_of=args.multiple_of,
                       device=args.device)
        try:  # a bad option or --restore object is one line, not after the warnings
            check_options(**options)
            snapshot = Snapshot(namespace, {name: namespace[name] for name in args.restore})
        except (SearchError, RestoreError) as error:
            raise UsageError(str(error)) from None
        for warning in warnings:
            print(f"colab_gpu: {warning}", file=sys.stderr)

        # the cell's output is shown for its first run only
        later_runs = LaterRuns(self.shell, piped=pipes_its_commands(tree))

        def step(size: int) -> None:
            __tracebackhide__ = True
            namespace[args.var] = size
            with as_magic(False):  # the user's code is Python: its calls speak it
                _run_cell(code, namespace)

        notebook = in_notebook() and self.output != "text"
        progress = NotebookProgress(keep_report=not args.return_result) if notebook else TerminalProgress()
        try:
            result = search_batch(step, snapshot, progress=progress, around_run=later_runs.around_run,
                                  **options)
        except (SearchError, RestoreError) as error:
            raise UsageError(str(error)) from None
        if result.answer is not None:
            namespace[args.var] = result.answer
        hidden = later_runs.with_output
        if hidden:
            print(f"colab_gpu: the cell's output is shown for its first run; "
                  f"{count(hidden, 'later run')} had output too, hidden", file=sys.stderr)
        if args.return_result:  # the cell's Out: every formatter runs, so text is asked of the result
            return dataclasses.replace(result, text_only=True) if self.output == "text" else result
        if not notebook:  # in a notebook the progress display has become the report
            self._show(result)


def _colab_without_gpu(shell) -> bool:
    """A Colab runtime with no NVIDIA driver: a CPU or TPU runtime, where a GPU is a menu away."""
    from ..devices.nvml import nvidia_driver_present
    from ..runtime import COLAB, detect_platform

    return detect_platform(shell) == COLAB and not nvidia_driver_present()


def _loaded(shell) -> "GPUMagics | None":
    instance = shell.magics_manager.registry.get(GPUMagics.__name__)
    return instance if isinstance(instance, GPUMagics) else None


def _valid_config(config):
    """``config`` without the GPUMagics settings GPUMagics refuses, each named on stderr.

    %config merges a line into the shell's config even when GPUMagics refused it: without
    this, the next %load_ext or %reload_ext would fail on that value.
    """
    from traitlets.config import Config

    config = copy.deepcopy(config)
    settings = config.get(GPUMagics.__name__, {})
    probe = GPUMagics()
    known = probe.traits(config=True)
    for name, value in list(settings.items()):
        if name not in known:  # traitlets warns of a misspelt name, with a did-you-mean
            continue
        try:
            # Loaded as traitlets loads it: `ipython --GPUMagics.live_interval=0.5` gives a string
            # to convert, which a plain setattr refused ("expected a float, not the
            # DeferredConfigString").
            probe.update_config(Config({GPUMagics.__name__: {name: value}}))
        except (TraitError, ValueError) as error:  # ValueError: given twice on the command line
            del settings[name]
            print(f"colab_gpu: ignored a setting: {error}", file=sys.stderr)
    return config


def register(shell) -> GPUMagics:
    """Register the magics once per shell; a second load returns the first instance."""
    instance = _loaded(shell)
    if instance is None:
        instance = GPUMagics(shell=shell, config=_valid_config(shell.config))
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
    # IPython's Magics.__init__ added the instance to the shell's configurables, which %config
    # lists and sets: left there, %config listed GPUMagics once per load, and repeated a refused
    # value's error as often.
    configurables = getattr(shell, "configurables", None)
    if configurables is not None:
        configurables[:] = [configurable for configurable in configurables if configurable is not instance]
