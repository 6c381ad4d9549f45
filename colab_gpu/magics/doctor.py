"""The out-of-memory card under a failed cell, and ``%explain_oom``.

The card is hooked on IPython's ``post_run_cell`` event, which comes after IPython has shown
the traceback: the traceback stays IPython's own (``set_custom_exc`` would replace it). The
hook keeps the last report, numbers and names only, never the error: ``%clear_cache`` must be
able to free what the failed cell held. Whatever goes wrong in the doctor adds one line at most.
"""
from __future__ import annotations

import re
import sys
import time
import weakref
from typing import Any, Optional, Tuple

from IPython.core.error import UsageError

from ..spelling import as_magic

__all__ = ["OomDoctor", "watch", "unwatch", "explain_oom_magic", "doctor_of"]

_doctors: "weakref.WeakKeyDictionary[Any, OomDoctor]" = weakref.WeakKeyDictionary()


def _magics(shell):
    """The shell's GPUMagics, where the extension is loaded (its settings: oom_doctor, output)."""
    registry = getattr(getattr(shell, "magics_manager", None), "registry", {})
    return registry.get("GPUMagics")


def show(shell, report) -> None:
    """As the magics show a result: both forms for the front end, or text (GPUMagics.output)."""
    magics = _magics(shell)
    if magics is not None and magics.output == "text":
        print(str(report))
    else:
        from IPython.display import display

        display(report)


class OomDoctor:
    """The post_run_cell callback, and the last report it made."""

    def __init__(self, shell):
        self.shell = shell
        self.last = None  # the last OomReport
        self.last_error_id: Optional[int] = None  # id() of the error it explains: no reference

    def __call__(self, *args) -> None:
        """IPython >= 8.17 passes the cell's ExecutionResult, older ones nothing (or it)."""
        try:
            report = self._report(args[0] if args else None)
            if report is not None:
                show(self.shell, report)
        except (Exception, KeyboardInterrupt) as failure:  # never a traceback after the user's own
            print(f"colab_gpu: the out-of-memory card could not be made ({type(failure).__name__}: "
                  f"{str(failure)[:200]})", file=sys.stderr)

    def _report(self, result):
        magics = _magics(self.shell)
        if magics is None or not magics.oom_doctor:
            return None
        result = result if hasattr(result, "error_in_exec") else getattr(self.shell, "last_execution_result", None)
        error = getattr(result, "error_in_exec", None)
        from ..oom import is_out_of_memory

        # a magic's one-line usage message may quote one ("no out-of-memory message in ...")
        if error is None or isinstance(error, UsageError) or not is_out_of_memory(error):
            return None
        cell = getattr(getattr(result, "info", None), "raw_cell", None)
        del result
        return self.explain(error, cell)

    def explain(self, error: BaseException, cell: Optional[str] = None):
        started = time.perf_counter()
        from ..doctor import BUDGET, explain_error  # the first import counts in the half second too

        budget = max(0.05, BUDGET - (time.perf_counter() - started))
        with as_magic():  # its commands read as magics: %clear_cache, not colab_gpu.clear_cache()
            report = explain_error(error, shell=self.shell, cell=_transformed(self.shell, cell), budget=budget)
        self.last, self.last_error_id = report, id(error)
        return report


def _transformed(shell, cell: Optional[str]) -> Optional[str]:
    """The cell as Python (its magics turned into calls), for its names; as typed if that fails."""
    if not cell:
        return cell
    try:
        return shell.transform_cell(cell)
    except Exception:
        return cell


def doctor_of(shell) -> Optional[OomDoctor]:
    return _doctors.get(shell)


def watch(shell) -> OomDoctor:
    """Hook the card on the shell's cells, once however often the extension is loaded."""
    doctor = _doctors.get(shell)
    if doctor is None:
        doctor = _doctors[shell] = OomDoctor(shell)
        shell.events.register("post_run_cell", doctor)
    return doctor


def unwatch(shell) -> None:
    doctor = _doctors.pop(shell, None)
    if doctor is not None:
        shell.events.unregister("post_run_cell", doctor)


_OPTION = re.compile(r"""\s*(--json|--from(?:=|\s+)("[^"]*"|'[^']*'|\S+))(?=\s|$)""")
USAGE = '%explain_oom [--json] [--from FILE | "MESSAGE"]'


def read_line(line: str) -> Tuple[bool, Optional[str], str]:
    """(--json, --from's FILE, the message): options first or last, the rest the message as
    pasted (quotes around it dropped), whatever quotes or apostrophes it holds inside."""
    json, path, rest = False, None, line.strip()
    match = _OPTION.match(rest)
    while match is not None:
        if match.group(1) == "--json":
            json = True
        elif path is not None:
            raise UsageError(f"--from given twice; give it once (usage: {USAGE})")
        else:
            path = match.group(2).strip("\"'")
        rest = rest[match.end():].strip()
        match = _OPTION.match(rest)
    if rest == "--json" or rest.endswith(" --json"):
        json, rest = True, rest[:-len("--json")].strip()
    if rest.startswith("-"):  # no message starts so: an option misspelt
        raise UsageError(f"unrecognized option {rest.split()[0]!r} (usage: {USAGE})")
    return json, path, _unquoted(rest)


def _unquoted(rest: str) -> str:
    """The message without the quotes around it, and without a ``# comment`` after them (as the
    README writes its examples); a line that is only a comment is no message."""
    if rest.startswith("#"):
        return ""
    close = rest.find(rest[0], 1) if rest[:1] in ("'", '"') else -1
    if close > 0 and rest[close + 1:].strip()[:1] in ("", "#"):
        return rest[1:close]
    return rest


def _read_file(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as file:
            return file.read()
    except OSError as error:
        raise UsageError(f"--from {path}: cannot read it ({error.strerror or error})") from None


def _last_report(shell):
    """The card of the last out-of-memory error: the one the hook made, or, for an error it did
    not see (the card turned off, or before the extension was loaded), one made now."""
    from ..oom import is_out_of_memory

    doctor = watch(shell)
    error = getattr(sys, "last_value", None)
    if doctor.last is not None and (error is None or id(error) == doctor.last_error_id
                                    or not is_out_of_memory(error)):
        return doctor.last
    if error is not None and is_out_of_memory(error):
        return doctor.explain(error)
    raise UsageError("no out-of-memory error in this session yet; "
                     "%explain_oom \"CUDA out of memory. Tried to allocate ...\" explains a pasted message")


def explain_oom_magic(magics, line: str, cell: Optional[str]) -> None:
    """%explain_oom / %%explain_oom: the card of the last error, or of a pasted message."""
    from ..doctor import explain_text
    from ..doctor.report import PASTED

    json, path, text = read_line(line)
    if cell is not None and cell.strip():
        text = f"{text}\n{cell}".strip()
    if path is not None and text:
        raise UsageError(f"give a message or --from FILE, not both (usage: {USAGE})")
    if path is not None:  # a text with no out-of-memory message: a UserError, one line
        report = explain_text(_read_file(path), source=f"message in {path}")
    elif text:
        report = explain_text(text, source=PASTED)
    else:
        report = _last_report(magics.shell)
    if json:
        print(report.to_json())
    else:
        show(magics.shell, report)
