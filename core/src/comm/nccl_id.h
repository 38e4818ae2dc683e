// The NCCL unique id of a communicator, exchanged through the rendezvous
// store (internal; compiled in every build, so the exchange is tested where
// no NCCL can run).
#pragma once

#include <chrono>
#include <functional>
#include <string>

namespace kolo {
class Store;
}

namespace kolo::detail {

// Bytes of an ncclUniqueId (NCCL_UNIQUE_ID_BYTES, fixed by NCCL's ABI).
constexpr size_t kNcclIdBytes = 128;

// Member 0 of the communicator calls `generate` (ncclGetUniqueId) and
// publishes the id under `prefix` + "/nccl_id"; every other member reads it,
// waiting up to `timeout`. Returns the id on every member. Throws
// ContractError when `generate` returns other than kNcclIdBytes bytes,
// RuntimeFault when the stored value has another length (a corrupted store
// or a peer of another build), and the store's TimeoutError when member 0
// never publishes.
std::string exchange_nccl_id(Store& store, const std::string& prefix, int rank,
                             std::chrono::milliseconds timeout,
                             const std::function<std::string()>& generate);

}  // namespace kolo::detail
