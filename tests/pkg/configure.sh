#!/usr/bin/env bash
# configure.sh: a newcomer's first `make` while a dependency is missing, then `make` again once it is
# there (ctest pkg/configure). The first configure must fail, saying which package is missing, and
# leave nothing that stops the second: the second configures the same directory and succeeds.
#
#   tests/pkg/configure.sh SOURCE_DIR
#
# The missing package is simulated by hiding every pkg-config file (PKG_CONFIG_LIBDIR=/nonexistent);
# the first is `make build`, as typed; the second runs only the configure step (`make BUILD=DIR
# DIR/Makefile`), not the whole build.
set -euo pipefail
src=$(cd "$1" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/bytescale-configure.XXXXXX")
trap 'rm -rf "$work"' EXIT
fail() { echo "configure.sh: FAIL: $*" >&2; exit 1; }
mk() { env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make --no-print-directory -C "$src" BUILD="$work/build" "$@"; }

echo "== make with every pkg-config file hidden: configure fails"
if PKG_CONFIG_LIBDIR=/nonexistent mk build JOBS=2 >"$work/first.log" 2>&1; then
    cat "$work/first.log"; fail "configure succeeded without the packages"
fi
grep -q "not found" "$work/first.log" || { cat "$work/first.log"; fail "the failure does not name the missing package"; }
[ ! -f "$work/build/CMakeCache.txt" ] || fail "the failed configure left build/CMakeCache.txt behind"
[ ! -f "$work/build/Makefile" ] || fail "the failed configure left a Makefile"

echo "== make again with the packages: configure succeeds in the same directory"
mk "$work/build/Makefile" >"$work/second.log" 2>&1 || { cat "$work/second.log"; fail "the second configure failed"; }
[ -f "$work/build/Makefile" ] || fail "no Makefile after the second configure"
echo "configure.sh: ok"
