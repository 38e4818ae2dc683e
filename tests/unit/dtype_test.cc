// dtype names, sizes and parsing; f16/bf16 conversions (round to nearest even,
// Inf and NaN preserved, subnormals exact), scalar and array.
#include "kolo/core/dtype.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "half.h"
#include "kolo/core/errors.h"

namespace kolo {
namespace {

uint32_t bits_of(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  return bits;
}
float float_of(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, 4);
  return value;
}

TEST(DType, SizesNamesAndParsing) {
  const DType all[] = {DType::kU8,  DType::kI8,   DType::kI16, DType::kI32, DType::kI64,
                       DType::kF16, DType::kBF16, DType::kF32, DType::kF64};
  const size_t sizes[] = {1, 1, 2, 4, 8, 2, 2, 4, 8};
  const char* names[] = {"u8", "i8", "i16", "i32", "i64", "f16", "bf16", "f32", "f64"};
  for (int i = 0; i < kNumDTypes; ++i) {
    EXPECT_EQ(dtype_size(all[i]), sizes[i]);
    EXPECT_STREQ(dtype_name(all[i]), names[i]);
    EXPECT_EQ(parse_dtype(names[i]), all[i]);
    EXPECT_EQ(is_floating(all[i]), i >= 5);
  }
  const ReduceOp ops[] = {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMin, ReduceOp::kMax,
                          ReduceOp::kProduct};
  const char* op_names[] = {"sum", "average", "min", "max", "product"};
  for (int i = 0; i < kNumReduceOps; ++i) {
    EXPECT_STREQ(reduce_op_name(ops[i]), op_names[i]);
    EXPECT_EQ(parse_reduce_op(op_names[i]), ops[i]);
  }
}

TEST(DType, ParseErrorsListTheAcceptedNames) {
  try {
    parse_dtype("float32");
    FAIL() << "expected ContractError";
  } catch (const ContractError& e) {
    EXPECT_NE(std::string(e.what()).find("'float32'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("bf16"), std::string::npos) << e.what();
  }
  try {
    parse_reduce_op("mean");
    FAIL() << "expected ContractError";
  } catch (const ContractError& e) {
    EXPECT_NE(std::string(e.what()).find("'mean'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("average"), std::string::npos) << e.what();
  }
}

TEST(F16, KnownValues) {
  EXPECT_EQ(float_to_f16(0.0f), 0x0000);
  EXPECT_EQ(float_to_f16(-0.0f), 0x8000);
  EXPECT_EQ(float_to_f16(1.0f), 0x3c00);
  EXPECT_EQ(float_to_f16(-2.0f), 0xc000);
  EXPECT_EQ(float_to_f16(65504.0f), 0x7bff);                      // largest finite
  EXPECT_EQ(float_to_f16(65519.0f), 0x7bff);                      // below the halfway point
  EXPECT_EQ(float_to_f16(65520.0f), 0x7c00);                      // halfway rounds to even: Inf
  EXPECT_EQ(float_to_f16(std::ldexp(1.0f, -24)), 0x0001);         // smallest subnormal
  EXPECT_EQ(float_to_f16(std::ldexp(1.0f, -25)), 0x0000);         // tie -> even (0)
  EXPECT_EQ(float_to_f16(std::ldexp(3.0f, -25)), 0x0002);         // tie -> even (2)
  EXPECT_EQ(float_to_f16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // tie -> even
  EXPECT_EQ(float_to_f16(1.0f + std::ldexp(3.0f, -11)), 0x3c02);  // tie -> even
  EXPECT_EQ(float_to_f16(1.0f + std::ldexp(1.0f, -10)), 0x3c01);
  EXPECT_EQ(float_to_f16(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_EQ(float_to_f16(-std::numeric_limits<float>::infinity()), 0xfc00);
  EXPECT_EQ(float_to_f16(1e10f), 0x7c00);
  const uint16_t nan = float_to_f16(std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(nan & 0x7c00, 0x7c00);
  EXPECT_NE(nan & 0x03ff, 0);
  // A signalling NaN whose payload lives only in the low bits must stay a NaN.
  const uint16_t low_nan = float_to_f16(float_of(0xff800001u));
  EXPECT_EQ(low_nan & 0x7c00, 0x7c00);
  EXPECT_NE(low_nan & 0x03ff, 0);
  EXPECT_EQ(low_nan & 0x8000, 0x8000);

  EXPECT_EQ(f16_to_float(0x3c00), 1.0f);
  EXPECT_EQ(f16_to_float(0x7bff), 65504.0f);
  EXPECT_EQ(f16_to_float(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(f16_to_float(0x03ff), std::ldexp(1023.0f, -24));
  EXPECT_EQ(bits_of(f16_to_float(0x8000)), 0x80000000u);
  EXPECT_TRUE(std::isinf(f16_to_float(0x7c00)));
  EXPECT_TRUE(std::isnan(f16_to_float(0x7e00)));
  EXPECT_TRUE(std::isnan(f16_to_float(0xfc01)));
}

TEST(F16, EveryHalfRoundTrips) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float value = f16_to_float(static_cast<uint16_t>(h));
    const bool is_nan = (h & 0x7c00) == 0x7c00 && (h & 0x03ff) != 0;
    if (is_nan) {
      ASSERT_TRUE(std::isnan(value)) << std::hex << h;
      ASSERT_TRUE(std::isnan(f16_to_float(float_to_f16(value)))) << std::hex << h;
    } else {
      ASSERT_EQ(float_to_f16(value), h) << std::hex << h;
    }
  }
}

#ifdef __FLT16_MAX__
// gcc's _Float16 conversion (libgcc, round to nearest even) as the reference,
// on about a million float bit patterns spread over the whole range.
TEST(F16, MatchesCompilerFloat16OnSampledFloats) {
  for (uint64_t bits = 0; bits < (uint64_t{1} << 32); bits += 4099) {
    const float value = float_of(static_cast<uint32_t>(bits));
    if (std::isnan(value)) continue;
    const _Float16 reference = static_cast<_Float16>(value);
    uint16_t expected;
    std::memcpy(&expected, &reference, 2);
    ASSERT_EQ(float_to_f16(value), expected) << std::hex << bits;
  }
}
#endif

// The array conversions (F16C where the CPU has it, core/src/half.cc) give
// the scalar code's bits: every f16 pattern, and floats sampled over the
// whole range with NaNs, subnormals and the tails of 1-7 elements.
TEST(F16, ArrayConversionsMatchTheScalarCode) {
  std::vector<uint16_t> halves(65536);
  for (uint32_t h = 0; h < 65536; ++h) halves[h] = static_cast<uint16_t>(h);
  std::vector<float> floats(halves.size());
  detail::f16_to_float_array(halves.data(), floats.data(), halves.size());
  for (uint32_t h = 0; h < 65536; ++h) {
    ASSERT_EQ(bits_of(floats[h]), bits_of(f16_to_float(static_cast<uint16_t>(h)))) << std::hex << h;
    // The scalar code quiets a NaN as F16C does (results never depend on the CPU).
    if (std::isnan(floats[h])) {
      ASSERT_NE(bits_of(floats[h]) & 0x00400000u, 0u) << std::hex << h;
    }
  }
  std::vector<float> sampled;
  for (uint64_t bits = 0; bits < (uint64_t{1} << 32); bits += 65537) {
    sampled.push_back(float_of(static_cast<uint32_t>(bits)));
  }
  for (size_t count : {sampled.size(), size_t{7}, size_t{1}}) {
    std::vector<uint16_t> out(count);
    detail::float_to_f16_array(sampled.data(), out.data(), count);
    for (size_t i = 0; i < count; ++i) {
      ASSERT_EQ(out[i], float_to_f16(sampled[i])) << std::hex << bits_of(sampled[i]);
    }
  }
}

// The public array conversions (dtype.h; the fp16/bf16 compression hooks
// cast whole buckets with them) give the scalar functions' bits, for f16
// and bf16, on floats sampled over the whole range with NaNs and tails.
TEST(F16, PublicArrayConversionsMatchTheScalarFunctions) {
  std::vector<float> sampled;
  for (uint64_t bits = 0; bits < (uint64_t{1} << 32); bits += 65537) {
    sampled.push_back(float_of(static_cast<uint32_t>(bits)));
  }
  for (size_t count : {sampled.size(), size_t{13}, size_t{1}}) {
    std::vector<uint16_t> halves(count), brains(count);
    float_to_f16_array(sampled.data(), halves.data(), count);
    float_to_bf16_array(sampled.data(), brains.data(), count);
    std::vector<float> from_halves(count), from_brains(count);
    f16_to_float_array(halves.data(), from_halves.data(), count);
    bf16_to_float_array(brains.data(), from_brains.data(), count);
    for (size_t i = 0; i < count; ++i) {
      ASSERT_EQ(halves[i], float_to_f16(sampled[i])) << std::hex << bits_of(sampled[i]);
      ASSERT_EQ(brains[i], float_to_bf16(sampled[i])) << std::hex << bits_of(sampled[i]);
      ASSERT_EQ(bits_of(from_halves[i]), bits_of(f16_to_float(halves[i]))) << i;
      ASSERT_EQ(bits_of(from_brains[i]), bits_of(bf16_to_float(brains[i]))) << i;
    }
  }
}

// Exact reference: pick the nearer of the two bf16 neighbours, ties to even.
uint16_t bf16_reference(float value) {
  const uint32_t bits = bits_of(value);
  const uint16_t low = static_cast<uint16_t>(bits >> 16);
  const uint16_t high = static_cast<uint16_t>(low + 1);
  const double below = std::fabs(static_cast<double>(value) - bf16_to_float(low));
  const float high_value = bf16_to_float(high);
  const double above = std::isinf(high_value)
                           ? std::ldexp(1.0, 128) - std::fabs(static_cast<double>(value))
                           : std::fabs(static_cast<double>(high_value) - value);
  if (below < above) return low;
  if (above < below) return high;
  return (low & 1) ? high : low;
}

TEST(BF16, KnownValuesAndTies) {
  EXPECT_EQ(float_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(float_to_bf16(float_of(0x3f808000u)), 0x3f80);  // tie -> even
  EXPECT_EQ(float_to_bf16(float_of(0x3f818000u)), 0x3f82);  // tie -> even
  EXPECT_EQ(float_to_bf16(float_of(0x3f808001u)), 0x3f81);
  EXPECT_EQ(float_to_bf16(float_of(0x7f7fffffu)), 0x7f80);  // rounds up to Inf
  EXPECT_EQ(float_to_bf16(-std::numeric_limits<float>::infinity()), 0xff80);
  const uint16_t nan = float_to_bf16(float_of(0x7f800001u));  // payload only in low bits
  EXPECT_TRUE(std::isnan(bf16_to_float(nan)));
  EXPECT_EQ(bf16_to_float(0x3f80), 1.0f);
  EXPECT_EQ(bits_of(bf16_to_float(0x8001)), 0x80010000u);  // subnormals exact
}

TEST(BF16, MatchesExactReferenceOnSampledFloats) {
  for (uint64_t bits = 0; bits < (uint64_t{1} << 32); bits += 4099) {
    const float value = float_of(static_cast<uint32_t>(bits));
    if (std::isnan(value) || std::isinf(value)) continue;
    ASSERT_EQ(float_to_bf16(value), bf16_reference(value)) << std::hex << bits;
  }
  for (uint32_t h = 0; h < 65536; ++h) {
    const float value = bf16_to_float(static_cast<uint16_t>(h));
    if (!std::isnan(value)) {
      ASSERT_EQ(float_to_bf16(value), h) << std::hex << h;
    }
  }
}

}  // namespace
}  // namespace kolo
