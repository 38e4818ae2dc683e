#!/usr/bin/env bash
# Installs the Debian packages kolo needs, only those that are missing.
# Run as root on Debian 12 (CI and the README's quick start do).
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config
  libopenmpi-dev openmpi-bin         # mpi backend, mpirun baseline
  libgloo-dev                        # gloo backend
  zlib1g-dev                         # CRC-32 of kolo's files, gzipped data
  libgtest-dev libgmock-dev          # tests
  clang libclang-rt-14-dev           # the sanitizer build and libFuzzer (scripts/sanitize.sh)
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
