// Fusion buffers (internal): reusable, 64-byte aligned scratch memory of the
// engine thread into which fused requests are packed (and neutral inputs of
// joined ranks are written). Grows to the largest batch seen and stays there,
// so steady-state steps allocate nothing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

namespace kolo::detail {

class FusionBuffer {
 public:
  // Pointer to at least `bytes` bytes (contents unspecified). Valid until the
  // next call with a larger size.
  uint8_t* get(size_t bytes);
  size_t capacity() const { return capacity_; }

 private:
  struct Free {
    void operator()(uint8_t* p) const;
  };
  std::unique_ptr<uint8_t, Free> data_;
  size_t capacity_ = 0;
};

}  // namespace kolo::detail
