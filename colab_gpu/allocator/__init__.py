"""The caching-allocator configuration: schema per torch version, strict parsing, applying.

``alloc_conf()`` is what ``%alloc_conf`` calls; see :mod:`.apply` for when each setting
takes effect, :mod:`.saved` for the setting kept for after a restart, and the shared
:mod:`colab_gpu.torch_allocator` for what the installed torch is (``installed``) and every key
and where its facts come from (``schema``).
"""
from ..torch_allocator.installed import installed_torch_version
from ..torch_allocator.parse import AllocConfError, parse, roundup_table, to_torch, validate, version_of
from ..torch_allocator.schema import KEYS, PRESETS, ROUNDUP_INTERVALS, Key
from .apply import AllocConfResult, alloc_conf
from .saved import apply_saved

__all__ = ["AllocConfError", "AllocConfResult", "KEYS", "Key", "PRESETS", "ROUNDUP_INTERVALS", "alloc_conf",
           "apply_saved", "installed_torch_version", "parse", "roundup_table", "to_torch", "validate",
           "version_of"]
