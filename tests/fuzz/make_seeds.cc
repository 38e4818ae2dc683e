// Writes the valid seed inputs of every fuzz target into
// tests/fuzz/corpus/<target>/seed-* (run once after a format change):
//   build-asan/tests/fuzz/kolo_fuzz_make_seeds tests/fuzz/corpus
// Inputs that once crashed a target are added next to them by hand, named
// regression-*.
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>

#include "engine/message.h"
#include "kolo/core/checked_file.h"
#include "kolo/core/elastic.h"
#include "store_protocol.h"
#ifdef KOLO_FUZZ_HAVE_TORCH
#include "archive_codec.h"
#include "fuzz_model.h"
#include "kolo/torch/checkpoint.h"
#include "zero_format.h"
#endif

namespace {

namespace sp = kolo::store_protocol;
std::filesystem::path root;

void write(const std::string& target, const std::string& name, const std::string& bytes) {
  std::filesystem::create_directories(root / target);
  std::ofstream(root / target / ("seed-" + name), std::ios::binary) << bytes;
}

std::string u16(size_t n) { return std::string{char(n & 0xff), char((n >> 8) & 0xff)}; }

// One store_fuzz record.
std::string record(int kind, const std::string& bytes) {
  return std::string(1, char(kind)) + u16(bytes.size()) + bytes;
}

std::string message(uint8_t op, const std::vector<std::string>& keys, const std::string& value,
                    int64_t number) {
  sp::Writer w;
  w.u8(op);
  if (op == sp::kCheck || op == sp::kWait) w.u32(static_cast<uint32_t>(keys.size()));
  for (const auto& k : keys) w.str(k);
  if (op == sp::kSet) w.bytes(kolo::Bytes(value.begin(), value.end()));
  if (op == sp::kGet || op == sp::kAdd || op == sp::kWait) w.i64(number);
  return w.body();
}

void store_seeds() {
  const std::string session =
      record(1, message(sp::kSet, {"a"}, "hello", 0)) +
      record(1, message(sp::kGet, {"a"}, "", 100)) + record(1, message(sp::kAdd, {"n"}, "", 5)) +
      record(1, message(sp::kCheck, {"a", "n"}, "", 0)) +
      record(1, message(sp::kWait, {"a", "b"}, "", 50)) + record(2, std::string(3, 'x')) +
      record(1, message(sp::kErase, {"a"}, "", 0)) + record(3, message(sp::kWait, {"k"}, "", 7));
  write("store", "plain", std::string(1, 0) + session);
  write("store", "signed", std::string(1, 1) + session);
  // Raw framing: a length-prefixed get, and a header announcing 1 GiB.
  std::string raw = sp::seal("", 'Q', "", 0, message(sp::kGet, {"a"}, "", 0));
  write("store", "raw", std::string(1, 0) + record(0, raw) + record(0, "\x00\x00\x00\x40"));
  // An oversized set (the limit is 4096 in the harness).
  write("store", "oversized",
        std::string(1, 0) + record(1, message(sp::kSet, {"big"}, std::string(5000, 'v'), 0)));
}

void engine_seeds() {
  namespace d = kolo::detail;
  d::RequestList list;
  d::RequestInfo a;
  a.name = "grad/fc.weight";
  a.shape = {2, 3};
  list.requests.push_back(a);
  d::RequestInfo b;
  b.kind = d::RequestKind::kAlltoall;
  b.name = "tokens";
  b.shape = {4};
  b.splits = {1, 3};
  b.device = kolo::DeviceType::kCUDA;
  list.requests.push_back(b);
  write("engine_message", "requests", d::serialize(list));
  list.verdicts.push_back({"stuck", {1, 2}, 61.5});
  list.has_params = true;
  list.cycle_time_ms = 2.5;
  list.fusion_threshold_bytes = 1 << 20;
  write("engine_message", "verdicts-params", d::serialize(list));
  write("engine_message", "empty", d::serialize(d::RequestList{}));
}

void file_seeds() {
  write("checked_file", "checkpoint", kolo::encode_checked(kolo::kCheckpointFile, "payload"));
  write("checked_file", "commit", kolo::encode_checked(kolo::kElasticCommitFile, ""));
  write("checked_file", "store", kolo::encode_checked(kolo::kStoreValueFile, "10.0.0.1:4000"));

  // What elastic_commit_fuzz's BufferState commits (a 3-double and an int64 buffer).
  const auto dir = std::filesystem::temp_directory_path() / "kolo-make-seeds";
  std::filesystem::create_directories(dir);
  kolo::elastic::State::Options options;
  options.commit_path = (dir / "elastic.commit").string();
  double weights[3] = {1, 2, 3};
  int64_t seen = 7;
  kolo::elastic::BufferState state(options);
  state.add("w", weights, sizeof(weights));
  state.add("seen", &seen, sizeof(seen));
  state.epoch = 2;
  state.commit();
  std::ifstream in(options.commit_path, std::ios::binary);
  const std::string file((std::istreambuf_iterator<char>(in)), {});
  write("elastic_commit", "file", std::string(1, 0) + file);
  write("elastic_commit", "payload",
        std::string(1, 1) + kolo::decode_checked(kolo::kElasticCommitFile, file, "seed"));
  std::filesystem::remove_all(dir);
}

#ifdef KOLO_FUZZ_HAVE_TORCH
void torch_seeds() {
  kolo::fuzz::FuzzNet net;
  torch::optim::Adam adam(net.parameters(), torch::optim::AdamOptions(0.01));
  net.fc->weight.mutable_grad() = torch::ones_like(net.fc->weight);
  net.fc->bias.mutable_grad() = torch::ones_like(net.fc->bias);
  adam.step();
  kolo::CheckpointState state;
  state.epoch = 3;
  state.extras["note"] = "x";
  const std::string payload = kolo::encode_checkpoint(net, &adam, state, {"rng0"});
  write("checkpoint", "payload", std::string(1, 1) + payload);
  write("checkpoint", "file",
        std::string(1, 0) + kolo::encode_checked(kolo::kCheckpointFile, payload));
  write("checkpoint", "no-optimizer",
        std::string(1, 1) + kolo::encode_checkpoint(net, nullptr, {}));
  // A seed that does not decode would only steer the fuzzer into the first
  // error: check that each loads (a ContractError ends the program).
  {
    kolo::fuzz::FuzzNet other;
    torch::optim::Adam other_adam(other.parameters(), torch::optim::AdamOptions(0.5));
    kolo::decode_checkpoint(payload, other, &other_adam, "seed");
  }

  namespace d = kolo::detail;
  d::ZeroIndexFile index;
  index.save_id = "0123456789abcdef";
  index.world = 2;
  index.params = {{"fc.weight", "Float", {2, 3}, 0}, {"fc.bias", "Float", {2}, 0}};
  index.optimizer_type = "Adam";
  torch::serialize::OutputArchive options;
  adam.param_groups()[0].options().serialize(options);
  index.group_options = {d::encode_archive(options)};
  index.buffers = {{"steps", torch::zeros({1})}};
  index.state = state;
  index.files = {"shard-0-of-2.kolo", "shard-1-of-2.kolo"};
  index.segments = {{{"fc.weight", 0, 4}}, {{"fc.weight", 4, 2}, {"fc.bias", 0, 2}}};
  d::ZeroShardFile shard;
  shard.save_id = index.save_id;
  shard.rank = 1;
  shard.world = 2;
  d::ZeroSegment w{"fc.weight", 4, 2, 0, torch::ones({2}), {{"exp_avg", torch::zeros({2})}}};
  d::ZeroSegment b{"fc.bias", 0, 2, 0, torch::ones({2}), {{"exp_avg", torch::zeros({2})}}};
  shard.segments = {w, b};
  torch::serialize::OutputArchive scalars;
  // A whole parameter's Adam state (a shard holds only its scalars; the
  // tensors let zero_checkpoint_fuzz's case 4 load it fully).
  adam.state().begin()->second->serialize(scalars);
  shard.group_scalars[0] = d::encode_archive(scalars);
  const std::string index_bytes = d::encode_zero_index(index);
  const std::string shard_bytes = d::encode_zero_shard(shard);
  write("zero_checkpoint", "index", std::string(1, 0) + index_bytes);
  write("zero_checkpoint", "shard", std::string(1, 1) + shard_bytes);
  std::string n(4, '\0');
  for (int i = 0; i < 4; ++i) n[i] = static_cast<char>((index_bytes.size() >> (8 * i)) & 0xff);
  write("zero_checkpoint", "both", std::string(1, 2) + n + index_bytes + shard_bytes);
  write("zero_checkpoint", "index-options", std::string(1, 3) + index_bytes);
  write("zero_checkpoint", "shard-state", std::string(1, 4) + shard_bytes);
  d::check_zero_shard(d::decode_zero_shard(shard_bytes, "shard"), 1,
                      d::decode_zero_index(index_bytes, "index"), "index", "shard");
}
#endif

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: kolo_fuzz_make_seeds tests/fuzz/corpus\n";
    return 2;
  }
  root = argv[1];
  store_seeds();
  engine_seeds();
  file_seeds();
#ifdef KOLO_FUZZ_HAVE_TORCH
  torch_seeds();
#endif
  return 0;
}
