// CUDA tensors in the engine: batch memory and host staging (device_path.h).
#include "engine/device_path.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "engine/tensor_queue.h"
#include "kolo/core/errors.h"

namespace kolo::detail {

void fill_neutral(void* buffer, size_t count, DType dtype, ReduceOp op, double prescale) {
  if (count == 0) return;
  if (op == ReduceOp::kSum || op == ReduceOp::kAverage) {
    std::memset(buffer, 0, count * dtype_size(dtype));
    return;
  }
  enum { kOne, kHighest, kLowest } which = kOne;
  if (op == ReduceOp::kMin) which = prescale < 0 ? kLowest : kHighest;
  if (op == ReduceOp::kMax) which = prescale < 0 ? kHighest : kLowest;
  auto fill = [&](auto one, auto highest, auto lowest) {
    using T = decltype(one);
    const T value = which == kOne ? one : which == kHighest ? highest : lowest;
    T* p = static_cast<T*>(buffer);
    std::fill(p, p + count, value);
  };
  switch (dtype) {
    case DType::kU8:
      fill(uint8_t{1}, std::numeric_limits<uint8_t>::max(), uint8_t{0});
      break;
    case DType::kI8:
      fill(int8_t{1}, std::numeric_limits<int8_t>::max(), std::numeric_limits<int8_t>::min());
      break;
    case DType::kI16:
      fill(int16_t{1}, std::numeric_limits<int16_t>::max(), std::numeric_limits<int16_t>::min());
      break;
    case DType::kI32:
      fill(int32_t{1}, std::numeric_limits<int32_t>::max(), std::numeric_limits<int32_t>::min());
      break;
    case DType::kI64:
      fill(int64_t{1}, std::numeric_limits<int64_t>::max(), std::numeric_limits<int64_t>::min());
      break;
    case DType::kF16:  // 1.0, +inf, -inf
      fill(uint16_t{0x3C00}, uint16_t{0x7C00}, uint16_t{0xFC00});
      break;
    case DType::kBF16:
      fill(uint16_t{0x3F80}, uint16_t{0x7F80}, uint16_t{0xFF80});
      break;
    case DType::kF32:
      fill(1.0f, std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity());
      break;
    case DType::kF64:
      fill(1.0, std::numeric_limits<double>::infinity(), -std::numeric_limits<double>::infinity());
      break;
  }
}

// ---- BatchMemory ---------------------------------------------------------------

namespace {
FusionBuffer device_buffer(DeviceRuntime* runtime, int device) {
  return FusionBuffer(
      [runtime, device](size_t bytes) { return runtime->alloc_device(bytes, device); },
      [runtime, device](void* p) { runtime->free_device(p, device); });
}
}  // namespace

BatchMemory::BatchMemory(DeviceRuntime* runtime, int device)
    : fusion(device_buffer(runtime, device)),
      fusion_out(device_buffer(runtime, device)),
      scratch(device_buffer(runtime, device)),
      scratch_out(device_buffer(runtime, device)),
      runtime_(runtime),
      device_(device) {}

void BatchMemory::copy(void* to, const void* from, size_t bytes) {
  if (bytes == 0) return;
  if (runtime_) {
    runtime_->copy_on_device(to, from, bytes, device_);
  } else {
    std::memcpy(to, from, bytes);
  }
}

void BatchMemory::zero(void* data, size_t bytes) {
  if (bytes == 0) return;
  if (runtime_) {
    runtime_->zero_on_device(data, bytes, device_);
  } else {
    std::memset(data, 0, bytes);
  }
}

void BatchMemory::fill_neutral(void* data, size_t count, DType dtype, ReduceOp op,
                               double prescale) {
  if (!runtime_) {
    detail::fill_neutral(data, count, dtype, op, prescale);
    return;
  }
  const size_t bytes = count * dtype_size(dtype);
  if (bytes == 0) return;
  if (host_.size() < bytes) host_.resize(bytes);
  detail::fill_neutral(host_.data(), count, dtype, op, prescale);
  runtime_->copy_to_device(data, host_.data(), bytes, device_);
}

// ---- Staging -------------------------------------------------------------------

namespace {
// Pinned blocks come in powers of two from 4 KiB: a size class per bit.
size_t size_class(size_t bytes) {
  size_t c = 4096;
  while (c < bytes) c <<= 1;
  return c;
}
}  // namespace

Staging::~Staging() {
  for (auto& [bytes, block] : free_) runtime_->free_host(block);
}

void* Staging::take(size_t bytes) {
  const size_t c = size_class(bytes);
  auto it = free_.find(c);
  if (it != free_.end()) {
    void* block = it->second;
    free_.erase(it);
    return block;
  }
  return runtime_->alloc_host(c);
}

void Staging::give(void* block, size_t bytes) {
  if (block) free_.emplace(size_class(bytes), block);
}

void Staging::stage_in(Request& request, size_t in_bytes, size_t out_bytes) {
  auto staged = std::make_unique<StagedRequest>();
  StagedRequest& s = *staged;
  s.kind = request.info.kind;
  s.device_in = request.in;
  s.device_out = request.out;
  s.in_bytes = in_bytes;
  s.out_bytes = out_bytes;
  const int device = request.in.device.index;
  runtime_->wait(request.ready);
  s.host_in = take(in_bytes);
  request.staged = std::move(staged);  // from here on stage_out gives the blocks back
  if (in_bytes) runtime_->copy_to_host(s.host_in, s.device_in.data, in_bytes, device);
  const bool has_out = s.kind == RequestKind::kAllreduce || s.kind == RequestKind::kReducescatter;
  if (has_out) {
    s.host_out = s.device_out.data == s.device_in.data ? s.host_in : take(out_bytes);
  }
  request.in.data = s.host_in;
  request.in.device = Device{};
  request.out.data = s.host_out;
  request.out.device = Device{};
  if (request.allocate) {
    s.device_allocate = std::move(request.allocate);
    StagedRequest* state = &s;
    request.allocate = [this, state](const std::vector<int64_t>& shape) {
      TensorView view = state->device_allocate(shape);
      state->device_output = view;
      if (view.device.is_cpu()) return view;  // a host output needs no mirror
      state->output_bytes = view.bytes();
      state->host_output = take(state->output_bytes);
      TensorView host = view;
      host.data = state->host_output;
      host.device = Device{};
      host.stream = nullptr;
      return host;
    };
  }
}

void Staging::stage_out(Request& request, bool success) {
  std::unique_ptr<StagedRequest> staged = std::move(request.staged);
  if (!staged) return;
  StagedRequest& s = *staged;
  const int device = s.device_in.device.index;
  // The views and blocks go back whatever the copies do.
  request.in = s.device_in;
  request.out = s.device_out;
  request.allocate = std::move(s.device_allocate);
  struct Return {
    Staging* staging;
    StagedRequest& s;
    ~Return() {
      staging->give(s.host_in, s.in_bytes);
      if (s.host_out != s.host_in) staging->give(s.host_out, s.out_bytes);
      staging->give(s.host_output, s.output_bytes);
    }
  } give_back{this, s};
  if (!success) return;
  switch (s.kind) {
    case RequestKind::kAllreduce:
    case RequestKind::kReducescatter:
      if (s.out_bytes) runtime_->copy_to_device(s.device_out.data, s.host_out, s.out_bytes, device);
      break;
    case RequestKind::kBroadcast:
      if (s.in_bytes) runtime_->copy_to_device(s.device_in.data, s.host_in, s.in_bytes, device);
      break;
    case RequestKind::kAllgather:
    case RequestKind::kAlltoall:
      if (s.host_output && s.output_bytes) {
        runtime_->copy_to_device(s.device_output.data, s.host_output, s.output_bytes,
                                 s.device_output.device.index);
      }
      {
        std::lock_guard<std::mutex> lock(request.handle->mutex);
        request.handle->output = s.device_output;
      }
      break;
    default:
      break;
  }
}

}  // namespace kolo::detail
