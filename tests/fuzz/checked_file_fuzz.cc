// Fuzz target: the checked file container (core/src/checked_file.cc) that
// every file kolo reads back starts with. Any bytes either decode to a
// payload that encodes back to the same bytes, or raise kolo::ContractError.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "kolo/core/checked_file.h"
#include "kolo/core/errors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  for (const kolo::FileKind* kind :
       {&kolo::kCheckpointFile, &kolo::kElasticCommitFile, &kolo::kStoreValueFile}) {
    try {
      const std::string payload = kolo::decode_checked(*kind, bytes, "fuzz");
      if (kolo::encode_checked(*kind, payload) != bytes) std::abort();
    } catch (const kolo::ContractError&) {
    }
  }
  return 0;
}
