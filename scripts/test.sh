#!/usr/bin/env bash
# README command 2: install, build, run the whole test suite (what CI runs).
#   scripts/test.sh                 everything below
#   scripts/test.sh <ctest args>    the main suite only, with those arguments
# 1. the main suite in ./build, on the torch 2.x of .venv (the default stack);
# 2. the second stack, Debian's libtorch 1.13 and python3-torch, in
#    ./build-debian: the libtorch frontend's tiers (torch, torch_internal,
#    c10d) and the Python tier, which are what differs between the stacks
#    (the core, kolorun and the backends are the same code, never built
#    against libtorch);
# 3. the sanitizer build (scripts/sanitize.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
# OpenMPI refuses root without these; CI runs as root.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
status=0
(cd build && ctest --output-on-failure --timeout 600 -j 1 "$@") || status=$?
if (($# == 0)); then
  echo "== the second stack: Debian's libtorch 1.13 (build-debian)"
  bash scripts/build.sh --debian-torch --target kolo_torch_tests kolo_torch_internal_tests \
    kolo_c10d_tests kolo_python_extension kolorun
  (cd build-debian &&
    ctest --output-on-failure --timeout 600 -j 1 -L '^(torch|torch_internal|c10d|python)$') ||
    status=$?
  echo "== the sanitizer build (build-asan)"
  bash scripts/sanitize.sh || status=$?
fi
exit "$status"
