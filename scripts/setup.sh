#!/usr/bin/env bash
# Installs the Debian packages kolo needs, only those that are missing.
# Run as root on Debian 12 (CI and the README's quick start do).
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(
  build-essential cmake ninja-build pkg-config
  libopenmpi-dev openmpi-bin         # mpi backend, mpirun baseline
  libgloo-dev                        # gloo backend
  zlib1g-dev                         # CRC-32 of kolo's files, gzipped data
  libgtest-dev libgmock-dev          # tests
  clang libclang-rt-14-dev           # the sanitizer build and libFuzzer (scripts/sanitize.sh)
  clang-format                       # scripts/check_format.sh (the format test)
  libcli11-dev nlohmann-json3-dev     # command lines; JSON of the store, checkpoints, benches
  libssl-dev                         # libcrypto: HMAC-SHA256 of the store, the job secret
  gnuplot-nox                        # kolo-bench scaling --plot
  libopenblas0-pthread               # libtorch otherwise uses the reference BLAS
  libtorch-dev                       # the libtorch frontend (torch/, kolo_torch)
  python3-torch python3-dev pybind11-dev  # the Python frontend (python/, kolo.torch)
  python3-pytest                     # its tests (tests/python)
  dataset-fashion-mnist              # examples/fashion_mnist's data
  iproute2 openssh-server openssh-client  # scripts/test_hosts.sh: namespaces, sshd, ssh
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  if [[ $(id -u) -ne 0 ]]; then
    echo "setup: missing packages and not root; run as root or: apt-get install ${missing[*]}" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q --no-install-recommends "${missing[@]}"
else
  echo "setup: all packages present"
fi

# The project's Python environment, .venv: the machine's Python 3 (the
# python3 first on PATH; Debian's with python3-venv otherwise) with the newest
# torch 2.x from PyPI. A plain `cmake -S . -B build` takes its libtorch and its
# interpreter (cmake/KoloTorch.cmake); Debian's libtorch 1.13 and python3-torch
# above are the second, tested stack (scripts/build.sh --debian-torch).
# KOLO_TORCH_REQUIREMENT pins another torch (e.g. "torch==2.4.1").
venv=$PWD/.venv
if [[ ! -x $venv/bin/python ]]; then
  base=python3
  if ! "$base" -c 'import venv, ensurepip' 2>/dev/null; then
    base=/usr/bin/python3
    dpkg-query -W -f='${Status}' python3-venv 2>/dev/null | grep -q "install ok installed" ||
      apt-get install -y -q --no-install-recommends python3-venv
  fi
  echo "setup: creating $venv with $("$base" --version 2>&1)"
  "$base" -m venv "$venv"
fi
requirements=("${KOLO_TORCH_REQUIREMENT:-torch>=2.4,<3}" numpy pytest)
# From /: the source tree's torch/ folder would shadow the package.
if version=$(cd / && "$venv/bin/python" -c 'import torch, numpy, pytest; print(torch.__version__)' 2>/dev/null); then
  echo "setup: $venv has torch $version"
else
  echo "setup: installing ${requirements[*]} into $venv (torch's CUDA wheels: about 5 GB)"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check "${requirements[@]}"
fi
