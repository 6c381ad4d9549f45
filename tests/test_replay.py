"""The replay source: real nvidia-smi recordings read into the same dataclasses as NVML's.

Expected values come from the recordings themselves (and tests/data/README.md), so a parser
that reads the wrong field, the wrong unit or the wrong schema version fails here.
"""
from __future__ import annotations

import datetime
import pathlib
import re

import pytest

import colab_gpu
from colab_gpu.devices import MiB, known_compute_capability, open_source
from colab_gpu.devices.replay import ACCEPTED, ReplaySource, load_frames

from conftest import DATA, ROOT

XML = DATA / "nvidia-smi-xml"
CSV = DATA / "nvidia-smi-csv"
CAPTURES = DATA / "nvidia-smi-captures"
TABLES = DATA / "nvidia-smi-text"
RECORDINGS = sorted(XML.glob("*.xml")) + sorted(CSV.glob("*.csv"))


def section(capture: pathlib.Path, title: str) -> str:
    """The output under one '# <title>' heading of an nvidia_gpu_exporter capture."""
    lines = capture.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"# {title}"))
    body = start + 1
    while lines[body].startswith("#"):  # the command line and the closing rule
        body += 1
    end = body
    while end < len(lines) and not lines[end].startswith("####"):
        end += 1
    return "\n".join(lines[body:end]).strip() + "\n"


@pytest.mark.parametrize("path", RECORDINGS, ids=lambda path: path.name)
def test_every_recording_replays_with_named_gpus(path):
    frames = load_frames(path)
    final = ReplaySource(path).snapshot()
    assert frames and final.ok and final.source.startswith(f"replay of {path.name}")
    assert final.gpus and all(gpu.name for gpu in final.gpus)
    # Every recording reports at least one measured quantity per GPU.
    for gpu in final.gpus:
        assert any(value is not None for value in (gpu.memory_used, gpu.utilization_gpu, gpu.power_draw))


def test_tesla_t4_xml_fields_match_the_recording():
    snapshot = ReplaySource(XML / "tesla-t4.xml").snapshot()
    assert (snapshot.driver_version, snapshot.cuda_driver_version) == ("515.105.01", "11.7")
    (gpu,) = snapshot.gpus
    assert (gpu.index, gpu.name) == (0, "Tesla T4")
    assert gpu.uuid == "GPU-d37e67a5-91dd-3774-a5cb-99096249601a"
    assert gpu.bus_id == "00000000:00:1E.0"
    assert (gpu.memory_total, gpu.memory_reserved, gpu.memory_used, gpu.memory_free) == (
        15360 * MiB, 388 * MiB, 1032 * MiB, 13939 * MiB)
    assert (gpu.power_draw, gpu.power_limit, gpu.temperature) == (26.78, 70.0, 40.0)
    assert gpu.performance_state == "P0"
    assert (gpu.utilization_gpu, gpu.utilization_memory) == (0.0, 0.0)
    assert (gpu.sm_clock, gpu.sm_clock_max, gpu.memory_clock, gpu.memory_clock_max) == (585, 1590, 5000, 5001)
    assert (gpu.pcie_generation, gpu.pcie_generation_max, gpu.pcie_width, gpu.pcie_width_max) == (3, 3, 8, 16)
    assert gpu.clock_event_reasons == ()  # every throttle reason "Not Active"
    assert gpu.compute_capability == (7, 5)  # not in the XML: known by the product name
    assert [(p.pid, p.name, p.used_memory, p.kind) for p in gpu.processes] == [
        (675, "/usr/lib/xorg/Xorg", 22 * MiB, "graphics"), (5762, "python", 1005 * MiB, "compute")]
    assert snapshot.timestamp == 1682353359.0  # Mon Apr 24 16:22:39 2023, read as UTC


def test_a100_v12_reads_renamed_power_and_event_reason_fields():
    snapshot = ReplaySource(XML / "a100-sxm4-v12.xml").snapshot()
    # The file says 4 attached GPUs but holds one <gpu> (in MIG mode): all it holds is listed.
    (gpu,) = snapshot.gpus
    assert gpu.name == "NVIDIA A100-SXM4-80GB"
    # The GPU's own fb_memory_usage, not one of its four MIG devices' (19968 MiB each).
    assert (gpu.memory_total, gpu.memory_reserved, gpu.memory_used, gpu.memory_free) == (
        81920 * MiB, 869 * MiB, 50 * MiB, 80999 * MiB)
    assert (gpu.power_draw, gpu.power_limit) == (67.03, 500.0)  # gpu_power_readings/current_power_limit
    assert gpu.utilization_gpu is None and gpu.utilization_memory is None  # "N/A" under MIG
    assert gpu.clock_event_reasons == ()  # clocks_event_reasons, all "Not Active"
    assert snapshot.driver_version == "535.54.03"


def test_a_file_of_some_of_the_machines_gpus_says_so():
    """`nvidia-smi -q -x -i 1` on a 4-GPU box: attached_gpus says 4, one <gpu> is recorded,
    without its index. The card showed 'GPU 0 ... (cuda:0' with no word of the other three."""
    from IPython.lib.pretty import pretty

    status = colab_gpu.status(XML / "a100-sxm4-v12.xml")
    assert status.snapshot.source == ("replay of a100-sxm4-v12.xml (holds 1 of the machine's 4 GPUs, "
                                      "numbered here from 0: the file does not say which)")
    assert "holds 1 of the machine" in pretty(status) and "holds 1 of the machine" in status._repr_html_()
    assert colab_gpu.status(XML / "tesla-t4.xml").snapshot.source == "replay of tesla-t4.xml"  # 1 of 1


def test_status_takes_a_path_as_bytes_and_refuses_what_is_no_source():
    """status(b'tesla-t4.xml') raised TypeError: can only concatenate str (not "bytes") to str;
    status(0), as if for GPU 0, raised AttributeError: 'int' object has no attribute 'snapshot'."""
    path = XML / "tesla-t4.xml"
    assert colab_gpu.status(bytes(path)).gpus[0].name == "Tesla T4"
    assert colab_gpu.status(path=bytes(path)).snapshot.source == "replay of tesla-t4.xml"
    for wrong in (0, None.__class__, [str(path)]):
        with pytest.raises(TypeError, match=r"status\(\) takes a recording's path .* or a DeviceSource"):
            colab_gpu.status(wrong)


def test_v13_average_power_draw_and_combined_process_types():
    (gpu,) = ReplaySource(XML / "rtx-4000-sff-ada-v13.xml").snapshot().gpus
    assert (gpu.power_draw, gpu.power_limit) == (8.81, 70.0)  # average_power_draw, not instant 8.44
    assert gpu.clock_event_reasons == ("idle",)
    assert (gpu.memory_total, gpu.memory_reserved) == (20475 * MiB, 460 * MiB)
    kinds = {p.pid: p.kind for p in gpu.processes}
    assert kinds == {1842: "graphics", 3190: "graphics", 4937: "compute", 34626: "compute"}  # C+G computes


def test_old_schemas_leave_unrecorded_fields_empty():
    (minimal,) = ReplaySource(XML / "gtx-1070-ti.xml").snapshot().gpus  # v10, a few fields only
    assert minimal.memory_total == 4096 * MiB and minimal.memory_reserved is None
    assert minimal.power_draw is None  # "N/A"
    assert minimal.processes is None and minimal.clock_event_reasons is None and minimal.sm_clock_max is None
    old = ReplaySource(XML / "gtx-1660-ti.xml").snapshot()  # driver 418: no reserved memory yet
    (gpu,) = old.gpus
    assert (gpu.name, old.driver_version, gpu.memory_reserved) == ("Graphics Device", "418.43", None)
    assert gpu.processes == () and gpu.clock_event_reasons == ("idle",)


def test_csv_with_units_replays_every_second_and_ends_on_the_last_row():
    frames = load_frames(CSV / "v100s-pcie-32gb_miris.csv")
    assert len(frames) == 107 and all(len(frame.gpus) == 1 for frame in frames)
    assert [frame.timestamp for frame in frames] == sorted(frame.timestamp for frame in frames)
    assert max(frame.gpus[0].utilization_gpu for frame in frames) == 19.0  # light load: at most 19 %
    used = [frame.gpus[0].memory_used for frame in frames]
    assert (used[0], max(used), used[-1]) == (1 * MiB, 1094 * MiB, 1 * MiB)  # idle -> load -> idle
    (gpu,) = ReplaySource(CSV / "v100s-pcie-32gb_miris.csv").snapshot().gpus
    assert (gpu.name, gpu.memory_total, gpu.memory_used, gpu.temperature) == (
        "Tesla V100S-PCIE-32GB", 32768 * MiB, 1 * MiB, 28.0)


def test_custom_header_log_groups_eight_gpus_per_timestamp():
    frames = load_frames(CSV / "8gpu-training_nanogpt-pr643.csv")
    assert len(frames) == 639 and {len(frame.gpus) for frame in frames} == {8}
    final = ReplaySource(CSV / "8gpu-training_nanogpt-pr643.csv").snapshot()
    assert final.source == "replay of 8gpu-training_nanogpt-pr643.csv"  # nothing guessed
    assert [gpu.index for gpu in final.gpus] == list(range(8))
    gpu = final.gpus[6]  # 2025-09-24T03:51:11.016Z,6, 47, 100, 389.93
    assert (gpu.temperature, gpu.utilization_gpu, gpu.power_draw) == (47.0, 100.0, 389.93)


def test_headerless_csv_is_recognised_from_its_units_and_says_so():
    path = CSV / "20gb-noheader_plato.csv"
    frames = load_frames(path)
    assert len(frames) == 1923
    assert max(frame.gpus[0].memory_used for frame in frames) == 20137 * MiB  # the jump to a full 20 GB
    final = ReplaySource(path).snapshot()
    assert "no header: columns read from their units as timestamp, utilization.gpu" in final.source
    (gpu,) = final.gpus  # 2026/04/25 18:46:43.733, 0 %, 0 %, 2 MiB, 20146 MiB, 27, 11.28 W
    assert (gpu.memory_used, gpu.memory_free, gpu.temperature, gpu.power_draw) == (2 * MiB, 20146 * MiB, 27.0, 11.28)
    # No memory.total column: nvidia-smi's total is used + free (+ the driver's reserve, not recorded)
    assert gpu.memory_total == (2 + 20146) * MiB and "memory total taken as used + free" in final.source


def test_a_log_without_memory_total_shows_the_total_and_judges_a_full_gpu(tmp_path):
    """The headerless log records used and free, no total: the card said "2 MiB used / n/a", and
    the log cut at its full moment (20137 MiB used, 11 free) got no advice that the GPU was full."""
    from IPython.lib.pretty import pretty

    path = CSV / "20gb-noheader_plato.csv"
    assert "  memory      2 MiB used / 19.68 GiB, 19.67 GiB free" in pretty(colab_gpu.status(path))
    rows = path.read_text().splitlines()
    last_full = max(number for number, row in enumerate(rows) if ", 20137 MiB, 11 MiB," in row)
    (tmp_path / "full.csv").write_text("\n".join(rows[:last_full + 1]) + "\n")
    status = colab_gpu.status(tmp_path / "full.csv")
    assert "  memory      19.67 GiB used / 19.68 GiB, 11 MiB free" in pretty(status)
    assert [advice.rule for advice in status.advice] == ["memory_nearly_full"]
    assert "GPU 0 was 100% full when recorded" in status.advice[0].message


def test_a_thin_recording_shows_what_it_holds_not_lines_of_n_a():
    from IPython.lib.pretty import pretty

    status = colab_gpu.status(CSV / "8gpu-80gb-idle_gpu-glasses.csv")
    shown = pretty(status)
    assert len(status.snapshot.gpus) == 8
    assert not [line for line in shown.splitlines() if line.lstrip().startswith(("clocks", "PCIe", "processes"))]
    assert shown.count("  memory      ") == 8 and ">PCIe</td>" not in status._repr_html_()
    t4 = colab_gpu.status(XML / "tesla-t4.xml")  # a full recording keeps every row
    assert "  clocks      SM 585 / 1590 MHz" in pretty(t4) and "  PCIe        gen 3/3 x8/16" in pretty(t4)
    assert ">PCIe</td>" in t4._repr_html_()


def test_a_log_without_memory_columns_shows_no_memory_row():
    """nanoGPT's log records temperature, utilization and power only: no "n/a used / n/a" line."""
    from IPython.lib.pretty import pretty

    status = colab_gpu.status(CSV / "8gpu-training_nanogpt-pr643.csv")
    shown = pretty(status)
    assert "  memory " not in shown and ">memory</td>" not in status._repr_html_()
    assert shown.count("  busy        100% compute, n/a memory bus") == 8


def test_a_log_without_power_temperature_or_state_shows_no_power_row(tmp_path):
    """`--query-gpu=index,name,memory.used,memory.total,utilization.gpu`, what students query
    most: every GPU had a line 'power n/a   temperature n/a   state n/a'."""
    from IPython.lib.pretty import pretty

    path = tmp_path / "memory.csv"
    path.write_text("index, name, memory.used [MiB], memory.total [MiB], utilization.gpu [%]\n"
                    "0, Tesla T4, 3 MiB, 15360 MiB, 0 %\n1, Tesla T4, 14000 MiB, 15360 MiB, 97 %\n")
    status = colab_gpu.status(path)
    shown = pretty(status)
    assert "  power " not in shown and ">power</td>" not in status._repr_html_()
    assert shown.count("  busy        ") == 2
    temperature_only = tmp_path / "temperature.csv"
    temperature_only.write_text("index, temperature.gpu\n0, 71\n")
    assert "  power       n/a, temperature 71 °C, state n/a" in pretty(colab_gpu.status(temperature_only))


def test_mig_mode_is_read_and_shown():
    """The A100 recording's GPU is split into MIG instances; the card said nothing of it."""
    from IPython.lib.pretty import pretty

    status = colab_gpu.status(XML / "a100-sxm4-v12.xml")
    assert status.gpus[0].mig_enabled is True
    assert "(cuda:0, compute capability 8.0, MIG on)" in pretty(status)
    assert "compute capability 8.0, MIG on</span>" in status._repr_html_()
    assert "mig_mode" in {advice.rule for advice in status.advice}
    assert colab_gpu.status(XML / "quadro-p2000-v12.xml").gpus[0].mig_enabled is None  # "N/A"


def test_a_link_without_its_maximum_shows_the_current_link_alone():
    """The v10 GTX 1070 Ti records only the current PCIe link; the card said "x16/n/a" and "xn/a"."""
    from IPython.lib.pretty import pretty

    status = colab_gpu.status(XML / "gtx-1070-ti.xml")
    assert "  PCIe        gen 1 x16; bus 00000000:01:00.0" in pretty(status)
    assert "gen 1 x16; bus 00000000:01:00.0" in status._repr_html_()
    # a live GPU whose link cannot be read: both cards say n/a, not "gen n/a xn/a"
    from colab_gpu.devices import GPU
    from colab_gpu.render import pcie_link
    assert pcie_link(GPU(0, "Tesla T4")) == "n/a"
    # nor power as "n/a of n/a" where neither draw nor limit is recorded
    assert "  power       n/a, temperature" in pretty(status)
    assert "n/a of n/a" not in status._repr_html_()


def test_a_whole_command_line_is_cut_so_the_card_keeps_its_width():
    """The RTX 3080 recording holds a browser's 400-character command line as its process name."""
    from IPython.lib.pretty import pretty

    status = colab_gpu.status(XML / "rtx-3080-v12.xml")
    (edge,) = [line for line in pretty(status).splitlines() if " 2214 " in line]
    assert edge == "  process        2214      79 MiB  /opt/microsoft/msedge/msedge --type=gpu-proc…"
    assert max(len(line) for line in pretty(status).splitlines() if line.startswith("  process")) == 80
    html = status._repr_html_()
    assert "--variations-seed-version</span>" not in html  # shown cut ...
    assert "title='/opt/microsoft/msedge/msedge --type=gpu-process" in html  # ... whole on hover


def test_unknown_headerless_layout_is_a_problem(tmp_path):
    rows = (CSV / "20gb-noheader_plato.csv").read_text().splitlines()[:3]
    path = tmp_path / "three-columns.csv"
    path.write_text("\n".join(", ".join(row.split(", ")[:3]) for row in rows))
    problem = ReplaySource(path).snapshot().problem
    assert problem == (f"cannot replay {path}: it is a CSV without a header line whose columns (time, %, %) "
                       f"match no known nvidia-smi layout: record it with a header (--format=csv); {ACCEPTED}")


def test_wrong_header_of_gpu_glasses_is_read_by_name_and_noted():
    final = ReplaySource(CSV / "8gpu-80gb-idle_gpu-glasses.csv").snapshot()
    assert "its index column repeats within one time step, so GPUs are numbered in row order" in final.source
    assert [gpu.index for gpu in final.gpus] == list(range(8))
    assert all(gpu.memory_total == 81559 * MiB and gpu.memory_used == 4 * MiB for gpu in final.gpus)
    assert all(gpu.utilization_gpu is None for gpu in final.gpus)  # it hides under "index"
    # The last step stops after GPU 2: GPUs 0-2 come from it, 3-7 from the step before.
    assert [gpu.power_draw for gpu in final.gpus] == [74.05, 73.24, 72.96, 73.93, 72.68, 72.31, 74.31, 73.43]
    assert [len(frame.gpus) for frame in load_frames(CSV / "8gpu-80gb-idle_gpu-glasses.csv")] == [8] * 5 + [3]


def _with_header(path, header):
    """A real log under another header line: the values stay as recorded."""
    return header + "\n" + path.read_text().split("\n", 1)[1]


@pytest.mark.parametrize("source, header, expected", [
    # gpu_glasses' values under a header that swaps index and utilization: 0..7 would be shown as 0-7 %.
    ("8gpu-80gb-idle_gpu-glasses.csv", "timestamp,utilization.gpu,index,memory.used,memory.total,power.draw,temperature.gpu",
     "the column named utilization.gpu holds 0, 1, ..., 7 in every time step, like GPU indices, "
     "while the one named index holds 0, 0, 0, ..."),
    # miris' percentages and MiB under each other's names.
    ("v100s-pcie-32gb_miris.csv", "timestamp, index, name, memory.total [MiB], utilization.memory [%], "
     "utilization.gpu [%], memory.used [MiB], temperature.gpu", "column 4 is named memory.total but it holds '0 %' on the first row"),
    ("v100s-pcie-32gb_miris.csv", "timestamp, index, name, utilization.gpu [MiB], utilization.memory [%], "
     "memory.total [MiB], memory.used [MiB], temperature.gpu", "column 4 is named utilization.gpu but its header says [MiB]"),
])
def test_a_header_that_contradicts_its_values_is_refused_in_one_line(tmp_path, source, header, expected):
    path = tmp_path / source
    path.write_text(_with_header(CSV / source, header))
    problem = ReplaySource(path).snapshot().problem
    assert problem == (f"cannot replay {path}: it is a CSV whose header contradicts its values: "
                       f"{expected}; fix the header line; {ACCEPTED}")


@pytest.mark.parametrize("capture", sorted(CAPTURES.glob("*.txt")), ids=lambda path: path.name.split("__")[1])
def test_every_field_query_gpu_csv_of_real_captures(capture, tmp_path):
    idle, load = tmp_path / "idle.csv", tmp_path / "load.csv"
    idle.write_text(section(capture, "idle :: query-gpu (csv"))
    load.write_text(section(capture, "load :: query-gpu (csv"))
    (quiet,) = ReplaySource(idle).snapshot().gpus
    (busy,) = ReplaySource(load).snapshot().gpus
    assert quiet.name.lower().replace(" ", "-") == capture.name.split("__")[1]  # the file is named after it
    assert quiet.memory_total == busy.memory_total and quiet.memory_total > 16000 * MiB
    assert quiet.memory_reserved is not None and quiet.power_limit is not None
    assert quiet.compute_capability in {(8, 9), (9, 0)}
    assert quiet.clock_event_reasons == ("idle",)  # clocks_event_reasons.active 0x...01
    assert busy.utilization_gpu > quiet.utilization_gpu
    assert busy.sm_clock > quiet.sm_clock and busy.sm_clock_max == quiet.sm_clock_max
    assert quiet.pcie_width_max == 16


@pytest.mark.parametrize("capture", sorted(CAPTURES.glob("*.txt")), ids=lambda path: path.name.split("__")[1])
def test_a_whole_capture_replays_its_query_gpu_logs(capture, tmp_path):
    """An nvidia_gpu_exporter capture holds the table, `nvidia-smi -q` and two --query-gpu logs
    (idle, then load): `--from` it said 'it is the `nvidia-smi` table, which has too little to
    replay'. Its logs are its time steps; the card shows the last, under load."""
    load = tmp_path / "load.csv"
    load.write_text(section(capture, "load :: query-gpu (csv"))
    idle, busy = load_frames(capture)
    assert busy.gpus == ReplaySource(load).snapshot().gpus and idle.gpus[0].utilization_gpu < 10
    final = ReplaySource(capture).snapshot()
    assert final.ok and final.gpus == busy.gpus
    assert final.source == (f"replay of {capture.name} (read from its --query-gpu CSV logs; its other "
                            f"nvidia-smi outputs left out)")


def test_the_h200_capture_on_the_card():
    text = str(colab_gpu.status(next(CAPTURES.glob("*h200*"))))
    assert "GPU 0  NVIDIA H200  (cuda:0, compute capability 9.0)" in text
    assert "31.60 GiB used / 140.40 GiB, 108.20 GiB free" in text  # 32362 of 143771 MiB, 110796 free
    assert "627.4 W of 700 W, temperature 52 °C, state P0" in text and "No GPU read" not in text


@pytest.mark.parametrize("title, expected", [
    ("load :: query-compute-apps", "it is a per-process log (`nvidia-smi --query-compute-apps` or "
                                   "`--query-accounted-apps`): its rows are processes, not GPUs"),
    ("load :: query-accounted-apps", "it is a per-process log"),  # header only: not 'no rows'
    ("load :: query-retired-pages", "it is a `nvidia-smi --query-retired-pages` log: its rows are "
                                    "retired memory pages, not GPUs"),
])
def test_a_query_of_processes_or_pages_is_not_read_as_gpus(title, expected, tmp_path):
    """nvidia-smi's other --query-* lists name the GPU on every row (gpu_name, gpu_bus_id,
    gpu_uuid): the H100's three processes showed as three H100s on one bus."""
    path = tmp_path / "apps.csv"
    path.write_text(section(next(CAPTURES.glob("*h100*")), title))
    snapshot = ReplaySource(path).snapshot()
    assert not snapshot.gpus
    assert snapshot.problem.startswith(f"cannot replay {path}: {expected}")
    assert "save `nvidia-smi -q -x` instead" in snapshot.problem


def test_h100_capture_values(tmp_path):
    path = tmp_path / "h100.csv"
    path.write_text(section(next(CAPTURES.glob("*h100*")), "idle :: query-gpu (csv"))
    (frame,) = load_frames(path)
    (gpu,) = frame.gpus
    assert (gpu.name, gpu.memory_total, gpu.memory_reserved, gpu.memory_used, gpu.memory_free) == (
        "NVIDIA H100 80GB HBM3", 81559 * MiB, 479 * MiB, 0, 81081 * MiB)
    assert (gpu.power_draw, gpu.power_limit, gpu.temperature, gpu.compute_capability) == (69.85, 700.0, 41.0, (9, 0))
    assert (gpu.pcie_generation, gpu.pcie_generation_max, gpu.performance_state) == (5, 5, "P0")
    assert frame.driver_version == "590.48.01"


def test_a_log_without_the_cuda_version_does_not_call_it_n_a(tmp_path):
    """A --query-gpu log records driver_version but no CUDA version: 'CUDA driver n/a' read as
    a machine without CUDA (the H100 ran CUDA 13.1). A recording shows what it holds."""
    from IPython.lib.pretty import pretty

    path = tmp_path / "h100.csv"
    path.write_text(section(next(CAPTURES.glob("*h100*")), "load :: query-gpu (csv"))
    status = colab_gpu.status(path)
    assert pretty(status).splitlines()[1:3] == ["Source: replay of h100.csv", "Driver 590.48.01"]
    assert "driver 590.48.01 · replay of h100.csv" in status._repr_html_()
    t4 = colab_gpu.status(XML / "tesla-t4.xml")  # a recording that holds both keeps both
    assert "Driver 515.105.01, CUDA driver 11.7" in pretty(t4) and "driver 515.105.01, CUDA 11.7" in t4._repr_html_()


# What each plain `!nvidia-smi` screen shows, read off the file: name, bus id, temperature, state,
# power draw / cap (W), memory used / total (MiB), utilization (%), driver, CUDA, the date line.
TABLE_FIGURES = {
    "15ada0ae26da": ("Tesla T4", "00000000:00:1E.0", 43, "P0", 25, 70, 3420, 15109, 0, "440.33.01", "11.3",
                     "Fri Sep 16 19:04:38 2022"),
    "f9c38dd4d5d1": ("Tesla T4", "00000000:00:1E.0", 27, "P8", 8, 70, 0, 15109, 0, "440.33.01", "11.3",
                     "Fri Sep 16 09:45:13 2022"),
    "54b991e34fdd": ("Tesla T4", "00000000:00:04.0", 45, "P8", 12, 70, 0, 15360, 0, "525.105.17", "12.0",
                     "Wed Aug  9 01:51:20 2023"),
    "5012d5020452": ("Tesla T4", "00000000:00:04.0", 70, "P8", 11, 70, 0, 15360, 0, "525.105.17", "12.0",
                     "Wed Nov 22 09:02:12 2023"),
    "6b1afba82b31": ("Tesla T4", "00000000:00:04.0", 49, "P8", 9, 70, 0, 15360, 0, "525.105.17", "12.0",
                     "Thu Nov 23 06:47:16 2023"),
    "1b6ac4832730": ("Tesla V100-SXM2...", "00000000:00:04.0", 42, "P0", 27, 300, 0, 16160, 0, "460.32.03", "11.2",
                     "Thu Sep  8 18:58:28 2022"),
    "1c0b3816bde0": ("Tesla V100-SXM2...", "00000000:00:1D.0", 38, "P0", 39, 300, 4, 16384, 0, "510.108.03", "11.6",
                     "Thu Apr  6 08:49:04 2023"),
}
TABLE_NOTE = ("read from the `nvidia-smi` table: memory used / total only (no free or driver-reserved column); "
              "no clocks, PCIe link, UUID or memory-bus use")


def test_every_table_screen_is_known():
    assert sorted(path.name.rsplit("__", 1)[1][:-4] for path in TABLES.glob("*.txt")) == sorted(TABLE_FIGURES)


@pytest.mark.parametrize("path", sorted(TABLES.glob("*.txt")), ids=lambda path: path.stem)
def test_every_nvidia_smi_table_replays_with_its_figures(path):
    """The `!nvidia-smi` table Colab and Kaggle users paste was refused as 'too little to replay',
    though it holds memory, power, temperature and utilization per GPU (drivers 440 to 525)."""
    (name, bus_id, temperature, state, draw, cap, used, total, utilization, driver, cuda,
     date) = TABLE_FIGURES[path.name.rsplit("__", 1)[1][:-4]]
    (frame,) = load_frames(path)
    (gpu,) = frame.gpus
    assert (gpu.index, gpu.name, gpu.bus_id, gpu.temperature, gpu.performance_state) == (0, name, bus_id, temperature, state)
    assert (gpu.power_draw, gpu.power_limit, gpu.utilization_gpu) == (draw, cap, utilization)
    assert (gpu.memory_used, gpu.memory_total) == (used * MiB, total * MiB)  # "15360MiB" is MiB
    # no free column: unknown, as in a --query-gpu log of total and used (total - used is not free)
    assert gpu.memory_free is None and gpu.memory_reserved is None
    assert (gpu.sm_clock, gpu.uuid, gpu.pcie_generation, gpu.utilization_memory) == (None, None, None, None)
    assert gpu.processes == ()  # "No running processes found", or an empty processes table
    assert (frame.driver_version, frame.cuda_driver_version) == (driver, cuda)
    assert frame.timestamp == datetime.datetime.strptime(date, "%a %b %d %H:%M:%S %Y").replace(
        tzinfo=datetime.timezone.utc).timestamp()
    assert frame.source.startswith(f"replay of {path.name} ({TABLE_NOTE}")
    assert ("names cut short by the table are shown as given" in frame.source) == name.endswith("...")


def test_the_newest_table_layout_of_a_capture_replays_with_its_processes(tmp_path):
    """Drivers 590 / 595: wider cells, and a GI / CI column in the processes table."""
    from IPython.lib.pretty import pretty

    path = tmp_path / "h200.txt"
    path.write_text(section(next(CAPTURES.glob("*h200*")), "load :: nvidia-smi (default table)"))
    status = colab_gpu.status(path)
    (gpu,) = status.snapshot.gpus
    assert (gpu.name, gpu.bus_id, gpu.mig_enabled, gpu.compute_capability) == ("NVIDIA H200", "00000000:83:00.0", False, (9, 0))
    assert (gpu.memory_used, gpu.memory_total, gpu.memory_free) == (32362 * MiB, 143771 * MiB, None)
    assert (gpu.power_draw, gpu.power_limit, gpu.temperature, gpu.utilization_gpu) == (628, 700, 52, 100)
    assert [(p.pid, p.name, p.used_memory, p.kind) for p in gpu.processes] == [
        (10291, "/root/tools/memhog", 2566 * MiB, "compute"), (10293, "/root/tools/memhog", 1542 * MiB, "compute"),
        (10309, "./gpu_burn", 28234 * MiB, "compute")]
    shown = pretty(status)
    assert "  memory      31.60 GiB used / 140.40 GiB, n/a free" in shown  # the same 32362 of 143771 MiB as its CSV
    assert "  process       10309   27.57 GiB  ./gpu_burn" in shown
    rtx = tmp_path / "rtx.txt"
    rtx.write_text(section(next(CAPTURES.glob("*4080*")), "idle :: nvidia-smi (default table)"))
    (gpu,) = ReplaySource(rtx).snapshot().gpus
    assert gpu.name == "NVIDIA GeForce RTX 4080 ..." and gpu.mig_enabled is None  # MIG M. "N/A"
    assert [(p.pid, p.kind) for p in gpu.processes][:2] == [(2165, "compute"), (2496, "graphics")]  # C+G, G


def _two_gpus(table: str) -> str:
    """A two-GPU table constructed from a one-GPU one: its GPU block repeated as GPU 1 on bus
    00000000:00:05.0, 123MiB used, and a process of GPU 1 added."""
    lines = table.splitlines()
    top = next(number for number, line in enumerate(lines) if line.startswith("|="))
    end = next(number for number in range(top + 1, len(lines)) if lines[number].startswith("+"))
    block = "\n".join(lines[top + 1:end + 1])
    second = re.sub(r"\|   0  ", "|   1  ", block).replace(":00:04.0", ":00:05.0").replace("     0MiB /", "   123MiB /")
    text = "\n".join(lines[:end + 1] + second.splitlines() + lines[end + 1:])
    return text.replace("|  No running processes found ",
                        "|    1   N/A  N/A      4242      C   python3                          120MiB |\n|")


def test_a_table_of_two_gpus_gives_each_its_figures_and_processes(tmp_path):
    path = tmp_path / "two.txt"
    path.write_text(_two_gpus((TABLES / "Tesla-T4__drv525.105.17__captured-2023-08-09__54b991e34fdd.txt").read_text()))
    (frame,) = load_frames(path)
    first, second = frame.gpus
    assert [(gpu.index, gpu.bus_id, gpu.memory_used) for gpu in frame.gpus] == [
        (0, "00000000:00:04.0", 0), (1, "00000000:00:05.0", 123 * MiB)]
    assert first.processes == () and [(p.pid, p.name, p.used_memory) for p in second.processes] == [(4242, "python3", 120 * MiB)]
    assert first.memory_total == second.memory_total == 15360 * MiB


def test_an_nvidia_smi_l_file_of_two_tables_is_two_time_steps_crlf_too(tmp_path):
    """`nvidia-smi -l 5 > smi.txt` appends a table a step under its date line; saved on Windows,
    its lines end in CRLF."""
    capture = next(CAPTURES.glob("*h100*"))
    idle, load = (section(capture, f"{step} :: nvidia-smi (default table)") for step in ("idle", "load"))
    path = tmp_path / "smi.txt"
    path.write_bytes((idle + "\n" + load).replace("\n", "\r\n").encode())
    first, second = load_frames(path)
    assert second.timestamp - first.timestamp == 15  # Tue Jul 14 08:12:38, then 08:12:53 2026
    assert (first.gpus[0].utilization_gpu, second.gpus[0].utilization_gpu) == (0, 100)
    assert (first.gpus[0].processes, len(second.gpus[0].processes)) == ((), 3)
    final = ReplaySource(path).snapshot()
    assert final.gpus == second.gpus and final.gpus[0].memory_used == 19818 * MiB


def test_a_mig_devices_section_gives_the_instances(tmp_path):
    """Constructed: the H100's table with MIG on and the MIG devices section nvidia-smi prints
    then (two 3g.40gb instances), before its processes table."""
    table = section(next(CAPTURES.glob("*h100*")), "idle :: nvidia-smi (default table)")
    mig = """
+-----------------------------------------------------------------------------------------+
| MIG devices:                                                                            |
+------------------+----------------------------------+-----------+-----------------------+
| GPU  GI  CI  MIG |                     Memory-Usage |        Vol|        Shared         |
|      ID  ID  Dev |                       BAR1-Usage | SM     Unc| CE ENC  DEC  OFA  JPG |
|                  |                                  |        ECC|                       |
|==================+==================================+===========+=======================|
|  0    1   0   0  |              44MiB / 40320MiB    | 60      0 |  3   0    3    0    3 |
|                  |                 0MiB / 65535MiB  |           |                       |
+------------------+----------------------------------+-----------+-----------------------+
|  0    2   0   1  |            1044MiB / 40320MiB    | 60      0 |  3   0    3    0    3 |
|                  |                 0MiB / 65535MiB  |           |                       |
+------------------+----------------------------------+-----------+-----------------------+
"""
    table = table.replace("            Disabled |", "             Enabled |")
    cut = table.index("\n\n+")  # the blank line between the GPUs and the processes
    path = tmp_path / "mig.txt"
    path.write_text(table[:cut] + "\n" + mig + table[cut:])
    (gpu,) = ReplaySource(path).snapshot().gpus
    assert gpu.mig_enabled is True and gpu.memory_total == 81559 * MiB
    assert [(m.index, m.gpu_instance_id, m.compute_instance_id, m.multiprocessors, m.memory_used, m.memory_total)
            for m in gpu.mig_instances] == [(0, 1, 0, 60, 44 * MiB, 40320 * MiB), (1, 2, 0, 60, 1044 * MiB, 40320 * MiB)]
    assert gpu.processes == ()
    plain = tmp_path / "plain.txt"  # MIG off, no section: no instances, as from the XML
    plain.write_text(section(next(CAPTURES.glob("*h100*")), "idle :: nvidia-smi (default table)"))
    assert ReplaySource(plain).snapshot().gpus[0].mig_instances is None


def test_follow_mode_steps_through_every_frame_and_loops():
    path = CSV / "v100s-pcie-32gb_miris.csv"
    frames = load_frames(path)
    source = ReplaySource(path, follow=True)
    played = [source.snapshot() for _ in range(len(frames) + 2)]
    assert played[:len(frames)] == list(frames)
    assert played[len(frames):] == list(frames[:2])
    fixed = ReplaySource(path)
    assert fixed.snapshot() == fixed.snapshot() == frames[-1]


def test_open_source_with_a_path_is_the_replay_source():
    source = open_source(str(XML / "tesla-t4.xml"))
    assert isinstance(source, ReplaySource) and source.label == "replay of tesla-t4.xml"
    source.close()
    source.close()  # harmless twice


def _malformed():
    """(file name, content, what the problem line must say) for files that cannot be replayed."""
    t4 = (XML / "tesla-t4.xml").read_bytes()
    capture = next(CAPTURES.glob("*h200*"))
    miris = (CSV / "v100s-pcie-32gb_miris.csv").read_text().splitlines()
    return [
        ("empty.xml", b"", "it is empty"),
        ("blank.csv", b"\n  \n", "it is empty"),
        ("image.png", b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR", "it holds binary data, not text"),
        ("latin1.csv", "temp\xe9rature\n".encode("latin-1"), "it is not UTF-8 text"),
        ("cut.xml", t4[: len(t4) // 2], "it is not well-formed XML (unclosed token: line 213"),
        ("other.xml", b"<html><body>hi</body></html>", "it is XML but not from `nvidia-smi -q -x` (its root element is <html>"),
        # a table pasted without its GPU rows (the table itself replays: see the table tests)
        ("table.txt", "\n".join(section(capture, "idle :: nvidia-smi (default table)").splitlines()[:7]).encode(),
         "it is the `nvidia-smi` table but holds no GPU rows"),
        ("query.txt", section(capture, "idle :: query (-q)").encode(), "it is `nvidia-smi -q` text"),
        ("header-only.csv", (miris[0] + "\n").encode(), "it has a CSV header but no rows"),
        # `nvidia-smi -L > gpus.txt` on a one-GPU runtime: one line, which is no CSV header
        ("gpus.txt", section(capture, "capabilities :: list (-L)").encode(),
         "it is neither XML nor a CSV log: its first line is 'GPU 0: NVIDIA H200 (UUID: "),
        ("short-row.csv", "\n".join(miris[:2] + [miris[2].rsplit(",", 2)[0]] + miris[3:5]).encode(),
         "it has 6 values on line 3 where the header names 8 columns"),
        ("unrelated.csv", b"player,score\nalice,3\n", "it is a CSV whose columns (player, score) are not nvidia-smi"),
        ("LICENSE", (ROOT / "LICENSE").read_bytes(), "it is neither XML nor a CSV log: its first line is 'MIT License'"),
    ]


def test_a_path_starting_with_the_home_tilde_is_found(tmp_path, monkeypatch):
    """`%gpu_status --from ~/logs/t4.xml`: no shell expands the ~ on a magic's line."""
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "t4.xml").write_bytes((XML / "tesla-t4.xml").read_bytes())
    snapshot = ReplaySource("~/t4.xml").snapshot()
    assert snapshot.problem is None and snapshot.gpus[0].name == "Tesla T4"


@pytest.mark.parametrize("name", ["tesla-t4.xml", "v100s-pcie-32gb_miris.csv"])
def test_a_recording_saved_as_utf16_by_windows_powershell_replays(tmp_path, name):
    """PowerShell 5's `>` writes UTF-16 with a BOM: the file was called binary data."""
    original = (XML if name.endswith(".xml") else CSV) / name
    path = tmp_path / name
    path.write_bytes(original.read_text().replace("\n", "\r\n").encode("utf-16"))
    replayed, expected = ReplaySource(path).snapshot(), ReplaySource(original).snapshot()
    assert replayed.problem is None and replayed.gpus == expected.gpus and replayed.gpus


def test_a_log_cut_off_mid_line_replays_up_to_its_last_whole_line_and_says_so(tmp_path):
    """A log copied while `nvidia-smi -l` was writing it: the whole file was refused."""
    text = (CSV / "v100s-pcie-32gb_miris.csv").read_text()
    lines = text.splitlines()
    path = tmp_path / "copied-while-written.csv"
    path.write_text("\n".join(lines[:54]) + "\n" + lines[54][:40])  # 53 rows and half of one
    (last_whole,) = load_frames(CSV / "v100s-pcie-32gb_miris.csv")[52].gpus
    snapshot = ReplaySource(path).snapshot()
    assert snapshot.problem is None and snapshot.gpus == (last_whole,)
    assert snapshot.source.endswith("(its last line is cut off (3 of 8 values) and left out)")
    whole_but_short = tmp_path / "short.csv"  # a short line that ends properly is not "cut off"
    whole_but_short.write_text("\n".join(lines[:54]) + "\n" + lines[54][:40] + "\n")
    assert "has 3 values on line 55" in ReplaySource(whole_but_short).snapshot().problem


def test_gpus_of_a_log_without_index_are_told_apart_by_bus_id_or_uuid(tmp_path):
    """`nvidia-smi --query-gpu=name,pci.bus_id,memory.used --format=csv` on Kaggle's two T4s,
    twice: each row was read as a time step of one GPU, and the card showed the second T4
    alone, as GPU 0."""
    path = tmp_path / "two-t4.csv"
    path.write_text("name, pci.bus_id, memory.used [MiB], memory.total [MiB]\n"
                    "Tesla T4, 00000000:00:04.0, 3 MiB, 15360 MiB\n"
                    "Tesla T4, 00000000:00:05.0, 14000 MiB, 15360 MiB\n"
                    "Tesla T4, 00000000:00:04.0, 5 MiB, 15360 MiB\n"
                    "Tesla T4, 00000000:00:05.0, 14100 MiB, 15360 MiB\n")
    frames = load_frames(path)
    assert [[(gpu.index, gpu.bus_id[-4:], gpu.memory_used // MiB) for gpu in frame.gpus] for frame in frames] == [
        [(0, "04.0", 3), (1, "05.0", 14000)], [(0, "04.0", 5), (1, "05.0", 14100)]]
    by_uuid = tmp_path / "by-uuid.csv"
    by_uuid.write_text("uuid, memory.used [MiB]\nGPU-aaaa, 1 MiB\nGPU-bbbb, 2 MiB\n")
    assert [gpu.memory_used // MiB for gpu in ReplaySource(by_uuid).snapshot().gpus] == [1, 2]
    text = str(colab_gpu.status(path))
    assert "GPU 0  Tesla T4" in text and "GPU 1  Tesla T4" in text and "(no timestamp" not in text


def test_a_log_with_nothing_to_tell_rows_apart_says_how_it_was_read(tmp_path):
    """Without a timestamp, index, UUID or bus id, two rows may be two GPUs or two moments of
    one: the card shows one GPU, and now says why."""
    path = tmp_path / "two-rows.csv"
    path.write_text("name, memory.used [MiB]\nTesla T4, 3 MiB\nTesla T4, 14000 MiB\n")
    snapshot = ReplaySource(path).snapshot()
    assert [gpu.memory_used // MiB for gpu in snapshot.gpus] == [14000]
    assert snapshot.source == ("replay of two-rows.csv (no timestamp, GPU index, uuid or bus id: "
                               "each row is read as the next time step of one GPU)")
    one_row = tmp_path / "one-row.csv"
    one_row.write_text("name, memory.used [MiB]\nTesla T4, 3 MiB\n")
    assert ReplaySource(one_row).snapshot().source == "replay of one-row.csv"


def test_a_log_appended_to_by_two_runs_skips_the_second_header(tmp_path):
    """`nvidia-smi --query-gpu=... --format=csv -l 1 >> gpu.csv` run twice writes its header
    twice: the second became a GPU named 'name' with no readings, a replayed sample of its own,
    and the card's only GPU where the last run was stopped before its first sample."""
    lines = (CSV / "v100s-pcie-32gb_miris.csv").read_text().splitlines()
    path = tmp_path / "gpu.csv"
    path.write_text("\n".join(lines[:4] + lines[:3] + lines[:1]) + "\n")
    frames = load_frames(path)
    first_three = [frame.gpus for frame in load_frames(CSV / "v100s-pcie-32gb_miris.csv")[:3]]
    assert [frame.gpus for frame in frames] == first_three + first_three[:2]
    assert "GPU 0  Tesla V100S-PCIE-32GB  (cuda:0" in str(colab_gpu.status(path))
    headers_only = tmp_path / "headers.csv"
    headers_only.write_text(lines[0] + "\n" + lines[0] + "\n")
    assert "it has a CSV header but no rows" in ReplaySource(headers_only).snapshot().problem


def test_a_log_of_one_column_replays(tmp_path):
    """`--query-gpu=memory.used`: one column, no comma, and still a log (unlike a text file)."""
    path = tmp_path / "memory.csv"
    path.write_text("memory.used [MiB]\n1234 MiB\n")
    snapshot = ReplaySource(path).snapshot()
    assert snapshot.problem is None and snapshot.gpus[0].memory_used == 1234 * 1024 ** 2


def test_files_that_are_no_recording_become_one_problem_line(tmp_path):
    for name, content, expected in _malformed():
        path = tmp_path / name
        path.write_bytes(content)
        snapshot = ReplaySource(path).snapshot()  # never raises
        problem = snapshot.problem
        assert problem is not None and snapshot.gpus == (), name
        assert problem.startswith(f"cannot replay {path}: ") and expected in problem, (name, problem)
        assert problem.endswith(ACCEPTED) and "\n" not in problem, name
        assert snapshot.source == f"replay of {name}"


@pytest.mark.parametrize("name, capability", [
    ("Tesla T4", (7, 5)), ("NVIDIA A100-SXM4-80GB", (8, 0)), ("NVIDIA GeForce RTX 3090", (8, 6)),
    ("NVIDIA RTX 4000 SFF Ada Generation", (8, 9)), ("NVIDIA GeForce GTX 1070 Ti", (6, 1)),
    ("Quadro P400", (6, 1)), ("Tesla V100-SXM2-16GB", (7, 0)), ("NVIDIA H100 80GB HBM3", (9, 0)),
    ("NVIDIA L4", (8, 9)), ("Tesla P100-PCIE-16GB", (6, 0)), ("Graphics Device", None),
    ("NVIDIA TITAN X (Pascal)", (6, 1)), ("NVIDIA TITAN Xp", (6, 1)), ("GeForce GTX TITAN X", (5, 2)),
    ("Tesla M40 24GB", (5, 2)), ("GeForce GTX 980 Ti", (5, 2)),
])
def test_compute_capability_known_by_name(name, capability):
    assert known_compute_capability(name) == capability


@pytest.mark.parametrize("name, capability, rule", [
    ("Quadro RTX 4000", (7, 5), "turing_fp16"), ("Quadro RTX 5000", (7, 5), "turing_fp16"),
    ("NVIDIA RTX 5000 Ada Generation", (8, 9), "ampere_bf16"),
])
def test_a_workstation_card_is_not_taken_for_the_geforce_of_its_number(tmp_path, name, capability, rule):
    """A Quadro RTX 4000 (Turing, Paperspace's free tier) was read as an RTX 4080's 8.9 and told
    to train in bf16, which it runs emulated; a Quadro RTX 5000 as an RTX 5090's 12.0; an RTX
    5000 Ada Generation as Blackwell. The recording is the real T4's, renamed."""
    (tmp_path / "card.xml").write_text((XML / "tesla-t4.xml").read_text().replace(
        "<product_name>Tesla T4</product_name>", f"<product_name>{name}</product_name>"))
    status = colab_gpu.status(path=str(tmp_path / "card.xml"))
    assert f"GPU 0  {name}  (cuda:0, compute capability {capability[0]}.{capability[1]})" in str(status)
    assert [advice.rule for advice in status.advice] == [rule]


def test_a_recorded_t4_gets_the_fp16_advice():
    """nvidia-smi's XML has no compute capability; the T4's is known by name."""
    status = colab_gpu.status(path=str(XML / "tesla-t4.xml"))
    assert status.gpus[0].compute_capability == (7, 5)
    assert [advice.rule for advice in status.advice] == ["turing_fp16"]


def test_a_recording_without_uuids_shows_no_uuid_line_but_its_bus():
    """The table (and a log with pci.bus_id) records a bus id and no UUID: the card showed
    "uuid n/a", as if the read had failed, since the uuid row was left out only with the PCIe facts."""
    from IPython.lib.pretty import pretty

    import colab_gpu

    for source in (TABLES / "Tesla-T4__drv525.105.17__captured-2023-11-22__5012d5020452.txt",):
        status = colab_gpu.status(source)
        shown, card = pretty(status), status._repr_html_()
        assert "bus 00000000:00:04.0" in shown and "uuid" not in shown
        assert "00000000:00:04.0" in card and ">uuid<" not in card
    assert "  uuid        GPU-" in pretty(colab_gpu.status(XML / "tesla-t4.xml"))  # recorded: shown
