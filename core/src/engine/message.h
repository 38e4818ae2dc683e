// What ranks tell each other about requests, and what they agree on (internal).
//
// RequestInfo is the wire form of one submitted request (no buffers): the
// fields every rank must agree on. Response is what the ranks of a process set
// agree to execute, computed identically on every rank from everyone's
// RequestInfos (controller.h). RequestList is one rank's contribution to a
// full negotiation.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kolo/core/device.h"
#include "kolo/core/dtype.h"

namespace kolo::detail {

enum class RequestKind : uint8_t {
  kAllreduce,
  kAllgather,
  kBroadcast,
  kReducescatter,
  kAlltoall,
  kJoin,              // Engine::join: this rank ran out of data
  kAddProcessSet,     // on set 0; splits = the new set's world ranks
  kRemoveProcessSet,  // on set 0; root = the set's id
};
constexpr int kNumRequestKinds = 8;

// "ALLREDUCE", "ALLGATHER", "BROADCAST", "REDUCESCATTER", "ALLTOALL", "JOIN",
// "ADD_PROCESS_SET", "REMOVE_PROCESS_SET" (also the timeline's labels).
const char* request_kind_name(RequestKind kind);
// True for the five collectives on tensors.
bool is_data_kind(RequestKind kind);

struct RequestInfo {
  RequestKind kind = RequestKind::kAllreduce;
  DType dtype = DType::kF32;
  // Where the tensor lives: every rank must agree (the collective runs on
  // NCCL or through host staging alike everywhere). The device index is each
  // rank's own business and not sent.
  DeviceType device = DeviceType::kCPU;
  ReduceOp op = ReduceOp::kSum;
  int32_t root = 0;
  double prescale = 1.0;
  double postscale = 1.0;
  std::string name;
  std::vector<int64_t> shape;
  // alltoall: rows sent to each rank of the set (always one entry per rank);
  // add_process_set: the world ranks of the new set.
  std::vector<int64_t> splits;

  bool operator==(const RequestInfo& other) const;
  // operator== without comparing the names (the caller matched them already).
  bool same_except_name(const RequestInfo& other) const;
  bool operator!=(const RequestInfo& other) const { return !(*this == other); }
};

// Set rank 0's verdict that a request stalled: it fails on the ranks that
// submitted it. The name "__kolo/join" stands for a join some ranks never made.
struct StallVerdict {
  std::string name;
  std::vector<int32_t> missing;  // set ranks that did not submit it
  double waited_seconds = 0;
};

// One rank's contribution to a full negotiation.
struct RequestList {
  std::vector<RequestInfo> requests;
  // Sent by set rank 0 only.
  std::vector<StallVerdict> verdicts;
  bool has_params = false;  // autotuned parameters (set 0 only)
  double cycle_time_ms = 0;
  int64_t fusion_threshold_bytes = 0;
};

std::string serialize(const RequestList& list);
// Throws RuntimeFault if the bytes are not a RequestList (a corrupted exchange).
RequestList deserialize(const uint8_t* data, size_t size);

// Agreed by every rank of a process set; identical on every rank.
struct Response {
  enum class Status : uint8_t {
    kOk,
    kMismatch,  // ranks disagree: ContractError(error) on every rank that has it
    kStalled,   // stall shutdown: RuntimeFault(error) on every rank that has it
  };
  RequestKind kind = RequestKind::kAllreduce;
  Status status = Status::kOk;
  DType dtype = DType::kF32;
  DeviceType device = DeviceType::kCPU;
  ReduceOp op = ReduceOp::kSum;
  int32_t root = 0;
  double prescale = 1.0;
  double postscale = 1.0;
  std::string name;
  std::vector<int64_t> shape;        // the lowest contributing rank's shape
  std::vector<int64_t> rows;         // allgather: first dimension per set rank
  std::vector<int64_t> splits;       // alltoall: n x n, [s * n + d] = rows s sends to d;
                                     // add_process_set: the world ranks
  std::vector<uint8_t> contributed;  // per set rank: 1 = submitted it, 0 = joined
  int contributors = 0;
  std::string error;
  std::vector<int> failed_ranks;  // kStalled: world ranks that never submitted

  // Elements per row (product of shape[1:]); 1 for a scalar.
  int64_t row_elements() const;
  int64_t elements() const;  // of the common shape (allreduce, broadcast, reducescatter)
};

// Responses are shared, immutable once agreed: the cache and a cycle's
// outcome hold the same object.
using ResponsePtr = std::shared_ptr<const Response>;

// "[4, 5]"; "[]" for a scalar.
std::string shape_text(const std::vector<int64_t>& shape);

}  // namespace kolo::detail
