"""The magics: parse a line, call the plain API, display the result. Nothing more.

Options are declared with IPython's ``magic_arguments``, so ``%gpu_status?`` shows them;
settings that outlive one call are traitlets on :class:`GPUMagics`, set with ``%config``.
How the options are read is in ``arguments.py``; %%find_batch's handling of the cell, in
``cell.py`` (checked before the search, then run) and ``later_runs.py`` (the output of runs
after the first); %gpu_status --live's, in ``live.py``; %%distributed's, in ``distributed.py``.
An error in what the user asked for (:class:`~colab_gpu.errors.UserError`) becomes one
UsageError line here, in one place.
"""
from __future__ import annotations

import copy
import dataclasses
import functools
import sys
from typing import TYPE_CHECKING, Callable

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument
from traitlets import Bool, Enum, Float, Int, TraitError, validate

from ..errors import UserError
from ..spelling import as_magic
from .arguments import WHOLE_NUMBER, Once, int_or_float, magic_arguments, number, parse
from .cell import plan_cell, prepare, raised_in_cell, search_cell
from .live import check_combination, start_and_show, stop_and_show, stop_on_unload
from .loader import tune_and_show

if TYPE_CHECKING:
    from ..render.shown import Shown


def _one_line(error: BaseException) -> str:
    """The error's message on one line, as a UsageError shows it."""
    return " ".join(str(error).splitlines()) or type(error).__name__


def _friendly_errors(method: Callable) -> Callable:
    """Turn an error in what the user asked for (a UserError), a missing package or an NVML
    failure into one line instead of a traceback; the messages inside spell options as the
    magic's. The user's cell's own errors are raised as they are: its traceback, not "pip
    install torch" for a misspelt ``from torch import``."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        __tracebackhide__ = True  # IPython hides this frame in a traceback of the user's error
        try:
            with as_magic():  # the messages name --headroom, not headroom=
                return method(self, *args, **kwargs)
        except UsageError:
            raise
        except UserError as error:  # the one place an API's refusal becomes the magic's
            if raised_in_cell(error):
                raise
            raise UsageError(_one_line(error)) from None
        except ImportError as error:
            if raised_in_cell(error):
                raise
            package = (error.name or "").partition(".")[0]  # matplotlib.figure: pip install matplotlib
            print(f"colab_gpu: {package or 'a module'} could not be imported ({error}); "
                  + (f"pip install {package}" if package else "install it with pip"), file=sys.stderr)
        except Exception as error:
            if not type(error).__name__.startswith("NVMLError") or raised_in_cell(error):
                raise
            from ..devices.nvml import describe_nvml_error

            print(f"colab_gpu: {describe_nvml_error(error)}", file=sys.stderr)

    return wrapper


@magics_class
class GPUMagics(Magics):
    """See and tune the GPU from a notebook: %gpu_status, %alloc_conf, %clear_cache, %%find_batch,
    %tune_loader, %%distributed."""

    output = Enum(
        ["auto", "text"], default_value="auto",
        help="How results are shown: 'auto' gives the front end both forms, so notebooks (Jupyter, "
             "Colab, VS Code) show the HTML card and a terminal shows text; 'text' forces plain "
             "text everywhere but in %gpu_status --live, which follows live_display.",
    ).tag(config=True)

    live_interval = Float(
        1.0, help="Seconds between two samples of %gpu_status --live (--interval overrides it), "
                  "from 0.1 to 3600: NVML's counters change every 1/6 s to 1 s.",
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
        from ..live import checked_interval

        try:
            return checked_interval(proposal.value, "GPUMagics.live_interval")
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
        stop_on_unload(self.show)

    def live_session(self):
        """This shell's live session, created once and stopped on unload."""
        if self._session is None:
            from ..live.notebook import LiveSession

            self._session = LiveSession(self.shell, self.show)
        return self._session

    def show(self, result) -> None:
        """Display ``result`` as GPUMagics.output says."""
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
              help="With --live: seconds between samples, from 0.1 to 3600 (default: "
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
        if args.live or args.stop:
            check_combination(args)
            return stop_and_show(self.show) if args.stop else start_and_show(self, args)
        if args.interval is not None or args.demo or args.cells:
            if args.interval is not None:  # a wrong value is wrong with or without --live
                from ..live import checked_interval

                checked_interval(args.interval, "--interval")
            raise UsageError("--interval, --demo and --cells go with --live, "
                             "e.g. %gpu_status --live --demo")
        result = status(path=args.path, shell=self.shell)  # --from a FIFO ...: a UserError, one line
        if args.json:
            print(result.to_json())
        else:
            self.show(result)

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
        from ..memory import clear_cache, memory_holders

        args = parse(self.clear_cache, line)
        if args.vars and (args.names or args.history):
            raise UsageError("--vars only shows who holds memory; it takes no NAME or --history")
        result: Shown
        if args.vars:
            result = memory_holders(shell=self.shell)
        else:
            result = clear_cache(*args.names, history=args.history, shell=self.shell)
        if args.quiet:
            print(result.summary())
        else:
            self.show(result)

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
        from ..allocator import alloc_conf, installed_torch_version, version_of

        args = parse(self.alloc_conf, line)
        if args.keys:
            if any(value not in (None, False, []) for name, value in vars(args).items()
                   if name != "keys"):
                raise UsageError("--keys lists every key and takes no other option: "
                                 "%alloc_conf --keys")
            from ..allocator.render import render_keys

            print(render_keys(version_of(installed_torch_version())))
            return
        result = alloc_conf(args.settings, unset=args.unset, reset=args.reset, preset=args.preset,
                            check=args.check, save=args.save, forget=args.forget)
        if args.json:
            print(result.to_json())
        else:
            self.show(result)

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
              help="Only try multiples of K (tensor cores like multiples of 8), K at most --max.")
    @argument("--mode", action=Once, choices=["max", "throughput"], default="max",
              help="max: the largest size that fits; throughput: the fastest size that fits.")
    @argument("--restore", nargs="+", action="extend", default=[], metavar="NAME",
              help="More objects whose state is saved to the CPU and restored after every trial: "
                   "a tensor, your own random generator (the models, optimizers, LR schedulers and "
                   "GradScalers the cell uses are restored without it).")
    @argument("--no-restore", action="store_true", dest="no_restore",
              help="Leave the models, optimizers, LR schedulers and GradScalers the cell uses as "
                   "the trials change them (names, random generators and --restore objects are "
                   "still put back).")
    @argument("--device", action=Once, default="auto",
              help="auto (CUDA once your code has started it, else CPU), cpu, cuda or cuda:N.")
    @argument("--plan", action=Once, metavar="GPU",
              help="Predict instead of run: the cell's step under torch's fake tensors (no data, no "
                   "GPU needed, CUDA never started), its peak memory at each size on GPU: T4, L4, "
                   "V100-16GB, A100-40GB, A100-80GB, H100, RTX3090 or a capacity like 15GiB. "
                   "Labelled PLANNED; the variable is set only with --apply. --plan this (the GPU "
                   "here) plans, then searches from the planned size, which a right plan confirms "
                   "in two trials, and sets the variable as a search does.")
    @argument("--apply", action="store_true",
              help="With --plan: set the variable to the largest size planned to fit.")
    @argument("-o", action="store_true", dest="return_result",
              help="Return the BatchResult (as %%timeit -o does): the report becomes the cell's "
                   "Out, and _ holds the result.")
    @cell_magic
    @_friendly_errors
    def find_batch(self, line: str = "", cell: str = ""):
        """Run the cell at several batch sizes; set the variable to the largest (or
        fastest) that fits.

        Every notebook name a trial binds, rebinds or deletes (also through %time or a
        function's global), the models, optimizers, LR schedulers and GradScalers the
        cell uses (unless --no-restore), the --restore objects and the random generators
        are put back after every trial; Ctrl-C stops and keeps the best size so far. A
        cell error other than out-of-memory stops the search and is shown.
        """
        from ..batch.gpus import names_this
        from ..batch.progress import NotebookProgress, TerminalProgress
        from ..runtime import in_notebook

        __tracebackhide__ = True  # the user's error shows their cell's lines, not the magic's
        args = parse(self.find_batch, line)
        if args.apply and args.plan is None:
            raise UsageError("--apply sets the variable to a planned size: use it with --plan GPU")
        this = args.plan is not None and names_this(args.plan)
        if args.apply and this:
            raise UsageError("--plan this searches after planning, and the search sets the variable: drop --apply")
        if args.plan is not None and (args.mode != "max" or args.device != "auto"):
            given = f"--mode {args.mode}" if args.mode != "max" else f"--device {args.device}"
            raise UsageError(f"--plan predicts memory on the GPU it names, so {given} has nothing to act on: "
                             f"drop it, or run the search without --plan")
        prepared = prepare(self.shell, line, cell, args)
        plan = plan_cell(self.shell, prepared, args.plan, args.apply) if args.plan is not None else None
        if plan is not None and not this:  # a GPU not here: the plan is the answer
            if args.return_result:
                return plan
            self.show(plan)
            return None
        notebook = in_notebook() and self.output != "text"
        progress = NotebookProgress(keep_report=not args.return_result) if notebook else TerminalProgress()
        result = search_cell(self.shell, prepared, progress, plan=plan)
        if args.return_result:  # the cell's Out: every formatter runs, so text is asked of the result
            return dataclasses.replace(result, text_only=True) if self.output == "text" else result
        if not notebook:  # in a notebook the progress display has become the report
            self.show(result)

    @magic_arguments()
    @argument("name", metavar="NAME", help="The variable holding the torch.utils.data.DataLoader to time.")
    @argument("--step", action=Once, metavar="NAME",
              help="A function running one training step on a batch as the loader yields it, or a "
                   "%%%%find_batch --mode throughput result (-o): say whether the loader or the step "
                   "bounds training, and by how much. A function runs on one batch, then in the loop.")
    @argument("--apply", action="store_true",
              help="Rebind NAME to a new DataLoader with the answer (same dataset, sampler and "
                   "batches) and print the constructor call to paste for the next run.")
    @argument("--device", action=Once, default="auto",
              help="Where batches are copied while timed: auto (CUDA once your code has started it, "
                   "else none), cpu, cuda or cuda:N; pin_memory is tried only for CUDA.")
    @argument("--seconds", action=Once, type=number(float, "a number of seconds"), default=0.5,
              help="Seconds each setting is timed in each round, after its start-up (default 0.5).")
    @argument("--repeats", action=Once, type=WHOLE_NUMBER, default=3,
              help="Rounds of timings (default 3; up to twice as many where rates vary too much to "
                   "tell the answer from a smaller setting).")
    @argument("--max-workers", action=Once, type=WHOLE_NUMBER, dest="max_workers", metavar="N",
              help="Try at most N workers (default: the usable cores and a little past).")
    @line_magic
    @_friendly_errors
    def tune_loader(self, line: str = ""):
        """Time a DataLoader with its own settings and with the settings worth
        trying here (num_workers, prefetch_factor, pin_memory,
        persistent_workers); answer the smallest within 5 % of the best.

        Each setting runs on a new DataLoader over the same dataset, sampler,
        batch size, collate_fn, drop_last and generator; your loader, its
        iterator and the random state it draws from are left as they were,
        and every worker started is stopped.
        """
        tune_and_show(self, parse(self.tune_loader, line))

    @magic_arguments("%distributed")  # usage reads %%distributed: it is a cell magic
    @argument("-n", "--nprocs", action=Once, type=WHOLE_NUMBER, metavar="N",
              help="Processes (ranks) to run the cell on (default: one per GPU).")
    @argument("--backend", action=Once, metavar="NAME",
              help="nccl (one GPU per rank) or gloo (the CPU); default: NCCL where there are GPUs.")
    @argument("--timeout", action=Once, type=number(float, "a number of seconds"), metavar="SECONDS",
              help="Stop every rank after this many seconds (default: wait until they end).")
    @cell_magic
    @_friendly_errors
    def distributed(self, line: str = "", cell: str = ""):
        """Run the cell on every rank, with torch.distributed set up (colab_gpu.launch).

        The ranks are forked from this kernel: the cell sees your functions and data;
        what it assigns stays in the ranks. Each rank's prints appear prefixed with
        [rank N]; the cell's result is the list of the ranks' last expressions.
        """
        from .distributed import run_distributed

        __tracebackhide__ = True  # a rank's error shows its cell's lines, not the magic's
        return run_distributed(self.shell, line, cell, parse(self.distributed, line))


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
