"""%gpu_status in a real IPython shell, on this real machine without a GPU."""
import json
import os
import sys

import pytest
from IPython.core.error import UsageError

import colab_gpu
from conftest import DATA


def test_load_twice_is_harmless_and_unload_removes_every_magic(ipython):
    before = {kind: set(table) for kind, table in ipython.magics_manager.magics.items()}
    ipython.run_line_magic("load_ext", "colab_gpu")
    first = ipython.magics_manager.registry["GPUMagics"]
    colab_gpu.load_ipython_extension(ipython)  # a direct second load, bypassing %load_ext's guard
    assert ipython.magics_manager.registry["GPUMagics"] is first
    assert "gpu_status" in ipython.magics_manager.magics["line"]
    ipython.run_line_magic("unload_ext", "colab_gpu")
    after = {kind: set(table) for kind, table in ipython.magics_manager.magics.items()}
    assert after == before
    assert "GPUMagics" not in ipython.magics_manager.registry


def test_a_refused_setting_does_not_stop_the_extension_loading_again(shell, capsys):
    """%config merges even a value GPUMagics refused into the shell's config; %reload_ext failed on it."""
    try:
        shell.run_line_magic("config", "GPUMagics.live_interval = -5")
        shell.run_line_magic("config", "GPUMagics.live_lines = 3")
        shell.run_line_magic("reload_ext", "colab_gpu")
        magics = shell.magics_manager.registry["GPUMagics"]
        assert (magics.live_interval, magics.live_lines) == (1.0, 3)  # the valid setting is kept
        assert "gpu_status" in shell.magics_manager.magics["line"]
        assert capsys.readouterr().err == (
            "colab_gpu: ignored a setting: GPUMagics.live_interval must be a number of seconds from "
            "0.1 (NVML's counters change every 1/6 s to 1 s) to 3600 (an hour), e.g. 1 or 0.5; not -5\n")
    finally:
        shell.run_line_magic("config", "GPUMagics.live_interval = 1.0")
        shell.run_line_magic("config", "GPUMagics.live_lines = 0")


def test_config_knows_one_gpumagics_however_often_the_extension_was_reloaded(ipython, caplog, capsys):
    """Each load left its GPUMagics among the shell's configurables: after two %reload_ext,
    `%config` listed GPUMagics three times and a refused value logged its error three times;
    after %unload_ext, `%config GPUMagics` still showed the unloaded instance's settings."""
    ipython.run_line_magic("load_ext", "colab_gpu")
    try:
        ipython.run_line_magic("reload_ext", "colab_gpu")
        ipython.run_line_magic("reload_ext", "colab_gpu")
        capsys.readouterr()
        ipython.run_line_magic("config", "")
        assert capsys.readouterr().out.split().count("GPUMagics") == 1
        ipython.run_line_magic("config", "GPUMagics.live_lines = -1")
        assert caplog.text.count("live_lines") == 1
    finally:
        ipython.run_line_magic("config", "GPUMagics.live_lines = 0")  # %config keeps even a refused value
        ipython.run_line_magic("unload_ext", "colab_gpu")
    capsys.readouterr()
    ipython.run_line_magic("config", "")
    assert "GPUMagics" not in capsys.readouterr().out


def test_settings_given_on_the_ipython_command_line_are_kept(tmp_path):
    """`ipython --ext colab_gpu --GPUMagics.live_interval=0.5` hands the value over as a string
    for traitlets to convert: it was refused ("ignored a setting: ... expected a float, not the
    DeferredConfigString") and the default kept. A value wrong as such is still refused."""
    import subprocess

    from conftest import ROOT

    code = ("m = get_ipython().magics_manager.registry['GPUMagics']; "
            "print('SETTINGS', m.live_interval, m.live_lines, m.live_display, m.live_history)")
    run = subprocess.run([sys.executable, "-m", "IPython", "--no-banner", "--ext", "colab_gpu",
                          "--GPUMagics.live_interval=0.5", "--GPUMagics.live_lines=3",
                          "--GPUMagics.live_display=terminal", "--GPUMagics.live_history=0", "-c", code],
                         capture_output=True, text=True, cwd=ROOT, timeout=120,
                         env=dict(os.environ, IPYTHONDIR=str(tmp_path), PYTHONPATH=str(ROOT)))
    assert "SETTINGS 0.5 3 terminal 3600" in run.stdout, run.stdout + run.stderr
    assert [line for line in (run.stdout + run.stderr).splitlines() if "ignored" in line] == [
        "colab_gpu: ignored a setting: The value of the 'live_history' trait of a GPUMagics instance "
        "should not be less than 1, but a value of 0 was specified"]


def test_a_setting_given_twice_on_the_command_line_is_one_line_and_the_extension_loads(tmp_path):
    """`ipython --ext colab_gpu --GPUMagics.live_lines=5 --GPUMagics.live_lines=10` (an alias plus
    the user's own): traitlets' ValueError escaped the check of the settings, so the extension
    failed to load with a traceback and every magic was missing."""
    import subprocess

    from conftest import ROOT

    code = "print('LOADED', 'gpu_status' in get_ipython().magics_manager.magics['line'])"
    run = subprocess.run([sys.executable, "-m", "IPython", "--no-banner", "--ext", "colab_gpu",
                          "--GPUMagics.live_lines=5", "--GPUMagics.live_lines=10", "-c", code],
                         capture_output=True, text=True, cwd=ROOT, timeout=120,
                         env=dict(os.environ, IPYTHONDIR=str(tmp_path), PYTHONPATH=str(ROOT)))
    assert "LOADED True" in run.stdout, run.stdout + run.stderr
    assert "Traceback" not in run.stderr + run.stdout
    assert [line for line in (run.stdout + run.stderr).splitlines() if "ignored" in line] == [
        "colab_gpu: ignored a setting: live_lines only accepts one value, got 2: ['5', '10']"]


def test_loading_without_an_ipython_shell_says_what_to_do_instead():
    """`colab_gpu.load_ipython_extension(get_ipython())` in a plain `python` script passes None:
    it failed with "'NoneType' object has no attribute 'magics_manager'"."""
    import pytest

    for function in (colab_gpu.load_ipython_extension, colab_gpu.unload_ipython_extension):
        with pytest.raises(TypeError) as error:
            function(None)
        assert str(error.value).startswith(f"colab_gpu.{function.__name__}() takes the running IPython "
                                           f"shell (get_ipython()), not None: in IPython or a notebook "
                                           f"run %load_ext colab_gpu; without IPython call colab_gpu.status()")


def test_help_lists_the_options(shell):
    doc = shell.find_line_magic("gpu_status").__doc__
    assert "--json" in doc and "--from" in doc and "NVML" in doc


def test_loading_imports_neither_torch_nor_matplotlib_nor_ipywidgets():
    import subprocess

    from conftest import ROOT

    # Compared with what the shell itself had imported: IPython's test shell may import matplotlib.
    code = ("import sys; from IPython.testing.globalipapp import start_ipython; ip = start_ipython(); "
            "before = set(sys.modules); ip.run_line_magic('load_ext', 'colab_gpu'); "
            "print('IMPORTED', sorted(m for m in set(sys.modules) - before if m.split('.')[0] in "
            "('torch', 'matplotlib', 'ipywidgets')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert "IMPORTED []" in out.stdout


def test_status_without_a_gpu_says_why(shell, clean_env, capsys):
    result = shell.run_cell("%gpu_status")
    out = capsys.readouterr().out
    assert result.success
    assert "No NVIDIA GPU found" in out
    assert "libnvidia-ml.so" in out or "pynvml" in out  # the real pynvml, the real missing library
    why = next(line for line in out.splitlines() if line.startswith("No GPU read: "))[len("No GPU read: "):]
    assert out.count(why) == 1  # said once, not again in the advice


def test_gpu_status_leaves_cuda_uninitialized(shell, capsys):
    import torch

    shell.run_cell("import torch\n%gpu_status")
    assert "torch 2." in capsys.readouterr().out
    assert torch.cuda.is_initialized() is False


def test_json_is_machine_readable(shell, clean_env, capsys):
    shell.run_cell("%gpu_status --json")
    data = json.loads(capsys.readouterr().out)
    assert data["runtime"]["platform"] == "terminal"
    assert data["snapshot"]["gpus"] == []
    assert any(advice["rule"] == "no_gpu_found" for advice in data["advice"])


def test_unknown_option_is_a_one_line_usage_error(shell, capsys):
    result = shell.run_cell("%gpu_status --bogus")
    assert isinstance(result.error_in_exec, UsageError)
    out = capsys.readouterr()
    text = out.out + out.err
    assert "Traceback" not in text
    assert "unrecognized arguments: --bogus" in text


def test_quoted_values_mean_what_a_shell_would(shell, capsys):
    """Quotes are shell quoting, as users type them, not part of the value."""
    shell.run_line_magic("alloc_conf", "--check 'max_split_size_mb:128' --json")
    assert json.loads(capsys.readouterr().out)["settings"] == {"max_split_size_mb": "128"}
    shell.user_ns["doomed"] = 1
    shell.run_line_magic("clear_cache", '"doomed" --quiet')
    assert "doomed" not in shell.user_ns
    result = shell.run_cell('%alloc_conf --check "max_split_size_mb:128')
    assert isinstance(result.error_in_exec, UsageError)
    assert "no closing quotation" in str(result.error_in_exec)


def test_output_is_configurable_with_config(shell, capsys):
    shell.run_cell("%config GPUMagics.output = 'text'")
    try:
        assert shell.magics_manager.registry["GPUMagics"].output == "text"
        shell.run_cell("%gpu_status")
        assert "No NVIDIA GPU found" in capsys.readouterr().out
    finally:
        shell.run_cell("%config GPUMagics.output = 'auto'")


def test_output_offers_only_choices_that_change_something(shell, caplog, capsys):
    """'html' behaved exactly like 'auto', which already shows the HTML card where one can be drawn."""
    try:
        shell.run_line_magic("config", "GPUMagics.output = 'html'")
        assert "expected any of ['auto', 'text']" in caplog.text  # %config's own one-line error
        assert shell.magics_manager.registry["GPUMagics"].output == "auto"
    finally:  # IPython keeps even a refused value in the shell's config
        shell.run_line_magic("config", "GPUMagics.output = 'auto'")
    shell.run_line_magic("config", "GPUMagics")
    assert "notebooks (Jupyter, Colab, VS Code) show the HTML card" in " ".join(capsys.readouterr().out.split())


def test_python_api_returns_the_same_data():
    status = colab_gpu.status()
    assert isinstance(status, colab_gpu.Status)
    assert repr(status).startswith("<Status ")
    assert "No GPU read" in status._repr_html_() or "No GPU found" in status._repr_html_()
    recorded = colab_gpu.status(DATA / "nvidia-smi-xml" / "tesla-t4.xml")  # a path, first
    assert [gpu.name for gpu in recorded.snapshot.gpus] == ["Tesla T4"]
    # print() in a script shows the card the magic prints, not the one-line repr.
    assert "GPU 0  Tesla T4  (cuda:0, compute capability 7.5)" in str(recorded)


def test_sizes_keep_three_digits_below_100_units():
    """4,000,000 B was shown as '4 MiB'; round sizes read as before."""
    from colab_gpu.render import size

    shown = [size(n) for n in (4_000_000, 19.9 * 2 ** 20, 1 * 2 ** 20, 388 * 2 ** 20, 1536, 1000, 32 * 2 ** 30)]
    assert shown == ["3.81 MiB", "19.9 MiB", "1 MiB", "388 MiB", "1.5 KiB", "1000 B", "32.00 GiB"]


@pytest.mark.parametrize("mps", [True, False, "not imported"], ids=["mps", "no-mps", "torch-not-imported"])
def test_a_mac_is_told_of_its_gpu_through_mps(shell, clean_env, capsys, monkeypatch, mps):
    """On a Mac the advice said "No NVIDIA GPU found: torch will run on the CPU", and the card
    "CPU-only build", where torch.backends.mps.is_available() says torch runs on the Mac's GPU."""
    import torch

    monkeypatch.setattr(sys, "platform", "darwin")
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: mps is True)
    monkeypatch.setattr(torch.version, "cuda", None)  # a Mac's torch, whichever build tests run with
    if mps == "not imported":
        monkeypatch.delitem(sys.modules, "torch")  # and the magic must not import it to ask
    assert shell.run_cell("%gpu_status").success
    out = " ".join(capsys.readouterr().out.split())  # the advice is folded at 80 columns
    assert "NVML does not run on macOS" in out
    if mps is False:
        assert "torch will run on the CPU" in out and "mps" not in out and "(CPU-only build)" in out
        return
    assert "torch will run on the CPU" not in out and "CPU-only" not in out
    assert "torch runs on its GPU with model.to('mps')" in out
    assert ("torch.backends.mps.is_available()" in out) is (mps != True)
    assert ("(MPS: the Mac's GPU)" in out) is (mps is True)
    assert ("torch" in sys.modules) is (mps != "not imported")
