"""How a message names an option: the way its caller wrote it.

One check serves both entry points, so one message reaches both: a ``%%find_batch`` user
reads ``--headroom '12x'``, a script author who wrote ``find_batch(fn, headroom='12x')``
reads ``headroom='12x'``, not an option they never typed. The magics run inside
:func:`as_magic`; everything else is the Python API.
"""
from __future__ import annotations

import contextlib
import contextvars
from typing import Any, Iterator

_IN_MAGIC = contextvars.ContextVar("colab_gpu_in_magic", default=False)
_FLAGS = {"variable": "--var", "path": "--from"}  # the magic options not named as the keyword
_UNSET = object()


@contextlib.contextmanager
def as_magic() -> Iterator[None]:
    """Messages made inside spell options as a magic's flags."""
    token = _IN_MAGIC.set(True)
    try:
        yield
    finally:
        _IN_MAGIC.reset(token)


def option(name: str, value: Any = _UNSET, plain: bool = False) -> str:
    """The keyword ``name`` (with ``value``) as its caller spelt it: ``multiple_of=8`` in Python,
    ``--multiple-of 8`` in a magic (``--save`` for True). ``plain``: a magic shows the value
    unquoted, as typed (a string already checked)."""
    if not _IN_MAGIC.get():
        return name if value is _UNSET else f"{name}={value!r}"
    flag = _FLAGS.get(name, "--" + name.replace("_", "-"))
    if value is _UNSET or value is True:
        return flag
    return f"{flag} {value if plain else repr(value)}"
