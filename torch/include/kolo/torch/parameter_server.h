// Parameter server (the seeds' "Design 1"; TensorFlow's ParameterServerStrategy):
// servers hold the parameters and apply the optimizer, workers pull the
// parameters, compute gradients on their batches and push them.
//
//   kolorun -np 2 --servers 1 ./train      (ranks 0, 1 work; rank 2 serves)
//
//   kolo::init();
//   auto model = make_model();                     // every rank, the same way
//   kolo::ps::Links links = kolo::ps::connect(kolo::runtime());
//   kolo::ps::PsOptions options;                   // mode: sync, async or ssp
//   if (links.roles.is_server()) {
//     kolo::ps::Server server(model->named_parameters(), [](std::vector<torch::Tensor> p) {
//       return std::make_unique<torch::optim::Adam>(p, torch::optim::AdamOptions(1e-3));
//     }, std::move(links), options);
//     server.run();                                // until every worker has left
//   } else {
//     kolo::ps::Worker worker(model->named_parameters(), std::move(links), options);
//     for (...) {
//       worker.pull();                             // model <- the servers' parameters
//       loss(model, batch).backward();
//       worker.push();                             // the gradients -> the servers
//     }
//     worker.finish();
//   }
//
// The parameters (which must share one floating dtype) are partitioned across
// the servers by bytes (kolo/core/parameter_server.h: Partition::by_bytes); a
// server keeps its slices as flat leaf tensors and runs the optimizer the
// factory builds over them, so any element-wise torch::optim optimizer (SGD,
// Adam, AdamW, Adagrad, RMSprop) behaves as on the whole model, its state
// living on the servers only. Layer-wise optimizers (LARS, LAMB) see slices,
// not layers: use DistributedOptimizer for them.
//
// Where training starts: the servers' copies of the parameters as their
// model was built (seed it, or load a checkpoint on the servers); workers
// take them with their first pull.
//
// Modes (PsOptions::mode; worker and server must agree: ContractError else):
//  - sync: a step's update is the average of every worker's gradient, applied
//    once: equals DistributedOptimizer (tested after several SGD and Adam steps).
//  - async: every push is applied when it arrives, pulls see whatever is there.
//  - ssp: async, but no worker runs more than max_staleness steps ahead of the
//    slowest live one (its pull waits).
// Each update's staleness (how many steps the worker that computed it was
// ahead of the slowest live worker when it pulled) is recorded on the server
// (Server::stats) and on the worker.
//
// Faults: a worker whose link fails (it died, or sent nothing for
// idle_timeout) leaves: asynchronous servers go on with the others;
// synchronous servers stop with a RuntimeFault naming it and abort every link,
// so every worker gets the error too. A server that dies is a RuntimeFault on
// every worker's next pull or push, naming the server's rank, within the
// timeout (never a hang). Under `kolorun --restart-workers N` a dead worker
// is restarted and rejoins an asynchronous job (kolo/core/parameter_server.h,
// "Rejoining"): the same program, whose Worker continues at the slowest live
// worker's step; a server ends once every worker has finished or left and
// none is coming back (it never waits for a worker that is not restarted).
// A worker alive but silent while others' pulls wait for it (a frozen
// process) is evicted after PsOptions::evict_after, and kolorun stops it.
#pragma once

#include <torch/optim/optimizer.h>
#include <torch/ordered_dict.h>
#include <torch/types.h>

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kolo/core/parameter_server.h"

#pragma GCC visibility push(default)  // the exported API: cmake/kolo_targets.cmake
namespace kolo::ps {

using NamedParameters = torch::OrderedDict<std::string, torch::Tensor>;
// Builds the server's optimizer over its slices (1-D leaf tensors).
using OptimizerFactory =
    std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<torch::Tensor> params)>;

struct PsOptions {
  Mode mode = Mode::kSync;
  int max_staleness = 0;  // ssp only: steps a worker may run ahead of the slowest
  // A worker's wait for a server's reply (a sync or ssp pull waits for the
  // slowest worker too); 0 = the links' default (KOLO_TIMEOUT_SECONDS).
  std::chrono::milliseconds timeout{0};
  // A server counts a worker that sends no request for this long as gone.
  std::chrono::milliseconds idle_timeout = std::chrono::hours(24);
  // A pull that waits for other workers (sync, ssp) makes the server evict
  // each of them that has sent it nothing for this long (a frozen process:
  // SIGSTOP, swapped out): its link is aborted, it no longer holds anyone
  // back, and the launcher is asked to stop it (RejoinChannel::evict: under
  // kolorun it is killed and, with --restart-workers, restarted to rejoin).
  // Async and ssp go on with the others; sync stops naming it. 0 = 9/10 of
  // the timeout, so that the eviction comes before the waiting worker's own
  // wait ends.
  std::chrono::milliseconds evict_after{0};
  // Server checkpoints (docs/strategies.md; the servers act on them, a
  // WorkerOptimizer's checkpoints check them on the workers): every
  // checkpoint_every steps (0 = never) each server writes its shard to
  // checkpoint_dir (the dense slices, the optimizer state and every sparse
  // table's rows and row-wise state); with resume_from the servers start
  // from the shards there (the constructor checks the shard is there, run()
  // loads it once every table is added) and every worker continues at the
  // saved step. A job that resumes and saves again keeps the period
  // (checkpoint_every as saved, else a ContractError naming both): the
  // steps between saves are what maps a saved step to an epoch
  // (WorkerOptimizer's checkpoints, ps_optimizer.h).
  std::string checkpoint_dir;
  int64_t checkpoint_every = 0;
  std::string resume_from;
};

// What a server records of its workers' updates.
struct StalenessStats {
  int64_t updates = 0;        // pushes applied (sync: pushes received)
  int64_t max_staleness = 0;  // largest staleness any update was computed at
  // counts[k]: updates computed at staleness k (the last bin counts k and more)
  std::vector<int64_t> counts;
  std::vector<int64_t> worker_updates;  // per worker: its pushes received
  std::vector<int64_t> rejoins;         // per worker: times it came back after leaving
};

class EmbeddingTable;  // kolo/torch/ps_embedding.h

class Server {
 public:
  Server(const NamedParameters& parameters, const OptimizerFactory& make_optimizer, Links links,
         const PsOptions& options = {});
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Adds a sparse embedding table (kolo/torch/ps_embedding.h) before run():
  // workers name it by its index, in the order of the calls. Server
  // checkpoints hold it; resuming needs the same tables in the same order.
  void add_table(std::shared_ptr<EmbeddingTable> table);

  // Serves every worker (one thread per link) until each has finished or
  // left. Throws the RuntimeFault that stopped a synchronous server, and the
  // ContractError of a checkpoint (resume_from) that does not load (every
  // worker's link is aborted with it).
  void run();

  struct Stats {
    StalenessStats staleness;
    int64_t rounds = 0;             // sync rounds applied
    std::vector<std::string> lost;  // workers that left without finish(), and why
  };
  Stats stats() const;
  // This server's slices (1-D, in Partition order) and which they are.
  std::vector<torch::Tensor> shard() const;
  const std::vector<Slice>& slices() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

class Worker {
 public:
  // Greets every server (collective with the servers' construction): a
  // server whose model or mode differs is a ContractError here.
  Worker(const NamedParameters& parameters, Links links, const PsOptions& options = {});
  // Calls finish() when it was not called (errors are swallowed there).
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  // Copies the servers' parameters into the model for step clock() (waits
  // in sync and ssp modes as the mode says).
  void pull();
  // Sends the gradients of the model's parameters (an undefined grad counts
  // as zeros) as step clock(), then advances clock().
  void push();
  // Tells every server this worker is done.
  void finish();

  int64_t clock() const;
  const Roles& roles() const;
  const PsOptions& options() const;

  // The sparse exchange of ps::Embedding (ps_embedding.h) on this worker's
  // links, as its current step: rows[s] are int64 row ids local to server
  // s's range, unique; servers given no rows are skipped.
  struct RowRequest {
    int table = 0;            // the server's index of the table
    int64_t fingerprint = 0;  // EmbeddingOptions::fingerprint()
    int64_t dim = 0;
  };
  // Asks every server whether it holds the table (Embedding's constructor):
  // ContractError when one does not.
  void check_table(const RowRequest& request);
  // values[s] <- the rows (rows[s].numel() x dim, float32).
  void pull_rows(const RowRequest& request, const std::vector<torch::Tensor>& rows,
                 std::vector<torch::Tensor>* values);
  // grads[s]: (rows[s].numel() x dim, float32) gradients of those rows.
  void push_rows(const RowRequest& request, const std::vector<torch::Tensor>& rows,
                 const std::vector<torch::Tensor>& grads);

  struct Stats {
    int64_t max_staleness_seen = 0;  // over this worker's pulls
    int64_t bytes_pulled = 0;
    int64_t bytes_pushed = 0;
  };
  Stats stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kolo::ps
#pragma GCC visibility pop
