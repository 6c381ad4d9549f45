"""What a terminal and a narrow notebook show of every report.

A terminal (IPython, ``%config GPUMagics.output = 'text'``, ``print(result)``) breaks a line
longer than its width at any character, mid-word and mid-number; a 600 px notebook broke
"388" from "MiB". Each report family below is rendered from real recordings in every state
the issue names (each recording, MIG, no GPU, NVML failures, Kaggle's two T4s, CUDA started
or not; every %alloc_conf option; %clear_cache; %%find_batch; the live run's summary and
panel). Text: no line wider than 80 columns, except a line that holds one token alone that
cannot be broken (a configuration string, a path; see too_wide). HTML: no number is
separated from its unit by a space a line may break at, while the text keeps plain spaces.
"""
from __future__ import annotations

import dataclasses
import re
from html.parser import HTMLParser

import pytest

import colab_gpu
from colab_gpu import live
from colab_gpu.allocator import alloc_conf
from colab_gpu.allocator.apply import ignored_variables, setting_warnings
from colab_gpu.allocator.render import render_keys
from colab_gpu.batch.render import trial_line
from colab_gpu.batch.result import OUT_OF_MEMORY, Trial
from colab_gpu.batch.search import Search
from colab_gpu.devices import Snapshot
from colab_gpu.devices.nvml import DRIVER_WITHOUT_NVML, INIT_PROBLEMS, NO_PYNVML, NvmlSource
from colab_gpu.live.panel import render_panel
from colab_gpu.render import WIDTH
from colab_gpu.runtime import TorchState
from colab_gpu.torch_allocator.schema import KEYS, PRESETS
from conftest import DATA, ROOT
from milabench_replay import Curve, ReplayDevice
from nvml_recording import RecordedNvml
from test_mig import UUIDS, filled, recorded_a100, with_instances
from test_multigpu import box, cuda_on_cuda0  # noqa: F401 (a fixture)
from test_never_harms import DEVICE_CALLS, NVML_CALLS, NVML_ERRORS, two_t4s

RECORDINGS = sorted([*(DATA / "nvidia-smi-xml").glob("*.xml"), *(DATA / "nvidia-smi-csv").glob("*.csv"),
                     *(ROOT / "colab_gpu" / "data").glob("*.xml"), *(ROOT / "colab_gpu" / "data").glob("*.csv")])


def too_wide(reports: dict) -> list:
    """(report, width, line) of every line over WIDTH columns but those that hold one token
    alone: a configuration string (max_split_size_mb:128,expandable_segments:True,...), a path
    or a UUID, which no folding can break (and a terminal breaking it is better than a
    copied value cut in two)."""
    return [(name, len(line), line) for name, text in reports.items()
            for line in str(text).splitlines() if len(line) > WIDTH and len(line.split()) > 1]


class Broken:
    """A device source whose NVML could not start, for the problems RecordedNvml cannot raise
    (the module or the library missing)."""

    label = "NVML"

    def __init__(self, problem: str):
        self.problem = problem

    def snapshot(self) -> Snapshot:
        return Snapshot(source=self.label, problem=self.problem)

    def close(self) -> None:
        pass


@pytest.fixture
def gpu_status_cards(clean_env):
    clean_env.setenv("KAGGLE_KERNEL_RUN_TYPE", "Interactive")
    reports = {path.name: colab_gpu.status(path=str(path)) for path in RECORDINGS}
    reports["this machine"] = colab_gpu.status()
    for problem in [*INIT_PROBLEMS.values(), NO_PYNVML, DRIVER_WITHOUT_NVML]:
        reports[f"no GPU: {problem[:30]}"] = colab_gpu.status(Broken(problem))
    for function in NVML_CALLS:
        for error, code in NVML_ERRORS.items():
            for index in (None, 1):
                if index is None or function in DEVICE_CALLS:
                    nvml = RecordedNvml(two_t4s()).fail(function, code, index=index)
                    reports[f"{function} {error} on {index}"] = colab_gpu.status(NvmlSource(nvml=nvml))
    reports["mixed box"] = colab_gpu.status(box("rtx-3060-v12.xml", "rtx-3090-v12.xml"))
    clean_env.setenv("CUDA_VISIBLE_DEVICES", UUIDS[1])
    reports["MIG named"] = colab_gpu.status(NvmlSource(nvml=RecordedNvml(with_instances(recorded_a100(), filled(1)))))
    reports["MIG named, UUIDs unknown"] = colab_gpu.status(NvmlSource(nvml=RecordedNvml(recorded_a100())))
    clean_env.setenv("CUDA_VISIBLE_DEVICES", "GPU-00000001,GPU-00000000")
    reports["two T4s reordered"] = colab_gpu.status(box("tesla-t4.xml", "tesla-t4.xml"))
    return reports


@pytest.fixture
def cuda_started_cards(clean_env, cuda_on_cuda0):  # noqa: F811
    """torch's allocator rows and the breakdown appear once the user's code started CUDA."""
    clean_env.setenv("COLAB_RELEASE_TAG", "release-colab_20250101-060000_RC00")
    return {"Kaggle's two T4s": colab_gpu.status(box("tesla-t4.xml", "tesla-t4.xml")),
            "mixed box": colab_gpu.status(box("rtx-3060-v12.xml", "rtx-3090-v12.xml"))}


@pytest.fixture
def alloc_conf_reports(tmp_path):
    call = dict(environ={"COLAB_GPU_CONFIG_DIR": str(tmp_path)}, modules={})
    reports = {
        "show": alloc_conf(**call),
        "set": alloc_conf(["max_split_size_mb=128 expandable_segments=True garbage_collection_threshold=0.6",
                           "roundup_power2_divisions:[256:1,512:2,>:4]"], **call),
        "unset": alloc_conf(unset=["garbage_collection_threshold"], **call),
        "check": alloc_conf(check="max_split_size_mb:128,expandable_segments:True", **call),
        "save": alloc_conf(["pinned_use_cuda_host_register=True", "pinned_num_register_threads=8"], save=True, **call),
        "forget": alloc_conf(forget=True, **call),
        "forget nothing": alloc_conf(forget=True, **call),
        "reset": alloc_conf(reset=True, **call),
    }
    for name in PRESETS:
        reports[f"preset {name}"] = alloc_conf(preset=name, **call)
    result = reports["set"]
    reports["every key"] = dataclasses.replace(result, settings=tuple((key.name, "1") for key in KEYS))
    started = TorchState(imported=True, version="2.13.0", cuda_version="12.8", cuda_initialized=True)
    reports["deferred"] = dataclasses.replace(
        result, torch=started, deferred=tuple((key.name, key.runtime_reason) for key in KEYS if key.runtime_reason),
        in_effect="max_split_size_mb:128,expandable_segments:True",
        applied_via=("environment", "torch._C._accelerator_setAllocatorSettings"))
    everything = dict((key.name, "True") for key in KEYS)
    everything.update(backend="cudaMallocAsync", pinned_max_round_threshold_mb="64", pinned_max_cached_size_mb="32",
                      per_process_memory_fraction="1.0", garbage_collection_threshold="0.6")
    variables = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "PYTORCH_ALLOC_CONF": "a"}
    reports["warnings"] = dataclasses.replace(result, warnings=setting_warnings(
        tuple(everything.items()), (2, 9), "win32") + setting_warnings((), None)
        + setting_warnings((), (3, 5)) + setting_warnings((), (1, 10))
        + ignored_variables((2, 9), variables, written=True) + ignored_variables((2, 13), variables, False)
        + ignored_variables((2, 4), {"PYTORCH_CUDA_ALLOC_CONF": None, "PYTORCH_ALLOC_CONF": "a"}, False))
    for version in (None, (1, 13), (2, 13)):
        reports[f"--keys {version}"] = render_keys(version)
    return reports


@pytest.fixture
def memory_reports(shell, clean_env, cuda_on_cuda0):  # noqa: F811
    import torch

    namespace = shell.user_ns
    mine = dict(model=torch.nn.Linear(64, 64), optimizer_state_for_the_big_model=[torch.ones(1000)],
                meta=torch.ones(3, device="meta"), shared_a=torch.ones(5000),
                **{f"tensor_{index}": torch.ones(100 * index + 1) for index in range(12)})
    mine["shared_b"] = mine["shared_a"][10:]
    namespace.update(mine)
    source = box("tesla-t4.xml", "tesla-t4.xml")
    try:
        yield {"clear_cache": colab_gpu.clear_cache("tensor_0", history=True, shell=shell, source=source),
               "memory holders": colab_gpu.memory_holders(shell=shell, source=source),
               "no GPU read": colab_gpu.memory_holders(shell=shell, source=Broken(DRIVER_WITHOUT_NVML))}
    finally:
        for name in mine:
            namespace.pop(name, None)


@pytest.fixture
def find_batch_reports():
    curve = Curve([(1, 2 * 1024 ** 3), (64, 9 * 1024 ** 3), (512, 60 * 1024 ** 3)])
    oom = Trial(65536, OUT_OF_MEMORY, runs=1, error=(
        "OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total capacity of "
        "14.74 GiB of which 9.81 GiB is free. Process 4218 has 4.93 GiB memory in use."))
    return {"max": Search(ReplayDevice(curve, 15 * 1024 ** 3), headroom="10%", multiple_of=8).run(),
            "throughput": Search(ReplayDevice(curve, 80 * 1024 ** 3), mode="throughput").run(),
            "nothing fits": Search(ReplayDevice(curve, 1024 ** 3), variable="per_device_train_batch_size").run(),
            "cpu": colab_gpu.find_batch(lambda size: None, max=64, steps=1, mode="throughput", device="cpu",
                                         progress=False),
            "progress line": trial_line(oom, "per_device_train_batch_size", 12)}


@pytest.fixture
def live_reports(fast_live_sampling):
    sampler, _ = live.start(path=str(DATA / "nvidia-smi-csv" / "8gpu-training_nanogpt-pr643.csv"), interval=0.01)
    try:
        sampler.wait(3, timeout=10)
        panel = render_panel(sampler)
    finally:
        record = live.stop("%gpu_status --stop")
    return {"8 GPUs": record, "panel": panel,
            "stopped by itself": dataclasses.replace(
                record, error=INIT_PROBLEMS["NVMLError_GpuIsLost"],
                display_error="the widget's comm was closed by the front end (the notebook was reloaded)",
                torch_labels={index: "hidden from torch" for index in record.gpu_names},
                numbering_note="cuda:? - CUDA numbers these different GPUs fastest first")}


FAMILIES = ["gpu_status_cards", "cuda_started_cards", "alloc_conf_reports", "memory_reports",
            "find_batch_reports", "live_reports"]


@pytest.mark.parametrize("family", FAMILIES)
def test_every_text_report_fits_80_columns(request, family):
    reports = {name: report for name, report in request.getfixturevalue(family).items() if name != "panel"}
    assert too_wide(reports) == []


def test_only_a_configuration_string_or_a_path_is_left_wider(alloc_conf_reports):
    alone = {line.strip() for text in map(str, alloc_conf_reports.values()) for line in text.splitlines()
             if len(line) > WIDTH}
    assert alone and all(re.fullmatch(r"'?[\w:.,\[\]>]+'?|\(?/[\w/.-]+:?\)?", line) for line in alone), alone


class Text(HTMLParser):
    """The text a browser shows of an HTML fragment (entities decoded: &nbsp; is \\xa0)."""

    def __init__(self, html: str):
        super().__init__(convert_charrefs=True)
        self.parts, self.hidden = [], 0
        self.feed(html)
        self.close()

    def handle_starttag(self, tag, attrs):
        self.hidden += tag in ("style", "script")

    def handle_endtag(self, tag):
        self.hidden -= tag in ("style", "script")

    def handle_data(self, data):
        if not self.hidden:
            self.parts.append(data)

    def __str__(self):
        return "".join(self.parts)


def number_and_unit(space: str) -> re.Pattern:
    return re.compile(rf"\d+(?:\.\d+)?{space}(?:B|KiB|MiB|GiB|TiB|%|W|°C|MHz)(?!\w)")


@pytest.mark.parametrize("family", FAMILIES)
def test_html_never_breaks_a_number_from_its_unit(request, family):
    cards = {name: report if isinstance(report, str) else report._repr_html_()
             for name, report in request.getfixturevalue(family).items()
             if hasattr(report, "_repr_html_") or name == "panel"}
    shown = {name: str(Text(html)) for name, html in cards.items()}
    assert {name: number_and_unit(" ").findall(text) for name, text in shown.items()
            if number_and_unit(" ").search(text)} == {}
    if family != "alloc_conf_reports":  # its cards hold no size; the others' sizes are held
        assert any(number_and_unit("\xa0").search(text) for text in shown.values())


def test_the_text_view_keeps_plain_spaces(gpu_status_cards):
    """Only the HTML holds a number to its unit: the text is what text tests and terminals compare."""
    text = str(gpu_status_cards["tesla-t4.xml"])
    assert "\xa0" not in text and "&nbsp;" not in text
    assert "  memory      1.01 GiB used / 15.00 GiB, 13.61 GiB free,\n              388 MiB reserved by the driver" in text
    assert "1.01&nbsp;GiB used / 15.00&nbsp;GiB, 13.61&nbsp;GiB free, 388&nbsp;MiB reserved by the driver" in \
        gpu_status_cards["tesla-t4.xml"]._repr_html_()
