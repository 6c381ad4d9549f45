"""This machine's memory as Linux reports it, for the CPU runtime's figures: this process's
sizes, the machine's available memory and a container's (cgroup v2) limit. find_batch's CPU
gauge and the out-of-memory card read the same files the same way."""
from __future__ import annotations

from typing import Dict, Optional, Tuple

__all__ = ["cgroup_memory", "meminfo", "process_status", "ram_available"]


def _kilobyte_lines(path: str) -> Dict[str, int]:
    """The ``Name:  1234 kB`` lines of a /proc file, in bytes."""
    values = {}
    with open(path) as lines:
        for line in lines:
            name, _, rest = line.partition(":")
            if rest.strip().endswith("kB"):
                values[name] = int(rest.split()[0]) * 1024
    return values


def process_status() -> Dict[str, int]:
    """This process's /proc/self/status sizes (VmSize, VmPeak, VmRSS, VmHWM ...) in bytes."""
    return _kilobyte_lines("/proc/self/status")


def meminfo() -> Dict[str, int]:
    """/proc/meminfo (MemTotal, MemAvailable ...) in bytes."""
    return _kilobyte_lines("/proc/meminfo")


def cgroup_memory() -> Tuple[Optional[int], Optional[int]]:
    """A cgroup v2 memory limit (containers, Colab) and the bytes left under it; Nones where
    there is none or it cannot be read."""
    try:
        with open("/sys/fs/cgroup/memory.max") as limit, open("/sys/fs/cgroup/memory.current") as used:
            text = limit.read().strip()
            return (None, None) if text == "max" else (int(text), int(text) - int(used.read()))
    except (OSError, ValueError):
        return None, None


def ram_available() -> Optional[int]:
    """Bytes of memory this process can still take: what Linux counts as available (free and
    reclaimable), or less where the container's cgroup or an address-space limit (``ulimit
    -v``) leaves less; None where /proc cannot be read (not Linux)."""
    try:
        rooms = [meminfo()["MemAvailable"], cgroup_memory()[1]]
        import resource

        limit = resource.getrlimit(resource.RLIMIT_AS)[0]
        if limit != resource.RLIM_INFINITY:
            rooms.append(max(0, limit - process_status()["VmSize"]))
    except (OSError, KeyError, ValueError, ImportError):
        return None
    return max(0, min(room for room in rooms if room is not None))
