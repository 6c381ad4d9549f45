"""Whether the installed torch has an allocator key: which fragmentation fix to give.

The one fact the doctor needs of the allocator settings, from the shared core's
``torch_allocator`` (what the installed torch is, every key and since when it exists).
"""
from __future__ import annotations

from typing import Optional

__all__ = ["allocator_key_available"]


def allocator_key_available(name: str) -> Optional[bool]:
    """Whether the installed torch (imported or not) accepts allocator key ``name``; None where
    its version is unknown."""
    from ..torch_allocator.installed import installed_torch
    from ..torch_allocator.schema import BY_NAME

    _, version, _ = installed_torch()
    return None if version is None else BY_NAME[name].available(version)
