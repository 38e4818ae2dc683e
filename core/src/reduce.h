// Reduction kernels shared by every backend (internal).
//
// Semantics, identical on every backend so results agree across them:
//   result[i] = postscale * R_k(prescale * in_k[i]),  k = 0..n-1 in rank order
// where R is sum, min, max or product, and average is sum / n.
// f16/bf16 accumulate in f32, f32 in f32, f64 in f64; integers accumulate in
// their own type (wrapping) unless a scale or average applies, in which case
// each prescaled input and the final value are truncated toward zero and
// saturated to the type's range, the reduction running in double (Horovod's
// integer semantics; dtype.h).
#pragma once

#include <cstddef>

#include "kolo/core/communicator.h"
#include "kolo/core/dtype.h"

namespace kolo::detail {

// out[i] = full reduction of n inputs (in rank order). `out` may alias any input.
// `divisor` is what kAverage divides by (normally n).
void reduce_inputs(void* out, const void* const* inputs, int n, size_t count, DType dtype,
                   const AllreduceOptions& options, int divisor);

// Pairwise step for ring/tree algorithms: acc[i] = acc[i] (op) in[i], no scaling.
// kAverage accumulates as kSum; call finish_reduction at the end.
void reduce_pair(void* acc, const void* in, size_t count, DType dtype, ReduceOp op);

// Applies prescale to a rank's own input in place (copying first is the caller's job).
void apply_prescale(void* buffer, size_t count, DType dtype, double prescale);

// After pairwise accumulation: applies the average divisor and postscale in place.
void finish_reduction(void* buffer, size_t count, DType dtype, const AllreduceOptions& options,
                      int divisor);

// True when options require no scaling at all (prescale == postscale == 1, op != average).
bool is_unscaled(const AllreduceOptions& options);

}  // namespace kolo::detail
