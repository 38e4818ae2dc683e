#include "engine/fusion_buffer.h"

#include <cstdlib>
#include <new>

namespace kolo::detail {

FusionBuffer::~FusionBuffer() { release(); }

void FusionBuffer::release() {
  if (data_ == nullptr) return;
  if (release_) {
    release_(data_);
  } else {
    std::free(data_);
  }
  data_ = nullptr;
  capacity_ = 0;
}

uint8_t* FusionBuffer::get(size_t bytes) {
  if (bytes <= capacity_ && data_) return data_;
  // Grow by at least 1.5x so a slowly growing batch does not reallocate every step.
  size_t want = capacity_ + capacity_ / 2;
  if (want < bytes) want = bytes;
  want = (want + 63) / 64 * 64;
  if (want == 0) want = 64;
  release();
  void* p = allocate_ ? allocate_(want) : std::aligned_alloc(64, want);
  if (p == nullptr) throw std::bad_alloc();
  data_ = static_cast<uint8_t*>(p);
  capacity_ = want;
  return data_;
}

}  // namespace kolo::detail
