"""Which GPU is cuda:N on a box of different GPUs, asked of the CUDA driver in a child process.

CUDA numbers GPUs fastest first unless ``CUDA_DEVICE_ORDER=PCI_BUS_ID``, NVML in PCI bus
order, and nothing NVML reports says how CUDA ranks speed. Only the CUDA driver knows, and
asking it here would load ``libcuda`` into the user's process (and initialize it behind
their back). So a child process with the user's ``CUDA_VISIBLE_DEVICES`` and
``CUDA_DEVICE_ORDER`` asks the driver (ctypes, no torch) for each CUDA ordinal's PCI bus id
and UUID, and prints them; the parent matches them to NVML's GPUs. Any failure (no driver
library, a CUDA error, a slow ``cuInit``, garbage) leaves the numbering unknown, until CUDA starts in
this process or the library path changes (:func:`_conditions`).

Run as a script, this file is that child: it imports nothing but the standard library.
"""
from __future__ import annotations

import ctypes
import json
import os
import re
import subprocess
import sys
from typing import Dict, Optional, Sequence, Tuple

DRIVER_LIBRARY = "libcuda.so.1"
TIMEOUT = 5.0  # seconds for the whole child: cuInit alone takes seconds on a box without persistence mode
CUDA_SUCCESS = 0
CUDA_ERROR_NO_DEVICE = 100  # cuInit's answer when CUDA_VISIBLE_DEVICES hides every GPU

Device = Tuple[Optional[str], Optional[str]]  # one CUDA ordinal's (PCI bus id, UUID)


def driver_torch_indices(cuda_visible_devices: Optional[str], cuda_device_order: str,
                         gpus: Sequence) -> Optional[Dict[int, int]]:
    """NVML index -> torch index of this machine's ``gpus`` (NVML's records: ``index``,
    ``uuid``, ``bus_id``) as the CUDA driver numbers them under these settings, or None when
    the driver could not be asked or a device it lists is none of ``gpus``. Asked once per
    process and setting (``session.driver_answers``), a failure again when :func:`_conditions` change."""
    # here: the child runs this file alone, outside the package
    from .state import session

    key = (cuda_visible_devices, cuda_device_order, frozenset((gpu.uuid, gpu.bus_id) for gpu in gpus))
    with session.driver_asking:
        answers = session.driver_answers
        devices, failed_under = answers.get(key, (None, None))
        if key not in answers or (devices is None and failed_under != _conditions()):
            devices = ask_driver(cuda_visible_devices, cuda_device_order)
            answers[key] = devices, None if devices is not None else _conditions()
    return None if devices is None else match_devices(devices, gpus)


def _conditions() -> tuple:
    """What a failed answer is asked again after a change of: whether this process's CUDA has
    started since (it keeps the GPUs initialized, so a cuInit that took over :data:`TIMEOUT`
    then answers at once) and the library path the child finds ``libcuda.so.1`` on. Anything
    else fails the same way again, at up to :data:`TIMEOUT` a card."""
    from .runtime import cuda_torch  # here: the child runs this file alone, outside the package

    return cuda_torch() is not None, os.environ.get("LD_LIBRARY_PATH")


def ask_driver(cuda_visible_devices: Optional[str], cuda_device_order: str) -> Optional[Tuple[Device, ...]]:
    """Each CUDA ordinal's (PCI bus id, UUID), from a child process that asks the driver under
    these settings; None on any failure. Waits at most :data:`TIMEOUT`, then kills the child."""
    environ = dict(os.environ, CUDA_DEVICE_ORDER=cuda_device_order)
    environ.pop("CUDA_VISIBLE_DEVICES", None)
    if cuda_visible_devices is not None:
        environ["CUDA_VISIBLE_DEVICES"] = cuda_visible_devices
    try:  # -I -S: none of the user's PYTHON* variables, site-packages or .pth files run in the child
        child = subprocess.Popen([sys.executable, "-I", "-S", os.path.abspath(__file__)], env=environ,
                                 stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    except (OSError, ValueError):  # no usable sys.executable (an embedded interpreter)
        return None
    try:
        out, _ = child.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        return None
    finally:
        if child.returncode is None:  # timed out, or interrupted (Ctrl-C) while waiting
            child.kill()
            try:  # reap it; a child stuck inside the driver is left rather than waited for
                child.communicate(timeout=1)
            except subprocess.TimeoutExpired:
                pass
    return parse_devices(out) if child.returncode == 0 else None


def parse_devices(out: bytes) -> Optional[Tuple[Device, ...]]:
    """The child's printed list of [bus id, UUID] pairs, or None for anything else."""
    try:
        devices = json.loads(out)
    except ValueError:
        return None
    if not isinstance(devices, list) or not all(
            isinstance(device, list) and len(device) == 2 and any(device)
            and all(part is None or isinstance(part, str) for part in device) for device in devices):
        return None
    return tuple((bus_id, uuid) for bus_id, uuid in devices)


def match_devices(devices: Sequence[Device], gpus: Sequence) -> Optional[Dict[int, int]]:
    """NVML index -> CUDA ordinal, each device found among ``gpus`` by UUID or PCI bus id;
    None if one is not there or two are the same GPU (MIG instances share their GPU's bus)."""
    index_of: Dict[int, int] = {}
    for ordinal, (bus_id, uuid) in enumerate(devices):
        found = [gpu for gpu in gpus if uuid and gpu.uuid and gpu.uuid.lower() == uuid.lower()]
        if not found and bus_key(bus_id) is not None:
            found = [gpu for gpu in gpus if bus_key(gpu.bus_id) == bus_key(bus_id)]
        if len(found) != 1 or found[0].index in index_of:
            return None
        index_of[found[0].index] = ordinal
    return index_of


_BUS_ID = re.compile(r"([0-9a-fA-F]+):([0-9a-fA-F]+):([0-9a-fA-F]+)(?:\.([0-9a-fA-F]+))?")


def bus_key(bus_id: Optional[str]) -> Optional[Tuple[int, int, int, int]]:
    """(domain, bus, device, function) of a PCI bus id however it is written: NVML's
    "00000000:43:00.0", CUDA's "0000:43:00.0", either case, the function left out."""
    match = _BUS_ID.fullmatch((bus_id or "").strip())
    if match is None:
        return None
    domain, bus, device, function = match.groups()
    return int(domain, 16), int(bus, 16), int(device, 16), int(function or "0", 16)


# ----------------------------------------------------------------------------- the child


class DriverError(RuntimeError):
    """A CUDA driver call returned an error code."""


def _check(result: int, call: str) -> None:
    if result != CUDA_SUCCESS:
        raise DriverError(f"{call} returned CUDA error {result}")


def uuid_text(raw: bytes) -> str:
    """CUDA's 16 UUID bytes as NVML writes them: "GPU-12345678-aaaa-bbbb-cccc-0123456789ab"."""
    digits = raw.hex()
    return f"GPU-{digits[:8]}-{digits[8:12]}-{digits[12:16]}-{digits[16:20]}-{digits[20:32]}"


def driver_devices() -> Tuple[Device, ...]:
    """Each CUDA ordinal's (PCI bus id, UUID) as the driver numbers them under this process's
    CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER. Loads the driver library: child only."""
    driver = ctypes.CDLL(DRIVER_LIBRARY)
    result = driver.cuInit(0)
    if result == CUDA_ERROR_NO_DEVICE:
        return ()
    _check(result, "cuInit")
    count = ctypes.c_int()
    _check(driver.cuDeviceGetCount(ctypes.byref(count)), "cuDeviceGetCount")
    # _v2 (CUDA 11.4+) is what cuda.h calls cuDeviceGetUuid today; a whole GPU's UUID is the same
    get_uuid = getattr(driver, "cuDeviceGetUuid_v2", None) or getattr(driver, "cuDeviceGetUuid", None)
    devices = []
    for ordinal in range(count.value):
        device = ctypes.c_int()
        _check(driver.cuDeviceGet(ctypes.byref(device), ordinal), "cuDeviceGet")
        text = ctypes.create_string_buffer(64)
        found = driver.cuDeviceGetPCIBusId(text, len(text), device.value) == CUDA_SUCCESS
        bus_id = text.value.decode("ascii", "replace") if found else None
        raw = (ctypes.c_ubyte * 16)()
        uuid = uuid_text(bytes(raw)) if get_uuid is not None and get_uuid(raw, device.value) == CUDA_SUCCESS else None
        if bus_id is None and uuid is None:
            raise DriverError(f"cuda:{ordinal} has neither a PCI bus id nor a UUID")
        devices.append((bus_id, uuid))
    return tuple(devices)


def main() -> int:
    """Print the driver's devices as JSON; on any failure say why on stderr and exit 1."""
    try:
        devices = driver_devices()
    except Exception as error:  # no library, a missing entry point, a CUDA error
        print(f"{type(error).__name__}: {error}", file=sys.stderr)
        return 1
    print(json.dumps([list(device) for device in devices]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
