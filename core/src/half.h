// f16 / bf16 <-> f32 conversions (internal).
//
// The inline scalar functions are branch-free, written as selects rather than
// branches so that gcc -O3 vectorizes the loops that call them. Round to
// nearest even; Inf stays Inf; NaN stays a quiet NaN with its sign and top
// payload bits. Subnormals are exact in both directions
// (assumes the default FP environment: no FTZ/DAZ).
//
// Why kolo keeps its own f16 code next to F16C (measured 2026-11-24 on the
// 2-core AMD EPYC CI VM, shared machine, /tmp microbench under the bench lock,
// best of 3 interleaved rounds, ns per element, 64 Ki elements in cache):
//                  this file, SSE2   this file, AVX2   F16C (8-wide)
//   f16 -> f32        0.39              0.19              0.03
//   f32 -> f16        0.77              0.35              0.03
// F16C is 4-10x faster, so whole arrays (the f16 reduction kernel, the
// staging of pairwise reductions) go through f16_to_float_array /
// float_to_f16_array, which use F16C whenever the CPU has it (every x86-64
// CPU since 2013) and agree bit for bit with the scalar code (checked on all
// 2^32 f32 and all 2^16 f16 bit patterns, NaNs included). The scalar code stays for what F16C
// cannot serve: the array tails, single values (kolo::float_to_f16 and friends), CPUs or builds
// without F16C (x86-64 baseline binaries must run anywhere), and bf16, which
// has no baseline x86 instruction (AVX512-BF16's vcvtneps2bf16 flushes
// subnormal inputs to zero, a different result). Libraries were not taken
// instead: gcc 12 calls libgcc per element for _Float16 (not vectorized), and
// Debian has no libfp16 package.
#pragma once

#include <cstddef>
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
  // Inf / NaN: push the exponent to 255; a NaN comes out quiet, as from F16C.
  const uint32_t inf_nan =
      (rebiased + 0x38000000u) | select_bits((h & 0x03ffu) != 0, 0x00400000u, 0u);
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

// True when the CPU has the F16C instructions (CPUID leaf 1, ECX bit 29).
bool cpu_has_f16c();

// Whole arrays, `count` elements: F16C when the CPU has it, else the scalar
// code above; same results either way. `in` and `out` must not overlap.
void f16_to_float_array(const uint16_t* in, float* out, size_t count);
void float_to_f16_array(const float* in, uint16_t* out, size_t count);

}  // namespace kolo::detail
