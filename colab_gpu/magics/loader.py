"""%tune_loader: the loader (and --step) named on the line, read from the notebook's namespace,
timed by ``colab_gpu.loader``, shown; --apply rebinds the name to a loader with the answer."""
from __future__ import annotations

from IPython.core.error import UsageError


def _variable(shell, name: str, what: str):
    """The notebook's variable ``name``, or a one-line refusal saying what was expected."""
    if not name.isidentifier():
        raise UsageError(f"{what} {name!r}: give the name of a variable in the notebook")
    try:
        return shell.user_ns[name]
    except KeyError:
        raise UsageError(f"{what} {name}: no variable of that name in the notebook") from None


def tune_and_show(magics, args) -> None:
    """Time the loader, show the result, and with --apply rebind its name."""
    from ..loader import tune_loader

    shell = magics.shell
    loader = _variable(shell, args.name, "NAME")
    step = None if args.step is None else _variable(shell, args.step, "--step")
    result = tune_loader(loader, step=step, device=args.device, seconds=args.seconds, repeats=args.repeats,
                         max_workers=args.max_workers, name=args.name, namespace=shell.user_ns)
    magics.show(result)
    if not args.apply:
        return
    if result.unchanged:
        print(f"colab_gpu: {args.name} already has these settings; left as it is")
        return
    shell.user_ns[args.name] = result.new_loader()
    print(f"colab_gpu: {args.name} is now a new DataLoader with {result.answer.label()}, over the same "
          f"dataset, sampler and batches; for the next run of the notebook, paste:\n{result.call}")
