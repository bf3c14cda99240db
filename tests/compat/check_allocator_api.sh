#!/usr/bin/env bash
# Compiles one translation unit with -fsyntax-only (nothing linked or run)
# and checks the outcome; ctest's allocator_api_* tests (tests/compat/
# CMakeLists.txt) call it.
#
#   check_allocator_api.sh pass|fail CXX SOURCE [--only-c10-from DIR] -- FLAGS...
#
#   pass   SOURCE must compile without a warning (-Wall -Wextra -Werror).
#   fail   SOURCE must be rejected for an override that overrides nothing
#          (the compiler's "does not override"), not for any other reason.
#   --only-c10-from DIR   every c10/ and torch/ header the compiler reads
#          must come from DIR (the stand-in), none from an installed
#          LibTorch found through the default include path.
set -uo pipefail
[ $# -ge 3 ] || { echo "usage: $0 pass|fail CXX SOURCE [--only-c10-from DIR] -- FLAGS..." >&2; exit 2; }
expect=$1 cxx=$2 src=$3
shift 3
only_from=""
if [ "${1:-}" = --only-c10-from ]; then only_from=$2; shift 2; fi
[ "${1:-}" = -- ] && shift

out=$("$cxx" -std=c++17 -fsyntax-only -Wall -Wextra -Werror "$@" "$src" 2>&1)
rc=$?
case $expect in
  pass)
    if [ $rc -ne 0 ]; then
      printf '%s\n' "$out"
      echo "FAILED: $src does not compile against these headers (exit $rc)"
      exit 1
    fi ;;
  fail)
    if [ $rc -eq 0 ]; then
      echo "FAILED: $src compiled, but these headers must reject it"
      exit 1
    fi
    # GCC: "marked 'override', but does not override"; clang (the fuzz and
    # sanitizer build): "non-virtual member function marked 'override' hides ...".
    if ! grep -qE "does not override|marked 'override' hides" <<<"$out"; then
      printf '%s\n' "$out"
      echo "FAILED: $src was rejected, but not for an override that overrides nothing"
      exit 1
    fi ;;
  *) echo "$0: expect pass or fail, not $expect" >&2; exit 2 ;;
esac

if [ -n "$only_from" ]; then
  deps=$("$cxx" -std=c++17 "$@" -M "$src" 2>&1) || { printf '%s\n' "$deps"; echo "FAILED: $cxx -M"; exit 1; }
  outside=$(tr ' \\' '\n\n' <<<"$deps" | grep -E '/(c10|torch)/' | grep -v "^$only_from/" || true)
  if [ -n "$outside" ]; then
    printf '%s\n' "$outside"
    echo "FAILED: the headers above are not from $only_from: the check did not compile against the stand-in alone"
    exit 1
  fi
fi
echo "ok: $src ($expect) with $*"
