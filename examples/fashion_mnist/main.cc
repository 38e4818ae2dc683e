// Fashion-MNIST on kolo: data-parallel training of a small CNN with libtorch's
// C++ frontend, following the Horovod recipe step by step.
//
//   build/launcher/kolorun -np 2 build/examples/fashion_mnist/fashion_mnist --epochs 2
//
// Every worker runs this same program on its own shard of the training data.
// After each backward pass the workers average their gradients (kolo's
// DistributedOptimizer does it while backward() is still running), so all of
// them take the same optimizer step and keep identical weights: together they
// train one model with a global batch of workers x --batch-size images.
//
// The recipe:
//   1. kolo::init_torch() (kolo::init() that also joins torchrun's c10d store),
//      and set the threads each worker computes with
//   2. load the data and give each worker its shard (DistributedSampler)
//   3. build the model (the seed's Keras CNN)
//   4. choose the optimizer (--optimizer adam|sgd|lars|lamb) and its learning-rate
//      schedule: scaled by the number of workers and reached by a warmup, or, for
//      the layer-wise LARS and LAMB, set for the global batch (docs/large_batch.md)
//   5. start every worker from rank 0's weights and optimizer state
//   6. wrap the optimizer in kolo::DistributedOptimizer (or, with --zero-stage 1-3,
//      kolo::ZeroOptimizer, which shards it across the workers), and resume
//      from a checkpoint if asked
//   7. train; average the metrics across workers; rank 0 prints and saves
//
// With --elastic (under kolorun --min-np/--max-np) the same training survives
// workers dying and joining: see run_elastic() below and docs/elastic.md.
// With --balance the global batch is split by each worker's measured speed
// (kolo::BatchBalancer) instead of evenly: for workers on cores, machines or
// neighbours of different speeds.
#include <malloc.h>
#include <torch/torch.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <memory>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "fashion_mnist_data.h"
#include "kolo/torch.h"
#include "model.h"
#include "optimizer_choice.h"

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// --- Flags -------------------------------------------------------------------

struct Flags {
  int epochs = 2;
  int64_t batch_size = 64;                   // per worker; the global batch is workers x this
  fashion_mnist::OptimizerChoice optimizer;  // --optimizer, --lr, --momentum, --weight-decay
  bool scale_lr = false;                     // multiply lr by the number of workers (Goyal et al.)
  double warmup_epochs = 0;                  // reach the peak rate linearly over this many epochs
  std::string lr_decay = "constant";         // after the warmup: constant or cosine
  std::string checkpoint_dir;                // "" = no checkpoints
  bool resume = false;                       // start from the checkpoint in checkpoint_dir
  int threads = 0;                           // 0 = $OMP_NUM_THREADS (kolorun sets it), else 1
  int64_t train_subset = 0;                  // 0 = all 60000 training images
  int64_t test_subset = 0;                   // 0 = all 10000 test images
  std::string compression = "none";          // gradients on the wire: none, fp16, bf16
  int zero_stage = 0;              // 0 = DistributedOptimizer, 1-3 = ZeRO stage (docs/zero.md)
  std::string precision = "fp32";  // fp32, or bf16: the forward pass under bf16 autocast
  std::string data_dir = fashion_mnist::kDefaultDataDir;
  uint64_t seed = 42;
  int progress_lines = 10;    // progress lines per epoch on rank 0
  bool balance = false;       // split each global batch by the workers' speed (BatchBalancer)
  bool elastic = false;       // train with kolo::elastic::run (kolorun --min-np/--max-np)
  int64_t commit_every = 20;  // --elastic: steps between commits
  std::string stop_at;  // --elastic: "EPOCH:STEP" (1-based epoch) to stop at, after its commit
};

fashion_mnist::ScheduleChoice schedule_choice(const Flags& flags) {
  fashion_mnist::ScheduleChoice choice;
  choice.scale_lr = flags.scale_lr;
  choice.warmup_epochs = flags.warmup_epochs;
  choice.decay = flags.lr_decay;
  choice.epochs = flags.epochs;
  return choice;
}

// "  lamb lr 0.00125 -> 0.02 over 2 warmup epoch(s), then cosine; weight decay 0.01"
void print_optimizer(const fashion_mnist::OptimizerChoice& choice,
                     const kolo::LrScheduleOptions& schedule, const std::string& decay) {
  std::printf("  %s lr %g -> %g over %g warmup epoch(s), then %s", choice.name.c_str(),
              schedule.base_lr, schedule.peak_lr, schedule.warmup_epochs, decay.c_str());
  if (choice.name == "sgd" || choice.name == "lars") std::printf("; momentum %g", choice.momentum);
  std::printf("; weight decay %g\n", choice.weight_decay);
}

int default_threads() {
  const char* omp = std::getenv("OMP_NUM_THREADS");
  const int n = omp ? std::atoi(omp) : 0;
  return n > 0 ? n : 1;
}

// Every step allocates and frees the same tens of MB of activations and
// gradients. By default glibc returns freed blocks above 128 KiB (adaptively
// more) to the kernel and trims the heap top, so the next step page-faults
// them in again: measured here, that was more than half of a CNN step on one
// core (about 480 images/s instead of 1000). Keeping freed memory in the
// process fixes it; LD_PRELOAD of jemalloc or tcmalloc would do the same.
// Blocks of 32 MiB or more are still mapped afresh each time: the largest
// activation is (B, 64, 24, 24) floats, 144 KiB per image, so batches up to
// about 220 images per worker stay below it.
void keep_freed_memory() {
  mallopt(M_MMAP_THRESHOLD, 32 << 20);  // glibc's largest: blocks below it come from the heap
  mallopt(M_TRIM_THRESHOLD, 1 << 30);   // never shrink the heap by less than 1 GiB
}

// --- The model: the seed's Keras CNN (model.h) --------------------------------
//
//   Conv2D(32, 3x3, ReLU) -> Conv2D(64, 3x3, ReLU) -> MaxPool(2x2) -> Dropout(0.25)
//   -> Flatten -> Dense(128, ReLU) -> Dropout(0.5) -> Dense(10)
using fashion_mnist::Cnn;

// A batch of images as the model wants them: (B, 1, 28, 28) float in [0, 1].
torch::Tensor as_input(const torch::Tensor& images_u8) {
  return images_u8.to(torch::kFloat).div_(255.0);
}

// This rank's indices for the epoch as a tensor, for index_select.
torch::Tensor index_tensor(const kolo::DistributedSampler& sampler) {
  const auto& indices = sampler.indices();
  torch::Tensor t = torch::empty({static_cast<int64_t>(indices.size())}, torch::kLong);
  int64_t* out = t.data_ptr<int64_t>();
  for (size_t i = 0; i < indices.size(); ++i) out[i] = static_cast<int64_t>(indices[i]);
  return t;
}

// Keras-style progress: " 47/469 [===>.........] - ETA: 40s - 94ms/step - loss: ... - accuracy:
// ..."
void print_progress(int64_t step, int64_t steps, double elapsed_s, double loss, double accuracy,
                    bool done) {
  constexpr int kWidth = 30;
  const int filled = static_cast<int>(kWidth * step / steps);
  std::string bar(static_cast<size_t>(filled), '=');
  if (filled < kWidth) bar += '>' + std::string(static_cast<size_t>(kWidth - filled - 1), '.');
  const double per_step_ms = 1000.0 * elapsed_s / static_cast<double>(step);
  const int width = static_cast<int>(std::to_string(steps).size());
  if (done) {
    std::printf("%*lld/%lld [%s] - %.0fs %.0fms/step - loss: %.4f - accuracy: %.4f\n", width,
                static_cast<long long>(step), static_cast<long long>(steps), bar.c_str(), elapsed_s,
                per_step_ms, loss, accuracy);
  } else {
    const double eta_s = per_step_ms * static_cast<double>(steps - step) / 1000.0;
    std::printf("%*lld/%lld [%s] - ETA: %.0fs - %.0fms/step - loss: %.4f - accuracy: %.4f\n", width,
                static_cast<long long>(step), static_cast<long long>(steps), bar.c_str(), eta_s,
                per_step_ms, loss, accuracy);
  }
  std::fflush(stdout);
}

struct Evaluation {
  double loss = 0;
  double accuracy = 0;
};

// One row of the closing table.
struct EpochRecord {
  int epoch = 0;  // 1-based
  double seconds = 0;
  int64_t images = 0;       // training images the row's metrics cover, the whole world's
  double images_per_s = 0;  // the whole world's
  double train_loss = 0;
  double train_accuracy = 0;
  Evaluation test;
};

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
                r.images_per_s, r.train_loss, r.train_accuracy, r.test.loss, r.test.accuracy,
                static_cast<long long>(r.images));
  }
  std::fflush(stdout);
}

// Test loss and accuracy on this rank's shard of the test set, then averaged
// across the ranks (equal shards, so the average is the whole set's).
Evaluation evaluate(Cnn& model, const fashion_mnist::Split& test) {
  kolo::DistributedSamplerOptions shard;
  shard.shuffle = false;
  kolo::DistributedSampler sampler(static_cast<size_t>(test.images.size(0)), shard);
  const torch::Tensor indices = index_tensor(sampler);
  model->eval();
  torch::NoGradGuard no_grad;
  double loss_sum = 0;
  int64_t correct = 0;
  // Small enough that the largest activation, (100, 64, 24, 24) floats = 15 MB,
  // stays below the 32 MiB above which glibc always maps fresh pages.
  constexpr int64_t kEvalBatch = 100;
  for (int64_t start = 0; start < indices.size(0); start += kEvalBatch) {
    const torch::Tensor rows = indices.slice(0, start, start + kEvalBatch);
    const torch::Tensor logits = model->forward(as_input(test.images.index_select(0, rows)));
    const torch::Tensor labels = test.labels.index_select(0, rows);
    loss_sum +=
        torch::nn::functional::cross_entropy(
            logits, labels, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
            .item<double>();
    correct += logits.argmax(1).eq(labels).sum().item<int64_t>();
  }
  model->train();
  const double n = static_cast<double>(indices.size(0));
  return {kolo::metric_average(loss_sum / n, "test_loss"),
          kolo::metric_average(static_cast<double>(correct) / n, "test_accuracy")};
}

// The training and test splits, cut to --train-subset / --test-subset.
std::pair<fashion_mnist::Split, fashion_mnist::Split> load_data(const Flags& flags) {
  fashion_mnist::Split train = fashion_mnist::load_split(flags.data_dir, "train");
  fashion_mnist::Split test = fashion_mnist::load_split(flags.data_dir, "t10k");
  if (flags.train_subset > 0 && flags.train_subset < train.images.size(0)) {
    train = {train.images.slice(0, 0, flags.train_subset),
             train.labels.slice(0, 0, flags.train_subset)};
  }
  if (flags.test_subset > 0 && flags.test_subset < test.images.size(0)) {
    test = {test.images.slice(0, 0, flags.test_subset), test.labels.slice(0, 0, flags.test_subset)};
  }
  return {std::move(train), std::move(test)};
}

int run(const Flags& flags) {
  // --- 1. Initialise kolo; one worker per process, `threads` cores each ----
  kolo::init_torch();  // rank, size from kolorun, mpirun, srun, torchrun; else a world of one
  const int rank = kolo::rank();
  const int workers = kolo::size();
  const bool chief = rank == 0;  // rank 0 prints and writes checkpoints
  const int threads = flags.threads > 0 ? flags.threads : default_threads();
  torch::set_num_threads(threads);  // libtorch defaults to 1 thread here
  keep_freed_memory();

  // --- 2. Data: every worker reads the files, then takes its own shard ----
  fashion_mnist::Split train, test;
  std::tie(train, test) = load_data(flags);
  // Each epoch every worker gets a disjoint ceil(N / workers) of the images,
  // reshuffled per epoch with a seed all workers share.
  kolo::DistributedSamplerOptions shard;
  shard.seed = flags.seed;
  const int64_t global_batch = flags.batch_size * workers;
  // With --balance, step k's global batch is positions [k G, (k + 1) G) of
  // the epoch's whole order (the same on every worker: a "sampler" of one
  // rank), and the balancer says which part of it is this worker's; the
  // last partial global batch of an epoch is left out.
  if (flags.balance) {
    shard.rank = 0;
    shard.world_size = 1;
  }
  kolo::DistributedSampler sampler(static_cast<size_t>(train.images.size(0)), shard);
  const int64_t shard_size = static_cast<int64_t>(sampler.size());
  const int64_t steps_per_epoch = flags.balance
                                      ? shard_size / global_batch
                                      : (shard_size + flags.batch_size - 1) / flags.batch_size;
  if (flags.balance && steps_per_epoch == 0) {
    throw std::invalid_argument("--balance needs at least one global batch of " +
                                std::to_string(global_batch) + " images per epoch, got " +
                                std::to_string(shard_size) +
                                "; raise --train-subset or lower --batch-size");
  }
  std::unique_ptr<kolo::BatchBalancer> balancer;
  if (flags.balance) {
    kolo::BatchBalancerOptions balance;
    balance.global_batch = global_batch;
    balancer = std::make_unique<kolo::BatchBalancer>(balance);
  }

  // --- 3. The model ---------------------------------------------------------
  torch::manual_seed(flags.seed);
  Cnn model;

  // --- 4. The optimizer and its learning rate, step by step ------------------
  // The global batch is `workers` times larger than one worker's, so the rate
  // may be too (--scale-lr, linear scaling); the warmup climbs to it from the
  // single-worker rate over the first epochs. LARS and LAMB instead take a
  // rate set for the global batch, reached from near zero by the warmup
  // (optimizer_choice.h).
  const fashion_mnist::OptimizerChoice choice = fashion_mnist::resolved(flags.optimizer);
  const kolo::LrScheduleOptions schedule_options =
      fashion_mnist::schedule_options(choice.lr, schedule_choice(flags), workers, steps_per_epoch);
  const kolo::LrSchedule schedule(schedule_options);
  const std::unique_ptr<torch::optim::Optimizer> base_optimizer =
      fashion_mnist::make_optimizer(choice, *model);

  // --- 5. Same starting point on every worker -----------------------------
  // Rank 0's weights and optimizer state (none yet before the first step; a
  // checkpoint overwrites both below).
  kolo::broadcast_parameters(*model, /*root=*/0);
  kolo::broadcast_optimizer_state(*base_optimizer, /*root=*/0);

  // --- 6. The distributed optimizer -------------------------------------------
  // backward() hands the gradients to kolo's engine in buckets (DDP's 25 MiB
  // by default; this model's 4.8 MB of gradients make one bucket, averaged
  // over the workers in one fused allreduce as backward() ends);
  // optimizer->step() waits for them, then steps the optimizer. With
  // --zero-stage 1-3 the same call builds a kolo::ZeroOptimizer, which shards
  // the optimizer's state (and the gradients, and the parameters) across the
  // workers instead.
  kolo::ParallelOptimizerOptions optimizer_options;
  optimizer_options.zero_stage = flags.zero_stage;
  optimizer_options.compression = kolo::parse_compression(flags.compression);
  const std::unique_ptr<kolo::ParallelOptimizer> optimizer =
      kolo::make_parallel_optimizer(*base_optimizer, *model, optimizer_options);
  // --resume: every worker continues from the checkpoint, whatever stage and
  // worker count wrote it.
  int first_epoch = 0;
  if (flags.resume) {
    first_epoch = static_cast<int>(kolo::load_checkpoint(flags.checkpoint_dir, *optimizer).epoch);
    if (chief) {
      std::printf("Resumed from %s after epoch %d\n", flags.checkpoint_dir.c_str(), first_epoch);
    }
  }
  // Dropout masks differ per worker (the weights are already identical).
  torch::manual_seed(flags.seed + 1000003ULL * static_cast<uint64_t>(rank + 1));

  if (chief) {
    std::printf("Fashion-MNIST: %d worker(s) x %d thread(s), %s backend, launched by %s\n", workers,
                threads, kolo::runtime().world().backend(),
                kolo::runtime().topology().source.c_str());
    std::printf(
        "  %lld training images (%lld per worker, %lld steps per epoch), %lld test images\n",
        static_cast<long long>(train.images.size(0)),
        static_cast<long long>(flags.balance ? shard_size / workers : shard_size),
        static_cast<long long>(steps_per_epoch), static_cast<long long>(test.images.size(0)));
    std::printf(
        "  batch %lld per worker (global %lld), gradient compression %s, ZeRO stage %d, "
        "precision %s\n",
        static_cast<long long>(flags.batch_size),
        static_cast<long long>(flags.batch_size * workers), flags.compression.c_str(),
        flags.zero_stage, flags.precision.c_str());
    print_optimizer(choice, schedule_options, flags.lr_decay);
    std::fflush(stdout);
  }

  // --- 7. Train -----------------------------------------------------------------
  const int64_t log_every =
      std::max<int64_t>(1, steps_per_epoch / std::max(1, flags.progress_lines));
  std::vector<EpochRecord> records;
  for (int epoch = first_epoch; epoch < flags.epochs; ++epoch) {
    if (chief) {
      std::printf("Epoch %d/%d\n", epoch + 1, flags.epochs);
      std::fflush(stdout);
    }
    sampler.set_epoch(epoch);
    const torch::Tensor order = index_tensor(sampler);
    double loss_sum = 0;  // over this worker's images so far
    int64_t correct = 0;
    int64_t seen = 0;
    const Clock::time_point start = Clock::now();
    for (int64_t step = 0; step < steps_per_epoch; ++step) {
      const Clock::time_point step_start = Clock::now();
      const int64_t first = balancer ? step * global_batch + balancer->offset()  // --balance
                                     : step * flags.batch_size;
      const int64_t count = balancer ? balancer->batch() : flags.batch_size;
      const torch::Tensor rows = order.slice(0, first, first + count);
      const torch::Tensor images = as_input(train.images.index_select(0, rows));  // (B, 1, 28, 28)
      const torch::Tensor labels = train.labels.index_select(0, rows);            // (B)

      kolo::apply_lr(*base_optimizer, schedule.lr(epoch, step));
      optimizer->zero_grad();
      torch::Tensor logits, loss;
      {
        // --precision bf16: convolutions and linear layers compute in bf16;
        // weights, gradients and Adam's state stay float32.
        kolo::AutocastGuard autocast(torch::kBFloat16, flags.precision == "bf16");
        logits = model->forward(images);  // (B, 10)
        loss = torch::nn::functional::cross_entropy(logits, labels);
      }
      if (balancer) {
        // Uneven batches: weight this worker's mean loss by its share so that
        // the averaged gradient is the mean over the whole global batch, then
        // report this worker's compute time (not the wait in step()).
        (loss * balancer->gradient_weight()).backward();
        balancer->record(seconds_since(step_start));
      } else {
        loss.backward();  // gradients' allreduces start here, in buckets (one, for this model)
      }
      optimizer->step();  // waits for the averaged gradients, then steps the optimizer

      const int64_t b = rows.size(0);
      loss_sum += loss.item<double>() * static_cast<double>(b);
      correct += logits.argmax(1).eq(labels).sum().item<int64_t>();
      seen += b;
      if (chief && (step + 1) % log_every == 0 && step + 1 < steps_per_epoch) {
        print_progress(step + 1, steps_per_epoch, seconds_since(start),
                       loss_sum / static_cast<double>(seen),
                       static_cast<double>(correct) / static_cast<double>(seen), false);
      }
    }
    const double epoch_s = seconds_since(start);

    // The epoch's metrics, averaged over the workers (Horovod's
    // MetricAverageCallback); the throughput counts every worker's images.
    const double train_loss = kolo::metric_average(loss_sum / static_cast<double>(seen), "loss");
    const double train_accuracy =
        kolo::metric_average(static_cast<double>(correct) / static_cast<double>(seen), "accuracy");
    const double images_per_s =
        kolo::metric_average(static_cast<double>(seen), "images") * workers / epoch_s;
    const Evaluation eval = evaluate(model, test);
    if (chief) {
      print_progress(steps_per_epoch, steps_per_epoch, epoch_s, train_loss, train_accuracy, true);
      std::printf("Epoch time: %.1f s\n", epoch_s);
      std::printf("Images/sec: %.1f (%d worker(s), %.1f per worker)\n", images_per_s, workers,
                  images_per_s / workers);
      std::printf("Test loss: %.4f - test accuracy: %.4f\n", eval.loss, eval.accuracy);
      if (balancer) {
        std::printf("Balanced batch per worker:");
        for (int64_t b : balancer->batches()) std::printf(" %lld", static_cast<long long>(b));
        std::printf("\n");
      }
      std::fflush(stdout);
    }
    records.push_back(
        {epoch + 1, epoch_s, seen * workers, images_per_s, train_loss, train_accuracy, eval});

    // Checkpoint (atomically, collective): rank 0 writes the whole model and
    // its optimizer at --zero-stage 0, every worker its shard at stages 1-3.
    if (!flags.checkpoint_dir.empty()) {
      kolo::CheckpointState state;
      state.epoch = epoch + 1;  // epochs completed
      state.seed = flags.seed;
      state.sampler = {epoch + 1, 0};
      kolo::save_checkpoint(flags.checkpoint_dir, *optimizer, state);
      if (chief) std::printf("Saved %s\n", flags.checkpoint_dir.c_str());
    }
  }
  if (chief && !records.empty()) {
    print_summary(records, workers, threads, flags.batch_size * workers);
  }
  kolo::shutdown();
  return 0;
}

// --- Elastic training (--elastic) --------------------------------------------
//
//   kolorun -np 3 --min-np 2 build/examples/fashion_mnist/fashion_mnist --elastic
//
// The same recipe for a world that may change while it trains: a worker dies
// (killed, its host gone) or kolorun starts a new one. kolorun decides each
// world (a "round"); kolo::elastic::run calls train() once per round with kolo
// initialised for it. What must survive a change is a kolo::elastic::TorchState:
// the model, the optimizer's state, the epoch, the step and how many of the epoch's
// images the whole world has taken. Every --commit-every steps (and at the end
// of every epoch) the workers commit it, an in-memory snapshot. After a change
// every worker returns to the last commit of rank 0 (the oldest survivor), and
// the new world shares out the images of the epoch not yet taken. The steps
// done since that commit are done again: at most --commit-every of them.
// (docs/elastic.md)

// The epoch's training metrics over the whole world, committed with the
// state so that an epoch's summary row covers the whole epoch, whatever
// re-formations happened in it: each commit adds the world's sums since the
// previous commit; a restore returns to the committed sums, so steps done
// again after a fault count once.
struct EpochTotals {
  double loss_sum = 0;  // sum over the images of the loss
  double correct = 0;
  double images = 0;
  double started = 0;  // when the epoch's first step ran, system_clock seconds (0: not yet)
};

// TorchState plus the totals (elastic.h: a State serialises what it holds).
class ElasticTraining : public kolo::elastic::TorchState {
 public:
  using TorchState::TorchState;
  EpochTotals totals;

 protected:
  kolo::Bytes serialize() override {
    kolo::Bytes bytes = TorchState::serialize();
    const auto* raw = reinterpret_cast<const uint8_t*>(&totals);
    bytes.insert(bytes.end(), raw, raw + sizeof(totals));
    return bytes;
  }
  void deserialize(const kolo::Bytes& bytes) override {
    if (bytes.size() < sizeof(totals)) {
      throw std::runtime_error("elastic commit too short for the epoch totals");
    }
    const size_t state_bytes = bytes.size() - sizeof(totals);
    std::memcpy(&totals, bytes.data() + state_bytes, sizeof(totals));
    TorchState::deserialize(kolo::Bytes(bytes.begin(), bytes.begin() + state_bytes));
  }
};

// FNV-1a over the bytes of every parameter, in registration order.
uint64_t parameters_fingerprint(torch::nn::Module& model) {
  uint64_t hash = 1469598103934665603ULL;
  for (const torch::Tensor& p : model.parameters()) {
    const torch::Tensor t = p.detach().contiguous();
    const auto* bytes = static_cast<const uint8_t*>(t.data_ptr());
    for (size_t i = 0; i < t.nbytes(); ++i) hash = (hash ^ bytes[i]) * 1099511628211ULL;
  }
  return hash;
}

double wall_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

int run_elastic(const Flags& flags) {
  const int threads = flags.threads > 0 ? flags.threads : default_threads();
  torch::set_num_threads(threads);
  keep_freed_memory();

  // Data, model and optimizer as in run(), built once: they outlive the rounds.
  fashion_mnist::Split train, test;
  std::tie(train, test) = load_data(flags);
  const int64_t train_size = train.images.size(0);
  torch::manual_seed(flags.seed);
  Cnn model;
  const fashion_mnist::OptimizerChoice choice = fashion_mnist::resolved(flags.optimizer);
  const std::unique_ptr<torch::optim::Optimizer> base_optimizer =
      fashion_mnist::make_optimizer(choice, *model);

  // The state that survives a change. With --checkpoint-dir rank 0 also
  // writes every commit to <dir>/elastic.commit (--resume starts from it) and
  // the state each round starts from to <dir>/round<k>.start.
  kolo::DistributedSamplerOptions shard;
  shard.seed = flags.seed;
  kolo::elastic::State::Options commit_options;
  if (!flags.checkpoint_dir.empty()) {
    std::filesystem::create_directories(flags.checkpoint_dir);
    commit_options.commit_path = flags.checkpoint_dir + "/elastic.commit";
  }
  ElasticTraining state(*model, base_optimizer.get(), static_cast<size_t>(train_size), shard,
                        commit_options);
  // A missing, truncated or corrupt commit file is an error naming it.
  if (flags.resume) state.load_commit_file(commit_options.commit_path);

  std::vector<EpochRecord> records;
  int workers = 1;
  kolo::elastic::run(state, [&] {
    // --- A round: kolo is initialised for this world ---------------------------
    const int rank = kolo::rank();
    workers = kolo::size();
    const bool chief = rank == 0;
    // Built afresh per round: it belongs to this round's engine.
    kolo::DistributedOptimizerOptions dist_options;
    dist_options.compression = kolo::parse_compression(flags.compression);
    kolo::DistributedOptimizer optimizer(*base_optimizer, model->named_parameters(), dist_options);
    // The rate is scaled for this world's size (the warmup counts this world's steps).
    const kolo::LrSchedule schedule(fashion_mnist::schedule_options(
        choice.lr, schedule_choice(flags), workers,
        (train_size + flags.batch_size * workers - 1) / (flags.batch_size * workers)));
    // Dropout's masks: seeded by the rank and the point the round resumes
    // from, so that a world of the same size resuming from the same commit
    // trains exactly alike (kolo-bench chaos replays rounds that way).
    torch::manual_seed(flags.seed + 1000003ULL * static_cast<uint64_t>(rank + 1) +
                       7919ULL * static_cast<uint64_t>(state.epoch * 1000003 + state.batch));
    if (chief) {
      std::printf("Round %lld: %d worker(s), %s backend; epoch %lld resumes at step %lld\n",
                  static_cast<long long>(state.round()), workers, kolo::runtime().world().backend(),
                  static_cast<long long>(state.epoch + 1), static_cast<long long>(state.batch));
      std::printf("round_start_params_fnv1a=%016llx\n",
                  static_cast<unsigned long long>(parameters_fingerprint(*model)));
      std::fflush(stdout);
      if (!flags.checkpoint_dir.empty() && !state.committed().empty()) {
        // The state this round trains from (rank 0's last commit, which sync()
        // gave everyone; no file: the initial model), for replays.
        state.write_commit_file(flags.checkpoint_dir + "/round" + std::to_string(state.round()) +
                                ".start");
      }
    }
    // --stop-at EPOCH:STEP: true once the commit at that point is made.
    auto at_stop = [&] {
      return !flags.stop_at.empty() &&
             flags.stop_at == std::to_string(state.epoch + 1) + ":" + std::to_string(state.batch);
    };

    while (state.epoch < flags.epochs) {
      if (chief && state.batch == 0) {
        std::printf("Epoch %lld/%d\n", static_cast<long long>(state.epoch + 1), flags.epochs);
      }
      // This world's share of the images of the epoch not yet taken.
      kolo::DistributedSampler& sampler = state.sampler();
      const int64_t left = static_cast<int64_t>(sampler.size()) - sampler.position().next_index;
      const int64_t steps = state.batch + (left + flags.batch_size - 1) / flags.batch_size;
      const int64_t log_every = std::max<int64_t>(1, steps / std::max(1, flags.progress_lines));
      double loss_sum = 0;  // over this worker's images of this epoch in this round
      int64_t correct = 0;
      int64_t seen = 0;
      double uncommitted[3] = {0, 0, 0};  // loss sum, correct, images since the last commit
      const Clock::time_point start = Clock::now();
      if (state.totals.started == 0) state.totals.started = wall_seconds();
      // Adds the world's sums since the last commit to the totals, then
      // commits; true when --stop-at's point is reached.
      auto commit = [&] {
        kolo::TensorOpOptions sum;
        sum.op = kolo::ReduceOp::kSum;
        const torch::Tensor sums = kolo::allreduce(
            torch::tensor({uncommitted[0], uncommitted[1], uncommitted[2]}, torch::kDouble),
            "epoch_totals", sum);
        state.totals.loss_sum += sums[0].item<double>();
        state.totals.correct += sums[1].item<double>();
        state.totals.images += sums[2].item<double>();
        std::fill(std::begin(uncommitted), std::end(uncommitted), 0.0);
        state.commit();
        return at_stop();
      };
      while (auto rows = sampler.next(static_cast<size_t>(flags.batch_size))) {
        const torch::Tensor index =
            torch::tensor(std::vector<int64_t>(rows->begin(), rows->end()), torch::kLong);
        const torch::Tensor images = as_input(train.images.index_select(0, index));
        const torch::Tensor labels = train.labels.index_select(0, index);
        kolo::apply_lr(*base_optimizer, schedule.lr(state.epoch, state.batch));
        optimizer.zero_grad();
        torch::Tensor logits, loss;
        {
          kolo::AutocastGuard autocast(torch::kBFloat16, flags.precision == "bf16");
          logits = model->forward(images);
          loss = torch::nn::functional::cross_entropy(logits, labels);
        }
        loss.backward();
        optimizer.step();  // a dead peer makes this throw; run() takes it from there
        ++state.batch;

        const double batch_loss = loss.item<double>() * static_cast<double>(labels.size(0));
        const int64_t batch_correct = logits.argmax(1).eq(labels).sum().item<int64_t>();
        loss_sum += batch_loss;
        correct += batch_correct;
        seen += labels.size(0);
        uncommitted[0] += batch_loss;
        uncommitted[1] += static_cast<double>(batch_correct);
        uncommitted[2] += static_cast<double>(labels.size(0));
        if (chief && state.batch % log_every == 0 && state.batch < steps) {
          print_progress(state.batch, steps, seconds_since(start),
                         loss_sum / static_cast<double>(seen),
                         static_cast<double>(correct) / static_cast<double>(seen), false);
        }
        if (state.batch % flags.commit_every == 0 && commit()) return;
      }
      // The whole epoch, across every round it took (the totals committed so
      // far plus this round's rest).
      if (commit()) return;  // the end of an epoch is always a commit
      const EpochTotals totals = state.totals;
      const double epoch_s = std::max(wall_seconds() - totals.started, 1e-9);
      const double images = std::max(totals.images, 1.0);
      const double train_loss = totals.loss_sum / images;
      const double train_accuracy = totals.correct / images;
      const Evaluation eval = evaluate(model, test);
      if (chief) {
        print_progress(steps, steps, epoch_s, train_loss, train_accuracy, true);
        std::printf("Test loss: %.4f - test accuracy: %.4f\n", eval.loss, eval.accuracy);
        std::fflush(stdout);
      }
      // An epoch redone after a change replaces its row.
      const int epoch = static_cast<int>(state.epoch) + 1;
      while (!records.empty() && records.back().epoch >= epoch) records.pop_back();
      records.push_back({epoch, epoch_s, static_cast<int64_t>(totals.images),
                         totals.images / epoch_s, train_loss, train_accuracy, eval});
      ++state.epoch;
      state.batch = 0;
      state.totals = EpochTotals{};
      state.commit();  // the next epoch starts from a commit with fresh totals
      if (at_stop()) return;
    }
  });
  if (kolo::rank() == 0 && !records.empty()) {
    print_summary(records, workers, threads, flags.batch_size * workers);
  }
  if (kolo::rank() == 0) {
    // A fingerprint of the trained weights: runs that end with the same
    // parameters print the same line (kolo-bench chaos compares them).
    std::printf("final_params_fnv1a=%016llx\n",
                static_cast<unsigned long long>(parameters_fingerprint(*model)));
    std::fflush(stdout);
  }
  kolo::shutdown();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags;
  CLI::App app{"Fashion-MNIST CNN trained data-parallel with kolo (run it under kolorun)"};
  app.add_option("--epochs", flags.epochs, "Epochs to train")->capture_default_str();
  app.add_option("--batch-size", flags.batch_size, "Images per worker per step")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--optimizer", flags.optimizer.name,
                 "adam, sgd (with momentum), lars or lamb (layer-wise, for large batches: "
                 "docs/large_batch.md)")
      ->capture_default_str()
      ->check(CLI::IsMember({"adam", "sgd", "lars", "lamb"}));
  app.add_option("--lr", flags.optimizer.lr,
                 "Learning rate (with --scale-lr: for one worker); default: adam 0.001, sgd "
                 "0.05, lars and lamb the 8 x 2048 recipe's (docs/large_batch.md)")
      ->check(CLI::PositiveNumber);
  app.add_option("--momentum", flags.optimizer.momentum, "Momentum of sgd and lars")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 0.999999));
  app.add_option("--weight-decay", flags.optimizer.weight_decay,
                 "Weight decay; default: adam 0, sgd and lars 5e-4, lamb 0.01 (lars and lamb "
                 "leave biases and normalisation parameters undecayed)")
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--scale-lr", flags.scale_lr, "Multiply the learning rate by the number of workers");
  app.add_option("--warmup-epochs", flags.warmup_epochs,
                 "Epochs over which the rate climbs linearly: from --lr to the scaled rate with "
                 "--scale-lr, else from --lr / (warmup steps) to --lr")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--lr-decay", flags.lr_decay,
                 "After the warmup: constant, or cosine (down to 0 at the last epoch)")
      ->capture_default_str()
      ->check(CLI::IsMember({"constant", "cosine"}));
  app.add_option("--checkpoint-dir", flags.checkpoint_dir,
                 "Save after every epoch: rank 0 writes <dir>/checkpoint.kolo (--zero-stage 0) "
                 "or every rank its shard of <dir>/zero/ (stages 1-3); with --elastic, every "
                 "commit to <dir>/elastic.commit and each round's starting state to "
                 "<dir>/round<k>.start");
  app.add_flag("--resume", flags.resume,
               "Start from the checkpoint in --checkpoint-dir (same --zero-stage kind; a ZeRO "
               "checkpoint loads at any worker count)");
  app.add_option("--threads", flags.threads,
                 "Threads per worker (default: $OMP_NUM_THREADS, which kolorun sets, else 1)");
  app.add_option("--train-subset", flags.train_subset,
                 "Train on the first N images only (quick runs); 0 = all")
      ->capture_default_str();
  app.add_option("--test-subset", flags.test_subset, "Test on the first N images only; 0 = all")
      ->capture_default_str();
  app.add_option("--zero-stage", flags.zero_stage,
                 "0 = DistributedOptimizer; 1, 2, 3 = ZeRO stage (kolo::ZeroOptimizer)")
      ->check(CLI::Validator(
          [](std::string& value) -> std::string {
            if (value == "0" || value == "1" || value == "2" || value == "3") return "";
            return "is '" + value +
                   "'; use 0 (DistributedOptimizer, plain data parallelism) or the ZeRO stage 1, "
                   "2 or 3 (docs/zero.md)";
          },
          "0|1|2|3"))
      ->capture_default_str();
  app.add_option("--precision", flags.precision,
                 "Arithmetic of the forward pass: fp32, or bf16 (bf16 autocast; float32 weights, "
                 "gradients and optimizer state)")
      ->check(CLI::IsMember({"fp32", "bf16"}))
      ->capture_default_str();
  app.add_option("--compression", flags.compression, "Gradient compression: none, fp16, bf16")
      ->capture_default_str()
      ->check(CLI::IsMember({"none", "fp16", "bf16"}));
  app.add_option("--data-dir", flags.data_dir, "Directory of the gzipped IDX files")
      ->capture_default_str();
  app.add_option("--seed", flags.seed, "Seed shared by all workers")->capture_default_str();
  app.add_option("--progress-lines", flags.progress_lines, "Progress lines per epoch")
      ->capture_default_str();
  app.add_flag("--balance", flags.balance,
               "Split each global batch (workers x --batch-size) by the workers' measured speed "
               "(kolo::BatchBalancer) instead of evenly");
  app.add_flag("--elastic", flags.elastic,
               "Survive workers dying and joining under kolorun --min-np/--max-np "
               "(docs/elastic.md)");
  app.add_option("--commit-every", flags.commit_every,
                 "--elastic: commit the training state every N steps (and at each epoch's end)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--stop-at", flags.stop_at,
                 "--elastic: stop once the commit at EPOCH:STEP (1-based epoch, steps done) is "
                 "made, e.g. to replay one round of an elastic run (kolo-bench chaos)")
      ->type_name("EPOCH:STEP");
  CLI11_PARSE(app, argc, argv);
  if (flags.resume && flags.checkpoint_dir.empty()) {
    std::fprintf(stderr, "fashion_mnist: --resume needs --checkpoint-dir\n");
    return 2;
  }
  if (flags.zero_stage != 0 && flags.compression != "none") {
    // kolo::ZeroOptimizer reduce-scatters full-precision gradients (docs/zero.md).
    std::fprintf(stderr,
                 "fashion_mnist: --compression %s works with --zero-stage 0 only (ZeRO stage %d "
                 "does not compress gradients); drop --compression or use --zero-stage 0\n",
                 flags.compression.c_str(), flags.zero_stage);
    return 2;
  }
  if (flags.elastic && flags.balance) {
    std::fprintf(stderr,
                 "fashion_mnist: --balance works without --elastic only (an elastic round "
                 "re-shards the data by worker, not by global batch); drop one of them\n");
    return 2;
  }
  if (flags.elastic && flags.zero_stage != 0) {
    std::fprintf(
        stderr,
        "fashion_mnist: --elastic cannot be combined with --zero-stage %d: ZeRO shards "
        "the optimizer's state across a fixed set of workers, while an elastic commit holds the "
        "whole state on every worker; use --zero-stage 0 (the default) with --elastic\n",
        flags.zero_stage);
    return 2;
  }
  try {
    return flags.elastic ? run_elastic(flags) : run(flags);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fashion_mnist: error: %s\n", e.what());
    return 1;
  }
}
