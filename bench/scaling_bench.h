// `kolo-bench scaling`: training throughput (images/sec) and scaling
// efficiency of kolo against the alternatives a libtorch user has, on the
// seed CNN and on a communication-heavy MLP (see scaling_models.h).
//
// The driver is a plain process (not under kolorun). For each configuration
// (model, system, workers) it starts the workers, each of them this program
// in its hidden worker mode (`kolo-bench scaling --worker ...`), which trains
// for --warmup-steps untimed then --steps timed steps and prints one JSON
// object on stdout; the driver sums the ranks' images/sec. Configurations are
// interleaved and the whole list is repeated --repeats times (the median
// counts), because timings on a shared 2-core machine swing by +-30%. Within
// a pass, configurations of the same model and worker count run back to back
// (the ratios the targets compare), and every other pass runs in reverse.
//
// Systems (each worker computes with --threads threads, 1 by default):
//   kolo               N workers under kolorun, kolo::DistributedOptimizer, equal
//                      per-worker batches
//   kolo_python        the same through kolo's Python frontend: N Python processes
//                      under kolorun, hvd.DistributedOptimizer (bench/scaling_worker.py
//                      --system kolo); only when python3 can import kolo.torch
//   kolo_balanced      the same with kolo::BatchBalancer: the same global batch split
//                      by each worker's measured speed (kolo/core/batch_balancer.h)
//   kolo_mirrored      ONE process under kolorun with N in-process replicas
//                      (kolo::MirroredStrategy, threads of the process, one copy of
//                      the data set), --threads intra-op threads each, gradients
//                      averaged between the threads; against kolo's N processes
//   kolo_bucketview    kolo with gradients as bucket views
//                      (DistributedOptimizerOptions::gradient_as_bucket_view): each
//                      bucket one in-place allreduce of the gradients' own memory
//   kolo_powersgd      kolo with the PowerSGD communication hook (rank
//                      --powersgd-rank, from the first step after warm-up step 0);
//                      the note gives the bytes each worker allreduces per step
//   independent        N processes training alone, no gradient exchange: the ceiling.
//                      They start timing together and keep training (untimed) until
//                      the last one has finished its timed steps, so that every
//                      timed step ran beside the others (alone, a worker is faster)
//   libtorch_1thread   one process, plain libtorch, 1 thread (workers = 1)
//   libtorch_2threads  one process, plain libtorch, 2 threads (workers = 1)
//   c10d_gloo          N processes, c10d ProcessGroupGloo (libtorch_cpu), FileStore
//                      rendezvous, allreduce of every gradient after backward()
//   pytorch_ddp        N Python processes, DistributedDataParallel (gloo), from
//                      bench/scaling_worker.py, started by the interpreter's real
//                      torchrun (one per host across hosts; by hand for torch < 2.4);
//                      only when --python can import torch
//   kolo_fp16          kolo with fp16 gradient compression
//                      (DistributedOptimizerOptions::compression); not by default
//
// Every row also gives the resident memory of the configuration's processes
// on the host: the sum over its processes of each one's peak resident set
// (VmHWM), which is what N processes each holding the data set and a model
// cost against one process holding the data set once (kolo_mirrored).
//
// Across hosts (--hosts h1,h2 [--ssh-command CMD] [--link NAME]): each
// configuration of kolo, kolo_fp16 and pytorch_ddp whose worker count the
// hosts divide also runs with its workers spread evenly over the hosts, next
// to the same workers on this machine: kolo's through kolorun -H over the ssh
// command, DDP's ranks started by hand over ssh with MASTER_ADDR = the first
// host (Debian's torchrun does not run on its Python 3.11). The hosts share
// this machine's file system (the build and the data at the same paths), as
// scripts/test_hosts.sh's do; docs/hosts.md#training-across-hosts.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kolo::bench {

struct ScalingOptions {
  std::vector<std::string> models = {"cnn", "mlp"};
  std::vector<std::string> systems = {"kolo",          "kolo_bucketview",  "kolo_python",
                                      "kolo_balanced", "kolo_powersgd",    "kolo_mirrored",
                                      "independent",   "libtorch_1thread", "libtorch_2threads",
                                      "c10d_gloo",     "pytorch_ddp"};
  std::vector<int> workers = {1, 2, 4};
  int steps = 50;        // timed steps per worker
  int warmup_steps = 5;  // untimed steps first
  int repeats = 3;       // passes over all configurations (median)
  int threads = 1;       // per worker (libtorch_2threads uses 2)
  int cnn_batch = 64;    // per-worker batch of the CNN (Adam)
  int mlp_batch = 16;    // per-worker batch of the MLP (SGD)
  // kolo systems: DistributedOptimizerOptions::bucket_bytes; < 0 = kolo's default.
  int64_t bucket_bytes = -1;
  int powersgd_rank = 4;           // kolo_powersgd: PowerSGDOptions::rank
  std::vector<std::string> hosts;  // across hosts: see the file comment; empty = this machine only
  std::string ssh_command = "ssh";
  std::string link;        // the hosts' link, named in the table ("1gbit")
  bool synthetic = false;  // random data of Fashion-MNIST's shape instead of the files
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  int config_timeout_s = 900;  // a configuration running longer is killed and reported
  bool json = false;
  std::string docs_path;
  std::string plot_path;
  std::string command_line;
  std::string python_worker;  // default: <source dir>/bench/scaling_worker.py
  std::string python_path;    // kolo_python's PYTHONPATH; default: <build dir>/python
  std::string kolorun;        // default: <build dir>/launcher/kolorun
  // The interpreter the build's Python frontend is for (KOLO_PYTHON: the
  // project's .venv with torch 2.x by default); pytorch_ddp and kolo_python
  // run on it, so that DDP and kolo use the same torch.
  std::string python = KOLO_BENCH_PYTHON;
};

// What a worker process runs (the hidden `--worker` mode).
struct ScalingWorkerOptions {
  std::string system;  // "kolo", "c10d_gloo" or "local" (independent and plain libtorch)
  std::string model;   // "cnn" or "mlp"
  int steps = 50;
  int warmup_steps = 5;
  int threads = 1;
  int batch = 64;
  bool synthetic = false;
  std::string data_dir;
  std::string store_path;     // c10d_gloo: FileStore path shared by the ranks
  bool balance = false;       // kolo: kolo::BatchBalancer splits the global batch
  int64_t bucket_bytes = -1;  // kolo: DistributedOptimizerOptions::bucket_bytes; < 0 = default
  int powersgd_rank = 0;      // kolo: > 0 = the PowerSGD hook at this rank
  int replicas = 0;           // kolo: > 0 = this many in-process replicas (kolo_mirrored)
  std::string compression = "none";  // kolo: DistributedOptimizerOptions::compression
  bool bucket_view = false;          // kolo: DistributedOptimizerOptions::gradient_as_bucket_view
  // local with WORLD_SIZE > 1 (independent): a directory the workers share
  // (a kolo file store) to start timing together and to keep training until
  // all are done; waiting for the others to start ends after sync_timeout_s
  // (the driver's --config-timeout) with a TimeoutError.
  std::string sync_dir;
  int sync_timeout_s = 900;
};

// The driver: runs every configuration, prints the table (or JSON rows),
// writes the docs section and the plot when asked. Returns the exit code.
int run_scaling_bench(const ScalingOptions& options);

// One worker: trains and prints {"rank", "world", "images_per_sec", "step_ms"}
// (plus "batch", this worker's mean images per step, "pid" and
// "resident_bytes", the process's peak resident set) as one JSON line on
// stdout; with replicas > 0, one line per replica (the same pid). kolo workers take
// their rank from kolorun; c10d_gloo and local workers from RANK and WORLD_SIZE (default 0 and 1).
int run_scaling_worker(const ScalingWorkerOptions& options);

}  // namespace kolo::bench
