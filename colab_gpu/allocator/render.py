"""Text and HTML views of an AllocConfResult (HTML reuses the status card's theme-aware style)."""
from __future__ import annotations

from html import escape
from typing import List, Tuple

from ..render import count, fold, torch_summary
from ..render.html import STYLE, rows_table, unbroken_units
from ..spelling import command, option
from ..torch_allocator.parse import format_version, to_torch
from ..torch_allocator.schema import KEYS

_TITLES = {"show": "Allocator configuration", "check": "Allocator setting checked",
           "set": "Allocator configuration changed"}


def _title(result) -> str:
    """A call that set what was already set says so, instead of claiming a change."""
    title = "Allocator configuration unchanged" if result.action == "set" and \
        not result.changed else _TITLES[result.action]
    return f"{title}: {to_torch(result.settings) or '(empty)'}"


def _sections(result) -> List[Tuple[str, List[str]]]:
    """The report as (heading, lines); both renderers draw from this one list."""
    version = f" (installed torch {result.torch_version})" if result.torch_version and \
        not result.torch.imported else ""
    sections = [("state", [torch_summary(result.torch) + version])]
    if result.preset:
        sections.append((f"preset {result.preset[0]}", [result.preset[1]]))
    sections.append(("environment", [
        f"{name} = {value!r}" if value is not None else f"{name} not set"
        for name, value in result.env_after.items()]))
    sections.append(("settings", [f"{name} = {value}  -- {meaning}"
                                  for name, value, meaning in result.meanings()]
                     or ["nothing set: torch uses its defaults"]))
    if result.in_effect is not None:
        sections.append(("torch reports in effect", [repr(result.in_effect)]))
    if result.applied_via and result.changed:  # "unchanged" applied nothing
        sections.append(("applied", [_applied(result)]))
    if result.deferred:
        lines = [f"{name}: {why}" for name, why in result.deferred]
        lines.append("kept out of this process's environment" + (
            "" if result.saved else
            f"; add {option('save', True)} to apply them when the extension loads after a restart"))
        sections.append(("could not change now", lines))
    if result.warnings:
        sections.append(("warnings", list(result.warnings)))
    load = command("%load_ext colab_gpu", "colab_gpu.allocator.apply_saved()")
    if result.saved:
        sections.append(("saved for after a restart", [
            f"{result.saved!r} in {result.saved_path}: applied by {load} before CUDA starts; "
            f"{command('%alloc_conf --forget', 'colab_gpu.alloc_conf(forget=True)')} removes it"]))
    if result.forgotten is not None:
        sections.append(("saved setting", [
            f"deleted {result.forgotten!r} from {result.saved_path}: {load} no "
            f"longer applies it" if result.forgotten else
            f"there was none to delete ({result.saved_path})"]))
    return sections


def render_line(result) -> str:
    """"set: expandable_segments:True; 0 warnings": the result's one line (its repr)."""
    deferred = f"; {len(result.deferred)} deferred" if result.deferred else ""
    return (f"{result.action}: {to_torch(result.settings) or 'nothing set'}; "
            f"{count(len(result.warnings), 'warning')}{deferred}")
def _applied(result) -> str:
    """What the change did, in the user's terms: the variables written or unset, and whether
    torch took it at once (through its run-time call, which ``applied_via`` names for scripts;
    a private function of torch's said nothing a user could act on)."""
    names = list(result.env_after)
    variables = " and ".join([", ".join(names[:-1]), names[-1]] if len(names) > 1 else names)
    cleared = all(value is None for value in result.env_after.values())
    if len(result.applied_via) > 1:  # torch's run-time settings call too
        return (f"{variables} unset, and torch told: it uses its defaults from now on" if cleared else
                f"written to {variables}, and given to torch, which uses it from now on")
    return (f"{variables} unset: torch uses its defaults when CUDA starts" if cleared else
            f"written to {variables}, which torch reads when CUDA starts")


def render_text(result) -> str:
    """Folded for an 80-column terminal; the configuration string and paths, which cannot be
    broken, go whole on a line of their own."""
    lines = [fold(_title(result), 4)]
    for heading, body in _sections(result):
        lines.append(f"  {heading}:")
        lines += [fold(f"    {line}", 6) for line in body]
    return "\n".join(lines)


def render_html(result) -> str:
    rows = [(heading, "<br>".join(escape(line) for line in body))
            for heading, body in _sections(result)]
    title = escape(_title(result))
    warnings = "".join(f"<li class='warning'><b>warning</b> {escape(w)}</li>" for w in result.warnings)
    return unbroken_units(STYLE + f'<div class="cgpu-card"><h4>{title}</h4>'
                          + rows_table([row for row in rows if row[0] != "warnings"])
                          + (f"<ul>{warnings}</ul>" if warnings else "") + "</div>")


def render_keys(version) -> str:
    """Every key, its kind, default and versions, marking those the installed torch lacks."""
    lines = []
    for key in KEYS:
        span = f"{format_version(key.added)}" + (
            f", removed in {format_version(key.removed)}" if key.removed else "+")
        mark = "" if version is None or key.available(version) else f"  (not in torch {format_version(version)})"
        # two short lines and the meaning folded under them: one 100-column row per key
        # wrapped mid-word in a notebook and in a terminal
        lines.append(f"{key.name}  torch {span}{mark}")
        lines.append(fold(f"    {key.kind}, default {key.default}: {key.meaning}", 4))
        if key.aliases:
            lines.append(f"    also spelled {', '.join(key.aliases)} (ROCm's name)")
        if key.rocm_choices:
            lines.append(f"    ROCm builds also take {', '.join(key.rocm_choices)}")
    return "\n".join(lines)
