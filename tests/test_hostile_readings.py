"""Impossible recorded values (issue #40): more memory used than the GPU has, a negative total,
500 % busy, a GPU index of 20 digits, numbers past a float. Each is marked as an invalid reading
on the card (text and HTML) instead of shown, and no advice is built on it; an index, which
cannot become n/a, refuses the recording in one line. Recordings are the real ones of
tests/data, edited."""
from __future__ import annotations

import re
import time

import pytest
from IPython.lib.pretty import pretty

import colab_gpu
from colab_gpu.devices import GPU, MiB, GPUProcess, InvalidIndex, MigInstance

from conftest import DATA

T4_XML = (DATA / "nvidia-smi-xml" / "tesla-t4.xml").read_text()
A100_MIG_XML = (DATA / "nvidia-smi-xml" / "a100-sxm4-v12.xml").read_text()
V100_CSV = (DATA / "nvidia-smi-csv" / "v100s-pcie-32gb_miris.csv").read_text().splitlines()


def edited_xml(text, **values):
    """The XML with the first element of each name (fb_memory_usage/total as "total") set anew."""
    for tag, value in values.items():
        text, count = re.subn(rf"<{tag}>[^<]*</{tag}>", f"<{tag}>{value}</{tag}>", text, count=1)
        assert count == 1, tag
    return text


def edited_csv(**cells):
    """The V100 log's header and first row, its cells (by header name) set anew."""
    header = [name.strip() for name in V100_CSV[0].split(",")]
    row = [cell.strip() for cell in V100_CSV[1].split(",")]
    for name, value in cells.items():
        row[header.index(name)] = value
    return f"{V100_CSV[0]}\n{', '.join(row)}\n"


def taken(tmp_path, name, text):
    """colab_gpu.status of ``text`` saved as ``name``: its text, HTML and advice, within a bound."""
    path = tmp_path / name
    path.write_text(text)
    started = time.monotonic()
    status = colab_gpu.status(path=path)
    text, html = pretty(status), status._repr_html_()
    assert time.monotonic() - started < 10
    assert "Traceback" not in text
    return status, " ".join(text.split()), html  # the text unfolded from its 80 columns


def rules(status):
    return [advice.rule for advice in status.advice]


def test_more_memory_used_than_the_gpu_has_is_an_invalid_reading_and_no_advice(tmp_path):
    memory_total = "<total>100 MiB</total>"  # fb_memory_usage's total, the first <total> of the file
    xml = T4_XML.replace("<total>15360 MiB</total>", memory_total, 1)
    status, text, html = taken(tmp_path, "t4.xml", edited_xml(xml, used="999999 MiB"))
    assert "memory n/a (invalid reading: 976.56 GiB used of 100 MiB)" in text
    assert "memory</td><td>n/a (invalid reading: 976.56&nbsp;GiB used of 100&nbsp;MiB)</td>" in html
    assert "999999%" not in text + html and "976.56 GiB used / 100 MiB" not in text
    assert "cgpu-bar" not in html.split("memory</td>")[1].split("</tr>")[0]  # no bar filled past its end
    assert "memory_nearly_full" not in rules(status)
    gpu = status.gpus[0]
    assert (gpu.memory_used, gpu.memory_total, gpu.memory_used_fraction) == (None, None, None)
    assert gpu.invalid == (("memory", "976.56 GiB used of 100 MiB"),)


def test_a_gpu_nearly_full_still_gets_its_advice(tmp_path):
    """The control of the test above: a reading that can be, 99 of 100 MiB, is advised on."""
    xml = T4_XML.replace("<total>15360 MiB</total>", "<total>100 MiB</total>", 1)
    xml = edited_xml(xml, used="99 MiB", free="1 MiB", reserved="0 MiB")
    xml = xml.replace("<used_memory>1005 MiB</used_memory>", "<used_memory>90 MiB</used_memory>")
    status, text, _ = taken(tmp_path, "t4.xml", xml)
    assert "memory 99 MiB used / 100 MiB" in text and "invalid" not in text
    assert "memory_nearly_full" in rules(status)


def test_a_negative_total_is_an_invalid_reading(tmp_path):
    status, text, html = taken(tmp_path, "v100.csv", edited_csv(**{"memory.total [MiB]": "-100 MiB",
                                                                  "memory.used [MiB]": "10 MiB"}))
    assert "memory n/a (invalid reading: -100 MiB total)" in text
    assert "n/a (invalid reading: -100&nbsp;MiB total)" in html
    assert "/ -100" not in text


def test_utilization_past_100_and_a_temperature_below_absolute_zero_are_invalid_readings(tmp_path):
    status, text, html = taken(tmp_path, "t4.xml", edited_xml(T4_XML, gpu_util="500 %", gpu_temp="-300 C"))
    assert "busy n/a compute, 0% memory bus (invalid reading: compute 500%)" in text
    assert "temperature n/a, state P0 (invalid reading: temperature -300 °C)" in text
    assert "invalid reading: compute 500%" in html and "500%</td>" not in html
    assert "500% compute" not in text and 'title="100%"' not in html  # no bar for busy
    gpu = status.gpus[0]
    assert gpu.utilization_gpu is None and gpu.temperature is None and gpu.memory_total == 15360 * MiB


def test_a_gpu_index_of_20_digits_refuses_the_recording_in_one_line(tmp_path):
    """Read through a float it showed as GPU 12345678901234567168; no GPU has such an index,
    and the index cannot be n/a: it names the GPU."""
    status, text, html = taken(tmp_path, "v100.csv", edited_csv(index="12345678901234567891"))
    problem = status.snapshot.problem
    assert problem.startswith(f"cannot replay {tmp_path / 'v100.csv'}: it gives GPU index 12345678901234567891, "
                              f"which none has (NVML numbers them from 0, below 4294967296)")
    assert "\n" not in problem and "12345678901234567168" not in text + html
    assert status.gpus == () and "memory_nearly_full" not in rules(status)


@pytest.mark.parametrize("index", ["-1", "4294967296", "9" * 5000])
def test_any_index_no_gpu_has_refuses_the_recording(tmp_path, index):
    status, _, _ = taken(tmp_path, "v100.csv", edited_csv(index=index))
    assert "which none has" in status.snapshot.problem and len(status.snapshot.problem) < 400


def test_numbers_past_a_float_are_invalid_readings_not_a_traceback(tmp_path):
    """A 400-digit size read as a float is infinite: int() of it raised OverflowError."""
    status, text, _ = taken(tmp_path, "v100.csv", edited_csv(**{"memory.used [MiB]": "9" * 400 + " MiB",
                                                              "utilization.gpu [%]": "9" * 400 + " %"}))
    assert "memory n/a (invalid reading: 104857599… (407 digits) bytes used)" in text  # 10**400 MiB
    assert "(invalid reading: compute inf%)" in text
    assert status.gpus[0].memory_used is None


def test_a_process_holding_more_than_its_gpu_has_is_an_invalid_reading(tmp_path):
    xml = T4_XML.replace("<used_memory>1005 MiB</used_memory>", "<used_memory>999999 MiB</used_memory>")
    status, text, html = taken(tmp_path, "t4.xml", xml)
    assert "invalid pid 5762 holding 976.56 GiB of 15.00 GiB: its memory n/a" in text
    assert "976.56&nbsp;GiB" not in html.split("invalid</td>")[0]  # not in the process list
    assert "largest: pid 5762" not in " ".join(advice.message for advice in status.advice)


def test_a_mig_instance_using_more_than_it_has_is_an_invalid_reading(tmp_path):
    xml = A100_MIG_XML.replace("<used>12 MiB</used>", "<used>99999 MiB</used>", 1)
    status, text, html = taken(tmp_path, "a100.xml", xml)
    assert "MIG 0 n/a used / n/a, GPU instance 3, compute instance 0, 14 SMs (invalid reading: " \
           "97.66 GiB used of 19.50 GiB)" in text
    assert "MIG 1 12 MiB used / 19.50 GiB" in text and "invalid reading: 97.66&nbsp;GiB used" in html
    assert status.gpus[0].mig_instances[0].memory_used_fraction is None


def test_the_dataclasses_check_every_source_s_readings_when_built():
    """NVML's readings go through the same: a broken driver's 4294967295 % is no reading."""
    gpu = GPU(index=0, name="T4", memory_total=100 * MiB, memory_used=50 * MiB, utilization_gpu=4294967295.0,
              power_draw=-5.0, sm_clock=-1, pcie_width=float("nan"),
              processes=(GPUProcess(pid=7, used_memory=-1), GPUProcess(pid=8, used_memory=10 * MiB)))
    assert gpu.memory_used == 50 * MiB and gpu.utilization_gpu is None and gpu.power_draw is None
    assert gpu.sm_clock is None and gpu.pcie_width is None
    assert [process.used_memory for process in gpu.processes] == [None, 10 * MiB]
    assert dict(gpu.invalid) == {"utilization_gpu": "compute 4.29497e+09%", "power_draw": "power draw -5 W",
                                 "sm_clock": "SM clock -1 MHz", "pcie_width": "PCIe width nan",
                                 "processes": "pid 7 holding -1 B: its memory n/a"}
    assert MigInstance(index=0, memory_total=10, memory_used=11).invalid == (("memory", "11 B used of 10 B"),)
    mig = MigInstance(index=1, gpu_instance_id=2 ** 40, multiprocessors=-14)
    assert (mig.gpu_instance_id, mig.multiprocessors) == (None, None)
    assert [what for _, what in mig.invalid] == ["gpu instance id 1099511627776", "multiprocessors -14"]
    with pytest.raises(InvalidIndex):
        MigInstance(index=-1)
    listed = GPU(index=0, name="T4", processes=(GPUProcess(pid=-3), GPUProcess(pid=2 ** 40), GPUProcess(pid=9)))
    assert [process.pid for process in listed.processes] == [9]
    assert [what for _, what in listed.invalid] == ["a process numbered -3: left out",
                                                    "a process numbered 1099511627776: left out"]
    for index in (-1, 2 ** 32, True, 1.5):
        with pytest.raises(InvalidIndex):
            GPU(index=index, name="T4")
    valid = GPU(index=3, name="T4", memory_total=100, memory_used=100, memory_free=0, utilization_gpu=100.0,
                temperature=-20.0, power_draw=0.0)
    assert valid.invalid == () and valid.memory_used_fraction == 1.0


def test_a_number_past_4300_digits_in_an_nvidia_smi_table_is_no_traceback(tmp_path):
    """The table's process and MIG rows were read with int(): a 5000-digit pid raised ValueError."""
    capture = (DATA / "nvidia-smi-captures" / "linux-x86_64__nvidia-geforce-rtx-4080-super__595.71.05.txt")
    lines = capture.read_text().splitlines()
    start = next(number for number, line in enumerate(lines) if line.startswith("| NVIDIA-SMI")) - 2
    table = "\n".join(lines[start:start + 30]).replace("2165    C+G", "9" * 5000 + "    C+G", 1)
    status, text, _ = taken(tmp_path, "table.txt", table)
    assert "invalid a process numbered inf: left out" in text  # past int(str), read through a float
    assert "2496" in text and status.gpus[0].memory_used == 596 * MiB
