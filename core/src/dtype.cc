// Element types and reduction operations: names, sizes, half conversions.
#include "kolo/core/dtype.h"

#include "half.h"
#include "kolo/core/errors.h"

namespace kolo {

namespace {

constexpr DType kAllDTypes[kNumDTypes] = {DType::kU8,   DType::kI8,  DType::kI16,
                                          DType::kI32,  DType::kI64, DType::kF16,
                                          DType::kBF16, DType::kF32, DType::kF64};
constexpr ReduceOp kAllOps[kNumReduceOps] = {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMin,
                                             ReduceOp::kMax, ReduceOp::kProduct};

std::string bad_enum_value(const char* what, int value) {
  return std::string("kolo: invalid ") + what + " value " + std::to_string(value) +
         " (memory corruption or a cast from an unchecked integer)";
}

}  // namespace

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kU8:
    case DType::kI8:
      return 1;
    case DType::kI16:
    case DType::kF16:
    case DType::kBF16:
      return 2;
    case DType::kI32:
    case DType::kF32:
      return 4;
    case DType::kI64:
    case DType::kF64:
      return 8;
  }
  throw ContractError(bad_enum_value("DType", static_cast<int>(dtype)));
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kU8:
      return "u8";
    case DType::kI8:
      return "i8";
    case DType::kI16:
      return "i16";
    case DType::kI32:
      return "i32";
    case DType::kI64:
      return "i64";
    case DType::kF16:
      return "f16";
    case DType::kBF16:
      return "bf16";
    case DType::kF32:
      return "f32";
    case DType::kF64:
      return "f64";
  }
  throw ContractError(bad_enum_value("DType", static_cast<int>(dtype)));
}

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kAverage:
      return "average";
    case ReduceOp::kMin:
      return "min";
    case ReduceOp::kMax:
      return "max";
    case ReduceOp::kProduct:
      return "product";
  }
  throw ContractError(bad_enum_value("ReduceOp", static_cast<int>(op)));
}

bool is_floating(DType dtype) {
  switch (dtype) {
    case DType::kF16:
    case DType::kBF16:
    case DType::kF32:
    case DType::kF64:
      return true;
    case DType::kU8:
    case DType::kI8:
    case DType::kI16:
    case DType::kI32:
    case DType::kI64:
      return false;
  }
  throw ContractError(bad_enum_value("DType", static_cast<int>(dtype)));
}

DType parse_dtype(const std::string& name) {
  std::string accepted;
  for (DType dtype : kAllDTypes) {
    if (name == dtype_name(dtype)) return dtype;
    accepted += accepted.empty() ? "" : ", ";
    accepted += dtype_name(dtype);
  }
  throw ContractError("kolo parse_dtype: unknown dtype '" + name + "'; accepted: " + accepted);
}

ReduceOp parse_reduce_op(const std::string& name) {
  std::string accepted;
  for (ReduceOp op : kAllOps) {
    if (name == reduce_op_name(op)) return op;
    accepted += accepted.empty() ? "" : ", ";
    accepted += reduce_op_name(op);
  }
  throw ContractError("kolo parse_reduce_op: unknown reduce op '" + name +
                      "'; accepted: " + accepted);
}

uint16_t float_to_f16(float value) { return detail::float_to_half_inline(value); }
float f16_to_float(uint16_t bits) { return detail::half_to_float_inline(bits); }
uint16_t float_to_bf16(float value) { return detail::float_to_bf16_inline(value); }
float bf16_to_float(uint16_t bits) { return detail::bf16_to_float_inline(bits); }

void float_to_f16_array(const float* in, uint16_t* out, size_t count) {
  detail::float_to_f16_array(in, out, count);
}
void f16_to_float_array(const uint16_t* in, float* out, size_t count) {
  detail::f16_to_float_array(in, out, count);
}
// bf16 has no baseline x86 instruction (half.h); these loops vectorize.
void float_to_bf16_array(const float* in, uint16_t* out, size_t count) {
  for (size_t i = 0; i < count; ++i) out[i] = detail::float_to_bf16_inline(in[i]);
}
void bf16_to_float_array(const uint16_t* in, float* out, size_t count) {
  for (size_t i = 0; i < count; ++i) out[i] = detail::bf16_to_float_inline(in[i]);
}

}  // namespace kolo
