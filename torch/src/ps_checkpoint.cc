// A parameter server's shard on disk (ps_checkpoint.h).
#include "ps_checkpoint.h"

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <filesystem>
#include <regex>
#include <set>

#include "kolo/core/errors.h"
#include "kolo/torch/checkpoint.h"

namespace kolo::ps::detail {
namespace {

// The shard's slices as a module's parameters "s0", "s1", ..., so that the
// checkpoint's payload code saves and checks them as any model's (the
// parameters are the slices themselves: loading writes into them).
struct ShardModule : torch::nn::Module {
  explicit ShardModule(const std::vector<torch::Tensor>& slices) {
    for (size_t i = 0; i < slices.size(); ++i) {
      register_parameter("s" + std::to_string(i), slices[i], slices[i].requires_grad());
    }
  }
};

std::string extra(const CheckpointState& state, const std::string& key, const std::string& path) {
  const auto it = state.extras.find(key);
  if (it == state.extras.end()) {
    throw ContractError("kolo::ps server checkpoint '" + path + "': it holds no '" + key +
                        "': not a parameter server's shard");
  }
  return it->second;
}

// The server counts whose shards `dir` holds ("ps-shard-<s>-of-<S>.kolo").
std::set<int> server_counts_in(const std::string& dir) {
  std::set<int> counts;
  const std::regex pattern(R"(ps-shard-[0-9]+-of-([0-9]+)\.kolo)");
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    std::smatch m;
    const std::string name = entry.path().filename().string();
    if (std::regex_match(name, m, pattern)) counts.insert(std::stoi(m[1].str()));
  }
  return counts;
}

}  // namespace

std::string shard_path(const std::string& dir, int server, int servers) {
  return dir + "/ps-shard-" + std::to_string(server) + "-of-" + std::to_string(servers) + ".kolo";
}

void save_shard(const std::string& dir, const ShardIdentity& who, int64_t step,
                const std::vector<torch::Tensor>& slices,
                const torch::optim::Optimizer& optimizer) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    throw ContractError("kolo::ps server " + std::to_string(who.server) +
                        ": cannot create the checkpoint directory '" + dir + "': " + ec.message());
  }
  CheckpointState state;
  state.step = step;
  state.extras["ps/server"] = std::to_string(who.server);
  state.extras["ps/servers"] = std::to_string(who.servers);
  state.extras["ps/fingerprint"] = std::to_string(who.fingerprint);
  state.extras["ps/mode"] = mode_name(who.mode);
  const ShardModule module(slices);
  write_checkpoint_file(shard_path(dir, who.server, who.servers),
                        encode_checkpoint(module, &optimizer, state));
}

int64_t load_shard(const std::string& dir, const ShardIdentity& who,
                   const std::vector<torch::Tensor>& slices, torch::optim::Optimizer& optimizer) {
  const std::string path = shard_path(dir, who.server, who.servers);
  if (!std::filesystem::exists(path)) {
    const std::set<int> counts = server_counts_in(dir);
    std::string message = "kolo::ps server " + std::to_string(who.server) + ": cannot resume: '" +
                          path + "' does not exist";
    if (!counts.empty() && counts.count(who.servers) == 0) {
      message += "; '" + dir + "' holds the shards of " + std::to_string(*counts.begin()) +
                 " server(s) and this job has " + std::to_string(who.servers) +
                 ": a server checkpoint resumes at the server count that saved it (kolorun "
                 "--servers " +
                 std::to_string(*counts.begin()) + ")";
    }
    throw ContractError(message);
  }
  ShardModule module(slices);
  const CheckpointState state =
      decode_checkpoint(read_checkpoint_file(path), module, &optimizer, path);
  const auto refuse = [&](const std::string& what) {
    throw ContractError("kolo::ps server checkpoint '" + path + "': " + what);
  };
  if (extra(state, "ps/servers", path) != std::to_string(who.servers) ||
      extra(state, "ps/server", path) != std::to_string(who.server)) {
    refuse("it is the shard of server " + extra(state, "ps/server", path) + " of " +
           extra(state, "ps/servers", path) + ", not of server " + std::to_string(who.server) +
           " of " + std::to_string(who.servers) + " (renamed?)");
  }
  if (extra(state, "ps/fingerprint", path) != std::to_string(who.fingerprint)) {
    refuse("it was saved for another model (parameter names, shapes or dtypes differ)");
  }
  return state.step;
}

}  // namespace kolo::ps::detail
