// --strategy ps-sync | ps-async | ps-ssp: the seeds' "Design 1". Under
// `kolorun -np W --servers S` the last S processes are parameter servers:
// they hold the model's parameters (cut across them by bytes) and apply the
// optimizer to the gradients the W workers push; each worker pulls the
// parameters before its step and pushes its gradients after it
// (kolo::ps, docs/strategies.md).
#pragma once

#include <functional>

#include "flags.h"
#include "kolo/torch.h"
#include "model.h"

namespace fashion_mnist {

// A worker's training once its model and optimizer are set up: step 7 of
// the recipe, with kolo's calls on `where` (the workers' process set).
using TrainOnWorker = std::function<void(Cnn& model, kolo::ParallelOptimizer& optimizer,
                                         const kolo::CallOptions& where)>;

// Every process of the job calls it (after kolo::init): servers serve until
// every worker is done, workers build the model and run `train`. A job
// without servers (kolorun without --servers) is a ContractError naming the flag.
void run_on_parameter_servers(const Flags& flags, const TrainOnWorker& train);

}  // namespace fashion_mnist
