// The example's command line (parse_flags in flags.cc lists every flag
// with its help; `fashion_mnist --help` prints them).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "fashion_mnist_data.h"
#include "optimizer_choice.h"

namespace fashion_mnist {

struct Flags {
  int epochs = 2;
  int64_t batch_size = 64;            // per worker; the global batch is workers x this
  OptimizerChoice optimizer;          // --optimizer, --lr, --momentum, --weight-decay, trust
  bool scale_lr = false;              // multiply lr by the number of workers (Goyal et al.)
  double warmup_epochs = 0;           // reach the peak rate linearly over this many epochs
  std::string lr_decay = "constant";  // after the warmup: constant or cosine
  double min_lr = 0;                  // cosine: the rate at the last epoch
  std::string checkpoint_dir;         // "" = no checkpoints
  bool resume = false;                // start from the checkpoint in checkpoint_dir
  bool resume_if_present = false;     // ... if it holds one (torchrun --max-restarts)
  int threads = 0;                    // 0 = $OMP_NUM_THREADS (kolorun sets it), else 1
  int64_t train_subset = 0;           // 0 = all 60000 training images
  int64_t test_subset = 0;            // 0 = all 10000 test images
  std::string compression = "none";   // gradients on the wire: none, fp16, bf16, powersgd
  int powersgd_rank = 1;              // --compression powersgd: rank r of the approximation
  int zero_stage = 0;                 // 0 = DistributedOptimizer, 1-3 = ZeRO stage (docs/zero.md)
  std::string precision = "fp32";     // fp32, or bf16: the forward pass under bf16 autocast
  std::string device = "cpu";         // cpu, or cuda: each worker on GPU (local rank % GPUs)
  std::string data_dir = kDefaultDataDir;
  uint64_t seed = 42;
  int progress_lines = 10;    // progress lines per epoch on rank 0
  bool balance = false;       // split each global batch by the workers' speed (BatchBalancer)
  bool elastic = false;       // train with kolo::elastic::run (kolorun --min-np/--max-np)
  int64_t commit_every = 20;  // --elastic: steps between commits
  std::string stop_at;  // --elastic: "EPOCH:STEP" (1-based epoch) to stop at, after its commit
  // allreduce (a worker per process), mirrored, or ps-sync, ps-async, ps-ssp
  // (on parameter servers: kolorun --servers)
  std::string strategy = "allreduce";
  int replicas = 2;       // --strategy mirrored: workers per process, as threads
  int max_staleness = 2;  // --strategy ps-ssp: steps a worker may run ahead of the slowest
};

// Parses the command line into `flags`; returns the exit code when the
// program should stop now (--help: 0; a bad flag or combination: 2, with
// the reason on stderr), nullopt to train.
std::optional<int> parse_flags(int argc, char** argv, Flags& flags);

// --strategy ps-sync, ps-async or ps-ssp.
bool on_parameter_servers(const Flags& flags);

}  // namespace fashion_mnist
