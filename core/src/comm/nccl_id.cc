// The NCCL unique-id exchange (nccl_id.h).
#include "comm/nccl_id.h"

#include "kolo/core/errors.h"
#include "kolo/core/store.h"

namespace kolo::detail {

std::string exchange_nccl_id(Store& store, const std::string& prefix, int rank,
                             std::chrono::milliseconds timeout,
                             const std::function<std::string()>& generate) {
  const std::string key = prefix + "/nccl_id";
  if (rank == 0) {
    std::string id = generate();
    if (id.size() != kNcclIdBytes) {
      throw ContractError("kolo nccl: ncclGetUniqueId gave " + std::to_string(id.size()) +
                          " bytes, expected " + std::to_string(kNcclIdBytes));
    }
    store.set(key, Bytes(id.begin(), id.end()));
    return id;
  }
  const Bytes value = store.get(key, timeout);
  if (value.size() != kNcclIdBytes) {
    throw RuntimeFault("kolo nccl: the unique id under '" + key + "' has " +
                       std::to_string(value.size()) + " bytes, expected " +
                       std::to_string(kNcclIdBytes) +
                       "; the store was written by a rank of another kolo build or corrupted");
  }
  return std::string(value.begin(), value.end());
}

}  // namespace kolo::detail
