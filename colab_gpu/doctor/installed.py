"""Whether the installed torch has an allocator key: which fragmentation fix to give.

The one fact the doctor needs of the allocator settings, which are a feature (allocator/) that
another feature must not import: kept to this function, imported when it is called, so it can
move into the core as it is.
"""
from __future__ import annotations

from typing import Optional

__all__ = ["allocator_key_available"]


def allocator_key_available(name: str) -> Optional[bool]:
    """Whether the installed torch (imported or not) accepts allocator key ``name``; None where
    its version is unknown."""
    from ..allocator.installed import installed_torch
    from ..allocator.schema import BY_NAME

    _, version, _ = installed_torch()
    return None if version is None else BY_NAME[name].available(version)
