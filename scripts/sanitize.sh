#!/usr/bin/env bash
# The sanitizer build and its tests (CI runs it after the main suite, from
# scripts/test.sh): the core and the libtorch frontend built with clang under
# AddressSanitizer + UndefinedBehaviorSanitizer at -O1 (any report fails),
# the libFuzzer targets of tests/fuzz, each run for KOLO_FUZZ_SECONDS (35),
# and the test tiers named in KOLO_SANITIZE_TIERS.
# Into ./build-asan. Extra args go to ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${KOLO_FUZZ_SECONDS:-35}
# The libtorch part (the checkpoint codecs' fuzz targets) builds against
# Debian's libtorch 1.13, whose headers clang 14 compiles; the codecs are the
# same code on every libtorch, and the main suite runs them on torch 2.x.
CC=clang CXX=clang++ cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DTorch_DIR=/usr/lib/x86_64-linux-gnu/cmake/Torch -DKOLO_PYTHON=/usr/bin/python3 \
  -DKOLO_BUILD_PYTHON=OFF -DKOLO_FUZZ=ON -DKOLO_FUZZ_SECONDS="$seconds" >/dev/null
# KOLO_SANITIZE_TIERS: ctest labels of the test tiers run under the
# sanitizers besides the fuzz targets. Default (CI): the unit and collectives
# tiers, ranks as threads, which cover the core's communicators, engine, store
# and decoders; set it empty for the fuzz targets alone.
tiers=${KOLO_SANITIZE_TIERS-unit collectives}
# KOLO_SANITIZE_EXCLUDE: a ctest -E regex of tests left out under the
# sanitizers. Default (CI): the collective matrix at 5 and 8 ranks, about
# 5 of the step's 14 minutes here (ASan makes each element check ~10x slower),
# and the staged-reduction matrix at 5 ranks (about a minute of the 7.3 that
# the tiers took in the CI run of dffcade); the main suite runs those world
# sizes unsanitized, and 1-4 ranks here (2 and 3 for the staged ones) cover
# every code path of the ring and direct algorithms (a rank with no block, odd
# block sizes, more than one segment). Set it empty for everything.
exclude=${KOLO_SANITIZE_EXCLUDE-'Matrix\.EveryCollectiveOpDtypeAndCount/[a-z]+_(5|8)( |$)|StagedMatrix\.LargeStagedReductionsMatchTheReference/[a-z]+_5( |$)'}
if [[ -n $tiers ]]; then
  cmake --build build-asan -j "$(nproc)" --target kolo_sanitized
else
  cmake --build build-asan -j "$(nproc)" --target kolo_fuzz_targets
fi
# OpenMPI refuses root without these; CI runs as root. Leaks in the test
# binaries are not checked (gtest and the backends' libraries keep state until
# exit); the fuzz targets check them (tests/fuzz/run_fuzz.sh).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export ASAN_OPTIONS=detect_leaks=0:abort_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
cd build-asan
# The fuzz targets run as many at a time as there are cores: each is one
# single-threaded process that fuzzes for a fixed time, so running them side
# by side takes a fraction of the time and fuzzes each as much (CI: about 2
# of the step's minutes). The test tiers then run one test at a time, as in
# the main suite (their timing-sensitive tests assume an otherwise idle
# machine). A failure in the first does not skip the second; the script
# fails if either did.
status=0
ctest --output-on-failure --timeout 600 -j "$(nproc)" -L '^fuzz$' "$@" || status=$?
labels=
for t in $tiers; do labels+="${labels:+|}$t"; done
if [[ -n $labels ]]; then
  ctest --output-on-failure --timeout 600 -j 1 -L "^($labels)\$" ${exclude:+-E "$exclude"} "$@" ||
    status=$?
fi
exit "$status"
