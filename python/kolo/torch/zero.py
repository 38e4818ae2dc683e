"""kolo.torch.ZeroOptimizer: ZeRO stages 1 and 2 (docs/zero.md) for a torch.optim optimizer.

``hvd.ZeroOptimizer(optimizer, model, stage=1|2)`` shards the optimizer's
state (stage 1) and the gradients (stage 2) across the ranks with kolo's C++
ZeroOptimizer (``kolo._kolo.ZeroSharding``): the model's parameters become
views of flat buffers (they stay the tensors the model holds), C++ hooks
hand each bucket of gradients to a reduce-scatter inside ``backward()``, and
the optimizer's parameter groups are replaced by this rank's pieces, 1-D
views of its slices of those buffers. ``step()`` finishes the
reduce-scatters, runs the optimizer's own ``step()`` on the pieces, and
allgathers the updated slices into the parameters. As DistributedOptimizer,
the result is an instance of a subclass of the optimizer's class.

Stage 3 (parameters sharded too) needs hooks around each submodule's forward
and backward that kolo's C++ ShardedUnit provides for C++ modules only:
docs/python.md says what is missing.
"""
import weakref

import torch

from kolo import _kolo
from kolo._kolo import ContractError
from kolo.torch import _lifecycle
from kolo.torch.optimizer import bucket_bytes_of, wrap_optimizer
from kolo.torch.process_sets import _set_id, global_process_set

_NAME = "kolo.torch.ZeroOptimizer"


class _ZeroOptimizer(torch.optim.Optimizer):
    # Copied into a subclass of the wrapped optimizer's class (wrap_optimizer);
    # super(self.__class__, self) is that class.

    def __init__(self, params, model, stage, backward_passes_per_step, process_set, bucket_bytes,
                 had_state):
        super(self.__class__, self).__init__(params)
        self._kolo_sharding = None
        set_id = _set_id(process_set)
        # Local problems are agreed on first, so that no rank is left alone in
        # the collective construction below (which checks the rest: the same
        # model, stage and options as rank 0, the optimizer's parameters in
        # the model, their dtypes).
        error = ""
        if _lifecycle.binding_deferred():
            error = ("under kolorun's elastic mode a ZeroOptimizer is not supported (its shards "
                     "belong to one world); use DistributedOptimizer")
        elif stage == 3:
            error = ("stage 3 is not available from Python: its parameter gathering hooks into "
                     "C++ modules (kolo::ShardedUnit) only; use stage 1 or 2 (docs/python.md)")
        elif had_state:
            error = ("the optimizer has state already (it has stepped); build the "
                     "ZeroOptimizer before the first step")
        elif not isinstance(model, torch.nn.Module):
            error = f"model must be a torch.nn.Module, got {type(model).__name__}"
        _kolo.agree_on_outcome(error, _NAME, "ZeroOptimizer.check", set_id)

        # The pieces' update calls back into this object: a weak reference,
        # since the C++ object that calls it is held by this one.
        me = weakref.ref(self)

        def python_step():
            this = me()
            if this is not None:
                super(this.__class__, this).step()

        self._kolo_sharding = _kolo.ZeroSharding(
            list(model.named_parameters()), [list(g["params"]) for g in self.param_groups],
            python_step, stage=stage, backward_passes_per_step=backward_passes_per_step,
            process_set=set_id, bucket_bytes=bucket_bytes)
        for group, pieces in zip(self.param_groups, self._kolo_sharding.pieces()):
            group["params"] = pieces
        _lifecycle.register(self)

    # --- bound to the runtime it was built in (kolo.torch._lifecycle)

    def _kolo_unbind(self):
        # Removes the C++ hooks before the engine goes; the shards belong to
        # that runtime, so _kolo_zero() refuses afterwards.
        self._kolo_sharding = None

    def _kolo_zero(self):
        if self._kolo_sharding is None:
            raise ContractError(
                f"{_NAME}: kolo was shut down since it was built; its shards belonged to that "
                "runtime: build a new one (from a new optimizer) after init()")
        return self._kolo_sharding

    # --- the optimizer's API

    def step(self, closure=None):
        """Reduce-scatters the gradients (what backward() did not start), steps the
        optimizer on this rank's pieces, allgathers the parameters."""
        if closure is not None:
            raise ContractError(f"{_NAME}.step(closure): a closure is not supported (it would "
                                "run backward() again inside the step)")
        self._kolo_zero().step()

    def synchronize(self):
        """Finishes the reduce-scatters: afterwards the pieces' .grad (this rank's
        slices, in the optimizer's param_groups) hold the averaged gradients,
        e.g. to clip them before step()."""
        self._kolo_zero().synchronize()

    def zero_grad(self, set_to_none=False):
        """Stage 1 zeroes the model's gradients (views of a flat buffer, whatever
        set_to_none says), stage 2 releases them; local accumulation restarts."""
        self._kolo_zero().zero_grad()

    def kolo_buckets(self):
        """kolo's addition: per bucket its request name, elements, and this
        rank's first element and element count."""
        return self._kolo_zero().buckets()

    def kolo_memory(self):
        """kolo's addition: bytes of parameters and gradients this rank holds (now
        and at the peak), counted by the C++ ZeroOptimizer."""
        return self._kolo_zero().memory()


def ZeroOptimizer(optimizer, model, stage=1, backward_passes_per_step=1,
                  process_set=global_process_set, bucket_cap_mb=None):
    """Wraps a torch.optim optimizer whose update is element-wise (SGD, Adam,
    AdamW, RMSprop, Adagrad...; not LBFGS) for ZeRO-sharded data-parallel
    training of ``model`` (whose named_parameters() name the optimizer's).

    stage 1 shards the optimizer state, 2 also the gradients; the averaged
    gradient is the one DistributedOptimizer computes, so the model follows
    the same trajectory. Buckets of ``bucket_cap_mb`` (default 32 MiB) are
    one reduce-scatter and one allgather per step. Collective: every rank of
    ``process_set`` builds it at the same point with the same model and
    options, after the parameters were broadcast, before the first step.
    """
    return wrap_optimizer(optimizer, _ZeroOptimizer, model, stage, backward_passes_per_step,
                          process_set, bucket_bytes_of(bucket_cap_mb), len(optimizer.state) > 0)
