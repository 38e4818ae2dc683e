// DistributedSampler: each rank's shard of a dataset's indices, per epoch.
//
// The same rules as PyTorch's torch.utils.data.DistributedSampler, so a run
// sees the same data order as the Python recipe for the same seed:
//  - shuffle: the epoch's order is torch::randperm(dataset_size) drawn from a
//    private CPU generator seeded with seed + epoch (the global generator is
//    not touched), identical on every rank because the seed is shared; call
//    set_epoch(e) before each epoch to reshuffle. Without shuffle: 0..n-1.
//  - drop_last = false (default): the order is padded to a multiple of the
//    world size by repeating its first indices, so every rank gets
//    ceil(n / size) samples and every sample appears at least once per epoch:
//    the first (size - n % size) % size indices of the order appear twice
//    (cyclically more often when n < size).
//  - drop_last = true: the tail of the order that does not fill a round is
//    dropped, every rank gets floor(n / size) samples and every kept sample
//    appears exactly once per epoch.
//  - rank r takes positions r, r + size, r + 2 * size, ... of that order, so
//    the ranks' shards are disjoint and together cover the order.
//
// Position: the sampler counts the indices it handed out through next() in
// the current epoch. position() / set_position() save and restore it (with
// the epoch) so that a checkpointed run resumes mid-epoch on the next index.
// It plugs into torch::data loaders as a Sampler<>; a loader (which holds its
// own copy of the sampler, out of the caller's reach) calls reset() at the
// start of each pass. reset() after a pass that handed out the whole epoch
// moves to the next epoch, as set_epoch(epoch() + 1) would, so the loader
// reshuffles every pass; after a pass cut short it rewinds to the epoch's
// start; the first reset() after set_position() keeps the restored position.
#pragma once

#include <torch/data/samplers/base.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#pragma GCC visibility push(default)  // the exported API: cmake/kolo_targets.cmake
namespace kolo {

struct DistributedSamplerOptions {
  int rank = -1;        // -1 = kolo::rank() of the default runtime
  int world_size = -1;  // ranks sharing the dataset; -1 = kolo::size() of the default runtime
  bool shuffle = true;
  uint64_t seed = 0;  // shared by every rank
  bool drop_last = false;
};

// Where a sampler stands: the epoch and how many of this rank's indices of
// that epoch were handed out.
struct SamplerPosition {
  int64_t epoch = 0;
  int64_t next_index = 0;
  bool operator==(const SamplerPosition& other) const {
    return epoch == other.epoch && next_index == other.next_index;
  }
};

class DistributedSampler : public torch::data::samplers::Sampler<std::vector<size_t>> {
 public:
  explicit DistributedSampler(size_t dataset_size, const DistributedSamplerOptions& options = {});

  // Selects the epoch's order (reshuffles) and rewinds to its start.
  void set_epoch(int64_t epoch);
  int64_t epoch() const { return position_.epoch; }

  // This rank's indices for the current epoch, in order (size() of them).
  const std::vector<size_t>& indices() const { return indices_; }
  // Samples this rank gets per epoch.
  size_t size() const { return indices_.size(); }
  size_t dataset_size() const { return dataset_size_; }
  int rank() const { return rank_; }
  int world_size() const { return world_size_; }

  SamplerPosition position() const { return position_; }
  // Restores a saved position: its epoch's order, then next_index indices
  // skipped (ContractError if next_index is not within 0..size()).
  void set_position(const SamplerPosition& position);

  // Elastic re-sharding (kolo/torch/elastic.h): the first `start` positions
  // of the current epoch's order were taken by an earlier world. The sampler
  // then shards only the rest, order[start..n): rank r takes its positions r,
  // r + size, ..., padded (from the rest's start) or cut to equal shards as
  // above, and rewinds to its first index. Every sample of the epoch is then
  // taken exactly once across both worlds (up to the padding). set_epoch(),
  // and set_position() to another epoch, clear it. ContractError when start
  // is outside 0..dataset_size().
  void set_epoch_start(int64_t start);
  int64_t epoch_start() const { return epoch_start_; }
  // Positions of the epoch's order taken by the whole world so far, when
  // every rank took as many as this one (they do: shards are equal):
  // epoch_start() + next_index * world_size(), at most dataset_size().
  int64_t consumed() const;

  // torch::data::samplers::Sampler (see above: the next epoch after a whole
  // one). reset(new_size) also changes the dataset size (which rewinds to the
  // current epoch's start, even after set_position).
  void reset(torch::optional<size_t> new_size = torch::nullopt) override;
  // The next up to batch_size indices of this rank's shard; nullopt when the
  // epoch is exhausted.
  torch::optional<std::vector<size_t>> next(size_t batch_size) override;
  // Saves / loads the position, the epoch start, the dataset size and the
  // options (load checks that the world size, rank, seed, shuffle and
  // drop_last agree).
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;

 private:
  void build_indices();

  size_t dataset_size_;
  int rank_;
  int world_size_;
  bool shuffle_;
  uint64_t seed_;
  bool drop_last_;
  SamplerPosition position_;
  int64_t epoch_start_ = 0;  // positions of the epoch's order taken by an earlier world
  bool keep_position_on_reset_ = false;
  std::vector<size_t> indices_;
};

}  // namespace kolo
#pragma GCC visibility pop
