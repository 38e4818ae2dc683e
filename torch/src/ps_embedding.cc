// Sparse embedding tables on the parameter server (kolo/torch/ps_embedding.h):
// the server's rows and row-wise optimizer, the worker's deduplicated pull
// and push. The transport and the clocks are the dense server's
// (parameter_server.cc: Server::add_table, Worker::pull_rows / push_rows).
#include "kolo/torch/ps_embedding.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <sstream>

#include "kolo/core/errors.h"
#include "kolo/torch/parameter_server.h"

namespace kolo::ps {
namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

void check_options(const EmbeddingOptions& o, const std::string& who) {
  if (o.rows <= 0 || o.dim <= 0) {
    throw ContractError(who + ": table '" + o.name + "' needs rows > 0 and dim > 0, got rows " +
                        std::to_string(o.rows) + ", dim " + std::to_string(o.dim));
  }
  if (!(o.optimizer.lr > 0) || !(o.optimizer.eps > 0)) {
    throw ContractError(who + ": table '" + o.name + "' needs optimizer lr > 0 and eps > 0");
  }
}

}  // namespace

int64_t EmbeddingOptions::fingerprint() const {
  return kolo::ps::fingerprint({VariableSpec{name, {rows, dim}, DType::kF32}});
}

torch::Tensor embedding_init(const EmbeddingOptions& o, int64_t begin, int64_t count) {
  torch::Tensor out = torch::empty({count, o.dim}, torch::kFloat);
  float* data = out.data_ptr<float>();
  const uint64_t salt = splitmix64(o.seed);
  const float scale = static_cast<float>(o.init_scale);
  const int64_t first = begin * o.dim;
  const int64_t n = count * o.dim;
  for (int64_t i = 0; i < n; ++i) {
    // 24 random bits -> [-1, 1).
    const uint64_t h = splitmix64(salt ^ static_cast<uint64_t>(first + i));
    const float u = static_cast<float>(h >> 40) * (1.0f / 16777216.0f);
    data[i] = (2.0f * u - 1.0f) * scale;
  }
  return out;
}

EvenSplit embedding_rows(const EmbeddingOptions& o, int servers, int server) {
  return even_split(o.rows, servers, server);
}

int embedding_owner(const EmbeddingOptions& o, int servers, int64_t row) {
  // The inverse of even_split: the first rows % servers parts hold one more.
  const int64_t base = o.rows / servers;
  const int64_t extra = o.rows % servers;
  const int64_t big = extra * (base + 1);  // rows in the larger parts
  if (row < big) return static_cast<int>(row / (base + 1));
  return static_cast<int>(extra + (row - big) / base);
}

// ---- EmbeddingTable (server) ----

EmbeddingTable::EmbeddingTable(const EmbeddingOptions& options, const Roles& roles)
    : options_(options) {
  const std::string who =
      "kolo::ps::EmbeddingTable (server " + std::to_string(roles.server_index()) + ")";
  check_options(options, who);
  if (!roles.is_server()) {
    throw ContractError(who + ": rank " + std::to_string(roles.rank) +
                        " is a worker; tables live on the servers");
  }
  const EvenSplit part = embedding_rows(options, roles.servers, roles.server_index());
  begin_ = part.begin;
  weight_ = embedding_init(options, part.begin, part.count);
  const double fill = options.optimizer.kind == SparseOptimizerOptions::Kind::kAdagrad
                          ? options.optimizer.initial_accumulator
                          : 0.0;
  state1_ = torch::full({part.count, options.dim}, fill, torch::kFloat);
  if (options.optimizer.kind == SparseOptimizerOptions::Kind::kAdam) {
    state2_ = torch::zeros({part.count, options.dim}, torch::kFloat);
    steps_ = torch::zeros({part.count}, torch::kLong);
  }
}

std::vector<std::pair<std::string, torch::Tensor>> EmbeddingTable::state() const {
  std::vector<std::pair<std::string, torch::Tensor>> tensors = {{"weight", weight_},
                                                                {"state1", state1_}};
  if (state2_.defined()) tensors.emplace_back("state2", state2_);
  if (steps_.defined()) tensors.emplace_back("steps", steps_);
  return tensors;
}

std::string EmbeddingTable::identity() const {
  const SparseOptimizerOptions& o = options_.optimizer;
  std::ostringstream text;
  text << "'" << options_.name << "' (" << options_.rows << " rows x " << options_.dim << ", "
       << (o.kind == SparseOptimizerOptions::Kind::kAdagrad ? "adagrad" : "adam") << " lr " << o.lr
       << " eps " << o.eps;
  if (o.kind == SparseOptimizerOptions::Kind::kAdam) {
    text << " betas " << o.beta1 << " " << o.beta2;
  } else {
    text << " initial_accumulator " << o.initial_accumulator;
  }
  text << ")";
  return text.str();
}

torch::Tensor EmbeddingTable::gather(const torch::Tensor& local) {
  stats_.rows_read += local.numel();
  return weight_.index_select(0, local);
}

void EmbeddingTable::apply(const torch::Tensor& local, const torch::Tensor& grads) {
  if (local.numel() == 0) return;
  torch::NoGradGuard no_grad;
  const SparseOptimizerOptions& o = options_.optimizer;
  torch::Tensor w = weight_.index_select(0, local);
  if (o.kind == SparseOptimizerOptions::Kind::kAdagrad) {
    // torch.optim.Adagrad on a sparse gradient (lr_decay 0, weight_decay 0).
    torch::Tensor acc = state1_.index_select(0, local).addcmul_(grads, grads);
    state1_.index_copy_(0, local, acc);
    w.addcdiv_(grads, acc.sqrt().add_(o.eps), -o.lr);
  } else {
    // torch.optim.SparseAdam, with the bias correction of each row's own steps.
    steps_.index_add_(0, local, torch::ones({local.numel()}, torch::kLong));
    const torch::Tensor t = steps_.index_select(0, local).to(torch::kDouble).unsqueeze(1);
    torch::Tensor m = state1_.index_select(0, local).mul_(o.beta1).add_(grads, 1 - o.beta1);
    torch::Tensor v =
        state2_.index_select(0, local).mul_(o.beta2).addcmul_(grads, grads, 1 - o.beta2);
    state1_.index_copy_(0, local, m);
    state2_.index_copy_(0, local, v);
    const torch::Tensor bc1 = 1 - torch::pow(o.beta1, t);
    const torch::Tensor bc2 = 1 - torch::pow(o.beta2, t);
    const torch::Tensor step_size = (o.lr * bc2.sqrt() / bc1).to(torch::kFloat);
    w.sub_(step_size * m / v.sqrt().add_(o.eps));
  }
  weight_.index_copy_(0, local, w);
  stats_.rows_written += local.numel();
  stats_.updates += 1;
}

void EmbeddingTable::accumulate(const torch::Tensor& local, const torch::Tensor& grads) {
  round_rows_.push_back(local);
  round_grads_.push_back(grads);
}

void EmbeddingTable::apply_round(int pushes) {
  if (round_rows_.empty()) return;
  torch::NoGradGuard no_grad;
  const torch::Tensor rows = torch::cat(round_rows_);
  const torch::Tensor grads = torch::cat(round_grads_);
  round_rows_.clear();
  round_grads_.clear();
  const auto [unique, inverse, counts] =
      torch::_unique2(rows, /*sorted=*/true, /*return_inverse=*/true, /*return_counts=*/false);
  torch::Tensor summed = torch::zeros({unique.numel(), options_.dim}, torch::kFloat);
  summed.index_add_(0, inverse, grads).div_(pushes);
  apply(unique, summed);
}

// ---- Embedding (worker) ----

Embedding::Embedding(const EmbeddingOptions& options, Worker& worker, int table)
    : options_(options), worker_(worker), table_(table) {
  check_options(options, "kolo::ps::Embedding");
  servers_ = worker.roles().servers;
  if (options.rows < servers_) {
    throw ContractError("kolo::ps::Embedding: table '" + options.name + "' has " +
                        std::to_string(options.rows) + " rows, fewer than the " +
                        std::to_string(servers_) + " servers it is split across");
  }
  worker.check_table(request());
}

torch::Tensor Embedding::forward(const torch::Tensor& indices) {
  const std::string who = "kolo::ps::Embedding '" + options_.name + "' (worker " +
                          std::to_string(worker_.roles().worker_index()) + ")";
  if (!indices.defined() || c10::isFloatingType(indices.scalar_type()) ||
      indices.scalar_type() == torch::kBool || c10::isComplexType(indices.scalar_type())) {
    throw ContractError(who + ": indices must be an integer tensor");
  }
  const torch::Tensor flat = indices.to(torch::kLong).reshape({-1}).contiguous();
  if (flat.numel() > 0) {
    const int64_t lo = flat.min().item<int64_t>();
    const int64_t hi = flat.max().item<int64_t>();
    if (lo < 0 || hi >= options_.rows) {
      throw ContractError(who + ": index " + std::to_string(lo < 0 ? lo : hi) +
                          " is out of range for a table of " + std::to_string(options_.rows) +
                          " rows (valid: 0 to " + std::to_string(options_.rows - 1) + ")");
    }
  }
  // The unique rows, sorted: each server's rows are one run of them.
  const auto [unique, inverse, counts] =
      torch::_unique2(flat, /*sorted=*/true, /*return_inverse=*/true, /*return_counts=*/false);
  const int64_t* ids = unique.data_ptr<int64_t>();
  const int64_t u = unique.numel();
  rows_.assign(servers_, torch::Tensor());
  offsets_.assign(servers_ + 1, 0);
  for (int s = 0; s < servers_; ++s) {
    const EvenSplit part = embedding_rows(options_, servers_, s);
    const int64_t end = std::lower_bound(ids, ids + u, part.begin + part.count) - ids;
    offsets_[s + 1] = end;
    rows_[s] = unique.slice(0, offsets_[s], end).sub(part.begin).contiguous();
  }
  std::vector<torch::Tensor> values;
  worker_.pull_rows(request(), rows_, &values);
  pulled_ = torch::cat(values).set_requires_grad(true);
  clock_ = worker_.clock();
  stats_.rows_pulled += u;
  stats_.bytes_pulled += u * (static_cast<int64_t>(sizeof(int64_t)) + options_.dim * 4);
  std::vector<int64_t> shape = indices.sizes().vec();
  shape.push_back(options_.dim);
  return pulled_.index_select(0, inverse).view(shape);
}

void Embedding::push() {
  if (!pulled_.defined()) return;  // no forward since the last push
  const torch::Tensor grad = pulled_.grad();
  pulled_ = torch::Tensor();
  if (worker_.clock() != clock_) {
    throw ContractError("kolo::ps::Embedding '" + options_.name + "': push() for step " +
                        std::to_string(clock_) + " after Worker::push() of that step; call " +
                        "Embedding::push() first");
  }
  if (!grad.defined()) return;  // the loss did not use the rows
  std::vector<torch::Tensor> grads;
  for (int s = 0; s < servers_; ++s) {
    grads.push_back(grad.slice(0, offsets_[s], offsets_[s + 1]).contiguous());
  }
  worker_.push_rows(request(), rows_, grads);
  const int64_t u = offsets_[servers_];
  stats_.bytes_pushed += u * (static_cast<int64_t>(sizeof(int64_t)) + options_.dim * 4);
}

Worker::RowRequest Embedding::request() const {
  Worker::RowRequest r;
  r.table = table_;
  r.fingerprint = options_.fingerprint();
  r.dim = options_.dim;
  return r;
}

}  // namespace kolo::ps
