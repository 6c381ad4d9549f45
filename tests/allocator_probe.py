"""What the installed torch's allocator holds, read from the process's own libc10.

torch 2.13 reports its last settings string with torch._C._accelerator_getAllocatorSettings,
which returns c10::CachingAllocator::getAllocatorSettings(); torch 2.11 (Colab's) has the setter
but no such getter, and its CUDA memory snapshot, which reports the same string, needs a GPU.
A small library built against the installed headers calls that c10 function in this process, so
a test checks torch's real state under every torch. Importable by a subprocess or a kernel too.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import importlib.util
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

SETTINGS_PROBE = r"""
#include <c10/core/AllocatorConfig.h>
#include <string>
extern "C" const char* allocator_settings() {
  static std::string held;
  held = c10::CachingAllocator::getAllocatorSettings();
  return held.c_str();
}
"""


def torch_package() -> Path:
    return Path(importlib.util.find_spec("torch").origin).parent


def build_against_torch(source: str, output: Path, *flags: str) -> Path:
    """Compile C++ ``source`` against the installed torch's headers and libc10 into ``output``."""
    package = torch_package()
    compiler = shutil.which("g++")
    assert compiler, "g++ builds the probes of torch's allocator: install it"
    code = output.with_suffix(".cpp")
    code.write_text(source)
    subprocess.run([compiler, "-std=c++17", *flags, "-I", str(package / "include"), "-o", str(output),
                    str(code), "-L", str(package / "lib"), "-lc10", f"-Wl,-rpath,{package / 'lib'}"],
                   check=True, timeout=300)
    return output


@functools.lru_cache(maxsize=None)
def _settings_reader():
    """The probe, built once per torch (kept in the temporary directory across processes)."""
    tag = hashlib.sha1(f"{torch_package()}{SETTINGS_PROBE}".encode()).hexdigest()[:12]
    library = Path(tempfile.gettempdir(), f"colab_gpu_allocator_probe_{tag}.so")
    if not library.exists():
        building = Path(tempfile.mkdtemp())
        os.replace(build_against_torch(SETTINGS_PROBE, building / "probe.so", "-shared", "-fPIC"), library)
    reader = ctypes.CDLL(str(library)).allocator_settings
    reader.restype = ctypes.c_char_p
    return reader


def torch_holds(torch) -> str:
    """The last settings string the imported ``torch`` parsed: its getter where it has one, else
    the same c10 function read through the probe. Like the getter, a first call makes torch read
    the variables."""
    getter = getattr(torch._C, "_accelerator_getAllocatorSettings", None)
    return getter() if getter is not None else _settings_reader()().decode()
