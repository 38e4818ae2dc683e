// What the example's ways of training share (training.h).
#include "training.h"

#include <malloc.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "fashion_mnist_data.h"

namespace fashion_mnist {

int threads_of(const Flags& flags) {
  if (flags.threads > 0) return flags.threads;
  const char* omp = std::getenv("OMP_NUM_THREADS");
  const int n = omp ? std::atoi(omp) : 0;
  return n > 0 ? n : 1;
}

// By default glibc returns freed blocks above 128 KiB (adaptively more) to
// the kernel and trims the heap top, so the next step page-faults them in
// again: measured here, that was more than half of a CNN step on one core
// (about 480 images/s instead of 1000). LD_PRELOAD of jemalloc or tcmalloc
// would do the same. Blocks of 32 MiB or more are still mapped afresh each
// time (kolorun's default GLIBC_TUNABLES=glibc.malloc.hugetlb=1 makes those
// fault in 2 MiB at a time, docs/kolorun.md): the largest activation is
// (B, 64, 24, 24) floats, 144 KiB per image,
// so batches up to about 220 images per worker stay below it (and the
// Trainer's evaluation batch of 100, 15 MB).
void keep_freed_memory() {
  mallopt(M_MMAP_THRESHOLD, 32 << 20);  // glibc's largest: blocks below it come from the heap
  mallopt(M_TRIM_THRESHOLD, 1 << 30);   // never shrink the heap by less than 1 GiB
}

namespace {

// The samples a split of `available` gives with --train-subset /
// --test-subset `subset` (0 = all): one rule for the data the workers load
// and the count a parameter server saves by.
int64_t subset_size(int64_t available, int64_t subset) {
  return subset > 0 ? std::min(subset, available) : available;
}

kolo::Dataset as_dataset(Split split, int64_t subset) {
  const int64_t taken = subset_size(split.images.size(0), subset);
  if (taken < split.images.size(0)) {
    split = {split.images.slice(0, 0, taken), split.labels.slice(0, 0, taken)};
  }
  const int64_t size = split.images.size(0);
  return {size, [split = std::move(split)](const torch::Tensor& rows) {
            return std::make_pair(split.images.index_select(0, rows).to(torch::kFloat).div_(255.0),
                                  split.labels.index_select(0, rows));
          }};
}

}  // namespace

std::pair<kolo::Dataset, kolo::Dataset> load_data(const Flags& flags) {
  return {as_dataset(load_split(flags.data_dir, "train"), flags.train_subset),
          as_dataset(load_split(flags.data_dir, "t10k"), flags.test_subset)};
}

int64_t training_size(const Flags& flags) {
  return subset_size(split_size(flags.data_dir, "train"), flags.train_subset);
}

torch::Device device_of(const Flags& flags) {
  if (flags.device == "cpu") return torch::kCPU;
  if (!torch::cuda::is_available()) {
    throw std::runtime_error(
        "--device cuda: no CUDA device is present (or this libtorch has no CUDA); train with "
        "--device cpu");
  }
  return torch::Device(torch::kCUDA,
                       static_cast<int>(kolo::local_rank() % torch::cuda::device_count()));
}

kolo::TrainerOptions trainer_options_of(const Flags& flags, const kolo::CallOptions& where) {
  kolo::TrainerOptions options;
  static_cast<kolo::CallOptions&>(options) = where;
  options.epochs = flags.epochs;
  options.batch_size = flags.batch_size;  // per worker
  options.sampling.seed = flags.seed;     // each epoch a new order, the same on every worker
  options.autocast_bf16 = flags.precision == "bf16";  // weights and gradients stay float32
  options.device = device_of(flags);
  options.balance = flags.balance;
  return options;
}

void set_gradient_exchange(const Flags& flags, kolo::DistributedOptimizerOptions& options) {
  if (flags.compression == "powersgd") {
    kolo::PowerSGDOptions powersgd;
    powersgd.rank = flags.powersgd_rank;
    powersgd.seed = flags.seed;
    options.comm_hook = kolo::powersgd_hook(powersgd);
  } else {
    options.compression = kolo::parse_compression(flags.compression);
  }
}

kolo::LrScheduleOptions schedule_of(const Flags& flags, const OptimizerChoice& choice, int workers,
                                    int64_t steps_per_epoch) {
  ScheduleChoice schedule;
  schedule.scale_lr = flags.scale_lr;
  schedule.warmup_epochs = flags.warmup_epochs;
  schedule.decay = flags.lr_decay;
  schedule.epochs = flags.epochs;
  schedule.min_lr = flags.min_lr;
  return schedule_options(choice.lr, schedule, workers, steps_per_epoch);
}

void print_optimizer(const OptimizerChoice& choice, const kolo::LrScheduleOptions& schedule,
                     const std::string& decay) {
  std::printf("  %s lr %g -> %g over %g warmup epoch(s), then %s", choice.name.c_str(),
              schedule.base_lr, schedule.peak_lr, schedule.warmup_epochs, decay.c_str());
  if (schedule.decay == kolo::LrDecay::kCosine) std::printf(" to %g", schedule.min_lr);
  if (choice.name == "sgd" || choice.name == "lars") std::printf("; momentum %g", choice.momentum);
  if (choice.name == "lars") {
    std::printf("; trust coefficient %g%s", choice.trust_coefficient,
                choice.trust_clip ? " (clip mode)" : "");
  }
  if (choice.name == "lamb") {
    std::printf("; trust ratio in [%g, %g]", choice.min_trust_ratio, choice.max_trust_ratio);
  }
  std::printf("; weight decay %g\n", choice.weight_decay);
}

void print_summary(const std::vector<EpochRecord>& records, int workers, int threads,
                   int64_t global_batch) {
  std::printf("\nSummary: %d worker(s) x %d thread(s), global batch %lld\n", workers, threads,
              static_cast<long long>(global_batch));
  std::printf(
      "| epoch | epoch time (s) | images/sec | train loss | train accuracy | test loss | "
      "test accuracy | train images |\n");
  std::printf("|---|---|---|---|---|---|---|---|\n");
  for (const EpochRecord& r : records) {
    std::printf("| %d | %.1f | %.1f | %.4f | %.4f | %.4f | %.4f | %lld |\n", r.epoch, r.seconds,
                r.images_per_s, r.train_loss, r.train_accuracy, r.test_loss, r.test_accuracy,
                static_cast<long long>(r.images));
  }
  std::fflush(stdout);
}

}  // namespace fashion_mnist
