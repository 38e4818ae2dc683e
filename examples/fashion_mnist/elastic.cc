// --elastic: the example's training for a world that may change while it
// trains (kolo::elastic::run), on the pieces main.cc uses.
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
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "flags.h"
#include "kolo/torch.h"
#include "model.h"
#include "optimizer_choice.h"
#include "training.h"

namespace fashion_mnist {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

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

}  // namespace

int run_elastic(const Flags& flags) {
  const int threads = threads_of(flags);
  torch::set_num_threads(threads);
  keep_freed_memory();

  // Data, model and optimizer as in run() (main.cc), built once: they outlive the rounds.
  const std::pair<kolo::Dataset, kolo::Dataset> data = load_data(flags);
  const kolo::Dataset& train = data.first;
  const kolo::Dataset& test = data.second;
  const int64_t train_size = train.size;
  torch::manual_seed(flags.seed);
  Cnn model;
  const auto forward = [&](const torch::Tensor& images) { return model->forward(images); };
  const auto loss_of = [](const torch::Tensor& logits, const torch::Tensor& labels) {
    return torch::nn::functional::cross_entropy(logits, labels);
  };
  const OptimizerChoice choice = resolved(flags.optimizer);
  const std::unique_ptr<torch::optim::Optimizer> base_optimizer = make_optimizer(choice, *model);

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
    set_gradient_exchange(flags, dist_options);
    kolo::DistributedOptimizer optimizer(*base_optimizer, model->named_parameters(), dist_options);
    // The rate is scaled for this world's size (the warmup counts this world's steps).
    const kolo::LrSchedule schedule(
        schedule_of(flags, choice, workers,
                    (train_size + flags.batch_size * workers - 1) / (flags.batch_size * workers)));
    // The Trainer's step (train_on_batch) and evaluation; the loop over the
    // epoch's remaining steps, the commits and the totals are this round's own.
    kolo::TrainerOptions trainer_options;
    trainer_options.autocast_bf16 = flags.precision == "bf16";
    kolo::Trainer trainer(*model, forward, loss_of, optimizer, trainer_options);
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
        const auto [images, labels] = train.get(
            torch::tensor(std::vector<int64_t>(rows->begin(), rows->end()), torch::kLong));
        kolo::apply_lr(*base_optimizer, schedule.lr(state.epoch, state.batch));
        // A dead peer makes this throw; run() takes it from there.
        const kolo::Logs batch = trainer.train_on_batch(images, labels);
        ++state.batch;

        const double batch_loss = batch.at("loss") * static_cast<double>(labels.size(0));
        const int64_t batch_correct =
            std::llround(batch.at("accuracy") * static_cast<double>(labels.size(0)));
        loss_sum += batch_loss;
        correct += batch_correct;
        seen += labels.size(0);
        uncommitted[0] += batch_loss;
        uncommitted[1] += static_cast<double>(batch_correct);
        uncommitted[2] += static_cast<double>(labels.size(0));
        if (chief && state.batch % log_every == 0 && state.batch < steps) {
          kolo::ProgressBar::print(
              state.batch, steps, seconds_since(start),
              {{"loss", loss_sum / static_cast<double>(seen)},
               {"accuracy", static_cast<double>(correct) / static_cast<double>(seen)}},
              false);
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
      const kolo::Logs eval = trainer.evaluate(test);
      if (chief) {
        kolo::ProgressBar::print(steps, steps, epoch_s,
                                 {{"loss", train_loss}, {"accuracy", train_accuracy}}, true);
        std::printf("Test loss: %.4f - test accuracy: %.4f\n", eval.at("loss"),
                    eval.at("accuracy"));
        std::fflush(stdout);
      }
      // An epoch redone after a change replaces its row.
      const int epoch = static_cast<int>(state.epoch) + 1;
      while (!records.empty() && records.back().epoch >= epoch) records.pop_back();
      records.push_back({epoch, epoch_s, static_cast<int64_t>(totals.images),
                         totals.images / epoch_s, train_loss, train_accuracy, eval.at("loss"),
                         eval.at("accuracy")});
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

}  // namespace fashion_mnist
