"""How a message names an option: the way its caller wrote it.

One check serves both entry points, so one message reaches both: a ``%%find_batch`` user
reads ``--headroom '12x'``, a script author who wrote ``find_batch(fn, headroom='12x')``
reads ``headroom='12x'``, not an option they never typed; a hint naming a command reads
``colab_gpu.alloc_conf(forget=True)`` for them, not ``%alloc_conf --forget``. The magics run
inside :func:`as_magic`; everything else is the Python API.
"""
from __future__ import annotations

import contextlib
import contextvars
from typing import Any, Iterator

_IN_MAGIC = contextvars.ContextVar("colab_gpu_in_magic", default=False)
_FLAGS = {"variable": "--var", "path": "--from"}  # the magic options not named as the keyword
_UNSET = object()


@contextlib.contextmanager
def as_magic(magic: bool = True) -> Iterator[None]:
    """Messages made inside spell options as a magic's flags; ``magic=False`` as the Python
    API's, for the user's own code a magic runs (a ``find_batch()`` call in a ``%%find_batch`` cell)."""
    token = _IN_MAGIC.set(magic)
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


def command(magic: str, python: str) -> str:
    """A hint's command as its caller runs it: ``magic`` (``%alloc_conf --keys``) in a magic,
    ``python`` (``colab_gpu.allocator.KEYS``) elsewhere, where no magic was used."""
    return magic if _IN_MAGIC.get() else python
