#!/usr/bin/env bash
# README command 2: install, build, run the whole test suite (what CI runs).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
# OpenMPI refuses root without these; CI runs as root.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
cd build
ctest --output-on-failure --timeout 600 -j 1 "$@"
# The whole suite (no ctest arguments) also runs the sanitizer build: ASan +
# UBSan over the unit and collectives tiers, and the fuzz targets.
if (($# == 0)); then
  cd ..
  bash scripts/sanitize.sh
fi
