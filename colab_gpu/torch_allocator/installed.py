"""What the installed torch is, as far as the allocator settings are concerned: its version,
whether it is a ROCm build, the variables it reads and the settings they give it, its run-time
settings call and its report of the settings it holds; :class:`TargetTorch`, all of it read once
for one ``alloc_conf()`` call.

Each answers before `import torch` too (from the installed package's metadata and version
tag), since the settings must be right before torch first reads them. Nothing here imports
torch.
"""
from __future__ import annotations

import dataclasses
import importlib.metadata
import sys
from typing import Any, Callable, Mapping, MutableMapping, Optional, Sequence, Tuple

from ..runtime import TorchState, torch_state, wheel_build
from ..spelling import option
from .parse import AllocConfError, Settings, canonical_value, parse, validate, version_of
from .schema import BY_NAME, ENV_NAMES, GENERIC_ENV_SINCE, HIP_ENV_SINCE, NEWEST, ROCM_ENV_NAMES, Version


def installed_torch_version(modules=sys.modules) -> Optional[str]:
    """torch.__version__ if torch is imported, else the installed package's metadata."""
    torch = modules.get("torch")
    if torch is not None and getattr(torch, "__version__", None):
        return str(torch.__version__)
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return None


def installed_torch(modules=sys.modules) -> Tuple[Optional[str], Optional[Version], bool]:
    """The installed torch's version as written, as (major, minor), and whether it is a ROCm
    build: what every allocator rule is read against."""
    version_text = installed_torch_version(modules)
    return version_text, version_of(version_text), is_rocm_build(version_text, modules)


def is_rocm_build(version_text: Optional[str], modules=sys.modules) -> bool:
    """torch.version.hip once torch is imported; before that, the wheel's tag (2.8.0+rocm6.4)."""
    imported = modules.get("torch") is not None
    return (torch_state(modules).build if imported else wheel_build(version_text)) == "rocm"


def env_names(version: Optional[Version], rocm: bool) -> Tuple[str, ...]:
    """The variables torch reads and every change writes, in torch's order."""
    return ROCM_ENV_NAMES if rocm and (version or NEWEST) >= HIP_ENV_SINCE else ENV_NAMES


def read_names(names: Sequence[str], version: Optional[Version]) -> Tuple[str, ...]:
    """Those of ``names`` that torch reads: PYTORCH_ALLOC_CONF only from 2.10 (up to 2.9 CUDA's
    own parser never reads it, pytorch#183387), though every change writes it too."""
    known = version if version is not None else NEWEST
    return tuple(name for name in names if name != "PYTORCH_ALLOC_CONF" or known >= GENERIC_ENV_SINCE)


def installed_env_names(modules=sys.modules) -> Tuple[str, ...]:
    """The variables the installed torch reads, in its order (see env_names, read_names)."""
    _, version, rocm = installed_torch(modules)
    return read_names(env_names(version, rocm), version)


def current_settings(environ: MutableMapping[str, str], names: Sequence[str] = ENV_NAMES
                     ) -> Tuple[str, Settings]:
    """The configuration torch will read: the first of ``names`` that is set."""
    for name in names:
        text = environ.get(name)
        if text is not None:
            try:
                return name, parse(text)
            except AllocConfError as error:
                raise AllocConfError(f"{name} already holds something unreadable ({error}); "
                                     f"use {option('reset', True)} to start over") from None
    return "", ()


class _Setter:
    """torch's run-time settings call of the installed version, with its getter if any."""

    def __init__(self, name: str, set_: Callable[[str], None], get: Optional[Callable[[], str]]):
        self.name, self.set, self.get = name, set_, get


def runtime_setter(modules=sys.modules) -> Optional[_Setter]:
    """2.10+: torch._C._accelerator_setAllocatorSettings (every build); <= 2.9:
    torch.cuda.memory._set_allocator_settings (CUDA and ROCm builds). None before torch is
    imported, and for a torch that has neither."""
    torch = modules.get("torch")
    if torch is None:
        return None
    native: Any = getattr(torch, "_C", None)
    if hasattr(native, "_accelerator_setAllocatorSettings"):
        return _Setter("torch._C._accelerator_setAllocatorSettings",
                       native._accelerator_setAllocatorSettings,
                       getattr(native, "_accelerator_getAllocatorSettings", None))
    memory = getattr(getattr(torch, "cuda", None), "memory", None)
    legacy = getattr(memory, "_set_allocator_settings", None)
    if legacy is not None and torch_state(modules).build in ("cuda", "rocm"):
        return _Setter("torch.cuda.memory._set_allocator_settings", legacy, None)
    return None


def reported_settings(modules=sys.modules) -> Optional[str]:
    """The last settings string torch parsed, as torch reports it; None where it cannot say.
    Its getter where it has one (2.13 has, 2.11 lacks it); else the CUDA memory snapshot's
    allocator_settings, the same c10 string (``getConfigMetadata``). Ask only once CUDA runs,
    or right before handing torch a new string: the getter makes torch read the variables
    early, and the snapshot would start CUDA on a GPU."""
    setter = runtime_setter(modules)
    if setter is not None and setter.get is not None:
        return setter.get()
    memory: Any = getattr(getattr(modules.get("torch"), "cuda", None), "memory", None)
    try:  # None too: the AttributeError below
        return memory._snapshot()["allocator_settings"]["PYTORCH_CUDA_ALLOC_CONF"]
    except Exception:  # no CUDA build, backend:cudaMallocAsync (no snapshot), or a torch without the key
        return None


@dataclasses.dataclass(frozen=True)
class TargetTorch:
    """The torch being configured, read once per call without importing it: every rule of a
    call is judged against this one reading."""

    version_text: Optional[str]  # as installed ("2.13.0+cu128"); None: torch is not installed
    version: Optional[Version]  # (2, 13); None where unknown
    rocm: bool  # a ROCm build: ROCm's spellings, choices and variables
    state: TorchState  # imported, CUDA started
    setter: bool  # it has a run-time settings call (only once imported)

    @classmethod
    def installed(cls, modules: Mapping[str, Any] = sys.modules, state: Optional[TorchState] = None
                  ) -> "TargetTorch":
        """The installed torch; ``state`` overrides the detected one (for callers that know it)."""
        text, version, rocm = installed_torch(modules)
        return cls(text, version, rocm, state or torch_state(modules), runtime_setter(modules) is not None)

    @property
    def known(self) -> Version:
        """The version the rules are read for: the newest known where torch's is unknown."""
        return self.version or NEWEST

    @property
    def env_names(self) -> Tuple[str, ...]:
        """The variables it reads and every change writes, in its order."""
        return env_names(self.version, self.rocm)

    def validate(self, settings: Settings, given: Optional[Mapping[str, str]] = None) -> Settings:
        """``settings`` as this torch takes them, or AllocConfError (see parse.validate)."""
        return validate(settings, self.version, self.rocm, given)

    def canonical(self, name: str, value: str, given: Optional[Mapping[str, str]] = None) -> str:
        """One key's value as this torch takes it, or AllocConfError (see parse.canonical_value)."""
        return canonical_value(BY_NAME[name], value, self.known, self.rocm, given)
