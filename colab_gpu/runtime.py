"""Where the notebook runs and what state torch is in, read without side effects.

Nothing here imports torch or initializes CUDA: torch is inspected only when the user's code
has already imported it, and CUDA's state only through ``torch.cuda.is_initialized()``.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
import sys
from typing import TYPE_CHECKING, Any, Mapping, Optional, Sequence, Tuple

from .devices import GPU, gpu_models

if TYPE_CHECKING:
    from IPython.core.interactiveshell import InteractiveShell

COLAB = "colab"
KAGGLE = "kaggle"
BINDER = "binder"
JUPYTER = "jupyter"
TERMINAL = "terminal"
PLAIN_PYTHON = "python"

PLATFORM_NAMES = {
    COLAB: "Google Colab",
    KAGGLE: "Kaggle",
    BINDER: "Binder",
    JUPYTER: "Jupyter",
    TERMINAL: "IPython in a terminal",
    PLAIN_PYTHON: "plain Python",
}


@dataclasses.dataclass(frozen=True)
class TorchState:
    """What torch the user has, as far as can be told without importing or starting anything."""

    imported: bool
    version: Optional[str] = None
    cuda_version: Optional[str] = None  # the CUDA torch was built with; None for a CPU or ROCm build
    cuda_initialized: bool = False
    hip_version: Optional[str] = None  # the ROCm (HIP) a ROCm build was built with: torch.cuda runs on it
    mps_available: Optional[bool] = None  # on a Mac, whether torch reaches its GPU as device 'mps'; else None
    # Whether torch can be imported here at all: "not imported yet" told a user without torch to
    # wait for something that would never come.
    installed: bool = True

    @property
    def cuda_built(self) -> bool:
        return self.cuda_version is not None

    @property
    def build(self) -> Optional[str]:
        """Which torch this is: "cuda", "rocm" (torch.cuda runs on HIP), "mps" (a Mac's, reaching
        its GPU) or "cpu" (a CPU-only build, or a Mac's that reaches no GPU); None while torch is
        not imported (:func:`wheel_build` reads the installed one's tag)."""
        if not self.imported:
            return None
        return ("cuda" if self.cuda_built else "rocm" if self.hip_version else
                "mps" if self.mps_available else "cpu")


def wheel_build(version_text: Optional[str]) -> Optional[str]:
    """The build an installed torch's version names, read before `import torch`: "rocm"
    (2.8.0+rocm6.4), "cpu" (2.5.1+cpu) or "cuda" (2.5.1+cu121); None where the version has no
    such tag (PyPI's Linux wheels are CUDA builds without one, a Mac's have none)."""
    text = version_text or ""
    return "rocm" if "rocm" in text else "cpu" if "+cpu" in text else "cuda" if "+cu" in text else None


def cpu_only_build(torch: str, clash: str, fix: str) -> str:
    """What a CPU-only torch on a machine with a GPU is told, in one wording: "<torch> is a
    CPU-only build<clash> install a CUDA build<fix>"."""
    return f"{torch} is a CPU-only build{clash} install a CUDA build{fix}"


@dataclasses.dataclass(frozen=True)
class Runtime:
    """The notebook's surroundings: platform, accelerator hints, torch and device visibility."""

    platform: str
    accelerator_hint: Optional[str]  # "gpu" / "tpu" / "none" from the platform's own variables
    tpu_type: Optional[str]
    torch: TorchState
    cuda_visible_devices: Optional[str]  # None when unset; "" hides every GPU
    cuda_device_order: str  # "FASTEST_FIRST" (CUDA's default) or "PCI_BUS_ID"

    @property
    def platform_name(self) -> str:
        return PLATFORM_NAMES.get(self.platform, self.platform)


def detect_platform(shell: object = None, environ: Mapping[str, str] = os.environ) -> str:
    """Colab, Kaggle, Binder, Jupyter, a terminal IPython or plain Python.

    Colab's own shell class is the strongest sign. Kaggle runs on Colab's base image and so
    also sets ``COLAB_RELEASE_TAG``; its own ``KAGGLE_KERNEL_RUN_TYPE`` must win.
    """
    shell_module = type(shell).__module__ if shell is not None else ""
    if shell_module.startswith("google.colab"):
        return COLAB
    if environ.get("KAGGLE_KERNEL_RUN_TYPE") or environ.get("KAGGLE_URL_BASE"):
        return KAGGLE
    if environ.get("COLAB_RELEASE_TAG") or environ.get("COLAB_BACKEND_VERSION"):
        return COLAB
    if environ.get("BINDER_SERVICE_HOST") or environ.get("BINDER_REQUEST") or environ.get("BINDER_LAUNCH_HOST"):
        return BINDER
    shell_class = type(shell).__name__ if shell is not None else ""
    if shell_class == "ZMQInteractiveShell" or "ipykernel" in shell_module:
        return JUPYTER
    if shell is not None:
        return TERMINAL
    return PLAIN_PYTHON


def detect_tpu(environ: Mapping[str, str] = os.environ) -> Optional[str]:
    """The TPU type of a TPU VM runtime ("v2-8", ...), "TPU" when only flagged, else None.

    Kaggle's TPU image sets ``ISTPUVM=1`` (Kaggle/docker-python tpu/Dockerfile), and since
    September 2025 no longer ``TPU_ACCELERATOR_TYPE``."""
    if environ.get("TPU_ACCELERATOR_TYPE"):
        return environ["TPU_ACCELERATOR_TYPE"]
    if (environ.get("COLAB_TPU_1VM") or environ.get("PJRT_DEVICE", "").upper() == "TPU"
            or environ.get("ISTPUVM")):
        return "TPU"
    if environ.get("COLAB_TPU_ADDR"):  # the retired TPU-node runtimes
        return "TPU (node)"
    return None


def cuda_torch(modules: Mapping[str, Any] = sys.modules):
    """The user's torch once their code has initialized CUDA, else None: the check before any
    torch.cuda call, which must never start CUDA itself. A half-imported or broken torch
    counts as not started."""
    torch = modules.get("torch")
    if torch is None:
        return None
    try:
        return torch if torch.cuda.is_initialized() else None
    except Exception:
        return None


def torch_state(modules: Mapping[str, object] = sys.modules) -> TorchState:
    """torch's version and CUDA state, only if the user already imported torch."""
    torch = modules.get("torch")
    if torch is None:
        return TorchState(imported=False, installed=torch_installed())
    version = getattr(torch, "__version__", None)
    build = getattr(torch, "version", None)
    return TorchState(imported=True, version=str(version) if version else None,
                      cuda_version=getattr(build, "cuda", None), cuda_initialized=cuda_torch(modules) is not None,
                      hip_version=getattr(build, "hip", None),
                      mps_available=mps_available(torch) if sys.platform == "darwin" else None)


def torch_installed() -> bool:
    """Whether ``import torch`` would find a torch, asked of the import system without importing
    it (importlib.util.find_spec runs none of torch's code)."""
    try:
        return importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):  # a broken entry in sys.path or sys.modules: none usable
        return False


def mps_available(torch) -> Optional[bool]:
    """``torch.backends.mps.is_available()``: whether torch runs on this Mac's GPU. It only looks
    for a Metal device (no memory taken, nothing started; torch caches the answer). None where
    torch cannot say (a torch without MPS support)."""
    try:
        return bool(torch.backends.mps.is_available())
    except Exception:
        return None


def current_shell(modules: Mapping[str, object] = sys.modules) -> Optional[InteractiveShell]:
    """The running IPython shell, if IPython is already imported (never imports it)."""
    ipython = modules.get("IPython")
    get_ipython = getattr(ipython, "get_ipython", None)
    return get_ipython() if get_ipython is not None else None


def in_notebook(shell: object = None) -> bool:
    """Whether ``shell`` (the running one when None) has a kernel, so a notebook front end shows
    what it displays; an IPython in a terminal has none, whatever machine it runs on."""
    return getattr(shell if shell is not None else current_shell(), "kernel", None) is not None


def detect_runtime(shell: object = None, environ: Optional[Mapping[str, str]] = None) -> Runtime:
    """Everything about the surroundings that can be read without touching the GPU.

    Parameters
    ----------
    shell : InteractiveShell, optional
        The IPython shell; the running one when None, so ``colab_gpu.status()`` called from
        a notebook cell knows it is in a notebook.
    environ : Mapping[str, str], optional
        The environment variables read; ``os.environ`` when None.

    Returns
    -------
    Runtime
        The platform (Colab, Kaggle, Binder, Jupyter, a terminal IPython or plain Python),
        its accelerator hint and TPU type, torch's version and whether CUDA started (read
        only where the user imported torch), ``CUDA_VISIBLE_DEVICES`` and
        ``CUDA_DEVICE_ORDER``.
    """
    environ = os.environ if environ is None else environ
    platform = detect_platform(shell if shell is not None else current_shell(), environ)
    tpu = detect_tpu(environ)
    colab_gpu = environ.get("COLAB_GPU")
    if tpu:
        hint = "tpu"
    elif colab_gpu == "1":
        hint = "gpu"
    elif platform == COLAB and colab_gpu is not None:
        hint = "none"
    else:
        hint = None
    return Runtime(
        platform=platform,
        accelerator_hint=hint,
        tpu_type=tpu,
        torch=torch_state(),
        cuda_visible_devices=environ.get("CUDA_VISIBLE_DEVICES"),
        cuda_device_order=cuda_device_order(environ),
    )


def cuda_device_order(environ: Mapping[str, str]) -> str:
    """How CUDA numbers GPUs: CUDA_DEVICE_ORDER, else CUDA's default, FASTEST_FIRST."""
    return environ.get("CUDA_DEVICE_ORDER", "FASTEST_FIRST")


def torch_indices(cuda_visible_devices: Optional[str], gpus: Sequence[GPU]) -> dict:
    """Map NVML indices to the indices torch will use, given ``CUDA_VISIBLE_DEVICES``.

    ``gpus`` are NVML's GPU records (their ``index`` and ``uuid`` are read). Entries may be
    ordinals or (prefixes of) UUIDs, of the first entry's form (:func:`read_entries`); CUDA
    stops at the first entry it cannot resolve, and so does this. A GPU named twice ("0,0")
    hides every GPU, as in torch's own parsing (torch.cuda._parse_visible_devices: "Repeated
    ordinal results in empty set"). A GPU hidden from CUDA is absent from the result.
    """
    return _resolved(cuda_visible_devices, gpus)[0]


def names_a_device_twice(cuda_visible_devices: Optional[str], gpus: Sequence[GPU]) -> bool:
    """Whether CUDA_VISIBLE_DEVICES hides every GPU by naming one (or a MIG instance) twice:
    "0,0", "1,0,1", a UUID and its prefix; what :func:`torch_indices` reads as none visible."""
    return _resolved(cuda_visible_devices, gpus)[1]


def _resolved(cuda_visible_devices: Optional[str], gpus: Sequence[GPU]) -> Tuple[dict, bool]:
    """:func:`torch_indices`, and whether a device named twice emptied it."""
    ids = [(gpu.index, gpu.uuid) for gpu in gpus]
    if cuda_visible_devices is None:
        return {index: position for position, (index, _) in enumerate(ids)}, False
    entries, repeated = _read(cuda_visible_devices)
    if repeated:
        return {}, True
    mapping: dict = {}
    for entry in entries:
        match = _resolve_visible_entry(entry, ids)
        if match is None:
            break
        if match in mapping:
            return {}, True
        mapping[match] = len(mapping)
    return mapping, False


_UUID_FORMS = ("GPU-", "MIG-")


def read_entries(cuda_visible_devices: Optional[str]) -> list:
    """The entries of CUDA_VISIBLE_DEVICES that CUDA reads, stripped of spaces, as
    torch.cuda._parse_visible_devices reads them: all of the first entry's form, GPU UUIDs,
    MIG UUIDs or ordinals, up to the first of another form ("GPU-5c2e,1" is the one GPU:
    "Ordinals are not included in GPUid set", and "1,GPU-5c2e" the one ordinal) or, in a list
    of ordinals, the first that is no ordinal ("1,abc,0", "0,-1,1"); none when an entry is
    repeated ("0,0" hides every GPU)."""
    read, repeated = _read(cuda_visible_devices)
    return [] if repeated else read


def _read(cuda_visible_devices: Optional[str]) -> Tuple[list, bool]:
    """:func:`read_entries` before the check for repeats, and whether an entry is repeated."""
    entries = [part.strip() for part in cuda_visible_devices.split(",")] if cuda_visible_devices else []
    form = next((prefix for prefix in _UUID_FORMS if entries and entries[0].startswith(prefix)), None)
    read: list = []
    for entry in entries:
        if (_ordinal(entry) is None) if form is None else not entry.startswith(form):
            break
        read.append(entry)
    keys = [_ordinal(entry) for entry in read] if form is None else read
    return read, len(set(keys)) < len(keys)


def _ordinal(entry: str) -> Optional[int]:
    """An entry read as CUDA reads an ordinal, like C's strtoul: the number it starts with,
    a sign allowed ("1gpu" is 1, "+1" 1, "-0" 0); None for no number or a negative one."""
    match = re.match(r"[+-]?[0-9]+", entry)
    return int(match.group()) if match and int(match.group()) >= 0 else None


def names_mig_instances(cuda_visible_devices: Optional[str]) -> bool:
    """Whether CUDA_VISIBLE_DEVICES picks MIG instances: NVML lists their GPUs, not them, so
    which GPU torch runs on (and how many devices it sees) cannot be told from NVML's list."""
    return any(entry.startswith("MIG-") for entry in read_entries(cuda_visible_devices))


def mig_torch_indices(cuda_visible_devices: Optional[str], gpus: Sequence[GPU]) -> dict:
    """Map the MIG instance CUDA_VISIBLE_DEVICES gives this process, as ``(GPU index, MIG
    index)``, to its torch index, 0: CUDA enumerates one MIG instance only (NVIDIA's CUDA
    Programming Guide, CUDA_VISIBLE_DEVICES: "Only single MIG instance enumeration is
    supported"), the first entry's, so the instances named after it are none of torch's
    devices. Empty when the first entry is no MIG UUID, names no instance here (or, as a UUID
    prefix, more than one), or when an entry is repeated (:func:`read_entries`). Instances whose
    UUID NVML did not give cannot be matched (a recording holds none)."""
    if not names_mig_instances(cuda_visible_devices):
        return {}
    instances = [((gpu.index, mig.index), mig.uuid) for gpu in gpus for mig in gpu.mig_instances or ()]
    match = _resolve_visible_entry(read_entries(cuda_visible_devices)[0], instances)
    return {} if match is None else {match: 0}


def cuda_numbering_known(cuda_visible_devices: Optional[str], cuda_device_order: str,
                         gpus: Sequence[GPU]) -> bool:
    """Whether CUDA numbers these GPUs as :func:`torch_indices` assumes: in NVML's PCI bus order.

    CUDA's default order (FASTEST_FIRST) puts the fastest GPU first, so on a box of different
    GPUs cuda:0 (and ordinal N in CUDA_VISIBLE_DEVICES) may be another GPU than NVML's 0.
    Identical GPUs keep bus order; UUIDs in CUDA_VISIBLE_DEVICES name their GPU in any order.
    """
    if cuda_device_order == "PCI_BUS_ID" or len(gpu_models(gpus)) <= 1:
        return True
    entries = read_entries(cuda_visible_devices)
    return bool(entries) and entries[0].startswith(_UUID_FORMS)


def _resolve_visible_entry(entry: str, gpus: Sequence[Tuple[object, Optional[str]]]) -> Optional[object]:
    """The key of the one (key, uuid) pair an entry names: by a UUID prefix, or by ordinal."""
    if entry.startswith(_UUID_FORMS):
        candidates = [index for index, uuid in gpus if uuid and uuid.startswith(entry)]
        return candidates[0] if len(candidates) == 1 else None
    ordinal = _ordinal(entry)
    return ordinal if ordinal is not None and any(index == ordinal for index, _ in gpus) else None
