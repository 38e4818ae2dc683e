// Staging of reductions for pairwise wire algorithms (staged_reduction.h).
#include "comm/staged_reduction.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "half.h"
#include "reduce.h"
#include "rounding.h"

namespace kolo::detail {

namespace {

template <typename T>
void ints_to_double(const void* in, void* work, size_t count) {
  const T* src = static_cast<const T*>(in);
  double* dst = static_cast<double*>(work);
  for (size_t i = 0; i < count; ++i) dst[i] = static_cast<double>(src[i]);
}

template <typename T>
void double_to_ints(const void* work, void* out, size_t count) {
  const double* src = static_cast<const double*>(work);
  T* dst = static_cast<T*>(out);
  for (size_t i = 0; i < count; ++i) dst[i] = round_saturate<T>(src[i]);
}

void to_wire(DType dtype, const void* in, void* work, size_t count) {
  switch (dtype) {
    case DType::kU8:
      return ints_to_double<uint8_t>(in, work, count);
    case DType::kI8:
      return ints_to_double<int8_t>(in, work, count);
    case DType::kI32:
      return ints_to_double<int32_t>(in, work, count);
    case DType::kI64:
      return ints_to_double<int64_t>(in, work, count);
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

void from_wire(DType dtype, const void* work, void* out, size_t count) {
  switch (dtype) {
    case DType::kU8:
      return double_to_ints<uint8_t>(work, out, count);
    case DType::kI8:
      return double_to_ints<int8_t>(work, out, count);
    case DType::kI32:
      return double_to_ints<int32_t>(work, out, count);
    case DType::kI64:
      return double_to_ints<int64_t>(work, out, count);
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
    to_wire(plan.dtype, in, work, count);
  } else if (work != in) {
    std::memcpy(work, in, count * dtype_size(plan.dtype));
  }
  apply_prescale(work, count, plan.wire, options.prescale);
}

void stage_out(const ReductionPlan& plan, const AllreduceOptions& options, void* work, void* out,
               size_t count, int divisor) {
  if (count == 0) return;
  if (plan.scaled) finish_reduction(work, count, plan.wire, options, divisor);
  if (plan.staged) {
    from_wire(plan.dtype, work, out, count);
  } else if (out != work) {
    std::memcpy(out, work, count * dtype_size(plan.dtype));
  }
}

}  // namespace kolo::detail
