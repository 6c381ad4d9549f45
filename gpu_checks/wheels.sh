#!/usr/bin/env bash
# Download, HERE (a machine that reaches PyPI), the wheels the GPU checks need and the GPU
# machine lacks, into .whl/ at the repository's root (ignored by git):
#
#     bash gpu_checks/wheels.sh
#
# The lent GPU machine (nvidia-h200: Python 3.12, torch 2.11+cu130, no network) has torch,
# numpy, matplotlib, pygments, psutil and nvidia-ml-py, but no IPython, which every check but
# live_monitor and alloc_conf starts (a real IPython shell). run_all.sh installs .whl/*.whl
# there into a temporary folder when `import IPython` fails; the device call must name .whl
# in `carry`. All of these are pure-Python wheels, about 4 MiB together. The versions are the
# ones the "latest" test environment (scripts/test.sh latest) had when this was written.
set -eu
cd "$(dirname "$0")/.."
python="${PYTHON:-python3}"
mkdir -p .whl
"$python" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux2014_x86_64 --platform any -d .whl \
    ipython==9.18.1 ipython-pygments-lexers==1.1.1 traitlets==5.16.1 jedi==0.20.1 parso==0.8.7 \
    prompt_toolkit==3.0.53 wcwidth==0.9.4 pexpect==4.9.0 ptyprocess==0.7.0 matplotlib-inline==0.2.2 \
    stack_data==0.6.3 executing==2.3.0 asttokens==3.0.2 pure_eval==0.2.4
ls .whl
