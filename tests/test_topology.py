"""%gpu_status on several GPUs says how they are linked (NVLink or which PCIe path), as
``nvidia-smi topo -m`` does, read through NVML: the stand-in answers from real recordings of
the GPUs, and from a stated wiring (no recording holds one: the captures' ``topo -m`` shows a
single GPU). A recording's card says the topology was not recorded."""
from __future__ import annotations

import dataclasses
import re

import pynvml

import colab_gpu
from colab_gpu.devices import Link
from colab_gpu.devices.nvml import NvmlSource
from colab_gpu.devices.replay import ReplaySource
from conftest import DATA
from nvml_recording import RecordedNvml, Wiring

XML = DATA / "nvidia-smi-xml"
H100 = DATA / "nvidia-smi-captures" / "linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt"
GPU_TYPE, SWITCH_TYPE = 0, 2  # NVML's NVLink far-end device types


def bus(index: int) -> str:
    return f"00000000:{0x10 + index:02X}:00.0"


def box(recording, gpus: int, wiring: Wiring) -> NvmlSource:
    """``gpus`` copies of the recorded GPU, on consecutive PCI buses, wired as ``wiring`` says."""
    recorded = ReplaySource(recording).snapshot()
    copies = tuple(dataclasses.replace(recorded.gpus[0], index=index, bus_id=bus(index),
                                       uuid=f"GPU-{index:08d}-0000-0000-0000-000000000000")
                   for index in range(gpus))
    return NvmlSource(nvml=RecordedNvml(dataclasses.replace(recorded, gpus=copies), wiring=wiring))


def recorded_nvlinks(capture) -> int:
    """The NVLinks `nvidia-smi nvlink -s` listed in a capture (its GPU's, all up)."""
    text = capture.read_text()
    section = text.split("# $ nvidia-smi nvlink -s", 1)[1].split("# capabilities", 1)[0]
    return len(re.findall(r"^\s+Link \d+: [\d.]+ GB/s", section, re.MULTILINE))


def test_kaggles_two_t4s_on_pcie_say_their_path():
    """T4s have no NVLink (NVML: not supported); the pair meets at the CPU's host bridge."""
    status = colab_gpu.status(box(XML / "tesla-t4.xml", 2, Wiring(ancestors={
        frozenset({0, 1}): pynvml.NVML_TOPOLOGY_HOSTBRIDGE})))
    assert status.snapshot.topology == (Link(0, 1, "PHB"),)
    assert "\nInterconnect  PCIe through the CPU (PHB) between every pair" in str(status)
    assert "PCIe through the CPU (PHB) between every pair" in status._repr_html_()


def test_h100s_joined_by_nvswitches_are_nv18_between_every_pair():
    """The capture's H100 has 18 NVLinks up; on an HGX board each goes to an NVSwitch."""
    links = recorded_nvlinks(H100)
    assert links == 18
    switches = [(f"00000000:{0x80 + link % 4:02X}:00.0", SWITCH_TYPE) for link in range(links)]
    source = box(H100, 4, Wiring(nvlinks={index: switches for index in range(4)}))
    status = colab_gpu.status(source)
    assert {link.path for link in status.snapshot.topology} == {"NV18"} and len(status.snapshot.topology) == 6
    assert "Interconnect  NVLink x18 (NV18) between every pair" in str(status)
    calls = len(source._nvml.calls)
    colab_gpu.status(source)  # slots and cables do not change: read once
    assert not any("NvLink" in call for call in source._nvml.calls[calls:])


def test_nvlink_bridged_pairs_and_pcie_between_them():
    """Two pairs of GPUs with 4 direct NVLinks each (bridges), across two CPU sockets."""
    def bridge(peer):
        return [(bus(peer), GPU_TYPE)] * 4

    wiring = Wiring(nvlinks={0: bridge(1), 1: bridge(0), 2: bridge(3), 3: bridge(2)},
                    ancestors={frozenset(pair): pynvml.NVML_TOPOLOGY_SYSTEM for pair in ((0, 2), (0, 3), (1, 2), (1, 3))})
    status = colab_gpu.status(box(XML / "rtx-3090-v12.xml", 4, wiring))
    text = str(status)
    assert ("\nInterconnect  NVLink x4 (NV4): 0-1, 2-3;\n"
            "              PCIe across CPU sockets (SYS): 0-2, 0-3, 1-2, 1-3\n") in text  # folded at 80 columns

    assert [link.nvlink for link in status.snapshot.topology] == [True, False, False, False, False, True]


def test_a_driver_that_cannot_say_leaves_the_path_unknown():
    status = colab_gpu.status(box(XML / "tesla-t4.xml", 2, Wiring()))
    assert status.snapshot.topology == (Link(0, 1, None),)
    assert "Interconnect  n/a between every pair" in str(status)


def test_a_recording_of_several_gpus_says_the_topology_was_not_recorded():
    status = colab_gpu.status(path=DATA / "nvidia-smi-csv" / "8gpu-training_nanogpt-pr643.csv")
    assert len(status.gpus) == 8 and status.snapshot.topology is None
    assert str(status).count("Interconnect  topology not recorded") == 1
    assert "topology not recorded" in status._repr_html_()


def test_one_gpu_has_no_links_line_and_reads_no_topology():
    source = box(XML / "tesla-t4.xml", 1, Wiring())
    text = str(colab_gpu.status(source))
    assert "Interconnect" not in text and not any("Topology" in call or "NvLink" in call for call in source._nvml.calls)


def test_the_live_monitors_light_reads_skip_the_topology():
    source = box(XML / "tesla-t4.xml", 2, Wiring(ancestors={frozenset({0, 1}): pynvml.NVML_TOPOLOGY_SINGLE}))
    assert source.light_snapshot().topology is None
    assert not any("Topology" in call for call in source._nvml.calls)
