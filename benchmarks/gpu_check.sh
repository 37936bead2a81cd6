#!/usr/bin/env bash
# The GPU check (see benchmarks/gpu_check.py): GPU tests, capsule votes / sgemm 4096^3 /
# softmax [8192,4096] searched on the GPU and timed next to torch, a small GPU dataset (the variants, and
# `superopt dataset collect --target cuda` for --collect-seconds, default 50 s, into OUT.collect/), one JSON file.
# Runs on a GPU machine with no network in under 8 minutes, installing nothing.
#
#   benchmarks/gpu_check.sh [OUT.json] [extra gpu_check.py options]    (default OUT: benchmarks/results/gpu_check.json)
#   PYTHON=/path/to/python benchmarks/gpu_check.sh                     (default: the repo's .venv if it has torch, else python3)
set -u
cd "$(dirname "$0")/.."
OUT="${1:-benchmarks/results/gpu_check.json}"
[ $# -gt 0 ] && shift
if [ -z "${PYTHON:-}" ]; then
    PYTHON=python3
    if [ -x .venv/bin/python ] && .venv/bin/python -c "import torch, numpy" 2>/dev/null; then PYTHON=.venv/bin/python; fi
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PATH="$PATH:/usr/local/cuda/bin"
echo "[gpu_check] python: $($PYTHON -c 'import sys; print(sys.executable, sys.version.split()[0])')"
echo "[gpu_check] nvcc: $(command -v nvcc || echo missing)"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo "[gpu_check] nvidia-smi: not available"
# the whole check is bounded: 450 s of work inside a 470 s hard limit (the JSON is rewritten after every part)
timeout -k 10 470 "$PYTHON" benchmarks/gpu_check.py "$OUT" --deadline 450 "$@"
rc=$?
echo "[gpu_check] exit code $rc; results in $OUT"
exit $rc
