// RoundReport (round_report.h).
#include "round_report.h"

#include <cstdint>
#include <cstdio>
#include <string>

namespace fashion_mnist {
namespace {

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

}  // namespace

void RoundReport::on_round(kolo::Trainer& trainer) {
  const int rank = trainer.rank();
  torch::manual_seed(flags_.seed + 1000003ULL * static_cast<uint64_t>(rank + 1) +
                     7919ULL * static_cast<uint64_t>(state_.epoch * 1000003 + state_.batch));
  if (rank != 0) return;
  std::printf("Round %lld: %d worker(s), %s backend; epoch %lld resumes at step %lld\n",
              static_cast<long long>(state_.round()), trainer.world_size(),
              kolo::runtime().world().backend(), static_cast<long long>(state_.epoch + 1),
              static_cast<long long>(state_.batch));
  std::printf("round_start_params_fnv1a=%016llx\n",
              static_cast<unsigned long long>(parameters_fingerprint(*model_)));
  std::fflush(stdout);
  if (!flags_.checkpoint_dir.empty() && !state_.committed().empty()) {
    // The state this round trains from (rank 0's last commit, which sync()
    // gave everyone; no file in a world of one's first round: the initial model).
    state_.write_commit_file(flags_.checkpoint_dir + "/round" + std::to_string(state_.round()) +
                             ".start");
  }
}

void RoundReport::on_batch_end(kolo::Trainer& trainer, int64_t, kolo::Logs&) {
  // --stop-at points are commit points: fit() commits this batch, then stops.
  if (!flags_.stop_at.empty() &&
      flags_.stop_at == std::to_string(state_.epoch + 1) + ":" + std::to_string(state_.batch)) {
    trainer.stop_training = true;
  }
}

void RoundReport::on_epoch_end(kolo::Trainer& trainer, int64_t epoch, kolo::Logs&) {
  // The commit after the epoch's end is at (next epoch, step 0).
  if (!flags_.stop_at.empty() && flags_.stop_at == std::to_string(epoch + 2) + ":0") {
    trainer.stop_training = true;
  }
}

void RoundReport::on_train_end(kolo::Trainer& trainer, kolo::Logs&) {
  if (trainer.rank() != 0) return;
  // A fingerprint of the trained weights: runs that end with the same
  // parameters print the same line (kolo-bench chaos compares them).
  std::printf("final_params_fnv1a=%016llx\n",
              static_cast<unsigned long long>(parameters_fingerprint(*model_)));
  std::fflush(stdout);
}

}  // namespace fashion_mnist
