// PLACEHOLDER: replaced by the real implementation.
#include "kolo/core/dtype.h"
#include "kolo/core/errors.h"
namespace kolo {
size_t dtype_size(DType) { throw ContractError("not implemented yet"); }
const char* dtype_name(DType) { throw ContractError("not implemented yet"); }
const char* reduce_op_name(ReduceOp) { throw ContractError("not implemented yet"); }
bool is_floating(DType) { throw ContractError("not implemented yet"); }
DType parse_dtype(const std::string&) { throw ContractError("not implemented yet"); }
ReduceOp parse_reduce_op(const std::string&) { throw ContractError("not implemented yet"); }
uint16_t float_to_f16(float) { throw ContractError("not implemented yet"); }
float f16_to_float(uint16_t) { throw ContractError("not implemented yet"); }
uint16_t float_to_bf16(float) { throw ContractError("not implemented yet"); }
float bf16_to_float(uint16_t) { throw ContractError("not implemented yet"); }
}  // namespace kolo
