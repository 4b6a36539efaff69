#!/usr/bin/env bash
# install.sh: the installed library as its users get it (ctest pkg/install; README.md, "Using the library").
#
#   tests/pkg/install.sh SOURCE_DIR BUILD_DIR PYTHON
#
# 1. `make install PREFIX=<temporary prefix>` from the build: the shared library with its SONAME, the
#    static library, the public headers (and none of the internal ones), bytescale.pc, the CMake package
# 2. every installed header compiles on its own; the shared library exports exactly the functions
#    the installed headers declare (nothing internal: no make_dirs, no now_seconds)
# 3. examples/plan_example.c built with pkg-config and with CMake (find_package, shared and static)
#    against the prefix, and run
# 4. the Python package installed into a fresh environment the documented way, in a copy of the checkout
#    (`make python`: .venv made by Debian's interpreter whatever python3 is first on the PATH, holding
#    requirements.txt's pins), found there, and its tests run on it; an interpreter that cannot make a
#    venv refused (this was tests/pkg/make_python.sh too: one venv, made once, covers both)
set -euo pipefail
src=$(cd "$1" && pwd)
build=$(cd "$2" && pwd)
python=${3:-/usr/bin/python3}
work=$(mktemp -d "${TMPDIR:-/tmp}/bytescale-pkg.XXXXXX")
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix
step() { printf '\n== %s\n' "$*"; }
fail() { echo "install.sh: FAIL: $*" >&2; exit 1; }

step "make install PREFIX=$prefix"
# (a make of its own: not the jobserver of a `make test` that may have started ctest)
env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make --no-print-directory -C "$src" install BUILD="$build" PREFIX="$prefix" JOBS=2 >"$work/install.log" 2>&1 ||
  { cat "$work/install.log"; fail "make install"; }
pc=$(find "$prefix" -name bytescale.pc)
[ -n "$pc" ] || fail "no bytescale.pc under $prefix"
libdir=$(cd "$(dirname "$pc")/.." && pwd)
for f in "$libdir/libbytescale.so.0" "$libdir/libbytescale.so" "$libdir/libbytescale.a" "$prefix/bin/bytescale" \
         "$prefix/include/bytescale/bytescale.h" "$libdir/cmake/bytescale/bytescaleConfig.cmake" \
         "$libdir/cmake/bytescale/bytescaleConfigVersion.cmake"; do
  [ -e "$f" ] || fail "$f was not installed"
done
soname=$(objdump -p "$libdir/libbytescale.so" | awk '$1 == "SONAME" {print $2}')
[ "$soname" = libbytescale.so.0 ] || fail "SONAME is '$soname', not libbytescale.so.0"
for internal in fileio json timer arena progress seeds train comm sampler llama executor; do
  [ ! -e "$prefix/include/bytescale/$internal.h" ] || fail "internal header $internal.h was installed"
done
echo "installed: $(cd "$prefix" && find . -type f | sort | tr '\n' ' ')"

export PKG_CONFIG_PATH=$libdir/pkgconfig
step "pkg-config"
pkg-config --modversion bytescale
pkg-config --cflags --libs bytescale
pkg-config --static --libs bytescale >/dev/null || fail "pkg-config --static: a private requirement is missing"

step "every installed header compiles on its own"
for h in "$prefix"/include/bytescale/*.h; do
  echo "#include <bytescale/$(basename "$h")>" |
    cc -std=c17 -Wall -Wextra -Werror -fsyntax-only $(pkg-config --cflags bytescale) -x c - ||
    fail "$(basename "$h") does not compile on its own"
done

step "exported symbols = the functions the installed headers declare"
nm -D --defined-only "$libdir/libbytescale.so" | awk '$2 == "T" {print $3}' | sort >"$work/exported"
# gcc -aux-info writes every prototype it sees with the file that declares it
echo '#include <bytescale/bytescale.h>' >"$work/all.c"
cc -std=c17 -fsyntax-only -aux-info "$work/aux" $(pkg-config --cflags bytescale) "$work/all.c"
# (lines "/* <path>/include/bytescale/plan.h:66:NC */ extern int plan_init (Plan *, ...);")
grep "^/\* [^ ]*/include/bytescale/[a-z_]*\.h:" "$work/aux" | sed -E 's/^.*\*\/ *//; s/ *\(.*$//; s/.*[ *]//' |
  sort -u >"$work/declared"
if ! diff "$work/declared" "$work/exported" >"$work/diff"; then
  cat "$work/diff"
  fail "the exported functions differ from the declared ones ('<' declared, not exported; '>' exported, not declared)"
fi
nm -D --defined-only "$libdir/libbytescale.so" | awk '$2 != "T"' | grep . && fail "exported data or other symbols"
echo "$(wc -l <"$work/exported") functions exported, all declared in the installed headers"

step "examples/plan_example.c with pkg-config"
cc -std=c17 -Wall -Werror -o "$work/plan_example_pc" "$src/examples/plan_example.c" \
  $(pkg-config --cflags --libs bytescale) -Wl,-rpath,"$(pkg-config --variable=libdir bytescale)"
"$work/plan_example_pc" balance | tee "$work/pc.out"
# ldd's output kept whole, then searched: piping ldd into an early-exiting grep fails at random
# under pipefail (grep stops at its first match and ldd may then die of SIGPIPE)
libs=$(ldd "$work/plan_example_pc")
grep -q "libbytescale.so.0 => $libdir" <<<"$libs" || fail "the example did not load the installed library"

step "examples/ with CMake: find_package(bytescale), shared and static"
cmake -S "$src/examples" -B "$work/example-build" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release \
  >"$work/cmake.log" 2>&1 || { cat "$work/cmake.log"; fail "configuring examples/"; }
cmake --build "$work/example-build" -j 2 >>"$work/cmake.log" 2>&1 || { cat "$work/cmake.log"; fail "building examples/"; }
[ -x "$work/example-build/plan_example_static" ] || fail "bytescale::bytescale_static was not defined"
"$work/example-build/plan_example" balance >"$work/cmake.out"
"$work/example-build/plan_example_static" balance >"$work/static.out"
cat "$work/cmake.out"
cmp "$work/pc.out" "$work/cmake.out" && cmp "$work/pc.out" "$work/static.out" || fail "the examples print different plans"
libs=$(ldd "$work/example-build/plan_example_static")
grep -q libbytescale <<<"$libs" && fail "the static example loads libbytescale.so"
out=$("$work/example-build/plan_example" bogus 2>&1) && fail "the example accepted an unknown policy"
grep -q "unknown policy 'bogus'" <<<"$out" || fail "the example's error: $out"

step "the Python package in a fresh environment, made the documented way: make python in a copy of the checkout"
# In a copy of the Makefile, requirements.txt and python/ (pip builds in the package's source tree, and
# the venv goes to .venv beside the Makefile: a copy keeps the checkout clean), `make python` with the
# defaults the documentation relies on: PYSRC=python (a relative path, which pip once read as the name
# of a package to download), VENV=.venv, PYTHON=/usr/bin/python3. Only BUILD names this build.
mkdir -p "$work/checkout/python"
cp "$src/Makefile" "$src/requirements.txt" "$work/checkout/"
cp -r "$src/python/bytescale" "$src/python/setup.py" "$src/python/pyproject.toml" "$work/checkout/python/"
find "$work/checkout/python" -name __pycache__ -prune -exec rm -rf {} +
# The environment: where the checkout has one (`make deps` made it, from nothing, on the fresh clone
# CI runs), a copy of it to start from, so that torch's several hundred MB are not installed a second
# time: its lib/ as hard links (pip and Python only ever add or rename files there, never write into
# one), the rest copied. `make venv` then runs its whole recipe over it all the same (the copied
# requirements.txt is newer than the stamp): venv, pip install -r requirements.txt, the stamp. Without
# one, make venv makes it from nothing here.
if [ -f "$src/.venv/.requirements" ] && [ -d "$src/.venv/lib" ]; then
  mkdir -p "$work/checkout/.venv"
  for entry in "$src/.venv"/*; do
    case "$(basename "$entry")" in
      lib) cp -al "$entry" "$work/checkout/.venv/" ;;
      *) cp -a "$entry" "$work/checkout/.venv/" ;;
    esac
  done
  cp -p "$src/.venv/.requirements" "$work/checkout/.venv/"
  touch "$work/checkout/requirements.txt"
  echo "started from a copy of $src/.venv (lib/ hard-linked)"
fi
# Whatever python3 comes first on the PATH must not matter (pyenv's, say): here the first one is a
# decoy that fails if anything runs it.
mkdir -p "$work/decoy"
printf '#!/bin/sh\necho "the python3 first on the PATH ($0) was run: make python must use PYTHON" >&2\nexit 97\n' \
  >"$work/decoy/python3"
chmod +x "$work/decoy/python3"
ln -s python3 "$work/decoy/python"
args=(python BUILD="$build" JOBS=2)
[ "$python" = /usr/bin/python3 ] || args+=(PYTHON="$python")
echo "in a copy of the checkout: make ${args[*]}"
# (a make of its own: not the jobserver of a `make test` that may have started ctest)
out=$(cd "$work/checkout" && env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL -u BYTESCALE_LIB -u PYTHONPATH \
  PATH="$work/decoy:$PATH" make --no-print-directory "${args[@]}" 2>&1) || { echo "$out"; fail "make python"; }
echo "$out" | grep -v "Location 'file" | tail -n 3
grep -q "^.venv: torch 2\.13\.0" <<<"$out" || fail "make venv did not report torch 2.13.0 in .venv"
grep -q "^.venv: bytescale .* with numpy" <<<"$out" || fail "make python did not report the package"
venv=$work/checkout/.venv
grep -q "^home = $(dirname "$python")\$" "$venv/pyvenv.cfg" || fail "the venv was not made with $python"
grep -q "include-system-site-packages = false" "$venv/pyvenv.cfg" || fail "the venv sees the system's packages"
cmp -s "$src/requirements.txt" "$venv/.requirements" || fail "the venv does not record the requirements it holds"
# the environment holds exactly the pins of requirements.txt, each at its version
"$venv/bin/python" - "$src/requirements.txt" <<'EOF' || fail "the venv differs from requirements.txt"
import re, sys
from importlib.metadata import version
for line in open(sys.argv[1]):
    m = re.match(r"([A-Za-z0-9_.-]+)==([^ #]+)", line.strip())
    if m:
        got = version(m[1]).split("+")[0]
        assert got == m[2], f"{m[1]}: {got} installed, requirements.txt pins {m[2]}"
print("the venv holds requirements.txt's pins")
EOF
# an interpreter that cannot make venvs (no ensurepip: Debian's python3 without python3-venv) is
# refused with the package to install, before anything is made
mkdir -p "$work/no-ensurepip/ensurepip"
echo 'raise ImportError("no ensurepip (a test decoy)")' >"$work/no-ensurepip/ensurepip/__init__.py"
printf '#!/bin/sh\nPYTHONPATH=%s exec %s "$@"\n' "$work/no-ensurepip" "$python" >"$work/decoy/python-no-venv"
chmod +x "$work/decoy/python-no-venv"
out=$(env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make --no-print-directory -C "$work/checkout" venv \
  VENV="$work/venv-bare" PYTHON="$work/decoy/python-no-venv" 2>&1) && fail "make venv accepted an interpreter without venv"
grep -q "cannot make a venv: apt-get install python3-venv" <<<"$out" || fail "make venv without ensurepip: $out"
[ ! -e "$work/venv-bare" ] || fail "make venv made a venv with an interpreter it refused"
# from the copy pip made into the environment, not this checkout, and with no help from the environment
cd "$work"
env -u BYTESCALE_LIB -u PYTHONPATH "$venv/bin/python" - "$venv" <<'EOF'
import sys, bytescale
venv = sys.argv[1]
assert bytescale.__file__.startswith(venv), bytescale.__file__
assert bytescale.library_path.startswith(venv), bytescale.library_path
p = bytescale.plan([30000, 12000] + [500] * 60, ranks=8, capacity=8192)
assert sum(len(it.ranks) > 1 for it in p.items) > 0, "no ring for sequences above the capacity"
print(f"bytescale {bytescale.__version__} from {bytescale.library_path}: {p}")
EOF
# the package's own plan tests on the installed copy (the Python plan equals the command's plan file,
# every policy): the package works as pip installed it. The other Python tests run once, in the
# python/pytest* ctest entries, on the same code from the source tree (running them here too doubled
# the suite's Python time for no path of its own).
env -u BYTESCALE_LIB -u PYTHONPATH PYTHONDONTWRITEBYTECODE=1 \
  "$venv/bin/python" -m pytest -q -p no:cacheprovider "$src/python/tests/test_plan.py" || fail "the Python tests in the venv"
echo "pkg/install: ok"
