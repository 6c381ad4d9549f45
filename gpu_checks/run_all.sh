#!/usr/bin/env bash
# Run every GPU check in one go, each under its own time limit, and keep what each printed.
#
#     bash gpu_checks/run_all.sh [OUTPUT_DIR [CHECK ...]]
#
# CHECK names some of them (gpu_status find_batch alloc_conf clear_cache live_monitor oom_doctor tune_loader launch
# multi_gpu plan_batch) to
# rerun.
# One log per check lands in OUTPUT_DIR (default gpu_checks/out), with the GPU's own
# `nvidia-smi -q -x` record beside them (a new replay file for colab_gpu/data, should the GPU
# be one we have none of). Exit status: 0 when every check passed, 1 when one failed or ran
# out of time, 2 when this machine has no GPU (nothing was checked), 3 when IPython is missing
# and cannot be installed (see below).
#
# On the lent GPU machine (15 minutes of device time a session, the machine's start and every
# rerun included; 10 minutes a command), from the repository's root, with .whl carried:
#
#     bash gpu_checks/run_all.sh $OUT find_batch gpu_status clear_cache      (timeout_s 420)
#
# The whole run stops after GPU_CHECKS_SECONDS (default 360): a check gets its own limit or
# what is left, whichever is less, so one that hangs cannot eat the time a rerun needs.
set -u
cd "$(dirname "$0")/.."
out="${1:-gpu_checks/out}"
mkdir -p "$out"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
python="${PYTHON:-python3}"

# The lent GPU machine has torch with CUDA in its python3 (/opt/torch/.venv) but no IPython, and
# no network: the wheels gpu_checks/wheels.sh downloaded here travel in .whl (name it in the
# device call's `carry`) and go into a temporary folder. Without them every check that starts
# an IPython shell would stop at its first line with "No module named 'IPython'".
if ! "$python" -c "import IPython" 2>/dev/null; then
    if ! ls .whl/*.whl >/dev/null 2>&1; then
        echo "IPython is not installed for $python and there is no .whl/ to install it from: run" \
             "bash gpu_checks/wheels.sh where pip reaches PyPI, and carry .whl" >&2
        exit 3
    fi
    site="${TMPDIR:-/tmp}/gpu_checks_site"
    "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$site" .whl/*.whl || exit 3
    export PYTHONPATH="$PYTHONPATH:$site"
fi

nvidia-smi -q -x >"$out/nvidia-smi-q-x.xml" 2>/dev/null || rm -f "$out/nvidia-smi-q-x.xml"
"$python" -c "import torch, IPython; print('torch', torch.__version__, 'CUDA', torch.version.cuda, \
'IPython', IPython.__version__)"

# name and seconds, each well above what the check should need; find_batch, the longest,
# goes second so a slow machine still runs it
checks=(gpu_status:60 find_batch:180 alloc_conf:90 clear_cache:150 live_monitor:150 oom_doctor:150 tune_loader:120 launch:120 multi_gpu:150 plan_batch:240)
budget="${GPU_CHECKS_SECONDS:-360}"
shift $(($# > 0))
status=0
for check in "${checks[@]}"; do
    name="${check%%:*}" seconds="${check##*:}"
    if [ $# -gt 0 ] && [[ " $* " != *" $name "* ]]; then continue; fi
    left=$((budget - SECONDS - 10))  # 10: timeout's --kill-after
    if [ "$left" -lt 20 ]; then
        echo "=== $name: not run, ${GPU_CHECKS_SECONDS:-360} s of GPU_CHECKS_SECONDS spent" | tee "$out/$name.log"
        status=1
        continue
    fi
    if [ "$seconds" -gt "$left" ]; then seconds=$left; fi
    echo "=== $name (at most $seconds s)"
    started=$SECONDS
    timeout --kill-after=10 "$seconds" "$python" "gpu_checks/$name.py" 2>&1 | tee "$out/$name.log"
    code=${PIPESTATUS[0]}
    echo "=== $name: exit $code in $((SECONDS - started)) s" | tee -a "$out/$name.log"
    if [ "$code" = 2 ]; then exit 2; fi
    if [ "$code" != 0 ]; then status=1; fi
done
exit $status
