// Conversion of reduced values back into an integer dtype (internal). One
// definition shared by the reduction kernels (reduce.cc) and the staged wire
// reductions (comm/staged_reduction.cc), so every backend converts alike.
#pragma once

#include <cmath>
#include <limits>

namespace kolo::detail {

// Truncates toward zero (as Horovod and a C cast do) and saturates to T's
// range; NaN -> 0.
template <typename T>
inline __attribute__((always_inline)) T truncate_saturate(double v) {
  // max + 1 (2^63 for i64): anything at or above saturates.
  constexpr double kUpper = static_cast<double>(std::numeric_limits<T>::max()) + 1.0;
  constexpr double kLower = static_cast<double>(std::numeric_limits<T>::min());
  const double r = std::trunc(v);
  if (!(r == r)) return 0;
  if (r >= kUpper) return std::numeric_limits<T>::max();
  if (r <= kLower) return std::numeric_limits<T>::min();
  return static_cast<T>(r);
}

// A rank's integer value times the prescale, truncated and saturated as if it
// were stored back into T (Horovod scales each rank's buffer in place), but
// kept in double for the reduction.
template <typename T>
inline __attribute__((always_inline)) double prescale_integer(double v, double prescale) {
  return static_cast<double>(truncate_saturate<T>(v * prescale));
}

}  // namespace kolo::detail
