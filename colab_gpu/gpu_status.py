"""``status()``: the GPUs, torch's view of their memory, and what to do about it.

Reads the device source (NVML or a recording) and, only when the user's code has already
initialized CUDA, torch's allocator statistics. Never initializes CUDA itself.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any, Optional

from .advice import advise
from .devices import DeviceSource, default_source, open_source
from .runtime import detect_runtime
from .torch_view import Status, breakdown, torch_memory, torch_view

__all__ = ["status"]


def status(source: Optional[DeviceSource] = None, path: Optional[str] = None,
           shell: Any = None) -> Status:
    """Take a status: the live GPUs (or the recording at ``path``), torch's view and advice.

    ``status("tesla-t4.xml")`` reads a recording too: a path is what people pass first.

    Parameters
    ----------
    source : DeviceSource, optional
        Where the GPUs are read (:func:`colab_gpu.open_source`); the process's NVML source
        when neither it nor ``path`` is given.
    path : str, bytes or os.PathLike, optional
        An ``nvidia-smi`` recording (``-q -x`` XML, a ``--query-gpu`` CSV log or the table)
        to read instead of the live GPUs.
    shell : InteractiveShell, optional
        The IPython shell, which tells a notebook from a terminal; the running one when None.

    Returns
    -------
    Status
        What ``%gpu_status`` shows. A GPU or driver that cannot be read is said in it
        (``status.snapshot.problem``), not raised.

    Raises
    ------
    TypeError
        Both ``source`` and ``path`` given, or one that is neither a path nor a source.
    colab_gpu.devices.replay.RecordingError
        (a ValueError) ``path`` names no regular file this process can read (missing, a
        directory, blank), or one too large to read whole.
    """
    wrong = None
    if source is not None and path is not None:  # path= was ignored without a word
        wrong = "both"
    else:
        given = source if source is not None else path  # either one, told apart by its type
        if isinstance(given, (str, bytes, os.PathLike)):
            source, path = None, given
        elif given is None or callable(getattr(given, "snapshot", None)):
            source, path = given, None  # status(path=open_source(...)) failed in os.fspath
        else:
            wrong = repr(given)  # status(path=3) failed in os.fspath, naming no argument
    if wrong:
        raise TypeError(f"status() takes a recording's path (str, bytes or os.PathLike) or a DeviceSource "
                        f"(colab_gpu.open_source()), not {wrong}")
    if source is None:
        source = open_source(path) if path is not None else default_source()
    view = torch_view(source.snapshot(), detect_runtime(shell))
    # A recording comes from another machine: this one's torch says nothing about it.
    live_torch = view.runtime.torch.cuda_initialized and not view.snapshot.recorded
    memory = torch_memory(view.torch_index_of if view.cuda_numbering_known else {}) if live_torch else ()
    by_nvml = {m.nvml_index: m for m in memory}
    parts = tuple(part for part in (breakdown(gpu, by_nvml.get(gpu.index), os.getpid())
                                    for gpu in view.gpus if gpu.index in by_nvml)
                  if part is not None)
    result = dataclasses.replace(view, torch_memory=memory, breakdown=parts)
    return dataclasses.replace(result, advice=advise(result))
