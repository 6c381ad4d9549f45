"""The allocator schema, parser and validator, and %alloc_conf with torch not imported.

"torch not imported" is real here: ``modules={}`` is the module table the core inspects, and
the magic tests run in a real IPython shell with torch hidden from ``sys.modules``.
"""
from __future__ import annotations

import os
import re

import pytest
from IPython.core.error import UsageError

from colab_gpu.allocator import (AllocConfError, alloc_conf, apply_saved, installed_torch_version, parse,
                                 to_torch, validate, version_of)
from colab_gpu.spelling import as_magic
from colab_gpu.runtime import TorchState
from colab_gpu.torch_allocator.parse import format_version
from colab_gpu.torch_allocator.schema import BY_NAME, KEYS, PRESETS

NOT_IMPORTED = TorchState(imported=False)
# the installed torch's version as the reports name it ("2.13"), read as %alloc_conf reads it
INSTALLED = format_version(version_of(installed_torch_version()))


def check(text, version=(2, 13)):
    return to_torch(validate(parse(text), version))


def rejected(text, version=(2, 13)):
    with pytest.raises(AllocConfError) as error:
        check(text, version)
    return str(error.value)


@pytest.fixture
def env(tmp_path):
    """A private environment mapping with its own config dir for saved settings."""
    return {"COLAB_GPU_CONFIG_DIR": str(tmp_path / "config")}


def test_both_forms_give_torchs_string():
    assert check("max_split_size_mb=128 expandable_segments=True") == \
        "max_split_size_mb:128,expandable_segments:True"
    assert check("max_split_size_mb:128, expandable_segments : True,") == \
        "max_split_size_mb:128,expandable_segments:True"
    assert check("roundup_power2_divisions:[256:1, 512:2,>:4]") == \
        "roundup_power2_divisions:[256:1,512:2,>:4]"
    assert check("roundup_power2_divisions=[256:1,512:2,>:4],garbage_collection_threshold=0.6") == \
        "roundup_power2_divisions:[256:1,512:2,>:4],garbage_collection_threshold:0.6"
    assert check("") == ""


@pytest.mark.parametrize("text, expected", [
    ("max_split_size:128", "did you mean 'max_split_size_mb'"),
    ("expandable_segment=True", "did you mean 'expandable_segments'"),
    ("expandable_segments:true", "takes True or False, capitalized as in Python (write True)"),
    ("max_split_size_mb:19", "must be >= 20"),
    ("max_split_size_mb:128abc", "takes a whole number"),
    ("max_split_size_mb:-5", "takes a whole number"),
    ("max_split_size_mb:abc", "takes a whole number, >= 20 (large_segment_size_mb's default; a "
                              "smaller large_segment_size_mb allows less) and <= 2147483647"),
    ("garbage_collection_threshold:1.5", "must be > 0 and < 1"),
    ("garbage_collection_threshold:0", "must be > 0 and < 1"),
    ("garbage_collection_threshold:1e-1", "takes a decimal number"),
    ("backend:cudaMalloc", "did you mean 'cudaMallocAsync'"),
    ("pinned_num_register_threads:3", "power of two"),
    ("pinned_num_register_threads:256", "must be >= 1 and <= 128"),
    ("large_segment_size_mb:10", "must be > 10"),
    ("roundup_power2_divisions:3", "takes a power of two"),
    ("roundup_power2_divisions:[3:1]", "each interval is a power of two"),
    ("roundup_power2_divisions:[256:3]", "must be 0 (no rounding) or a power of two"),
    ("max_split_size_mb:128 expandable_segments:True", "put a ',' before 'expandable_segments'"),
    ("max_split_size_mb=128,expandable_segments:True", "not both"),
    ("max_split_size_mb:", "expected a value for max_split_size_mb"),
    ("max_split_size_mb", "expected '=' or ':' after 'max_split_size_mb'"),
    ("max_split_size_mb:128,,expandable_segments:True", "expected a key"),
    ("max_split_size_mb:128,max_split_size_mb:256", "given twice"),
    ("max_split_size_mb:30,large_segment_size_mb:40", "must be >= large_segment_size_mb=40"),
])
def test_errors_name_the_problem(text, expected):
    assert expected in rejected(text)


def test_versions_are_checked_both_ways():
    assert "removed in torch 2.0" in rejected("roundup_bypass_threshold_mb:64", (2, 1))
    assert check("roundup_bypass_threshold_mb:64", (1, 13)) == "roundup_bypass_threshold_mb:64"
    assert "needs torch >= 2.1 (added in 2.1); the installed torch is 2.0" in \
        rejected("expandable_segments:True", (2, 0))
    assert "list form needs torch >= 2.0" in rejected("roundup_power2_divisions:[256:1]", (1, 13))
    assert check("roundup_power2_divisions:4", (1, 13)) == "roundup_power2_divisions:4"
    # CUDA's own parser said "> 20" up to 2.9; 2.10's AcceleratorAllocatorConfig says ">= 20"
    for key in ("max_split_size_mb", "max_non_split_rounding_mb"):
        assert "must be > 20" in rejected(f"{key}:20", (2, 9))
        assert check(f"{key}:20", (2, 10)) == f"{key}:20"
    assert "needs torch >= 2.10" in rejected("per_process_memory_fraction:0.5", (2, 9))
    # a divisions entry of 0 ("no rounding") is refused by 2.0-2.3 and accepted from 2.4
    assert "0 needs torch >= 2.4" in rejected("roundup_power2_divisions:[256:0,>:4]", (2, 3))
    assert check("roundup_power2_divisions:[256:0,>:4]", (2, 4)) == \
        "roundup_power2_divisions:[256:0,>:4]"


@pytest.mark.parametrize("version", [(2, 11), (2, 13)])
def test_the_split_minimums_follow_large_segment_size_mb(version):
    """From 2.11 torch checks both split keys against large_segment_size_mb (read first,
    wherever it stands), not against a fixed 20: a smaller segment size allows smaller values."""
    for text in ("large_segment_size_mb:12,max_split_size_mb:15,max_non_split_rounding_mb:12",
                 "max_split_size_mb:15,max_non_split_rounding_mb:12,large_segment_size_mb:12"):
        assert check(text, version) == text
    assert "max_split_size_mb=11 is out of range: must be >= large_segment_size_mb=12" in \
        rejected("max_split_size_mb:11,large_segment_size_mb:12", version)
    assert "must be >= 20 (large_segment_size_mb's default" in rejected("max_split_size_mb:15", version)
    assert "must be >= 20 and" in rejected("max_split_size_mb:15", (2, 10))


# The first release whose CUDA wheel parses each key (pip download torch==X: the parser's
# strings in libc10_cuda.so / libc10.so and CUDAAllocatorConfig.h's getKeys()).
FIRST_RELEASE = [
    ("backend:native", (2, 0)),
    ("expandable_segments:True", (2, 1)),
    ("release_lock_on_cudamalloc:True", (2, 2)),
    ("pinned_use_cuda_host_register:True", (2, 2)),
    ("pinned_num_register_threads:8", (2, 2)),
    ("max_non_split_rounding_mb:64", (2, 6)),
    ("pinned_use_background_threads:True", (2, 6)),
    ("graph_capture_record_stream_reuse:True", (2, 9)),
    ("pinned_reserve_segment_size_mb:64", (2, 10)),
    ("per_process_memory_fraction:0.5", (2, 10)),
    ("large_segment_size_mb:40", (2, 11)),
    ("pinned_free_catch_all:True", (2, 12)),
    ("throw_on_cudamalloc_oom:True", (2, 12)),
    ("pinned_max_round_threshold_mb:64", (2, 13)),
    ("pinned_max_cached_size_mb:64", (2, 13)),
    ("expandable_segments_reserve:0.5", (2, 15)),
    ("expandable_segments_reserve_by_class:[serving:0.25,ads_sparse:8G]", (2, 15)),
]


@pytest.mark.parametrize("value, accepted", [
    ("0.5", True), ("1.125", True), ("40G", True), ("1.5G", True),
    ("0", False), ("0G", False), ("40GB", False), ("-1G", False), ("G", False), ("half", False),
])
def test_expandable_segments_reserve_takes_a_fraction_or_gib(value, accepted):
    text = f"expandable_segments_reserve:{value}"
    if accepted:
        assert check(text, (2, 15)) == text
    else:
        assert "a positive fraction of the GPU's memory" in rejected(text, (2, 15))


@pytest.mark.parametrize("value, problem", [
    ("[serving:0.25,ads_sparse:8G]", None),  # torch 2.15's own test string
    ("[capture:0.25, workspace:40G]", None),
    ("[tiny:0.05]", None),
    ("0.5", "takes a list of stream classes and their reserves"),
    ("[serving:0]", "the reserve of 'serving': takes a positive fraction"),
    ("[serving:8GB]", "the reserve of 'serving': takes a positive fraction"),
    ("[serving:0.5,serving:8G]", "the class 'serving' is given twice"),
    ("[]", "expected an entry in expandable_segments_reserve_by_class's list but found ']'"),
    ("[serving]", "expected ':' after 'serving'"),
    ("[serving:0.5", "the string ends too early"),
])
def test_reserve_by_class_takes_a_reserve_per_stream_class(value, problem):
    """torch 2.15 skips a bad entry with a warning and keeps the last of a repeated class:
    both would leave a reserve other than the one written, so both are refused here."""
    text = f"expandable_segments_reserve_by_class:{value}"
    if problem is None:
        assert check(text, (2, 15)) == text.replace(" ", "")
    else:
        assert problem in rejected(text, (2, 15))


def test_rocm_spellings_of_keys_are_the_same_keys(env):
    """Every wheel since 2.2 accepts release_lock_on_hipmalloc and pinned_use_hip_host_register
    (libc10_cuda.so has both spellings): they merge with, unset and clash with the CUDA names."""
    assert check("release_lock_on_hipmalloc:True,pinned_use_hip_host_register:True") == \
        "release_lock_on_cudamalloc:True,pinned_use_cuda_host_register:True"
    assert "given twice" in rejected("release_lock_on_hipmalloc:True,release_lock_on_cudamalloc:False")
    assert "needs torch >= 2.2" in rejected("release_lock_on_hipmalloc:True", (2, 1))
    assert "did you mean 'release_lock_on_hipmalloc'" in rejected("release_lock_on_hipmaloc:True")
    env["PYTORCH_CUDA_ALLOC_CONF"] = "release_lock_on_hipmalloc:True,expandable_segments:True"
    alloc_conf(["release_lock_on_cudamalloc=False"], environ=env, modules={})
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "release_lock_on_cudamalloc:False,expandable_segments:True"
    alloc_conf(unset=["release_lock_on_hipmalloc"], environ=env, modules={})
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"


def test_hipmallocasync_is_refused_outside_rocm_builds():
    """No CUDA wheel has the string hipMallocAsync; only ROCm builds parse it."""
    message = rejected("backend:hipMallocAsync")
    assert "only ROCm builds of torch accept hipMallocAsync" in message
    assert "takes one of native, cudaMallocAsync" in message
    assert to_torch(validate(parse("backend:hipMallocAsync"), (2, 8), rocm=True)) == \
        "backend:hipMallocAsync"


@pytest.fixture
def rocm_wheel(tmp_path, monkeypatch):
    """An installed ROCm build of torch as the package metadata shows it before `import torch`
    (what ``pip install torch --index-url .../rocm6.4`` leaves in site-packages)."""
    info = tmp_path / "site" / "torch-2.8.0+rocm6.4.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 2.8.0+rocm6.4\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    import importlib.metadata

    assert importlib.metadata.version("torch") == "2.8.0+rocm6.4"


def test_rocm_build_reads_and_writes_pytorch_hip_alloc_conf(env, rocm_wheel):
    """ROCm torch reads PYTORCH_HIP_ALLOC_CONF when PYTORCH_CUDA_ALLOC_CONF is unset: the
    setting there is the base, and all three variables end up with the same string."""
    env["PYTORCH_HIP_ALLOC_CONF"] = "expandable_segments:True"
    result = alloc_conf(["backend=hipMallocAsync"], environ=env, modules={})
    expected = "expandable_segments:True,backend:hipMallocAsync"
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == env["PYTORCH_HIP_ALLOC_CONF"] == \
        env["PYTORCH_ALLOC_CONF"] == expected
    assert result.torch_version == "2.8.0+rocm6.4"
    assert "backend hipMallocAsync ignores expandable_segments" in result.warnings
    alloc_conf(reset=True, environ=env, modules={})
    assert not {"PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF", "PYTORCH_ALLOC_CONF"} & set(env)


def test_cuda_and_cpu_builds_leave_pytorch_hip_alloc_conf_alone(env):
    env["PYTORCH_HIP_ALLOC_CONF"] = "expandable_segments:True"
    alloc_conf(["max_split_size_mb=128"], environ=env, modules={})
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:128"
    assert env["PYTORCH_HIP_ALLOC_CONF"] == "expandable_segments:True"


@pytest.mark.parametrize("text, first", FIRST_RELEASE)
def test_each_key_arrives_in_the_release_that_first_parses_it(text, first):
    before = (1, 13) if first == (2, 0) else (first[0], first[1] - 1)
    added = f"{first[0]}.{first[1]}"
    assert f"needs torch >= {added} (added in {added})" in rejected(text, before)
    assert check(text, first) == text


def test_schema_covers_the_issue_keys_with_meaning_and_versions():
    wanted = {"backend", "max_split_size_mb", "roundup_power2_divisions",
              "roundup_bypass_threshold_mb", "garbage_collection_threshold", "expandable_segments",
              "release_lock_on_cudamalloc", "pinned_use_cuda_host_register",
              "pinned_num_register_threads", "max_non_split_rounding_mb",
              "pinned_use_background_threads", "graph_capture_record_stream_reuse",
              "pinned_reserve_segment_size_mb", "per_process_memory_fraction",
              "large_segment_size_mb"}
    assert wanted <= set(BY_NAME)
    for key in KEYS:
        assert key.meaning and key.default and key.added >= (1, 13), key.name
        assert key.runtime or key.runtime_reason, key.name


def test_every_preset_is_valid_on_the_newest_torch_and_explained():
    for name, (text, why) in PRESETS.items():
        assert check(text) and len(why) > 40, name


def test_merge_unset_reset(env):
    alloc_conf(["max_split_size_mb=128 expandable_segments=True"], environ=env, modules={})
    result = alloc_conf(["garbage_collection_threshold:0.6"], unset=["max_split_size_mb"],
                        environ=env, modules={})
    expected = "expandable_segments:True,garbage_collection_threshold:0.6"
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == env["PYTORCH_ALLOC_CONF"] == expected
    assert result.env_before["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:128,expandable_segments:True"
    assert result.applied_via == ("environment",)
    alloc_conf(reset=True, environ=env, modules={})
    assert "PYTORCH_CUDA_ALLOC_CONF" not in env and "PYTORCH_ALLOC_CONF" not in env


def test_unset_takes_one_key_as_a_plain_string_like_settings(env):
    env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True,max_split_size_mb:128"
    alloc_conf(unset="expandable_segments", environ=env, modules={})
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:128"


@pytest.mark.parametrize("kwargs, named", [
    (dict(settings={"max_split_size_mb": 128}), "settings"),  # a dict: its values were dropped
    (dict(settings=b"max_split_size_mb=128"), "settings"),  # bytes: AttributeError on an int
    (dict(settings=["max_split_size_mb=128", 128]), "settings"),
    (dict(settings=None), "settings"),
    (dict(unset=["max_split_size_mb", 5]), "unset"),
    (dict(unset=None), "unset"),
    (dict(check=b"max_split_size_mb:128"), "check"),
    (dict(check=128), "check"),
])
def test_arguments_of_the_wrong_type_are_a_type_error_naming_them(env, kwargs, named):
    """alloc_conf({"max_split_size_mb": 128}) said 'malformed setting 'max_split_size_mb': expected
    '=' or ':' ... but found the end', bytes raised AttributeError: 'int' object has no attribute
    'rstrip'; each now says which argument takes what, and nothing changes."""
    env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    before = dict(env)
    with pytest.raises(TypeError, match=rf"alloc_conf\(\) takes {named} as "):
        alloc_conf(environ=env, modules={}, **kwargs)
    assert env == before


def test_warnings_where_torch_is_surprising(env):
    result = alloc_conf(["garbage_collection_threshold=0.6 max_split_size_mb=128 "
                         "expandable_segments=True backend=cudaMallocAsync"], environ=env, modules={})
    text = " | ".join(result.warnings)
    assert "does nothing unless a per-process memory fraction below 1" in text
    assert "max_split_size_mb with expandable_segments" in text
    assert "cudaMallocAsync ignores garbage_collection_threshold, max_split_size_mb, expandable_segments" in text
    assert "snapshots" in text
    quiet = alloc_conf(["garbage_collection_threshold=0.6 per_process_memory_fraction=0.9"],
                       reset=True, environ=env, modules={})
    assert not any("per-process memory fraction" in w for w in quiet.warnings)


def test_the_memory_fraction_hints_say_the_call_caps_one_gpu(env):
    """torch.cuda.set_per_process_memory_fraction(f) caps the current GPU only: on a 2-GPU
    box the model on cuda:1 got no fraction, so garbage_collection_threshold did nothing."""
    result = alloc_conf(["garbage_collection_threshold=0.6"], environ=env, modules={})
    (hint,) = [w for w in result.warnings if "set_per_process_memory_fraction" in w]
    assert "(fraction, device), once per GPU" in hint and "current one only" in hint
    assert "0.95, device) for each GPU in use" in PRESETS["reclaim"][1]
    assert "(fraction, device) for each GPU in use" in BY_NAME["per_process_memory_fraction"].runtime_reason


def _torch(version):
    """An imported torch of this version (a CUDA build, CUDA not started), for the version rules."""
    import types

    torch = types.ModuleType("torch")
    torch.__version__ = version
    torch.version = types.SimpleNamespace(cuda="12.1", hip=None)
    return {"torch": torch}


@pytest.mark.parametrize("version, says", [
    ("2.9.1", "torch 2.9 does not read PYTORCH_ALLOC_CONF for CUDA (pytorch#183387)"),
    ("2.4.0", "torch 2.4 does not read PYTORCH_ALLOC_CONF (torch reads it from 2.10)"),
    ("2.13.0", "torch 2.13 reads PYTORCH_CUDA_ALLOC_CONF first and ignores PYTORCH_ALLOC_CONF while "
               "PYTORCH_CUDA_ALLOC_CONF is set")])
def test_a_variable_torch_does_not_read_is_named_and_never_said_rewritten_by_a_show(env, version, says):
    """A user who set PYTORCH_ALLOC_CONF (torch's newer name) next to PYTORCH_CUDA_ALLOC_CONF saw
    its settings nowhere and no word why, and a change then replaced them silently; on torch 2.9
    even a plain %alloc_conf said 'both now hold the same string' while it changed nothing."""
    env.update(PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True", PYTORCH_ALLOC_CONF="max_split_size_mb:512")
    shown = alloc_conf(environ=env, modules=_torch(version))
    assert shown.warnings == (f"PYTORCH_ALLOC_CONF holds 'max_split_size_mb:512', which is not in effect: "
                              f"{says}; any change with colab_gpu.alloc_conf() replaces it with "
                              f"PYTORCH_CUDA_ALLOC_CONF's setting",)
    assert env["PYTORCH_ALLOC_CONF"] == "max_split_size_mb:512"
    changed = alloc_conf(["garbage_collection_threshold=0.5"], environ=env, modules=_torch(version))
    assert changed.warnings[-1:] == (f"PYTORCH_ALLOC_CONF held 'max_split_size_mb:512', which was not in "
                                f"effect: {says}; it now holds the same string as PYTORCH_CUDA_ALLOC_CONF",)
    assert env["PYTORCH_ALLOC_CONF"] == env["PYTORCH_CUDA_ALLOC_CONF"] == \
        "expandable_segments:True,garbage_collection_threshold:0.5"
    assert not [w for w in alloc_conf(environ=env, modules=_torch(version)).warnings if "PYTORCH_ALLOC_CONF" in w]


@pytest.mark.parametrize("before, call, said", [
    (dict(PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True", PYTORCH_ALLOC_CONF="max_split_size_mb:512"),
     dict(reset=True), "PYTORCH_ALLOC_CONF held 'max_split_size_mb:512', which was not in effect: torch 2.13 "
                       "reads PYTORCH_CUDA_ALLOC_CONF first and ignores PYTORCH_ALLOC_CONF while "
                       "PYTORCH_CUDA_ALLOC_CONF is set; it is now unset, as PYTORCH_CUDA_ALLOC_CONF is"),
    (dict(PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True", PYTORCH_ALLOC_CONF="max_split_size_mb:512"),
     dict(unset=["expandable_segments"]), "; it is now unset, as PYTORCH_CUDA_ALLOC_CONF is"),
    (dict(PYTORCH_ALLOC_CONF="max_split_size_mb:512"), dict(reset=True),
     "PYTORCH_ALLOC_CONF's settings were not in effect: torch 2.9 does not read PYTORCH_ALLOC_CONF for CUDA "
     "(pytorch#183387); every variable is now unset"),
])
def test_a_change_that_empties_the_setting_says_the_ignored_variable_is_now_unset(env, before, call, said):
    """--reset (or unsetting every key) removes every variable: the warning said the ignored
    PYTORCH_ALLOC_CONF 'now holds the same string as PYTORCH_CUDA_ALLOC_CONF', or that its
    settings 'are now in every variable', of an environment that held neither any more."""
    env.update(before)
    version = "2.9.1" if "PYTORCH_CUDA_ALLOC_CONF" not in before else "2.13.0"
    result = alloc_conf(environ=env, modules=_torch(version), **call)
    assert "PYTORCH_CUDA_ALLOC_CONF" not in env and "PYTORCH_ALLOC_CONF" not in env
    assert result.warnings[-1].endswith(said) and "same string" not in result.warnings[-1]


@pytest.mark.parametrize("version, in_effect", [("2.9.1", False), ("2.8.0", False), ("2.10.0", True)])
def test_settings_only_in_pytorch_alloc_conf_are_said_to_be_in_effect_only_where_torch_reads_it(
        env, version, in_effect):
    env["PYTORCH_ALLOC_CONF"] = "max_split_size_mb:512"
    shown = alloc_conf(environ=env, modules=_torch(version))
    assert shown.settings == (("max_split_size_mb", "512"),)
    warned = [w for w in shown.warnings if "PYTORCH_ALLOC_CONF's settings, shown here, are not in effect" in w]
    assert bool(warned) != in_effect
    checked = alloc_conf(check="expandable_segments:True", environ=env, modules=_torch(version))
    assert bool([w for w in checked.warnings if "shown here, are not in effect" in w]) != in_effect
    changed = alloc_conf(["expandable_segments=True"], environ=env, modules=_torch(version))
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:512,expandable_segments:True"
    assert bool([w for w in changed.warnings if "settings were not in effect" in w and
                 w.endswith("they are now in every variable")]) != in_effect


@pytest.mark.parametrize("version, held", [("2.9.1", False), ("2.10.0", True)])
def test_a_saved_setting_only_in_pytorch_alloc_conf_is_held_only_where_torch_reads_it(env, version, held):
    """torch 2.9 (CUDA) never reads PYTORCH_ALLOC_CONF: with the saved setting there alone,
    %reload_ext once CUDA ran said it was "already in this process's setting", so the user
    never learnt that a restart was needed for it to apply."""
    os.makedirs(env["COLAB_GPU_CONFIG_DIR"])
    with open(os.path.join(env["COLAB_GPU_CONFIG_DIR"], "alloc_conf.txt"), "w") as file:
        file.write("expandable_segments:True\n")
    env["PYTORCH_ALLOC_CONF"] = "expandable_segments:True"
    started = TorchState(imported=True, version=version, cuda_version="12.1", cuda_initialized=True)
    message = apply_saved(environ=env, modules=_torch(version), state=started)
    assert ("already in this process's setting (PYTORCH_ALLOC_CONF holds it)" in message) == held
    assert ("not applied: CUDA is already running" in message) != held


BAD_CALLS = [
    dict(settings=["max_split_size=128"]),
    dict(settings=["expandable_segments=true"]),
    dict(settings=["max_split_size_mb=128 garbage_collection_threshold=2"]),
    dict(settings=["roundup_power2_divisions:[256:1,512:2"]),
    dict(settings=["max_split_size_mb=64"], unset=["max_split_size_mb"]),
    dict(unset=["max_split"]),
    dict(preset="fragmentaton"),
    dict(check="max_split_size_mb:5"),
]


@pytest.mark.parametrize("call", BAD_CALLS)
def test_rejected_calls_leave_the_environment_byte_identical(call, env):
    env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True, max_split_size_mb:256"
    env["PYTORCH_ALLOC_CONF"] = "garbage_collection_threshold:0.5"
    before = {name: value.encode() for name, value in env.items()}
    with pytest.raises(AllocConfError):
        alloc_conf(environ=env, modules={}, **call)
    assert {name: value.encode() for name, value in env.items()} == before


def test_check_applies_nothing(env):
    result = alloc_conf(check="max_split_size_mb:128", environ=env, modules={})
    assert result.action == "check" and to_torch(result.settings) == "max_split_size_mb:128"
    assert "PYTORCH_CUDA_ALLOC_CONF" not in env


def test_unreadable_existing_setting_asks_for_reset(env):
    env["PYTORCH_CUDA_ALLOC_CONF"] = "max_split_size_mb"
    with pytest.raises(AllocConfError, match="PYTORCH_CUDA_ALLOC_CONF already holds something unreadable"):
        alloc_conf(["expandable_segments=True"], environ=env, modules={})
    alloc_conf(["expandable_segments=True"], reset=True, environ=env, modules={})
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"


def test_save_is_visible_applied_on_load_and_forgettable(env):
    result = alloc_conf(preset="fragmentation", save=True, environ=env, modules={})
    path = os.path.join(env["COLAB_GPU_CONFIG_DIR"], "alloc_conf.txt")
    assert open(path).read() == "expandable_segments:True\n"
    assert result.saved == "expandable_segments:True" and result.saved_path == path
    shown = alloc_conf(environ=env, modules={})
    assert shown.saved == "expandable_segments:True"
    # a restarted runtime: empty environment, the saved file applied before CUDA starts
    fresh = {"COLAB_GPU_CONFIG_DIR": env["COLAB_GPU_CONFIG_DIR"]}
    message = apply_saved(environ=fresh, modules={}, state=NOT_IMPORTED)
    assert "applied the saved allocator setting 'expandable_segments:True'" in message
    assert fresh["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    late = {"COLAB_GPU_CONFIG_DIR": env["COLAB_GPU_CONFIG_DIR"]}
    started = TorchState(imported=True, version="2.13.0", cuda_version="12.8", cuda_initialized=True)
    assert "not applied: CUDA is already running" in apply_saved(environ=late, modules={}, state=started)
    assert "PYTORCH_CUDA_ALLOC_CONF" not in late
    alloc_conf(forget=True, environ=env, modules={})
    assert not os.path.exists(path)
    assert apply_saved(environ=fresh, modules={}, state=NOT_IMPORTED) is None


def test_reloading_once_cuda_runs_does_not_say_an_applied_saved_setting_was_not_applied(env):
    """%reload_ext colab_gpu after training started: the saved setting, applied when the extension
    first loaded, was reported 'not applied: CUDA is already running; restart the runtime'."""
    alloc_conf(["expandable_segments=True max_split_size_mb=128"], save=True, environ=env, modules={})
    fresh = {"COLAB_GPU_CONFIG_DIR": env["COLAB_GPU_CONFIG_DIR"]}
    apply_saved(environ=fresh, modules={}, state=NOT_IMPORTED)
    alloc_conf(["garbage_collection_threshold=0.6"], environ=fresh, modules={})  # a later cell
    started = TorchState(imported=True, version="2.13.0", cuda_version="12.8", cuda_initialized=True)
    before = dict(fresh)
    with as_magic():  # as %reload_ext runs it
        message = apply_saved(environ=fresh, modules={}, state=started)
    assert message == ("colab_gpu: the saved allocator setting 'expandable_segments:True,max_split_size_mb:128' "
                       "is already in this process's setting (PYTORCH_CUDA_ALLOC_CONF holds it) "
                       "(%alloc_conf --forget removes it)")
    assert fresh == before
    fresh["PYTORCH_CUDA_ALLOC_CONF"] = fresh["PYTORCH_ALLOC_CONF"] = "max_split_size_mb:128"
    assert "not applied: CUDA is already running" in apply_saved(environ=fresh, modules={}, state=started)


def test_saved_backend_after_import_waits_and_the_rest_of_the_setting_applies(env):
    """A restarted notebook whose first cell imports torch, then loads the extension."""
    alloc_conf(["backend=cudaMallocAsync expandable_segments=True"], save=True, environ=env, modules={})
    fresh = {"COLAB_GPU_CONFIG_DIR": env["COLAB_GPU_CONFIG_DIR"]}
    message = apply_saved(environ=fresh, modules={}, state=TorchState(imported=True, version="2.11.0"))
    assert fresh["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert "except backend:cudaMallocAsync (torch was imported before the extension loaded" in message
    assert "add --save" not in message and "save=True" not in message


def test_a_saved_backend_alone_after_import_is_not_applied_and_says_so(env):
    """`%alloc_conf --preset async --save`, then a restarted notebook that imports torch before
    %load_ext: the message said "applied the saved allocator setting 'backend:cudaMallocAsync'
    ... except backend:cudaMallocAsync ...; now ''", when nothing at all was applied."""
    alloc_conf(preset="async", save=True, environ=env, modules={})
    fresh = {"COLAB_GPU_CONFIG_DIR": env["COLAB_GPU_CONFIG_DIR"]}
    with as_magic():  # as %load_ext runs it
        message = apply_saved(environ=fresh, modules={}, state=TorchState(imported=True, version="2.11.0"))
    path = os.path.join(env["COLAB_GPU_CONFIG_DIR"], "alloc_conf.txt")
    assert message == (f"colab_gpu: saved allocator setting 'backend:cudaMallocAsync' from {path} not "
                       f"applied: torch was imported before the extension loaded and chose its allocator "
                       f"then: restart and load the extension before `import torch` "
                       f"(%alloc_conf --forget removes it)")
    assert fresh == {"COLAB_GPU_CONFIG_DIR": env["COLAB_GPU_CONFIG_DIR"],
                     "COLAB_GPU_SAVED_APPLIED": str(os.getpid())}  # this process's first load is done


def test_saved_reset_after_import_keeps_the_loaded_backend_in_the_environment(env):
    env["PYTORCH_CUDA_ALLOC_CONF"] = "backend:cudaMallocAsync,expandable_segments:True"
    imported = TorchState(imported=True, version="2.13.0")
    with pytest.raises(AllocConfError, match="backend cannot change now"):
        alloc_conf(reset=True, environ=env, modules={}, state=imported)
    result = alloc_conf(reset=True, save=True, environ=env, modules={}, state=imported)
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == env["PYTORCH_ALLOC_CONF"] == "backend:cudaMallocAsync"
    assert to_torch(result.settings) == "backend:cudaMallocAsync"
    assert not os.path.exists(result.saved_path)  # nothing for %load_ext to apply after a restart


def test_heading_says_unchanged_and_forget_says_what_it_deleted(env):
    from IPython.lib.pretty import pretty

    alloc_conf(preset="fragmentation", save=True, environ=env, modules={})
    again = alloc_conf(preset="fragmentation", environ=env, modules={})
    assert pretty(again).startswith("Allocator configuration unchanged: expandable_segments:True\n")
    assert "<h4>Allocator configuration unchanged: " in again._repr_html_()
    forgot = pretty(alloc_conf(forget=True, environ=env, modules={}))
    assert forgot.startswith("Allocator configuration unchanged: expandable_segments:True\n")
    assert "  saved setting:\n    deleted 'expandable_segments:True' from\n" in forgot  # the path on its own line
    assert "applied:" not in forgot and "applied:" not in pretty(again)  # nothing was
    assert ("applied:\n    written to PYTORCH_CUDA_ALLOC_CONF and PYTORCH_ALLOC_CONF, which torch reads\n"
            "      when CUDA starts\n") in pretty(alloc_conf(["max_split_size_mb=64"], environ=env, modules={}))
    assert "there was none to delete" in pretty(alloc_conf(forget=True, environ=env, modules={}))
    assert pretty(alloc_conf(reset=True, environ=env, modules={})).startswith(
        "Allocator configuration changed: (empty)\n")
    assert pretty(alloc_conf(reset=True, environ=env, modules={})).startswith(
        "Allocator configuration unchanged: (empty)\n")


def test_saving_an_empty_result_says_it_replaced_the_saved_setting(env):
    """`%alloc_conf --reset --save` after a saved setting: the restart applies nothing, and
    the report says so (it said nothing of the save, and --forget then said there was none)."""
    from IPython.lib.pretty import pretty

    alloc_conf(preset="fragmentation", save=True, environ=env, modules={})
    reset = alloc_conf(reset=True, save=True, environ=env, modules={})
    assert "  saved setting:\n    deleted 'expandable_segments:True' from\n" in pretty(reset)
    assert "deleted &#x27;expandable_segments:True&#x27;" in reset._repr_html_()
    assert not os.path.exists(reset.saved_path)
    assert alloc_conf(environ=env, modules={}).saved is None
    assert "there was none to delete" in pretty(alloc_conf(unset=["max_split_size_mb"], save=True,
                                                           environ=env, modules={}))


def test_result_renders_as_text_html_and_json(env):
    result = alloc_conf(["max_split_size_mb=128"], environ=env, modules={})
    assert repr(result) == "<AllocConfResult set: max_split_size_mb:128; 0 warnings>"
    warned = alloc_conf(["garbage_collection_threshold=0.6"], environ=dict(env), modules={})
    assert len(warned.warnings) == 1 and repr(warned).endswith("; 1 warning>")
    from IPython.lib.pretty import pretty

    text = pretty(result)
    assert "PYTORCH_CUDA_ALLOC_CONF = 'max_split_size_mb:128'" in text
    assert "max_split_size_mb = 128  -- cached blocks larger than this are never split" in text
    assert "torch not imported yet" in text
    assert str(result) == text  # print() in a script shows the report, not the repr
    html = result._repr_html_()
    assert 'class="cgpu-card"' in html and "max_split_size_mb" in html and "<script" not in html
    assert '"PYTORCH_ALLOC_CONF": "max_split_size_mb:128"' in result.to_json()


# --- the magic in the real IPython shell, torch not imported -------------------------------

@pytest.fixture
def magic_env(shell, clean_env, tmp_path):
    """The shell as a notebook sees it before `import torch`.

    Other test files import torch into this process; hiding it from ``sys.modules`` for the
    test is exactly the state the core reads, and any attempt of the code under test to
    import torch would now fail loudly (a second import of torch raises).
    """
    import sys

    clean_env.delitem(sys.modules, "torch", raising=False)
    clean_env.setenv("COLAB_GPU_CONFIG_DIR", str(tmp_path))
    return shell


def test_magic_sets_both_variables_and_shows_the_meaning(magic_env, capsys):
    magic_env.run_line_magic("config", "GPUMagics.output = 'text'")
    try:
        magic_env.run_line_magic("alloc_conf", "max_split_size_mb=128 expandable_segments=True")
        magic_env.run_line_magic("alloc_conf", "roundup_power2_divisions:[256:1,512:2,>:4]")
    finally:
        magic_env.run_line_magic("config", "GPUMagics.output = 'auto'")
    expected = "max_split_size_mb:128,expandable_segments:True,roundup_power2_divisions:[256:1,512:2,>:4]"
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == os.environ["PYTORCH_ALLOC_CONF"] == expected
    out = " ".join(capsys.readouterr().out.split())  # folded at 80 columns
    assert "round request sizes up to one of N steps" in out


@pytest.mark.parametrize("line, expected", [
    ("max_split_size=128", "did you mean 'max_split_size_mb'"),
    ("--check max_split_size_mb:5", "must be >= 20"),
    ("--unset expandable_segment", "did you mean 'expandable_segments'"),
    ("--preset frag", "unknown preset 'frag'; presets: fragmentation"),
    ("garbage_collection_threshold:0.5 max_split_size_mb:abc", "takes a whole number"),
    ("PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:128,expandable_segments:True",
     "PYTORCH_CUDA_ALLOC_CONF is the environment variable, not an allocator key: give only its "
     "value (max_split_size_mb:128,expandable_segments:True)"),
    ("PYTORCH_ALLOC_CONF", "PYTORCH_ALLOC_CONF is the environment variable, not an allocator "
     "key: give only its value (e.g. expandable_segments:True)"),
])
def test_magic_bad_input_is_a_usage_error_and_changes_nothing(magic_env, line, expected):
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    before = {name: value.encode() for name, value in os.environ.items()}
    with pytest.raises(UsageError, match=re.escape(expected)):
        magic_env.run_line_magic("alloc_conf", line)
    assert {name: value.encode() for name, value in os.environ.items()} == before


@pytest.mark.parametrize("line, expected", [
    ("--save --forget", "--save and --forget contradict each other"),
    ("--forget expandable_segments=False --save", "--save and --forget contradict each other"),
    ("--check max_split_size_mb:128 expandable_segments=False", "--check only validates"),
    ("--check max_split_size_mb:128 --save", "--check only validates"),
    ("--check max_split_size_mb:128 --reset --preset reclaim", "--check only validates"),
    ("--keys --json", "--keys lists every key and takes no other option"),
    ("--keys max_split_size_mb=128", "--keys lists every key and takes no other option"),
])
def test_magic_refuses_options_that_contradict_each_other(magic_env, capsys, line, expected):
    magic_env.run_line_magic("alloc_conf", "expandable_segments=True --save")
    capsys.readouterr()
    saved = os.path.join(os.environ["COLAB_GPU_CONFIG_DIR"], "alloc_conf.txt")
    before = {name: value.encode() for name, value in os.environ.items()}
    with pytest.raises(UsageError, match=expected) as error:
        magic_env.run_line_magic("alloc_conf", line)
    assert "\n" not in str(error.value) and not capsys.readouterr().out
    assert {name: value.encode() for name, value in os.environ.items()} == before
    assert open(saved).read() == "expandable_segments:True\n"


@pytest.mark.parametrize("line, message", [
    ("max_split_size_mb=64 --save", "--save: cannot write {dir}/alloc_conf.txt (File exists: {dir}); "
                                    "nothing was changed (COLAB_GPU_CONFIG_DIR names another folder)"),
    ("--forget", "--forget: cannot delete {dir}/alloc_conf.txt (Not a directory: {dir}/alloc_conf.txt); "
                 "nothing was changed (COLAB_GPU_CONFIG_DIR names another folder)"),
    # Saving an empty result deletes the file: the error names --save, the option typed.
    ("--reset --save", "--save: cannot delete {dir}/alloc_conf.txt (Not a directory: {dir}/alloc_conf.txt); "
                       "nothing was changed (COLAB_GPU_CONFIG_DIR names another folder)"),
])
def test_a_config_folder_that_cannot_be_written_is_one_line_and_applies_nothing(magic_env, tmp_path, line,
                                                                                message):
    folder = tmp_path / "a-file"
    folder.write_text("")
    os.environ["COLAB_GPU_CONFIG_DIR"] = str(folder)
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    before = {name: value.encode() for name, value in os.environ.items()}
    with pytest.raises(UsageError) as error:
        magic_env.run_line_magic("alloc_conf", line)
    assert str(error.value) == message.format(dir=folder)
    assert {name: value.encode() for name, value in os.environ.items()} == before


def test_magic_check_json_keys_and_show(magic_env, capsys):
    import json

    magic_env.run_line_magic("alloc_conf", "--check expandable_segments:True --json")
    data = json.loads(capsys.readouterr().out)
    assert data["action"] == "check" and data["settings"] == {"expandable_segments": "True"}
    assert "PYTORCH_CUDA_ALLOC_CONF" not in os.environ
    magic_env.run_line_magic("alloc_conf", "--keys")
    listing = capsys.readouterr().out
    bypass = next(line for line in listing.splitlines() if line.startswith("roundup_bypass"))
    assert f"torch 1.13, removed in 2.0  (not in torch {INSTALLED})" in bypass  # not "1.13-2.0"
    magic_env.run_line_magic("alloc_conf", "--json")
    shown = json.loads(capsys.readouterr().out)
    assert shown["action"] == "show" and shown["torch"]["imported"] is False


def test_magic_help_lists_the_options(magic_env):
    doc = magic_env.find_line_magic("alloc_conf").__doc__
    for option in ("--unset", "--reset", "--check", "--preset", "--save", "--forget", "--json"):
        assert option in doc


@pytest.mark.parametrize("held, problem", [
    ("foo:1", "unknown allocator key 'foo'"),
    ("max_split_size_mb:10", "max_split_size_mb=10 is out of range"),
    ("expandable_segments:true,garbage_collection_threshold:0.8,per_process_memory_fraction:x",
     "expandable_segments=true: takes True or False"),
])
def test_a_refused_setting_already_in_the_environment_is_shown_and_named(env, held, problem):
    """Set before the kernel started: showing it says what torch will refuse, and a change to
    another key names the variable instead of blaming what the user typed."""
    env["PYTORCH_CUDA_ALLOC_CONF"] = held
    shown = alloc_conf(environ=env, modules={})
    assert [w for w in shown.warnings if w.startswith(
        f"PYTORCH_CUDA_ALLOC_CONF holds what the installed torch {INSTALLED} refuses")] and \
        problem in " ".join(str(shown).split()) and "unset='KEY' or reset=True" in " ".join(str(shown).split())
    with pytest.raises(AllocConfError, match=r"^PYTORCH_CUDA_ALLOC_CONF already holds what the installed "
                                             + re.escape(f"torch {INSTALLED} refuses ({problem}")):
        alloc_conf(["roundup_power2_divisions=4"], environ=env, modules={})
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == held
    if "foo" in held:  # the advice works for a key torch does not know, too
        assert alloc_conf(unset="foo", environ=env, modules={}).warnings == ()
        assert "PYTORCH_CUDA_ALLOC_CONF" not in env
    fixed = alloc_conf(["roundup_power2_divisions=4"], reset=True, environ=env, modules={})
    assert fixed.warnings == ()


def test_a_change_to_the_segment_size_names_the_split_size_it_leaves_refused(env):
    """From 2.11 the split sizes follow large_segment_size_mb. A kept split size was judged
    alone: unsetting the segment size under max_split_size_mb:15 said the variable "already
    holds" what torch refuses (it held an accepted setting), and setting large_segment_size_mb=12
    under a held max_split_size_mb:15, the fix that error names, was refused the same way."""
    env["PYTORCH_CUDA_ALLOC_CONF"] = held = "large_segment_size_mb:12,max_split_size_mb:15"
    with pytest.raises(AllocConfError) as error:
        alloc_conf(unset="large_segment_size_mb", environ=env, modules={})
    assert str(error.value).startswith(
        "unsetting large_segment_size_mb (default 20) leaves max_split_size_mb=15, which torch then "
        "refuses (max_split_size_mb=15 is out of range: must be >= 20")
    assert str(error.value).endswith(
        "unset max_split_size_mb too (unset='large_segment_size_mb,max_split_size_mb') or raise it to "
        "20 or more (max_split_size_mb=20); nothing was changed")
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == held
    with pytest.raises(AllocConfError, match=r"^large_segment_size_mb=30 leaves max_split_size_mb=15, "
                                             r".*unset max_split_size_mb too \(unset='max_split_size_mb'\) "
                                             r"or raise it to 30 or more"):
        alloc_conf(["large_segment_size_mb=30"], environ=env, modules={})
    assert alloc_conf(unset="large_segment_size_mb,max_split_size_mb", environ=env, modules={}).settings == ()
    env["PYTORCH_CUDA_ALLOC_CONF"] = "max_split_size_mb:15"
    fixed = alloc_conf(["large_segment_size_mb=12"], environ=env, modules={})
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:15,large_segment_size_mb:12"
    assert fixed.warnings == ()


def test_a_variable_set_by_hand_in_key_value_form_is_not_shown_as_in_effect(magic_env, capsys):
    """torch's parser splits only at , : [ ] and refuses 'expandable_segments=True' when CUDA
    starts; the show said the setting was in effect. The fix it names is torch's form."""
    magic_env.run_line_magic("env", "PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb=128,expandable_segments=True")
    magic_env.run_line_magic("config", "GPUMagics.output = 'text'")
    try:
        magic_env.run_line_magic("alloc_conf", "")
        out = " ".join(capsys.readouterr().out.split())
        assert ("PYTORCH_CUDA_ALLOC_CONF holds 'max_split_size_mb=128,expandable_segments=True' in "
                "the key=value form, which torch refuses (it reads only key:value,key:value): "
                "%alloc_conf max_split_size_mb:128,expandable_segments:True rewrites it") in out
        magic_env.run_line_magic("alloc_conf", "max_split_size_mb:128,expandable_segments:True")
        magic_env.run_line_magic("alloc_conf", "")
    finally:
        magic_env.run_line_magic("config", "GPUMagics.output = 'auto'")
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:128,expandable_segments:True"
    assert "key=value form" not in capsys.readouterr().out


def test_unset_takes_keys_separated_by_commas(magic_env):
    """torch separates keys with commas; the list was taken for one unknown key, with a
    suggestion naming only one of them."""
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = \
        "max_split_size_mb:128,expandable_segments:True,garbage_collection_threshold:0.6"
    magic_env.run_line_magic("alloc_conf", "--unset max_split_size_mb,expandable_segments --json")
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == os.environ["PYTORCH_ALLOC_CONF"] == \
        "garbage_collection_threshold:0.6"
    with pytest.raises(UsageError, match=r"^unknown allocator key 'nosuch' \("):
        magic_env.run_line_magic("alloc_conf", "--unset nosuch,garbage_collection_threshold")
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "garbage_collection_threshold:0.6"


def test_a_key_repeated_in_the_environment_is_replaced_by_setting_it(env):
    env["PYTORCH_CUDA_ALLOC_CONF"] = "max_split_size_mb:128,expandable_segments:True,max_split_size_mb:256"
    assert "max_split_size_mb is given twice" in alloc_conf(environ=env, modules={}).warnings[0]
    alloc_conf(["max_split_size_mb=64"], environ=env, modules={})
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:64,expandable_segments:True"


@pytest.mark.parametrize("line", [
    "max_split_size_mb = 128 expandable_segments = True",
    "max_split_size_mb: 128, expandable_segments: True",
    "max_split_size_mb :128 expandable_segments= True",
])
def test_magic_reads_a_setting_the_shell_split_at_its_spaces(magic_env, line):
    """torch ignores the spaces around ':' and ','; so does %alloc_conf, though the line is
    split into arguments at them."""
    magic_env.run_line_magic("alloc_conf", line + " --json")
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:128,expandable_segments:True"
    magic_env.run_line_magic("alloc_conf", "roundup_power2_divisions:[256:1, 512:2, >:4] --json")
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"].endswith(
        ",roundup_power2_divisions:[256:1,512:2,>:4]")


def test_the_readmes_example_lines_work_pasted_with_their_comments(magic_env, capsys):
    """The README writes `%alloc_conf ...   # why` lines; pasted into a cell, each was a
    UsageError ("malformed setting '#'", or "no closing quotation" for "torch's")."""
    from conftest import ROOT

    section = (ROOT / "README.md").read_text().split("## `%alloc_conf`", 1)[1]
    lines = [line for line in section.split("```python", 1)[1].split("```", 1)[0].splitlines()
             if line.startswith("%alloc_conf")]
    assert len(lines) == 4 and sum("  # " in line for line in lines) == 3
    for line in lines:
        magic, _, rest = line.partition(" ")
        magic_env.run_line_magic(magic[1:], rest + " --json")
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == \
        "max_split_size_mb:128,expandable_segments:True,roundup_power2_divisions:[256:1,512:2,>:4]"
    # a '#' inside a word or quotes is no comment
    with pytest.raises(UsageError, match="max_split_size_mb=128#5: takes a whole number"):
        magic_env.run_line_magic("alloc_conf", "max_split_size_mb=128#5")
    with pytest.raises(UsageError, match="put a ',' before '#x'"):
        magic_env.run_line_magic("alloc_conf", "--check 'expandable_segments:True #x'  # why")


def test_once_cuda_runs_a_torch_without_a_runtime_setter_changes_nothing_and_says_so(env):
    """A torch with no run-time settings call read the setting when CUDA started: the report said
    'changed ... applied through: environment' for a setting that never reached torch, and the
    environment no longer said what the process runs with."""
    import types

    from IPython.lib.pretty import pretty

    old = _torch("2.0.1+cu118")
    env["PYTORCH_CUDA_ALLOC_CONF"] = env["PYTORCH_ALLOC_CONF"] = "garbage_collection_threshold:0.6"
    started = TorchState(imported=True, version="2.0.1+cu118", cuda_version="11.8", cuda_initialized=True)
    before = dict(env)
    result = alloc_conf(["max_split_size_mb=128"], unset=["garbage_collection_threshold"], environ=env,
                        modules=old, state=started)
    assert env == before and not result.changed and result.applied_via == ("environment",)
    assert [name for name, _ in result.deferred] == ["garbage_collection_threshold", "max_split_size_mb"]
    text = " ".join(pretty(result).split())
    assert text.startswith("Allocator configuration unchanged: garbage_collection_threshold:0.6")
    assert ("max_split_size_mb: the installed torch has no run-time settings call: it read its "
            "allocator settings once, when CUDA started") in text
    saved = alloc_conf(["max_split_size_mb=128"], save=True, environ=env, modules=old, state=started)
    assert saved.saved == "garbage_collection_threshold:0.6,max_split_size_mb:128" and env == before
    # ROCm builds up to 2.9 have the call (torch.version.cuda is None there, hip is set)
    calls = []
    rocm = _torch("2.5.1+rocm6.2")
    rocm["torch"].version = types.SimpleNamespace(cuda=None, hip="6.2")
    rocm["torch"].cuda = types.SimpleNamespace(memory=types.SimpleNamespace(_set_allocator_settings=calls.append))
    applied = alloc_conf(["max_split_size_mb=256"], environ=env, modules=rocm, state=started)
    assert applied.deferred == () and calls == ["garbage_collection_threshold:0.6,max_split_size_mb:256"]
    assert applied.applied_via == ("environment", "torch.cuda.memory._set_allocator_settings")


def test_a_saved_file_hand_edited_in_windows_notepad_applies_at_load(env):
    """Notepad saves UTF-8 with a byte order mark first: %load_ext said "unknown allocator key
    '\\ufeffexpandable_segments' (did you mean 'expandable_segments'?)" and applied nothing."""
    os.makedirs(env["COLAB_GPU_CONFIG_DIR"])
    path = os.path.join(env["COLAB_GPU_CONFIG_DIR"], "alloc_conf.txt")
    with open(path, "w", encoding="utf-8-sig", newline="\r\n") as file:
        file.write("expandable_segments:True\n")
    message = apply_saved(environ=env, modules={}, state=NOT_IMPORTED)
    assert message.startswith("colab_gpu: applied the saved allocator setting 'expandable_segments:True'")
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert alloc_conf(environ=env, modules={}).saved == "expandable_segments:True"


def test_a_saved_file_that_is_not_utf8_is_one_line_at_load_and_the_extension_loads_whole(
        ipython, clean_env, tmp_path, capsys):
    """A hand-edited alloc_conf.txt with a Latin-1 byte made %load_ext colab_gpu end in a
    UnicodeDecodeError traceback with the magics registered but the extension "not loaded"
    (%unload_ext could not remove them), and %alloc_conf failed the same way."""
    import sys

    clean_env.delitem(sys.modules, "torch", raising=False)
    clean_env.setenv("COLAB_GPU_CONFIG_DIR", str(tmp_path))
    (tmp_path / "alloc_conf.txt").write_bytes(b"expandable_segments:True # f\xfcr Fragmente\n")
    result = ipython.run_cell("%load_ext colab_gpu")
    try:
        assert result.success
        assert "colab_gpu" in ipython.extension_manager.loaded
        out = capsys.readouterr().out
        assert out.startswith(f"colab_gpu: saved allocator setting from {tmp_path / 'alloc_conf.txt'} not applied:")
        assert out.count("\n") == 1 and "(%alloc_conf --forget removes it)" in out
        assert "PYTORCH_CUDA_ALLOC_CONF" not in os.environ
        assert ipython.run_cell("%alloc_conf --forget").success
        assert not (tmp_path / "alloc_conf.txt").exists()
    finally:
        ipython.run_line_magic("unload_ext", "colab_gpu")
    assert "gpu_status" not in ipython.magics_manager.magics["line"]
