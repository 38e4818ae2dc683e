// Reduction kernels: every op and dtype against a double reference, aliasing of
// out with any input, f16/bf16 accumulation in f32, integer wrap / rounding /
// saturation, and the pairwise API used by ring algorithms.
#include "reduce.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "kolo/core/dtype.h"

namespace kolo::detail {
namespace {

AllreduceOptions options_of(ReduceOp op, double prescale = 1.0, double postscale = 1.0) {
  AllreduceOptions options;
  options.op = op;
  options.prescale = prescale;
  options.postscale = postscale;
  return options;
}

std::vector<const void*> pointers(const std::vector<std::vector<float>>& inputs) {
  std::vector<const void*> result;
  for (const auto& input : inputs) result.push_back(input.data());
  return result;
}

// Counts straddling the kernel's block size (2048 elements).
const size_t kCounts[] = {1, 7, 2047, 2048, 2049, 5000};

double reference(ReduceOp op, const std::vector<double>& values, double prescale,
                 double postscale) {
  double acc = values[0] * prescale;
  for (size_t k = 1; k < values.size(); ++k) {
    const double v = values[k] * prescale;
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAverage:
        acc += v;
        break;
      case ReduceOp::kMin:
        acc = std::min(acc, v);
        break;
      case ReduceOp::kMax:
        acc = std::max(acc, v);
        break;
      case ReduceOp::kProduct:
        acc *= v;
        break;
    }
  }
  if (op == ReduceOp::kAverage) acc /= static_cast<double>(values.size());
  return acc * postscale;
}

TEST(Reduce, F32EveryOpAndAliasAgainstDouble) {
  const ReduceOp ops[] = {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMin, ReduceOp::kMax,
                          ReduceOp::kProduct};
  for (int n = 1; n <= 5; ++n) {
    for (size_t count : kCounts) {
      for (ReduceOp op : ops) {
        for (double prescale : {1.0, -0.5}) {
          // alias = -1: separate output; alias = k: out is input k.
          for (int alias = -1; alias < n; ++alias) {
            std::vector<std::vector<float>> inputs(n, std::vector<float>(count));
            for (int k = 0; k < n; ++k) {
              for (size_t i = 0; i < count; ++i) {
                inputs[k][i] = 0.75f + 0.125f * static_cast<float>((i * 7 + k * 3) % 5);
              }
            }
            const auto original = inputs;
            std::vector<float> separate(count, -1.0f);
            float* out = alias < 0 ? separate.data() : inputs[alias].data();
            const auto in = pointers(inputs);
            reduce_inputs(out, in.data(), n, count, DType::kF32, options_of(op, prescale, 2.0), n);
            for (size_t i = 0; i < count; ++i) {
              std::vector<double> values;
              for (int k = 0; k < n; ++k) values.push_back(original[k][i]);
              const double expected = reference(op, values, prescale, 2.0);
              ASSERT_NEAR(out[i], expected, 1e-5 * std::fabs(expected) + 1e-6)
                  << reduce_op_name(op) << " n=" << n << " count=" << count << " i=" << i
                  << " alias=" << alias << " prescale=" << prescale;
            }
          }
        }
      }
    }
  }
}

TEST(Reduce, F64SumIsExactForSmallIntegers) {
  const size_t count = 3001;
  std::vector<std::vector<double>> inputs(3, std::vector<double>(count));
  for (int k = 0; k < 3; ++k) {
    for (size_t i = 0; i < count; ++i) inputs[k][i] = static_cast<double>(i) * (k + 1);
  }
  const void* in[3] = {inputs[0].data(), inputs[1].data(), inputs[2].data()};
  reduce_inputs(inputs[1].data(), in, 3, count, DType::kF64, options_of(ReduceOp::kSum), 3);
  for (size_t i = 0; i < count; ++i) ASSERT_EQ(inputs[1][i], 6.0 * i);
}

TEST(Reduce, HalfTypesAccumulateInF32) {
  // 2048 + 1 + 1: summed pairwise in f16 each +1 rounds back to 2048 (the f16
  // spacing there is 2); accumulated in f32 the exact 2050 is representable.
  for (DType dtype : {DType::kF16, DType::kBF16}) {
    auto to_half = dtype == DType::kF16 ? float_to_f16 : float_to_bf16;
    auto from_half = dtype == DType::kF16 ? f16_to_float : bf16_to_float;
    const float big = dtype == DType::kF16 ? 2048.0f : 256.0f;  // bf16 spacing 2 at 256
    std::vector<uint16_t> a(3000, to_half(big)), b(3000, to_half(1.0f)), c(3000, to_half(1.0f));
    const void* in[3] = {a.data(), b.data(), c.data()};
    std::vector<uint16_t> out(3000);
    reduce_inputs(out.data(), in, 3, out.size(), dtype, options_of(ReduceOp::kSum), 3);
    for (uint16_t v : out) ASSERT_EQ(from_half(v), big + 2.0f) << dtype_name(dtype);

    // The pairwise API rounds after every step, as documented.
    reduce_pair(a.data(), b.data(), a.size(), dtype, ReduceOp::kSum);
    reduce_pair(a.data(), c.data(), a.size(), dtype, ReduceOp::kSum);
    EXPECT_EQ(from_half(a[0]), big) << dtype_name(dtype);
  }
}

TEST(Reduce, HalfTypesEveryOpAgainstDouble) {
  const ReduceOp ops[] = {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMin, ReduceOp::kMax,
                          ReduceOp::kProduct};
  for (DType dtype : {DType::kF16, DType::kBF16}) {
    auto to_half = dtype == DType::kF16 ? float_to_f16 : float_to_bf16;
    auto from_half = dtype == DType::kF16 ? f16_to_float : bf16_to_float;
    const double tolerance = dtype == DType::kF16 ? 1.0 / 1024 : 1.0 / 128;  // ~2 ulp
    for (ReduceOp op : ops) {
      const int n = 4;
      const size_t count = 2500;
      std::vector<std::vector<uint16_t>> inputs(n, std::vector<uint16_t>(count));
      for (int k = 0; k < n; ++k) {
        for (size_t i = 0; i < count; ++i) {
          inputs[k][i] = to_half(0.5f + 0.25f * static_cast<float>((i + 3 * k) % 6));
        }
      }
      const void* in[n] = {inputs[0].data(), inputs[1].data(), inputs[2].data(), inputs[3].data()};
      std::vector<uint16_t> out(count);
      reduce_inputs(out.data(), in, n, count, dtype, options_of(op, 0.5, 3.0), n);
      for (size_t i = 0; i < count; ++i) {
        std::vector<double> values;
        for (int k = 0; k < n; ++k) values.push_back(from_half(inputs[k][i]));
        const double expected = reference(op, values, 0.5, 3.0);
        ASSERT_NEAR(from_half(out[i]), expected, tolerance * std::fabs(expected))
            << dtype_name(dtype) << " " << reduce_op_name(op) << " i=" << i;
      }
    }
  }
}

TEST(Reduce, HalfTypesKeepInfAndNan) {
  std::vector<uint16_t> a = {0x7c00, 0x7e00, 0x3c00};  // +Inf, NaN, 1
  std::vector<uint16_t> b = {0x3c00, 0x3c00, 0x3c00};
  const void* in[2] = {a.data(), b.data()};
  std::vector<uint16_t> out(3);
  reduce_inputs(out.data(), in, 2, 3, DType::kF16, options_of(ReduceOp::kSum), 2);
  EXPECT_EQ(out[0], 0x7c00);
  EXPECT_TRUE(std::isnan(f16_to_float(out[1])));
  EXPECT_EQ(out[2], 0x4000);
}

// Every f16/bf16 bit pattern through the kernels (the F16C path where the CPU
// has it, including the scalar tail) against the scalar conversions.
TEST(Reduce, HalfKernelsMatchScalarConversionsOnEveryPattern) {
  for (DType dtype : {DType::kF16, DType::kBF16}) {
    auto to_half = dtype == DType::kF16 ? float_to_f16 : float_to_bf16;
    auto from_half = dtype == DType::kF16 ? f16_to_float : bf16_to_float;
    const size_t count = 65536 + 5;  // not a multiple of the vector width
    std::vector<uint16_t> a(count), b(count);
    for (size_t i = 0; i < count; ++i) {
      a[i] = static_cast<uint16_t>(i);
      b[i] = static_cast<uint16_t>((i * 7919 + 3) & 0xffff);
    }
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kProduct, ReduceOp::kMax}) {
      std::vector<uint16_t> out(count);
      const void* in[2] = {a.data(), b.data()};
      reduce_inputs(out.data(), in, 2, count, dtype, options_of(op, 1.0, 0.5), 2);
      for (size_t i = 0; i < count; ++i) {
        const float x = from_half(a[i]), y = from_half(b[i]);
        const float combined = op == ReduceOp::kSum       ? x + y
                               : op == ReduceOp::kProduct ? x * y
                                                          : (x < y ? y : x);
        const uint16_t expected = to_half(combined * 0.5f);
        if (std::isnan(from_half(expected))) {
          ASSERT_TRUE(std::isnan(from_half(out[i]))) << dtype_name(dtype) << " i=" << i;
        } else {
          ASSERT_EQ(out[i], expected)
              << dtype_name(dtype) << " " << reduce_op_name(op) << " i=" << i;
        }
      }
    }
  }
}

template <typename T>
std::vector<T> reduce_ints(const std::vector<std::vector<T>>& inputs, DType dtype,
                           const AllreduceOptions& options) {
  std::vector<const void*> in;
  for (const auto& input : inputs) in.push_back(input.data());
  std::vector<T> out(inputs[0].size());
  reduce_inputs(out.data(), in.data(), static_cast<int>(in.size()), out.size(), dtype, options,
                static_cast<int>(in.size()));
  return out;
}

TEST(Reduce, IntegersWrapWhenUnscaled) {
  EXPECT_EQ(reduce_ints<int8_t>({{100, -100}, {100, -100}}, DType::kI8, options_of(ReduceOp::kSum)),
            (std::vector<int8_t>{-56, 56}));
  EXPECT_EQ(reduce_ints<uint8_t>({{200}, {100}}, DType::kU8, options_of(ReduceOp::kSum)),
            (std::vector<uint8_t>{44}));
  EXPECT_EQ(reduce_ints<uint8_t>({{16}, {16}}, DType::kU8, options_of(ReduceOp::kProduct)),
            (std::vector<uint8_t>{0}));
  EXPECT_EQ(
      reduce_ints<int32_t>({{1 << 20}, {1 << 12}}, DType::kI32, options_of(ReduceOp::kProduct)),
      (std::vector<int32_t>{0}));
  EXPECT_EQ(reduce_ints<int32_t>({{std::numeric_limits<int32_t>::max()}, {1}}, DType::kI32,
                                 options_of(ReduceOp::kSum)),
            (std::vector<int32_t>{std::numeric_limits<int32_t>::min()}));
  EXPECT_EQ(
      reduce_ints<int64_t>({{-3, 5}, {7, -2}, {2, 2}}, DType::kI64, options_of(ReduceOp::kProduct)),
      (std::vector<int64_t>{-42, -20}));
  EXPECT_EQ(reduce_ints<int8_t>({{-3, 5}, {7, -2}, {2, 2}}, DType::kI8, options_of(ReduceOp::kMin)),
            (std::vector<int8_t>{-3, -2}));
  EXPECT_EQ(reduce_ints<uint8_t>({{3, 250}, {7, 2}}, DType::kU8, options_of(ReduceOp::kMax)),
            (std::vector<uint8_t>{7, 250}));
}

TEST(Reduce, IntegersTruncateAndSaturateWhenScaled) {
  // average: (1 + 2) / 2 = 1.5 -> 1; (-1 + -2) / 2 = -1.5 -> -1; (1 + 4) / 2 = 2.5 -> 2.
  EXPECT_EQ(
      reduce_ints<int32_t>({{1, -1, 1}, {2, -2, 4}}, DType::kI32, options_of(ReduceOp::kAverage)),
      (std::vector<int32_t>{1, -1, 2}));
  // The average is computed in double: no wrap of the i8 sum 100 + 100.
  EXPECT_EQ(reduce_ints<int8_t>({{100}, {100}}, DType::kI8, options_of(ReduceOp::kAverage)),
            (std::vector<int8_t>{100}));
  EXPECT_EQ(reduce_ints<uint8_t>({{200, 3}}, DType::kU8, options_of(ReduceOp::kSum, 1.0, 2.0)),
            (std::vector<uint8_t>{255, 6}));
  EXPECT_EQ(reduce_ints<uint8_t>({{200}}, DType::kU8, options_of(ReduceOp::kSum, -1.0)),
            (std::vector<uint8_t>{0}));
  EXPECT_EQ(reduce_ints<int8_t>({{-100}, {-100}}, DType::kI8, options_of(ReduceOp::kSum, 1.0, 2.0)),
            (std::vector<int8_t>{-128}));
  EXPECT_EQ(reduce_ints<int64_t>({{std::numeric_limits<int64_t>::max()}}, DType::kI64,
                                 options_of(ReduceOp::kSum, 4.0)),
            (std::vector<int64_t>{std::numeric_limits<int64_t>::max()}));
  // A negative prescale turns max into -min.
  EXPECT_EQ(reduce_ints<int32_t>({{3}, {-5}, {1}}, DType::kI32, options_of(ReduceOp::kMax, -1.0)),
            (std::vector<int32_t>{5}));
  // Postscale 0.5 of an odd sum: 7 * 0.5 = 3.5 -> 3, and -3.5 -> -3.
  EXPECT_EQ(
      reduce_ints<int64_t>({{3, -3}, {4, -4}}, DType::kI64, options_of(ReduceOp::kSum, 1.0, 0.5)),
      (std::vector<int64_t>{3, -3}));
  // The prescaled value saturates on each rank, as storing it back would:
  // 100 * 2 -> 127 per rank, then 254 in double, halved: 127.
  EXPECT_EQ(reduce_ints<int8_t>({{100}, {100}}, DType::kI8, options_of(ReduceOp::kSum, 2.0, 0.5)),
            (std::vector<int8_t>{127}));
}

TEST(Reduce, TruncatingIntegersAsHorovod) {
  // Horovod's test_horovod_allreduce_prescale: each rank's value times the
  // prescale is truncated before the sum. [7, -7, 5] * 0.5 on 2 ranks:
  // 3 + 3, -3 + -3, 2 + 2.
  const AllreduceOptions half = options_of(ReduceOp::kSum, 0.5);
  EXPECT_EQ(reduce_ints<int16_t>({{7, -7, 5}, {7, -7, 5}}, DType::kI16, half),
            (std::vector<int16_t>{6, -6, 4}));
  EXPECT_EQ(reduce_ints<int32_t>({{7, -7, 5}, {7, -7, 5}}, DType::kI32, half),
            (std::vector<int32_t>{6, -6, 4}));
  EXPECT_EQ(reduce_ints<int64_t>({{7, -7, 5}, {7, -7, 5}}, DType::kI64, half),
            (std::vector<int64_t>{6, -6, 4}));
  // Postscale truncates the sum: (7 + 7) * 0.3 = 4.2 -> 4, (5 + 5) * 0.3 = 3.
  EXPECT_EQ(
      reduce_ints<int32_t>({{7, 5}, {7, 5}}, DType::kI32, options_of(ReduceOp::kSum, 1.0, 0.3)),
      (std::vector<int32_t>{4, 3}));
}

TEST(Reduce, AveragesDivideCorrectlyRounded) {
  // 3 ranks, one of which joined (zeros): Horovod's test_horovod_join_allreduce
  // expects 2x / 3 exactly, as torch's `t / 3` gives. float(1/3) * 2x differs
  // in 66 of the 201 values below; the average, and a Sum with postscale
  // 1/3 (how the Python frontend sends Horovod's Average), divide instead.
  std::vector<float> x, zeros(201, 0.0f), expected;
  for (int v = -100; v <= 100; ++v) {
    x.push_back(static_cast<float>(v));
    expected.push_back(static_cast<float>(2 * v) / 3.0f);
  }
  const void* in[3] = {x.data(), x.data(), zeros.data()};
  std::vector<float> average(201), sum_scaled(201);
  reduce_inputs(average.data(), in, 3, 201, DType::kF32, options_of(ReduceOp::kAverage), 3);
  reduce_inputs(sum_scaled.data(), in, 3, 201, DType::kF32,
                options_of(ReduceOp::kSum, 1.0, 1.0 / 3), 3);
  EXPECT_EQ(average, expected);
  EXPECT_EQ(sum_scaled, expected);
  // The pairwise (ring) path finishes alike.
  std::vector<float> ring = x;
  reduce_pair(ring.data(), x.data(), 201, DType::kF32, ReduceOp::kSum);
  finish_reduction(ring.data(), 201, DType::kF32, options_of(ReduceOp::kSum, 1.0, 1.0 / 3), 3);
  EXPECT_EQ(ring, expected);

  // Any other postscale is Horovod's float factor: float(2x) * float(0.37).
  std::vector<float> scaled(201);
  reduce_inputs(scaled.data(), in, 3, 201, DType::kF32, options_of(ReduceOp::kSum, 1.0, 0.37), 3);
  for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(scaled[i], 2.0f * x[i] * 0.37f) << i;

  // f16: the f32 quotient rounded once more to f16.
  std::vector<uint16_t> h, hzeros(201, float_to_f16(0.0f));
  for (float v : x) h.push_back(float_to_f16(v));
  const void* hin[3] = {h.data(), h.data(), hzeros.data()};
  std::vector<uint16_t> havg(201);
  reduce_inputs(havg.data(), hin, 3, 201, DType::kF16, options_of(ReduceOp::kAverage), 3);
  for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(havg[i], float_to_f16(expected[i])) << i;

  // Integers: 1.0 / (1.0 / 49) is not 49 in double, and 49 * (1.0 / 49)
  // truncates to 0; a postscale of 1/49 divides, so 49 / 49 is 1.
  EXPECT_EQ(
      reduce_ints<int32_t>({{49, 98, -49}}, DType::kI32, options_of(ReduceOp::kSum, 1.0, 1.0 / 49)),
      (std::vector<int32_t>{1, 2, -1}));
  // With an average's divisor too: (1/2) over 3 ranks divides by 6.
  EXPECT_EQ(reduce_ints<int32_t>({{6, 12}, {0, 0}, {0, 0}}, DType::kI32,
                                 options_of(ReduceOp::kAverage, 1.0, 0.5)),
            (std::vector<int32_t>{1, 2}));
}

TEST(Reduce, PairwiseStepsMatchReduceInputs) {
  // prescale on each input, pairwise accumulation, finish: the ring path.
  const int n = 3;
  const size_t count = 4099;
  for (DType dtype : {DType::kI32, DType::kF32, DType::kF64}) {
    for (ReduceOp op :
         {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProduct}) {
      const AllreduceOptions options = options_of(op, 2.0, 0.25);
      std::vector<std::vector<double>> storage(n, std::vector<double>(count));
      std::vector<const void*> in;
      for (int k = 0; k < n; ++k) {
        auto* bytes = reinterpret_cast<uint8_t*>(storage[k].data());
        for (size_t i = 0; i < count; ++i) {
          const int value = static_cast<int>((i + 5 * k) % 9) - 4;
          if (dtype == DType::kI32) reinterpret_cast<int32_t*>(bytes)[i] = value;
          if (dtype == DType::kF32) reinterpret_cast<float*>(bytes)[i] = value * 0.5f;
          if (dtype == DType::kF64) reinterpret_cast<double*>(bytes)[i] = value * 0.5;
        }
        in.push_back(storage[k].data());
      }
      std::vector<double> direct(count), ring(count);
      reduce_inputs(direct.data(), in.data(), n, count, dtype, options, n);

      std::vector<std::vector<double>> scaled = storage;
      for (auto& buffer : scaled) apply_prescale(buffer.data(), count, dtype, options.prescale);
      ring = scaled[0];
      for (int k = 1; k < n; ++k) reduce_pair(ring.data(), scaled[k].data(), count, dtype, op);
      finish_reduction(ring.data(), count, dtype, options, n);
      ASSERT_EQ(std::memcmp(direct.data(), ring.data(), count * dtype_size(dtype)), 0)
          << dtype_name(dtype) << " " << reduce_op_name(op);
    }
  }
}

TEST(Reduce, ScaleHelpers) {
  EXPECT_TRUE(is_unscaled(options_of(ReduceOp::kSum)));
  EXPECT_TRUE(is_unscaled(options_of(ReduceOp::kProduct)));
  EXPECT_FALSE(is_unscaled(options_of(ReduceOp::kAverage)));
  EXPECT_FALSE(is_unscaled(options_of(ReduceOp::kSum, 0.5)));
  EXPECT_FALSE(is_unscaled(options_of(ReduceOp::kMin, 1.0, 3.0)));

  std::vector<int8_t> bytes = {1, -3, 100};
  apply_prescale(bytes.data(), bytes.size(), DType::kI8, 1.5);  // 1.5, -4.5, 150: truncated
  EXPECT_EQ(bytes, (std::vector<int8_t>{1, -4, 127}));
  std::vector<float> values = {2.0f, 4.0f};
  finish_reduction(values.data(), values.size(), DType::kF32,
                   options_of(ReduceOp::kAverage, 1.0, 3.0), 2);
  EXPECT_EQ(values, (std::vector<float>{3.0f, 6.0f}));
}

TEST(Reduce, ZeroCountTouchesNothing) {
  reduce_inputs(nullptr, nullptr, 4, 0, DType::kF32, options_of(ReduceOp::kSum), 4);
  reduce_pair(nullptr, nullptr, 0, DType::kI64, ReduceOp::kMax);
  apply_prescale(nullptr, 0, DType::kF16, 2.0);
  finish_reduction(nullptr, 0, DType::kBF16, options_of(ReduceOp::kAverage), 2);
}

}  // namespace
}  // namespace kolo::detail
