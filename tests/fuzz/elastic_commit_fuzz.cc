// Fuzz target: an elastic commit file (kolo/core/elastic.h, "KOLOCMIT") as
// fashion_mnist --elastic --resume reads it, into a BufferState of two
// buffers. The first byte picks what the rest is: 0, a whole file (container
// first, so mostly checksum errors); otherwise the payload after the
// container, to reach the commit format and State decoding. Anything but
// kolo::ContractError (or success) is a finding.
#include <cstdint>
#include <string>

#include "kolo/core/checked_file.h"
#include "kolo/core/elastic.h"
#include "kolo/core/errors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  double weights[3] = {0, 0, 0};
  int64_t seen = 0;
  kolo::elastic::BufferState state;
  state.add("w", weights, sizeof(weights));
  state.add("seen", &seen, sizeof(seen));
  try {
    const std::string payload =
        data[0] == 0 ? kolo::decode_checked(kolo::kElasticCommitFile, rest, "fuzz") : rest;
    state.load_commit_payload(payload, "fuzz");
  } catch (const kolo::ContractError&) {
  }
  return 0;
}
