#!/usr/bin/env bash
# cuda_check.sh: every CUDA C file the project holds (*.cu under src/, bench/, tests/, examples/)
# compiles with nvcc (make cuda-check; scripts/gpu_check.sh runs it first). Compiling is all it checks:
# it runs nothing, so it works on a machine without a GPU.
#
# Today the project holds no CUDA C (the engine is C on CPUs; bytescale.torch's GPU paths are
# PyTorch's): then it says so plainly and exits 0, having compiled nothing. Without nvcc it says that
# it checked nothing and exits 77 (skipped), so that no one reads a pass into it.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
NVCC=${NVCC:-nvcc}
mapfile -t files < <(cd "$ROOT" && find src bench tests examples -name '*.cu' 2>/dev/null | sort)
if [ "${#files[@]}" = 0 ]; then
  echo "cuda_check.sh: the project holds no CUDA C (no *.cu under src/ bench/ tests/ examples/): nvcc compiled nothing"
  exit 0
fi
if ! command -v "$NVCC" >/dev/null 2>&1; then
  echo "cuda_check.sh: NOTHING CHECKED: nvcc not found (NVCC=...), ${#files[@]} CUDA C file(s) left uncompiled" >&2
  exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "cuda_check.sh: $("$NVCC" --version | tail -1)"
fail=0
for f in "${files[@]}"; do
  if "$NVCC" -std=c++17 -I"$ROOT/include" -I"$ROOT/src" -c "$ROOT/$f" -o "$tmp/$(basename "$f").o"; then
    echo "  compiled $f"
  else
    echo "  FAILED  $f" >&2
    fail=1
  fi
done
echo "cuda_check.sh: ${#files[@]} CUDA C file(s), $([ $fail = 0 ] && echo all compiled || echo SOME FAILED)"
exit $fail
