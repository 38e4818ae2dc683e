#!/usr/bin/env bash
# Runs one libFuzzer target for a bounded time (tests/fuzz/CMakeLists.txt):
#   run_fuzz.sh BINARY SEED_DIR WORK_DIR SECONDS [LIBFUZZER_FLAGS...]
# New inputs go to WORK_DIR/corpus (the seeds stay as they are); a crashing
# input is saved as WORK_DIR/crash-* (or leak-*, timeout-*, oom-*) and printed
# with the command that replays it. Exit status non-zero on any finding.
set -euo pipefail
binary=$1 seeds=$2 work=$3 seconds=$4
shift 4
mkdir -p "$work/corpus"
# Leaks inside libtorch's and OpenMPI's own static state are not kolo's.
export ASAN_OPTIONS="detect_leaks=1"
export LSAN_OPTIONS="suppressions=$(dirname "$0")/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
status=0
"$binary" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
  -artifact_prefix="$work/" "$@" "$work/corpus" "$seeds" 2>"$work/log" || status=$?
tail -n 25 "$work/log"
if ((status != 0)); then
  echo "run_fuzz: $(basename "$binary") found a failing input; replay it with:" >&2
  for f in "$work"/crash-* "$work"/leak-* "$work"/timeout-* "$work"/oom-*; do
    [[ -e $f ]] && echo "  $binary $f   (add it to $seeds as a regression input once fixed)" >&2
  done
fi
exit "$status"
