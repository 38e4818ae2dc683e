#!/usr/bin/env bash
# Configures and builds kolo (Release). Extra args go to cmake --build.
#   scripts/build.sh [--debian-torch] [cmake --build args...]
# Default: ./build against the torch 2.x of the project's .venv (scripts/setup.sh
# makes it; cmake/KoloTorch.cmake finds it). --debian-torch: ./build-debian
# against Debian's libtorch 1.13 and /usr/bin/python3's python3-torch, the
# second supported stack (scripts/test.sh builds and tests its torch tiers).
set -euo pipefail
cd "$(dirname "$0")/.."
dir=build
config=()
if [[ ${1:-} == --debian-torch ]]; then
  shift
  dir=build-debian
  config=(-DTorch_DIR=/usr/lib/x86_64-linux-gnu/cmake/Torch -DKOLO_PYTHON=/usr/bin/python3)
fi
cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release "${config[@]}" >/dev/null
cmake --build "$dir" -j "$(nproc)" "$@"
