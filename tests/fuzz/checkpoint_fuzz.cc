// Fuzz target: a plain checkpoint (kolo/torch/checkpoint.h) loaded into a
// small model and Adam. The first byte picks what the rest is: 0, a whole
// file (the checked container first); otherwise the payload, an archive in
// kolo's encoding (torch/src/archive_codec.h). Anything but
// kolo::ContractError (or success) is a finding.
//
// The fuzzed bytes reach kolo's decoder only (instrumented); libtorch (Debian's
// build, not instrumented) then reads only the archive it has itself written
// from what kolo decoded, and the model and optimizer load from it
// (torch/src/checkpoint.cc, optim_state.cc).
#include <cstdint>
#include <string>

#include "fuzz_model.h"
#include "kolo/core/checked_file.h"
#include "kolo/core/errors.h"
#include "kolo/torch/checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  torch::set_num_threads(1);
  const std::string rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  kolo::fuzz::FuzzNet net;
  torch::optim::Adam adam(net.parameters(), torch::optim::AdamOptions(0.01));
  std::vector<std::string> rng;
  try {
    const std::string payload =
        data[0] == 0 ? kolo::decode_checked(kolo::kCheckpointFile, rest, "fuzz") : rest;
    kolo::decode_checkpoint(payload, net, &adam, "fuzz", &rng);
  } catch (const kolo::ContractError&) {
  }
  return 0;
}
