"""Apply allocator settings at the right moment, all or nothing, and say what happened.

torch not imported -> both environment variables. torch imported, CUDA not started -> the
same (``backend`` can no longer change), plus torch's run-time setter where it has one, so the
settings hold even if something already read them. CUDA started -> the run-time setter of
the installed version for the keys that take effect at run time; the others are listed with
the reason and can be saved for the next start. Keys that cannot change now keep their old
value in the environment, which always says what this process runs with. Nothing here
imports torch.
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys
from typing import Any, Dict, List, Mapping, MutableMapping, Optional, Sequence, Tuple, Union

from ..spelling import command, option
from ..runtime import TorchState
from ..render.shown import Shown
from ..state import session
from ..torch_allocator.installed import TargetTorch, current_settings, read_names, reported_settings, runtime_setter
from ..torch_allocator.parse import (AllocConfError, Settings, check_key_name, format_number, format_version,
                                     merge, parse, parse_many, to_torch)
from ..torch_allocator.schema import BY_NAME, ENV_NAMES, GENERIC_ENV_SINCE, NEWEST, OLDEST, PRESETS, Version

__all__ = ["AllocConfResult", "alloc_conf", "ignored_variables", "setting_warnings"]

# torch's parseArgs (CUDAAllocatorConfig up to 2.9, AcceleratorAllocatorConfig and its CUDA hook
# from 2.10) puts only these keys back to their defaults for each new settings string, and from
# 2.11 max_non_split_rounding_mb to large_segment_size_mb's value (a key whose default follows
# another, see _reset_by_every_string): every other key keeps the last value a string gave it,
# so a key dropped from the setting is written to the run-time setter at its default (see
# _dropped_defaults).
_RESET_BY_EVERY_STRING = ("max_split_size_mb", "roundup_power2_divisions", "garbage_collection_threshold")


def _reset_by_every_string(name: str, version: Version) -> bool:
    """Whether torch puts ``name`` back to its default at each settings string: the keys above,
    and one whose default follows a key the version has (to the value torch holds for that key,
    which may wait for a restart, so writing our default could be refused)."""
    key = BY_NAME.get(name)
    follows = key.default_follows if key is not None else None
    return name in _RESET_BY_EVERY_STRING or (follows is not None and BY_NAME[follows].available(version))


@dataclasses.dataclass(frozen=True, repr=False)
class AllocConfResult(Shown):
    """What one ``alloc_conf()`` call found and did.

    ``print(result)`` is the report ``%alloc_conf`` prints, ``result.to_json()`` what
    ``%alloc_conf --json`` prints; ``result.changed`` whether the environment changed.

    Attributes
    ----------
    action : str
        ``"show"``, ``"check"`` or ``"set"``.
    torch : TorchState
        The torch the call acted on: imported, CUDA started.
    torch_version : str or None
        The installed torch's version, read without importing it.
    settings : tuple of (str, str)
        The configuration now set in this process (or checked), key by key.
    env_before, env_after : dict of str to str or None
        The allocator variables before and after the call (None: unset).
    applied_via : tuple of str
        Where the settings went: ``"environment"``, then torch's run-time setter if called.
    deferred : tuple of (str, str)
        (key, why) of keys that cannot change in this process any more.
    warnings : tuple of str
        What the settings do not do as one would think, and variables torch ignores.
    in_effect : str or None
        What torch reports it runs with, where asking it changes nothing.
    preset : (str, str) or None
        (name, explanation) of the preset applied.
    saved, saved_path : str or None
        The setting kept for ``%load_ext`` after a restart, and its file.
    forgotten : str or None
        With ``forget``: the saved setting deleted, ``""`` where none was.
    """

    action: str  # "show", "check" or "set"
    torch: TorchState
    torch_version: Optional[str]  # the installed torch, read without importing it
    settings: Settings  # the merged configuration now set in this process (or checked)
    env_before: Dict[str, Optional[str]]
    env_after: Dict[str, Optional[str]]
    applied_via: Tuple[str, ...] = ()  # "environment", "torch._C._accelerator_setAllocatorSettings", ...
    deferred: Tuple[Tuple[str, str], ...] = ()  # (key, why it cannot change now)
    warnings: Tuple[str, ...] = ()
    in_effect: Optional[str] = None  # what torch reports, only where asking cannot change it
    preset: Optional[Tuple[str, str]] = None  # (name, explanation)
    saved: Optional[str] = None  # the setting saved for after a restart
    saved_path: Optional[str] = None
    forgotten: Optional[str] = None  # with forget: the setting deleted, "" where none was saved

    @property
    def changed(self) -> bool:
        return self.env_before != self.env_after

    def meanings(self) -> Tuple[Tuple[str, str, str], ...]:
        """(key, value, one-line meaning) for each setting; a key the environment already
        held may be unknown (the warnings say so)."""
        return tuple((name, value, BY_NAME[name].meaning if name in BY_NAME else
                      "not a key of the installed torch (see the warnings)")
                     for name, value in self.settings)

    def to_dict(self) -> Dict[str, Any]:
        data = dataclasses.asdict(self)
        data["settings"] = dict(self.settings)
        data["deferred"] = dict(self.deferred)
        return data

    def to_json(self, indent: Optional[int] = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    line_view = "colab_gpu.allocator.render:render_line"
    text_view = "colab_gpu.allocator.render:render_text"  # the report %alloc_conf prints
    html_view = "colab_gpu.allocator.render:render_html"


def _env_snapshot(environ: MutableMapping[str, str], names: Sequence[str] = ENV_NAMES
                  ) -> Dict[str, Optional[str]]:
    """The variables torch reads, in its order; every later write goes to all of them."""
    return {name: environ.get(name) for name in names}


def _restore(environ: MutableMapping[str, str], snapshot: Dict[str, Optional[str]]) -> None:
    for name, value in snapshot.items():
        if value is None:
            environ.pop(name, None)
        else:
            environ[name] = value


def setting_warnings(settings: Settings, version: Optional[Tuple[int, int]],
                     platform: str = sys.platform) -> Tuple[str, ...]:
    """What ``settings`` do not do as one would think under torch ``version`` (None: not
    installed) on ``platform``: a key another makes useless, a torch this check does not know."""
    values = dict(settings)
    found = []
    if version is None:
        found.append("torch is not installed: checked against the newest torch known "
                     f"({format_version(NEWEST)})")
    elif version > NEWEST:
        found.append(f"torch {format_version(version)} is newer than this check knows "
                     f"({format_version(NEWEST)}): its new keys are unknown here")
    elif version < OLDEST:
        found.append(f"torch {format_version(version)} is older than 1.13: checked as 1.13")
    if "garbage_collection_threshold" in values and \
            float(values.get("per_process_memory_fraction", "1")) >= 1:
        found.append("garbage_collection_threshold does nothing unless a per-process memory "
                     "fraction below 1 is set (torch.cuda.set_per_process_memory_fraction(fraction, "
                     "device), once per GPU: without device it caps the current one only)")
    if "max_split_size_mb" in values and values.get("expandable_segments") == "True":
        found.append("max_split_size_mb with expandable_segments: expandable segments already "
                     "fight fragmentation and max_split_size_mb can slow allocation; keep one")
    backend = values.get("backend", "native")
    if backend != "native":
        ignored = [name for name in values if BY_NAME[name].native_only]
        if ignored:
            found.append(f"backend {backend} ignores {', '.join(ignored)}")
        found.append(f"backend {backend}: torch's memory snapshots and history are not "
                     "meaningful with it")
    if values.get("expandable_segments") == "True" and platform.startswith("win"):
        found.append("expandable_segments is not supported on Windows: torch ignores it")
    if {"pinned_max_round_threshold_mb", "pinned_max_cached_size_mb"} <= set(values) and \
            int(values["pinned_max_round_threshold_mb"]) > int(values["pinned_max_cached_size_mb"]):
        found.append("pinned_max_round_threshold_mb > pinned_max_cached_size_mb: the cache "
                     "limit wins, larger pinned allocations are never rounded up")
    return tuple(found)


def ignored_variables(version: Optional[Version], env_before: Mapping[str, Optional[str]],
                      written: bool, cleared: bool = False) -> Tuple[str, ...]:
    """The variables set in ``env_before`` that torch does not read, said as such: torch reads
    the first one set (``env_before`` is in its order; PYTORCH_ALLOC_CONF only from 2.10), so
    another that holds something else changes nothing. ``written``: this call wrote the same
    string to every variable, replacing what the ignored ones held; ``cleared``: that string
    was empty (--reset, or every key unset), so every variable is now unset."""
    known = version if version is not None else NEWEST
    torch = f"torch {format_version(version)}" if version is not None else "torch"
    order = read_names(tuple(env_before), version)
    read = next((name for name in order if env_before[name] is not None), None)
    found, change = [], command("%alloc_conf", "colab_gpu.alloc_conf()")
    for name, value in env_before.items():
        if value is None or name == read or (read is not None and value == env_before[read]):
            continue
        if name in order:
            why = f"{torch} reads {read} first and ignores {name} while {read} is set"
        else:
            why = f"{torch} does not read {name}" + (
                " for CUDA (pytorch#183387)" if known[:2] == (2, 9) else
                f" (torch reads it from {format_version(GENERIC_ENV_SINCE)})")
        if read is None:  # the settings shown come from this variable alone
            found.append(f"{name}'s settings were not in effect: {why}; every variable is now unset"
                         if cleared else
                         f"{name}'s settings were not in effect: {why}; they are now in every "
                         f"variable" if written else
                         f"{name}'s settings, shown here, are not in effect: {why}; any change with "
                         f"{change} writes them to every variable")
        elif cleared:
            found.append(f"{name} held {value!r}, which was not in effect: {why}; it is now unset, "
                         f"as {read} is")
        elif written:
            found.append(f"{name} held {value!r}, which was not in effect: {why}; it now holds "
                         f"the same string as {read}")
        else:
            found.append(f"{name} holds {value!r}, which is not in effect: {why}; any change "
                         f"with {change} replaces it with {read}'s setting")
    return tuple(found)


def _refused_setting(source: str, held: Settings, target: TargetTorch, verb: str,
                     given: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """What the installed torch would refuse in a setting made before this call (by the user,
    before the kernel started), said as such; None when torch accepts it. ``given``: the whole
    setting ``held`` is judged in (``held`` itself where None)."""
    try:
        target.validate(held, given)
    except AllocConfError as error:
        torch = f"the installed torch {format_version(target.version)}" if target.version else "torch"
        return (f"{source} {verb} what {torch} refuses ({error}): change it with KEY=VALUE, "
                f"remove it with {option('unset', 'KEY', plain=True)} or {option('reset', True)}")
    return None


def _left_refused(base: Settings, kept: Settings, merged: Settings, target: TargetTorch) -> Optional[str]:
    """Where this call changes or unsets a key that a kept key's lowest value follows (the split
    sizes follow large_segment_size_mb from 2.11), what torch would refuse in the result, when,
    and how to fix it; None otherwise. The held setting is accepted: the change leaves it
    refused, so "already holds" would send the user looking in the wrong place."""
    before, after, found = dict(base), dict(merged), []
    for name, value in kept:
        followed = BY_NAME[name].followed(target.known) if name in BY_NAME else None
        if followed is None or before.get(followed) == after.get(followed):
            continue
        try:
            target.canonical(name, value, after)
            continue
        except AllocConfError as error:
            why = str(error)
        lowest = BY_NAME[name].lowest(target.known, after)
        assert lowest is not None  # a key whose bound follows another always has one
        low = format_number(lowest[0])
        done = f"{followed}={after[followed]}" if followed in after else \
            f"unsetting {followed} (default {BY_NAME[followed].default})"
        when = ""
        if target.state.cuda_initialized and not BY_NAME[followed].runtime:
            when = (f"torch keeps {followed}={before.get(followed, BY_NAME[followed].default)} until "
                    f"a restart, so this process takes {name}={value} now, but the next start "
                    f"would refuse it; ")
        unset = ",".join(([] if followed in after else [followed]) + [name])
        found.append(f"{done} leaves {name}={value}, which torch then refuses ({why}): {when}"
                     f"unset {name} too ({option('unset', unset, plain=True)}) or raise it to "
                     f"{low} or more ({name}={low}); nothing was changed")
    return "; ".join(found) or None


def _key_value_form(source: str, text: Optional[str], settings: Settings) -> Optional[str]:
    """A variable set by hand in the ``key=value`` form: ours reads it, torch's parser does not
    (it splits only at ``, : [ ]`` and fails when CUDA starts), so the report must not show it
    as in effect; None when the variable is in torch's form."""
    if not source or text is None or "=" not in text:
        return None
    fix = command(f"%alloc_conf {to_torch(settings)}", f"colab_gpu.alloc_conf({to_torch(settings)!r})")
    return (f"{source} holds {text!r} in the key=value form, which torch refuses (it reads only "
            f"key:value,key:value): {fix} rewrites it in torch's form")


def _strings(argument: str, given: Any, example: str) -> Tuple[str, ...]:
    """``given``, one string or several, as a tuple of strings; a TypeError naming ``argument``
    for anything else: a dict's values would be dropped, and bytes read as numbers."""
    if isinstance(given, str):
        return (given,)
    items = None if isinstance(given, (bytes, bytearray, Mapping)) or not hasattr(given, "__iter__") \
        else tuple(given)
    if items is None or not all(isinstance(item, str) for item in items):
        raise TypeError(f"alloc_conf() takes {argument} as a string or a list of strings, e.g. "
                        f"{example}; got {given!r}")
    return items


@dataclasses.dataclass(frozen=True)
class _Request:
    """What one ``alloc_conf()`` call asks to change, its arguments checked."""

    changes: Settings  # the settings given, after the preset's
    unset: Tuple[str, ...]  # key names as given (torch's "a,b" split)
    reset: bool
    save: bool
    forget: bool
    preset: Optional[Tuple[str, str]]  # (name, explanation)

    @property
    def changes_anything(self) -> bool:
        return bool(self.changes or self.unset or self.reset or self.save or self.forget)


@dataclasses.dataclass(frozen=True)
class _Held:
    """What the process holds before the call: the variables torch reads, the setting they give
    (from ``source``, the first one set), and where torch no longer reads them, what it took."""

    env_before: Dict[str, Optional[str]]
    source: str  # the variable the setting comes from; "" when none is set
    current: Settings  # the setting this call starts from (what torch took, after a hand edit)
    taken: Optional[Tuple[str, str]]  # (setting, when) once torch took its settings
    edited: Optional[str]  # what the variables hold instead of what torch took, set by hand


def alloc_conf(settings: Union[str, Sequence[str]] = (), *, unset: Union[str, Sequence[str]] = (),
               reset: bool = False, preset: Optional[str] = None, check: Optional[str] = None,
               save: bool = False, forget: bool = False, state: Optional[TorchState] = None,
               environ: Optional[MutableMapping[str, str]] = None,
               modules: Optional[Mapping[str, Any]] = None) -> AllocConfResult:
    """Show, check or change the allocator configuration, as ``%alloc_conf`` does.

    Before CUDA starts the settings go into the environment variables; after, through
    torch's run-time setter (keys that cannot change any more are listed; under a torch
    without a setter, every changed key). Everything is validated against the installed
    torch before anything changes; on any failure the environment is restored byte for byte.
    Without arguments it shows the configuration and changes nothing.

    Parameters
    ----------
    settings : str or sequence of str
        Settings in either form, ``"max_split_size_mb=128"`` or
        ``"max_split_size_mb:128,expandable_segments:True"``, merged into the current ones.
    unset : str or sequence of str
        Key names to drop from the configuration.
    reset : bool, default False
        Start from nothing instead of the current configuration.
    preset : str, optional
        One of ``colab_gpu.allocator.PRESETS``, applied before ``settings``.
    check : str, optional
        A setting string to validate against the installed torch; nothing is applied.
    save, forget : bool, default False
        Keep the result for ``%load_ext colab_gpu`` after a restart, or delete what was kept.
    state : TorchState, optional
        The torch state to act on, for callers that already know it; detected when None.
    environ : MutableMapping[str, str], optional
        The environment written; ``os.environ`` when None.
    modules : Mapping[str, module], optional
        The module table torch is looked up in (never imported); ``sys.modules`` when None.

    Returns
    -------
    AllocConfResult
        What the call found and did: the settings now held, how they were applied, what
        waits for a restart, warnings.

    Raises
    ------
    TypeError
        ``settings`` or ``unset`` is neither a string nor a list of strings (a dict, bytes),
        or ``check`` is not a string.
    AllocConfError
        (a ValueError) A setting that is malformed, unknown, out of range or not in the
        installed torch, an unknown preset, options that contradict each other, a variable
        already set that cannot be read (``reset=True`` replaces it), a value torch refused,
        or a saved file that could not be written or deleted; nothing was changed.
    """
    environ = os.environ if environ is None else environ
    modules = sys.modules if modules is None else modules
    request = _request(settings, unset, reset, preset, check, save, forget)
    target = TargetTorch.installed(modules, state)
    env_before = _env_snapshot(environ, target.env_names)
    if check is not None:
        return _check(check, target, env_before)
    held = _held(target, environ, env_before, reset, modules)
    # ROCm's spellings name the same key; a key torch does not know can go if it was set
    request = dataclasses.replace(request, unset=tuple(
        name if name in dict(held.current) else check_key_name(name).name for name in request.unset))
    for name in request.unset:
        if name in dict(request.changes):
            raise AllocConfError(f"{name} is both set and unset in one call; pick one")
    if not request.changes_anything:
        return _show(target, held, environ, modules)
    return _set(target, held, request, environ, modules)


def _request(settings, unset, reset: bool, preset: Optional[str], check: Optional[str], save: bool,
             forget: bool) -> _Request:
    """alloc_conf()'s arguments as a _Request, or the TypeError or AllocConfError that says
    which argument is wrong or which contradict each other."""
    settings = _strings("settings", settings, "'max_split_size_mb=128' or ['max_split_size_mb=128', "
                        "'expandable_segments=True']")
    unset = _strings("unset", unset, "'max_split_size_mb' or ['max_split_size_mb', 'expandable_segments']")
    # torch's own separator: "max_split_size_mb,expandable_segments" names two keys, not one unknown
    unset = tuple(name.strip() for names in unset for name in names.split(",") if name.strip())
    if check is not None and not isinstance(check, str):
        raise TypeError(f"alloc_conf() takes check as a string, e.g. 'max_split_size_mb:128'; "
                        f"got {type(check).__name__}")
    if save and forget:
        raise AllocConfError(f"{option('save', True)} and {option('forget', True)} contradict each "
                             f"other: {option('save')} replaces the saved setting, {option('forget')} "
                             f"deletes it; give one")
    if check is not None and (settings or unset or reset or preset is not None or save or forget):
        raise AllocConfError(f"{option('check')} only validates its string and changes nothing: give "
                             f"it without settings, {option('unset')}, {option('reset')}, "
                             f"{option('preset')}, {option('save')} or {option('forget')}")
    changes = parse_many(settings)
    explanation = None
    if preset is not None:
        if preset not in PRESETS:
            raise AllocConfError(f"unknown preset {preset!r}; presets: {', '.join(PRESETS)}")
        text, why = PRESETS[preset]
        changes = parse(text) + changes
        explanation = (preset, why)
    return _Request(changes, unset, reset, save, forget, explanation)


def _held(target: TargetTorch, environ, env_before: Dict[str, Optional[str]], reset: bool, modules) -> _Held:
    """What the process holds now; an unreadable variable is an AllocConfError unless ``reset``
    (the way out of it) or torch no longer reads the variables."""
    taken = _taken_setting(target.state, modules)
    try:
        source, current = current_settings(environ, target.env_names)
    except AllocConfError:
        if not reset and taken is None:
            raise
        source, current = "", ()  # --reset is the way out of an unreadable setting
    edited = _hand_edit(taken, source, env_before, current)
    if edited is not None and taken is not None:  # torch no longer reads the variables: start from what it holds
        current = parse(taken[0])
    return _Held(env_before, source, current, taken, edited)


def _check(text: str, target: TargetTorch, env_before: Dict[str, Optional[str]]) -> AllocConfResult:
    """``alloc_conf(check=text)``: ``text`` validated against ``target``, nothing changed."""
    checked = target.validate(parse(text))
    return AllocConfResult(action="check", torch=target.state, torch_version=target.version_text,
                           settings=checked, env_before=env_before, env_after=env_before,
                           warnings=setting_warnings(checked, target.version)
                           + ignored_variables(target.version, env_before, written=False))


def _show(target: TargetTorch, held: _Held, environ, modules) -> AllocConfResult:
    """``alloc_conf()`` with nothing to change: the setting held, what torch would refuse in it,
    and the setting saved for after a restart."""
    from .saved import saved_setting  # not at the top: .saved imports alloc_conf

    saved, path = saved_setting(environ)
    refused = () if held.edited else tuple(problem for problem in (
        _key_value_form(held.source, held.env_before.get(held.source), held.current),
        _refused_setting(held.source, held.current, target, "holds")) if problem)
    warnings = (refused + setting_warnings((), target.version) if refused
                else setting_warnings(held.current, target.version)) + (
        (_hand_edit_warning(held.edited, held.taken, written=False),) if held.edited else
        ignored_variables(target.version, held.env_before, False))
    return AllocConfResult(action="show", torch=target.state, torch_version=target.version_text,
                           settings=held.current, env_before=held.env_before, env_after=held.env_before,
                           warnings=warnings, in_effect=_in_effect(target.state, modules),
                           saved=saved, saved_path=str(path))


def _set(target: TargetTorch, held: _Held, request: _Request, environ, modules) -> AllocConfResult:
    """``alloc_conf()`` with something to change: all of it (the environment, torch's run-time
    setting, the saved file) or, on any refusal, none of it."""
    from .saved import save_or_forget, saved_setting  # not at the top: .saved imports alloc_conf

    base = () if request.reset else held.current
    new_settings = _merged(base, request, held.source, target)
    deferred = _deferred(held.current, new_settings, target, allow=request.save)
    # The file first: one that cannot be written or deleted then changes nothing, and a setting
    # torch refuses puts the file back, so that either all of it happens or none.
    previous, _ = saved_setting(environ)
    waiting: Settings = ()
    to_save = new_settings
    if request.save and not request.reset:
        waiting, to_save = _still_waiting(previous, new_settings, set(dict(request.changes)) | set(request.unset),
                                          target)
    saved, forgotten, path = save_or_forget(to_torch(to_save), request.save, request.forget, environ)
    dropped = _dropped_defaults(held.current, new_settings, target)
    try:
        result = _apply(_live(held.current, new_settings, deferred), deferred, target.state, environ, modules,
                        held.env_before, dropped)
    except AllocConfError:
        if request.save or request.forget:
            save_or_forget(previous or "", previous is not None, previous is None, environ)
        raise
    return dataclasses.replace(
        result, action="set", preset=request.preset, saved=saved, saved_path=str(path),
        forgotten=forgotten, deferred=result.deferred + waiting, torch=target.state,
        torch_version=target.version_text, env_before=held.env_before,
        warnings=setting_warnings(new_settings, target.version) + result.warnings + (
            (_hand_edit_warning(held.edited, held.taken, written=True),) if held.edited else
            ignored_variables(target.version, held.env_before, written=True,
                               cleared=all(value is None for value in result.env_after.values()))))


def _merged(base: Settings, request: _Request, source: str, target: TargetTorch) -> Settings:
    """``base`` with the request's changes and unset keys, validated; a kept key torch would
    refuse is said as the held setting's fault, or the change's where the change breaks it."""
    kept = tuple((name, value) for name, value in base if name not in dict(request.changes)
                 and name not in request.unset)
    merged = merge(base, request.changes, request.unset)
    # a kept key judged with the keys this call leaves: one the change fixes is no refusal, and
    # one the change breaks is the change's fault, not the held setting's
    if _refused_setting(source, kept, target, "already holds", dict(merged)):
        refused = _refused_setting(source, kept, target, "already holds", dict(base))
        raise AllocConfError(refused or _left_refused(base, kept, merged, target))
    return target.validate(merged)


_NO_SETTER = ("the installed torch has no run-time settings call: it read its allocator "
              "settings once, when CUDA started")


def _deferred(current: Settings, new: Settings, target: TargetTorch, allow: bool) -> Tuple[Tuple[str, str], ...]:
    """Changed keys that cannot take effect now, with why; a refused change raises. Without a
    run-time settings call in ``target``, once CUDA runs, none can. A key whose lowest value
    follows a deferred key waits too where torch, which keeps that key's old value until a
    restart, would refuse it now."""
    state = target.state
    if not state.imported:
        return ()
    before, after = dict(current), dict(new)
    changed = [name for name in set(before) | set(after) if before.get(name) != after.get(name)]
    deferred = []
    for name in sorted(changed):
        key = BY_NAME[name]
        if name == "backend":
            if before.get(name, key.default) == after.get(name, key.default):
                continue  # naming the backend torch loaded (or dropping its name) changes nothing
            if not allow:
                raise AllocConfError(
                    "backend cannot change now: torch is already imported and chose its "
                    "allocator then; restart the runtime and set it before `import torch`, "
                    f"or add {option('save', True)} to apply it when the extension loads after a "
                    f"restart")
            deferred.append((name, key.runtime_reason))
        elif state.cuda_initialized and not key.runtime:
            deferred.append((name, key.runtime_reason))
        elif state.cuda_initialized and not target.setter:
            deferred.append((name, _NO_SETTER))
    waiting = {name for name, _ in deferred}
    for name in sorted(set(changed) - waiting):
        followed = BY_NAME[name].followed(target.known)
        if followed in waiting and name in after:
            kept = before.get(followed, BY_NAME[followed].default)
            try:
                target.canonical(name, after[name], {followed: kept})
            except AllocConfError:
                deferred.append((name, f"torch checks it against the {followed} this process "
                                       f"keeps until a restart ({kept}), and refuses it"))
    return tuple(deferred)


def _still_waiting(previous: Optional[str], settings: Settings, named, target: TargetTorch
                   ) -> Tuple[Tuple[Tuple[str, str], ...], Settings]:
    """(deferred, setting to save): the keys of the saved setting that this process cannot take
    now (as :func:`_deferred` says, with why) and that this call neither sets nor unsets are
    kept in what ``--save`` writes: they wait for the restart, and saving only what this
    process holds lost them without a word."""
    try:
        saved = target.validate(parse(previous or ""))
    except AllocConfError:  # a file edited by hand into something torch refuses: replaced
        return (), settings
    rest = tuple((name, value) for name, value in saved if name not in named)
    deferred = _deferred(settings, merge(settings, rest), target, allow=True)
    kept = tuple((name, value) for name, value in rest if name in dict(deferred))
    try:
        to_save = target.validate(merge(settings, kept))
    except AllocConfError as error:
        raise AllocConfError(
            f"{option('save', True)} keeps {to_torch(kept)} from the setting saved before, which "
            f"waits for the restart; with it the next start would refuse the result ({error}): "
            f"change them in this call or drop them ({option('unset', ','.join(dict(kept)), plain=True)}); "
            f"nothing was changed") from None
    return tuple((name, f"kept from the setting saved before; {why}") for name, why in deferred), to_save


def _dropped_defaults(current: Settings, new: Settings, target: TargetTorch
                      ) -> Tuple[Tuple[str, Optional[str]], ...]:
    """The keys ``current`` held and ``new`` drops, each with the value that puts it back to
    torch's default through the run-time setter, or None where torch takes no value meaning
    its default ("0 (off)", "unlimited")."""
    after = dict(new)
    dropped: List[Tuple[str, Optional[str]]] = []
    for name in dict(current):
        key = BY_NAME.get(name)
        if name in after or _reset_by_every_string(name, target.known) or key is None \
                or not key.available(target.known):
            continue
        try:
            dropped.append((name, target.canonical(name, key.default)))
        except ValueError:  # AllocConfError, or a list parser given "[] (none)"
            dropped.append((name, None))
    return tuple(dropped)


def _live(current: Settings, new: Settings, deferred) -> Settings:
    """``new`` with the deferred keys as they are now: torch asserts at CUDA start if the
    environment names another backend than the one it loaded with (pytorch#104801), and
    the other deferred keys would reach child processes while this one runs without them."""
    held = {name for name, _ in deferred}
    before = dict(current)
    return merge(new, tuple((name, before[name]) for name in held if name in before),
                 unset=[name for name in held if name not in before])


def _apply(settings: Settings, deferred, state: TorchState, environ, modules, env_before,
           dropped: Sequence[Tuple[str, Optional[str]]] = ()) -> AllocConfResult:
    """Write the environment and call torch's setter; restore everything if anything fails.

    ``dropped``: keys the setting held before and no longer does, with their defaults
    (:func:`_dropped_defaults`); torch keeps a key's value until the setter's string names it."""
    text = to_torch(settings)
    setter = runtime_setter(modules) if state.imported else None
    skip = {name for name, _ in deferred} | {"backend"}
    dropped = [(name, default) for name, default in dropped if name not in skip]
    runtime_text = to_torch(tuple((n, v) for n, v in settings if n not in skip)
                            + tuple((n, v) for n, v in dropped if v is not None))
    # where torch gets the setting now (the variables only, before CUDA starts, without a getter:
    # torch reads them then, and nothing here could be put back if it refused)
    hands_to_torch = setter is not None and (state.cuda_initialized or setter.get is not None)
    try:
        previous = reported_settings(modules) if hands_to_torch else None
    except Exception:  # torch's first read of a variable it refuses: it holds no settings yet,
        previous = None  # and reads the variable written below instead, at the setter call
    via = []
    try:
        for name in env_before:
            if text:
                environ[name] = text
            else:
                environ.pop(name, None)
        via.append("environment")
        if hands_to_torch and setter is not None:
            setter.set(runtime_text)
            via.append(setter.name)
            session.given_to_torch = text
    except Exception as error:
        _restore(environ, env_before)
        if previous is not None and setter is not None:  # previous: read from this setter
            setter.set(previous)
        if isinstance(error, AllocConfError):
            raise
        raise AllocConfError(f"torch refused {runtime_text!r}: {str(error).splitlines()[0]}; "
                             f"nothing was changed") from None
    return AllocConfResult(action="set", torch=state, torch_version=None, settings=settings,
                           env_before=env_before, env_after=_env_snapshot(environ, tuple(env_before)),
                           applied_via=tuple(via), deferred=tuple(deferred),
                           warnings=tuple(f"{name} keeps its last value in this process: torch "
                                          f"keeps a key until a settings string names it, and its "
                                          f"default cannot be written; restart the runtime to drop it"
                                          for name, default in dropped if default is None and len(via) > 1),
                           in_effect=reported_settings(modules) if hands_to_torch else None)


def _taken_setting(state: TorchState, modules) -> Optional[Tuple[str, str]]:
    """(setting, when) once torch has read its settings and ignores the variables: from
    %alloc_conf's call of its run-time setter (what torch reports then lacks the keys held
    for a restart), else from CUDA's start, where torch's own report, the last string it
    parsed, is what it uses; None before either."""
    if not state.imported:
        return None
    if session.given_to_torch is not None:  # the setting last given to torch's setter
        return session.given_to_torch, "when %alloc_conf applied them through its run-time setter"
    try:
        reported = _in_effect(state, modules)
    except Exception:  # a variable torch refuses, read for the first time: it holds nothing yet
        return None
    if reported is None:
        return None
    return reported, "at CUDA start or a later call of its run-time setter, as torch reports"


def _hand_edit(taken: Optional[Tuple[str, str]], source: str, env_before: Mapping[str, Optional[str]],
               current: Settings) -> Optional[str]:
    """What the variables hold instead of the setting torch took, e.g. "PYTORCH_CUDA_ALLOC_CONF
    holds 'x:1'", where they were changed by hand after torch read them; None otherwise."""
    if taken is None:
        return None
    try:
        if dict(parse(taken[0])) == dict(current) and (source or not any(env_before.values())):
            return None
    except AllocConfError:
        return None
    if source:
        return f"{source} holds {env_before[source]!r}"
    held = [f"{name} holds {value!r}" for name, value in env_before.items() if value is not None]
    return "; ".join(held) if held else f"{' and '.join(env_before)} are unset"


def _hand_edit_warning(edited: str, taken: Optional[Tuple[str, str]], written: bool) -> str:
    assert taken is not None  # an edit by hand is found only against a setting torch took
    setting, when = taken
    change = command("%alloc_conf KEY=VALUE", "colab_gpu.alloc_conf('KEY=VALUE')")
    held = repr(setting) if setting else "its defaults"
    if written:
        return (f"{edited}, set by hand after torch read its settings ({when}), which never took "
                f"effect: this change started from what torch holds ({held}) and every variable "
                f"now holds the result")
    return (f"{edited}, set by hand after torch read its settings ({when}): torch does not read "
            f"the variables again, so this edit does not take effect; torch uses {held}, shown "
            f"here; change settings with {change}")


def _in_effect(state: TorchState, modules) -> Optional[str]:
    """torch's own report, asked only once CUDA runs: before that, asking would make torch
    read the environment early and ignore later changes (or start CUDA)."""
    return reported_settings(modules) if state.cuda_initialized else None
