// --elastic: what an elastic run reports per round, for replaying a round
// bitwise (kolo-bench chaos; docs/elastic.md, "The example").
#pragma once

#include <torch/torch.h>

#include "flags.h"
#include "kolo/torch.h"
#include "model.h"

namespace fashion_mnist {

// A callback over the elastic state that, at each round's start (train begin
// or reset), seeds dropout by the rank and the point the round resumes from
// (so that a world of the same size resuming from the same commit trains
// exactly alike) and, on rank 0, prints
//   Round 2: 2 worker(s), gloo backend; epoch 1 resumes at step 8
//   round_start_params_fnv1a=<fingerprint of the parameters>
// and with --checkpoint-dir writes the state the round starts from to
// <dir>/round<k>.start; --stop-at EPOCH:STEP stops training once the commit
// at that point is made; at the end rank 0 prints final_params_fnv1a=.
class RoundReport : public kolo::Callback {
 public:
  RoundReport(const Flags& flags, Cnn& model, kolo::elastic::TrainerState& state)
      : flags_(flags), model_(model), state_(state) {}
  void on_train_begin(kolo::Trainer& trainer) override { on_round(trainer); }
  void on_reset(kolo::Trainer& trainer) override { on_round(trainer); }
  void on_batch_end(kolo::Trainer& trainer, int64_t step, kolo::Logs& logs) override;
  void on_epoch_end(kolo::Trainer& trainer, int64_t epoch, kolo::Logs& logs) override;
  void on_train_end(kolo::Trainer& trainer, kolo::Logs& logs) override;

 private:
  void on_round(kolo::Trainer& trainer);
  const Flags& flags_;
  Cnn& model_;
  kolo::elastic::TrainerState& state_;
};

}  // namespace fashion_mnist
