#!/usr/bin/env bash
# Collective benchmarks across test hosts (docs/hosts.md#benchmarks): brings
# up network-namespace hosts with scripts/test_hosts.sh, shapes their links,
# runs `kolo-bench collectives` over them with kolorun (gloo world: gloo's flat
# ring, the hierarchical shm + gloo path and raw gloo) and with
# `kolorun --backend mpi` (kolo's flat mpi backend and raw MPI_Allreduce over
# OpenMPI's TCP transport), each run measuring the link's TCP rate too; writes
# one section of docs/hosts.md per run and its JSON rows to
# DATA/HOSTSxRANKS-RATE-BACKEND.jsonl, which `kolo-bench model` fits
# (docs/scale.md). Tears the hosts down.
#
#   scripts/bench_hosts.sh [--build DIR] [--data DIR] [--docs FILE] [--quick]
#                          [--training RATES] [CONFIG...]
#
# CONFIG = HOSTSxRANKS@RATE[:BACKENDS], e.g. 2x2@1gbit or 2x2@1gbit:gloo;
# RATE = unshaped or a tc rate (10gbit, 1gbit, 500mbit); BACKENDS = gloo,
# mpi or gloo+mpi (default). Default configs: the measured set (2x2 unshaped,
# 10gbit and 1gbit, both backends) and the model's held-out set (2x2 at
# 2gbit, 3x2 at 1gbit; gloo). --quick: sizes up to 4 MiB, for a smoke run.
# --training RATES (e.g. 10gbit,1gbit; "none" to skip, the default when
# CONFIGs are given): after the collectives, `kolo-bench scaling` trains the
# seed CNN and the MLP on 2 hosts x 1 worker at each rate (kolo, kolo with
# fp16 compression, PyTorch DDP started over ssh), next to the same 2 workers
# on this machine; a docs section per rate.
# Needs root (exit 77 otherwise, like test_hosts.sh). Runs under
# flock /tmp/kolo-bench.lock, so two benchmarks never share the machine.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [[ -z ${BENCH_HOSTS_LOCKED:-} ]]; then
  exec env BENCH_HOSTS_LOCKED=1 flock /tmp/kolo-bench.lock "$0" "$@"
fi

BUILD=$ROOT/build
DATA=$ROOT/docs/hosts_data
DOCS=$ROOT/docs/hosts.md
MAX_BYTES=$((256 << 20))
TRAINING=""
CONFIGS=()
while (($#)); do
  case $1 in
  --build) BUILD=$2; shift 2 ;;
  --data) DATA=$2; shift 2 ;;
  --docs) DOCS=$2; shift 2 ;;
  --quick) MAX_BYTES=$((4 << 20)); shift ;;
  --training) TRAINING=$2; shift 2 ;;
  -h | --help) sed -n '2,20p' "$0"; exit 0 ;;
  -*) echo "bench_hosts: unknown option '$1' (see --help)" >&2; exit 2 ;;
  *) CONFIGS+=("$1"); shift ;;
  esac
done
if ((${#CONFIGS[@]} == 0)); then
  CONFIGS=(2x2@unshaped 2x2@10gbit 2x2@1gbit 2x2@2gbit:gloo 3x2@1gbit:gloo)
  TRAINING=${TRAINING:-10gbit,1gbit}
fi
[[ $TRAINING != none ]] || TRAINING=""

if ((EUID != 0)); then
  echo "bench_hosts: needs root (network namespaces, tc, sshd); skipped" >&2
  exit 77
fi
for program in "$BUILD/launcher/kolorun" "$BUILD/bench/kolo-bench"; do
  [[ -x $program ]] || { echo "bench_hosts: $program is missing; build it (--build DIR)" >&2; exit 2; }
done
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
HOSTS_SCRIPT=$ROOT/scripts/test_hosts.sh
trap '"$HOSTS_SCRIPT" down --holder $$ >/dev/null || true' EXIT
mkdir -p "$DATA"

for config in "${CONFIGS[@]}"; do
  [[ $config =~ ^([0-9]+)x([0-9]+)@([a-z0-9]+)(:([a-z+]+))?$ ]] ||
    { echo "bench_hosts: config '$config': write HOSTSxRANKS@RATE[:gloo|mpi|gloo+mpi]" >&2; exit 2; }
  hosts=${BASH_REMATCH[1]} ranks=${BASH_REMATCH[2]} rate=${BASH_REMATCH[3]}
  backends=${BASH_REMATCH[5]:-gloo+mpi}
  rate_args=()
  [[ $rate == unshaped ]] || rate_args=(--rate "$rate")
  "$HOSTS_SCRIPT" up "$hosts" "${rate_args[@]}" --holder $$ >/dev/null
  placement=""
  for ((k = 1; k <= hosts; k++)); do placement+="${placement:+,}kolo-h$k:$ranks"; done
  np=$((hosts * ranks))
  bench=("$BUILD/bench/kolo-bench" collectives --ops allreduce --no-pingpong --min-bytes 4096
    --max-bytes "$MAX_BYTES" --warmup 1 --repeats 5 --link "$rate" --json --docs "$DOCS")
  for backend in ${backends//+/ }; do
    echo "bench_hosts: $hosts hosts x $ranks ranks, link $rate, $backend world" >&2
    launch=("$BUILD/launcher/kolorun" -np "$np" -H "$placement"
      --ssh-command "ssh -F /run/kolo-hosts/ssh_config")
    extra=()
    # Under mpi, ranks that wait yield the core (OpenMPI otherwise spins, and
    # 4-6 spinning ranks on this machine's 2 cores starve the one that works).
    [[ $backend == mpi ]] && launch+=(--backend mpi -x OMPI_MCA_mpi_yield_when_idle=1) &&
      extra=(--backends mpi)
    out=$DATA/${hosts}x$ranks-$rate-$backend.jsonl
    "${launch[@]}" "${bench[@]}" "${extra[@]}" | grep '^{' >"$out.new"
    mv "$out.new" "$out"
  done
done

for rate in ${TRAINING//,/ }; do
  echo "bench_hosts: training on 2 hosts x 1 worker, link $rate" >&2
  "$HOSTS_SCRIPT" up 2 --rate "$rate" --holder $$ >/dev/null
  "$BUILD/bench/kolo-bench" scaling --models cnn,mlp --systems kolo,kolo_fp16,pytorch_ddp \
    --workers 2 --steps 30 --repeats 2 --hosts kolo-h1,kolo-h2 \
    --ssh-command "ssh -F /run/kolo-hosts/ssh_config" --link "$rate" --docs "$DOCS"
done
echo "bench_hosts: JSON rows in $DATA; sections written to $DOCS" >&2
