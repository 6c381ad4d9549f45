"""The caching-allocator configuration: schema per torch version, strict parsing, applying.

``alloc_conf()`` is what ``%alloc_conf`` calls; see :mod:`.apply` for when each setting
takes effect, :mod:`.saved` for the setting kept for after a restart, :mod:`.installed` for
what the installed torch is and :mod:`.schema` for every key and where its facts come from.
"""
from .apply import AllocConfResult, alloc_conf
from .installed import installed_torch_version
from .parse import AllocConfError, parse, roundup_table, to_torch, validate, version_of
from .saved import apply_saved
from .schema import KEYS, PRESETS, ROUNDUP_INTERVALS, Key

__all__ = ["AllocConfError", "AllocConfResult", "KEYS", "Key", "PRESETS", "ROUNDUP_INTERVALS", "alloc_conf",
           "apply_saved", "installed_torch_version", "parse", "roundup_table", "to_torch", "validate",
           "version_of"]
