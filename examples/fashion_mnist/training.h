// What the example's ways of training share (main.cc: kolo::Trainer in a
// fixed world, in an elastic one, under the mirrored strategy or on
// parameter servers): threads and allocator setup, the data as
// kolo::Datasets, the optimizer's report line, the closing table.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "flags.h"
#include "kolo/torch.h"

namespace fashion_mnist {

// --threads, else $OMP_NUM_THREADS (kolorun sets it), else 1.
int threads_of(const Flags& flags);

// Keeps freed memory in the process (glibc's mallopt): every step frees and
// allocates the same tens of MB, which glibc otherwise returns to the kernel
// and page-faults back in (more than half of a CNN step on one core here).
void keep_freed_memory();

// The training and test splits, cut to --train-subset / --test-subset, as
// the Trainer takes them: inputs (B, 1, 28, 28) float in [0, 1], targets (B)
// int64.
std::pair<kolo::Dataset, kolo::Dataset> load_data(const Flags& flags);
// The training images load_data would give (the labels file alone is read):
// for a parameter server, which trains on none but saves once per epoch.
int64_t training_size(const Flags& flags);

// The Trainer's options from the flags (epochs, batch per worker, the
// sampler's seed, bf16 autocast, balance); `where` for its collectives.
// The device a worker trains on (--device): the CPU, or its GPU (the local
// rank modulo the GPUs present). Throws std::runtime_error for cuda without one.
torch::Device device_of(const Flags& flags);

kolo::TrainerOptions trainer_options_of(const Flags& flags, const kolo::CallOptions& where);

// --compression into the data-parallel optimizer's options: fp16/bf16 as
// `compression`, powersgd as a communication hook (kolo::powersgd_hook with
// --powersgd-rank; its error feedback and warm start are part of checkpoints).
void set_gradient_exchange(const Flags& flags, kolo::DistributedOptimizerOptions& options);

// The optimizer's rate schedule from the flags (optimizer_choice.h).
kolo::LrScheduleOptions schedule_of(const Flags& flags, const OptimizerChoice& choice, int workers,
                                    int64_t steps_per_epoch);

// "  lamb lr 0.00125 -> 0.02 over 2 warmup epoch(s), then cosine; weight decay 0.01"
void print_optimizer(const OptimizerChoice& choice, const kolo::LrScheduleOptions& schedule,
                     const std::string& decay);

// One row of the closing table.
struct EpochRecord {
  int epoch = 0;  // 1-based
  double seconds = 0;
  int64_t images = 0;       // training images the row's metrics cover, the whole world's
  double images_per_s = 0;  // the whole world's
  double train_loss = 0;
  double train_accuracy = 0;
  double test_loss = 0;
  double test_accuracy = 0;
};

// "Summary: 2 worker(s) x 1 thread(s), global batch 128" and a Markdown table.
void print_summary(const std::vector<EpochRecord>& records, int workers, int threads,
                   int64_t global_batch);

}  // namespace fashion_mnist
