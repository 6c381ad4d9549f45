"""tune_loader's parts that need no timing: the answer from rates, the settings tried, the
cores read, the constructor call, the loaders refused, and the wording of who bounds training."""
from __future__ import annotations

import types

import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, SequentialSampler, TensorDataset

import colab_gpu
from colab_gpu.loader import LoaderError, NotALoader
from colab_gpu.loader.choose import choose, training_rate
from colab_gpu.loader.hints import hints
from colab_gpu.loader.measure import Split, batch_length, error_text, time_window
from colab_gpu.loader.result import Measurement, waiting
from colab_gpu.host import usable_cores
from colab_gpu.loader.settings import Setting, constructor_call, notebook_parts, rebuilt, setting_of, worker_counts

ZERO, ONE, TWO, THREE = (Setting(0).with_(num_workers=count) for count in range(4))


def test_the_answer_is_the_smallest_setting_within_5_percent_of_the_best():
    choice = choose({ZERO: [10, 10, 10], ONE: [18, 19, 18], TWO: [30, 31, 30], THREE: [31, 31.5, 31]})
    assert choice.best == THREE and choice.answer == TWO and not choice.keeps_up and choice.unresolved == ()


def test_a_smaller_setting_that_reached_the_bar_in_some_rounds_is_said_to_be_unresolved():
    # ONE's median is 7 % below the best, but one round reached it: the rounds did not tell them apart
    choice = choose({ZERO: [10, 10, 10], ONE: [27, 28, 31], TWO: [30, 31, 30]})
    assert choice.answer == TWO and choice.unresolved == (ONE,)


def test_with_a_step_the_answer_is_the_smallest_setting_that_keeps_it_fed():
    rates = {ZERO: [50, 50, 50], ONE: [40, 40, 40], TWO: [80, 80, 80], THREE: [82, 82, 82]}
    # A step of 1/30 s: one worker delivers 40 a second beside it, so the step bounds training.
    # Without workers the loader makes each batch between two steps: 1 / (1/50 + 1/30) = 18.75.
    choice = choose(rates, step_seconds=1 / 30)
    assert choice.answer == ONE and choice.keeps_up and choice.best == THREE
    # A slow step: the main process alone makes batches 25 times as fast, within 5 % of it.
    choice = choose(rates, step_seconds=0.5)
    assert choice.answer == ZERO and choice.keeps_up
    assert training_rate(ZERO, 50, 0.5) == pytest.approx(1 / 0.52)
    # A step faster than any setting: the loader bounds training, the best rule decides.
    choice = choose(rates, step_seconds=1 / 500)
    assert choice.answer == TWO and not choice.keeps_up


def test_worker_counts_go_past_the_usable_cores():
    assert worker_counts(2, 0) == [0, 1, 2, 3]
    assert worker_counts(1, 0) == [0, 1, 2]
    assert worker_counts(16, 6) == [0, 1, 2, 3, 4, 6, 8, 12, 16, 20]
    assert worker_counts(16, 0, most=5) == [0, 1, 2, 3, 4]


def test_a_container_quota_lowers_the_usable_cores(tmp_path, monkeypatch):
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1, 2, 3})
    (tmp_path / "cpu.max").write_text("150000 100000\n")  # docker --cpus 1.5
    assert usable_cores(str(tmp_path)) == (2, "container CPU quota of 1.5 cores")
    (tmp_path / "cpu.max").write_text("100000 100000\n")
    assert usable_cores(str(tmp_path)) == (1, "container CPU quota of 1 core")
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert usable_cores(str(tmp_path)) == (4, "CPU affinity")
    assert usable_cores(str(tmp_path / "none")) == (4, "CPU affinity")


def test_setting_labels_and_the_loaders_own_setting():
    loader = DataLoader(TensorDataset(torch.arange(8)), num_workers=2, pin_memory=True, prefetch_factor=4,
                        persistent_workers=True)
    setting = setting_of(loader)
    assert setting == Setting(2, True, 4, True)
    assert setting.label() == "num_workers=2, pin_memory=True, prefetch_factor=4, persistent_workers=True"
    assert setting_of(DataLoader(TensorDataset(torch.arange(8)))).label() == "num_workers=0"
    assert ZERO.with_(num_workers=2).prefetch_factor == 2 and TWO.with_(num_workers=0).prefetch_factor is None


def test_a_copy_keeps_the_loaders_parts():
    data = TensorDataset(torch.arange(10))
    generator = torch.Generator().manual_seed(3)

    def collate(items):
        return items

    loader = DataLoader(data, batch_size=3, shuffle=True, drop_last=True, collate_fn=collate, generator=generator)
    copy = rebuilt(loader, TWO)
    assert copy.dataset is data and copy.sampler is loader.sampler and copy.generator is generator
    assert copy.collate_fn is collate and copy.batch_size == 3 and copy.drop_last and copy.num_workers == 2
    custom = DataLoader(data, batch_sampler=BatchSampler(SequentialSampler(data), 4, False))
    assert rebuilt(custom, ONE).batch_sampler is custom.batch_sampler
    spawned = DataLoader(data, num_workers=1, multiprocessing_context="spawn")
    assert rebuilt(spawned, ZERO).num_workers == 0  # torch refuses a start method without workers


def test_the_constructor_call_names_the_notebooks_variables():
    train_ds = TensorDataset(torch.arange(10))
    loader = DataLoader(train_ds, batch_size=4, shuffle=True)
    names = {id(train_ds): "train_ds"}
    assert constructor_call(loader, TWO.with_(persistent_workers=True), "train_loader", names, "DataLoader") == \
        "train_loader = DataLoader(train_ds, batch_size=4, shuffle=True, num_workers=2, persistent_workers=True)"
    generator = torch.Generator()
    sampler_loader = DataLoader(train_ds, batch_size=2, sampler=[3, 1, 2], drop_last=True, generator=generator,
                                num_workers=1, multiprocessing_context="spawn")
    call = constructor_call(sampler_loader, ONE.with_(prefetch_factor=4), "loader", {id(generator): "g"})
    assert call == ("loader = torch.utils.data.DataLoader(loader.dataset, batch_size=2, sampler=loader.sampler, "
                    "drop_last=True, num_workers=1, prefetch_factor=4, multiprocessing_context='spawn', generator=g)")
    # no workers: no start method, which torch would refuse
    assert "multiprocessing_context" not in constructor_call(sampler_loader, ZERO, "loader")


class NotebookDataset(Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, index):
        return index


def test_parts_defined_in_a_notebook_cell_are_named():
    notebook = types.ModuleType("__main__")  # a kernel's __main__: no file a worker could import
    NotebookDataset.__module__ = "__main__"
    try:
        dataset = NotebookDataset()
        dataset.transform = NotebookDataset  # a class of the cell kept on the dataset
        loader = DataLoader(dataset, collate_fn=lambda items: items)
        loader.collate_fn.__module__ = "__main__"
        assert notebook_parts(loader, notebook) == [
            "the dataset's class NotebookDataset", "the dataset's transform (NotebookDataset)",
            "collate_fn test_parts_defined_in_a_notebook_cell_are_named.<locals>.<lambda>"]
        script = types.ModuleType("__main__")
        script.__file__ = "train.py"  # a script: a spawned worker imports it again
        assert notebook_parts(loader, script) == []
    finally:
        NotebookDataset.__module__ = __name__


@pytest.mark.parametrize("options, message", [
    (dict(seconds=0), "seconds=0: give the seconds each timing lasts, from 0.01 to 600"),
    (dict(repeats=0), "repeats=0: give a whole number from 1 to 20"),
    (dict(max_workers=-1), "max_workers=-1: give a whole number from 0 to 1024"),
    (dict(device="tpu"), "device='tpu': use auto, cpu, cuda or cuda:N"),
    (dict(step=42), "step takes a function that runs one training step on a batch"),
])
def test_options_are_refused_in_the_callers_words(options, message):
    loader = DataLoader(TensorDataset(torch.arange(8)))
    with pytest.raises(LoaderError) as raised:
        colab_gpu.tune_loader(loader, progress=False, **options)
    assert str(raised.value).startswith(message) and isinstance(raised.value, colab_gpu.UserError)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")
def test_cuda_on_a_machine_without_it_is_refused():
    with pytest.raises(LoaderError, match=r"^device='cuda': torch sees no CUDA device here; use device='auto' or device='cpu'$"):
        colab_gpu.tune_loader(DataLoader(TensorDataset(torch.arange(8))), device="cuda", progress=False)


def test_what_is_no_loader_or_would_be_used_up_is_refused():
    with pytest.raises(NotALoader, match=r"^tune_loader takes a torch.utils.data.DataLoader, not list \[1, 2\]"):
        colab_gpu.tune_loader([1, 2])
    assert issubclass(NotALoader, TypeError)
    once = DataLoader(TensorDataset(torch.arange(8)), sampler=iter(range(8)))
    with pytest.raises(LoaderError, match=r"sampler is an iterator .* measuring would take the batches"):
        colab_gpu.tune_loader(once)


def test_who_bounds_training_and_how_long_the_step_waits():
    # The example: a 40 ms step, a batch every 95 ms from workers: the GPU waits 58 %.
    bound, share = waiting(1 / 0.095, 0.040, workers=2)
    assert bound and round(share * 100) == 58
    # Without workers the loader runs between two steps: 95 ms of loading a 135 ms round.
    assert waiting(1 / 0.095, 0.040, workers=0)[1] == pytest.approx(0.095 / 0.135)
    # A step slower than the loader bounds it; measured together, the busy share is the step's.
    assert waiting(100, 0.040, workers=2) == (False, 0.0)
    assert waiting(100, 0.040, workers=2, together_rate=20)[1] == pytest.approx(0.2)


def test_batch_length_reads_what_collate_functions_build():
    assert batch_length([torch.zeros(5, 3), torch.zeros(5)]) == 5
    assert batch_length({"image": torch.zeros(7, 3), "label": torch.zeros(7)}) == 7
    assert batch_length(["a", "b", "c"]) == 3
    assert batch_length(torch.tensor(1.0)) is None


class MissingFile(Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, index):
        raise KeyError("missing.jpg")


def test_an_error_in_this_process_is_shown_without_colab_gpus_frames():
    loader = DataLoader(MissingFile(), batch_size=2)
    with pytest.raises(KeyError) as raised:
        time_window(loader, 0.01)
    text = error_text(raised.value)
    assert text.startswith("Traceback (most recent call last):") and "in __getitem__" in text
    assert text.endswith("KeyError: 'missing.jpg'")
    assert "colab_gpu/loader" not in text and "torch/utils/data" not in text


def _split(fetch=0.030, collate=0.002, transfer=None, blocked=0.0, items=8.0, one_thread=None):
    return Split(4, fetch, collate, transfer, blocked, items, one_thread)


def _hints(split=None, **given):
    measured = dict(cores=2, cores_how="CPU affinity", zero=Measurement(ZERO, (30.0,)),
                    answer=Measurement(ZERO, (30.0,)), split=split or _split(), device=None, step=None,
                    still_bound=False, notebook=[], method="fork", workers_failed=False, load=0.5)
    measured.update(given)
    return " | ".join(hints(**measured))


def test_what_would_help_follows_the_evidence():
    # Workers did not help on an idle machine although a batch costs 32 ms: something serializes.
    assert "its work may already use every core" in _hints()
    assert "__getitem__ takes 94 % of a batch's time (3.75 ms an item): cache decoded samples" in _hints()
    # ... on a busy machine: no idle core; a cheap batch: passing it costs as much.
    assert "the cores were busy with other work (load average 5.0 on 2)" in _hints(load=5.0)
    assert "a batch costs only 1.1 ms to make" in _hints(_split(fetch=0.001, collate=0.0001))
    # One core, workers that failed, a cell's class under spawn.
    assert _hints(cores=1).startswith("one usable core (CPU affinity): worker processes would take turns")
    assert "every setting with workers failed in a worker" in _hints(workers_failed=True)
    spawn = _hints(notebook=["the dataset's class Images"], method="spawn")
    assert "start by 'spawn'" in spawn and "%%writefile mydata.py" in spawn
    # The copy to the GPU dominates; items that wait on storage; torch's threads in collate_fn.
    assert "the copy to cuda:0 takes 86 %" in _hints(_split(fetch=0.002, collate=0.001, transfer=0.018),
                                                     device="cuda:0")
    assert "items wait 80 % of their fetch time" in _hints(_split(blocked=0.8))
    assert "collate_fn takes 90 ms a batch with torch's threads but 1 ms with one" in \
        _hints(_split(collate=0.090, one_thread=0.001))
    # Workers helped and no step was given: nothing to say.
    assert _hints(answer=Measurement(TWO, (60.0,))) == ""
