// CUDA tensors in the engine (internal): the memory a batch is packed in,
// and host staging. Which communicator runs a process set's CUDA requests
// (NCCL, or the host one through staging) is decided once per set, in
// execute.cc's route(); docs/architecture.md, "Devices", says why.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <vector>

#include "engine/fusion_buffer.h"
#include "engine/message.h"
#include "kolo/core/device.h"
#include "kolo/core/engine.h"

namespace kolo::detail {

struct Request;

// Writes `count` neutral elements of `op` (the value that leaves the others'
// reduction unchanged) for a joined rank, in host memory. A negative
// prescale swaps min and max.
void fill_neutral(void* buffer, size_t count, DType dtype, ReduceOp op, double prescale);

// Where a batch's fusion and scratch buffers live, and how bytes move among
// them and the requests' buffers: host memory (memcpy), or the memory of one
// CUDA device (the DeviceRuntime's copies), for batches on NCCL.
class BatchMemory {
 public:
  BatchMemory() = default;  // host memory
  BatchMemory(DeviceRuntime* runtime, int device);
  bool on_device() const { return runtime_ != nullptr; }

  void copy(void* to, const void* from, size_t bytes);
  void zero(void* data, size_t bytes);
  void fill_neutral(void* data, size_t count, DType dtype, ReduceOp op, double prescale);

  FusionBuffer fusion;      // packed inputs / in-place fused results
  FusionBuffer fusion_out;  // fused allgather results
  FusionBuffer scratch;     // neutral inputs and discarded outputs of joined ranks
  FusionBuffer scratch_out;

 private:
  DeviceRuntime* runtime_ = nullptr;
  int device_ = 0;
  std::vector<uint8_t> host_;  // device fills are written here, then copied
};

// A staged request: its caller's device views and the pinned host mirrors
// it runs on instead (Staging).
struct StagedRequest {
  RequestKind kind = RequestKind::kAllreduce;
  TensorView device_in;
  TensorView device_out;
  AllocateOutput device_allocate;
  TensorView device_output;  // allgather, alltoall: what device_allocate returned
  void* host_in = nullptr;
  void* host_out = nullptr;  // == host_in when the request is in place
  void* host_output = nullptr;
  size_t in_bytes = 0;
  size_t out_bytes = 0;
  size_t output_bytes = 0;
};

// CUDA tensors on a host communicator (shm, gloo, mpi, threads): each is
// copied into pinned host memory before its collective and back after it.
// Mirrors come from a pool of blocks by power-of-two size, reused across
// steps, so a steady training loop allocates no pinned memory.
class Staging {
 public:
  explicit Staging(DeviceRuntime* runtime) : runtime_(runtime) {}
  ~Staging();
  Staging(const Staging&) = delete;
  Staging& operator=(const Staging&) = delete;

  // Before `request` runs: waits for its readiness event, copies its input
  // (in_bytes) into a mirror, and points request.in and request.out at
  // mirrors (out_bytes of result; an out that is in's start stays in place
  // on in's mirror). Its allocate is wrapped: the caller's function
  // allocates the output (on the device) and the collective writes a mirror.
  void stage_in(Request& request, size_t in_bytes, size_t out_bytes);
  // After it ran, before its handle completes: on success copies the results
  // from the mirrors to the device (out; broadcast's buffer; the allocated
  // output, which becomes the handle's output). Always gives the request its
  // caller's views back and the mirrors back to the pool.
  void stage_out(Request& request, bool success);

  DeviceRuntime* runtime() const { return runtime_; }

 private:
  void* take(size_t bytes);
  void give(void* block, size_t bytes);

  DeviceRuntime* runtime_;
  std::multimap<size_t, void*> free_;  // size class -> pinned block
};

}  // namespace kolo::detail
