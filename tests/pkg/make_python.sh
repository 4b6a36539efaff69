#!/usr/bin/env bash
# make_python.sh: `make python` exactly as docs/python.md gives it (ctest pkg/make_python).
#
#   tests/pkg/make_python.sh SOURCE_DIR BUILD_DIR [PYTHON]
#
# In a copy of the checkout's Makefile and python/ (pip builds in the package's source tree, and the
# venv goes to .venv beside the Makefile: a copy keeps the checkout clean), `make python` with the
# defaults the documentation relies on: PYSRC=python (a relative path, which pip once read as the
# name of a package to download), VENV=.venv. Only BUILD names this build (the copy has none of its
# own) and PYTHON is passed only when it is not the default /usr/bin/python3. Then the venv's
# interpreter, from another directory and with no BYTESCALE_LIB or PYTHONPATH, imports the package
# from .venv with the library pip copied in, and plans a batch.
set -euo pipefail
src=$(cd "$1" && pwd)
build=$(cd "$2" && pwd)
python=${3:-/usr/bin/python3}
work=$(mktemp -d "${TMPDIR:-/tmp}/bytescale-make-python.XXXXXX")
trap 'rm -rf "$work"' EXIT
fail() { echo "make_python.sh: FAIL: $*" >&2; exit 1; }

mkdir -p "$work/checkout/python"
cp "$src/Makefile" "$work/checkout/"
cp -r "$src/python/bytescale" "$src/python/setup.py" "$src/python/pyproject.toml" "$work/checkout/python/"
find "$work/checkout/python" -name __pycache__ -prune -exec rm -rf {} +
args=(python BUILD="$build" JOBS=2)
[ "$python" = /usr/bin/python3 ] || args+=(PYTHON="$python")
echo "in a copy of the checkout: make ${args[*]}"
# (a make of its own: not the jobserver of a `make test` that may have started ctest)
out=$(cd "$work/checkout" && env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL -u BYTESCALE_LIB -u PYTHONPATH \
  make --no-print-directory "${args[@]}" 2>&1) || { echo "$out"; fail "make python"; }
echo "$out" | tail -n 3
grep -q "^.venv: bytescale .* with numpy" <<<"$out" || fail "make python did not report the package"
[ -f "$work/checkout/.venv/pyvenv.cfg" ] || fail "no .venv beside the Makefile"
cd "$work"
env -u BYTESCALE_LIB -u PYTHONPATH "$work/checkout/.venv/bin/python" - "$work/checkout/.venv" <<'EOF'
import sys, bytescale
venv = sys.argv[1]
assert bytescale.__file__.startswith(venv), bytescale.__file__
assert bytescale.library_path.startswith(venv), bytescale.library_path
p = bytescale.plan([20000, 9000] + [400] * 40, ranks=4, capacity=8192)
assert sum(len(it.ranks) > 1 for it in p.items) > 0, "no ring for sequences above the capacity"
print(f"bytescale {bytescale.__version__} from {bytescale.library_path}: {p}")
EOF
echo "pkg/make_python: ok"
