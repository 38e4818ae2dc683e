// Sparse embedding tables on the parameter server (kolo/torch/parameter_server.h):
// a table of millions of rows x dim lives on the servers, partitioned by row;
// a step pulls only the rows its batch touches and pushes only their
// gradients, and the servers apply a row-wise sparse optimizer to those rows.
// This is what recommendation models need: each step touches a few thousand
// rows of a table that would cost gigabytes to allreduce.
//
//   EmbeddingOptions table;                        // the same on every rank
//   table.name = "items"; table.rows = 10'000'000; table.dim = 64;
//   // server rank, before run():
//   server.add_table(std::make_shared<EmbeddingTable>(table, links.roles));
//   // worker rank, after constructing the Worker, tables in the same order:
//   Embedding items(table, worker, /*table=*/0);
//   for (...) {
//     worker.pull();                               // the dense parameters
//     torch::Tensor e = items.forward(ids);        // ids (any shape, int64) -> ids.shape + [dim]
//     loss(mlp(e), y).backward();
//     items.push();                                // the touched rows' gradients ...
//     worker.push();                               // ... then the dense ones: one step
//   }
//
// Rows. Server s holds rows [b, b + n) with {b, n} = even_split(rows, S, s)
// (kolo/core/split.h, the one split rule): every server holds the same share.
// Where a table starts: row r, column j is uniform in [-init_scale, init_scale]
// from a hash of (seed, r, j) (embedding_init), so a table's start does not
// depend on the number of servers, and no worker ever builds the whole table.
//
// A step. forward() deduplicates its indices (torch::_unique2, sorted), pulls
// the U unique rows from their servers and returns an index into them; its
// backward leaves one gradient per unique row (the sum over its occurrences,
// as torch's sparse embedding gradient); push() sends those U rows. Indices
// outside [0, rows) are a ContractError on the worker that holds them, naming
// the index and the table's size, before anything is sent. An empty batch
// pulls and pushes nothing.
//
// Modes are the dense server's, on the same clocks and links: sync averages
// every worker's row gradients of a step (a row touched by one worker gets its
// gradient / W: data-parallel SGD on the union of the batches) and applies the
// optimizer to the union of the touched rows when the step's round completes
// (with the dense update); async and ssp apply each push when it arrives.
// Contract: push() before Worker::push() of the same step (the server refuses
// a table push for a step the worker has already pushed).
//
// Optimizers (row-wise, state only where a row is touched):
//  - Adagrad as torch's with a sparse gradient: per element, acc += g^2,
//    w -= lr * g / (sqrt(acc) + eps) on the touched rows only.
//  - Adam as torch's SparseAdam, lazily per row: m, v and the step count of a
//    row advance only when the row is touched (bias correction by the row's
//    own count).
// The table's dtype is float32.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kolo/core/parameter_server.h"
#include "kolo/core/split.h"
#include "kolo/torch/parameter_server.h"

#pragma GCC visibility push(default)  // the exported API: cmake/kolo_targets.cmake
namespace kolo::ps {

struct SparseOptimizerOptions {
  enum class Kind { kAdagrad, kAdam };
  Kind kind = Kind::kAdagrad;
  double lr = 0.01;
  double eps = 1e-10;                 // Adagrad: torch's default; Adam: use 1e-8
  double initial_accumulator = 0.0;   // Adagrad
  double beta1 = 0.9, beta2 = 0.999;  // Adam
};

struct EmbeddingOptions {
  std::string name = "embedding";
  int64_t rows = 0;
  int64_t dim = 0;
  double init_scale = 0.01;  // rows start uniform in [-init_scale, init_scale]
  uint64_t seed = 0;
  SparseOptimizerOptions optimizer;

  // Name, rows and dim: a worker and a server that disagree refuse each other.
  int64_t fingerprint() const;
};

// Rows [begin, begin + count) of the table as it starts (count x dim, float32).
torch::Tensor embedding_init(const EmbeddingOptions& options, int64_t begin, int64_t count);

// Server s's rows of the table and the server owning a row.
EvenSplit embedding_rows(const EmbeddingOptions& options, int servers, int server);
int embedding_owner(const EmbeddingOptions& options, int servers, int64_t row);

// The rows of one table that one server holds, and their optimizer state.
// Thread-compatible: the Server calls it under its lock.
class EmbeddingTable {
 public:
  EmbeddingTable(const EmbeddingOptions& options, const Roles& roles);

  const EmbeddingOptions& options() const { return options_; }
  int64_t begin() const { return begin_; }  // first row held
  int64_t rows() const { return weight_.size(0); }
  const torch::Tensor& weight() const { return weight_; }  // rows() x dim

  // The rows `local` (int64, unique, in [0, rows())) as a (n, dim) copy.
  torch::Tensor gather(const torch::Tensor& local);
  // One optimizer step on the rows `local` (unique) with gradients (n, dim).
  void apply(const torch::Tensor& local, const torch::Tensor& grads);
  // Sync rounds: collect the pushes of a round, then apply their average
  // (sum per row / pushes) once.
  void accumulate(const torch::Tensor& local, const torch::Tensor& grads);
  void apply_round(int pushes);

  // The tensors a server checkpoint holds, by name: the rows ("weight") and
  // the row-wise optimizer state (Adagrad's accumulator; Adam's m, v and
  // per-row step counts). The table's own tensors: loading writes into them.
  std::vector<std::pair<std::string, torch::Tensor>> state() const;
  // What the table is, for a checkpoint to compare on resume: name, rows,
  // dim, optimizer and its settings.
  std::string identity() const;

  struct Stats {
    int64_t rows_read = 0;     // rows gathered (pulls)
    int64_t rows_written = 0;  // rows the optimizer updated
    int64_t updates = 0;       // optimizer steps
  };
  const Stats& stats() const { return stats_; }

 private:
  EmbeddingOptions options_;
  int64_t begin_ = 0;
  torch::Tensor weight_;
  torch::Tensor state1_;  // Adagrad: the accumulator; Adam: m
  torch::Tensor state2_;  // Adam: v
  torch::Tensor steps_;   // Adam: per-row step count (int64)
  std::vector<torch::Tensor> round_rows_, round_grads_;
  Stats stats_;
};

// A worker's handle on one table (the table'th that the servers added).
class Embedding {
 public:
  // Asks every server for the table: ContractError when one holds no table
  // of that index with the same name, rows and dim.
  Embedding(const EmbeddingOptions& options, Worker& worker, int table);

  // indices (any shape, integer) -> indices.shape + [dim], differentiable
  // with respect to the pulled rows. Pulls for the worker's current step.
  torch::Tensor forward(const torch::Tensor& indices);
  // Pushes the gradients of the rows of the last forward (nothing when it
  // had no rows or the loss did not use them), as the worker's current step.
  void push();

  const EmbeddingOptions& options() const { return options_; }
  struct Stats {
    int64_t rows_pulled = 0;  // unique rows, summed over steps
    int64_t bytes_pulled = 0;
    int64_t bytes_pushed = 0;  // row ids and gradients
  };
  const Stats& stats() const { return stats_; }

 private:
  Worker::RowRequest request() const;

  EmbeddingOptions options_;
  Worker& worker_;
  int table_ = 0;
  int servers_ = 0;
  int64_t clock_ = 0;                // the worker's step at the last forward
  std::vector<torch::Tensor> rows_;  // per server: the last forward's rows (local ids)
  std::vector<int64_t> offsets_;     // server s's rows are pulled_[offsets_[s], offsets_[s + 1])
  torch::Tensor pulled_;             // (U, dim) leaf: the last forward's rows
  Stats stats_;
};

}  // namespace kolo::ps
#pragma GCC visibility pop
