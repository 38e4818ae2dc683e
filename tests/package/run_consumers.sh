#!/usr/bin/env bash
# ctest `package.consumers` and `package.deb`: kolo as an outside project gets it.
#   run_consumers.sh <kolo build folder> <kolo source folder> [--deb]
# Installs the build into a temporary prefix, builds this folder's consumer
# three ways (find_package, pkg-config, add_subdirectory of the source tree)
# and runs each under the *installed* kolorun with 2 workers; every worker
# checks that the ranks agree (main.cc; core_main.cc, the core alone, for
# add_subdirectory: CMakeLists.txt says why). Also checks the installed kolorun's
# --version and that libkolo_core exports no internal symbol. The find_package
# consumer also builds README.md's C++ example (its first ```cpp block, as a
# newcomer would copy it) and runs it under the installed kolorun.
# --deb: the prefix comes from the Debian packages instead: `cpack -G DEB`
# builds them, their Depends must name Debian's libtorch, gloo, OpenMPI and
# OpenSSL packages and be satisfied by this machine's installed packages, and
# `dpkg -x` unpacks them into a temporary root (a real `dpkg -i` would change
# this machine); then the find_package and pkg-config consumers as above.
set -euo pipefail
build=$(cd "$1" && pwd)
source=$(cd "$2" && pwd)
from=${3:-}
consumer=$source/tests/package

work=$(mktemp -d "${TMPDIR:-/tmp}/kolo-package.XXXXXX")
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix

step() { echo "== $*"; }

# Every "name (op version)" of a Depends field is installed here at a version
# that satisfies it (alternatives "a | b": one of them).
check_depends() {
  local deb=$1 entry alternative name op version installed ok
  local -A relation=([">="]=ge ["<="]=le [">>"]=gt ["<<"]=lt ["="]=eq)
  IFS=',' read -ra entries <<<"$(dpkg-deb -f "$deb" Depends)"
  for entry in "${entries[@]}"; do
    ok=0
    IFS='|' read -ra alternatives <<<"$entry"
    for alternative in "${alternatives[@]}"; do
      # " libfoo (>= 1.2)" -> name op version
      read -r name op version <<<"$(tr -d '()' <<<"$alternative")"
      if [[ $name == libkolo* ]]; then ok=1; break; fi  # this build's own packages
      installed=$(dpkg-query -W -f='${Version}\n' "$name" 2>/dev/null | head -1 || true)
      [[ -n $installed ]] || continue
      if [[ -z $op ]] || dpkg --compare-versions "$installed" "${relation[$op]}" "$version"; then
        ok=1
        break
      fi
    done
    if ((!ok)); then
      echo "$(basename "$deb"): dependency '$entry' is not installed on this machine" >&2
      return 1
    fi
  done
}

if [[ $from == --deb ]]; then
  step "Debian packages by cpack -G DEB"
  (cd "$work" && cpack -G DEB --config "$build/CPackConfig.cmake" -B "$work/debs" >"$work/cpack.log" 2>&1) ||
    { cat "$work/cpack.log" >&2; exit 1; }
  shopt -s nullglob
  debs=("$work"/debs/*.deb)
  shopt -u nullglob
  packages=(libkolo libkolo-dev kolo-tools)
  # The Python frontend's package, when this build has the frontend.
  [[ -f $build/python/kolo/__init__.py ]] && packages+=(python3-kolo)
  for package in "${packages[@]}"; do
    match=$(printf '%s\n' "${debs[@]}" | grep -E "/${package}[0-9.]*_" || true)
    [[ -n $match ]] || { echo "cpack made no $package package: ${debs[*]}" >&2; exit 1; }
  done
  runtime_deb=$(printf '%s\n' "${debs[@]}" | grep -E '/libkolo[0-9.]+_')
  depends=$(dpkg-deb -f "$runtime_deb" Depends)
  echo "$(dpkg-deb -f "$runtime_deb" Package) Depends: $depends"
  for needed in libtorch libgloo libopenmpi libssl; do
    [[ $depends == *"$needed"* ]] || { echo "the runtime package does not depend on $needed*" >&2; exit 1; }
  done
  root=$work/root
  for deb in "${debs[@]}"; do
    check_depends "$deb"
    dpkg -x "$deb" "$root"
  done
  prefix=$root/usr
  modes=(find_package pkg-config)
else
  step "install into $prefix"
  cmake --install "$build" --prefix "$prefix" >/dev/null
  modes=(find_package pkg-config add_subdirectory)
fi
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

# The README's C++ example, exactly as README.md shows it.
readme_source=$work/readme_main.cc
awk '/^```cpp$/ { inside = 1; next } inside && /^```$/ { exit } inside { print }' \
  "$source/README.md" >"$readme_source"
grep -q 'int main' "$readme_source" || { echo "README.md has no C++ example (a \`\`\`cpp block with main)" >&2; exit 1; }

for mode in "${modes[@]}"; do
  step "consumer by $mode"
  dir=$work/$mode
  args=(-S "$consumer" -B "$dir" "${common[@]}" -DKOLO_CONSUME="$mode")
  case $mode in
    find_package) args+=(-DCMAKE_PREFIX_PATH="$prefix" -DKOLO_README_SOURCE="$readme_source") ;;
    pkg-config) export PKG_CONFIG_PATH=$libdir/pkgconfig ;;
    # kolo's own build type and flags stay out of an embedding project: this
    # one builds without optimisation, which also keeps the test short.
    add_subdirectory) args+=(-DKOLO_SOURCE_DIR="$source") ;;
  esac
  cmake "${args[@]}" >"$dir.configure.log" 2>&1 || { cat "$dir.configure.log" >&2; exit 1; }
  unset PKG_CONFIG_PATH
  # Only what the consumer needs (add_subdirectory: kolo's core, not kolorun).
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
  if [[ $mode == find_package ]]; then
    step "README.md's C++ example, built by find_package, under kolorun -np 2"
    cmake --build "$dir" -j "$jobs" --target kolo_readme >"$dir.readme.log" 2>&1 ||
      { cat "$dir.readme.log" >&2; exit 1; }
    out=$("$prefix/bin/kolorun" -np 2 "$dir/kolo_readme")
    echo "$out"
    # Rank 0 alone prints, every 20 steps of 100.
    [[ $(grep -c '^step [0-9]* loss [0-9.]*$' <<<"$out") == 5 ]] ||
      { echo "README.md's C++ example did not print its 5 loss lines" >&2; exit 1; }
  fi
done
step "the consumers (${modes[*]}) trained and agree"

# The Python frontend from the same prefix (not the build tree): its package
# imports, and its extension finds the installed libkolo (RUNPATH $ORIGIN/..).
if [[ -f $build/python/kolo/__init__.py ]]; then
  step "kolo.torch from $prefix"
  package_dir=$(dirname "$(dirname "$(find "$prefix" -path '*/kolo/__init__.py' | head -1)")")
  [[ $package_dir != . ]] || { echo "no kolo Python package under $prefix" >&2; exit 1; }
  used=$(ldd "$package_dir"/kolo/_kolo*.so | sed -n 's/.*libkolo_torch[^ ]* => \([^ ]*\).*/\1/p')
  if [[ $(realpath "$(dirname "$used")") != $(realpath "$libdir") ]]; then
    echo "kolo.torch uses libkolo_torch from '$used', not from $libdir" >&2
    exit 1
  fi
  PYTHONPATH=$package_dir "$prefix/bin/kolorun" -np 2 "${PACKAGE_PYTHON:-/usr/bin/python3}" -c '
import torch, kolo.torch as hvd
hvd.init()
total = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum)
assert total.item() == 3.0, total
assert hvd.__file__.startswith("'"$package_dir"'"), hvd.__file__
print("rank", hvd.rank(), "of", hvd.size(), "sum", total.item())
'
fi
