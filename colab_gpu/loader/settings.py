"""What a DataLoader is built from, the settings worth trying on this machine, and new loaders
built from the same parts with other settings.

A copy keeps the dataset, the sampler (or batch sampler), the batch size, ``collate_fn``,
``drop_last``, the generator, ``worker_init_fn``, the start method and the timeout: the very
objects, so its batches are the user's batches in the user's order. Only the four settings
below change. torch is imported inside functions: whoever holds a DataLoader has imported it.
"""
from __future__ import annotations

import collections.abc
import dataclasses
import inspect
import multiprocessing
import sys
from typing import Any, Dict, List, Mapping, Optional, Tuple

from ..errors import UserError

__all__ = ["Setting", "LoaderError", "NotALoader", "setting_of", "worker_counts",
           "rebuilt", "check_loader", "is_iterable", "start_method", "notebook_parts", "constructor_call",
           "DEFAULT_PREFETCH", "batches_per_epoch",
           "parts_of"]

DEFAULT_PREFETCH = 2  # torch's prefetch_factor when workers are on


class LoaderError(UserError, ValueError):
    """An option of tune_loader that cannot be used, or a loader it cannot measure safely."""


class NotALoader(UserError, TypeError, ValueError):
    """What was given is not a torch.utils.data.DataLoader: a TypeError, and a ValueError as
    every error in what the user asked for is."""


@dataclasses.dataclass(frozen=True)
class Setting:
    """The four DataLoader settings tune_loader changes; everything else stays the user's."""

    num_workers: int
    pin_memory: bool = False
    prefetch_factor: Optional[int] = None  # None with no workers; torch's 2 otherwise unless set
    persistent_workers: bool = False

    @property
    def cost(self) -> Tuple[int, bool, int, bool]:
        """What "smallest" means: fewer processes, then less pinned memory, then fewer batches
        held in advance, then no process kept between epochs."""
        return (self.num_workers, self.pin_memory, self.prefetch_factor or 0, self.persistent_workers)

    def keywords(self) -> Dict[str, Any]:
        """The DataLoader keywords of this setting, torch's defaults included."""
        return {"num_workers": self.num_workers, "pin_memory": self.pin_memory,
                "prefetch_factor": self.prefetch_factor if self.num_workers else None,
                "persistent_workers": self.persistent_workers and self.num_workers > 0}

    def label(self) -> str:
        """"num_workers=2, pin_memory=True": what differs from torch's defaults, workers always."""
        parts = [f"num_workers={self.num_workers}"]
        if self.pin_memory:
            parts.append("pin_memory=True")
        if self.num_workers and (self.prefetch_factor or DEFAULT_PREFETCH) != DEFAULT_PREFETCH:
            parts.append(f"prefetch_factor={self.prefetch_factor}")
        if self.persistent_workers and self.num_workers:
            parts.append("persistent_workers=True")
        return ", ".join(parts)

    def with_(self, **changes) -> "Setting":
        setting = dataclasses.replace(self, **changes)
        if not setting.num_workers:  # torch refuses both without workers
            setting = dataclasses.replace(setting, prefetch_factor=None, persistent_workers=False)
        elif setting.prefetch_factor is None:
            setting = dataclasses.replace(setting, prefetch_factor=DEFAULT_PREFETCH)
        return setting


def setting_of(loader) -> Setting:
    """The loader's own setting, as torch reads it (prefetch_factor 2 when it has workers)."""
    return Setting(0).with_(num_workers=loader.num_workers, pin_memory=bool(loader.pin_memory),
                            prefetch_factor=loader.prefetch_factor,
                            persistent_workers=bool(loader.persistent_workers))


def worker_counts(cores: int, current: int, most: Optional[int] = None) -> List[int]:
    """The worker counts worth trying: each up to 4, then a ladder up to the usable cores, and a
    little past them (a loader that waits on storage gains from more workers than cores)."""
    counts = set(range(min(cores, 4) + 1))
    counts.update({cores // 2, (3 * cores) // 4, cores, cores + max(1, cores // 4), current})
    if most is not None:
        counts = {count for count in counts if count <= most}
    return sorted(counts)


def check_loader(loader) -> None:
    """NotALoader for anything but a DataLoader; LoaderError for one whose sampler is an iterator,
    which a measurement would use up (the user's own next batches)."""
    data = sys.modules.get("torch.utils.data")
    if data is None or not isinstance(loader, data.DataLoader):
        raise NotALoader(f"tune_loader takes a torch.utils.data.DataLoader, not {_kind(loader)}")
    for part in ("sampler", "batch_sampler"):
        value = getattr(loader, part, None)
        if isinstance(value, collections.abc.Iterator):
            raise LoaderError(f"the loader's {part} is an iterator ({_kind(value)}): one pass uses it up, "
                              f"so measuring would take the batches your training would get; give the "
                              f"DataLoader a list or a Sampler instead")


def _kind(value) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:60] + '…' if len(text) > 60 else text}"


def is_iterable(loader) -> bool:
    """Whether the loader's dataset is an IterableDataset (no sampler: a stream)."""
    from torch.utils.data import IterableDataset

    return isinstance(loader.dataset, IterableDataset)


def _custom_batch_sampler(loader) -> bool:
    """True where the user gave a batch_sampler: torch then sets batch_size to None."""
    return loader.batch_size is None and loader.batch_sampler is not None


def parts_of(loader) -> Dict[str, Any]:
    """The DataLoader keywords that rebuild ``loader``'s batches: the same objects, in torch's
    accepted combination (a custom batch_sampler excludes batch_size, sampler and drop_last;
    an iterable dataset takes no sampler)."""
    from torch.utils.data import DataLoader

    accepted = inspect.signature(DataLoader.__init__).parameters
    parts: Dict[str, Any] = {"dataset": loader.dataset, "collate_fn": loader.collate_fn,
                             "timeout": loader.timeout, "worker_init_fn": loader.worker_init_fn,
                             "multiprocessing_context": loader.multiprocessing_context,
                             "generator": loader.generator}
    if _custom_batch_sampler(loader):
        parts["batch_sampler"] = loader.batch_sampler
    else:
        parts.update(batch_size=loader.batch_size, drop_last=loader.drop_last)
        if not is_iterable(loader):
            parts["sampler"] = loader.sampler
    if getattr(loader, "pin_memory_device", "") and "pin_memory_device" in accepted:
        parts["pin_memory_device"] = loader.pin_memory_device  # deprecated: passed only when set
    if "in_order" in accepted and hasattr(loader, "in_order"):
        parts["in_order"] = loader.in_order
    return parts


def rebuilt(loader, setting: Setting):
    """A new torch DataLoader over ``loader``'s parts with ``setting``."""
    from torch.utils.data import DataLoader

    parts = parts_of(loader)
    if not setting.num_workers:  # torch refuses a start method without worker processes
        parts["multiprocessing_context"] = None
    return DataLoader(**parts, **setting.keywords())


def start_method(loader) -> str:
    """How the loader's workers would start: its multiprocessing_context's method, else the
    default, read without fixing it (``multiprocessing.get_start_method()`` would)."""
    context = loader.multiprocessing_context
    if context is not None:
        return context.get_start_method()
    return multiprocessing.get_start_method(allow_none=True) or multiprocessing.get_all_start_methods()[0]


def _made_in(value, module: str) -> bool:
    target = value if inspect.isclass(value) or callable(value) and hasattr(value, "__qualname__") else type(value)
    return getattr(target, "__module__", None) == module


def notebook_parts(loader, main=None) -> List[str]:
    """What the workers must import that a notebook cell defined ("the dataset's class
    MyDataset", "collate_fn pad_batch"): a worker started by spawn or forkserver imports it
    from ``__main__``, which in a notebook is no file it can import. Empty for a script, whose
    ``__main__`` is a file a worker re-imports. The dataset's own attributes are looked at one
    level deep (a transform class defined in a cell)."""
    main = sys.modules.get("__main__") if main is None else main
    if getattr(main, "__file__", None):
        return []
    found = []
    dataset = loader.dataset
    if _made_in(dataset, "__main__"):
        found.append(f"the dataset's class {type(dataset).__qualname__}")
    for name, value in sorted(getattr(dataset, "__dict__", {}).items()):
        if not name.startswith("__") and _made_in(value, "__main__") and not isinstance(value, (int, float, str)):
            what = value.__qualname__ if hasattr(value, "__qualname__") else type(value).__qualname__
            found.append(f"the dataset's {name} ({what})")
    for name in ("collate_fn", "worker_init_fn"):
        value = getattr(loader, name)
        if value is not None and _made_in(value, "__main__"):
            found.append(f"{name} {getattr(value, '__qualname__', type(value).__qualname__)}")
    return found


def batches_per_epoch(loader) -> Optional[int]:
    """len(loader), None where the dataset has no length (an iterable one)."""
    try:
        return len(loader)
    except TypeError:
        return None


def _name_of(value, names: Mapping[int, str], fallback: str) -> str:
    return names.get(id(value), fallback)


def constructor_call(loader, setting: Setting, name: str, names: Mapping[int, str] = {},
                     function: str = "torch.utils.data.DataLoader") -> str:
    """The DataLoader call that makes ``loader`` with ``setting``, to paste into the notebook:
    each part named by the variable that holds it (``names``: id -> name), else reached
    through the loader (``train_loader.dataset``), which the new loader keeps."""
    from torch.utils.data import RandomSampler, SequentialSampler
    from torch.utils.data._utils.collate import default_collate, default_convert

    def named(part: str) -> str:
        return _name_of(getattr(loader, part), names, f"{name}.{part}")

    arguments = [named("dataset")]
    if _custom_batch_sampler(loader):
        arguments.append(f"batch_sampler={named('batch_sampler')}")
    else:
        arguments.append(f"batch_size={loader.batch_size}")
        sampler = loader.sampler
        if is_iterable(loader) or type(sampler) is SequentialSampler:
            pass
        elif type(sampler) is RandomSampler and not sampler.replacement \
                and getattr(sampler, "_num_samples", None) is None and sampler.generator is loader.generator:
            arguments.append("shuffle=True")  # the sampler DataLoader(shuffle=True) makes
        else:
            arguments.append(f"sampler={named('sampler')}")
        if loader.drop_last:
            arguments.append("drop_last=True")
    if loader.collate_fn not in (default_collate, default_convert):
        arguments.append(f"collate_fn={named('collate_fn')}")
    arguments += [f"{key}={value!r}" for key, value in setting.keywords().items()
                  if key == "num_workers" or value not in (None, False)
                  and not (key == "prefetch_factor" and value == DEFAULT_PREFETCH)]
    if loader.timeout:
        arguments.append(f"timeout={loader.timeout!r}")
    if loader.worker_init_fn is not None:
        arguments.append(f"worker_init_fn={named('worker_init_fn')}")
    if loader.multiprocessing_context is not None and setting.num_workers:
        arguments.append(f"multiprocessing_context={start_method(loader)!r}")
    if loader.generator is not None:
        arguments.append(f"generator={named('generator')}")
    if getattr(loader, "pin_memory_device", ""):
        arguments.append(f"pin_memory_device={loader.pin_memory_device!r}")
    if getattr(loader, "in_order", True) is False:
        arguments.append("in_order=False")
    return f"{name} = {function}({', '.join(arguments)})"

