"""The rows of a GPU on the %gpu_status card, worded once for the text and the HTML card."""
from __future__ import annotations

from typing import List, Optional, Tuple

from ..devices import invalid_readings
from . import (NA, allocator_summary, breakdown_summary, celsius, mig_instance_summary, number, pcie_link, power,
               ratio, size, unrecorded_rows, words)

# The GPU fields each row shows ("memory": the whole reading, noted as one), for its invalid readings
_ROW_FIELDS = {"memory": ("memory",), "busy": ("utilization_gpu", "utilization_memory"),
               "power": ("power_draw", "power_limit", "temperature"),
               "clocks": ("sm_clock", "sm_clock_max", "memory_clock", "memory_clock_max"),
               "PCIe": ("pcie_generation", "pcie_generation_max", "pcie_width", "pcie_width_max"),
               "processes": ("processes",)}


def with_invalid(value: Optional[str], notes: List[str]) -> Optional[str]:
    """A row's value followed by what was read impossibly there (and is n/a in the value), so
    a broken reading says so instead of showing as unknown or as "999999% full"."""
    if not notes:
        return value
    said = f"invalid reading: {'; '.join(notes)}"
    return f"{NA} ({said})" if value is None else f"{value} ({said})"


def gpu_rows(status, gpu) -> List[Tuple[str, Optional[str]]]:
    """A GPU's rows as (label, value text), in the card's order, the rows a recording lacks left
    out (:func:`unrecorded_rows`), unless they read impossibly: text.py lays them out in columns,
    html.py escapes them and adds its bars. A listed "processes" row's value is None: each renderer
    lays the list out its own way (columns in a terminal, the whole command line on hover in HTML)."""
    invalid = {label: invalid_readings(gpu, fields) for label, fields in _ROW_FIELDS.items()}
    rows = [
        ("memory", None if invalid["memory"] else  # all of it n/a: which number was wrong is unknown
         f"{size(gpu.memory_used)} used / {size(gpu.memory_total)}, {size(gpu.memory_free)} free, "
         f"{size(gpu.memory_reserved)} reserved by the driver"),
        ("busy", f"{number(gpu.utilization_gpu, '%')} compute, {number(gpu.utilization_memory, '%')} memory bus"),
        ("power", f"{power(gpu.power_draw, gpu.power_limit)}, temperature {celsius(gpu.temperature)}, "
                  f"state {gpu.performance_state or NA}"),
        ("clocks", f"SM {ratio(gpu.sm_clock, gpu.sm_clock_max, 'MHz')}, memory "
                   f"{ratio(gpu.memory_clock, gpu.memory_clock_max, 'MHz')}; "
                   f"slowed by {words(gpu.clock_event_reasons)}"),
        ("PCIe", f"{pcie_link(gpu)}; bus {gpu.bus_id or NA}"),
        ("uuid", gpu.uuid or NA),  # what CUDA_VISIBLE_DEVICES=GPU-... takes
        ("processes", None if gpu.processes else NA if gpu.processes is None else "none visible"),
    ]
    left_out = unrecorded_rows(status.snapshot, gpu) - {label for label, notes in invalid.items() if notes}
    rows = [(label, value if label == "processes" else with_invalid(value, invalid.get(label, [])))
            for label, value in rows if label not in left_out]
    if invalid["processes"]:  # under the list of processes, which lacks them
        rows.append(("invalid", "; ".join(invalid["processes"])))
    rows += [(f"MIG {mig.index}", with_invalid(mig_instance_summary(status, gpu, mig),
                                               [what for _, what in mig.invalid]))
             for mig in gpu.mig_instances or ()]
    memory, part = status.torch_memory_of(gpu.index), status.breakdown_of(gpu.index)
    if memory:
        rows.append(("torch", allocator_summary(memory)))
    if part:
        rows.append(("where", breakdown_summary(part)))
    return rows
