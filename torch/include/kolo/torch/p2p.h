// Point-to-point transfers of torch::Tensor between two ranks (on a
// Communicator's send/recv, kolo/core/communicator.h).
//
//   kolo::send(activation, /*dst=*/rank + 1);        // stage i -> stage i+1
//   torch::Tensor x = kolo::recv(/*src=*/rank - 1);  // shape and dtype from the sender
//
// Every transfer is a small header (dtype and shape, 16 int64) followed by the
// data, both with the options' tag, so a receiver learns what arrives and can
// allocate it. A send matches the receive of its peer with the same tag, in
// posting order. Tensors must be CPU and of a dtype the engine knows (uint8,
// int8, int16, int32, int64, float16, bfloat16, float32, float64), with at most
// kMaxP2PDims dimensions; a send of a non-contiguous tensor sends a
// contiguous copy. A count or dtype that differs between the two sides is a
// ContractError on both; a dead peer a RuntimeFault naming it (as for the
// collectives, see docs/errors.md).
//
// The communicator: options.communicator, or kolo::runtime().world() (the
// caller's own; the engine's collectives run on communicators of their own,
// so transfers and collectives can be used side by side). Tests with ranks as
// threads pass their own communicators.
#pragma once

#include <torch/types.h>

#include <chrono>
#include <memory>

#include "kolo/core/communicator.h"
#include "kolo/core/export.h"

#pragma GCC visibility push(default)  // the exported API: cmake/kolo_targets.cmake
namespace kolo {

constexpr int kMaxP2PDims = 13;

struct P2PTensorOptions {
  Communicator* communicator = nullptr;  // nullptr = kolo::runtime().world()
  int tag = 0;                           // [0, kMaxP2PTag]
  std::chrono::milliseconds timeout{0};  // 0 = the communicator's default
};

// The caller's side of an isend or irecv_. Keeps the tensors alive until the
// transfer finished, even if the handle is dropped earlier.
class TensorP2PHandle {
 public:
  TensorP2PHandle() = default;
  bool valid() const { return state_ != nullptr; }
  // True once finished, successfully or not; moves the transfer along.
  bool test();
  // Blocks until finished, rethrows its error, returns the tensor sent or
  // received into. A receive whose sender's shape differs from the tensor's
  // (same number of elements) throws ContractError here, on the receiver only.
  torch::Tensor wait();

  struct KOLO_HIDDEN State;
  explicit TensorP2PHandle(std::shared_ptr<State> state) : state_(std::move(state)) {}

 private:
  std::shared_ptr<State> state_;
};

// Sends `tensor` to rank `dst` of the communicator (blocking: returns once
// the receiver took it, or it sits in shm's shared buffer).
void send(const torch::Tensor& tensor, int dst, const P2PTensorOptions& options = {});
// Receives the tensor rank `src` sends, allocated with the sender's dtype and shape.
torch::Tensor recv(int src, const P2PTensorOptions& options = {});
// Receives into `tensor` (contiguous, CPU); the sender's tensor must have the
// same dtype and number of elements (ContractError on both sides otherwise)
// and the same shape (ContractError on this side otherwise). Returns `tensor`.
torch::Tensor recv_(const torch::Tensor& tensor, int src, const P2PTensorOptions& options = {});

// Nonblocking forms. irecv_ needs the tensor up front (the data is posted at
// once, so that no transfer waits for this rank to call wait()).
TensorP2PHandle isend(const torch::Tensor& tensor, int dst, const P2PTensorOptions& options = {});
TensorP2PHandle irecv_(const torch::Tensor& tensor, int src, const P2PTensorOptions& options = {});

}  // namespace kolo
#pragma GCC visibility pop
