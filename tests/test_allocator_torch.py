"""%alloc_conf against the real torch (2.13.0+cpu in CI, 2.11.0 on Colab): its parser, its setter,
a real kernel. What torch holds is read with its getter, or where it has none (2.11) from its
libc10 through tests/allocator_probe.py.

This file imports torch into the test process (the "torch imported, CUDA not initialized"
state is the natural one on a CPU build), so it sorts after test_allocator.py, whose tests
need a process without torch.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from IPython.core.error import UsageError

from allocator_probe import build_against_torch, torch_holds, torch_package
from colab_gpu.allocator import (AllocConfError, alloc_conf, installed_torch_version, parse, roundup_table,
                                 to_torch, validate)
from colab_gpu.runtime import TorchState
from colab_gpu.torch_allocator.parse import version_of
from colab_gpu.torch_allocator.schema import KEYS
from conftest import ROOT

INSTALLED = version_of(installed_torch_version())
# The keys the CPU build's parser checks (AcceleratorAllocatorConfig); it lets others through.
CHECKED_KEYS = [key.name for key in KEYS if key.general and key.available(INSTALLED)]
# for a subprocess that reads torch's state with allocator_probe
PROBE_PATH = os.pathsep.join([str(ROOT), str(ROOT / "tests")])

# One torch process judges a whole batch; the settings torch keeps between calls (e.g.
# large_segment_size_mb) are put back to their defaults before each string.
JUDGE = r"""
import json, sys, warnings
warnings.simplefilter("ignore")
import torch
setter = torch._C._accelerator_setAllocatorSettings
BASELINE = "large_segment_size_mb:20,expandable_segments:False,pinned_use_background_threads:False"
verdicts = []
for text in json.load(sys.stdin):
    setter(BASELINE)
    try:
        setter(text)
        verdicts.append(None)
    except Exception as error:
        verdicts.append(f"{type(error).__name__}: {str(error).splitlines()[0]}")
print(json.dumps(verdicts))
"""


def as_text(shell, line):
    """%alloc_conf LINE as a terminal shows it (GPUMagics.output = 'text'), then back to auto."""
    shell.run_line_magic("config", "GPUMagics.output = 'text'")
    try:
        shell.run_line_magic("alloc_conf", line)
    finally:
        shell.run_line_magic("config", "GPUMagics.output = 'auto'")


def torch_verdicts(texts):
    """None (accepted) or the error, per string, from torch's own parser in a subprocess."""
    done = subprocess.run([sys.executable, "-c", JUDGE], input=json.dumps(texts), text=True,
                          capture_output=True, timeout=120, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


VALUES = st.one_of(
    st.sampled_from(["0", "1", "2", "3", "4", "10", "11", "19", "20", "21", "40", "128", "0.5",
                     "1.0", "1.5", ".5", "0.", "1e-1", "nan", "True", "False", "true", "abc",
                     "-5", "128abc", "99999999999999999999999", "[256:1,512:2,>:4]", "[3:1]",
                     "[256:3]", "[>:0]", "[1:4,]", "[256:1", "", " 7 "]),
    st.integers(0, 5000).map(str),
    st.floats(0, 2, allow_nan=False).map(lambda f: f"{f:.3f}"),
)
SETTING = st.tuples(st.sampled_from(CHECKED_KEYS), VALUES).map(lambda kv: f"{kv[0]}:{kv[1]}")
CONFIG = st.tuples(st.lists(SETTING, min_size=1, max_size=4),
                   st.sampled_from([",", ", ", " ,"]), st.sampled_from(["", ","])
                   ).map(lambda parts: parts[1].join(parts[0]) + parts[2])


def ours(text):
    try:
        return to_torch(validate(parse(text), INSTALLED))
    except AllocConfError:
        return None


# Fixed strings with known outcomes, so the comparison is shown not to be trivial.
KNOWN = {"max_split_size_mb:128,expandable_segments:True": True, "max_split_size_mb:19": False,
         "roundup_power2_divisions:[256:1,512:2,>:4]": True, "garbage_collection_threshold:1.5": False,
         "expandable_segments:true": False, "large_segment_size_mb:11": True,
         "max_split_size_mb:15,large_segment_size_mb:12": True, "max_split_size_mb:15": False}


@settings(max_examples=3, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(CONFIG, min_size=100, max_size=100, unique=True))
def test_check_accepts_only_what_torchs_parser_accepts(texts):
    """One torch subprocess per example judges 100 generated strings, our rewrites of those we accept, and
    the known strings: every string torch rejects (for the keys it checks), --check rejects."""
    accepted = {text: ours(text) for text in texts if ours(text) is not None}
    batch = texts + list(accepted.values()) + list(KNOWN)
    verdicts = dict(zip(batch, torch_verdicts(batch)))
    wrongly_accepted = {text: verdicts[text] for text in accepted if verdicts[text] is not None}
    assert not wrongly_accepted
    assert all(verdicts[canonical] is None for canonical in accepted.values())
    assert {text: verdicts[text] is None for text in KNOWN} == KNOWN == \
        {text: ours(text) is not None for text in KNOWN}
    assert 0 < len(accepted) < len(texts)  # both outcomes are exercised


# The table torch's allocator rounds with, read back from C++ after each settings string
# (no Python binding shows it): the installed libc10 and its headers.
TABLE_PROBE = r"""
#include <c10/core/AllocatorConfig.h>
#include <iostream>
int main(int argc, char** argv) {
  using c10::CachingAllocator::AcceleratorAllocatorConfig;
  for (int i = 1; i < argc; i++) {
    c10::CachingAllocator::setAllocatorSettings(argv[i]);
    for (size_t divisions : AcceleratorAllocatorConfig::roundup_power2_divisions())
      std::cout << divisions << " ";
    std::cout << "\n";
  }
}
"""


def test_roundup_table_is_the_table_the_installed_torch_builds(tmp_path):
    """%clear_cache's "the rest" counts each GPU storage at the block torch makes of it, by the
    roundup_power2_divisions table: the one the installed torch builds, '>' included."""
    package = torch_package()
    build_against_torch(TABLE_PROBE, tmp_path / "probe")
    values = ["4", "[256:1,512:2,>:8]", "[>:4]", "[>:4,256:1]", "[256:1]", "[1:2,65536:8]",
              "[128:4,256:0,>:2]", "[64:8,128:2,256:4,512:2,1024:4,>:1]"]
    done = subprocess.run([str(tmp_path / "probe")] + [f"roundup_power2_divisions:{value}" for value in values],
                          capture_output=True, text=True, check=True, timeout=60)
    built = [[int(n) for n in line.split()] for line in done.stdout.splitlines()]
    version = version_of((package / "version.py").read_text().split("__version__ = ")[1][1:])
    assert [roundup_table(value, version) for value in values] == built
    assert built[1] == [1] * 9 + [2] + [8] * 6  # not the test's own echo


# --- torch imported, CUDA not initialized: the real setter ----------------------------------

@pytest.fixture
def torch_env(clean_env, tmp_path):
    torch = pytest.importorskip("torch")
    assert not torch.cuda.is_initialized()
    clean_env.setenv("COLAB_GPU_CONFIG_DIR", str(tmp_path))
    yield torch
    torch._C._accelerator_setAllocatorSettings("large_segment_size_mb:20")


def has_getter(torch) -> bool:
    """torch reports its settings (torch._C._accelerator_getAllocatorSettings; 2.13 does, 2.11 not):
    only then does %alloc_conf hand them to torch's setter before CUDA starts, since without a
    report nothing could be put back if torch refused them."""
    return hasattr(torch._C, "_accelerator_getAllocatorSettings")


# torch's first read of the variables, in a fresh process
FRESH_READ = "import torch, allocator_probe; print(allocator_probe.torch_holds(torch))"


def torch_takes(torch) -> str:
    """What torch runs with once CUDA starts, as things stand: what it holds where %alloc_conf
    handed it the setting (a torch with a getter, or CUDA running); else (2.11 before CUDA starts)
    what it reads from the variables at its first read, as a fresh process given them reads it."""
    if has_getter(torch) or torch.cuda.is_initialized():
        return torch_holds(torch)
    done = subprocess.run([sys.executable, "-c", FRESH_READ], text=True, capture_output=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=PROBE_PATH), check=True)
    return done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""


def test_cuda_keys_of_the_installed_torch_match_the_schema():
    """The CUDA-only keys CUDAAllocatorConfig::getKeys() lists in the installed headers (the
    CPU wheel ships them) are exactly the schema's CUDA-only keys for that version."""
    package = torch_package()
    header = (package / "include/c10/cuda/CUDAAllocatorConfig.h").read_text()
    block = re.search(r"getKeys\(\) \{(.*?)\};", header, re.S).group(1)
    block = re.sub(r"//[^\n]*", "", block)
    literals = re.sub(r'"\s*"', "", block)  # "release_lock_on_cud" "amalloc" is one name
    listed = {name for name in re.findall(r'"(\w+)"', literals) if "hip" not in name}
    version = version_of((package / "version.py").read_text().split("__version__ = ")[1][1:])
    expected = {key.name for key in KEYS if not key.general and key.available(version)}
    assert listed == expected


def test_imported_state_writes_env_and_torchs_setter(shell, torch_env):
    shell.run_line_magic("alloc_conf", "max_split_size_mb=256 expandable_segments=True --json")
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:256,expandable_segments:True"
    assert torch_takes(torch_env) == "max_split_size_mb:256,expandable_segments:True"


def test_backend_is_refused_once_torch_is_imported(shell, torch_env):
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    before = {name: value.encode() for name, value in os.environ.items()}
    with pytest.raises(UsageError, match="backend cannot change now: torch is already imported"):
        shell.run_line_magic("alloc_conf", "backend=cudaMallocAsync")
    assert {name: value.encode() for name, value in os.environ.items()} == before


def test_backend_saved_after_import_stays_out_of_the_live_environment(shell, torch_env, capsys):
    """torch asserts at CUDA start when the environment names another backend than the one
    it loaded with (c10/cuda/CUDAAllocatorConfig.cpp, pytorch#104801): --save keeps it for
    after a restart only."""
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    as_text(shell, "backend=cudaMallocAsync --save")
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == os.environ["PYTORCH_ALLOC_CONF"] == \
        "expandable_segments:True"
    saved = Path(os.environ["COLAB_GPU_CONFIG_DIR"], "alloc_conf.txt").read_text()
    assert saved == "expandable_segments:True,backend:cudaMallocAsync\n"
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "Allocator configuration changed: expandable_segments:True"
    assert "backend: backend is chosen when torch is imported\n    kept out of this process's " \
        "environment\n" in out


def test_torch_refusing_restores_env_and_torchs_settings(torch_env, monkeypatch):
    """torch keeps large_segment_size_mb between calls; set behind our back, it makes torch
    refuse a string we validated. Everything must come back as it was. A torch without a getter
    (2.11) is handed settings only once CUDA runs, and there it was left holding the refused
    string: it is asked through the CUDA memory snapshot, which reports it."""
    torch_env._C._accelerator_setAllocatorSettings("large_segment_size_mb:40")
    os.environ["PYTORCH_ALLOC_CONF"] = "expandable_segments:True"
    if not has_getter(torch_env):
        cuda_started(torch_env, monkeypatch)  # torch parses expandable_segments:True and keeps the 40
    held = torch_holds(torch_env)
    before = {name: value.encode() for name, value in os.environ.items()}
    with pytest.raises(AllocConfError, match="torch refused .*must be >= 40; nothing was changed"):
        alloc_conf(["max_split_size_mb=30"])
    assert {name: value.encode() for name, value in os.environ.items()} == before
    assert torch_holds(torch_env) == held
    saved = Path(os.environ["COLAB_GPU_CONFIG_DIR"], "alloc_conf.txt")  # --save keeps the saved file too
    for kept in ("expandable_segments:True\n", None):
        if kept is None:
            saved.unlink()
        else:
            saved.write_text(kept)
        with pytest.raises(AllocConfError, match="nothing was changed"):
            alloc_conf(["max_split_size_mb=30"], save=True)
        assert (saved.read_text() if saved.exists() else None) == kept


# A fresh process: torch reads the variable once, at its first settings call, and this one has
# already made it.
FIRST_READ = r"""
import json, os, sys
from IPython.testing.globalipapp import start_ipython
shell = start_ipython()
shell.run_line_magic("load_ext", "colab_gpu")
import torch
from allocator_probe import torch_holds
shell.run_line_magic("env", "PYTORCH_CUDA_ALLOC_CONF=" + sys.argv[1])
try:
    shell.run_line_magic("alloc_conf", sys.argv[2] + " --json")
    error = None
except Exception as caught:
    error = f"{type(caught).__name__}: {caught}"
print(json.dumps([error, os.environ.get("PYTORCH_CUDA_ALLOC_CONF"), torch_holds(torch),
                  hasattr(torch._C, "_accelerator_getAllocatorSettings")]))
"""


@pytest.mark.parametrize("held, line, env, in_torch", [
    ("expandable_segments:true", "--reset", None, "expandable_segments:False"),
    ("expandable_segments:true", "expandable_segments=True", "expandable_segments:True",
     "expandable_segments:True"),
    ("expandable_segments=True", "max_split_size_mb=128", "expandable_segments:True,max_split_size_mb:128",
     "expandable_segments:True,max_split_size_mb:128"),
])
def test_the_fix_for_a_refused_variable_works_after_import_torch(tmp_path, held, line, env, in_torch):
    """Set with %env before torch's first read, a value torch refuses made the fix the report
    names (--reset, KEY=VALUE) raise torch's own error out of the magic, changing nothing.
    A torch without a getter (2.11) is handed only the variables, which it reads at its first
    read: the fixed variable, or its defaults ("") where --reset cleared it."""
    done = subprocess.run([sys.executable, "-c", FIRST_READ, held, line], text=True, capture_output=True,
                          timeout=120, env=dict(os.environ, PYTHONPATH=PROBE_PATH,
                                                COLAB_GPU_CONFIG_DIR=str(tmp_path)))
    assert done.returncode == 0, done.stderr
    error, variable, took, getter = json.loads(done.stdout.strip().splitlines()[-1])
    assert [error, variable, took] == [None, env, in_torch if getter else env or ""]


def test_an_unset_key_goes_back_to_its_default_in_torch_too(shell, torch_env):
    """torch's parser resets only max_split_size_mb, roundup_power2_divisions,
    garbage_collection_threshold and (2.11+) max_non_split_rounding_mb per string: a key
    merely left out keeps its value. A torch without a getter (2.11) is handed only the
    variables before CUDA starts, which hold nothing of the unset keys: nothing to warn of."""
    shell.run_line_magic("alloc_conf", "large_segment_size_mb=64 pinned_reserve_segment_size_mb=8 --json")
    result = alloc_conf(unset=["large_segment_size_mb", "pinned_reserve_segment_size_mb"])
    assert "PYTORCH_CUDA_ALLOC_CONF" not in os.environ
    kept = ("pinned_reserve_segment_size_mb keeps its last value in this process: torch keeps a key until "
            "a settings string names it, and its default cannot be written; restart the runtime to drop it",)
    assert result.warnings == (kept if has_getter(torch_env) else ())
    shell.run_line_magic("alloc_conf", "max_split_size_mb=30 --json")  # >= 64 only while 64 held
    assert torch_takes(torch_env) == "max_split_size_mb:30"


@pytest.mark.parametrize("version, already", [("2.9.1+cu128", False), ("2.10.0+cu128", True)])
def test_the_fragmentation_tip_reads_pytorch_alloc_conf_only_where_torch_reads_it(torch_env, monkeypatch,
                                                                                  version, already):
    """A CUDA torch 2.9 never reads PYTORCH_ALLOC_CONF (pytorch#183387): with
    expandable_segments:True there alone, the tip said "already on" and sent the user to
    %clear_cache instead of telling how to turn it on."""
    from test_advice import T4, fired, make_status, memory

    from colab_gpu.devices import GiB

    monkeypatch.setattr(torch_env, "__version__", version)
    monkeypatch.setenv("PYTORCH_ALLOC_CONF", "expandable_segments:True")
    fragmented = [memory(allocated=2 * GiB, reserved=6 * GiB, num_alloc_retries=3)]
    tip = fired(make_status([T4], platform="colab", memory=fragmented))["fragmentation"]
    assert ("expandable_segments already on (PYTORCH_ALLOC_CONF)" in tip) == already
    assert ("after a runtime restart run %alloc_conf expandable_segments=True" in tip) != already


def cuda_started(torch, monkeypatch=None) -> TorchState:
    """The state once CUDA has started, and what its start does to torch: it parses the
    variables (this CPU build cannot start CUDA, and read them long ago, in an earlier test).
    With ``monkeypatch``, torch.cuda.is_initialized says so too, for the magic to read, and the
    CUDA memory snapshot (the device's allocator, absent here) reports the settings string torch
    holds, as a CUDA build's does: a torch without a getter (2.11) is asked through it."""
    torch._C._accelerator_setAllocatorSettings(
        os.environ.get("PYTORCH_CUDA_ALLOC_CONF", os.environ.get("PYTORCH_ALLOC_CONF", "")))
    if monkeypatch is not None:
        monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
        monkeypatch.setattr(torch._C, "_cuda_memorySnapshot", lambda *options: {
            "segments": [], "device_traces": [],
            "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": torch_holds(torch)}}, raising=False)
    return TorchState(imported=True, version=torch.__version__, cuda_version="12.8",
                      cuda_initialized=True)


def test_cuda_initialized_applies_runtime_keys_and_defers_the_rest(torch_env, monkeypatch):
    """The CUDA-started branch, with the state passed in and torch's real setter called."""
    started = cuda_started(torch_env, monkeypatch)
    result = alloc_conf(["max_split_size_mb=128 per_process_memory_fraction=0.5"], state=started)
    assert result.deferred == (("per_process_memory_fraction", dict(
        (k.name, k.runtime_reason) for k in KEYS)["per_process_memory_fraction"]),)
    assert result.applied_via == ("environment", "torch._C._accelerator_setAllocatorSettings")
    assert result.in_effect == "max_split_size_mb:128"
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:128"  # as in effect
    from IPython.lib.pretty import pretty

    assert "add save=True to apply them when the extension loads after a restart" in " ".join(pretty(result).split())
    saved = alloc_conf(["backend=cudaMallocAsync"], state=started, save=True)
    assert ("backend", "backend is chosen when torch is imported") in saved.deferred
    assert saved.saved.endswith("backend:cudaMallocAsync")


def test_the_magic_once_cuda_started_says_what_waits_for_a_restart(shell, torch_env, monkeypatch, capsys):
    """The same branch reached the way a user does: the magic reads torch's state itself, and
    the CUDA device (absent here) is faked only at torch.cuda.is_initialized."""
    cuda_started(torch_env, monkeypatch)
    as_text(shell, "max_split_size_mb=128 per_process_memory_fraction=0.5")
    out = capsys.readouterr().out
    assert "CUDA initialized" in out and "could not change now:\n    per_process_memory_fraction: " in out
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:128"
    assert torch_holds(torch_env) == "max_split_size_mb:128"


def test_reload_ext_keeps_the_setting_made_since_the_first_load(ipython, torch_env, capsys):
    """Save 128, set 256 without saving, %reload_ext colab_gpu: the reload applied the saved
    setting again ("applied the saved allocator setting ...; now 'max_split_size_mb:128'") and
    the 256 was gone. The saved setting is for the first load after a start, once."""
    ipython.run_line_magic("load_ext", "colab_gpu")
    try:
        as_text(ipython, "max_split_size_mb=128 --save")
        as_text(ipython, "max_split_size_mb=256")
        capsys.readouterr()
        ipython.run_line_magic("reload_ext", "colab_gpu")
        assert capsys.readouterr().out == (
            "colab_gpu: saved allocator setting 'max_split_size_mb:128' not re-applied: it applies at "
            "the extension's first load in a process, not at a reload; %alloc_conf shows what runs "
            "(%alloc_conf --forget removes it)\n")
        ipython.run_line_magic("unload_ext", "colab_gpu")
        ipython.run_line_magic("load_ext", "colab_gpu")
        assert "not re-applied" in capsys.readouterr().out
        assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:256"
        assert torch_takes(torch_env) == "max_split_size_mb:256"
        as_text(ipython, "max_split_size_mb=128")  # the saved setting again: a reload says so
        capsys.readouterr()
        ipython.run_line_magic("reload_ext", "colab_gpu")
        assert "is already in this process's setting" in capsys.readouterr().out
    finally:
        ipython.run_line_magic("unload_ext", "colab_gpu")


def test_a_kernel_started_from_a_loading_process_applies_the_saved_setting(ipython, torch_env, capsys):
    """A kernel started from a notebook that loaded the extension inherits its environment,
    the mark of that first load included: its own first load still applies the saved setting."""
    Path(os.environ["COLAB_GPU_CONFIG_DIR"], "alloc_conf.txt").write_text("max_split_size_mb:128\n")
    os.environ["COLAB_GPU_SAVED_APPLIED"] = str(os.getppid())  # as the parent process left it
    ipython.run_line_magic("load_ext", "colab_gpu")
    try:
        assert "applied the saved allocator setting 'max_split_size_mb:128'" in capsys.readouterr().out
        assert torch_takes(torch_env) == "max_split_size_mb:128"
    finally:
        ipython.run_line_magic("unload_ext", "colab_gpu")


def test_a_refused_saved_setting_says_so_at_reload_once_cuda_runs(ipython, torch_env, monkeypatch, capsys):
    """A saved setting the installed torch refuses (edited by hand, saved under another torch):
    %reload_ext once CUDA ran said "not applied: CUDA is already running; restart the runtime",
    and after the restart the load failed again, with the real error. The reload says what the
    first load said."""
    Path(os.environ["COLAB_GPU_CONFIG_DIR"], "alloc_conf.txt").write_text("max_split_size_mb:19\n")
    with pytest.raises(ValueError, match="max_split_size_mb too small"):  # the installed torch's own parser refuses it
        torch_env._C._accelerator_setAllocatorSettings("max_split_size_mb:19")
    ipython.run_line_magic("load_ext", "colab_gpu")
    try:
        first = capsys.readouterr().out
        assert "not applied: max_split_size_mb=19 is out of range: must be >= 20" in first
        cuda_started(torch_env, monkeypatch)
        ipython.run_line_magic("reload_ext", "colab_gpu")
        assert capsys.readouterr().out == first
    finally:
        ipython.run_line_magic("unload_ext", "colab_gpu")


# --- a real Jupyter kernel ------------------------------------------------------------------

@pytest.mark.kernel
def test_kernel_applies_saved_and_new_settings_before_torch_reads_them(tmp_path):
    nbformat = pytest.importorskip("nbformat")
    from nbclient import NotebookClient

    (tmp_path / "alloc_conf.txt").write_text("expandable_segments:True\n")
    cells = ["%load_ext colab_gpu",
             "%alloc_conf max_split_size_mb=256",
             "import torch, allocator_probe\nprint(allocator_probe.torch_holds(torch))"]
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    env = {name: value for name, value in os.environ.items() if not name.startswith("PYTORCH_")}
    env.update(PYTHONPATH=PROBE_PATH, COLAB_GPU_CONFIG_DIR=str(tmp_path))
    NotebookClient(notebook, timeout=120, kernel_name="python3").execute(env=env)
    loaded = "".join(o.get("text", "") for o in notebook.cells[0].outputs)
    assert "applied the saved allocator setting 'expandable_segments:True'" in loaded
    final = "".join(o.get("text", "") for o in notebook.cells[2].outputs)
    assert final.strip() == "expandable_segments:True,max_split_size_mb:256"


def test_naming_the_backend_torch_loaded_is_no_change_after_import(shell, torch_env):
    """torch loaded its default, native: saying so (a usual template line) is not a change."""
    shell.run_line_magic("alloc_conf", "backend:native,expandable_segments:True --json")
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "backend:native,expandable_segments:True"
    shell.run_line_magic("alloc_conf", "--unset backend --json")
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    with pytest.raises(UsageError, match="backend cannot change now"):
        shell.run_line_magic("alloc_conf", "backend=cudaMallocAsync")


def test_a_hand_edit_after_torchs_setter_is_shown_as_not_in_effect(shell, torch_env, capsys):
    """torch 2.10+ reads the variables once, at its first settings call (AcceleratorAllocatorConfig
    and CUDAAllocatorConfig::instance()); after %alloc_conf called the setter, an edit by hand
    changes nothing, yet the report showed the edited variable as the configuration. A torch
    without a getter (2.11) is handed nothing before CUDA starts and reads the variables then:
    there the edit takes effect, and is shown as the configuration."""
    shell.run_line_magic("alloc_conf", "max_split_size_mb=128 --json")
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    shown = alloc_conf()
    if not has_getter(torch_env):
        assert to_torch(shown.settings) == torch_takes(torch_env) == "expandable_segments:True"
        assert not any("set by hand" in warning for warning in shown.warnings)
        return
    assert torch_holds(torch_env) == "max_split_size_mb:128"
    assert to_torch(shown.settings) == "max_split_size_mb:128"
    assert shown.warnings == (
        "PYTORCH_CUDA_ALLOC_CONF holds 'expandable_segments:True', set by hand after torch read its "
        "settings (when %alloc_conf applied them through its run-time setter): torch does not read the "
        "variables again, so this edit does not take effect; torch uses 'max_split_size_mb:128', shown "
        "here; change settings with colab_gpu.alloc_conf('KEY=VALUE')",)
    capsys.readouterr()
    as_text(shell, "")
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "Allocator configuration: max_split_size_mb:128"
    assert "change settings with %alloc_conf KEY=VALUE" in " ".join(out.split())
    # a change starts from what torch holds, and the variables follow it again
    changed = alloc_conf(["garbage_collection_threshold=0.5"])
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == os.environ["PYTORCH_ALLOC_CONF"] == \
        torch_holds(torch_env) == \
        "max_split_size_mb:128,garbage_collection_threshold:0.5"
    assert any("which never took effect" in warning for warning in changed.warnings)
    assert not any("set by hand" in warning for warning in alloc_conf().warnings)


def test_a_split_size_below_the_segment_size_torch_keeps_waits_for_the_restart(torch_env, monkeypatch):
    """Once CUDA runs, large_segment_size_mb waits for a restart and torch checks a new
    max_split_size_mb against the one it keeps: 15 with 12 saved for later made torch refuse
    the whole call, and nothing was saved."""
    started = cuda_started(torch_env, monkeypatch)
    result = alloc_conf(["large_segment_size_mb=12 max_split_size_mb=15 expandable_segments=True"],
                        state=started, save=True)
    assert dict(result.deferred)["max_split_size_mb"] == (
        "torch checks it against the large_segment_size_mb this process keeps until a restart (20), "
        "and refuses it")
    assert result.saved == "large_segment_size_mb:12,max_split_size_mb:15,expandable_segments:True"
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert torch_holds(torch_env) == "expandable_segments:True"
    # a value torch accepts now still applies at once
    assert "max_split_size_mb" not in dict(alloc_conf(["large_segment_size_mb=12 max_split_size_mb=64"],
                                                      state=started).deferred)
    assert torch_holds(torch_env) == "expandable_segments:True,max_split_size_mb:64"


def test_reset_once_cuda_runs_with_a_large_segment_size_leaves_the_rounding_to_torch(shell, torch_env, monkeypatch,
                                                                                    capsys):
    """From 2.11 torch puts max_non_split_rounding_mb back to the large_segment_size_mb it holds
    at every settings string. %alloc_conf --reset once CUDA ran (large_segment_size_mb:30 kept
    until a restart) wrote max_non_split_rounding_mb:20 to torch's setter, which refused it
    (must be >= 30): the way out of a setting failed with "nothing was changed"."""
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "large_segment_size_mb:30,max_non_split_rounding_mb:40"
    cuda_started(torch_env, monkeypatch)
    shell.run_line_magic("alloc_conf", "--reset --json")
    assert json.loads(capsys.readouterr().out)["deferred"] == {
        "large_segment_size_mb": "segments already made keep their size; set it before CUDA starts"}
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "large_segment_size_mb:30"  # until the restart
    assert torch_holds(torch_env) == ""


def test_unsetting_the_segment_size_torch_keeps_says_the_next_start_refuses(shell, torch_env, monkeypatch):
    """Once CUDA runs torch keeps large_segment_size_mb:12 until a restart, so a held
    max_split_size_mb:15 still works; --unset large_segment_size_mb said the variable "already
    holds what torch refuses". The result is what the next start would refuse: say so, and how."""
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = held = "large_segment_size_mb:12,max_split_size_mb:15"
    cuda_started(torch_env, monkeypatch)
    with pytest.raises(UsageError) as error:
        shell.run_line_magic("alloc_conf", "--unset large_segment_size_mb --save")
    message = " ".join(str(error.value).split())
    assert "already holds" not in message
    assert ("torch keeps large_segment_size_mb=12 until a restart, so this process takes "
            "max_split_size_mb=15 now, but the next start would refuse it; unset max_split_size_mb too "
            "(--unset large_segment_size_mb,max_split_size_mb) or raise it to 20 or more "
            "(max_split_size_mb=20); nothing was changed") in message
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == held
    assert not Path(os.environ["COLAB_GPU_CONFIG_DIR"], "alloc_conf.txt").exists()
    shell.run_line_magic("alloc_conf", "--unset large_segment_size_mb,max_split_size_mb --json")
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "large_segment_size_mb:12"  # until the restart


@pytest.mark.parametrize("getter", ["as installed", "removed"])
def test_a_hand_edit_after_cuda_started_is_shown_as_not_in_effect(shell, torch_env, monkeypatch, capsys, getter):
    """torch read the variable when CUDA started and never again; an edit by hand afterwards,
    with no %alloc_conf change in between, was shown as the configuration (and a change started
    from it): only the "torch reports in effect" line said what torch uses. A torch without a
    getter (2.11, Colab's; the getter removed here) showed the edit with nothing to say otherwise:
    its CUDA memory snapshot reports what it uses."""
    if getter == "removed":
        monkeypatch.delattr(torch_env._C, "_accelerator_getAllocatorSettings", raising=False)
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "max_split_size_mb:128"
    cuda_started(torch_env, monkeypatch)
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    as_text(shell, "")
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "Allocator configuration: max_split_size_mb:128"
    assert "  torch reports in effect:\n    'max_split_size_mb:128'\n" in out
    assert ("PYTORCH_CUDA_ALLOC_CONF holds 'expandable_segments:True', set by hand after torch read its "
            "settings (at CUDA start or a later call of its run-time setter, as torch reports): torch "
            "does not read the variables again, so this edit does not take effect; torch uses "
            "'max_split_size_mb:128'") in " ".join(out.split())
    changed = alloc_conf(["garbage_collection_threshold=0.5"])
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == torch_holds(torch_env) == \
        "max_split_size_mb:128,garbage_collection_threshold:0.5"
    assert any("which never took effect" in warning for warning in changed.warnings)
    del os.environ["PYTORCH_CUDA_ALLOC_CONF"], os.environ["PYTORCH_ALLOC_CONF"]  # by hand too
    assert to_torch(alloc_conf().settings) == "max_split_size_mb:128,garbage_collection_threshold:0.5"


def test_a_save_once_cuda_started_keeps_what_an_earlier_save_left_for_the_restart(
        shell, torch_env, monkeypatch, capsys):
    """per_process_memory_fraction saved once CUDA runs waits for the restart, out of the
    environment; a later --save of another key saved only what this process holds, and the
    fraction was lost without a word. Only what the call names, or --reset, drops it."""
    cuda_started(torch_env, monkeypatch)
    saved = Path(os.environ["COLAB_GPU_CONFIG_DIR"], "alloc_conf.txt")
    shell.run_line_magic("alloc_conf", "per_process_memory_fraction=0.5 --save --json")
    capsys.readouterr()
    as_text(shell, "max_split_size_mb=128 --save")
    out = " ".join(capsys.readouterr().out.split())
    assert saved.read_text().strip() == "max_split_size_mb:128,per_process_memory_fraction:0.5"
    assert "could not change now: per_process_memory_fraction: kept from the setting saved before; " in out
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:128"
    assert torch_holds(torch_env) == "max_split_size_mb:128"
    # a change the next start would refuse with the kept key says so and changes nothing
    shell.run_line_magic("alloc_conf", "large_segment_size_mb=64 --save --json")
    with pytest.raises(UsageError, match="keeps large_segment_size_mb:64,per_process_memory_fraction:0.5"):
        shell.run_line_magic("alloc_conf", "max_split_size_mb=30 --save")
    assert saved.read_text().strip() == \
        "max_split_size_mb:128,large_segment_size_mb:64,per_process_memory_fraction:0.5"
    assert torch_holds(torch_env) == "max_split_size_mb:128"
    shell.run_line_magic("alloc_conf", "--unset per_process_memory_fraction,large_segment_size_mb --save --json")
    assert saved.read_text().strip() == "max_split_size_mb:128"
    shell.run_line_magic("alloc_conf", "per_process_memory_fraction=0.5 --save --json")
    shell.run_line_magic("alloc_conf", "--reset --save --json")
    assert not saved.exists()


def test_the_reset_card_says_what_happened_not_which_private_call_did_it(shell, torch_env, monkeypatch, capsys):
    """The --reset card named torch._C._accelerator_setAllocatorSettings, a private function of
    torch's no user can act on: it says which variables it cleared and that torch went back to
    its defaults now (where the call ran), or when CUDA starts. Scripts still read the call in
    the JSON's applied_via."""
    shell.run_line_magic("alloc_conf", "max_split_size_mb=128 --json")
    capsys.readouterr()
    as_text(shell, "--reset")
    card = " ".join(capsys.readouterr().out.split())
    assert "_accelerator_setAllocatorSettings" not in card and "torch._C" not in card
    variables = "PYTORCH_CUDA_ALLOC_CONF and PYTORCH_ALLOC_CONF unset"
    assert (f"applied: {variables}, and torch told: it uses its defaults from now on" if has_getter(torch_env)
            else f"applied: {variables}: torch uses its defaults when CUDA starts") in card
    html = alloc_conf(["max_split_size_mb=64"])._repr_html_() + alloc_conf(reset=True)._repr_html_()
    assert "_accelerator_setAllocatorSettings" not in html
    started = cuda_started(torch_env, monkeypatch)  # once CUDA runs, the setter is called on every torch
    alloc_conf(["max_split_size_mb=64"], state=started)
    reset = alloc_conf(reset=True, state=started)
    assert "and torch told: it uses its defaults from now on" in " ".join(str(reset).split())
    assert reset.applied_via == ("environment", "torch._C._accelerator_setAllocatorSettings")
