// Fuzz target: the engine's negotiation message (core/src/engine/message.cc,
// what every rank sends the others each full negotiation). Any bytes either
// decode to a RequestList that encodes back to the same bytes, or raise
// kolo::RuntimeFault; anything else (another exception, a crash, a sanitizer
// report, an allocation sized by a count the bytes cannot hold) is a finding.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "engine/message.h"
#include "kolo/core/errors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kolo::detail::RequestList list;
  try {
    list = kolo::detail::deserialize(data, size);
  } catch (const kolo::RuntimeFault&) {
    return 0;
  }
  const std::string again = kolo::detail::serialize(list);
  if (again != std::string(reinterpret_cast<const char*>(data), size)) std::abort();
  return 0;
}
