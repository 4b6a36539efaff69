#!/usr/bin/env bash
# gpu_check.sh: bytescale.torch on a machine with a GPU (docs/torch.md, "On GPUs"): names the attention
# kernel the process chose, runs the torch tests (test_torch_device.py's CUDA tests run there, the
# others as everywhere) and times the kernel on the GPU (bench/torch_hdp.py --device cuda; with 2 GPUs
# or more also the ring and the all-to-all over NCCL). First, with nvcc, it compiles every CUDA C file
# the project holds (scripts/cuda_check.sh; today there is none, and it says so).
#
# Without a GPU it checks nothing and says so in capitals, exiting 77 (the "skipped" code of automake
# and ctest's SKIP_RETURN_CODE), never 0: no one should read a pass into a run that ran nothing.
#
#   scripts/gpu_check.sh [OUT]      (default OUT=gpu-check-out: the logs; the tables also go to stdout)
#
# PYTHON: a python3 whose torch is built for CUDA (default: the first of python3, /usr/bin/python3 that
# imports torch). DTYPE (bf16), LENGTHS (4096,16384,32768), MODELS (small,base), REPEATS (5): the bench's.
# QUICK=1 runs only test_torch_device.py of the tests. ON_CPU=1 runs every step on the CPU instead
# (the bench in fp32, its kernel table only): a check of this script on a machine without a GPU.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${1:-gpu-check-out}
DTYPE=${DTYPE:-bf16}
LENGTHS=${LENGTHS:-4096,16384,32768}
MODELS=${MODELS:-small,base}
REPEATS=${REPEATS:-5}

PY=${PYTHON:-}
if [ -z "$PY" ]; then
    for p in python3 /usr/bin/python3 "$ROOT/.venv/bin/python"; do
        if command -v "$p" >/dev/null 2>&1 && "$p" -c "import torch" >/dev/null 2>&1; then PY=$p; break; fi
    done
fi
"$ROOT/scripts/cuda_check.sh" || exit 1
if [ -z "$PY" ]; then
    echo "gpu_check.sh: NOTHING CHECKED: no python3 here imports torch (set PYTHON=...)"
    exit 77
fi

DEVICE=cuda
if [ "${ON_CPU:-0}" = 1 ]; then
    DEVICE=cpu DTYPE=fp32
# a GPU: the driver sees one and torch can use it
elif ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "gpu_check.sh: NOTHING CHECKED: no GPU on this machine (nvidia-smi absent or sees none). Exit 77:"
    echo "  this is not a pass. The CPU tests (make test) cover the gloo paths; the GPU paths stay unchecked."
    exit 77
elif ! "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "gpu_check.sh: nvidia-smi sees a GPU but $PY's torch $("$PY" -c 'import torch; print(torch.__version__)')"
    echo "  cannot use it (a CPU build of torch, or a driver too old for it): NOTHING CHECKED (exit 77). Set"
    echo "  PYTHON= to a python3 with a CUDA build of torch."
    exit 77
fi

mkdir -p "$OUT"
LIB="$ROOT/build/libbytescale.so.0"
if [ ! -e "$LIB" ] || [ ! -x "$ROOT/build/bytescale" ]; then
    echo "building (make) ..." >&2
    make -C "$ROOT" -j"$(nproc)" > "$OUT/make.log" 2>&1 || { echo "gpu_check.sh: make failed, see $OUT/make.log"; exit 1; }
fi
export PYTHONPATH="$ROOT/python" BYTESCALE_LIB="$LIB" BS_BINARY="$ROOT/build/bytescale" OMP_NUM_THREADS=1 \
       OPENBLAS_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

echo "## GPU check ($DEVICE)"
[ "$DEVICE" = cuda ] && nvidia-smi -L | sed 's/^/    /'
"$PY" - <<'EOF'
import torch
import bytescale.torch.attention as a
n = torch.cuda.device_count() if torch.cuda.is_available() else 0
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {n} GPU(s)"
      + (f": {torch.cuda.get_device_name(0)}" if n else ""))
print(f"attention kernel: {a.KERNEL.name} (fused: {a.KERNEL.fused})")
EOF

status=0
echo
echo "## Tests"
if "$PY" -m pytest -q -p no:cacheprovider -rs "$ROOT/python/tests/test_torch_device.py" > "$OUT/test_torch_device.log" 2>&1; then
    echo "test_torch_device.py (the CUDA tests): $(tail -1 "$OUT/test_torch_device.log")"
else
    echo "test_torch_device.py FAILED: $(tail -1 "$OUT/test_torch_device.log") (see $OUT/test_torch_device.log)"
    status=1
fi
if [ "${QUICK:-0}" != 1 ]; then
    if "$PY" -m pytest -q -p no:cacheprovider "$ROOT"/python/tests/test_torch_*.py > "$OUT/test_torch.log" 2>&1; then
        echo "test_torch_*.py: $(tail -1 "$OUT/test_torch.log")"
    else
        echo "test_torch_*.py FAILED: $(tail -1 "$OUT/test_torch.log") (see $OUT/test_torch.log)"
        status=1
    fi
fi

echo
echo "## Timing"
sections=kernel
if [ "$DEVICE" = cuda ] && [ "$("$PY" -c 'import torch; print(torch.cuda.device_count())')" -ge 2 ]; then
    sections=kernel,overlap,a2a
fi
if "$PY" "$ROOT/bench/torch_hdp.py" --device "$DEVICE" --dtype "$DTYPE" --sections "$sections" --lengths "$LENGTHS" \
        --overlap-models "$MODELS" --repeats "$REPEATS" > "$OUT/bench.md" 2> "$OUT/bench.err"; then
    cat "$OUT/bench.md"
else
    echo "bench/torch_hdp.py FAILED (see $OUT/bench.err):"
    tail -5 "$OUT/bench.err"
    status=1
fi
exit $status
