// Staging of reductions for backends whose wire algorithm only reduces
// pairwise (gloo's ring, MPI's built-in ops) (internal).
//
// reduce.h fixes the semantics: f16/bf16 accumulate in f32, integers with a
// scale or average are reduced in double and truncated once at the end. A
// pairwise algorithm reducing in the storage type would round at every hop, so such
// calls are staged: the input is converted into a "wire" buffer of the
// accumulation type (prescale applied there), the wire buffer is reduced with
// a plain op, and the result is finished (average divisor, postscale) and
// converted back once. Calls that need none of this (f32/f64, unscaled
// integers, f16/bf16 min/max, which are exact) reduce in their own dtype.
#pragma once

#include <cstddef>

#include "kolo/core/communicator.h"
#include "kolo/core/dtype.h"

namespace kolo::detail {

struct ReductionPlan {
  DType dtype;       // caller's element type
  DType wire;        // type reduced between ranks (== dtype when not staged)
  ReduceOp wire_op;  // op applied pairwise on the wire (average runs as sum)
  bool staged;       // wire != dtype: input converted into a wire-typed buffer
  bool scaled;       // prescale, postscale or average apply
};

ReductionPlan plan_reduction(DType dtype, const AllreduceOptions& options);

// work[i] = prescale * wire(in[i]). `work` holds `count` elements of plan.wire;
// when not staged it may equal `in` (then only the prescale runs).
void stage_in(const ReductionPlan& plan, const AllreduceOptions& options, const void* in,
              void* work, size_t count);

// out[i] = dtype(finish(work[i])): applies average divisor and postscale to the
// reduced wire values, then converts back. `work` is modified; when not staged
// `out` may equal `work`.
void stage_out(const ReductionPlan& plan, const AllreduceOptions& options, void* work, void* out,
               size_t count, int divisor);

}  // namespace kolo::detail
