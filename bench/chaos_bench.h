// `kolo-bench chaos`: an elastic job under random faults, and a check that
// they changed nothing but the time it took.
//
// The driver is a plain process (job_driver.h). It starts the Fashion-MNIST
// example in elastic mode under kolorun on --workers local "hosts"
// (127.0.0.1, 127.0.0.2, ...: two more than --workers, so that a failed
// host's cooldown never leaves the job without a free slot), with
// --min-np 2 and a short --timeout. While the job trains, a seeded random
// generator picks, after each recovery and a random pause of
// [--min-gap, --max-gap] seconds of training, a member of the current world
// and a fault: SIGKILL (a crash) or SIGSTOP (a frozen process: kolorun must
// evict it). The first faults cover every kind of --kinds once, in a seeded
// order; the rest are drawn. For each fault it records, by its own clock when
// each line arrives:
//   detect_s    fault -> kolorun's log line naming the worker (its death, or
//               its eviction)
//   recovery_s  fault -> rank 0's first step in the next round
//   lost_steps  steps done again: the last step completed before the new
//               round minus the step it resumed from
// After the job: it must exit 0 (completed); no worker process, no
// /dev/shm/kolo-<pid>-* segment of a worker and no *.tmp file in the
// checkpoint directory may remain.
//
// Replay: rank 0 of each round writes the state it starts from
// (<dir>/round<k>.start) and prints a fingerprint of its parameters
// (FNV-1a of their bytes); at the end it prints the final one. For each
// round the driver then runs the example fault-free under plain kolorun with
// the round's world size, resumed from the round's start file, stopped at the
// commit the next round resumed from (--stop-at), and requires the same
// fingerprint as the next round's start; the last round is replayed to the
// end and must reproduce the final fingerprint. Tolerance: none (bitwise).
#pragma once

#include <cstdint>
#include <string>

namespace kolo::bench {

struct ChaosBenchOptions {
  int workers = 4;                  // -np and --max-np; --min-np is 2
  int faults = 10;                  // faults to inject
  uint64_t seed = 1;                // of the fault schedule
  std::string kinds = "kill,stop";  // fault kinds drawn from
  double min_gap_s = 1.0;           // training between a recovery and the next fault
  double max_gap_s = 4.0;
  int commit_every = 10;
  int batch = 32;  // images per worker per step
  int threads = 1;
  int epochs = 2;
  int train_subset = 24000;
  int test_subset = 1000;
  double timeout_s = 10;        // the workers' --timeout (collectives, rendezvous)
  double stall_shutdown_s = 3;  // KOLO_STALL_SHUTDOWN_SECONDS: a frozen rank is failed after it
  int run_timeout_s = 1200;     // the whole chaos job (--job-timeout)
  bool replay = true;           // verify the rounds by replaying them
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  std::string log_path;  // "" = none; else every line of the chaos job, with the driver's time
  bool json = false;
  std::string docs_path;
  std::string kolorun;  // "" = <build>/launcher/kolorun
  std::string example;  // "" = <build>/examples/fashion_mnist/fashion_mnist
  std::string command_line;
};

int run_chaos_bench(const ChaosBenchOptions& options);

}  // namespace kolo::bench
