// The files of a sharded ZeRO checkpoint (internal): what the index and each
// shard hold, their encoding, and the checks that make a damaged, foreign or
// mixed directory an error naming the file. No I/O and no ZeroState: the
// fuzzers (tests/fuzz) call these directly.
//
// Both files are checked files (kolo/core/checked_file.h, "KOLOCKPT") whose
// payload is an archive in kolo's encoding (archive_codec.h) with key "kind"
// and "format" (kZeroFormat):
//   format 1: a libtorch zip archive, without save ids;
//   format 2: adds "save_id", the same random id in the index and in every
//             shard of one save;
//   format 3: the same keys, the archive in kolo's encoding instead of
//             libtorch's zip (formats 1 and 2 are no longer read).
//
// A shard: kind "kolo-zero-shard", format, save_id, rank, world_size,
//   segments/count, segments/<i>/{name, offset, length, group, values, keys,
//   state/<key>}: one run [offset, offset + length) of the flattened parameter
//   `name`, its values and the element-wise optimizer state tensors (Adam's
//   exp_avg...), each (length);
//   groups/with_state ("<g>\n"...), groups/<g>/scalars: the optimizer state
//   that is not element-wise (Adam's step), one archive per parameter group
//   this shard has state for (kolo-encoded archive bytes, checked while
//   decoding).
// The index: kind "kolo-zero-index", format, save_id, world_size, stage (0 =
// saved by a DistributedOptimizer: one shard holding everything, and
// "rng/count", "rng/<r>" with every rank's generator state), the
// parameters (name, dtype, shape, group) in the optimizer's order, the
// optimizer type and group options, the model's buffers, the
// CheckpointState, and each shard's file name and segments (so a loading
// rank reads only the shards it needs).
#pragma once

#include <torch/types.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "kolo/torch/checkpoint.h"

namespace kolo::detail {

constexpr int64_t kZeroFormat = 3;

[[noreturn]] void zero_fail(const std::string& source, const std::string& what);

struct ZeroSegment {
  std::string name;
  int64_t offset = 0;
  int64_t length = 0;
  int group = 0;
  torch::Tensor values;                        // (length)
  std::map<std::string, torch::Tensor> state;  // element-wise optimizer state, each (length)
};

struct ZeroShardFile {
  int64_t format = kZeroFormat;
  std::string save_id;
  int rank = 0;
  int world = 1;
  std::vector<ZeroSegment> segments;
  std::map<int, std::string> group_scalars;  // group -> kolo-encoded archive bytes
};

struct ZeroParamInfo {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  int group = 0;
  int64_t numel() const;
};

struct ZeroSegmentRef {
  std::string name;
  int64_t offset = 0;
  int64_t length = 0;
};

struct ZeroIndexFile {
  int64_t format = kZeroFormat;
  std::string save_id;
  int world = 1;
  int stage = 1;
  std::vector<ZeroParamInfo> params;
  std::string optimizer_type;
  std::vector<std::string> group_options;  // kolo-encoded archive bytes per group
  std::vector<std::pair<std::string, torch::Tensor>> buffers;
  CheckpointState state;
  // Stage 0 (a DistributedOptimizer's save): every rank's default CPU
  // generator state, "rng/<r>" (absent elsewhere).
  std::vector<std::string> rng_states;
  // Stage 0 with a communication hook: its describe() ("hook/name") and
  // every rank's save_state(), "hook/<r>" (absent without a hook).
  std::string hook;
  std::vector<std::string> hook_states;
  int64_t hook_step = 0;           // "hook/step": the exchanges completed at the save
  std::vector<std::string> files;  // per shard
  std::vector<std::vector<ZeroSegmentRef>> segments;  // per shard
};

// A fresh random save id (hex).
std::string new_zero_save_id();

std::string encode_zero_shard(const ZeroShardFile& shard);
std::string encode_zero_index(const ZeroIndexFile& index);

// Parse a payload; `source` names the file in errors. Every structural fact
// that later code relies on is checked here (counts, ranks, shapes, that
// each shard's segments lie inside the index's parameters): ContractError
// "ZeRO checkpoint <source>: ...".
ZeroIndexFile decode_zero_index(const std::string& payload, const std::string& source);
ZeroShardFile decode_zero_shard(const std::string& payload, const std::string& source);

// That shard file `r` belongs to `index`: same save, rank r of index.world,
// segments of the index's parameters with values and state of their length.
// `index_source` and `source` name the two files.
void check_zero_shard(const ZeroShardFile& shard, int r, const ZeroIndexFile& index,
                      const std::string& index_source, const std::string& source);

}  // namespace kolo::detail
