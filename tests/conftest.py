"""Shared fixtures: a real IPython shell with the extension loaded, and the recordings."""
from __future__ import annotations

import os
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
DATA = pathlib.Path(__file__).resolve().parent / "data"


@pytest.fixture(scope="session", autouse=True)
def private_config_dir(tmp_path_factory):
    """Keep `%alloc_conf --save` away from the real ~/.config (kernels inherit this too)."""
    os.environ["COLAB_GPU_CONFIG_DIR"] = str(tmp_path_factory.mktemp("colab_gpu_config"))


@pytest.fixture(scope="session")
def ipython():
    """The one real IPython shell of the test session (a TerminalInteractiveShell)."""
    from IPython.testing.globalipapp import start_ipython

    return start_ipython()


@pytest.fixture
def shell(ipython):
    """The real shell with ``%load_ext colab_gpu`` run, unloaded again after the test, and the
    names the test's cells bound taken out again: the shell is shared by the whole session,
    and a tensor or name one test left behind changed what a later test's ``--vars`` counted."""
    before = set(ipython.user_ns)
    ipython.run_line_magic("load_ext", "colab_gpu")
    yield ipython
    ipython.run_line_magic("unload_ext", "colab_gpu")
    for name in set(ipython.user_ns) - before:
        del ipython.user_ns[name]


@pytest.fixture(autouse=True)
def restored_environment():
    """Put os.environ back after every test: %alloc_conf writes PYTORCH_*ALLOC_CONF for real,
    and a later test or kernel must not inherit it; nor what it gave torch's setter, which
    would make the restored variables look edited by hand."""
    from colab_gpu.state import session

    session.reset("visible_seen")  # the CUDA_VISIBLE_DEVICES seen around CUDA's start: a fresh process's
    saved = dict(os.environ)
    yield
    session.reset("given_to_torch")
    if os.environ != saved:
        os.environ.clear()
        os.environ.update(saved)


@pytest.fixture
def clean_env(monkeypatch):
    """An environment without any platform or GPU variable, as on a plain local machine."""
    for name in list(os.environ):
        if name.startswith(("COLAB_", "KAGGLE_", "BINDER_", "TPU_", "PYTORCH_", "CUDA_")) or name in ("PJRT_DEVICE", "ISTPUVM"):
            monkeypatch.delenv(name)
    return monkeypatch


@pytest.fixture
def fast_live_sampling(monkeypatch):
    """For tests that replay recordings up to a thousand samples a second, to run in
    milliseconds; a user's live.start() keeps to live.MIN_INTERVAL. The real floor, for the
    tests among them that check it, is this fixture's value (see ``live_floor``)."""
    from colab_gpu import live

    floor = live.MIN_INTERVAL
    monkeypatch.setattr(live, "MIN_INTERVAL", 0.001)
    return floor


@pytest.fixture
def live_floor(monkeypatch, fast_live_sampling):
    """The floor users get, which fast_live_sampling lowered for the other tests."""
    from colab_gpu import live

    monkeypatch.setattr(live, "MIN_INTERVAL", fast_live_sampling)
    return fast_live_sampling
