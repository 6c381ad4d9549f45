"""%%find_batch --plan and colab_gpu.plan_batch: real small models on the CPU, their "cuda"
tensors fake, checked against arithmetic done by hand, never against torch's CPU allocator
(allocators differ); CUDA is never initialized."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

from colab_gpu import plan_batch  # noqa: E402
from colab_gpu.batch.caching import replay  # noqa: E402
from colab_gpu.batch.gpus import GPUS  # noqa: E402
from colab_gpu.batch.plan import ERROR_MARGIN  # noqa: E402

MiB = 1024 ** 2
WORKSPACE = GPUS["T4"].cublas_workspace  # 8 MiB and 128 KiB before Hopper


def _linear_step():
    model = nn.Linear(1024, 1024, bias=False)  # 4 MiB of weights: a whole number of 512 B blocks
    opt = torch.optim.Adam(model.parameters())

    def step(n):
        x = torch.randn(n, 1024, device="cuda")
        model.to("cuda")(x).sum().backward()
        opt.step()
        opt.zero_grad()

    return model, opt, step


def test_a_linear_models_peak_is_weights_gradients_adam_state_and_the_batch():
    """At the second step's optimizer step: the weights, their gradient, Adam's two moments,
    foreach Adam's one temporary (the square root of the second moment), the input, and the
    two cuBLAS workspaces (forward, backward): 5 weights + n rows + 2 workspaces, plus the
    scalars (Adam's step, the loss), a few 512 B blocks."""
    model, opt, step = _linear_step()
    weight = 4 * MiB
    for n in (64, 1000):
        plan = plan_batch(step, "T4", start=n, max=n)
        (row,) = plan.sizes
        by_hand = 5 * weight + -(-n * 4096 // 512) * 512 + 2 * WORKSPACE
        assert by_hand <= row.allocated <= by_hand + 16 * 512, (n, row.allocated - by_hand)
    assert not isinstance(model.weight, torch._subclasses.fake_tensor.FakeTensor)
    assert model.weight.grad is None and not opt.state  # the real objects are as they were
    assert not torch.cuda.is_initialized()


def test_sizes_grow_and_the_answer_is_the_largest_that_fits():
    _, _, step = _linear_step()
    plan = plan_batch(step, "600MiB")  # 150 MiB for torch's allocator beside the context
    sizes = [row.size for row in plan.sizes]
    assert sizes == sorted(sizes)
    allocated = [row.allocated for row in plan.sizes]
    assert allocated == sorted(allocated) and allocated[0] < allocated[-1]
    # what is reserved may dip where requests pack better into segments, never by a segment
    peaks = [row.peak for row in plan.sizes]
    assert all(later >= earlier - 20 * MiB for earlier, later in zip(peaks, peaks[1:]))
    fits = [row.fits for row in plan.sizes]
    assert fits == sorted(fits, reverse=True)  # no size fits above one that does not
    fitting = [row.size for row in plan.sizes if row.fits]
    assert plan.answer == max(fitting)
    assert plan.answer + 1 in [row.size for row in plan.sizes if not row.fits]  # bisected to one
    # At large sizes the peak is the forward pass: the weights and Adam's two moments, the two
    # workspaces, the input and the output, 4 KiB a row each.
    (answer,) = [row for row in plan.sizes if row.size == plan.answer]
    by_hand = 3 * 4 * MiB + 2 * WORKSPACE + 2 * plan.answer * 4096
    assert by_hand <= answer.allocated <= by_hand + 16 * 512
    room = 600 * MiB - GPUS["A100-40GB"].context  # a size given as a number: an A100's context
    assert answer.peak - GPUS["A100-40GB"].context <= room  # what the allocator reserves fits
    assert plan.answer <= (room - 3 * 4 * MiB - 2 * WORKSPACE) // (2 * 4096)  # not past the arithmetic
    assert all(row.peak <= 600 * MiB for row in plan.sizes if row.fits)
    assert "PLANNED for 600MiB" in str(plan)


def test_a_size_that_fits_only_in_the_plans_spare_is_too_close_not_the_answer():
    """The plan keeps 3 % of the usable memory spare for its own error (it fell short of real
    peaks by up to 3 % on milabench's H100 curves): a size whose peak lands in that spare is
    "too close", not the answer, and the report says what was kept."""
    plan = plan_batch(lambda n: torch.randn(n, 1024, 1024, device="cuda"), "620MiB")  # 4 MiB a row
    assert plan.spare == round(620 * MiB * ERROR_MARGIN)
    rows = {row.size: row for row in plan.sizes}
    answer, above = rows[plan.answer], rows[plan.answer + 1]
    assert answer.peak <= plan.usable - plan.spare < above.peak <= plan.usable  # 4 MiB apart, 18.6 spare
    assert plan.verdict(above) == "too close" and plan.verdict(answer) == "fits"
    assert f"{plan.answer + 1}  too close" in str(plan)
    flat = " ".join(str(plan).split())  # sentences are folded at 80 columns
    assert f"PLANNED for 620MiB: batch_size = {plan.answer} (largest predicted to fit in 620 MiB, 3 % of it kept spare" in flat
    assert "kept spare: 18.6 MiB (3 %), for the plan's own error" in flat


@pytest.mark.filterwarnings("ignore:torch.cuda.amp.GradScaler is enabled")
def test_a_cnn_with_autocast_and_sgd_plans_for_a_t4():
    model = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
                          nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                          nn.Flatten(), nn.Linear(64, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scaler = torch.amp.GradScaler("cuda")

    def step(n):
        model.cuda()
        x = torch.randn(n, 3, 64, 64).cuda()
        y = torch.randint(0, 10, (n,), device="cuda")
        with torch.autocast("cuda", dtype=torch.float16):
            out = model(x)
            assert out.dtype == torch.float16  # autocast cast as on the GPU
            loss = nn.functional.cross_entropy(out, y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()

    plan = plan_batch(step, "T4", max=4096)
    allocated = [row.allocated for row in plan.sizes]
    assert allocated == sorted(allocated)
    assert plan.answer is not None and plan.answer >= 64
    # one fp16 64-channel 64x64 activation per image at least: 512 KiB; the T4 holds at most
    assert plan.answer <= GPUS["T4"].usable // (64 * 64 * 64 * 2)
    assert not torch.cuda.is_initialized()


def test_an_op_without_a_fake_implementation_is_named_not_crashed_on():
    def step(n):
        x = torch.randn(n, 8, device="cuda")
        torch.nonzero(x)  # its output's size depends on the data

    plan = plan_batch(step, "T4", max=64)
    assert plan.unsupported == ("aten.nonzero.default",)
    assert plan.answer is None
    assert "aten.nonzero.default" in plan.summary()


def test_the_allocator_replay_reuses_freed_blocks_and_gives_back_segments_before_failing():
    events = [(0, 6 * MiB), (0, None), (1, 5 * MiB)]  # both in one 20 MiB segment
    assert replay(events).reserved == 20 * MiB
    assert replay(events).allocated == 6 * MiB
    big = [(0, 30 * MiB), (0, None), (1, 40 * MiB)]
    assert replay(big, limit=50 * MiB).out_of_memory is False  # the free 30 MiB given back first
    assert replay(big, limit=39 * MiB).out_of_memory is True


def test_the_magic_plans_a_cell_for_a_t4_and_sets_nothing(shell, capsys):
    shell.run_cell("import torch\nmodel = torch.nn.Linear(256, 256)\n"
                   "opt = torch.optim.SGD(model.parameters(), lr=0.1)")
    result = shell.run_cell("%%find_batch --plan T4 --max 1024\n"
                            "model.to('cuda')\n"
                            "x = torch.randn(batch_size, 256, device='cuda')\n"
                            "model(x).sum().backward()\n"
                            "opt.step(); opt.zero_grad()\n")
    assert result.error_in_exec is None
    out = capsys.readouterr().out
    assert "PLANNED for T4: batch_size = 1024" in out
    assert "batch_size was not changed" in out
    assert "batch_size" not in shell.user_ns
    assert "x" not in shell.user_ns  # the cell's names are taken out again
    model = shell.user_ns["model"]
    assert type(model.weight) is torch.nn.Parameter and model.weight.grad is None
    assert not torch.cuda.is_initialized()


def test_apply_sets_the_variable_to_the_planned_size(shell):
    shell.run_cell("import torch")
    shell.run_cell("%%find_batch --plan 600MiB --apply\n"
                   "x = torch.randn(batch_size, 1024, 1024, device='cuda')")
    # 4 MiB a row, and the previous run's x lives until the new one is made: 8 MiB a row in the
    # 150 MiB the context leaves less the 18 MiB (3 %) kept spare, each x in a segment of its own
    assert shell.user_ns["batch_size"] == 16


def test_a_bad_plan_value_is_one_line_saying_what_is_accepted(shell):
    from IPython.core.error import UsageError

    with pytest.raises(UsageError) as refused:
        shell.run_cell_magic("find_batch", "--plan T5", "pass")
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith("--plan T5: give T4, L4") and "15GiB" in message and "this" in message
    with pytest.raises(UsageError) as refused:
        shell.run_cell_magic("find_batch", "--apply", "pass")
    assert "--plan" in str(refused.value)


def test_autocast_runs_what_cuda_runs_in_float32_in_float32():
    """CUDA's autocast takes an attention's softmax to float32 (a matrix twice the size); the
    CPU's autocast, which stands in for it, would leave it in float16."""
    seen = []

    def step(n):
        q = torch.randn(n, 4, 16, 8, device="cuda")
        with torch.autocast("cuda"):
            scores = q @ q.transpose(-1, -2)
            weights = scores.softmax(-1)
            seen.append((scores.dtype, weights.dtype, (weights @ q).dtype))

    plan_batch(step, "T4", start=2, max=2)
    assert set(seen) == {(torch.float16, torch.float32, torch.float16)}


def test_a_value_the_step_reads_is_said_and_adams_own_reads_are_not():
    """Adam reads its step count with .item(): that sizes nothing and is not the user's to be
    told of; a loss the step reads itself (fake, so planned as 1) is."""
    model = nn.Linear(64, 64)
    opt = torch.optim.Adam(model.parameters(), foreach=False)

    def step(n, read):
        loss = model.to("cuda")(torch.randn(n, 64, device="cuda")).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        if read:
            loss.item()

    notes = plan_batch(lambda n: step(n, False), "T4", max=64).notes
    assert not any("tensor value" in note for note in notes), notes
    notes = plan_batch(lambda n: step(n, True), "T4", max=64).notes
    assert any(note.startswith("the step read 1 tensor value (.item()") for note in notes), notes


@pytest.mark.parametrize("option", ["--mode throughput", "--device cpu"])
def test_options_a_plan_cannot_honour_are_refused_in_one_line(shell, option):
    """A plan predicts memory, not speed, on the GPU it names: --mode throughput and --device
    were ignored without a word."""
    from IPython.core.error import UsageError

    with pytest.raises(UsageError, match=rf"^--plan predicts memory on the GPU it names, so {option} has "
                                         r"nothing to act on: drop it, or run the search without --plan$"):
        shell.run_cell_magic("find_batch", f"--plan T4 {option}", "x = batch_size")


def test_after_a_plan_a_launched_rank_still_runs_backward():
    """On a machine without a GPU torch's FakeTensorMode installed a no-op CUDA device guard for
    good; the next backward started autograd's device threads, and every rank colab_gpu.launch
    forked after a plan failed with "Unable to handle autograd's threading in combination with
    fork-based multiprocessing" (Colab's CPU runtime: a CUDA build of torch, no GPU)."""
    import colab_gpu

    _, _, step = _linear_step()
    plan_batch(step, "T4", max=8)
    step_after = torch.ones(3, requires_grad=True)
    (step_after * 2).sum().backward()  # the notebook's next CPU training step
    assert colab_gpu.launch(_a_backward, nprocs=2, backend="gloo", timeout=60) == [6.0, 6.0]


def _a_backward():
    weights = torch.ones(3, requires_grad=True)
    (weights * 2).sum().backward()
    return float(weights.grad.sum())
