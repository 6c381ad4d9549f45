"""``nvidia-smi -q -x`` XML: one time step, the fullest recording there is.

It alone holds clocks, the PCIe link, UUIDs, processes and MIG devices together. Schema v10 to
v13 are read; field names moved between versions (e.g. ``clocks_throttle_reasons`` ->
``clocks_event_reasons``, ``power_readings`` -> ``gpu_power_readings``, ``power_draw`` ->
``average_power_draw``), so a field is looked up under each name it has had.
"""
from __future__ import annotations

import re
import xml.etree.ElementTree as ElementTree
from typing import Optional, Tuple

from .. import GPU, GPUProcess, MemoryFields, MigInstance, Snapshot, known_compute_capability
from .values import (UNKNOWN_NAME, RecordingError, as_bytes, as_enabled, as_float, as_int, as_text, epoch,
                     event_reasons, process_kind, with_note)

__all__ = ["read", "sniff"]


def _find(element, *paths: str) -> Optional[str]:
    """The text of the first of ``paths`` that holds a value (names moved across versions)."""
    for path in paths:
        found = element.find(path)
        if found is not None and as_text(found.text) is not None:
            return found.text.strip()
    return None


def _xml_processes(gpu) -> Optional[Tuple[GPUProcess, ...]]:
    processes = gpu.find("processes")
    if processes is None:
        return None
    result = []
    for info in processes.findall("process_info"):
        pid = as_int(_find(info, "pid"))
        if pid is None:
            continue
        result.append(GPUProcess(
            pid=pid,
            name=_find(info, "process_name"),
            used_memory=as_bytes(_find(info, "used_memory")),
            kind=process_kind(_find(info, "type") or "C"),
        ))
    return tuple(result)


def _xml_memory(element) -> MemoryFields:
    """memory_total/used/free/reserved of a GPU's or a MIG device's ``<fb_memory_usage>``."""
    total, used, free, reserved = (as_bytes(_find(element, f"fb_memory_usage/{name}"))
                                   for name in ("total", "used", "free", "reserved"))
    return MemoryFields(memory_total=total, memory_used=used, memory_free=free, memory_reserved=reserved)


def _xml_mig_instance(position: int, device) -> MigInstance:
    recorded_index = as_int(_find(device, "index"))
    return MigInstance(
        index=position if recorded_index is None else recorded_index,
        gpu_instance_id=as_int(_find(device, "gpu_instance_id")),
        compute_instance_id=as_int(_find(device, "compute_instance_id")),
        multiprocessors=as_int(_find(device, "device_attributes/shared/multiprocessor_count")),
        **_xml_memory(device),
    )


def _xml_mig_instances(gpu) -> Optional[Tuple[MigInstance, ...]]:
    """The GPU's MIG instances from ``<mig_devices>``; None for a GPU without MIG on."""
    devices = gpu.find("mig_devices")
    if devices is None or as_enabled(_find(gpu, "mig_mode/current_mig")) is not True:
        return None
    return tuple(_xml_mig_instance(position, device)
                 for position, device in enumerate(devices.findall("mig_device")))


def _xml_gpu(index: int, gpu) -> GPU:
    power = "power_readings", "gpu_power_readings"
    reasons = gpu.find("clocks_event_reasons")
    if reasons is None:
        reasons = gpu.find("clocks_throttle_reasons")
    states = {} if reasons is None else {
        re.sub(r"^clocks_(event|throttle)_reason_", "", child.tag): as_text(child.text)
        for child in reasons}
    name = _find(gpu, "product_name") or UNKNOWN_NAME
    return GPU(
        index=index,
        name=name,
        compute_capability=known_compute_capability(name),
        mig_enabled=as_enabled(_find(gpu, "mig_mode/current_mig")),
        uuid=_find(gpu, "uuid"),
        bus_id=_find(gpu, "pci/pci_bus_id") or as_text(gpu.get("id")),
        **_xml_memory(gpu),
        utilization_gpu=as_float(_find(gpu, "utilization/gpu_util")),
        utilization_memory=as_float(_find(gpu, "utilization/memory_util")),
        temperature=as_float(_find(gpu, "temperature/gpu_temp")),
        power_draw=as_float(_find(gpu, *(f"{group}/{name}" for group in power for name in
                                          ("power_draw", "average_power_draw", "instant_power_draw")))),
        power_limit=as_float(_find(gpu, *(f"{group}/{name}" for group in power for name in
                                           ("enforced_power_limit", "current_power_limit", "power_limit")))),
        sm_clock=as_int(_find(gpu, "clocks/sm_clock")),
        sm_clock_max=as_int(_find(gpu, "max_clocks/sm_clock")),
        memory_clock=as_int(_find(gpu, "clocks/mem_clock")),
        memory_clock_max=as_int(_find(gpu, "max_clocks/mem_clock")),
        clock_event_reasons=event_reasons(states),
        performance_state=_find(gpu, "performance_state"),
        pcie_generation=as_int(_find(gpu, "pci/pci_gpu_link_info/pcie_gen/current_link_gen")),
        pcie_generation_max=as_int(_find(gpu, "pci/pci_gpu_link_info/pcie_gen/max_link_gen")),
        pcie_width=as_int(_find(gpu, "pci/pci_gpu_link_info/link_widths/current_link_width")),
        pcie_width_max=as_int(_find(gpu, "pci/pci_gpu_link_info/link_widths/max_link_width")),
        processes=_xml_processes(gpu),
        mig_instances=_xml_mig_instances(gpu),
    )


def sniff(text: str) -> bool:
    """Any text that starts with a tag is taken for XML (a wrong one is said to be wrong)."""
    return text.lstrip().startswith("<")


def read(text: str, label: str, fallback_time: float) -> Tuple[Snapshot, ...]:
    """The one time step of an ``nvidia-smi -q -x`` file."""
    try:
        root = ElementTree.fromstring(text.lstrip())  # no blank line may precede <?xml
    except ElementTree.ParseError as error:
        raise RecordingError(f"is not well-formed XML ({error})") from None
    if root.tag != "nvidia_smi_log":
        raise RecordingError(f"is XML but not from `nvidia-smi -q -x` (its root element is "
                             f"<{root.tag}>, not <nvidia_smi_log>)")
    recorded = _find(root, "timestamp")
    frame = Snapshot(
        source=label,
        recorded=True,
        gpus=tuple(_xml_gpu(index, gpu) for index, gpu in enumerate(root.findall("gpu"))),
        driver_version=_find(root, "driver_version"),
        cuda_driver_version=_find(root, "cuda_version"),
        timestamp=(recorded and epoch(recorded)) or fallback_time,
    )
    attached = as_int(_find(root, "attached_gpus"))
    if attached is not None and attached > len(frame.gpus):
        # `nvidia-smi -q -x -i 2` records one GPU of several, without its index
        frame = with_note(frame, f"holds {len(frame.gpus)} of the machine's {attached} GPUs, "
                                  f"numbered here from 0: the file does not say which")
    return (frame,)
