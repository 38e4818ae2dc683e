// Staging of reductions for pairwise wire algorithms (staged_reduction.h).
#include "comm/staged_reduction.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "half.h"
#include "kolo/core/errors.h"
#include "reduce.h"
#include "rounding.h"

namespace kolo::detail {

namespace {

// Integers staged as double, prescaled and truncated as the kernels do
// (rounding.h) in the same pass, so the staged and unstaged paths agree.
template <typename T>
void ints_to_double(const void* in, void* work, size_t count, double prescale) {
  const T* src = static_cast<const T*>(in);
  double* dst = static_cast<double*>(work);
  if (prescale == 1.0) {
    for (size_t i = 0; i < count; ++i) dst[i] = static_cast<double>(src[i]);
  } else {
    for (size_t i = 0; i < count; ++i) {
      dst[i] = prescale_integer<T>(static_cast<double>(src[i]), prescale);
    }
  }
}

// The finishing step of reduce.cc's integer kernels, (postscale * R) /
// divisor, computed the same way so that truncation agrees bit for bit.
template <typename T>
void double_to_ints(const void* work, void* out, size_t count, double postscale, double divisor) {
  const double* src = static_cast<const double*>(work);
  T* dst = static_cast<T*>(out);
  for (size_t i = 0; i < count; ++i) dst[i] = truncate_saturate<T>(postscale * src[i] / divisor);
}

// Integers are prescaled here; floats are prescaled on the wire afterwards.
void to_wire(DType dtype, const void* in, void* work, size_t count, double prescale) {
  switch (dtype) {
    case DType::kU8:
      return ints_to_double<uint8_t>(in, work, count, prescale);
    case DType::kI8:
      return ints_to_double<int8_t>(in, work, count, prescale);
    case DType::kI16:
      return ints_to_double<int16_t>(in, work, count, prescale);
    case DType::kI32:
      return ints_to_double<int32_t>(in, work, count, prescale);
    case DType::kI64:
      return ints_to_double<int64_t>(in, work, count, prescale);
    case DType::kF16:
      return f16_to_float_array(static_cast<const uint16_t*>(in), static_cast<float*>(work), count);
    case DType::kBF16: {
      const uint16_t* src = static_cast<const uint16_t*>(in);
      float* dst = static_cast<float*>(work);
      for (size_t i = 0; i < count; ++i) dst[i] = bf16_to_float_inline(src[i]);
      return;
    }
    case DType::kF32:
    case DType::kF64:
      break;  // never staged
  }
}

// Integers: `postscale` and `divisor` finish the reduction here (1 and 1 when
// there is nothing to finish); floats were finished on the wire.
void from_wire(DType dtype, const void* work, void* out, size_t count, double postscale,
               double divisor) {
  switch (dtype) {
    case DType::kU8:
      return double_to_ints<uint8_t>(work, out, count, postscale, divisor);
    case DType::kI8:
      return double_to_ints<int8_t>(work, out, count, postscale, divisor);
    case DType::kI16:
      return double_to_ints<int16_t>(work, out, count, postscale, divisor);
    case DType::kI32:
      return double_to_ints<int32_t>(work, out, count, postscale, divisor);
    case DType::kI64:
      return double_to_ints<int64_t>(work, out, count, postscale, divisor);
    case DType::kF16:
      return float_to_f16_array(static_cast<const float*>(work), static_cast<uint16_t*>(out),
                                count);
    case DType::kBF16: {
      const float* src = static_cast<const float*>(work);
      uint16_t* dst = static_cast<uint16_t*>(out);
      for (size_t i = 0; i < count; ++i) dst[i] = float_to_bf16_inline(src[i]);
      return;
    }
    case DType::kF32:
    case DType::kF64:
      break;  // never staged
  }
}

}  // namespace

ReductionPlan plan_reduction(DType dtype, const AllreduceOptions& options) {
  ReductionPlan plan;
  plan.dtype = dtype;
  plan.wire = dtype;
  plan.wire_op = options.op == ReduceOp::kAverage ? ReduceOp::kSum : options.op;
  plan.scaled = !is_unscaled(options);
  const bool exact_in_storage =
      !plan.scaled && (options.op == ReduceOp::kMin || options.op == ReduceOp::kMax);
  switch (dtype) {
    case DType::kF16:
    case DType::kBF16:
      if (!exact_in_storage) plan.wire = DType::kF32;
      break;
    case DType::kU8:
    case DType::kI8:
    case DType::kI16:
    case DType::kI32:
    case DType::kI64:
      if (plan.scaled) plan.wire = DType::kF64;
      break;
    case DType::kF32:
    case DType::kF64:
      break;
  }
  plan.staged = plan.wire != dtype;
  return plan;
}

void stage_in(const ReductionPlan& plan, const AllreduceOptions& options, const void* in,
              void* work, size_t count) {
  if (count == 0) return;
  if (plan.staged) {
    to_wire(plan.dtype, in, work, count, options.prescale);
    if (!is_floating(plan.dtype)) return;  // prescaled while converting
  } else if (work != in) {
    std::memcpy(work, in, count * dtype_size(plan.dtype));
  }
  apply_prescale(work, count, plan.wire, options.prescale);
}

void stage_out(const ReductionPlan& plan, const AllreduceOptions& options, void* work, void* out,
               size_t count, int divisor) {
  if (count == 0) return;
  if (plan.staged && !is_floating(plan.dtype)) {
    // Staged integers are always scaled (plan_reduction): finish while converting.
    if (divisor < 1) {
      throw ContractError("kolo stage_out: divisor must be >= 1, got " + std::to_string(divisor));
    }
    const bool average = options.op == ReduceOp::kAverage;
    from_wire(plan.dtype, work, out, count, options.postscale, average ? divisor : 1);
    return;
  }
  if (plan.scaled) finish_reduction(work, count, plan.wire, options, divisor);
  if (plan.staged) {
    from_wire(plan.dtype, work, out, count, 1.0, 1.0);
  } else if (out != work) {
    std::memcpy(out, work, count * dtype_size(plan.dtype));
  }
}

}  // namespace kolo::detail
