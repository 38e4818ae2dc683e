// kolo-bench: measurement programs that print tables (never timed tests).
//
//   kolorun -np 2 kolo-bench collectives [--max-bytes 67108864] [--json] [--docs
//   docs/benchmarks.md] kolorun -np 2 kolo-bench engine [--json] [--docs docs/benchmarks.md]
//   [--timeline t.json] kolo-bench scaling [--steps 50] [--json] [--docs docs/benchmarks.md]
//   [--plot scaling.png]
//     (a plain process, not under kolorun: it starts the workers; built with libtorch)
//   kolo-bench zero [--steps 3] [--workers 1,2,4] [--json] [--docs docs/benchmarks.md]
//     (a plain process; ZeRO stages vs DistributedOptimizer; built with libtorch)
//   kolo-bench pipeline [--stages 2] [--micro-batches 1,2,4,8,16] [--memory-limit-mib 320]
//   [--json] [--docs docs/benchmarks.md --docs docs/parallelism.md]
//     (a plain process; pipeline bubble, throughput against data parallel, and memory of
//     pp=2 / tp=2 against the unsplit model under a limit; built with libtorch)
//   kolo-bench device [--sizes-mib 1,16,64,256] [--docs docs/benchmarks.md]
//     (a plain process on a GPU machine: staging and NCCL against the device's copy rate)
//   kolo-bench model [--data docs/hosts_data] [--json] [--docs docs/scale.md]
//     (a plain process; fits the allreduce cost model to scripts/bench_hosts.sh's rows)
//   kolo-bench ps [--models mlp,cnn] [--workers 2,4] [--servers 1,2] [--json]
//   [--docs docs/strategies.md]
//     (a plain process; parameter server sync/async/ssp against allreduce; built with
//     libtorch and the Fashion-MNIST reader)
//   kolo-bench store-attack --pid PID [--port P] [--json]
//     (attacks the rendezvous store served by PID, e.g. kolorun, and prints its memory)
//   kolo-bench elastic [--repeats 3] [--commit-every 10] [--json] [--docs docs/benchmarks.md]
//     (a plain process; kills a worker of the elastic Fashion-MNIST example under kolorun)
//   kolo-bench chaos [--faults 10] [--seed 1] [--kinds kill,stop] [--json] [--docs ...]
//     (a plain process; random SIGKILL/SIGSTOP of the elastic example's workers, then
//     a fault-free replay of every round)
//
// Each mode is one subcommand in its own file; every mode prints a table,
// prints JSON rows with --json, and with --docs rewrites its own section of
// docs/benchmarks.md together with the command that produced it.
#include <CLI/CLI.hpp>
#include <exception>
#include <iostream>

#include "chaos_bench.h"
#include "collectives_bench.h"
#include "device_bench.h"
#include "elastic_bench.h"
#include "engine_bench.h"
#include "kolo/core/errors.h"
#include "scale_model.h"
#include "store_attack.h"
#ifdef KOLO_BENCH_HAVE_SCALING
#include "ps_bench.h"
#include "scaling_bench.h"
#endif
#ifdef KOLO_BENCH_HAVE_ZERO
#include "zero_bench.h"
#endif
#ifdef KOLO_BENCH_HAVE_PIPELINE
#include "pipeline_bench.h"
#endif

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
  sub->add_flag("!--no-pingpong", collectives.pingpong,
                "skip the point-to-point ping-pong between ranks 0 and 1");
  sub->add_flag("--json", collectives.json, "one JSON object per row instead of tables");
  sub->add_option("--docs", collectives.docs_path,
                  "rewrite the collectives section of this markdown file");
  sub->add_option("--repeats", collectives.timing.repeats, "timed repetitions (median)")
      ->check(CLI::PositiveNumber);
  sub->add_option("--warmup", collectives.timing.warmup, "untimed calls first")
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--link", collectives.link,
                  "across hosts: the link's name in the JSON rows and docs section (e.g. 1gbit)");
  sub->add_option("--link-streams", collectives.link_streams,
                  "across hosts: TCP streams of the link-rate measurement besides one")
      ->check(CLI::PositiveNumber);

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
  engine_sub
      ->add_option("--timeline-steps", engine.timeline_steps,
                   "steps of each workload in the timeline")
      ->check(CLI::PositiveNumber);
  engine_sub->add_option("--repeats", engine.timing.repeats, "timed steps per round (median)")
      ->check(CLI::PositiveNumber);
  engine_sub
      ->add_option("--rounds", engine.rounds, "rounds in which the modes take turns (median round)")
      ->check(CLI::PositiveNumber);
  engine_sub->add_option("--warmup", engine.timing.warmup, "untimed steps per round first")
      ->check(CLI::NonNegativeNumber);

  kolo::bench::DeviceBenchOptions device;
  device.command_line = command_line;
  auto* device_sub = app.add_subcommand(
      "device",
      "CUDA tensors on one GPU: the device copy rate, an allreduce of 2 ranks sharing it "
      "through host staging, and NCCL at world size 1 (run as a plain process)");
  device_sub->add_option("--sizes-mib", device.sizes_mib, "message sizes in MiB")
      ->delimiter(',')
      ->check(CLI::PositiveNumber);
  device_sub->add_option("--repeats", device.repeats, "timed calls per size (median)")
      ->check(CLI::PositiveNumber);
  device_sub->add_flag("--json", device.json, "one JSON object per row instead of the table");
  device_sub->add_option("--docs", device.docs_path,
                         "rewrite the device section of this markdown file");

#ifdef KOLO_BENCH_HAVE_SCALING
  kolo::bench::ScalingOptions scaling;
  scaling.command_line = command_line;
  kolo::bench::ScalingWorkerOptions scaling_worker;
  bool scaling_is_worker = false;
  auto* scaling_sub = app.add_subcommand(
      "scaling",
      "training images/sec and scaling efficiency of the seed CNN and an MLP: kolo against "
      "independent workers, plain libtorch, c10d Gloo and PyTorch DDP (run as a plain process)");
  scaling_sub->add_option("--models", scaling.models, "models to train")
      ->delimiter(',')
      ->check(CLI::IsMember({"cnn", "mlp"}));
  scaling_sub->add_option("--systems", scaling.systems, "systems to measure")
      ->delimiter(',')
      ->check(CLI::IsMember({"kolo", "kolo_bucketview", "kolo_python", "kolo_balanced",
                             "kolo_powersgd", "kolo_mirrored", "kolo_fp16", "independent",
                             "libtorch_1thread", "libtorch_2threads", "c10d_gloo", "pytorch_ddp"}));
  scaling_sub->add_option("--workers", scaling.workers, "worker counts")
      ->delimiter(',')
      ->check(CLI::PositiveNumber);
  scaling_sub->add_option("--steps", scaling.steps, "timed steps per configuration")
      ->check(CLI::PositiveNumber);
  scaling_sub->add_option("--warmup-steps", scaling.warmup_steps, "untimed steps first")
      ->check(CLI::NonNegativeNumber);
  scaling_sub->add_option("--repeats", scaling.repeats, "interleaved passes (median)")
      ->check(CLI::PositiveNumber);
  scaling_sub->add_option("--threads", scaling.threads, "threads per worker")
      ->check(CLI::PositiveNumber);
  scaling_sub->add_option("--cnn-batch", scaling.cnn_batch, "CNN images per worker per step")
      ->check(CLI::PositiveNumber);
  scaling_sub->add_option("--mlp-batch", scaling.mlp_batch, "MLP images per worker per step")
      ->check(CLI::PositiveNumber);
  scaling_sub->add_flag("--synthetic", scaling.synthetic,
                        "random images of Fashion-MNIST's shape instead of the files");
  scaling_sub->add_option("--data-dir", scaling.data_dir, "Fashion-MNIST's gzipped IDX files");
  scaling_sub
      ->add_option("--config-timeout", scaling.config_timeout_s,
                   "seconds before a configuration's workers are killed")
      ->check(CLI::PositiveNumber);
  scaling_sub
      ->add_option("--bucket-bytes", scaling.bucket_bytes,
                   "kolo systems: DistributedOptimizerOptions::bucket_bytes (default: "
                   "kolo's, 25 MiB; 0 = each gradient alone, the moment it is ready)")
      ->check(CLI::NonNegativeNumber);
  scaling_sub
      ->add_option("--powersgd-rank", scaling.powersgd_rank,
                   "kolo_powersgd: rank of PowerSGD's low-rank approximation")
      ->check(CLI::PositiveNumber);
  scaling_sub->add_flag("--json", scaling.json, "one JSON object per row instead of the table");
  scaling_sub->add_option("--docs", scaling.docs_path,
                          "rewrite the scaling section of this markdown file");
  scaling_sub->add_option("--plot", scaling.plot_path,
                          "write a PNG of images/sec and efficiency against workers (gnuplot)");
  scaling_sub->add_option("--python-worker", scaling.python_worker,
                          "path of bench/scaling_worker.py (pytorch_ddp and kolo_python)");
  scaling_sub->add_option("--python-path", scaling.python_path,
                          "PYTHONPATH holding kolo.torch for kolo_python (default: the build "
                          "tree's python/)");
  scaling_sub->add_option("--kolorun", scaling.kolorun, "path of kolorun");
  scaling_sub
      ->add_option("--hosts", scaling.hosts,
                   "also run kolo, kolo_fp16 and pytorch_ddp with the workers spread over these "
                   "hosts (sharing this file system), next to this machine")
      ->delimiter(',');
  scaling_sub->add_option("--ssh-command", scaling.ssh_command, "how to reach --hosts")
      ->capture_default_str();
  scaling_sub->add_option("--link", scaling.link, "the hosts' link, named in the table");
  scaling_sub
      ->add_option("--python", scaling.python,
                   "interpreter with PyTorch for pytorch_ddp and kolo_python")
      ->capture_default_str();
  // The hidden worker mode the driver starts.
  scaling_sub->add_flag("--worker", scaling_is_worker)->group("");
  scaling_sub->add_option("--system", scaling_worker.system)->group("");
  scaling_sub->add_option("--model", scaling_worker.model)->group("");
  scaling_sub->add_option("--batch-size", scaling_worker.batch)->group("");
  scaling_sub->add_option("--store-path", scaling_worker.store_path)->group("");
  scaling_sub->add_flag("--balance", scaling_worker.balance)->group("");
  scaling_sub->add_option("--sync-dir", scaling_worker.sync_dir)->group("");
  scaling_sub->add_option("--replicas", scaling_worker.replicas)->group("");
  scaling_sub->add_option("--compression", scaling_worker.compression)->group("");
  scaling_sub->add_flag("--bucket-view", scaling_worker.bucket_view)->group("");
#endif

#ifdef KOLO_BENCH_HAVE_SCALING
  kolo::bench::PsBenchOptions ps;
  ps.command_line = command_line;
  kolo::bench::PsWorkerOptions ps_worker;
  bool ps_is_worker = false;
  auto* ps_sub = app.add_subcommand(
      "ps",
      "parameter server (sync, async, ssp) against allreduce: samples/sec, bytes per step, "
      "test accuracy and staleness on Fashion-MNIST (run as a plain process)");
  ps_sub->add_option("--models", ps.models, "mlp, cnn, sparse")->delimiter(',');
  ps_sub->add_option("--designs", ps.designs, "allreduce, ps")->delimiter(',');
  ps_sub->add_option("--modes", ps.modes, "sync, async, ssp (design ps)")->delimiter(',');
  ps_sub->add_option("--workers", ps.workers, "worker counts")->delimiter(',');
  ps_sub->add_option("--servers", ps.servers, "server counts (design ps)")->delimiter(',');
  ps_sub->add_option("--max-staleness", ps.max_staleness, "bound of mode ssp")
      ->check(CLI::NonNegativeNumber);
  ps_sub->add_option("--epochs", ps.epochs, "epochs")->check(CLI::PositiveNumber);
  ps_sub->add_option("--train-subset", ps.train_subset, "training images")
      ->check(CLI::PositiveNumber);
  ps_sub->add_option("--test-subset", ps.test_subset, "test images")->check(CLI::PositiveNumber);
  ps_sub->add_option("--batch", ps.batch, "images per worker per step")->check(CLI::PositiveNumber);
  ps_sub->add_option("--lr", ps.lr, "learning rate (SGD; Adagrad for model sparse)");
  ps_sub->add_option("--rows", ps.rows, "model sparse: embedding table rows (x 64 floats)")
      ->check(CLI::PositiveNumber);
  ps_sub->add_option("--config-timeout", ps.config_timeout_s, "seconds per configuration");
  ps_sub->add_option("--data-dir", ps.data_dir, "Fashion-MNIST's gzipped IDX files");
  ps_sub->add_flag("--json", ps.json, "one JSON object per row instead of the table");
  ps_sub->add_option("--docs", ps.docs_path, "rewrite the ps section of this markdown file");
  ps_sub->add_option("--kolorun", ps.kolorun, "path of kolorun");
  ps_sub->add_flag("--worker", ps_is_worker)->group("");
  ps_sub->add_option("--model", ps_worker.model)->group("");
  ps_sub->add_option("--design", ps_worker.design)->group("");
  ps_sub->add_option("--mode", ps_worker.mode)->group("");
#endif

#ifdef KOLO_BENCH_HAVE_ZERO
  kolo::bench::ZeroBenchOptions zero;
  zero.command_line = command_line;
  kolo::bench::ZeroWorkerOptions zero_worker;
  bool zero_is_worker = false;
  auto* zero_sub = app.add_subcommand(
      "zero",
      "per-rank memory (parameters, gradients, Adam state, peak RSS) and step time of ZeRO "
      "stages 1-3 against DistributedOptimizer and PyTorch's FSDP2 on a ~100 M-parameter model");
  zero_sub
      ->add_option("--modes", zero.modes,
                   "ddp, 1, 2, 3 (3 runs with and without prefetch), fsdp2 (PyTorch's, under "
                   "torchrun)")
      ->delimiter(',')
      ->check(CLI::IsMember({"ddp", "1", "2", "3", "fsdp2"}));
  zero_sub->add_option("--workers", zero.workers, "worker counts")->delimiter(',');
  zero_sub->add_option("--layers", zero.layers, "Linear layers")->check(CLI::PositiveNumber);
  zero_sub->add_option("--width", zero.width, "features per layer")->check(CLI::PositiveNumber);
  zero_sub->add_option("--batch", zero.batch, "rows per worker per step")
      ->check(CLI::PositiveNumber);
  zero_sub->add_option("--steps", zero.steps, "timed steps")->check(CLI::PositiveNumber);
  zero_sub->add_option("--warmup-steps", zero.warmup_steps, "untimed steps first")
      ->check(CLI::NonNegativeNumber);
  zero_sub->add_option("--config-timeout", zero.config_timeout_s, "seconds per configuration");
  zero_sub->add_flag("--json", zero.json, "one JSON object per row instead of the table");
  zero_sub->add_option("--docs", zero.docs_path, "rewrite the zero section of this markdown file");
  zero_sub->add_option("--kolorun", zero.kolorun, "path of kolorun");
  zero_sub->add_option(
      "--python", zero.python,
      "interpreter with torch >= 2.6 for fsdp2 (default: the build's KOLO_PYTHON)");
  zero_sub->add_flag("--worker", zero_is_worker)->group("");
  zero_sub->add_option("--mode", zero_worker.mode)->group("");
  zero_sub->add_flag("--no-prefetch", zero_worker.no_prefetch)->group("");
#endif

#ifdef KOLO_BENCH_HAVE_PIPELINE
  kolo::bench::PipelineBenchOptions pipeline;
  pipeline.command_line = command_line;
  kolo::bench::PipelineWorkerOptions pipeline_worker;
  bool pipeline_is_worker = false;
  auto* pipeline_sub = app.add_subcommand(
      "pipeline",
      "pipeline parallelism: measured bubble against (p-1)/(m+p-1) for GPipe and 1F1B, "
      "throughput against data parallel, and per-rank memory of pp=2 and tp=2 against the "
      "unsplit model under a memory limit (run as a plain process)");
  pipeline_sub->add_option("--schedules", pipeline.schedules, "gpipe, 1f1b")
      ->delimiter(',')
      ->check(CLI::IsMember({"gpipe", "1f1b"}));
  pipeline_sub->add_option("--stages", pipeline.stages, "stage counts (one rank per stage)")
      ->delimiter(',')
      ->check(CLI::Range(2, 64));
  pipeline_sub->add_option("--micro-batches", pipeline.micro_batches, "micro-batch counts")
      ->delimiter(',')
      ->check(CLI::PositiveNumber);
  pipeline_sub->add_option("--blocks", pipeline.model.blocks, "MLP blocks of the bubble model")
      ->check(CLI::PositiveNumber);
  pipeline_sub->add_option("--hidden", pipeline.model.hidden, "width between blocks")
      ->check(CLI::PositiveNumber);
  pipeline_sub->add_option("--ffn", pipeline.model.ffn, "width inside a block")
      ->check(CLI::PositiveNumber);
  pipeline_sub->add_option("--batch", pipeline.model.batch, "global rows per step")
      ->check(CLI::PositiveNumber);
  pipeline_sub->add_option("--steps", pipeline.model.steps, "timed steps per configuration")
      ->check(CLI::PositiveNumber);
  pipeline_sub->add_option("--warmup-steps", pipeline.model.warmup_steps, "untimed steps first")
      ->check(CLI::NonNegativeNumber);
  pipeline_sub->add_option("--threads", pipeline.model.threads, "torch threads per rank")
      ->check(CLI::PositiveNumber);
  pipeline_sub->add_flag("!--no-dp", pipeline.compare_dp,
                         "skip the throughput table (1 rank and data parallel)");
  pipeline_sub
      ->add_option("--memory-limit-mib", pipeline.memory_limit_mib,
                   "per-rank limit of the memory table, by the bench's accounting (parameters + "
                   "gradients + Adam state + peak activations); 0 = no memory table")
      ->check(CLI::NonNegativeNumber);
  pipeline_sub->add_option("--memory-blocks", pipeline.memory_model.blocks, "blocks")
      ->check(CLI::PositiveNumber);
  pipeline_sub->add_option("--memory-hidden", pipeline.memory_model.hidden, "width")
      ->check(CLI::PositiveNumber);
  pipeline_sub->add_option("--memory-ffn", pipeline.memory_model.ffn, "width inside a block")
      ->check(CLI::PositiveNumber);
  pipeline_sub->add_option("--memory-batch", pipeline.memory_model.batch, "global rows")
      ->check(CLI::PositiveNumber);
  pipeline_sub->add_option("--memory-steps", pipeline.memory_model.steps, "steps")
      ->check(CLI::PositiveNumber);
  pipeline_sub
      ->add_option("--memory-micro-batches", pipeline.memory_micro_batches,
                   "micro-batches of every memory layout (1F1B)")
      ->check(CLI::PositiveNumber);
  pipeline_sub
      ->add_option("--config-timeout", pipeline.config_timeout_s,
                   "seconds before a configuration's workers are killed")
      ->check(CLI::PositiveNumber);
  pipeline_sub->add_flag("--json", pipeline.json, "one JSON object per row instead of tables");
  pipeline_sub->add_option("--docs", pipeline.docs_path,
                           "rewrite the pipeline section of this markdown file (repeatable)");
  pipeline_sub->add_option("--kolorun", pipeline.kolorun, "path of kolorun");
  pipeline_sub->add_flag("!--no-torch", pipeline.compare_torch,
                         "leave out the table against torch.distributed.pipelining");
  pipeline_sub->add_option("--python", pipeline.python,
                           "interpreter whose torch.distributed.pipelining is measured (default: "
                           "the build's KOLO_PYTHON)");
  // The hidden worker mode the driver starts.
  pipeline_sub->add_flag("--worker", pipeline_is_worker)->group("");
  pipeline_sub->add_option("--layout", pipeline_worker.layout)->group("");
  pipeline_sub->add_option("--memory-limit-bytes", pipeline_worker.memory_limit_bytes)->group("");
#endif

  kolo::bench::ElasticBenchOptions elastic;
  elastic.command_line = command_line;
  auto* elastic_sub = app.add_subcommand(
      "elastic",
      "recovery time and lost steps when one of 3 workers of the elastic Fashion-MNIST example "
      "is SIGKILLed under kolorun --min-np");
  elastic_sub->add_option("--repeats", elastic.repeats, "runs, one row each")
      ->check(CLI::PositiveNumber);
  elastic_sub->add_option("--workers", elastic.workers, "workers before the kill (-np)")
      ->check(CLI::Range(2, 64));
  elastic_sub->add_option("--commit-every", elastic.commit_every, "steps between commits")
      ->check(CLI::PositiveNumber);
  elastic_sub->add_option("--kill-at-step", elastic.kill_at_step,
                          "kill when rank 0 reports this step (default 3 x commit-every - 1)");
  elastic_sub->add_option("--batch", elastic.batch, "images per worker per step")
      ->check(CLI::PositiveNumber);
  elastic_sub->add_option("--threads", elastic.threads, "threads per worker")
      ->check(CLI::PositiveNumber);
  elastic_sub
      ->add_option("--steps-after", elastic.steps_after,
                   "steps of the new world watched before the job is stopped")
      ->check(CLI::PositiveNumber);
  elastic_sub->add_flag("--finish", elastic.finish,
                        "let each job train to its end after the recovery and require exit 0");
  elastic_sub->add_option("--epochs", elastic.epochs, "epochs of each job")
      ->check(CLI::PositiveNumber);
  elastic_sub
      ->add_option("--train-subset", elastic.train_subset,
                   "train on the first N images (0 = all 60000)")
      ->check(CLI::NonNegativeNumber);
  elastic_sub->add_option("--run-timeout", elastic.run_timeout_s, "seconds per run")
      ->check(CLI::PositiveNumber);
  elastic_sub->add_option("--data-dir", elastic.data_dir, "Fashion-MNIST's gzipped IDX files");
  elastic_sub->add_flag("--json", elastic.json, "one JSON object per row instead of the table");
  elastic_sub->add_option("--docs", elastic.docs_path,
                          "rewrite the elastic section of this markdown file");
  elastic_sub->add_option("--kolorun", elastic.kolorun, "path of kolorun");
  elastic_sub->add_option("--example", elastic.example, "path of the fashion_mnist example");

  kolo::bench::ModelBenchOptions model;
  model.command_line = command_line;
  auto* model_sub = app.add_subcommand(
      "model",
      "fit an alpha-beta-gamma model of allreduce (flat ring, hierarchical, tree) to the "
      "measurements of scripts/bench_hosts.sh, check it on held-out configurations and project "
      "data-parallel training to 8..512 workers (a plain process)");
  model_sub->add_option("--data", model.data_dir, "directory of scripts/bench_hosts.sh's JSON rows")
      ->capture_default_str();
  model_sub
      ->add_option("--held-out", model.held_out,
                   "configurations (HOSTSxRANKS-LINK) predicted, not fitted")
      ->delimiter(',')
      ->capture_default_str();
  model_sub
      ->add_option("--held-out-bytes", model.held_out_bytes,
                   "sizes predicted, not fitted, in every configuration")
      ->delimiter(',')
      ->capture_default_str();
  model_sub->add_flag("--json", model.json, "one JSON object per row instead of tables");
  model_sub->add_option("--docs", model.docs_path,
                        "rewrite the model sections of this markdown file (docs/scale.md)");

  kolo::bench::StoreAttackOptions attack;
  auto* attack_sub = app.add_subcommand(
      "store-attack",
      "attack a running rendezvous store (kolorun's) as a hostile local client and print the "
      "serving process's resident memory");
  attack_sub->add_option("--pid", attack.pid, "process serving the store (kolorun)")->required();
  attack_sub->add_option("--port", attack.port, "its port (default: the one it listens on)");
  attack_sub->add_option("--host", attack.host, "its address")->capture_default_str();
  attack_sub->add_option("--seconds", attack.seconds_per_attack, "seconds per attack")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  attack_sub->add_flag("--json", attack.json, "one JSON object per attack instead of the table");

  kolo::bench::ChaosBenchOptions chaos;
  chaos.command_line = command_line;
  auto* chaos_sub = app.add_subcommand(
      "chaos",
      "an elastic Fashion-MNIST job while a seeded driver SIGKILLs and SIGSTOPs random workers; "
      "it must finish, every round must replay bitwise, nothing may be left behind");
  chaos_sub->add_option("--workers", chaos.workers, "workers (-np, --max-np; --min-np is 2)")
      ->capture_default_str();
  chaos_sub->add_option("--faults", chaos.faults, "faults to inject")->capture_default_str();
  chaos_sub->add_option("--seed", chaos.seed, "seed of the fault schedule")->capture_default_str();
  chaos_sub->add_option("--kinds", chaos.kinds, "fault kinds: kill and/or stop")
      ->capture_default_str();
  chaos_sub->add_option("--min-gap", chaos.min_gap_s, "seconds of training after a recovery")
      ->capture_default_str();
  chaos_sub->add_option("--max-gap", chaos.max_gap_s, "at most this many")->capture_default_str();
  chaos_sub->add_option("--commit-every", chaos.commit_every, "steps between commits")
      ->capture_default_str();
  chaos_sub->add_option("--batch", chaos.batch, "images per worker per step")
      ->capture_default_str();
  chaos_sub->add_option("--threads", chaos.threads, "threads per worker")->capture_default_str();
  chaos_sub->add_option("--epochs", chaos.epochs, "epochs of the job")->capture_default_str();
  chaos_sub->add_option("--train-subset", chaos.train_subset, "training images (0 = all)")
      ->capture_default_str();
  chaos_sub->add_option("--test-subset", chaos.test_subset, "test images")->capture_default_str();
  chaos_sub->add_option("--timeout", chaos.timeout_s, "the workers' --timeout, seconds")
      ->capture_default_str();
  chaos_sub
      ->add_option("--stall-shutdown", chaos.stall_shutdown_s,
                   "KOLO_STALL_SHUTDOWN_SECONDS of the workers")
      ->capture_default_str();
  chaos_sub->add_option("--run-timeout", chaos.run_timeout_s, "seconds for the chaos job")
      ->capture_default_str();
  chaos_sub->add_flag("!--no-replay", chaos.replay, "skip the replay of the rounds");
  chaos_sub->add_option("--data-dir", chaos.data_dir, "Fashion-MNIST's gzipped IDX files");
  chaos_sub->add_option("--log", chaos.log_path,
                        "write every line of the chaos job here, with the driver's time");
  chaos_sub->add_flag("--json", chaos.json, "one JSON object per row instead of the tables");
  chaos_sub->add_option("--docs", chaos.docs_path,
                        "rewrite the chaos section of this markdown file");
  chaos_sub->add_option("--kolorun", chaos.kolorun, "path of kolorun");
  chaos_sub->add_option("--example", chaos.example, "path of the fashion_mnist example");

  CLI11_PARSE(app, argc, argv);
  try {
    if (*attack_sub) return kolo::bench::run_store_attack_bench(attack);
    if (*model_sub) return kolo::bench::run_model_bench(model);
    if (*elastic_sub) return kolo::bench::run_elastic_bench(elastic);
    if (*chaos_sub) return kolo::bench::run_chaos_bench(chaos);
#ifdef KOLO_BENCH_HAVE_ZERO
    if (*zero_sub) {
      if (!zero_is_worker) return kolo::bench::run_zero_bench(zero);
      zero_worker.layers = zero.layers;
      zero_worker.width = zero.width;
      zero_worker.batch = zero.batch;
      zero_worker.steps = zero.steps;
      zero_worker.warmup_steps = zero.warmup_steps;
      return kolo::bench::run_zero_worker(zero_worker);
    }
#endif
#ifdef KOLO_BENCH_HAVE_PIPELINE
    if (*pipeline_sub) {
      if (!pipeline_is_worker) return kolo::bench::run_pipeline_bench(pipeline);
      pipeline_worker.model = pipeline.model;
      pipeline_worker.schedules = pipeline.schedules;
      pipeline_worker.micro_batches = pipeline.micro_batches;
      return kolo::bench::run_pipeline_worker(pipeline_worker);
    }
#endif
#ifdef KOLO_BENCH_HAVE_SCALING
    if (*ps_sub) {
      if (!ps_is_worker) return kolo::bench::run_ps_bench(ps);
      ps_worker.max_staleness = ps.max_staleness;
      ps_worker.epochs = ps.epochs;
      ps_worker.train_subset = ps.train_subset;
      ps_worker.test_subset = ps.test_subset;
      ps_worker.batch = ps.batch;
      ps_worker.lr = ps.lr;
      ps_worker.rows = ps.rows;
      ps_worker.data_dir = ps.data_dir;
      return kolo::bench::run_ps_worker(ps_worker);
    }
    if (*scaling_sub) {
      if (!scaling_is_worker) return kolo::bench::run_scaling_bench(scaling);
      scaling_worker.steps = scaling.steps;
      scaling_worker.warmup_steps = scaling.warmup_steps;
      scaling_worker.threads = scaling.threads;
      scaling_worker.synthetic = scaling.synthetic;
      scaling_worker.data_dir = scaling.data_dir;
      scaling_worker.sync_timeout_s = scaling.config_timeout_s;
      scaling_worker.bucket_bytes = scaling.bucket_bytes;
      // The driver passes --powersgd-rank to kolo_powersgd's workers only.
      if (scaling_sub->count("--powersgd-rank") > 0)
        scaling_worker.powersgd_rank = scaling.powersgd_rank;
      return kolo::bench::run_scaling_worker(scaling_worker);
    }
#endif
    if (*device_sub) return kolo::bench::run_device_bench(device);
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
  } catch (const std::exception& e) {  // libtorch, c10d, file errors of the scaling mode
    std::cerr << "kolo-bench: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
