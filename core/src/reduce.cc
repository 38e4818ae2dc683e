// PLACEHOLDER: replaced by the real implementation.
#include "reduce.h"
#include "kolo/core/errors.h"
namespace kolo {
namespace detail {
void reduce_inputs(void*, const void* const*, int, size_t, DType, const AllreduceOptions&, int) { throw ContractError("not implemented yet"); }
void reduce_pair(void*, const void*, size_t, DType, ReduceOp) { throw ContractError("not implemented yet"); }
void apply_prescale(void*, size_t, DType, double) { throw ContractError("not implemented yet"); }
void finish_reduction(void*, size_t, DType, const AllreduceOptions&, int) { throw ContractError("not implemented yet"); }
bool is_unscaled(const AllreduceOptions&) { throw ContractError("not implemented yet"); }
}
}  // namespace kolo
