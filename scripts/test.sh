#!/usr/bin/env bash
# Install everything the tests need on a fresh machine and run them at both ends of what
# users have: Colab's pins (IPython 7.34.0, ipywidgets 7.7.1) and the newest releases.
#   bash scripts/test.sh            # both environments
#   bash scripts/test.sh latest -k status   # one environment, extra pytest arguments
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
envs=(colab latest)
if [[ $# -gt 0 && ( $1 == colab || $1 == latest ) ]]; then envs=("$1"); shift; fi

# Chromium for the live-monitor browser tests, from Debian (never a browser a tool downloads).
if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [[ $(id -u) == 0 ]]; then
    (apt-get update -qq && apt-get install -y -qq chromium >/dev/null) || echo "warning: chromium could not be installed" >&2
fi

# Colab's own interpreter and torch (googlecolab/backend-info, 2026-08): Python 3.13 and
# torch 2.11.0. PyPI has no CPU build of that torch: its wheel is the CUDA one (about 5 GB
# installed), which runs on the CPU where there is no GPU, as on Colab's CPU runtime.
colab_python() {
    local found
    for found in python3.13 "$(pyenv root 2>/dev/null)"/versions/3.13*/bin/python3.13; do
        if "$found" -c 'import venv' >/dev/null 2>&1; then echo "$found"; return; fi
    done
}

status=0
for env in "${envs[@]}"; do
    venv=.venv/$env
    python=$PYTHON torch=(--no-deps --index-url https://download.pytorch.org/whl/cpu torch==2.13.0)
    if [[ $env == colab ]]; then
        found=$(colab_python)
        if [[ -n $found ]]; then
            python=$found torch=(torch==2.11.0)
        else
            echo "warning: no Python 3.13 found: the colab environment runs on $PYTHON with torch 2.13.0+cpu, not Colab's Python 3.13 and torch 2.11" >&2
        fi
    fi
    if [[ ! -x $venv/bin/python || $("$venv/bin/python" -V 2>&1) != $("$python" -V 2>&1) ]]; then
        rm -rf "$venv" && "$python" -m venv "$venv"
    fi
    # torch first, so that the project's torch range is already satisfied and pip never pulls
    # another build. Elsewhere the CPU build: PyPI's Linux torch is the multi-GB CUDA build. It
    # comes without its dependencies, which come from PyPI with the project's: that index holds
    # torch alone for us, and where it cannot be reached (a local wheel serves) pip retries it
    # per package.
    "$venv/bin/python" -m pip install -q "${torch[@]}"
    extras=test; [[ $env == latest ]] && extras=test,browser
    "$venv/bin/python" -m pip install -q -e ".[$extras]" -c "ci/$env.txt"
    "$venv/bin/python" -m ipykernel install --sys-prefix --name python3 >/dev/null
    echo "== tests in $env: $("$venv/bin/python" -c 'import platform, IPython, ipywidgets, torch; print("Python", platform.python_version(), "IPython", IPython.__version__, "ipywidgets", ipywidgets.__version__, "torch", torch.__version__)')"
    # The checks of the code itself, configured in pyproject.toml: pyflakes, bugbear and
    # complexity (ruff), types (mypy). Both environments: mypy reads the installed packages'
    # types, and IPython 7.34 has none. A finding fails the run, as a failing test does.
    "$venv/bin/python" -m ruff check --no-cache colab_gpu tests || status=$?
    "$venv/bin/python" -m mypy --cache-dir "$venv/mypy-cache" || status=$?
    # A hang fails this environment after 40 minutes (a run takes about 8) instead of
    # using up CI's 90; pytest's faulthandler_timeout has printed where it hangs by then.
    timeout -k 60 2400 "$venv/bin/python" -m pytest -q -p no:cacheprovider "$@" || status=$?
done
exit $status
