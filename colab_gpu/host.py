"""This machine's memory as Linux reports it, for the CPU runtime's figures: this process's
sizes, the machine's available memory and a container's (cgroup v2) limit. find_batch's CPU
gauge and the out-of-memory card read the same files the same way. And the CPU time this
process and its workers used, and the cores it may use (the live monitor's per-cell load,
%tune_loader's worker counts)."""
from __future__ import annotations

import math
import os
from typing import Dict, Optional, Tuple

__all__ = ["cgroup_memory", "meminfo", "process_cpu", "process_status", "ram_available", "usable_cores"]


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


def process_cpu() -> Tuple[float, Optional[float], Optional[float]]:
    """(CPU seconds this process used; with its child processes' (DataLoader workers): those
    ended and waited for, and those still running; the seconds its main thread ran or waited
    in the run queue for a core: on a machine shared with busier processes a thread that
    never stops computing may run only half the time, and still is the bound). The last two
    are None where /proc cannot tell (not Linux). All only grow: the difference of two
    readings is what was spent between them, by a worker started or ended meanwhile too."""
    times = os.times()
    own = times.user + times.system
    tree = own + times.children_user + times.children_system
    try:
        with open("/proc/self/schedstat") as stat:  # the main thread's: ran, waited (ns), slices
            ran, waited = (int(value) for value in stat.read().split()[:2])
        wanted: Optional[float] = (ran + waited) / 1e9
    except (OSError, ValueError):
        wanted = None
    try:
        tick = os.sysconf("SC_CLK_TCK")
        children = []
        for thread in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{thread}/children") as listed:
                children += listed.read().split()
    except (OSError, ValueError, AttributeError):
        return own, None, wanted
    for child in children:
        try:
            with open(f"/proc/{child}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()  # after the command's name, which may hold spaces
        except OSError:  # ended since it was listed: its time is in children_* once waited for
            continue
        tree += sum(int(value) for value in fields[11:15]) / tick  # utime, stime, and its own children's
    return own, tree, wanted


def _cgroup_cores(root: str = "/sys/fs/cgroup") -> Optional[float]:
    """The CPU quota of this container in cores (Docker's --cpus), None where there is none.
    cgroup v2's cpu.max reads "max 100000" or "200000 100000"; v1 has the two in two files."""
    try:
        with open(os.path.join(root, "cpu.max")) as file:
            quota, period = file.read().split()[:2]
        if quota == "max":
            return None
        return int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        with open(os.path.join(root, "cpu", "cpu.cfs_quota_us")) as file:
            quota_us = int(file.read())
        with open(os.path.join(root, "cpu", "cpu.cfs_period_us")) as file:
            period_us = int(file.read())
    except (OSError, ValueError):
        return None
    return quota_us / period_us if quota_us > 0 and period_us > 0 else None


def usable_cores(cgroup_root: str = "/sys/fs/cgroup") -> Tuple[int, str]:
    """The cores this process may run on, and how that was read: its CPU affinity (a Colab
    runtime's 2), lowered by a container's CPU quota, which the affinity does not show."""
    try:
        cores, how = len(os.sched_getaffinity(0)), "CPU affinity"
    except AttributeError:  # macOS, Windows
        cores, how = os.cpu_count() or 1, "os.cpu_count()"
    quota = _cgroup_cores(cgroup_root)
    if quota is not None and math.ceil(quota) < cores:
        cores, how = max(1, math.ceil(quota)), f"container CPU quota of {quota:g} core{'s' if quota != 1 else ''}"
    return cores, how
