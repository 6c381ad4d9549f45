#!/usr/bin/env bash
# Install colab_gpu on a fresh machine and open IPython with it loaded and %gpu_status shown.
#   bash scripts/run.sh                    # the live GPUs (or why there are none)
#   bash scripts/run.sh --from FILE        # a saved nvidia-smi recording instead
set -euo pipefail
caller=$PWD  # --from FILE is relative to where the command was typed
cd "$(dirname "$0")/.."
venv=$PWD/.venv/app
[[ -x $venv/bin/python ]] || "${PYTHON:-python3}" -m venv "$venv"
# torch's CPU build first where no torch is installed: the project's range is then satisfied
# without a multi-GB CUDA download (on a GPU machine, install the CUDA build you want first).
# PyPI's Linux torch is the CUDA build: the CPU build comes from PyTorch's own index, and
# torch's dependencies from PyPI with the project's.
"$venv/bin/python" -c 'import torch' 2>/dev/null \
    || "$venv/bin/python" -m pip install -q --no-deps --index-url https://download.pytorch.org/whl/cpu torch==2.13.0
"$venv/bin/python" -m pip install -q -e .
cd "$caller"
# Each argument quoted as the magic reads it, so a path with spaces stays one argument.
args=$("$venv/bin/python" -c 'import shlex, sys; print(shlex.join(sys.argv[1:]))' "$@")
exec "$venv/bin/ipython" -i -c "%load_ext colab_gpu
%gpu_status $args"
