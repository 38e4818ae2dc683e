// `kolo-bench elastic`: how fast an elastic job recovers from a dead worker,
// and how much work it loses.
//
// The driver is a plain process. Each run starts the Fashion-MNIST example in
// elastic mode under kolorun (`kolorun -np 3 --min-np 2 fashion_mnist --elastic
// --commit-every N ...`, the seed CNN, one epoch), reads rank 0's per-step
// progress lines, and when rank 0 reports step --kill-at-step it SIGKILLs the
// worker with the highest id (never rank 0, whose lines it reads). It then
// times, by the driver's clock when each line arrives:
//   kill -> kolorun logs the next round    (kolorun saw the exit, re-formed)
//   -> rank 0 prints "Round 2 ... resumes at step S"  (join, init, restore, sync)
//   -> rank 0 prints step S + 1            (the first step of the new world)
// recovery_s is kill -> step S + 1; lost_steps is the last step the old world
// completed minus S (steps done again). Then it stops the job (SIGTERM), or
// with --finish lets it train to its end and requires exit code 0 and rank
// 0's summary. kolorun gets --cooldown 3600, so the freed slot stays empty
// and no replacement joins while the new world is timed.
#pragma once

#include <string>

namespace kolo::bench {

struct ElasticBenchOptions {
  int repeats = 3;        // runs (one row each)
  int workers = 3;        // -np; --min-np is workers - 1
  int commit_every = 10;  // steps between commits
  int kill_at_step = 0;   // 0 = 3 * commit_every - 1: just before a commit, the most to lose
  int batch = 64;         // images per worker per step
  int threads = 1;        // per worker
  int steps_after = 5;    // steps of the new world watched before stopping the job
  bool finish = false;    // let the job train to its end instead (and check it exits 0)
  int epochs = 1;
  int train_subset = 0;     // 0 = all 60000 training images
  int run_timeout_s = 300;  // a run taking longer is stopped and reported
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  bool json = false;
  std::string docs_path;
  std::string kolorun;  // "" = <build>/launcher/kolorun
  std::string example;  // "" = <build>/examples/fashion_mnist/fashion_mnist
  std::string command_line;
};

int run_elastic_bench(const ElasticBenchOptions& options);

}  // namespace kolo::bench
