// Branch-free f16 / bf16 <-> f32 conversions (internal).
//
// Written as selects rather than branches so that gcc -O3 vectorizes the
// reduction loops that call them. Round to nearest even; Inf stays Inf; NaN
// stays a (quiet) NaN with its sign and top payload bits. Subnormals are exact
// in both directions (assumes the default FP environment: no FTZ/DAZ).
#pragma once

#include <cstdint>

namespace kolo::detail {

inline uint32_t float_bits(float value) { return __builtin_bit_cast(uint32_t, value); }
inline float bits_float(uint32_t bits) { return __builtin_bit_cast(float, bits); }

// cond ? a : b through an all-ones/all-zeros mask. A plain ?: lets gcc sink the
// float operation of one arm into a branch, which it then refuses to vectorize
// (floating point may trap); the mask keeps the loop branch-free.
inline uint32_t select_bits(bool cond, uint32_t a, uint32_t b) {
  const uint32_t mask = 0u - static_cast<uint32_t>(cond);
  return (a & mask) | (b & ~mask);
}

inline float half_to_float_inline(uint16_t half) {
  const uint32_t h = half;
  const uint32_t shifted = (h & 0x7fffu) << 13;  // exponent + mantissa in float position
  const uint32_t exponent = shifted & 0x0f800000u;
  const uint32_t rebiased = shifted + 0x38000000u;  // (127 - 15) << 23
  // Inf / NaN: push the exponent to 255.
  const uint32_t inf_nan = rebiased + 0x38000000u;
  // Zero / subnormal: renormalise through one float subtraction (exact).
  const uint32_t subnormal =
      float_bits(bits_float(rebiased + 0x00800000u) - bits_float(113u << 23));
  const uint32_t magnitude = select_bits(exponent == 0x0f800000u, inf_nan,
                                         select_bits(exponent == 0, subnormal, rebiased));
  return bits_float(magnitude | ((h & 0x8000u) << 16));
}

inline uint16_t float_to_half_inline(float value) {
  const uint32_t bits = float_bits(value);
  const uint32_t sign = (bits >> 16) & 0x8000u;
  const uint32_t x = bits & 0x7fffffffu;
  // Normal range: rebias the exponent and round the 13 dropped bits to even.
  // Values that round past 65504 carry into the exponent and become Inf.
  const uint32_t normal = (x + 0xc8000fffu + ((x >> 13) & 1u)) >> 13;
  // Subnormal range: adding 0.5f aligns the 10 kept bits at the bottom of the
  // mantissa and the FPU rounds to nearest even for us.
  const uint32_t subnormal = float_bits(bits_float(x) + bits_float(0x3f000000u)) - 0x3f000000u;
  const uint32_t inf_nan = select_bits(x > 0x7f800000u, 0x7e00u | ((x >> 13) & 0x3ffu), 0x7c00u);
  const uint32_t magnitude =
      select_bits(x >= 0x47800000u, inf_nan, select_bits(x < 0x38800000u, subnormal, normal));
  return static_cast<uint16_t>(magnitude | sign);
}

inline float bf16_to_float_inline(uint16_t bits) { return bits_float(uint32_t{bits} << 16); }

inline uint16_t float_to_bf16_inline(float value) {
  const uint32_t bits = float_bits(value);
  const bool is_nan = (bits & 0x7fffffffu) > 0x7f800000u;
  const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = (bits >> 16) | 0x0040u;
  return static_cast<uint16_t>(is_nan ? quiet_nan : rounded);
}

}  // namespace kolo::detail
