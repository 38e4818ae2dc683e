// Array conversions of f16 through F16C when the CPU has it (half.h).
#include "half.h"

#include <cpuid.h>
#include <immintrin.h>

namespace kolo::detail {

namespace {

__attribute__((target("avx,f16c"))) void f16_to_float_f16c(const uint16_t* in, float* out,
                                                           size_t count) {
  size_t i = 0;
  for (; i + 8 <= count; i += 8) {
    const __m128i half = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i));
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(half));
  }
  for (; i < count; ++i) out[i] = half_to_float_inline(in[i]);
}

__attribute__((target("avx,f16c"))) void float_to_f16_f16c(const float* in, uint16_t* out,
                                                           size_t count) {
  size_t i = 0;
  for (; i + 8 <= count; i += 8) {
    const __m128i half = _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), half);
  }
  for (; i < count; ++i) out[i] = float_to_half_inline(in[i]);
}

}  // namespace

// clang 14's __builtin_cpu_supports knows no "f16c": ask CPUID directly.
bool cpu_has_f16c() {
  static const bool has = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    return __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
  }();
  return has;
}

void f16_to_float_array(const uint16_t* in, float* out, size_t count) {
  if (cpu_has_f16c()) return f16_to_float_f16c(in, out, count);
  for (size_t i = 0; i < count; ++i) out[i] = half_to_float_inline(in[i]);
}

void float_to_f16_array(const float* in, uint16_t* out, size_t count) {
  if (cpu_has_f16c()) return float_to_f16_f16c(in, out, count);
  for (size_t i = 0; i < count; ++i) out[i] = float_to_half_inline(in[i]);
}

}  // namespace kolo::detail
