// Reduction kernels shared by every backend (semantics in reduce.h).
//
// Shape of every kernel: the count is cut into blocks of kBlock elements; for
// each block the inputs are loaded (converted to the accumulation type and
// prescaled), combined into a small accumulator array on the stack (L1), then
// finished (average divisor, postscale) and stored. Reading every input before
// the block's store is what lets `out` alias any input, and the stack
// accumulator cannot alias anything, so gcc vectorizes the inner loops without
// runtime alias checks. Memory traffic is the minimum: n reads and one write.
//
// Integer semantics (documented in reduce.h and dtype.h):
//  - unscaled (prescale == postscale == 1, op != average): accumulate in the
//    element type, sum and product wrap modulo 2^bits (two's complement);
//  - otherwise: every value is taken to double, prescaled and truncated toward
//    zero (saturating to the type's range, as storing it back would), reduced
//    in double in rank order, multiplied by the postscale and divided by the
//    divisor (average), then truncated toward zero and saturated to the
//    type's range (NaN stores 0). This is Horovod's integer semantics.
//
// Finishing (every dtype): a postscale that is exactly 1/m for a whole m (as
// 1.0 / m rounds in double) divides by m, and an average divides by its
// divisor, instead of multiplying by a rounded reciprocal. So an Average, and
// a Sum with postscale 1/size (how Horovod's Average and a join's whole-set
// divisor arrive), give acc / m correctly rounded, as torch's `t / m` and
// DDP's `div_` do: f32 2x times float(1/3) is one ulp off for about a
// third of the integers x in [-100, 100]. Any other postscale multiplies in
// the accumulation type (f32 for f16, bf16 and f32: Horovod's float factor).
#include "reduce.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "half.h"
#include "kolo/core/errors.h"
#include "rounding.h"

#define KOLO_HOT_KERNEL __attribute__((target_clones("avx2", "default")))
#define KOLO_INLINE inline __attribute__((always_inline))

namespace kolo::detail {

namespace {

// Elements per block: 8 KiB of f32 accumulator, 16 KiB of f64.
constexpr size_t kBlock = 2048;

// ---- Codecs: storage type <-> accumulation type ----------------------------

template <typename T>
struct PlainCodec {  // f32, f64 and unscaled integers: accumulate in T
  using Storage = T;
  using Acc = T;
  static KOLO_INLINE Acc load(Storage v) { return v; }
  static KOLO_INLINE Acc prescaled(Storage v, Acc prescale) { return load(v) * prescale; }
  static KOLO_INLINE Storage store(Acc v) { return v; }
};

struct F16Codec {
  using Storage = uint16_t;
  using Acc = float;
  static KOLO_INLINE Acc load(Storage v) { return half_to_float_inline(v); }
  static KOLO_INLINE Acc prescaled(Storage v, Acc prescale) { return load(v) * prescale; }
  static KOLO_INLINE Storage store(Acc v) { return float_to_half_inline(v); }
};

struct BF16Codec {
  using Storage = uint16_t;
  using Acc = float;
  static KOLO_INLINE Acc load(Storage v) { return bf16_to_float_inline(v); }
  static KOLO_INLINE Acc prescaled(Storage v, Acc prescale) { return load(v) * prescale; }
  static KOLO_INLINE Storage store(Acc v) { return float_to_bf16_inline(v); }
};

template <typename T>
struct ScaledIntCodec {  // integers with a scale or average: accumulate in double
  using Storage = T;
  using Acc = double;
  static KOLO_INLINE Acc load(Storage v) { return static_cast<double>(v); }
  static KOLO_INLINE Acc prescaled(Storage v, Acc prescale) {
    return prescale_integer<T>(load(v), prescale);
  }
  static KOLO_INLINE Storage store(Acc v) { return truncate_saturate<T>(v); }
};

// ---- Operations on the accumulation type ------------------------------------

// Integer sum/product wrap: computed on the unsigned type (no UB).
template <typename A>
KOLO_INLINE A wrap_add(A a, A b) {
  if constexpr (std::is_integral_v<A>) {
    using U = std::make_unsigned_t<A>;
    return static_cast<A>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
  } else {
    return a + b;
  }
}

template <typename A>
KOLO_INLINE A wrap_mul(A a, A b) {
  if constexpr (std::is_integral_v<A>) {
    // uint8 promotes to int; 255 * 255 still fits, so no signed overflow.
    using U = std::conditional_t<(sizeof(A) < sizeof(unsigned)), unsigned, std::make_unsigned_t<A>>;
    return static_cast<A>(static_cast<U>(a) * static_cast<U>(b));
  } else {
    return a * b;
  }
}

struct SumOp {
  template <typename A>
  static KOLO_INLINE A apply(A a, A b) {
    return wrap_add(a, b);
  }
};
struct ProductOp {
  template <typename A>
  static KOLO_INLINE A apply(A a, A b) {
    return wrap_mul(a, b);
  }
};
struct MinOp {
  template <typename A>
  static KOLO_INLINE A apply(A a, A b) {
    return b < a ? b : a;
  }
};
struct MaxOp {
  template <typename A>
  static KOLO_INLINE A apply(A a, A b) {
    return a < b ? b : a;
  }
};

// m when p == 1.0 / m for a whole m in [1, 2^24] (exact as a float too), else 0.
double whole_reciprocal(double p) {
  if (!(p > 0.0) || p > 1.0) return 0.0;
  const double m = std::nearbyint(1.0 / p);
  return m >= 1.0 && m <= 16777216.0 && 1.0 / m == p ? m : 0.0;
}

// How a reduced value is finished: value * multiply / divide (file comment).
struct Finish {
  double multiply = 1.0;
  double divide = 1.0;
};

Finish finish_of(double postscale, bool average, int divisor) {
  Finish f;
  const double m = whole_reciprocal(postscale);
  if (m != 0.0) {
    f.divide = m;
  } else {
    f.multiply = postscale;
  }
  if (average) f.divide *= divisor;
  return f;
}

// Scale parameters converted once to the accumulation type.
template <typename A>
struct Scales {
  A prescale;
  // Floats: the result is acc / divide when by_division, else acc * multiply
  // (a postscale over the average's divisor, as before this rule). Integers
  // (double path): multiply_d * acc / divide_d.
  A multiply;
  A divide;
  bool by_division;
  double multiply_d;
  double divide_d;
};

template <typename A>
Scales<A> scales_of(double prescale, const Finish& f) {
  Scales<A> s{};
  s.prescale = static_cast<A>(prescale);
  // A power of two's reciprocal is exact: multiplying by it is the same
  // quotient, and keeps the 2-, 4- and 8-rank averages on the multiply.
  int exponent = 0;
  const bool power_of_two = std::frexp(f.divide, &exponent) == 0.5;
  s.by_division = f.multiply == 1.0 && !power_of_two;
  s.multiply = static_cast<A>(f.multiply / f.divide);
  s.divide = static_cast<A>(f.divide);
  s.multiply_d = f.multiply;
  s.divide_d = f.divide;
  return s;
}

// One pass over `count` elements. kScaled selects whether prescale and the
// finishing step run at all (the unscaled path is the bandwidth-critical one).
template <typename Codec, typename Op, bool kScaled>
KOLO_INLINE void reduce_kernel(void* out_raw, const void* const* inputs, int n, size_t count,
                               const Scales<typename Codec::Acc>& scales) {
  using S = typename Codec::Storage;
  using A = typename Codec::Acc;
  S* out = static_cast<S*>(out_raw);
  A acc[kBlock];
  for (size_t base = 0; base < count; base += kBlock) {
    const size_t len = count - base < kBlock ? count - base : kBlock;
    const S* in0 = static_cast<const S*>(inputs[0]) + base;
    if constexpr (kScaled) {
      const A pre = scales.prescale;
      for (size_t i = 0; i < len; ++i) acc[i] = Codec::prescaled(in0[i], pre);
      for (int k = 1; k < n; ++k) {
        const S* in = static_cast<const S*>(inputs[k]) + base;
        for (size_t i = 0; i < len; ++i) acc[i] = Op::apply(acc[i], Codec::prescaled(in[i], pre));
      }
      if constexpr (std::is_integral_v<S>) {
        // Double path of integers: (multiply * R) / divide, as reduce.h states.
        const double post = scales.multiply_d;
        const double divide = scales.divide_d;
        if (divide != 1.0) {
          for (size_t i = 0; i < len; ++i) out[base + i] = Codec::store(post * acc[i] / divide);
        } else {
          for (size_t i = 0; i < len; ++i) out[base + i] = Codec::store(post * acc[i]);
        }
      } else if (scales.by_division) {
        const A divide = scales.divide;
        for (size_t i = 0; i < len; ++i) out[base + i] = Codec::store(acc[i] / divide);
      } else {
        const A post = scales.multiply;
        for (size_t i = 0; i < len; ++i) out[base + i] = Codec::store(acc[i] * post);
      }
    } else {
      if (n == 1) {
        if (out + base != in0) {
          for (size_t i = 0; i < len; ++i) acc[i] = Codec::load(in0[i]);
          for (size_t i = 0; i < len; ++i) out[base + i] = Codec::store(acc[i]);
        }
        continue;
      }
      const S* in1 = static_cast<const S*>(inputs[1]) + base;
      for (size_t i = 0; i < len; ++i) acc[i] = Op::apply(Codec::load(in0[i]), Codec::load(in1[i]));
      for (int k = 2; k < n; ++k) {
        const S* in = static_cast<const S*>(inputs[k]) + base;
        for (size_t i = 0; i < len; ++i) acc[i] = Op::apply(acc[i], Codec::load(in[i]));
      }
      for (size_t i = 0; i < len; ++i) out[base + i] = Codec::store(acc[i]);
    }
  }
}

// What one call needs after options are decoded.
struct Call {
  void* out;
  const void* const* inputs;
  int n;
  size_t count;
  ReduceOp op;
  bool scaled;
  double prescale;
  double postscale;
  int divisor;
};

template <typename Codec, bool kScaled>
KOLO_INLINE void dispatch_op(const Call& c) {
  using A = typename Codec::Acc;
  const Scales<A> scales =
      scales_of<A>(c.prescale, finish_of(c.postscale, c.op == ReduceOp::kAverage, c.divisor));
  switch (c.op) {
    case ReduceOp::kSum:
    case ReduceOp::kAverage:
      return reduce_kernel<Codec, SumOp, kScaled>(c.out, c.inputs, c.n, c.count, scales);
    case ReduceOp::kMin:
      return reduce_kernel<Codec, MinOp, kScaled>(c.out, c.inputs, c.n, c.count, scales);
    case ReduceOp::kMax:
      return reduce_kernel<Codec, MaxOp, kScaled>(c.out, c.inputs, c.n, c.count, scales);
    case ReduceOp::kProduct:
      return reduce_kernel<Codec, ProductOp, kScaled>(c.out, c.inputs, c.n, c.count, scales);
  }
}

template <typename Codec>
KOLO_INLINE void dispatch_float(const Call& c) {
  if (c.scaled) {
    dispatch_op<Codec, true>(c);
  } else {
    dispatch_op<Codec, false>(c);
  }
}

template <typename T>
KOLO_INLINE void dispatch_int(const Call& c) {
  if (c.scaled) {
    dispatch_op<ScaledIntCodec<T>, true>(c);
  } else {
    dispatch_op<PlainCodec<T>, false>(c);
  }
}

// One clone set per dtype keeps each function small; avx2 doubles the vector
// width of the hot loops over the x86-64 baseline (SSE2).
KOLO_HOT_KERNEL void reduce_u8(const Call& c) { dispatch_int<uint8_t>(c); }
KOLO_HOT_KERNEL void reduce_i8(const Call& c) { dispatch_int<int8_t>(c); }
KOLO_HOT_KERNEL void reduce_i16(const Call& c) { dispatch_int<int16_t>(c); }
KOLO_HOT_KERNEL void reduce_i32(const Call& c) { dispatch_int<int32_t>(c); }
KOLO_HOT_KERNEL void reduce_i64(const Call& c) { dispatch_int<int64_t>(c); }
KOLO_HOT_KERNEL void reduce_f16_portable(const Call& c) { dispatch_float<F16Codec>(c); }

// ---- f16 with F16C ---------------------------------------------------------------
// gcc 12 does not vectorize _Float16 conversions, so with F16C the f16 kernel
// converts whole blocks with the 8-wide instructions (half.h's array
// conversions) and reduces in f32 arrays. Same results as the portable path:
// both conversions are exact / round to nearest even.

template <typename Op, bool kScaled>
KOLO_INLINE void reduce_f16c_kernel(const Call& c, const Scales<float>& scales) {
  const float prescale = scales.prescale;
  uint16_t* out = static_cast<uint16_t*>(c.out);
  float acc[kBlock];
  float tmp[kBlock];
  for (size_t base = 0; base < c.count; base += kBlock) {
    const size_t len = c.count - base < kBlock ? c.count - base : kBlock;
    const uint16_t* in0 = static_cast<const uint16_t*>(c.inputs[0]) + base;
    if (!kScaled && c.n == 1) {
      if (out + base != in0) std::memcpy(out + base, in0, len * sizeof(uint16_t));
      continue;
    }
    f16_to_float_array(in0, acc, len);
    if constexpr (kScaled) {
      for (size_t i = 0; i < len; ++i) acc[i] *= prescale;
    }
    for (int k = 1; k < c.n; ++k) {
      f16_to_float_array(static_cast<const uint16_t*>(c.inputs[k]) + base, tmp, len);
      if constexpr (kScaled) {
        for (size_t i = 0; i < len; ++i) acc[i] = Op::apply(acc[i], tmp[i] * prescale);
      } else {
        for (size_t i = 0; i < len; ++i) acc[i] = Op::apply(acc[i], tmp[i]);
      }
    }
    if constexpr (kScaled) {
      const float divide = scales.divide;
      const float multiply = scales.multiply;
      if (scales.by_division) {
        for (size_t i = 0; i < len; ++i) acc[i] /= divide;
      } else {
        for (size_t i = 0; i < len; ++i) acc[i] *= multiply;
      }
    }
    float_to_f16_array(acc, out + base, len);  // after every input of the block was read
  }
}

template <bool kScaled>
KOLO_INLINE void reduce_f16c_op(const Call& c) {
  const Scales<float> scales =
      scales_of<float>(c.prescale, finish_of(c.postscale, c.op == ReduceOp::kAverage, c.divisor));
  switch (c.op) {
    case ReduceOp::kSum:
    case ReduceOp::kAverage:
      return reduce_f16c_kernel<SumOp, kScaled>(c, scales);
    case ReduceOp::kMin:
      return reduce_f16c_kernel<MinOp, kScaled>(c, scales);
    case ReduceOp::kMax:
      return reduce_f16c_kernel<MaxOp, kScaled>(c, scales);
    case ReduceOp::kProduct:
      return reduce_f16c_kernel<ProductOp, kScaled>(c, scales);
  }
}

KOLO_HOT_KERNEL void reduce_f16c(const Call& c) {
  if (c.scaled) {
    reduce_f16c_op<true>(c);
  } else {
    reduce_f16c_op<false>(c);
  }
}

void reduce_f16(const Call& c) {
  if (cpu_has_f16c()) {
    reduce_f16c(c);
  } else {
    reduce_f16_portable(c);
  }
}
KOLO_HOT_KERNEL void reduce_bf16(const Call& c) { dispatch_float<BF16Codec>(c); }
KOLO_HOT_KERNEL void reduce_f32(const Call& c) { dispatch_float<PlainCodec<float>>(c); }
KOLO_HOT_KERNEL void reduce_f64(const Call& c) { dispatch_float<PlainCodec<double>>(c); }

void run(const Call& c, DType dtype) {
  if (c.count == 0) return;
  switch (dtype) {
    case DType::kU8:
      return reduce_u8(c);
    case DType::kI8:
      return reduce_i8(c);
    case DType::kI16:
      return reduce_i16(c);
    case DType::kI32:
      return reduce_i32(c);
    case DType::kI64:
      return reduce_i64(c);
    case DType::kF16:
      return reduce_f16(c);
    case DType::kBF16:
      return reduce_bf16(c);
    case DType::kF32:
      return reduce_f32(c);
    case DType::kF64:
      return reduce_f64(c);
  }
  throw ContractError("kolo reduce: invalid dtype value " +
                      std::to_string(static_cast<int>(dtype)));
}

void check_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAverage:
    case ReduceOp::kMin:
    case ReduceOp::kMax:
    case ReduceOp::kProduct:
      return;
  }
  throw ContractError("kolo reduce: invalid reduce op value " +
                      std::to_string(static_cast<int>(op)));
}

}  // namespace

bool is_unscaled(const AllreduceOptions& options) {
  return options.prescale == 1.0 && options.postscale == 1.0 && options.op != ReduceOp::kAverage;
}

void reduce_inputs(void* out, const void* const* inputs, int n, size_t count, DType dtype,
                   const AllreduceOptions& options, int divisor) {
  if (count == 0) return;
  if (n < 1) throw ContractError("kolo reduce_inputs: n must be >= 1, got " + std::to_string(n));
  if (divisor < 1) {
    throw ContractError("kolo reduce_inputs: divisor must be >= 1, got " + std::to_string(divisor));
  }
  check_op(options.op);
  // One input averaged over one rank, unscaled, is that input: copied, or
  // nothing at all in place, instead of a multiply by 1 over every element.
  const bool identity =
      n == 1 && divisor == 1 && options.prescale == 1.0 && options.postscale == 1.0;
  run(Call{out, inputs, n, count, options.op, !identity && !is_unscaled(options), options.prescale,
           options.postscale, divisor},
      dtype);
}

void reduce_pair(void* acc, const void* in, size_t count, DType dtype, ReduceOp op) {
  check_op(op);
  const void* inputs[2] = {acc, in};
  const ReduceOp pair_op = op == ReduceOp::kAverage ? ReduceOp::kSum : op;
  run(Call{acc, inputs, 2, count, pair_op, false, 1.0, 1.0, 1}, dtype);
}

void apply_prescale(void* buffer, size_t count, DType dtype, double prescale) {
  if (prescale == 1.0) return;
  const void* inputs[1] = {buffer};
  run(Call{buffer, inputs, 1, count, ReduceOp::kSum, true, prescale, 1.0, 1}, dtype);
}

void finish_reduction(void* buffer, size_t count, DType dtype, const AllreduceOptions& options,
                      int divisor) {
  check_op(options.op);
  if (options.op != ReduceOp::kAverage && options.postscale == 1.0) return;
  if (divisor < 1) {
    throw ContractError("kolo finish_reduction: divisor must be >= 1, got " +
                        std::to_string(divisor));
  }
  const void* inputs[1] = {buffer};
  run(Call{buffer, inputs, 1, count, options.op, true, 1.0, options.postscale, divisor}, dtype);
}

}  // namespace kolo::detail
