"""The allocator setting kept for after a restart: its file, written by ``%alloc_conf --save``
(deleted by ``--forget``), and applied when the extension first loads in a process.

:mod:`.apply` writes the file through :func:`save_or_forget`, so it imports this module only
where it saves; this module applies the setting through :func:`.apply.alloc_conf`.
"""
from __future__ import annotations

import os
import pathlib
import sys
from typing import MutableMapping, Optional, Tuple

from ..spelling import command, option
from ..runtime import TorchState, torch_state
from ..torch_allocator.installed import TargetTorch, current_settings, installed_env_names
from ..torch_allocator.parse import AllocConfError, parse, to_torch
from .apply import AllocConfResult, alloc_conf

SAVED_NAME = "alloc_conf.txt"


def config_dir(environ: MutableMapping[str, str] = os.environ) -> pathlib.Path:
    """Where the saved setting lives: $COLAB_GPU_CONFIG_DIR, else ~/.config/colab_gpu."""
    if environ.get("COLAB_GPU_CONFIG_DIR"):
        return pathlib.Path(environ["COLAB_GPU_CONFIG_DIR"])
    base = environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return pathlib.Path(base) / "colab_gpu"


def saved_setting(environ: MutableMapping[str, str] = os.environ) -> Tuple[Optional[str], pathlib.Path]:
    path = config_dir(environ) / SAVED_NAME
    try:
        # A byte that is not UTF-8 (a hand edit in another encoding) becomes U+FFFD, which the
        # parser names: a UnicodeDecodeError made %load_ext fail half-way, magics registered.
        # utf-8-sig: the mark Windows Notepad puts first became part of the first key's name.
        return path.read_text(encoding="utf-8-sig", errors="replace").strip(), path
    except OSError:
        return None, path


def save_or_forget(text: str, save: bool, forget: bool, environ
                   ) -> Tuple[Optional[str], Optional[str], pathlib.Path]:
    """(saved, forgotten, path): what stays saved, and what --forget deleted, for the report.

    Saving an empty result (``--reset --save``) is forgetting: %load_ext then applies nothing,
    and the report says which saved setting that replaced instead of saying nothing."""
    saved, path = saved_setting(environ)
    forgotten, given = None, "save" if save else "forget"  # the option the error names
    if save and not text:
        save, forget = False, True
    try:
        if forget:
            forgotten, saved = saved or "", None
            path.unlink(missing_ok=True)
        if save:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text + "\n", encoding="utf-8")
            saved = text
    except OSError as error:  # a read-only home, a file where the folder should be
        where = f": {error.filename}" if error.filename else ""
        raise AllocConfError(f"{option(given, True)}: cannot "
                             f"{'write' if save else 'delete'} "
                             f"{path} ({error.strerror or error}{where}); nothing was changed "
                             f"(COLAB_GPU_CONFIG_DIR names another folder)") from None
    return saved, forgotten, path


# Set to this process's id by the first apply_saved(): %reload_ext colab_gpu (same process) must
# not put the saved setting back over what the user set since. A runtime restart starts without
# it; a child process (a kernel started from a notebook) inherits it with another id: its own
# first load. The environment, not a module flag, so that each test (and each ``environ`` given)
# is a process of its own.
APPLIED_VARIABLE = "COLAB_GPU_SAVED_APPLIED"


def apply_saved(environ: MutableMapping[str, str] = os.environ, modules=sys.modules,
                state: Optional[TorchState] = None) -> Optional[str]:
    """Apply the saved setting when the extension loads; a one-line message, None if none saved.

    Only at the first load in a process (a reload keeps what the user set since) and only
    before CUDA starts: afterwards most keys could not change, so nothing is applied.
    """
    saved, path = saved_setting(environ)
    first = environ.get(APPLIED_VARIABLE) != str(os.getpid())
    environ[APPLIED_VARIABLE] = str(os.getpid())
    if not saved:
        return None
    state = state or torch_state(modules)
    # %load_ext runs it as a magic; a script calling it never typed %alloc_conf
    forget = f"({command('%alloc_conf --forget', 'colab_gpu.alloc_conf(forget=True)')} removes it)"
    if state.cuda_initialized or not first:
        refused = _refused_saved(saved, modules)
        if refused:  # the real problem first: a restart would only end in the same refusal
            return f"colab_gpu: saved allocator setting from {path} not applied: {refused} {forget}"
        source = _holding(saved, environ, modules)
        if source:  # applied when the extension loaded before, or set by the user: no news
            return (f"colab_gpu: the saved allocator setting {saved!r} is already in this "
                    f"process's setting ({source} holds it) {forget}")
        if state.cuda_initialized:
            return (f"colab_gpu: saved allocator setting {saved!r} not applied: CUDA is already "
                    f"running; restart the runtime and load the extension first {forget}")
        # a reload: the user changed the setting since the first load, which applied this one
        shown = command("%alloc_conf", "colab_gpu.alloc_conf()")
        return (f"colab_gpu: saved allocator setting {saved!r} not re-applied: it applies at the "
                f"extension's first load in a process, not at a reload; {shown} shows what runs {forget}")
    late = ""
    try:
        result = alloc_conf([saved], environ=environ, modules=modules, state=state)
    except AllocConfError as error:
        retried = _without_backend(saved, environ, modules, state)
        if retried is None:
            return f"colab_gpu: saved allocator setting from {path} not applied: {error} {forget}"
        backend, result = retried
        why = ("torch was imported before the extension loaded and chose its allocator then: "
               "restart and load the extension before `import torch`")
        if result is None:  # the backend was the whole setting: nothing at all was applied
            return f"colab_gpu: saved allocator setting {saved!r} from {path} not applied: {why} {forget}"
        late = f" except backend:{backend} ({why})"
    return (f"colab_gpu: applied the saved allocator setting {saved!r} from {path}{late}; now "
            f"{to_torch(result.settings)!r} {forget}")


def _refused_saved(saved: str, modules) -> Optional[str]:
    """Why the installed torch refuses the saved setting (as its first load would say), else None."""
    try:
        TargetTorch.installed(modules).validate(parse(saved))
    except AllocConfError as error:
        return str(error)
    return None


def _holding(saved: str, environ, modules) -> Optional[str]:
    """The variable torch reads when it already holds every key of ``saved`` at its value (as
    after ``%reload_ext colab_gpu`` once CUDA runs), else None."""
    target = TargetTorch.installed(modules)
    try:
        source, current = current_settings(environ, installed_env_names(modules))
        held = set(target.validate(current))
        return source if set(target.validate(parse(saved))) <= held else None
    except AllocConfError:
        return None


def _without_backend(saved: str, environ, modules, state: TorchState
                     ) -> Optional[Tuple[str, Optional[AllocConfResult]]]:
    """The saved backend and the rest of the setting applied without it (None where the backend
    was all of it): `import torch` ran before the extension loaded and chose the backend then,
    and the rest still applies. None where the setting names no backend, torch is not
    imported, or the rest is refused too."""
    try:
        settings = parse(saved)
        backend = dict(settings).get("backend")
        if backend is None or not state.imported:
            return None
        rest = to_torch(tuple((name, value) for name, value in settings if name != "backend"))
        return backend, alloc_conf([rest], environ=environ, modules=modules, state=state) if rest else None
    except AllocConfError:
        return None
