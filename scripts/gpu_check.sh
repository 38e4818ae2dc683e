#!/usr/bin/env bash
# The device check: builds kolo on a GPU machine from what its image holds and
# runs everything CUDA there, in under 10 minutes on 16 cores:
#   1. the environment (GPU, torch, compilers)
#   2. configure against the image's torch (no Gloo or MPI needed)
#   3. build the gpu tier, kolorun, kolo-bench, the example and the Python module
#   4. the gpu tier (tests/gpu): staging of 2 ranks sharing the GPU, NCCL at
#      world size 1, the readiness event, one libnccl mapped
#   5. kolo-bench device: staging and NCCL against the device's copy rate
#   6. the example, 2 workers sharing the GPU (staged through shm)
#   7. the example, 1 worker on NCCL, ZeRO stage 1 and bf16 autocast
#   8. NCCL refused, with a ContractError on every rank, for 2 ranks on one GPU
#   9. Python: hvd.allreduce of CUDA tensors under kolorun
#
#   scripts/gpu_check.sh [--dry-run] [--build DIR] [--data DIR] [--out DIR]
#   scripts/gpu_check.sh --prepare DIR
#
# --dry-run rehearses it on a machine without a GPU (this one): every step
# runs as far as it can there, and steps that need the device must fail with
# kolo's own clear message instead ("no CUDA device is present"); it reuses
# ./build when that exists. --prepare DIR writes what the run must carry to a
# machine that reaches nothing: a Fashion-MNIST subset (6000 training and
# 1000 test images, gzipped IDX, about 4 MB) under DIR/data. Results: a table
# on stdout, logs and the benchmark's markdown under --out (default $OUT, or
# ./gpu_check_out).
set -uo pipefail
cd "$(dirname "$0")/.."

dry_run=0
build=""
data=""
out="${OUT:-$PWD/gpu_check_out}"
prepare=""
while [[ $# -gt 0 ]]; do
  case $1 in
    --dry-run) dry_run=1 ;;
    --build) build=$2; shift ;;
    --data) data=$2; shift ;;
    --out) out=$2; shift ;;
    --prepare) prepare=$2; shift ;;
    *) echo "gpu_check: unknown argument $1 (see the comment at the top of $0)" >&2; exit 2 ;;
  esac
  shift
done

if [[ -n $prepare ]]; then
  source=/usr/share/datasets/fashion-mnist
  [[ -d $source ]] || { echo "gpu_check --prepare: $source is missing (apt-get install dataset-fashion-mnist)" >&2; exit 1; }
  mkdir -p "$prepare/data"
  python3 - "$source" "$prepare/data" <<'EOF'
import gzip, struct, sys
source, target = sys.argv[1], sys.argv[2]
for split, count in (("train", 6000), ("t10k", 1000)):
    for kind, header in (("images-idx3-ubyte", 16), ("labels-idx1-ubyte", 8)):
        raw = gzip.open(f"{source}/{split}-{kind}.gz").read()
        item = 784 if kind.startswith("images") else 1
        head = bytearray(raw[:header])
        head[4:8] = struct.pack(">I", count)
        with gzip.open(f"{target}/{split}-{kind}.gz", "wb") as f:
            f.write(bytes(head) + raw[header:header + count * item])
EOF
  echo "gpu_check --prepare: wrote $(du -sh "$prepare/data" | cut -f1) of Fashion-MNIST under $prepare/data"
  exit 0
fi

mkdir -p "$out"
python=$(command -v python3)
if [[ -x .venv/bin/python && $dry_run == 1 ]]; then python=$PWD/.venv/bin/python; fi
if [[ -z $build ]]; then
  if [[ $dry_run == 1 && -f build/build.ninja ]]; then build=build; else build=build-gpu; fi
fi
if [[ -z $data ]]; then
  if [[ -d .gpu/data ]]; then data=.gpu/data; else data=/usr/share/datasets/fashion-mnist; fi
fi

results=()
failed=0
# step NAME EXPECT COMMAND...: runs COMMAND with its output in $out/NAME.log.
# EXPECT: "ok" (exit 0), or on a dry run "no-device:TEXT" (must fail and say TEXT).
step() {
  local name=$1 expect=$2
  shift 2
  local start=$SECONDS rc
  echo "=== $name: $*" | tee -a "$out/gpu_check.log"
  "$@" >"$out/$name.log" 2>&1
  rc=$?
  tail -n 25 "$out/$name.log" | tee -a "$out/gpu_check.log"
  local verdict
  if [[ $expect == ok ]]; then
    [[ $rc == 0 ]] && verdict=PASS || verdict="FAIL (exit $rc)"
  else
    local text=${expect#no-device:}
    if [[ $rc != 0 ]] && grep -q -- "$text" "$out/$name.log"; then
      verdict="PASS (no device: said '$text')"
    else
      verdict="FAIL (exit $rc; expected a failure saying '$text')"
    fi
  fi
  [[ $verdict == PASS* ]] || failed=1
  results+=("| $name | $verdict | $((SECONDS - start)) s |")
}
# On a dry run, the steps that need the device must fail saying why.
device() { if [[ $dry_run == 1 ]]; then echo "no-device:$1"; else echo ok; fi; }

have_gpu=0
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then have_gpu=1; fi
if [[ $dry_run == 0 && $have_gpu == 0 ]]; then
  echo "gpu_check: no CUDA device is present here (nvidia-smi lists none); run with --dry-run to rehearse" >&2
  exit 1
fi
if [[ $dry_run == 1 ]]; then
  echo "gpu_check: DRY RUN: no CUDA device is present on this machine; every step that needs one must fail with kolo's message"
fi

env_report() {
  echo "date: $(date -u +%FT%TZ)  host: $(hostname)  cores: $(nproc)"
  if [[ $have_gpu == 1 ]]; then nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; else echo "GPU: none"; fi
  (cd / && "$python" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())')
  cmake --version | head -1
  ninja --version
  c++ --version | head -1
}
step environment ok env_report

configure() {
  cmake -S . -B "$1" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKOLO_PYTHON="$python" \
    -DKOLO_BUILD_TESTS=ON -DKOLO_BUILD_BENCH=ON -DKOLO_BUILD_EXAMPLES=ON -DKOLO_INSTALL=OFF &&
    grep -q "kolo: CUDA path ON" "$out/configure.log"
}
if [[ $dry_run == 1 && $build == build ]]; then
  # Configure as the device run does (into a scratch folder); the build is
  # the existing one, checked to have every target of step 3.
  step configure ok configure "$out/build-configure"
  step build ok ninja -C "$build" -n kolo_gpu_tests kolorun kolo-bench fashion_mnist kolo_python_extension
else
  step configure ok configure "$build"
  # Only the targets this configuration has (no Python headers: no module).
  targets=()
  for t in kolo_gpu_tests kolorun kolo-bench fashion_mnist kolo_python_extension; do
    if ninja -C "$build" -t query "$t" >/dev/null 2>&1; then
      targets+=("$t")
    else
      echo "gpu_check: this configuration has no target $t" | tee -a "$out/gpu_check.log"
      failed=1
    fi
  done
  step build ok cmake --build "$build" -j "$(nproc)" --target "${targets[@]}"
fi

kolorun=$build/launcher/kolorun
example=$build/examples/fashion_mnist/fashion_mnist
if [[ $dry_run == 1 ]]; then
  # ctest must report the tier skipped, never passed.
  gpu_tier() { (cd "$build" && ctest -L '^gpu$' --output-on-failure) && grep -q "Not Run\|Skipped" "$out/gpu_tier.log"; }
  step gpu_tier ok gpu_tier
else
  step gpu_tier ok "$build/tests/kolo_gpu_tests"
fi
touch "$out/device_benchmarks.md"
step bench "$(device 'no CUDA device is present')" \
  "$build/bench/kolo-bench" device --docs "$out/device_benchmarks.md"
train=(--epochs 1 --batch-size 64 --train-subset 6000 --test-subset 1000 --data-dir "$data" --progress-lines 2)
step example_staged "$(device 'no CUDA device is present')" \
  "$kolorun" -np 2 "$example" --device cuda "${train[@]}"
step example_nccl "$(device 'no CUDA device is present')" \
  env KOLO_CUDA_COMM=nccl "$kolorun" -np 1 "$example" --device cuda --zero-stage 1 --precision bf16 "${train[@]}"
nccl_refused() {
  ! KOLO_CUDA_COMM=nccl "$kolorun" -np 2 "$example" --device cuda "${train[@]}" &&
    grep -c "share one GPU, and NCCL cannot run two ranks on one GPU" "$out/nccl_refused.log"
}
if [[ $dry_run == 1 ]]; then
  step nccl_refused no-device:"no CUDA device is present" \
    env KOLO_CUDA_COMM=nccl "$kolorun" -np 2 "$example" --device cuda "${train[@]}"
else
  step nccl_refused ok nccl_refused
fi
python_cuda() {
  PYTHONPATH=$PWD/$build/python "$kolorun" -np 2 "$python" -c '
import torch, kolo.torch as hvd
if not torch.cuda.is_available():
    raise SystemExit("no CUDA device is present (torch.cuda.is_available() is False)")
hvd.init()
x = torch.full((1000,), float(hvd.rank() + 1), device="cuda")
y = hvd.allreduce(x, op=hvd.Sum)
assert y.device.type == "cuda" and torch.equal(y.cpu(), torch.full((1000,), 3.0)), y
g = hvd.allgather(torch.ones(hvd.rank() + 1, 2, device="cuda"))
assert g.shape == (3, 2) and g.device.type == "cuda"
print("rank", hvd.rank(), "python CUDA allreduce and allgather ok, cuda_built", hvd.cuda_built(), "nccl", hvd.nccl_built())
'
}
step python "$(device 'no CUDA device is present')" python_cuda

{
  echo
  echo "| step | result | time |"
  echo "|---|---|---|"
  printf '%s\n' "${results[@]}"
} | tee -a "$out/gpu_check.log" "$out/summary.md"
if [[ $dry_run == 1 ]]; then
  echo "gpu_check: dry run done: no CUDA device is present here; the steps above are what the device run does"
fi
exit $failed
