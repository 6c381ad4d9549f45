"""The allocator setting kept for after a restart: its file, written by ``%alloc_conf --save``
(deleted by ``--forget``), and applied when the extension first loads in a process.

:mod:`.apply` writes the file through :func:`save_or_forget`, so it imports this module only
where it saves; this module applies the setting through :func:`.apply.alloc_conf`.
"""
from __future__ import annotations

import errno
import os
import pathlib
import stat
import sys
from typing import MutableMapping, Optional, Tuple

from ..spelling import command, option
from ..runtime import TorchState, torch_state
from ..torch_allocator.installed import TargetTorch, current_settings, installed_env_names
from ..torch_allocator.parse import AllocConfError, parse, shown, to_torch
from .apply import AllocConfResult, alloc_conf

SAVED_NAME = "alloc_conf.txt"


def config_dir(environ: MutableMapping[str, str] = os.environ) -> pathlib.Path:
    """Where the saved setting lives: $COLAB_GPU_CONFIG_DIR, else ~/.config/colab_gpu."""
    if environ.get("COLAB_GPU_CONFIG_DIR"):
        return pathlib.Path(environ["COLAB_GPU_CONFIG_DIR"])
    base = environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return pathlib.Path(base) / "colab_gpu"


# A setting of every key is under 1 KiB: more is no saved setting, and is not read whole into
# memory. Above 4300 digits, so that a hand-edited huge number gets the parser's own error.
SAVED_LIMIT = 16 * 1024
SAVED_SHOWN = 1024  # characters of a saved setting a message repeats (every key fits)


def _kind(mode: int) -> str:
    """What a file that is not a regular one is, for a message."""
    for test, kind in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a named pipe"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device")):
        if test(mode):
            return kind
    return "not a regular file"


def read_saved(environ: MutableMapping[str, str] = os.environ
               ) -> Tuple[Optional[str], pathlib.Path, Optional[str]]:
    """(setting, path, problem): the saved setting, None if there is none or it cannot be read,
    and then why not in a few words (None where there is simply no file).

    Only a regular file is read, and at most SAVED_LIMIT bytes of it: a FIFO opened for reading
    waits for a writer, so that ``%load_ext colab_gpu`` hung; it is opened without waiting
    (O_NONBLOCK) and refused after fstat, which also answers for a device or a directory."""
    path = config_dir(environ) / SAVED_NAME
    try:
        descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        return None, path, None
    except PermissionError:
        return None, path, "no permission to read it: make it readable (chmod u+r) or delete it"
    except OSError as error:  # a file where a folder of the path should be, too many links ...
        return None, path, f"{error.strerror or error}: delete it, or fix the folders it is in"
    mode = os.fstat(descriptor).st_mode
    if not stat.S_ISREG(mode):
        os.close(descriptor)
        return None, path, f"it is {_kind(mode)}, not a file: remove it"
    with os.fdopen(descriptor, "rb") as file:
        try:
            data = file.read(SAVED_LIMIT + 1)
        except OSError as error:
            return None, path, f"{error.strerror or error}: delete it"
    if len(data) > SAVED_LIMIT:
        forget = command("%alloc_conf --forget", "colab_gpu.alloc_conf(forget=True)")
        return None, path, (f"it holds over {SAVED_LIMIT // 1024} KiB, and a saved setting is one "
                            f"short line: {forget} deletes it")
    # A byte that is not UTF-8 (a hand edit in another encoding) becomes U+FFFD, which the
    # parser names: a UnicodeDecodeError made %load_ext fail half-way, magics registered.
    # utf-8-sig: the mark Windows Notepad puts first became part of the first key's name.
    return data.decode("utf-8-sig", errors="replace").strip(), path, None


def saved_setting(environ: MutableMapping[str, str] = os.environ) -> Tuple[Optional[str], pathlib.Path]:
    """(setting, path): the saved setting, None where there is none or it cannot be read
    (:func:`apply_saved` says why at load)."""
    saved, path, _ = read_saved(environ)
    return saved, path


def _write(path: pathlib.Path, text: str) -> None:
    """Write ``text`` to ``path``, a regular file or none yet: opening a FIFO for writing waits
    for a reader, so anything else is refused, and the file is opened without waiting besides."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        mode = None
    if mode is not None and not stat.S_ISREG(mode):
        raise OSError(errno.EINVAL, f"it is {_kind(mode)}, not a file")
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | getattr(os, "O_NONBLOCK", 0), 0o644)
    with os.fdopen(descriptor, "wb") as file:
        file.truncate(0)
        file.write(text.encode("utf-8"))


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
            _write(path, text + "\n")
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
    before CUDA starts: afterwards most keys could not change, so nothing is applied. Never
    raises: ``%load_ext`` has registered the magics by now, and an error here left it half done
    (loaded, yet not in IPython's list of loaded extensions); a setting that cannot be read or
    applied is said in the message instead.
    """
    try:
        return _apply_saved(environ, modules, state)
    except Exception as error:  # a bug here: said in one line, the rest of the load stands
        return (f"colab_gpu: the saved allocator setting was not applied ({type(error).__name__}: "
                f"{shown(str(error), 400)}); the extension loaded, without it")


def _apply_saved(environ: MutableMapping[str, str], modules, state: Optional[TorchState]) -> Optional[str]:
    saved, path, problem = read_saved(environ)
    first = environ.get(APPLIED_VARIABLE) != str(os.getpid())
    environ[APPLIED_VARIABLE] = str(os.getpid())
    if problem is not None:
        return f"colab_gpu: the saved allocator setting in {path} was not read, nor applied: {problem}"
    if not saved:
        return None
    said = shown(saved, SAVED_SHOWN)  # as the messages repeat it
    state = state or torch_state(modules)
    # %load_ext runs it as a magic; a script calling it never typed %alloc_conf
    forget = f"({command('%alloc_conf --forget', 'colab_gpu.alloc_conf(forget=True)')} removes it)"
    if state.cuda_initialized or not first:
        refused = _refused_saved(saved, modules)
        if refused:  # the real problem first: a restart would only end in the same refusal
            return f"colab_gpu: saved allocator setting from {path} not applied: {refused} {forget}"
        source = _holding(saved, environ, modules)
        if source:  # applied when the extension loaded before, or set by the user: no news
            return (f"colab_gpu: the saved allocator setting {said!r} is already in this "
                    f"process's setting ({source} holds it) {forget}")
        if state.cuda_initialized:
            return (f"colab_gpu: saved allocator setting {said!r} not applied: CUDA is already "
                    f"running; restart the runtime and load the extension first {forget}")
        # a reload: the user changed the setting since the first load, which applied this one
        shows = command("%alloc_conf", "colab_gpu.alloc_conf()")
        return (f"colab_gpu: saved allocator setting {said!r} not re-applied: it applies at the "
                f"extension's first load in a process, not at a reload; {shows} shows what runs {forget}")
    late = ""
    result: Optional[AllocConfResult]
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
            return f"colab_gpu: saved allocator setting {said!r} from {path} not applied: {why} {forget}"
        late = f" except backend:{backend} ({why})"
    return (f"colab_gpu: applied the saved allocator setting {said!r} from {path}{late}; now "
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
