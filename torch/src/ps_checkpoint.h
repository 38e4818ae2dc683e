// A parameter server's shard on disk (internal; PsOptions::checkpoint_dir,
// resume_from; docs/strategies.md, "Server checkpoints").
//
// Server s of S writes <dir>/ps-shard-<s>-of-<S>.kolo: a kolo checkpoint
// (kolo/torch/checkpoint.h: the checksummed container and its payload, with
// the shard's slices as the model's parameters "s0", "s1", ... and the
// server's optimizer) whose CheckpointState holds the save: step = the save
// id (the step every worker continues at), extras "ps/..." = the server's
// index, the server count, the model's fingerprint and the mode. Every shard
// of one save carries the same step; a worker greeting servers that resumed
// from different steps refuses them (a mix of two saves).
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "kolo/core/parameter_server.h"

namespace torch::optim {
class Optimizer;
}

namespace kolo::ps::detail {

struct ShardIdentity {
  int server = 0;
  int servers = 1;
  int64_t fingerprint = 0;  // of the model's specs
  Mode mode = Mode::kSync;
};

std::string shard_path(const std::string& dir, int server, int servers);

// Writes the shard saved at `step` (atomically: a crash leaves the previous
// save of this shard or this one).
void save_shard(const std::string& dir, const ShardIdentity& who, int64_t step,
                const std::vector<torch::Tensor>& slices, const torch::optim::Optimizer& optimizer);

// Loads this server's shard from `dir` into the slices (in place) and the
// optimizer; returns the saved step. ContractError naming the file when it
// is missing (and, when the directory holds another server count's shards,
// saying to resume with that count), damaged, or saved by another model or
// server (a save in another mode resumes: its state is the same).
int64_t load_shard(const std::string& dir, const ShardIdentity& who,
                   const std::vector<torch::Tensor>& slices, torch::optim::Optimizer& optimizer);

}  // namespace kolo::ps::detail
