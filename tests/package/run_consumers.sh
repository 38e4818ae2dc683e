#!/usr/bin/env bash
# ctest `package.consumers`: kolo as an outside project gets it.
#   run_consumers.sh <kolo build folder> <kolo source folder>
# Installs the build into a temporary prefix, builds this folder's consumer
# three ways (find_package, pkg-config, add_subdirectory of the source tree)
# and runs each under the *installed* kolorun with 2 workers; every worker
# checks that the ranks agree (main.cc). Also checks the installed kolorun's
# --version and that libkolo_core exports no internal symbol.
set -euo pipefail
build=$(cd "$1" && pwd)
source=$(cd "$2" && pwd)
consumer=$source/tests/package

work=$(mktemp -d "${TMPDIR:-/tmp}/kolo-package.XXXXXX")
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix

step() { echo "== $*"; }

step "install into $prefix"
cmake --install "$build" --prefix "$prefix" >/dev/null
libdir=$(dirname "$(find "$prefix" -name 'libkolo_core.so' | head -1)")
"$prefix/bin/kolorun" --version

# The exported symbols are the public API: nothing from core/src's internals.
leaked=$(nm -DC --defined-only "$libdir/libkolo_core.so" | grep -E 'kolo::(detail::|[A-Za-z]+::Impl::)' || true)
if [[ -n $leaked ]]; then
  echo "libkolo_core.so exports internal symbols:" >&2
  echo "$leaked" >&2
  exit 1
fi

# Reuse the build's compiler launcher (ccache) and generator when it has them.
cache_value() { sed -n "s/^$1:[A-Z]*=//p" "$build/CMakeCache.txt"; }
common=(-G "$(cache_value CMAKE_GENERATOR)")
launcher=$(cache_value CMAKE_CXX_COMPILER_LAUNCHER)
[[ -n $launcher ]] && common+=(-DCMAKE_CXX_COMPILER_LAUNCHER="$launcher" -DCMAKE_C_COMPILER_LAUNCHER="$launcher")
jobs=$(nproc)

for mode in find_package pkg-config add_subdirectory; do
  step "consumer by $mode"
  dir=$work/$mode
  args=(-S "$consumer" -B "$dir" "${common[@]}" -DKOLO_CONSUME="$mode")
  case $mode in
    find_package) args+=(-DCMAKE_PREFIX_PATH="$prefix") ;;
    pkg-config) export PKG_CONFIG_PATH=$libdir/pkgconfig ;;
    # kolo's own build type and flags stay out of an embedding project: this
    # one builds without optimisation, which also keeps the test short.
    add_subdirectory) args+=(-DKOLO_SOURCE_DIR="$source") ;;
  esac
  cmake "${args[@]}" >"$dir.configure.log" 2>&1 || { cat "$dir.configure.log" >&2; exit 1; }
  unset PKG_CONFIG_PATH
  # Only what the consumer needs (add_subdirectory: kolo's libraries, not kolorun).
  cmake --build "$dir" -j "$jobs" --target kolo_consumer >"$dir.build.log" 2>&1 ||
    { cat "$dir.build.log" >&2; exit 1; }
  # The installed consumers run with the installed libraries.
  if [[ $mode != add_subdirectory ]]; then
    used=$(ldd "$dir/kolo_consumer" | sed -n 's/.*libkolo_torch[^ ]* => \([^ ]*\).*/\1/p')
    if [[ $(realpath "$(dirname "$used")") != $(realpath "$libdir") ]]; then
      echo "$mode consumer uses libkolo_torch from '$used', not from $libdir" >&2
      exit 1
    fi
  fi
  "$prefix/bin/kolorun" -np 2 "$dir/kolo_consumer"
done
step "all three consumers trained and agree"
