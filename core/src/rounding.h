// Rounding of reduced values back into an integer dtype (internal). One
// definition shared by the reduction kernels (reduce.cc) and the staged wire
// reductions (comm/staged_reduction.cc), so every backend rounds alike.
#pragma once

#include <cmath>
#include <limits>

namespace kolo::detail {

// Rounds to nearest (ties away from zero) and saturates to T's range; NaN -> 0.
template <typename T>
inline __attribute__((always_inline)) T round_saturate(double v) {
  // max + 1 (2^63 for i64 after rounding): anything at or above saturates.
  constexpr double kUpper = static_cast<double>(std::numeric_limits<T>::max()) + 1.0;
  constexpr double kLower = static_cast<double>(std::numeric_limits<T>::min());
  const double r = std::round(v);
  if (!(r == r)) return 0;
  if (r >= kUpper) return std::numeric_limits<T>::max();
  if (r <= kLower) return std::numeric_limits<T>::min();
  return static_cast<T>(r);
}

}  // namespace kolo::detail
