#!/usr/bin/env bash
# README command 1: install what is missing, build, then train the Fashion-MNIST
# CNN (examples/fashion_mnist) on 2 local workers: 5 epochs, about 4.5 minutes on
# a 2-core machine, ending at about 0.91 test accuracy.
# The collective benchmark is its own command:
#   build/launcher/kolorun -np 2 build/bench/kolo-bench collectives
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
example=build/examples/fashion_mnist/fashion_mnist
if [[ ! -x $example ]]; then
  echo "main_job: $example was not built: the libtorch frontend needs libtorch-dev" \
    "(scripts/setup.sh installs it when run as root)" >&2
  exit 1
fi
exec build/launcher/kolorun -np 2 "$example" --epochs 5 --batch-size 64
