// Checkpoints: written by one rank, atomically, with a checksum; loaded on
// one rank, verified, and broadcast to the others.
//
// The file is kolo's checked container (kolo/core/checked_file.h: magic
// "KOLOCKPT", container version, payload size, CRC-32 of the payload and of
// the header; written atomically, verified on reading). Its payload is an
// archive in kolo's own encoding ("KOLOARCH": every size is checked before
// anything is allocated, so libtorch's reader never sees bytes from a file;
// key "format" = 1) with the model's parameters and buffers, the
// optimizer's state and parameter-group options, epoch, step, seed, sampler
// position, every rank's default CPU generator state and the extras. A
// missing, truncated or corrupt file is a ContractError naming the file and
// what is wrong.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "kolo/core/checked_file.h"  // crc32, the container
#include "kolo/torch/sampler.h"
#include "kolo/torch/tensor.h"

namespace torch::nn {
class Module;
}
namespace torch::optim {
class Optimizer;
}

#pragma GCC visibility push(default)  // the exported API: cmake/kolo_targets.cmake
namespace kolo {

// The training position saved with the model and optimizer.
struct CheckpointState {
  int64_t epoch = 0;
  int64_t step = 0;
  uint64_t seed = 0;                          // the run's seed, stored as given
  SamplerPosition sampler;                    // e.g. DistributedSampler::position()
  std::map<std::string, std::string> extras;  // user payloads (any bytes)
  // Set by load_checkpoint: the default CPU generator of every rank was
  // restored (only when the world size equals the saving run's).
  bool rng_restored = false;
};

struct CheckpointOptions : CallOptions {
  int root = 0;     // the rank (in options.process_set) that writes and reads the file
  bool rng = true;  // save / restore each rank's default CPU generator state
};

// Collective. Root writes `path` with the model (parameters and buffers), the
// optimizer (nullptr = none) and `state`; with options.rng every rank's
// default CPU generator state is gathered to root and saved. A failure to
// encode or write is a ContractError on every rank.
void save_checkpoint(const std::string& path, const torch::nn::Module& model,
                     const torch::optim::Optimizer* optimizer, const CheckpointState& state,
                     const CheckpointOptions& options = {});

// Collective. Root reads and verifies `path`, the bytes are broadcast, every
// rank loads the model's parameters and buffers (names, dtypes and shapes must
// match the saved model), the optimizer's state (nullptr = skip) and, with
// options.rng and the same world size, its own generator state. Returns the
// saved state. A missing, truncated or corrupt file, or a checkpoint that does
// not fit the model, is a ContractError on every rank naming the file.
//
// Ranks as threads share one process-wide default generator, so restoring
// per-rank generator state is meaningful only with one process per rank.
CheckpointState load_checkpoint(const std::string& path, torch::nn::Module& model,
                                torch::optim::Optimizer* optimizer,
                                const CheckpointOptions& options = {});

// --- The pieces, for single-process use and tests ---------------------------

// write_checked_file / read_checked_file with kCheckpointFile: header +
// payload to `path` atomically. ContractError naming the file and the failing
// system call on any I/O error.
void write_checkpoint_file(const std::string& path, const std::string& payload);
// Reads and verifies `path`; returns the payload.
std::string read_checkpoint_file(const std::string& path);

// The payload: encodes / decodes the archive described above. `rng_states`
// holds one default-generator state per rank (may be empty).
std::string encode_checkpoint(const torch::nn::Module& model,
                              const torch::optim::Optimizer* optimizer,
                              const CheckpointState& state,
                              const std::vector<std::string>& rng_states = {});
// Loads the model and the optimizer (nullptr = skip) from `payload`; `source`
// names it in errors (the file). Returns the state; fills `rng_states` when
// not null.
CheckpointState decode_checkpoint(const std::string& payload, torch::nn::Module& model,
                                  torch::optim::Optimizer* optimizer, const std::string& source,
                                  std::vector<std::string>* rng_states = nullptr);

// The default CPU generator's state as bytes, and back.
std::string default_generator_state();
void set_default_generator_state(const std::string& state);

}  // namespace kolo
#pragma GCC visibility pop
