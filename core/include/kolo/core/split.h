// The one rule by which kolo divides n items (rows, elements) among the ranks
// of a set: as evenly as possible, the first n % parts ranks one more. The
// engine's reducescatter splits a first dimension by it, the gloo
// communicator its blocks, and ZeRO its buckets, so that a slice one of them
// computes is the slice the others hand over.
#pragma once

#include <cstdint>

#pragma GCC visibility push(default)  // the exported API: cmake/kolo_targets.cmake
namespace kolo {

struct EvenSplit {
  int64_t begin = 0;  // first item of the part
  int64_t count = 0;  // items in it
};

// Part `index` (0 <= index < parts) of `n` items split into `parts`.
constexpr EvenSplit even_split(int64_t n, int64_t parts, int64_t index) {
  const int64_t base = n / parts;
  const int64_t extra = n % parts;
  return {index * base + (index < extra ? index : extra), base + (index < extra ? 1 : 0)};
}

}  // namespace kolo
#pragma GCC visibility pop
