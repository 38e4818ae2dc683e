#!/usr/bin/env bash
# README command 1: install, build, run the main job on 2 local workers.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
exec build/launcher/kolorun -np 2 build/bench/kolo-bench collectives
