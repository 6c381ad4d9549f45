"""Text and HTML views of a plan (plan.py): labelled PLANNED, never mistaken for a measurement."""
from __future__ import annotations

from html import escape

from .. import words
from ..render import fold
from .plan import ERROR_MARGIN


def render_line(plan) -> str:
    """"PLANNED for T4: batch_size = 96 (largest predicted to fit, 14.56 GiB)"."""
    head = f"PLANNED for {plan.gpu}"
    if plan.unsupported:
        return f"{head}: no answer, {plan.unsupported[0]} has no fake implementation"
    if plan.answer is None:
        return f"{head}: even {plan.variable}={plan.sizes[0].size if plan.sizes else '?'} is predicted not to fit"
    return (f"{head}: {plan.variable} = {plan.answer} (largest predicted to fit in "
            f"{words.size(plan.usable)}, {_margin()} of it kept spare; nothing ran on a GPU)")


def _margin() -> str:
    return f"{round(ERROR_MARGIN * 100)} %"


def render_text(plan) -> str:
    header, rows = (plan.variable, "predicted", "peak"), plan.rows()
    widths = [max(len(cell) for cell in column) for column in zip(header, *rows)]
    table = ["  " + "  ".join(cell.rjust(width) if index != 1 else cell.ljust(width)
                              for index, (cell, width) in enumerate(zip(line, widths))).rstrip()
             for line in [header, *rows]]
    kept = plan.capacity - plan.usable
    facts = [f"capacity {words.size(plan.capacity)}"
             + (f", {words.size(kept)} of it kept free (--headroom)" if kept else "")
             + f"; planned in {words.duration(plan.seconds)}",
             f"kept spare: {words.size(plan.spare)} ({_margin()}), for the plan's own error; \"too close\": a "
             f"peak that fits only without it"]
    if plan.applied and plan.answer is not None:
        facts.append(f"--apply: {plan.variable} = {plan.answer}")
    else:
        facts.append(f"{plan.variable} was not changed (--apply sets it to the planned size)")
    facts.extend(plan.notes)
    return "\n".join([fold(render_line(plan), 2), *table, *(fold(fact, 2) for fact in facts)])


def render_html(plan) -> str:
    return f"<pre>{escape(render_text(plan))}</pre>"
