// --strategy ps-sync | ps-async | ps-ssp (parameter_server.h).
#include "parameter_server.h"

#include <torch/torch.h>

#include <cstdio>
#include <memory>
#include <numeric>
#include <vector>

#include "kolo/torch.h"
#include "optimizer_choice.h"
#include "training.h"

namespace fashion_mnist {

void run_on_parameter_servers(const Flags& flags, const TrainOnWorker& train) {
  kolo::Runtime& runtime = kolo::runtime();
  if (runtime.config().get_int("KOLO_PS_SERVERS") <= 0) {
    throw kolo::ContractError("--strategy " + flags.strategy +
                              " trains on parameter servers, and this job has none: launch it "
                              "with kolorun -np W --servers S (the last S processes serve)");
  }
  // Which processes serve and the links between every server and worker.
  kolo::ps::Links links = kolo::ps::connect(runtime);
  const kolo::ps::Roles roles = links.roles;
  kolo::ps::PsOptions options;
  options.mode = kolo::ps::parse_mode(flags.strategy.substr(3), "--strategy");
  options.max_staleness = flags.max_staleness;
  if (!flags.checkpoint_dir.empty()) {
    // --checkpoint-dir: the servers' shards are the checkpoint. Each server
    // saves its slices and its optimizer's state there at every epoch's end
    // (every worker's ModelCheckpoint checks that; kolo::ps::WorkerOptimizer,
    // ps_optimizer.h); with --resume the servers start from their shards and
    // the workers from the epoch after the saved one.
    options.checkpoint_dir = flags.checkpoint_dir;
    options.checkpoint_every =
        kolo::steps_per_epoch(training_size(flags), roles.workers, trainer_options_of(flags, {}));
    if (flags.resume) options.resume_from = flags.checkpoint_dir;
  }
  // Where the workers' own collectives (metric averages, evaluation) run.
  // Sync: among them, since every step waits for every worker anyway (the
  // servers take part in none; every process adds the set). Async and ssp:
  // on an engine of each worker's own, so that no worker waits for another
  // (one the servers evict as frozen, or one kolorun --restart-workers
  // starts again, which has no world to share); each reports its own
  // metrics, worker 0's are printed.
  kolo::CallOptions where;
  std::unique_ptr<kolo::Engine> own_engine;
  if (options.mode == kolo::ps::Mode::kSync) {
    std::vector<int> workers(roles.workers);
    std::iota(workers.begin(), workers.end(), 0);
    where.process_set = runtime.engine().add_process_set(workers).id();
  } else if (!roles.is_server()) {
    own_engine = kolo::make_solo_engine(kolo::EngineOptions::from_config(runtime.config()));
    where.engine = own_engine.get();
  }

  // The model, built the same way everywhere: the servers' copies of its
  // initial parameters are where training starts.
  torch::manual_seed(flags.seed);
  Cnn model;
  torch::set_num_threads(threads_of(flags));

  if (roles.is_server()) {
    // A server keeps its slices of the parameters and runs the optimizer
    // over them (its state lives here only) until every worker is done.
    const OptimizerChoice choice = resolved(flags.optimizer);
    kolo::ps::Server server(
        model->named_parameters(),
        [&](std::vector<torch::Tensor> slices) {
          return make_elementwise_optimizer(choice, std::move(slices));
        },
        std::move(links), options);
    server.run();
    const kolo::ps::Server::Stats stats = server.stats();
    std::printf("Parameter server %d: %lld update(s), largest staleness %lld, %zu worker(s) lost\n",
                roles.server_index(), static_cast<long long>(stats.staleness.updates),
                static_cast<long long>(stats.staleness.max_staleness), stats.lost.size());
    std::fflush(stdout);
    return;
  }

  // A worker: pull the parameters, compute the gradients of its batch, push
  // them; kolo::ps::WorkerOptimizer puts that behind the optimizer interface
  // the Trainer steps (its constructor pulls the first step's parameters).
  kolo::ps::Worker worker(model->named_parameters(), std::move(links), options);
  kolo::ps::WorkerOptimizer optimizer(worker, *model, where);
  if (optimizer.rank() == 0) {
    std::printf("Parameter servers: %d worker(s), %d server(s), mode %s", roles.workers,
                roles.servers, kolo::ps::mode_name(options.mode));
    if (options.mode == kolo::ps::Mode::kSsp)
      std::printf(", max staleness %d", flags.max_staleness);
    std::printf("\n");
    std::fflush(stdout);
  }
  // Dropout masks differ per worker.
  torch::manual_seed(flags.seed + 1000003ULL * static_cast<uint64_t>(optimizer.rank() + 1));
  train(model, optimizer, where);
  const kolo::ps::Worker::Stats stats = worker.stats();
  worker.finish();  // the servers stop once every worker has finished
  if (optimizer.rank() == 0) {
    std::printf("Worker 0: max staleness seen: %lld, %.1f MB pulled, %.1f MB pushed\n",
                static_cast<long long>(stats.max_staleness_seen), stats.bytes_pulled / 1e6,
                stats.bytes_pushed / 1e6);
    std::fflush(stdout);
  }
}

}  // namespace fashion_mnist
