// DistributedSampler (kolo/torch/sampler.h).
#include "kolo/torch/sampler.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/serialize/archive.h>
#include <torch/types.h>

#include <algorithm>
#include <numeric>
#include <string>

#include "kolo/core/errors.h"
#include "kolo/core/runtime.h"

namespace kolo {

namespace {

int rank_or_default(int rank) { return rank >= 0 ? rank : kolo::rank(); }
int size_or_default(int size) { return size >= 0 ? size : kolo::size(); }

}  // namespace

DistributedSampler::DistributedSampler(size_t dataset_size,
                                       const DistributedSamplerOptions& options)
    : dataset_size_(dataset_size),
      rank_(rank_or_default(options.rank)),
      world_size_(size_or_default(options.world_size)),
      shuffle_(options.shuffle),
      seed_(options.seed),
      drop_last_(options.drop_last) {
  if (world_size_ < 1) {
    throw ContractError("kolo::DistributedSampler: world_size " + std::to_string(world_size_) +
                        " must be at least 1 (the number of ranks sharing the dataset)");
  }
  if (rank_ >= world_size_) {
    throw ContractError("kolo::DistributedSampler: rank " + std::to_string(rank_) +
                        " is outside 0.." + std::to_string(world_size_ - 1) + " (world_size " +
                        std::to_string(world_size_) + ")");
  }
  build_indices();
}

void DistributedSampler::build_indices() {
  const size_t n = dataset_size_;
  const size_t ranks = static_cast<size_t>(world_size_);
  // Only order[start..n) is sharded (set_epoch_start); start = 0 but for
  // elastic re-sharding. `m` samples remain.
  const size_t start = std::min(static_cast<size_t>(epoch_start_), n);
  const size_t m = n - start;
  // Per-rank samples as in PyTorch: drop_last with a ragged tail drops it.
  const size_t per_rank = drop_last_ ? m / ranks : (m + ranks - 1) / ranks;
  const size_t total = per_rank * ranks;

  std::vector<size_t> order(n);
  if (shuffle_ && n > 0) {
    // A private generator: the same order on every rank, the global one untouched.
    at::Generator generator =
        at::detail::createCPUGenerator(seed_ + static_cast<uint64_t>(position_.epoch));
    torch::Tensor perm = torch::randperm(static_cast<int64_t>(n), generator, torch::kLong);
    const int64_t* p = perm.data_ptr<int64_t>();
    for (size_t i = 0; i < n; ++i) order[i] = static_cast<size_t>(p[i]);
  } else {
    std::iota(order.begin(), order.end(), size_t{0});
  }
  order.erase(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(start));
  // Pad by repeating the order from its start (drop_last = false), or cut the tail.
  if (total > m) {
    for (size_t i = m; i < total; ++i) order.push_back(order[(i - m) % m]);
  } else {
    order.resize(total);
  }
  indices_.clear();
  indices_.reserve(per_rank);
  for (size_t i = static_cast<size_t>(rank_); i < total; i += ranks) indices_.push_back(order[i]);
}

void DistributedSampler::set_epoch(int64_t epoch) {
  position_.epoch = epoch;
  position_.next_index = 0;
  epoch_start_ = 0;
  keep_position_on_reset_ = false;
  build_indices();
}

void DistributedSampler::set_position(const SamplerPosition& position) {
  if (position.epoch != position_.epoch) {
    position_.epoch = position.epoch;
    epoch_start_ = 0;
    build_indices();
  }
  if (position.next_index < 0 || static_cast<size_t>(position.next_index) > indices_.size()) {
    throw ContractError("kolo::DistributedSampler::set_position: next_index " +
                        std::to_string(position.next_index) + " is outside 0.." +
                        std::to_string(indices_.size()) + " (this rank's samples per epoch for " +
                        std::to_string(dataset_size_) + " samples on " +
                        std::to_string(world_size_) +
                        " ranks); was the position saved with another dataset or world size?");
  }
  position_.next_index = position.next_index;
  keep_position_on_reset_ = true;
}

void DistributedSampler::set_epoch_start(int64_t start) {
  if (start < 0 || static_cast<size_t>(start) > dataset_size_) {
    throw ContractError("kolo::DistributedSampler::set_epoch_start: start " +
                        std::to_string(start) + " is outside 0.." + std::to_string(dataset_size_) +
                        " (samples of the epoch an earlier world took, at most the dataset size)");
  }
  epoch_start_ = start;
  position_.next_index = 0;
  keep_position_on_reset_ = false;
  build_indices();
}

int64_t DistributedSampler::consumed() const {
  const int64_t taken = epoch_start_ + position_.next_index * static_cast<int64_t>(world_size_);
  return std::min(taken, static_cast<int64_t>(dataset_size_));
}

void DistributedSampler::reset(torch::optional<size_t> new_size) {
  if (new_size && *new_size != dataset_size_) {
    dataset_size_ = *new_size;
    keep_position_on_reset_ = false;
    build_indices();
    position_.next_index = 0;
    return;
  }
  if (keep_position_on_reset_) {
    keep_position_on_reset_ = false;
    return;
  }
  // A loader's next pass after a whole epoch: the next epoch, reshuffled
  // (the loader's copy of the sampler is out of reach of set_epoch()).
  if (!indices_.empty() && position_.next_index >= static_cast<int64_t>(indices_.size())) {
    set_epoch(position_.epoch + 1);
    return;
  }
  position_.next_index = 0;
}

torch::optional<std::vector<size_t>> DistributedSampler::next(size_t batch_size) {
  keep_position_on_reset_ = false;
  const size_t start = static_cast<size_t>(position_.next_index);
  if (start >= indices_.size() || batch_size == 0) return torch::nullopt;
  const size_t end = std::min(indices_.size(), start + batch_size);
  position_.next_index = static_cast<int64_t>(end);
  return std::vector<size_t>(indices_.begin() + static_cast<std::ptrdiff_t>(start),
                             indices_.begin() + static_cast<std::ptrdiff_t>(end));
}

namespace {

int64_t read_int(torch::serialize::InputArchive& archive, const std::string& key) {
  c10::IValue value;
  if (!archive.try_read(key, value) || !value.isInt()) {
    throw ContractError("kolo::DistributedSampler::load: the archive has no integer '" + key +
                        "'; was it written by DistributedSampler::save?");
  }
  return value.toInt();
}

}  // namespace

void DistributedSampler::save(torch::serialize::OutputArchive& archive) const {
  archive.write("kolo_sampler/epoch", c10::IValue(position_.epoch));
  archive.write("kolo_sampler/next_index", c10::IValue(position_.next_index));
  archive.write("kolo_sampler/epoch_start", c10::IValue(epoch_start_));
  archive.write("kolo_sampler/dataset_size", c10::IValue(static_cast<int64_t>(dataset_size_)));
  archive.write("kolo_sampler/rank", c10::IValue(static_cast<int64_t>(rank_)));
  archive.write("kolo_sampler/size", c10::IValue(static_cast<int64_t>(world_size_)));
  archive.write("kolo_sampler/seed", c10::IValue(static_cast<int64_t>(seed_)));
  archive.write("kolo_sampler/shuffle", c10::IValue(static_cast<int64_t>(shuffle_)));
  archive.write("kolo_sampler/drop_last", c10::IValue(static_cast<int64_t>(drop_last_)));
}

void DistributedSampler::load(torch::serialize::InputArchive& archive) {
  const auto check = [&](const char* what, int64_t saved, int64_t mine) {
    if (saved != mine) {
      throw ContractError(std::string("kolo::DistributedSampler::load: the saved sampler has ") +
                          what + " " + std::to_string(saved) + ", this one " +
                          std::to_string(mine) + "; build the sampler with the same options");
    }
  };
  check("size", read_int(archive, "kolo_sampler/size"), world_size_);
  check("rank", read_int(archive, "kolo_sampler/rank"), rank_);
  check("seed", read_int(archive, "kolo_sampler/seed"), static_cast<int64_t>(seed_));
  check("shuffle", read_int(archive, "kolo_sampler/shuffle"), shuffle_);
  check("drop_last", read_int(archive, "kolo_sampler/drop_last"), drop_last_);
  const auto saved_size = static_cast<size_t>(read_int(archive, "kolo_sampler/dataset_size"));
  if (saved_size != dataset_size_) {
    dataset_size_ = saved_size;
    build_indices();
  }
  SamplerPosition position;
  position.epoch = read_int(archive, "kolo_sampler/epoch");
  position.next_index = read_int(archive, "kolo_sampler/next_index");
  // Archives written before epoch_start existed have none: 0.
  c10::IValue start;
  const int64_t epoch_start =
      archive.try_read("kolo_sampler/epoch_start", start) && start.isInt() ? start.toInt() : 0;
  if (position.epoch != position_.epoch || epoch_start != epoch_start_) {
    position_.epoch = position.epoch;
    epoch_start_ = epoch_start;
    build_indices();
  }
  set_position(position);
}

}  // namespace kolo
