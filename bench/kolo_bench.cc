// kolo-bench: measurement programs that print tables (never timed tests).
//
//   kolorun -np 2 kolo-bench collectives [--max-bytes 67108864] [--json] [--docs docs/benchmarks.md]
//   kolorun -np 2 kolo-bench engine [--json] [--docs docs/benchmarks.md] [--timeline t.json]
//
// Each mode is one subcommand in its own file; every mode prints a table,
// prints JSON rows with --json, and with --docs rewrites its own section of
// docs/benchmarks.md together with the command that produced it.
#include <CLI/CLI.hpp>
#include <exception>
#include <iostream>

#include "collectives_bench.h"
#include "engine_bench.h"
#include "kolo/core/errors.h"

int main(int argc, char** argv) {
  CLI::App app{"kolo-bench: kolo's benchmarks (run the workers under kolorun or mpirun)"};
  app.require_subcommand(1);

  std::string command_line = "kolo-bench";
  for (int i = 1; i < argc; ++i) command_line += std::string(" ") + argv[i];

  kolo::bench::CollectivesOptions collectives;
  collectives.command_line = "kolorun -np N " + command_line;
  auto* sub = app.add_subcommand("collectives",
                                 "latency and bandwidth of every collective and backend, with "
                                 "raw MPI, raw Gloo and memcpy baselines");
  sub->add_option("--min-bytes", collectives.min_bytes, "smallest message")
      ->check(CLI::PositiveNumber);
  sub->add_option("--max-bytes", collectives.max_bytes, "largest message")
      ->check(CLI::PositiveNumber);
  sub->add_option("--ops", collectives.ops, "collectives to measure")
      ->delimiter(',')
      ->check(CLI::IsMember({"allreduce", "allgather", "reducescatter", "broadcast", "alltoall"}));
  sub->add_option("--backends", collectives.backends,
                  "extra backends besides the world's own (all, shm, gloo)")
      ->delimiter(',')
      ->check(CLI::IsMember({"all", "shm", "gloo", "mpi", "none"}));
  sub->add_flag("!--no-baselines", collectives.baselines, "skip raw MPI / Gloo / memcpy");
  sub->add_flag("--json", collectives.json, "one JSON object per row instead of tables");
  sub->add_option("--docs", collectives.docs_path,
                  "rewrite the collectives section of this markdown file");
  sub->add_option("--repeats", collectives.timing.repeats, "timed repetitions (median)")
      ->check(CLI::PositiveNumber);
  sub->add_option("--warmup", collectives.timing.warmup, "untimed calls first")
      ->check(CLI::NonNegativeNumber);

  kolo::bench::EngineBenchOptions engine;
  engine.command_line = "kolorun -np N " + command_line;
  auto* engine_sub = app.add_subcommand(
      "engine",
      "engine step time for a ResNet-50-like gradient set and 1000 small tensors: fused, "
      "unfused, and one single-buffer allreduce of the same bytes");
  engine_sub->add_option("--workloads", engine.workloads, "gradient sets to measure")
      ->delimiter(',')
      ->check(CLI::IsMember({"resnet50", "small"}));
  engine_sub->add_option("--small-tensors", engine.small_tensors, "tensors in the small set")
      ->check(CLI::PositiveNumber);
  engine_sub->add_option("--small-bytes", engine.small_tensor_bytes, "bytes per small tensor")
      ->check(CLI::PositiveNumber);
  engine_sub->add_flag("--json", engine.json, "one JSON object per row instead of the table");
  engine_sub->add_option("--docs", engine.docs_path,
                         "rewrite the engine section of this markdown file");
  engine_sub->add_option("--timeline", engine.timeline_path,
                         "after measuring, rank 0 records a timeline of a few fused steps here");
  engine_sub->add_option("--timeline-steps", engine.timeline_steps,
                         "steps of each workload in the timeline")
      ->check(CLI::PositiveNumber);
  engine_sub->add_option("--repeats", engine.timing.repeats, "timed steps (median)")
      ->check(CLI::PositiveNumber);
  engine_sub->add_option("--warmup", engine.timing.warmup, "untimed steps first")
      ->check(CLI::NonNegativeNumber);

  CLI11_PARSE(app, argc, argv);
  try {
    if (*engine_sub) {
      if (std::getenv("OMPI_COMM_WORLD_SIZE")) engine.command_line = "mpirun -np N " + command_line;
      return kolo::bench::run_engine_bench(engine);
    }
    if (*sub) {
      if (collectives.command_line.find("--backend") == std::string::npos &&
          std::getenv("OMPI_COMM_WORLD_SIZE"))
        collectives.command_line = "mpirun -np N " + command_line;
      return kolo::bench::run_collectives(collectives);
    }
  } catch (const kolo::Error& e) {
    std::cerr << "kolo-bench: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
