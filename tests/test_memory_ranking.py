"""The "who holds my memory" ranking on real torch objects: shared storage, cycles, big containers."""
from __future__ import annotations

import dataclasses
import gc

import torch

from colab_gpu.memory import MAX_OBJECTS, Holders, rank_holders


def ranked(**variables):
    holders, total = rank_holders(variables.items(), torch)
    return {holder.name: holder for holder in holders}, [h.name for h in holders], dict(total)


def nbytes(*tensors) -> int:
    """Bytes of the distinct storages behind ``tensors``, computed independently of the ranking."""
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    return sum(storages.values())


def without_settings_report(monkeypatch, torch) -> None:
    """A torch that cannot say what settings it holds, so that the environment decides: no
    getter, only the legacy run-time setter (up to 2.9), no CUDA memory snapshot to ask."""
    for name in ("_accelerator_getAllocatorSettings", "_accelerator_setAllocatorSettings", "_cuda_memorySnapshot"):
        monkeypatch.delattr(torch._C, name, raising=False)
    monkeypatch.setattr(torch.cuda.memory, "_set_allocator_settings", lambda text: None, raising=False)


def test_the_biggest_holder_comes_first():
    small, big, middle = torch.ones(1_000), torch.ones(1_000_000), torch.ones(100_000)
    by_name, order, _ = ranked(small=small, nested={"a": [(big,)]}, middle=middle, text="no tensor")
    assert order == ["nested", "middle", "small"]
    assert by_name["nested"].nbytes == 4_000_000 and by_name["nested"].tensors == 1
    assert by_name["nested"].by_device == (("cpu", 4_000_000),)


def test_views_and_repeats_count_their_storage_once():
    base = torch.ones(1_000_000)
    view, reshaped = base[10:], base.view(1000, 1000)
    by_name, _, total = ranked(base=base, views=[view, reshaped, view], twice={"a": base, "b": base})
    assert {h.nbytes for h in by_name.values()} == {4_000_000}
    assert all(h.unique == 0 for h in by_name.values())  # each shares it with the others
    assert total == {"cpu": 4_000_000}


def test_model_and_its_optimizer_share_parameters():
    model = torch.nn.Sequential(torch.nn.Linear(300, 300), torch.nn.BatchNorm1d(300))
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(8, 300)).sum().backward()
    optimizer.step()
    params = list(model.parameters())
    grads = [p.grad for p in params]
    buffers = list(model.buffers())
    state = [t for s in optimizer.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
    by_name, order, total = ranked(model=model, optimizer=optimizer)
    assert by_name["model"].nbytes == nbytes(*params, *grads, *buffers)
    assert by_name["optimizer"].nbytes == nbytes(*params, *grads, *state)
    assert by_name["optimizer"].unique == nbytes(*state)  # what `del optimizer` gives back
    assert by_name["model"].unique == nbytes(*buffers)
    assert total == {"cpu": nbytes(*params, *grads, *buffers, *state)}
    assert order[0] == "optimizer"


def test_reference_cycles_end():
    tensor = torch.ones(1_000)
    loop = [tensor]
    loop.append(loop)

    class Node:
        def __init__(self):
            self.me, self.data = self, tensor

    by_name, _, _ = ranked(loop=loop, node=Node())
    assert by_name["loop"].nbytes == by_name["node"].nbytes == 4_000


def test_large_containers_are_walked_and_bounded():
    many = [torch.ones(2) for _ in range(100_000)]
    ints = list(range(1_000_000))
    by_name, order, _ = ranked(many=many, ints=ints)
    assert order == ["many"]  # a million ints hold no tensor
    assert by_name["many"].tensors == 100_000 and by_name["many"].nbytes == 100_000 * 8
    assert not by_name["many"].truncated and MAX_OBJECTS > 100_000
    holders, _ = rank_holders([("many", many)], torch, max_objects=1_000)
    assert holders[0].truncated and 0 < holders[0].nbytes < 100_000 * 8


def test_the_bound_counts_plain_values_too():
    """A list of 30 million token ids took 4 s a walk when ints did not count."""
    holders, _ = rank_holders([("mixed", [list(range(2_000)), torch.ones(2)])], torch, max_objects=1_000)
    assert holders[0].truncated and holders[0].nbytes == 8
    holders, _ = rank_holders([("small", [list(range(500)), torch.ones(2)])], torch, max_objects=1_000)
    assert not holders[0].truncated


def test_gradients_slots_dataclasses_and_kept_exceptions_are_followed():
    weight = torch.ones(1_000, requires_grad=True)
    (weight * 2).sum().backward()

    @dataclasses.dataclass
    class Batch:
        inputs: torch.Tensor

    class Slotted:
        __slots__ = ("held",)

        def __init__(self, held):
            self.held = held

    def failing():
        local = torch.ones(10_000)
        raise RuntimeError(local.shape)

    def caught():
        try:
            failing()
        except RuntimeError as error:
            return error

    sparse = torch.sparse_coo_tensor(torch.tensor([[0, 5]]), torch.ones(2), (10,), check_invariants=True)
    by_name, _, _ = ranked(weight=weight, batch=Batch(torch.ones(500)), slotted=Slotted(torch.ones(250)),
                           error=caught(), sparse=sparse, method=Batch.__repr__.__get__(Batch(torch.ones(50))))
    assert by_name["weight"].nbytes == 8_000  # the tensor and its gradient
    assert by_name["batch"].nbytes == 2_000 and by_name["slotted"].nbytes == 1_000
    assert by_name["error"].nbytes == 40_000  # the failed frame's local, through the traceback
    assert by_name["sparse"].nbytes == nbytes(sparse._indices(), sparse._values())
    assert by_name["method"].nbytes == 200  # a bound method holds its object


class Refusing(torch.Tensor):
    """A tensor subclass whose __torch_function__ raises on every attribute (user code)."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        raise RuntimeError("this subclass refuses")


def test_user_code_that_raises_is_not_run_or_is_skipped():
    class NoIteration(list):
        def __iter__(self):
            raise RuntimeError("iterated")

    class NoKeys(dict):
        def keys(self):
            raise RuntimeError("keys")

        values = keys

    by_name, _, _ = ranked(listed=NoIteration([torch.ones(10)]), mapped=NoKeys(t=torch.ones(20)),
                           refusing=[torch.ones(30).as_subclass(Refusing), torch.ones(40)])
    assert by_name["listed"].nbytes == 40 and by_name["mapped"].nbytes == 80
    assert by_name["refusing"].nbytes == 160  # the plain tensor next to the refusing one


def test_cpu_bytes_skip_a_tensor_subclass_that_raises():
    from colab_gpu.memory import cpu_tensor_bytes

    refusing, plain = torch.ones(1_000).as_subclass(Refusing), torch.ones(1_000)
    assert cpu_tensor_bytes(torch) >= plain.untyped_storage().nbytes()
    del refusing


def test_a_function_holds_its_closure_and_defaults_not_its_globals():
    weights = torch.ones(1_000)

    def make_loss():
        return lambda y: (y * weights).sum()

    def with_default(x, cache=torch.ones(500)):
        return x

    def with_keyword_default(x, *, cache=torch.ones(250)):
        return x

    def uses_a_global(x):
        return x * GLOBAL_TENSOR

    by_name, order, _ = ranked(loss=make_loss(), default=with_default, keyword=with_keyword_default,
                               module_level=uses_a_global)
    assert order == ["loss", "default", "keyword"]
    assert by_name["loss"].nbytes == 4_000 and by_name["default"].nbytes == 2_000
    assert by_name["keyword"].nbytes == 1_000


GLOBAL_TENSOR = torch.ones(10)


def test_a_partial_and_a_paused_generator_hold_what_they_keep_alive():
    """`step = partial(train_step, model=model)` and a generator paused after `data = ...; yield
    data[:10]` were not listed: after `del model` or `del first` the memory stayed, and the
    ranking named no variable holding it."""
    import functools

    model = torch.nn.Linear(100, 10)

    def batches():
        data = torch.ones(2_000)
        yield data[:10]
        yield GLOBAL_TENSOR  # its globals are not the generator's

    def ended():
        local = torch.ones(100)
        yield local

    paused, finished = batches(), ended()
    next(paused)
    list(finished)
    by_name, order, _ = ranked(step=functools.partial(torch.add, model.weight, alpha=2),
                               keyword=functools.partial(sum, start=torch.ones(300)),
                               paused=paused, finished=finished)
    assert order == ["paused", "step", "keyword"]
    assert by_name["paused"].nbytes == 8_000 and by_name["paused"].tensors == 1
    assert by_name["step"].nbytes == nbytes(model.weight) and by_name["keyword"].nbytes == 1_200


def test_an_iterator_zip_and_an_lru_cache_hold_what_they_keep_alive():
    """`it = iter(batches)` then `del batches`, a zip and an @lru_cache'd function's results
    kept their tensors alive, and --vars said "No variable of yours holds a tensor": built-in
    objects show none of what they keep as attributes."""
    import functools

    batches = [torch.ones(1_000), torch.ones(2_000)]

    @functools.lru_cache
    def embed(i):
        return torch.ones(500) * i

    embed(1), embed(2)
    by_name, order, _ = ranked(it=iter(batches), pairs=zip([torch.ones(300)], [1]), embed=embed,
                               position=torch.device("cpu"))
    assert order == ["it", "embed", "pairs"]
    assert by_name["it"].nbytes == nbytes(*batches) and by_name["it"].tensors == 2
    assert by_name["embed"].nbytes == 4_000 and by_name["pairs"].nbytes == 1_200


def test_a_numpy_array_and_the_tensor_lent_its_memory_hold_it_together():
    """`t = torch.from_numpy(arr)`: --vars listed t as holding that memory alone, and not arr,
    which owns every byte of it: `del t` frees nothing. Now both hold it, shared, counted once;
    a view of arr holds it too, and a plain array no tensor lies on is no holder."""
    import numpy

    arr = numpy.zeros(1_000_000, dtype=numpy.float32)
    t, alone = torch.from_numpy(arr), numpy.ones(500_000)
    by_name, order, total = ranked(arr=arr, t=t, tail=arr[10:], alone=alone)
    assert order == ["arr", "t", "tail"]
    assert all(by_name[name].nbytes == 4_000_000 and by_name[name].unique == 0 for name in order)
    assert by_name["arr"].tensors == 0 and by_name["arr"].arrays == 1
    assert total == {"cpu": 4_000_000}
    by_name, _, _ = ranked(t=t)  # with arr gone, t holds it alone (the tensor keeps arr alive)
    assert by_name["t"].unique == 4_000_000
    tail = torch.from_numpy(arr[250_000:])  # a tensor on a view lies inside arr's memory
    by_name, _, _ = ranked(arr=arr, tail=tail)
    assert by_name["arr"].nbytes == by_name["tail"].nbytes == 3_000_000 and by_name["arr"].arrays == 1


def test_an_array_from_tensor_numpy_holds_the_tensors_storage():
    """`arr = t.numpy()` then `del t`: arr keeps t's storage alive, yet --vars said no variable
    held a tensor; an array's base is the tensor it views."""
    t = torch.ones(250_000)
    arr = t[1000:].numpy()
    by_name, _, _ = ranked(arr=arr, doubled=[arr.reshape(-1, 1)])
    assert by_name["arr"].nbytes == by_name["doubled"].nbytes == nbytes(t)
    assert by_name["arr"].tensors == 1 and by_name["arr"].unique == 0


def test_ranking_a_paused_generator_does_not_keep_what_it_later_drops():
    """Python 3.11 and 3.12 cache a frame's ``f_locals`` on the frame: read once by the ranking,
    a generator's ``data`` stayed alive after the generator's own ``del data``, until it ended,
    so ``%clear_cache --vars`` kept the memory it reported on. Its closure cells count too."""
    import weakref

    scale = torch.ones(500)

    def batches():
        data = torch.ones(2_000)
        yield data[:10] if scale.numel() else None
        del data
        yield None
        yield None

    paused = batches()
    next(paused)
    by_name, _, _ = ranked(paused=paused)
    assert by_name["paused"].nbytes == 8_000 + 2_000 and by_name["paused"].tensors == 2
    data = weakref.ref(next(obj for obj in gc.get_referents(paused)  # read without f_locals
                            if isinstance(obj, torch.Tensor) and obj.numel() == 2_000))
    next(paused)  # del data
    gc.collect()
    assert data() is None


def test_one_line_agrees_with_the_number_of_holders():
    def line(**variables):
        holders, total = rank_holders(variables.items(), torch)
        return Holders(holders=holders, total_by_device=total).summary()

    assert line(only=torch.ones(4)) == "1 variable holds tensors: only 16 B"
    assert line(a=torch.ones(8), b=torch.ones(4)) == "2 variables hold tensors; the most: a 32 B, b 16 B"


def test_a_model_on_the_meta_device_holds_no_memory_and_says_so():
    from colab_gpu.memory import ClearReport
    from colab_gpu.render.memory import holders_text

    with torch.device("meta"):
        model = torch.nn.Linear(1_000, 1_000)
    holders, total = rank_holders([("model", model)], torch)
    found = Holders(holders=holders, total_by_device=total)
    assert "  model            0 B in 2 tensors - Linear" in holders_text(found).splitlines()
    assert ClearReport(before=(), steps=(), holders=found).summary() == "clear_cache: nothing freed"


def test_holders_beyond_the_top_ten_are_not_summed_over_shared_storage():
    from colab_gpu.render.memory import holders_text

    base = torch.ones(1_000)
    holders, total = rank_holders([(f"view{i:02}", base[i:]) for i in range(15)], torch)
    lines = holders_text(Holders(holders=holders, total_by_device=total)).splitlines()
    assert "  5 more           each 3.91 KiB or less" in lines  # not 19.5 KiB: one storage
    assert "  all variables    cpu 3.91 KiB (each storage counted once)" in lines


def test_the_rest_on_a_gpu_is_not_the_allocators_rounding():
    """torch.cuda.memory_allocated() counts each storage in 512 B blocks: a model of 4,000
    small tensors on cuda:0 would have shown ~2 MiB "that no variable reaches"."""
    from colab_gpu.memory import Reading
    from colab_gpu.memory.rounding import unreached_bytes

    union = {("cuda:0", address): 4 * 10 for address in range(1, 4_001)}  # 10 floats each
    assert unreached_bytes([Reading("cuda:0", 4_000 * 512)], union) == ()
    workspace = 32 * 1024 ** 2  # cuBLAS's, on a Hopper GPU: a library's cache
    assert unreached_bytes([Reading("cuda:0", 4_000 * 512 + workspace)], union) == (("cuda:0", workspace),)
    assert unreached_bytes([Reading("cpu", 4 * 1024 ** 2)], {("cpu", 1): 40}) == (("cpu", 4 * 1024 ** 2 - 40),)


def test_the_rest_on_a_gpu_is_not_the_large_blocks_left_unsplit():
    """A block over 1 MiB is not split for a remainder of 1 MiB or less, which
    memory_allocated() counts too: 200 weights of 1.5 MiB, each given a 2.4 MiB cached block
    in training, would have shown 180 MiB "that no variable reaches"."""
    from colab_gpu.memory import Reading
    from colab_gpu.memory.rounding import unreached_bytes

    weights = {("cuda:0", address): 3 * 512 * 1024 for address in range(1, 201)}
    assert unreached_bytes([Reading("cuda:0", 200 * int(2.4 * 1024 ** 2))], weights) == ()
    held = 600 * 1024 ** 2  # more than any rounding explains: still said
    rest = unreached_bytes([Reading("cuda:0", 200 * int(2.4 * 1024 ** 2) + held)], weights)
    assert rest and 0.95 * held < rest[0][1] <= held  # a lower bound of what is held


def test_the_rest_on_a_gpu_is_not_the_oversize_blocks_left_unsplit(monkeypatch):
    """Under max_split_size_mb:128 a block of 128 MiB or more is never split, and a cached one
    is reused for a request up to 20 MiB smaller: 20 activations of 130 MiB, each given a
    cached 148 MiB block, showed "at least 340 MiB that no variable reaches", none of it held."""
    import torch

    from colab_gpu.memory import Reading
    from colab_gpu.memory.rounding import unreached_bytes

    mib = 1024 ** 2
    stats = {"max_split_size": 128 * mib}  # the faked boundary: the allocator's statistics
    monkeypatch.setattr(torch.cuda, "memory_stats", lambda device=None: stats)
    activations = {("cuda:0", address): 130 * mib for address in range(1, 21)}
    assert unreached_bytes([Reading("cuda:0", 20 * 148 * mib)], activations, torch) == ()
    held = 600 * mib  # more than any rounding explains: still said
    rest = unreached_bytes([Reading("cuda:0", 20 * 148 * mib + held)], activations, torch)
    assert rest and held - 20 * 20 * mib <= rest[0][1] <= held  # a lower bound, within 20 MiB a block
    # the limit set after CUDA started (torch's statistics keep the first): oversize blocks tell
    stats.clear()
    stats.update({"max_split_size": -1, "oversize_allocations.current": 20})
    assert unreached_bytes([Reading("cuda:0", 20 * 148 * mib)], activations, torch) == ()
    stats["oversize_allocations.current"] = 0  # no limit: every large block is split
    assert unreached_bytes([Reading("cuda:0", 20 * 148 * mib)], activations, torch) == (("cuda:0", 20 * 17 * mib),)


def test_the_rest_on_a_gpu_is_not_the_oversize_blocks_of_a_limit_of_20_mib_or_less(monkeypatch):
    """torch 2.10 takes max_split_size_mb:20 (and 2.11, after large_segment_size_mb:12, 12):
    set after CUDA started, the statistics say only that blocks are oversize. 20 activations
    of 20 MiB, each given a cached 39 MiB block, showed "at least 360 MiB that no variable
    reaches": a block of 20 MiB was taken for one no limit can cover."""
    import torch

    from colab_gpu.memory import Reading
    from colab_gpu.memory.rounding import unreached_bytes

    mib = 1024 ** 2
    stats = {"max_split_size": -1, "oversize_allocations.current": 20}  # the faked boundary
    monkeypatch.setattr(torch.cuda, "memory_stats", lambda device=None: stats)
    activations = {("cuda:0", address): 20 * mib for address in range(1, 21)}
    assert unreached_bytes([Reading("cuda:0", 20 * 39 * mib)], activations, torch) == ()


def test_the_rest_on_a_gpu_is_not_the_power_of_two_rounding(monkeypatch):
    """Under roundup_power2_divisions:4 the allocator makes a block of 1.25 GiB of a 1.1 GiB
    request: 8 such activations showed "at least 1.20 GiB that no variable reaches", none of
    it held. torch's report of its settings (2.10+) says which; before 2.10 the environment."""
    import torch

    from colab_gpu.memory import Reading
    from colab_gpu.memory.rounding import unreached_bytes

    mib, gib = 1024 ** 2, 1024 ** 3
    monkeypatch.setattr(torch.cuda, "memory_stats", lambda device=None: {})  # the faked boundary
    setting = ["roundup_power2_divisions:4"]
    monkeypatch.setattr(torch._C, "_accelerator_getAllocatorSettings", lambda: setting[0], raising=False)
    activations = {("cuda:0", address): int(1.1 * gib) for address in range(1, 9)}
    assert unreached_bytes([Reading("cuda:0", 8 * 5 * gib // 4)], activations, torch) == ()
    held = 600 * mib  # more than any rounding explains: still said
    rest = unreached_bytes([Reading("cuda:0", 8 * 5 * gib // 4 + held)], activations, torch)
    assert rest and held - 8 * mib <= rest[0][1] <= held
    # per size range: 1.1 GiB is in 1024's interval, which '>' sets to 4 ('512:1' is overwritten)
    setting[0] = "roundup_power2_divisions:[256:1,512:1,>:4]"
    assert unreached_bytes([Reading("cuda:0", 8 * 5 * gib // 4)], activations, torch) == ()
    setting[0] = "roundup_power2_divisions:[256:1,>:1]"  # 1: no rounding, the rest is said
    assert unreached_bytes([Reading("cuda:0", 8 * 5 * gib // 4)], activations, torch)
    setting[0] = "max_split_size_mb:200"  # a later string put the rounding back to none
    assert unreached_bytes([Reading("cuda:0", 8 * 5 * gib // 4)], activations, torch)
    # torch 2.11 (Colab's) has no getter: its CUDA memory snapshot reports the same string
    monkeypatch.delattr(torch._C, "_accelerator_getAllocatorSettings", raising=False)
    for name in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
        monkeypatch.delenv(name, raising=False)
    reported = {"PYTORCH_CUDA_ALLOC_CONF": "roundup_power2_divisions:4"}
    monkeypatch.setattr(torch._C, "_cuda_memorySnapshot", lambda *options: {
        "segments": [], "device_traces": [], "allocator_settings": reported}, raising=False)
    assert unreached_bytes([Reading("cuda:0", 8 * 5 * gib // 4)], activations, torch) == ()
    # a torch with no report of its settings: the environment, which %alloc_conf keeps in step
    without_settings_report(monkeypatch, torch)
    monkeypatch.setattr(torch.version, "cuda", "12.4")
    for name in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
        monkeypatch.delenv(name, raising=False)
    assert unreached_bytes([Reading("cuda:0", 8 * 5 * gib // 4)], activations, torch)
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "roundup_power2_divisions:[64:8,>:4]")
    assert unreached_bytes([Reading("cuda:0", 8 * 5 * gib // 4)], activations, torch) == ()


def test_the_rest_on_a_gpu_follows_the_installed_torchs_rule_for_greater_than(monkeypatch):
    """Under roundup_power2_divisions:[256:1,512:2,>:8] torch 2.10+ rounds a 600 MiB request
    with 2 divisions to a 768 MiB block ('>' starts after 512's interval): 6 such activations
    showed "at least 762 MiB that no variable reaches", none of it held. Up to 2.9 '>' took
    512's interval too, and the block was 640 MiB."""
    import torch

    from colab_gpu.memory import Reading
    from colab_gpu.memory.rounding import unreached_bytes

    mib = 1024 ** 2
    monkeypatch.setattr(torch.cuda, "memory_stats", lambda device=None: {})  # the faked boundary
    setting = "roundup_power2_divisions:[256:1,512:2,>:8]"
    monkeypatch.setattr(torch._C, "_accelerator_getAllocatorSettings", lambda: setting, raising=False)
    activations = {("cuda:0", address): 600 * mib for address in range(1, 7)}
    assert unreached_bytes([Reading("cuda:0", 6 * 768 * mib)], activations, torch) == ()
    # torch 2.9 (no report of its settings: the environment) made 640 MiB blocks of them
    without_settings_report(monkeypatch, torch)
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(torch, "__version__", "2.9.1+cu128")
    monkeypatch.delenv("PYTORCH_ALLOC_CONF", raising=False)
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", setting)
    assert unreached_bytes([Reading("cuda:0", 6 * 640 * mib)], activations, torch) == ()
    assert unreached_bytes([Reading("cuda:0", 6 * 768 * mib)], activations, torch)


def test_the_rest_on_a_rocm_gpu_reads_the_variable_rocm_torch_reads(monkeypatch):
    """A ROCm build of torch 2.9 reads PYTORCH_HIP_ALLOC_CONF when PYTORCH_CUDA_ALLOC_CONF is
    unset and has no report of its settings: under roundup_power2_divisions:4 set there, 8
    activations of 1.1 GiB (1.25 GiB blocks) showed "at least 1.19 GiB that no variable
    reaches", none of it held. A CUDA build never reads that variable."""
    import torch

    from colab_gpu.memory import Reading
    from colab_gpu.memory.rounding import unreached_bytes

    gib = 1024 ** 3
    monkeypatch.setattr(torch.cuda, "memory_stats", lambda device=None: {})  # the faked boundary
    without_settings_report(monkeypatch, torch)
    monkeypatch.setattr(torch.version, "hip", "6.4.43482")
    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setattr(torch, "__version__", "2.9.1+rocm6.4")
    for name in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PYTORCH_HIP_ALLOC_CONF", "roundup_power2_divisions:4")
    activations = {("cuda:0", address): int(1.1 * gib) for address in range(1, 9)}
    assert unreached_bytes([Reading("cuda:0", 8 * 5 * gib // 4)], activations, torch) == ()
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(torch, "__version__", "2.9.1+cu128")
    assert unreached_bytes([Reading("cuda:0", 8 * 5 * gib // 4)], activations, torch)


def test_the_rest_on_the_cpu_and_a_gpu_bounds_only_the_gpus_figure():
    """The rest on both read "at least cpu 12 MiB, cuda:0 3.00 GiB", while the CPU's
    figure is exact (live CPU tensors, each storage once): only the GPU's is a lower bound."""
    from colab_gpu.render.memory import holders_line, holders_text

    mib, gib = 1024 ** 2, 1024 ** 3
    unreached = (("cpu", 12 * mib), ("cuda:0", 3 * gib))
    found = Holders(not_yours=unreached, unreached=unreached)
    rest = next(line for line in holders_text(found).splitlines() if line.startswith("  the rest"))
    assert " ".join(rest.split()).startswith("the rest cpu 12 MiB, at least cuda:0 3.00 GiB that no variable")
    assert "(the rest cpu 12 MiB, at least cuda:0 3.00 GiB)" in holders_line(found)  # --quiet's


def _oversize_blocks(monkeypatch, setting: str, block_mib: int, allowance_mib: int):
    """20 activations of 130 MiB under ``setting`` (torch's report; no variable set), each
    given a cached oversize block of ``block_mib``: none of it is "the rest", and 600 MiB more
    is said, as a lower bound within ``allowance_mib`` a block. The (setting, check) to go on."""
    import torch

    from colab_gpu.memory import Reading
    from colab_gpu.memory.rounding import unreached_bytes

    mib = 1024 ** 2
    monkeypatch.setattr(torch.cuda, "memory_stats", lambda device=None: {"max_split_size": 128 * mib})
    reported = [setting]
    monkeypatch.setattr(torch._C, "_accelerator_getAllocatorSettings", lambda: reported[0], raising=False)
    for name in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
        monkeypatch.delenv(name, raising=False)
    activations = {("cuda:0", address): 130 * mib for address in range(1, 21)}

    def unreached(block_mib: int, held: int = 0):
        return unreached_bytes([Reading("cuda:0", 20 * block_mib * mib + held)], activations, torch)

    assert unreached(block_mib) == ()
    held = 600 * mib  # more than any rounding explains: still said
    rest = unreached(block_mib, held)
    assert rest and held - 20 * allowance_mib * mib <= rest[0][1] <= held
    return reported, unreached


def test_the_rest_on_a_gpu_is_not_the_oversize_blocks_max_non_split_rounding_mb_allows(monkeypatch):
    """Under max_split_size_mb:128,max_non_split_rounding_mb:256 a cached oversize block is
    reused for a request up to 256 MiB smaller: 20 activations of 130 MiB, each given a cached
    380 MiB block, showed "at least 4.49 GiB that no variable reaches", none of it held."""
    reported, unreached = _oversize_blocks(monkeypatch, "max_split_size_mb:128,max_non_split_rounding_mb:256", 380, 256)
    # a later string without the key: torch up to 2.10 keeps its value, the environment has it
    reported[0] = "max_split_size_mb:128"
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:128,max_non_split_rounding_mb:256")
    assert unreached(380) == ()


def test_the_rest_on_a_gpu_is_not_the_oversize_blocks_large_segment_size_mb_allows(monkeypatch):
    """From torch 2.11 max_non_split_rounding_mb defaults to large_segment_size_mb: under
    large_segment_size_mb:64,max_split_size_mb:128 a cached oversize block is reused for a
    request up to 64 MiB smaller. 20 activations of 130 MiB, each given a cached 194 MiB block,
    showed "at least 880 MiB that no variable reaches", none of it held."""
    reported, unreached = _oversize_blocks(monkeypatch, "large_segment_size_mb:64,max_split_size_mb:128", 194, 64)
    # large_segment_size_mb stays from an earlier string (parseArgs never resets it): the environment has it
    reported[0] = "max_split_size_mb:128"
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "large_segment_size_mb:64,max_split_size_mb:128")
    assert unreached(194) == ()
    # max_non_split_rounding_mb set: it, not large_segment_size_mb, is the allowance
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF")
    reported[0] = "large_segment_size_mb:64,max_split_size_mb:128,max_non_split_rounding_mb:100"
    assert unreached(230) == ()
