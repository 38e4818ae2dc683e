// Helpers shared by the frontend's sources (internal).
#pragma once

#include <exception>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "kolo/torch/checkpoint.h"
#include "kolo/torch/tensor.h"

namespace torch::serialize {
class InputArchive;
class OutputArchive;
}  // namespace torch::serialize
namespace torch::nn {
class Module;
}
namespace torch::optim {
class Optimizer;
}

namespace kolo::detail {

// This rank's index in a process set and the set's size, as the engine
// knows them (Engine::process_set); ContractError naming `op` when this rank
// is not a member.
struct SetPosition {
  int rank = 0;
  int size = 1;
};
SetPosition set_position(Engine& engine, int process_set, const std::string& op);

// Bytes as a 1-D kByte tensor (an archive stores tensors, not strings), and
// a tensor's bytes back (made contiguous first).
torch::Tensor bytes_tensor(const std::string& bytes);
std::string tensor_bytes(const torch::Tensor& t);

// An exception's message without the C++ backtrace that libtorch's
// c10::Error appends to what(): for messages that reach users.
std::string what_of(const std::exception& e);

// Serialised form of an archive (torch's zip format) and back.
std::string archive_to_bytes(torch::serialize::OutputArchive& archive);
void archive_from_bytes(const std::string& bytes, torch::serialize::InputArchive& archive);

// Root runs `produce`; its result reaches every rank of the set. If `produce`
// throws on root, the error reaches every rank instead: root rethrows its own
// exception, the others throw the same kind (ContractError or RuntimeFault)
// with root's message. Non-root ranks do not call `produce`.
// `position` is this rank's place in options.process_set (set_position).
std::string broadcast_from_root(const std::function<std::string()>& produce, int root,
                                const SetPosition& position, const std::string& name,
                                const CallOptions& options);

// Public in kolo/torch/tensor.h; named here too for the frontend's sources.
using kolo::agree_on_outcome;

// The training position in an archive, under the keys "state/..." (epoch,
// step, seed, sampler_epoch, sampler_next_index, extras/count,
// extras/<i>/{key, value}): the one schema of every checkpoint file that holds
// it (the single-file checkpoint, the sharded index). `fail` is called with
// what is missing or malformed ("has no integer 'state/step'") and must throw.
void write_checkpoint_state(torch::serialize::OutputArchive& archive, const CheckpointState& state);
CheckpointState read_checkpoint_state(torch::serialize::InputArchive& archive,
                                      const std::function<void(const std::string&)>& fail);

// An optimizer's full state: Optimizer::save, a type tag, and every parameter
// group's size and options (Optimizer::load in libtorch 1.13 restores the
// per-parameter state but not the groups' options).
void save_optimizer(const torch::optim::Optimizer& optimizer,
                    torch::serialize::OutputArchive& archive);
// Clears the optimizer's state, then loads what save_optimizer wrote.
// ContractError naming `source` when the type or the groups differ.
void load_optimizer(torch::optim::Optimizer& optimizer, torch::serialize::InputArchive& archive,
                    const std::string& source);

// "name dtype [shape]" lines describing named tensors, for cross-rank and
// checkpoint-vs-model comparisons; and the first line that differs ("" if none).
std::string tensor_manifest(const std::vector<std::pair<std::string, torch::Tensor>>& tensors);
std::string manifest_difference(const std::string& expected, const std::string& actual);
// Parameters ("param/<name>") then buffers ("buffer/<name>"), recursively, in
// registration order.
std::vector<std::pair<std::string, torch::Tensor>> module_tensors(const torch::nn::Module& module);

}  // namespace kolo::detail
