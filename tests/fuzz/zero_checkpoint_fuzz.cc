// Fuzz target: the files of a sharded ZeRO checkpoint (torch/src/zero_format.h).
// The first byte picks what the rest is: 0, an index payload; 1, a shard
// payload; 2, u32 n, an index payload of n bytes, then a shard payload, and
// the shard is checked against the index as load_zero_checkpoint does.
// Anything but kolo::ContractError (or success) is a finding. (The payloads
// are kolo-encoded archives: see checkpoint_fuzz.cc.)
#include <torch/torch.h>

#include <cstdint>
#include <string>

#include "archive_codec.h"
#include "kolo/core/errors.h"
#include "zero_format.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  torch::set_num_threads(1);
  const std::string rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  namespace d = kolo::detail;
  try {
    switch (data[0] % 5) {
      case 0:
        d::decode_zero_index(rest, "index");
        break;
      case 1:
        d::decode_zero_shard(rest, "shard");
        break;
      case 2: {
        if (rest.size() < 4) return 0;
        uint32_t n = 0;
        for (int i = 0; i < 4; ++i) n |= uint32_t(static_cast<uint8_t>(rest[i])) << (8 * i);
        if (n > rest.size() - 4) return 0;
        const d::ZeroIndexFile index = d::decode_zero_index(rest.substr(4, n), "index");
        const d::ZeroShardFile shard = d::decode_zero_shard(rest.substr(4 + n), "shard");
        d::check_zero_shard(shard, shard.rank, index, "index", "shard");
        break;
      }
      case 3:
        for (const std::string& bytes : d::decode_zero_index(rest, "index").group_options) {
          torch::serialize::InputArchive in;
          d::decode_archive(bytes, in);
          torch::optim::AdamOptions options;
          try {
            options.serialize(in);
          } catch (const c10::Error&) {
          }
        }
        break;
      case 4:
        for (const auto& [group, bytes] : d::decode_zero_shard(rest, "shard").group_scalars) {
          torch::serialize::InputArchive in;
          d::decode_archive(bytes, in);
          torch::optim::AdamParamState state;
          try {
            state.serialize(in);
          } catch (const c10::Error&) {
          }
        }
        break;
    }
  } catch (const kolo::ContractError&) {
  }
  return 0;
}
