#!/usr/bin/env bash
# Configures and builds kolo into ./build (Release). Extra args go to cmake --build.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$(nproc)" "$@"
