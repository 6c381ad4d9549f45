"""``plan_batch``: will this training step fit on a T4? Its peak memory on a GPU at each batch
size, predicted on a machine without one.

The step runs under torch's fake tensors (FakeTensorMode: shapes and dtypes, no data, no
device): ``device="cuda"`` tensors and ``model.to("cuda")`` work without CUDA, and autocast
casts as on the GPU. Every storage the step creates is recorded when it is made and when it
dies (a finalizer on its storage), so the step's allocations and frees, in order, replay on an
emulation of CUDA's caching allocator (caching.py) for the GPU's size, with the cuBLAS and
cuDNN workspaces and the context (gpus.py). The step runs twice: the second run has the
optimizer's state and the gradients the first left. Memory of most steps is affine in the batch
size storage by storage; where two sizes and a third agree on that, other sizes are computed, not
run again. CUDA is never initialized.

cuDNN's convolution workspace: torch allocates it from its caching allocator for each
convolution, its input's gradient and its weight's gradient (aten/src/ATen/native/cudnn/
Conv_v7.cpp, Conv_v8.cpp: a byte tensor of the chosen algorithm's size, freed when the call
returns), and where it finds no room torch catches the out-of-memory error and runs the next
algorithm, down to ones that need none. Its size is cuDNN's, unknown without cuDNN; what the plan
counts is the part a documented rule fixes: tensor cores work on NHWC, so a convolution on NCHW
tensors in half precision (float16 from Volta, bfloat16 and TF32 from Ampere: Gpu.tensor_cores)
transforms its operands (cuDNN's developer guide, "Tensor Transformations": NCHW-to-NHWC, the
transposing kernels seen around each NCHW convolution under AMP), and the plan counts one NHWC
copy of each operand the call reads and writes. Channels-last tensors need no transform. The
workspace is a transient allocation that yields: it raises the peak where it finds room and
never makes a size run out of memory by itself (caching.replay's ``optional``). What the
chosen algorithm takes beyond the transforms (cudnn.benchmark's search, FFT and Winograd
buffers) is not counted.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import gc
import itertools
import os
import sys
import time
import warnings
import weakref
from typing import Any, Callable, Dict, FrozenSet, Iterator, List, Optional, Sequence, Set, Tuple, Union

from ..render.shown import Shown
from ..words import count
from .caching import Event, Replay, replay
from .gpus import Gpu, gpu_named
from .search import SearchError, whole_number

__all__ = ["Plan", "PlannedSize", "plan_batch", "plan_step", "ERROR_NOTE"]

# The plan against what fitted for real (benchmarks/plan_vs_measured.py, timm's models on an
# RTX 3090 and milabench's curves on an H100): what a result says of how sure it is.
ERROR_NOTE = ("how sure: against real recordings (benchmarks/plan_vs_measured.py), of 128 timm models "
              "trained with AMP on an RTX 3090 (two samples of 64) the plan put 96 % exactly on timm's batch "
              "ladder and all within one step, 1 of them one step too high; against milabench's H100 curves "
              "(28 points) peaks were within 1 % in the median, 25 % at worst (batch 1, where the context "
              "dominates)")
# The plan's own error, kept spare at the limit: on milabench's H100 curves the plan fell short of
# the recorded peak by up to 3 % (ResNet-50 at 128: 7404 of 7669 MiB), so a size is planned to fit
# only with that share of the usable memory to spare, lest the plan send a user out of memory.
ERROR_MARGIN = 0.03
CONVOLUTIONS = frozenset({"convolution", "convolution_backward"})
MATMULS = frozenset({"mm", "addmm", "bmm", "baddbmm", "_scaled_mm", "addbmm", "_addmm_activation"})
DEFAULT_MAX = 65536
# What CUDA's autocast runs in float32 (its float32 list), where the CPU's autocast, which plans
# it, leaves the input's float16: an attention's softmax is a float32 matrix on the GPU.
CUDA_FLOAT32 = frozenset({
    "softmax", "log_softmax", "layer_norm", "group_norm", "exp", "expm1", "log", "log10", "log2",
    "log1p", "pow", "reciprocal", "rsqrt", "sum", "prod", "cumsum", "cumprod", "logsumexp", "norm",
    "softplus", "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "nll_loss", "kl_div",
    "binary_cross_entropy_with_logits", "cosine_similarity", "cdist", "dist", "renorm"})


class _Unsupported(Exception):
    """An op torch's fake tensors cannot run: the step stops there."""


@dataclasses.dataclass(frozen=True)
class PlannedSize:
    """One size: the predicted peak (context, cuBLAS workspaces and what the allocator
    reserves) and whether it fits."""

    size: int
    peak: int  # bytes on the GPU at the step's peak, as nvidia-smi counts the process
    allocated: int  # the allocator's peak of memory handed to tensors
    fits: bool
    computed: bool = False  # from the affine fit of traced sizes, not traced itself


@dataclasses.dataclass(frozen=True, repr=False)
class Plan(Shown):
    """A planned ``%%find_batch`` answer: predicted, not run on a GPU.

    Attributes
    ----------
    variable : str
        The name of the size.
    gpu : str
        The GPU planned for.
    capacity : int
        Bytes torch can have on it (its ``total_memory``).
    usable : int
        What the headroom leaves of it.
    spare : int
        Bytes of ``usable`` a size that fits leaves free, for the plan's own error
        (``ERROR_MARGIN`` of it).
    sizes : tuple of PlannedSize
        Each size planned, smallest first.
    answer : int or None
        The largest size that fits; None when none does.
    unsupported : tuple of str
        Ops with no fake implementation, by name: the step stopped at the first, so the
        peaks are lower bounds.
    notes : tuple of str
        How sure the plan is, and what else to know.
    seconds : float
        How long planning took.
    applied : bool
        Whether ``--apply`` set the variable to ``answer``.
    """

    variable: str
    gpu: str
    capacity: int
    usable: int
    spare: int
    sizes: Tuple[PlannedSize, ...]
    answer: Optional[int]
    unsupported: Tuple[str, ...] = ()
    notes: Tuple[str, ...] = ()
    seconds: float = 0.0
    applied: bool = False

    def verdict(self, planned: "PlannedSize") -> str:
        """"fits"; "too close" where the peak fits but not with ``spare`` left; or "out of memory"."""
        if planned.fits:
            return "fits"
        return "too close" if planned.peak <= self.usable else "out of memory"

    def rows(self) -> List[Tuple[str, str, str]]:
        """(size, verdict, predicted peak) as text, one per size."""
        from ..words import size

        return [(str(planned.size), self.verdict(planned), size(planned.peak)) for planned in self.sizes]

    line_view = "colab_gpu.batch.plan_render:render_line"
    text_view = "colab_gpu.batch.plan_render:render_text"
    html_view = "colab_gpu.batch.plan_render:render_html"


# --- running the step under fake tensors -------------------------------------------------------

@dataclasses.dataclass
class Trace:
    """One traced size: its storages' allocations and frees, in order."""

    events: List[Event]
    unsupported: Optional[str] = None
    values_read: int = 0  # tensor values the step read (.item(), if tensor:), planned as 1
    optional: FrozenSet[int] = frozenset()  # serials of cuDNN's workspaces, which yield


def _fake_classes():
    from torch._subclasses import fake_tensor

    return fake_tensor


def _fake_mode(fake):
    """torch's FakeTensorMode, but one that never installs its no-op CUDA device guard. Where
    no GPU is available torch installs it on entering the mode, for the rest of the process; the
    guard reports one device, so the next backward starts autograd's device threads, and a
    process forked later (colab_gpu.launch, %%distributed) cannot run backward at all. The plan
    runs "cuda" on the CPU (``_device_mode``), so it needs no CUDA guard: this is the mode torch
    uses where a GPU is present."""

    base: Any = fake.FakeTensorMode

    class WithoutDeviceGuard(base):
        @property
        def avoid_device_init(self) -> bool:
            return False

    return WithoutDeviceGuard(allow_non_fake_inputs=True)


def _device_mode(torch, storages):
    """A TorchFunctionMode that runs "cuda" on the fake CPU: torch's fake CUDA tensors need
    CUDA's device guard, which a CPU-only build lacks (autograd then aborts the process) and
    which on a GPU machine would start CUDA. Every tensor the step makes stands for GPU memory;
    moving one to the GPU copies only a tensor the step did not make (a batch of the
    notebook's data), and moving one to the CPU keeps it where it is."""
    from torch.overrides import TorchFunctionMode

    def on_cpu(value):
        if isinstance(value, str) and value.split(":")[0] == "cuda":
            return "cpu"
        if isinstance(value, torch.device) and value.type == "cuda":
            return torch.device("cpu")
        return value

    def in_float32(value):
        if isinstance(value, torch.Tensor) and value.dtype in (torch.float16, torch.bfloat16):
            return value.float()
        return value

    class OnTheGpu(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = dict(kwargs or {})
            if func in (torch.Tensor.to, torch.Tensor.cuda, torch.Tensor.cpu):
                return self.moved(func, args, kwargs)
            if "device" in kwargs:
                kwargs["device"] = on_cpu(kwargs["device"])
            if getattr(func, "__name__", None) in CUDA_FLOAT32 and torch.is_autocast_enabled("cpu"):
                args = tuple(in_float32(arg) for arg in args)  # as CUDA's autocast casts them
            return func(*args, **kwargs)

        def moved(self, func, args, kwargs):
            tensor = args[0]
            if func is torch.Tensor.to:
                device, dtype, _, memory_format = torch._C._nn._parse_to(*args[1:], **kwargs)
                to_gpu = device is not None and device.type == "cuda"
                copy = kwargs.get("copy", False)
            else:
                dtype = memory_format = None
                to_gpu, copy = func is torch.Tensor.cuda, False
            if dtype is not None or memory_format is not None or copy:
                tensor = tensor.to(dtype=dtype, memory_format=memory_format, copy=copy)
            elif to_gpu and not storages.made(tensor):
                tensor = tensor.clone()
            return tensor

    return OnTheGpu()


class Storages:
    """The storages a traced step holds, each recorded when it is made and when it dies (a
    finalizer on its storage), as events in order."""

    def __init__(self, torch, fake_mode, gpu: Gpu):
        self.torch, self.fake_mode, self.gpu = torch, fake_mode, gpu
        self.events: List[Event] = []
        self.seen: Dict[int, int] = {}  # storage's address -> serial
        self.serials = itertools.count()
        self.workspaces: set = set()  # backward? for each cuBLAS workspace taken
        self.optional: Set[int] = set()  # serials of cuDNN's workspaces
        self.values_read = 0
        self.resident: Dict[int, Any] = {}  # a real tensor's storage -> its fake, kept alive

    def made(self, tensor) -> bool:
        """Whether ``tensor``'s storage is one the step made or held from the start."""
        try:
            key = tensor.untyped_storage()._cdata
        except Exception:
            return False
        return key in self.seen or key in self.resident

    def hold(self, tensor) -> None:
        """A tensor of the notebook's that the step works on: already on the GPU, its fake
        (the one torch's fake mode converts it to when an op reads it) recorded now."""
        if isinstance(tensor, _fake_classes().FakeTensor):
            self.record(tensor)
            return
        key = tensor.untyped_storage()._cdata
        if key not in self.resident:
            self.resident[key] = self.fake_mode.from_tensor(tensor)
            self.record(self.resident[key])

    def record(self, tensor) -> None:
        try:
            storage = tensor.untyped_storage()
        except Exception:  # a tensor without storage (sparse, a wrapper subclass)
            return
        key = storage._cdata
        if key in self.seen:
            return
        serial = self.seen[key] = next(self.serials)
        self.events.append((serial, storage.nbytes()))
        weakref.finalize(storage, self.ended, key, serial, self.events)

    def ended(self, key: int, serial: int, events: list) -> None:
        if self.seen.get(key) == serial:
            del self.seen[key]
        events.append((serial, None))

    def workspace(self) -> None:
        """cuBLAS's workspace, taken from torch's allocator at a handle's first matrix
        product and kept: one for the forward pass, one for the backward (autograd's
        thread has its own handle)."""
        backward = self.torch._C._current_autograd_node() is not None
        if backward not in self.workspaces:
            self.workspaces.add(backward)
            self.events.append((next(self.serials), self.gpu.cublas_workspace))

    def transient(self, nbytes: int) -> None:
        """A workspace taken and given back within one op, where there is room for it."""
        serial = next(self.serials)
        self.optional.add(serial)
        self.events += [(serial, nbytes), (serial, None)]

    def value(self, tensor):
        """What ``.item()`` or ``if tensor:`` reads: fake tensors hold none. Reads by torch's
        optimizers (Adam's step count) are not the step's to be told of: they size nothing."""
        if not _inside_torch_optim():
            self.values_read += 1
        dtype = tensor.dtype
        return False if dtype == self.torch.bool else 1.0 if dtype.is_floating_point else 1


def _inside_torch_optim() -> bool:
    """Whether torch.optim's code is on the stack."""
    optim = f"{os.sep}torch{os.sep}optim{os.sep}"
    frame: Optional[Any] = sys._getframe(1)
    while frame is not None:
        if optim in frame.f_code.co_filename:
            return True
        frame = frame.f_back
    return False


def _tracker(torch, storages: Storages):
    """A TorchDispatchMode giving ``storages`` what each op makes."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    fake = _fake_classes()
    failures = (fake.UnsupportedOperatorException, fake.DynamicOutputShapeException,
                fake.DataDependentOutputException)

    class Tracker(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.overloadpacket.__name__
            if name == "_local_scalar_dense":
                return storages.value(args[0])
            if name in MATMULS:
                storages.workspace()
            try:
                out = func(*args, **(kwargs or {}))
            except failures as error:
                raise _Unsupported(str(func)) from error
            for leaf in tree_leaves(out):
                if isinstance(leaf, torch.Tensor):
                    storages.record(leaf)
            if name in CONVOLUTIONS:
                for nbytes in _cudnn_transforms(torch, storages.gpu, name, args, out):
                    storages.transient(nbytes)
            return out

    return Tracker()


def _cudnn_transforms(torch, gpu: Gpu, name: str, args: Sequence[Any], out: Any) -> List[int]:
    """Bytes of cuDNN's NCHW-to-NHWC transforms at ``aten.convolution`` or
    ``aten.convolution_backward`` (its input's gradient, then its weight's), one workspace each:
    the operands' bytes where the convolution runs on tensor cores from NCHW tensors (see the
    module's docstring), else none."""
    if name == "convolution":
        source, weight = args[0], args[1]
        calls = [(source, weight, out)]
    else:
        grad_output, source, weight, mask = args[0], args[1], args[2], args[10]
        calls = [(grad_output, weight, out[0])] if mask[0] else []
        calls += [(source, grad_output, out[1])] if mask[1] else []
    dtype = str(source.dtype).replace("torch.", "")
    if source.dim() < 3 or not gpu.tensor_cores(dtype, torch.backends.cudnn.allow_tf32):
        return []
    channels_last = {4: torch.channels_last, 5: torch.channels_last_3d}.get(source.dim())
    if channels_last is not None and not source.is_contiguous() and source.is_contiguous(memory_format=channels_last):
        return []
    return [sum(tensor.numel() * tensor.element_size() for tensor in call) for call in calls]


@contextlib.contextmanager
def _autocast_on_cpu(torch):
    """``torch.autocast("cuda", ...)`` (``torch.cuda.amp.autocast()`` too) casts the fake CPU
    tensors as CUDA's would cast them (float16 unless told), where a CPU-only torch would
    disable it. torch.autocast's constructor is put back after."""
    autocast = torch.amp.autocast_mode.autocast
    constructor = autocast.__init__

    def on_cpu(self, device_type, dtype=None, *args, **kwargs):
        if device_type == "cuda":
            device_type, dtype = "cpu", dtype if dtype is not None else torch.float16
        constructor(self, device_type, dtype, *args, **kwargs)

    autocast.__init__ = on_cpu
    try:
        yield
    finally:
        autocast.__init__ = constructor


@contextlib.contextmanager
def _foreach_optimizers(torch):
    """Optimizers left to choose (``foreach=None``) take their foreach kernels on CUDA, whose
    temporaries span every parameter at once; on the fake CPU they would loop one tensor at a
    time and need less. While planning, torch.optim's choice says foreach as on CUDA."""
    patched = []
    for name, module in list(sys.modules.items()):
        choose = getattr(module, "_default_to_fused_or_foreach", None)
        if name.startswith("torch.optim") and callable(choose):
            def as_on_cuda(params, differentiable, use_fused=False, _choose=choose):
                fused, foreach = _choose(params, differentiable, use_fused)
                return fused, foreach or (not differentiable and not fused)
            patched.append((module, choose))
            module.__dict__["_default_to_fused_or_foreach"] = as_on_cuda
    try:
        yield
    finally:
        for module, choose in patched:
            module.__dict__["_default_to_fused_or_foreach"] = choose


@contextlib.contextmanager
def _swappable_fakes(torch, fake_mode):
    """torch's ``Module.to`` swaps a fake parameter with its copy, and refuses where anything
    holds a weak reference to either; the fake mode's memo of the tensors it made does. Only
    while planning, the memo forgets the two tensors before the swap (a cache: nothing else
    reads it), and torch.utils.swap_tensors is put back after."""
    swap = torch.utils.swap_tensors
    memo = fake_mode.fake_tensor_converter.meta_converter.tensor_memo

    def forgetting_swap(first, second):
        if isinstance(first, torch.Tensor) and isinstance(second, torch.Tensor):
            for key, value in list(memo.items()):
                if value is first or value is second:
                    del memo[key]
        return swap(first, second)

    torch.utils.swap_tensors = forgetting_swap
    try:
        yield
    finally:
        torch.utils.swap_tensors = swap


class _Structure:
    """What a step under fake tensors may change in the user's real modules and optimizers,
    saved by reference and put back: the parameter, buffer and submodule tables (``to()``
    replaces a real parameter with a fake one), each parameter's ``.grad`` (autograd gives a
    real parameter a fake gradient), an optimizer's groups and state. No tensor is copied:
    fake ops never write into a real tensor's memory."""

    def __init__(self, torch, objects: Sequence[Any]):
        self.saved: List[Tuple[Any, str, Any]] = []
        for obj in objects:
            if isinstance(obj, torch.nn.Module):
                for module in obj.modules():
                    for table in ("_parameters", "_buffers", "_modules"):
                        self.saved.append((module, table, dict(getattr(module, table))))
                    for parameter in module._parameters.values():
                        if parameter is not None:
                            self.saved.append((parameter, "grad", parameter.grad))
            elif isinstance(obj, torch.optim.Optimizer):
                self.saved.append((obj, "param_groups", [dict(group) for group in obj.param_groups]))
                self.saved.append((obj, "state", dict(obj.state)))

    def restore(self) -> None:
        for obj, field, value in self.saved:
            current = getattr(obj, field)
            if field == "grad":
                if current is not value:
                    obj.grad = value
            elif isinstance(current, list):
                current[:] = value
            else:
                current.clear()
                current.update(value)


def _fake_copies(torch, fake_mode, namespace: Dict[str, Any], objects: Sequence[Any]) -> Dict[str, Any]:
    """name -> fake copy of each name in ``namespace`` holding one of ``objects`` (models,
    optimizers, schedulers, tensors the step reads), copied together so that an optimizer's
    copy updates the model's copy."""
    fake = _fake_classes()
    wanted = {id(obj) for obj in objects}
    names = [name for name, value in namespace.items() if id(value) in wanted]
    if not names:
        return {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with fake.FakeCopyMode(fake_mode):
            copies = copy.deepcopy([namespace[name] for name in names], {})
    return dict(zip(names, copies))


def _tensors_of(torch, objects: Sequence[Any]) -> Iterator[Any]:
    """The tensors the fake copies hold: parameters, buffers, optimizer state, tensors."""
    for obj in objects:
        if isinstance(obj, torch.Tensor):
            yield obj
        elif isinstance(obj, torch.nn.Module):
            yield from obj.parameters()
            yield from obj.buffers()
        elif isinstance(obj, torch.optim.Optimizer):
            for state in obj.state.values():
                yield from (value for value in state.values() if isinstance(value, torch.Tensor))


def trace_step(step: Callable[[int], Any], size: int, gpu: Gpu, namespace: Optional[Dict[str, Any]] = None,
               objects: Sequence[Any] = (), runs: int = 2) -> Trace:
    """Run ``step(size)`` ``runs`` times under fake tensors, recording its storages. The
    ``objects`` held by names of ``namespace`` are replaced by fake copies while it runs; any
    real module or optimizer among them is put back as it was, as is the namespace."""
    import torch

    fake = _fake_classes()
    fake_mode = _fake_mode(fake)
    storages = Storages(torch, fake_mode, gpu)
    structure = _Structure(torch, objects)
    namespace = namespace if namespace is not None else {}
    copies = _fake_copies(torch, fake_mode, namespace, objects)
    originals = {name: namespace[name] for name in copies}
    collecting = gc.isenabled()
    gc.disable()  # storages end when the step drops them, not at a collection's whim
    unsupported = None
    try:
        namespace.update(copies)
        with _swappable_fakes(torch, fake_mode), _foreach_optimizers(torch), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # GradScaler's "CUDA is not available" and the like
            with _autocast_on_cpu(torch), fake_mode, _device_mode(torch, storages), _tracker(torch, storages):
                swapped = {id(value) for value in originals.values()}
                held = list(copies.values()) + [obj for obj in objects if id(obj) not in swapped]
                for tensor in _tensors_of(torch, held):
                    storages.hold(tensor)
                for _ in range(runs):
                    storages.values_read = 0  # one step's, the last run's
                    try:
                        step(size)
                    except _Unsupported as error:
                        unsupported = str(error)
                        break
            events = list(storages.events)
            optional = frozenset(storages.optional)
    finally:
        for name, value in originals.items():
            if namespace.get(name) is copies[name]:
                namespace[name] = value
        structure.restore()
        copies = {}
        if collecting:
            gc.enable()
    storages.seen.clear()
    storages.resident.clear()
    return Trace(events, unsupported, storages.values_read, optional)


def _affine(traces: Sequence[Tuple[int, List[Event]]]) -> Optional[Callable[[int], List[Event]]]:
    """Where the traced sizes made the same storages in the same order, each storage's bytes
    affine in the size (checked on a third size): the events of any size. Else None."""
    (a, first), (b, second) = traces[0], traces[1]
    if len(first) != len(second) or any(x[0] != y[0] or (x[1] is None) != (y[1] is None)
                                        for x, y in zip(first, second)):
        return None
    slopes = [(n, None if x is None or y is None else (x, (y - x) / (b - a)))
              for (n, x), (_, y) in zip(first, second)]

    def at(size: int) -> List[Event]:
        return [(n, None if line is None else max(0, round(line[0] + line[1] * (size - a))))
                for n, line in slopes]

    for size, events in traces[2:]:
        if at(size) != [(n, x) for n, x in events]:
            return None
    return at


def plan_step(step: Callable[[int], Any], gpu: Union[str, Gpu] = "T4", *, variable: str = "batch_size",
              start: Optional[int] = None, maximum: Optional[int] = None, multiple_of: int = 1,
              headroom=None, namespace: Optional[Dict[str, Any]] = None, objects: Sequence[Any] = ()) -> Plan:
    """The plan of ``step(size)`` for ``gpu``: see :func:`plan_batch`. ``namespace`` and
    ``objects``: as :func:`trace_step` takes them."""
    from .search import Headroom

    began = time.perf_counter()
    target = gpu if isinstance(gpu, Gpu) else gpu_named(gpu)
    multiple_of = whole_number("multiple_of", multiple_of)
    first = whole_number("start", start) if start is not None else max(multiple_of, 1)
    first = max(multiple_of, first // multiple_of * multiple_of)
    top = whole_number("max", maximum) if maximum is not None else max(DEFAULT_MAX, first)
    if top < first:
        raise SearchError(f"max={top} is below start={first}")
    room = Headroom(headroom if headroom is not None else "0")
    usable = room.usable(target.total) or 0
    spare = round(usable * ERROR_MARGIN)
    limit = usable - spare - target.context
    traced: Dict[int, Trace] = {}
    rows: Dict[int, PlannedSize] = {}
    affine: Optional[Callable[[int], List[Event]]] = None

    def trace(size: int) -> Trace:
        if size not in traced:
            traced[size] = trace_step(step, size, target, namespace, objects)
        return traced[size]

    def planned(size: int) -> PlannedSize:
        nonlocal affine
        if size in rows:
            return rows[size]
        computed = False
        if affine is None and len(traced) >= 3 and not any(t.unsupported for t in traced.values()):
            # the three largest sizes traced: a batch of one may take other paths (a squeeze)
            affine = _affine(sorted((s, t.events) for s, t in traced.items())[-3:])
        if affine is not None and size not in traced:
            # the fit's sizes made the same storages, its workspaces with the same serials
            events, optional, computed = affine(size), traced[max(traced)].optional, True
        else:
            traced_here = trace(size)
            events, optional = traced_here.events, traced_here.optional
        result: Replay = replay(events, max(limit, 0), optional)
        fits = not result.out_of_memory and limit > 0
        if not fits:  # what it would have reserved with room enough, not where it stopped
            result = replay(events)
        rows[size] = PlannedSize(size, target.context + result.reserved, result.allocated, fits, computed)
        return rows[size]

    largest, failed, bisected = _search(planned, lambda size: bool(traced.get(size) and traced[size].unsupported),
                                        first, top, multiple_of)
    unsupported = tuple(dict.fromkeys(t.unsupported for t in traced.values() if t.unsupported))
    notes = [_how_sure(target)]
    read = max((t.values_read for t in traced.values()), default=0)
    if read:
        notes.append(f"the step read {count(read, 'tensor value')} (.item(), if on a tensor): "
                     f"fake tensors have none, so each read as 1 (False for a truth value)")
    if unsupported:
        notes.append(f"{', '.join(unsupported)} has no fake implementation: the step was planned up to it, "
                     f"so the peaks are lower bounds")
        largest = None
    computed = sum(row.computed for row in rows.values())
    if computed:
        notes.append(f"{len(traced)} sizes ran under fake tensors; {computed} more were computed from them "
                     f"(every storage's size was affine in {variable})")
    # The doubling's sizes and the two the bisection ended between: not every size it tried.
    shown = (set(rows) - bisected) | ({largest or 0, failed or 0} & set(rows))
    sizes = tuple(rows[key] for key in sorted(shown))
    return Plan(variable=variable, gpu=target.name, capacity=target.total, usable=usable, spare=spare, sizes=sizes,
                answer=largest, unsupported=unsupported, notes=tuple(notes),
                seconds=time.perf_counter() - began)


def _search(planned: Callable[[int], "PlannedSize"], stopped: Callable[[int], bool], first: int, top: int,
            multiple_of: int) -> Tuple[Optional[int], Optional[int], Set[int]]:
    """The largest size that fits and the smallest that does not, and the sizes bisected
    between: three small sizes first (the affine fit and its check), then doubling, then
    bisection to one ``multiple_of``."""
    size, largest, failed = first, None, None
    bisected: Set[int] = set()
    while size <= top:
        row = planned(size)
        if stopped(size):
            return None, None, bisected
        if not row.fits:
            failed = size
            break
        largest = size
        size = size * 2 if size >= 4 * multiple_of else size + multiple_of
    while largest is not None and failed is not None and failed - largest > multiple_of:
        middle = (largest + failed) // 2 // multiple_of * multiple_of
        if middle <= largest:
            break
        bisected.add(middle)
        if planned(middle).fits:
            largest = middle
        else:
            failed = middle
    return largest, failed, bisected


def _how_sure(gpu: Gpu) -> str:
    context = "checked against real recordings" if gpu.measured else "estimated for its generation"
    from ..words import size

    return f"{ERROR_NOTE}; the CUDA context and libraries counted: {size(gpu.context)}, {context}"


def plan_batch(fn: Callable[[int], Any], gpu: Union[str, Gpu] = "T4", *, variable: str = "batch_size",
               start: Optional[int] = None, max: Optional[int] = None, multiple_of: int = 1,
               headroom: Union[str, int, None] = None) -> Plan:
    """Predict the largest batch size whose training step fits on a GPU, without that GPU.

    ``fn(batch_size)`` runs under torch's fake tensors (shapes and dtypes, no data): on a CPU
    runtime too, with ``device="cuda"`` tensors, ``model.to("cuda")`` and autocast working as on
    the GPU, and CUDA never initialized. Each size's peak is what CUDA's caching allocator would
    reserve for the step's tensors (twice run: the optimizer's state and the gradients of the
    first run count), plus cuBLAS's workspaces and the CUDA context of that GPU.

    Parameters
    ----------
    fn : callable
        ``fn(batch_size)`` runs one training (or inference) step.
    gpu : str, default "T4"
        ``"T4"``, ``"L4"``, ``"V100-16GB"``, ``"A100-40GB"``, ``"A100-80GB"``, ``"H100"``,
        ``"RTX3090"``, a capacity like ``"15GiB"``, or ``"this"`` for this machine's GPU (read
        through NVML).
    variable : str, default "batch_size"
        The name of the size in the report.
    start, max : int, optional
        The smallest and largest size planned (default ``multiple_of`` and 65536).
    multiple_of : int, default 1
        Only its multiples are planned.
    headroom : str or int, optional
        Memory to keep free: bytes (``"512MiB"``) or a share (``"10%"``).

    Returns
    -------
    Plan
        The predicted peak at each size planned and ``plan.answer``, the largest that fits
        (None when none does, or when an op without a fake implementation stopped the step:
        ``plan.unsupported`` names it). Nothing ran on a GPU: labelled PLANNED.

    Raises
    ------
    TypeError
        ``fn`` is not callable.
    colab_gpu.batch.SearchError
        (a ValueError) A ``gpu`` or option the plan cannot work with; the message says what is
        accepted.
    Exception
        The error ``fn`` raised (a shape mismatch shows under fake tensors as on the GPU).
    """
    if not callable(fn):
        raise TypeError(f"plan_batch() takes a function that runs one step at a batch size, "
                        f"fn(batch_size), not {fn!r:.80}")
    from .state import stateful_objects

    found = list(stateful_objects([(getattr(fn, "__name__", "fn"), fn)]).values())
    namespace = getattr(fn, "__globals__", None)
    return plan_step(fn, gpu, variable=variable, start=start, maximum=max, multiple_of=multiple_of,
                     headroom=headroom, namespace=namespace, objects=found)
