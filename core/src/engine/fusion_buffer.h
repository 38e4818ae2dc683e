// Fusion buffers (internal): reusable, 64-byte aligned scratch memory of the
// engine thread into which fused requests are packed (and neutral inputs of
// joined ranks are written). Grows to the largest batch seen and stays there,
// so steady-state steps allocate nothing. Host memory by default; given an
// allocator, memory elsewhere (a CUDA device's, engine/device_path.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

namespace kolo::detail {

class FusionBuffer {
 public:
  using Allocate = std::function<void*(size_t bytes)>;
  using Release = std::function<void(void*)>;

  FusionBuffer() = default;
  FusionBuffer(Allocate allocate, Release release)
      : allocate_(std::move(allocate)), release_(std::move(release)) {}
  ~FusionBuffer();
  FusionBuffer(const FusionBuffer&) = delete;
  FusionBuffer& operator=(const FusionBuffer&) = delete;

  // Pointer to at least `bytes` bytes (contents unspecified). Valid until the
  // next call with a larger size.
  uint8_t* get(size_t bytes);
  size_t capacity() const { return capacity_; }

 private:
  void release();

  Allocate allocate_;  // empty: aligned host memory
  Release release_;
  uint8_t* data_ = nullptr;
  size_t capacity_ = 0;
};

}  // namespace kolo::detail
