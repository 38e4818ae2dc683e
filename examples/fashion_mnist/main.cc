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
//   2. load the data (each worker takes its shard of it every epoch: the
//      Trainer's DistributedSampler)
//   3. build the model (the seed's Keras CNN)
//   4. choose the optimizer (--optimizer adam|sgd|lars|lamb)
//   5. start every worker from rank 0's weights and optimizer state
//   6. wrap the optimizer in kolo::DistributedOptimizer (or, with --zero-stage 1-3,
//      kolo::ZeroOptimizer, which shards it across the workers)
//   7. train with kolo::Trainer (Keras' model.fit) and Horovod's callbacks: the
//      learning-rate warmup, metrics averaged across workers, rank 0 prints
//      and saves checkpoints (and resumes from them)
//
// With --strategy mirrored each process runs --replicas workers as threads
// that share its one copy of the data (kolo::MirroredStrategy, mirrored.cc).
// With --strategy ps-sync|ps-async|ps-ssp (under kolorun --servers S) the
// optimizer runs on parameter servers instead: workers pull the parameters
// and push their gradients (kolo::ps, parameter_server.cc).
// With --elastic (under kolorun --min-np/--max-np) the same training survives
// workers dying and joining (fit_elastic below, docs/elastic.md). With --balance
// the global batch is split by each worker's measured speed
// (kolo::BatchBalancer) instead of evenly: for workers on cores, machines or
// neighbours of different speeds.
#include <torch/torch.h>

#include <cstdio>
#include <exception>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "flags.h"
#include "kolo/torch.h"
#include "mirrored.h"
#include "model.h"
#include "optimizer_choice.h"
#include "parameter_server.h"
#include "round_report.h"
#include "training.h"

namespace fashion_mnist {
namespace {

// A callback of our own (any kolo::Callback): rank 0 prints the run's
// header, each epoch's test metrics, and the closing table of every epoch.
// Added after MetricAverage and Throughput, so it reads their logs.
class Report : public kolo::Callback {
 public:
  Report(const Flags& flags, int64_t train_size, int64_t test_size)
      : flags_(flags), train_size_(train_size), test_size_(test_size) {}

  void on_train_begin(kolo::Trainer& trainer) override {
    // A worker restarted into a running parameter-server job (kolorun
    // --restart-workers) has no world to name; its first start printed this.
    if (trainer.rank() != 0 || kolo::runtime().config().get_int("KOLO_PS_REJOIN") > 0) return;
    const int workers = trainer.world_size();
    std::printf("Fashion-MNIST: %d worker(s) x %d thread(s), %s backend, launched by %s\n", workers,
                threads_of(flags_), kolo::runtime().world().backend(),
                kolo::runtime().topology().source.c_str());
    std::printf(
        "  %lld training images (%lld per worker, %lld steps per epoch), %lld test images\n",
        static_cast<long long>(train_size_),
        static_cast<long long>(flags_.balance ? train_size_ / workers
                                              : (train_size_ + workers - 1) / workers),
        static_cast<long long>(trainer.steps_per_epoch()), static_cast<long long>(test_size_));
    const std::string compression = flags_.compression == "powersgd"
                                        ? "powersgd rank " + std::to_string(flags_.powersgd_rank)
                                        : flags_.compression;
    std::printf(
        "  batch %lld per worker (global %lld), gradient compression %s, ZeRO stage %d, "
        "precision %s\n",
        static_cast<long long>(flags_.batch_size),
        static_cast<long long>(flags_.batch_size * workers), compression.c_str(), flags_.zero_stage,
        flags_.precision.c_str());
    const OptimizerChoice choice = resolved(flags_.optimizer);
    print_optimizer(choice, schedule_of(flags_, choice, workers, trainer.steps_per_epoch()),
                    flags_.lr_decay);
    std::fflush(stdout);
  }

  void on_epoch_end(kolo::Trainer& trainer, int64_t epoch, kolo::Logs& logs) override {
    // An epoch trained again after an elastic re-formation replaces its row.
    while (!records_.empty() && records_.back().epoch >= epoch + 1) records_.pop_back();
    records_.push_back({static_cast<int>(epoch) + 1, logs.at("epoch_time"),
                        static_cast<int64_t>(logs.at("images")), logs.at("images_per_sec"),
                        logs.at("loss"), logs.at("accuracy"), logs.at("val_loss"),
                        logs.at("val_accuracy")});
    if (trainer.rank() != 0) return;
    std::printf("Test loss: %.4f - test accuracy: %.4f\n", logs.at("val_loss"),
                logs.at("val_accuracy"));
    if (const kolo::BatchBalancer* balancer = trainer.balancer()) {
      std::printf("Balanced batch per worker:");
      for (int64_t b : balancer->batches()) std::printf(" %lld", static_cast<long long>(b));
      std::printf("\n");
    }
    std::fflush(stdout);
  }

  void on_train_end(kolo::Trainer& trainer, kolo::Logs&) override {
    if (trainer.rank() == 0 && !records_.empty()) {
      print_summary(records_, trainer.world_size(), threads_of(flags_),
                    flags_.batch_size * trainer.world_size());
    }
  }

 private:
  const Flags& flags_;
  int64_t train_size_, test_size_;
  std::vector<EpochRecord> records_;
};

using Callbacks = std::vector<std::shared_ptr<kolo::Callback>>;
Callbacks callbacks_of(const Flags& flags, const kolo::Dataset& train, const kolo::Dataset& test);
void train_model(const Flags& flags, Cnn& model, kolo::ParallelOptimizer& optimizer,
                 const kolo::Dataset& train, const kolo::Dataset& test,
                 const kolo::CallOptions& where, const Callbacks& callbacks,
                 kolo::elastic::TrainerState* elastic = nullptr);

// Steps 3-7 of the recipe: one worker's training, its kolo calls on `where`
// (the default engine for a worker process; a replica's engine with
// --strategy mirrored).
void fit(const Flags& flags, const kolo::Dataset& train, const kolo::Dataset& test,
         const kolo::CallOptions& where) {
  // --- 3. The model: the seed's Keras CNN (model.h) --------------------------
  //   Conv2D(32, 3x3, ReLU) -> Conv2D(64, 3x3, ReLU) -> MaxPool(2x2) -> Dropout(0.25)
  //   -> Flatten -> Dense(128, ReLU) -> Dropout(0.5) -> Dense(10)
  torch::manual_seed(flags.seed);
  Cnn model;
  model->to(device_of(flags));  // --device cuda: this worker's GPU

  // --- 4. The optimizer (its rate follows the schedule: step 7) ---------------
  const OptimizerChoice choice = resolved(flags.optimizer);
  const std::unique_ptr<torch::optim::Optimizer> base_optimizer = make_optimizer(choice, *model);

  // --- 5. Same starting point on every worker ----------------------------------
  // Rank 0's weights and optimizer state (none yet before the first step; a
  // checkpoint overwrites both). Before step 6: ZeRO shards what it wraps.
  kolo::broadcast_parameters(*model, /*root=*/0, where);
  kolo::broadcast_optimizer_state(*base_optimizer, /*root=*/0, where);

  // --- 6. The distributed optimizer ---------------------------------------------
  // backward() hands the gradients to kolo's engine in buckets (DDP's 25 MiB
  // by default; this model's 4.8 MB of gradients make one bucket, averaged
  // over the workers in one fused allreduce as backward() ends);
  // optimizer->step() waits for them, then steps the optimizer. With
  // --zero-stage 1-3 the same call builds a kolo::ZeroOptimizer, which shards
  // the optimizer's state (and the gradients, and the parameters) instead.
  kolo::ParallelOptimizerOptions optimizer_options;
  static_cast<kolo::CallOptions&>(optimizer_options) = where;
  optimizer_options.zero_stage = flags.zero_stage;
  set_gradient_exchange(flags, optimizer_options);
  const std::unique_ptr<kolo::ParallelOptimizer> optimizer =
      kolo::make_parallel_optimizer(*base_optimizer, *model, optimizer_options);
  // Dropout masks differ per worker (the weights are already identical).
  torch::manual_seed(flags.seed + 1000003ULL * static_cast<uint64_t>(optimizer->rank() + 1));

  train_model(flags, model, *optimizer, train, test, where, callbacks_of(flags, train, test));
}

// --- With --elastic: steps 3-7 for a world that may change while it trains --
// A worker dies (killed, its host gone) or kolorun starts a new one; kolorun
// decides each world (a "round") and kolo::elastic::run calls the training
// function once per round, kolo initialised for it. What survives a change
// is a kolo::elastic::TrainerState: the model, the optimizer's state, the
// epoch, the step, the images of the epoch the world has taken, the epoch's
// metrics and the callbacks' state. The Trainer commits it every
// --commit-every steps and at each epoch's end; after a change every worker
// returns to rank 0's last commit (rank 0 is the oldest survivor), the new
// world shares out the epoch's images not yet taken, and the rate follows
// the new world's size. At most --commit-every steps are done again.
void fit_elastic(const Flags& flags, const kolo::Dataset& train, const kolo::Dataset& test) {
  // Model and optimizer built once: they outlive the rounds (no broadcast:
  // each round starts from rank 0's state).
  torch::manual_seed(flags.seed);
  Cnn model;
  const std::unique_ptr<torch::optim::Optimizer> base_optimizer =
      make_optimizer(resolved(flags.optimizer), *model);
  kolo::elastic::TrainerState::Options elastic;
  elastic.commit_every = flags.commit_every;
  elastic.sampling.seed = flags.seed;
  if (!flags.checkpoint_dir.empty()) {
    // Rank 0 also writes every commit there; --resume starts from it.
    std::filesystem::create_directories(flags.checkpoint_dir);
    elastic.commit_path = flags.checkpoint_dir + "/elastic.commit";
  }
  kolo::elastic::TrainerState state(*model, *base_optimizer, static_cast<size_t>(train.size),
                                    elastic);
  if (flags.resume) state.load_commit_file(elastic.commit_path);  // errors name the file
  Callbacks callbacks = callbacks_of(flags, train, test);         // kept across the rounds
  callbacks.push_back(std::make_shared<RoundReport>(flags, model, state));
  kolo::elastic::run(state, [&] {
    // This round's optimizer: it belongs to this round's engine.
    kolo::ParallelOptimizerOptions optimizer_options;
    set_gradient_exchange(flags, optimizer_options);
    const std::unique_ptr<kolo::ParallelOptimizer> optimizer =
        kolo::make_parallel_optimizer(*base_optimizer, *model, optimizer_options);
    train_model(flags, model, *optimizer, train, test, {}, callbacks, &state);
  });
}

// --- 7. Train: Keras' fit with Horovod's callbacks ----------------------------
Callbacks callbacks_of(const Flags& flags, const kolo::Dataset& train, const kolo::Dataset& test) {
  Callbacks callbacks;
  // The rate, per step: the global batch is `workers` times larger than one
  // worker's, so the rate may be too (--scale-lr), reached by a warmup from
  // the single-worker rate (Goyal et al.); LARS and LAMB take a rate set for
  // the global batch, reached from near zero (optimizer_choice.h). Derived
  // from the trainer's world (again in each new world of an elastic run). On
  // parameter servers the servers' optimizer keeps --lr.
  if (!on_parameter_servers(flags)) {
    callbacks.push_back(std::make_shared<kolo::LearningRateWarmup>(
        [&flags, size = train.size](const kolo::Trainer& trainer) {
          return schedule_of(flags, resolved(flags.optimizer), trainer.world_size(),
                             trainer.steps_for(size));
        }));
  }
  callbacks.push_back(std::make_shared<kolo::MetricAverage>());  // logs averaged over the workers
  callbacks.push_back(std::make_shared<kolo::ProgressBar>(flags.progress_lines));  // rank 0
  callbacks.push_back(std::make_shared<kolo::Throughput>());  // "Epoch time", "Images/sec"
  callbacks.push_back(std::make_shared<Report>(flags, train.size, test.size));
  if (!flags.checkpoint_dir.empty() && !flags.elastic) {
    // Atomic and collective: rank 0 writes the whole model and its optimizer
    // at --zero-stage 0, every worker its shard at stages 1-3. --resume
    // continues from it, whatever stage and worker count wrote it.
    kolo::ModelCheckpointOptions checkpoint{flags.checkpoint_dir};
    checkpoint.resume = flags.resume              ? kolo::ModelCheckpointOptions::Resume::kRequired
                        : flags.resume_if_present ? kolo::ModelCheckpointOptions::Resume::kIfPresent
                                                  : kolo::ModelCheckpointOptions::Resume::kNo;
    checkpoint.verbose = true;
    callbacks.push_back(std::make_shared<kolo::ModelCheckpoint>(checkpoint));
  }
  return callbacks;
}

void train_model(const Flags& flags, Cnn& model, kolo::ParallelOptimizer& optimizer,
                 const kolo::Dataset& train, const kolo::Dataset& test,
                 const kolo::CallOptions& where, const Callbacks& callbacks,
                 kolo::elastic::TrainerState* elastic) {
  // Epochs, the batch per worker, the sampler's seed (each epoch a new
  // order, the same on every worker), bf16 autocast, --balance (training.cc).
  kolo::TrainerOptions options = trainer_options_of(flags, where);
  options.elastic = elastic;  // --elastic: train from and commit to the state
  kolo::Trainer trainer(
      *model, [&](const torch::Tensor& images) { return model->forward(images); },
      [](const torch::Tensor& logits, const torch::Tensor& labels) {
        return torch::nn::functional::cross_entropy(logits, labels);
      },
      optimizer, options);
  for (const auto& callback : callbacks) trainer.add(callback);
  trainer.fit(train, &test);
}

int run(const Flags& flags) {
  keep_freed_memory();
  if (flags.elastic) {
    // kolo::elastic::run initialises kolo for every world it joins.
    torch::set_num_threads(threads_of(flags));
    const auto [train, test] = load_data(flags);
    fit_elastic(flags, train, test);
    kolo::shutdown();
    return 0;
  }
  // --- 1. Initialise kolo; one worker per process, `threads` cores each ----
  kolo::init_torch();  // rank, size from kolorun, mpirun, srun, torchrun; else a world of one

  if (on_parameter_servers(flags)) {
    // The last processes serve the parameters (parameter_server.cc); the
    // workers read the data (step 2) and train the model the servers hold
    // (step 7).
    run_on_parameter_servers(flags, [&](Cnn& model, kolo::ParallelOptimizer& optimizer,
                                        const kolo::CallOptions& where) {
      const auto [train, test] = load_data(flags);
      train_model(flags, model, optimizer, train, test, where, callbacks_of(flags, train, test));
    });
    kolo::shutdown();
    return 0;
  }
  if (kolo::runtime().config().get_int("KOLO_PS_SERVERS") > 0) {
    throw kolo::ContractError(
        "this job has parameter servers (kolorun --servers), which --strategy " + flags.strategy +
        " does not use: add --strategy ps-sync, ps-async or ps-ssp, or "
        "launch without --servers");
  }

  // --- 2. Data: every process reads the files --------------------------------
  const auto [train, test] = load_data(flags);

  if (flags.strategy == "mirrored") {
    // --replicas workers as threads of this process, on the one copy of the
    // data (mirrored.cc); each runs steps 3-7 on its own engine.
    run_replicas(flags, [&](const kolo::CallOptions& where) { fit(flags, train, test, where); });
  } else {
    torch::set_num_threads(threads_of(flags));  // libtorch defaults to 1 thread here
    fit(flags, train, test, kolo::CallOptions{});
  }
  kolo::shutdown();
  return 0;
}

}  // namespace
}  // namespace fashion_mnist

int main(int argc, char** argv) {
  fashion_mnist::Flags flags;
  if (const std::optional<int> exit_code = fashion_mnist::parse_flags(argc, argv, flags)) {
    return *exit_code;
  }
  try {
    return fashion_mnist::run(flags);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fashion_mnist: error: %s\n", e.what());
    return 1;
  }
}
