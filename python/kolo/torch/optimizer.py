"""Horovod's DistributedOptimizer (horovod/torch/optimizer.py) on kolo's gradient pipeline.

``hvd.DistributedOptimizer(optimizer, ...)`` returns an instance of a
subclass of the optimizer's own class, as Horovod's does, so that
``isinstance`` checks, LR schedulers and ``state_dict()`` keep working. What
moves the gradients is kolo's C++ DistributedOptimizer in its
synchronize-only form (``kolo._kolo.GradientExchange``): C++ hooks on the
parameters' gradient accumulators hand each gradient to the engine inside
``backward()`` the moment autograd has accumulated it, in the same buckets as
the C++ frontend, with no Python code per gradient. ``step()`` waits for the
exchange (GIL released) and then runs the wrapped optimizer's ``step()``.
"""
import contextlib
import warnings

import torch

from kolo import _kolo
from kolo._kolo import ContractError
from kolo.torch import _lifecycle
from kolo.torch.compression import Compression
from kolo.torch.mpi_ops import Average
from kolo.torch.process_sets import _set_id, global_process_set


class _DistributedOptimizer(torch.optim.Optimizer):
    # The methods below are copied into a subclass of the wrapped optimizer's
    # class (see DistributedOptimizer); super(self.__class__, self) is that class.

    def __init__(self, params, named_parameters, compression, backward_passes_per_step, op,
                 gradient_predivide_factor, process_set, bucket_bytes):
        super(self.__class__, self).__init__(params)
        if getattr(compression, "kolo_name", None) is None:
            raise ContractError(
                "kolo.torch.DistributedOptimizer: compression must be Compression.none, .fp16 or "
                f".bf16 (kolo's gradient pipeline casts in C++), got {compression!r}")
        self._kolo_options = dict(op=op, compression=compression.kolo_name,
                                  backward_passes_per_step=backward_passes_per_step,
                                  gradient_predivide_factor=gradient_predivide_factor,
                                  process_set=_set_id(process_set), bucket_bytes=bucket_bytes,
                                  name_prefix="grad/")
        self._kolo_named, self._kolo_naming_error = _optimizer_order(self.param_groups,
                                                                     named_parameters)
        self._should_synchronize = True
        self._synchronized = False
        # A rank outside the process set trains on its own, as Horovod's does:
        # no exchange, and step() is the wrapped optimizer's.
        self._kolo_local = process_set.included() is False
        self._kolo_exchange = None
        self._kolo_generation = None
        if not self._kolo_local and not _lifecycle.binding_deferred():
            self._kolo_rebind()
        # Registered once built (a construction that failed is not rebuilt later).
        _lifecycle.register(self)

    # --- binding to the runtime's engine (kolo.torch._lifecycle)

    def _kolo_rebind(self):
        # Collective over the process set: at construction, and at the first
        # use in a runtime newer than the exchange (_kolo_pipeline).
        self._kolo_exchange = None
        # A naming problem on one rank must not leave the others in the
        # collective construction below: every rank learns of it.
        _kolo.agree_on_outcome(self._kolo_naming_error, "kolo.torch.DistributedOptimizer",
                               "DistributedOptimizer.names", self._kolo_options["process_set"])
        self._kolo_exchange = _kolo.GradientExchange(self._kolo_named, **self._kolo_options)
        self._kolo_generation = _lifecycle.generation()
        self._synchronized = False

    def _kolo_unbind(self):
        # Removes the C++ hooks; requests still running keep their tensors.
        self._kolo_exchange = None

    def _kolo_pipeline(self):
        if self._kolo_local:
            raise ContractError(
                "kolo.torch.DistributedOptimizer: this rank is not in the optimizer's process "
                "set, so it trains locally and has no gradient exchange")
        if self._kolo_exchange is None or self._kolo_generation != _lifecycle.generation():
            if _lifecycle.binding_deferred():
                raise ContractError(
                    "kolo.torch.DistributedOptimizer: under kolorun's elastic mode its gradient "
                    "exchange is built inside hvd.elastic.run; train inside the function it runs")
            if not _kolo.is_initialized():
                raise ContractError(
                    "kolo.torch.DistributedOptimizer: kolo was shut down; its gradient exchange "
                    "comes back at its first use after the next init()")
            self._kolo_rebind()
        return self._kolo_exchange

    # --- Horovod's API

    def synchronize(self):
        """Waits for every gradient's exchange (starting those backward() did not);
        afterwards every parameter's .grad holds the reduced gradient (a rank
        outside the process set keeps its own)."""
        if not self._kolo_local:
            self._kolo_pipeline().synchronize()
        self._synchronized = True

    @contextlib.contextmanager
    def skip_synchronize(self):
        """Within it, step() does not synchronize (call synchronize() yourself first,
        e.g. to clip the reduced gradients)."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure=None):
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn(
                    "optimizer.step() called without optimizer.skip_synchronize() context after "
                    "optimizer.synchronize(). This can cause training slowdown. You may want to "
                    "consider using optimizer.skip_synchronize() context if you use "
                    "optimizer.synchronize() in your code.")
            self.synchronize()
        self._synchronized = False
        return super(self.__class__, self).step(closure)

    def zero_grad(self, set_to_none=False):
        """Zeroes the gradients and restarts local accumulation.

        ContractError between backward() and step() (the exchange still
        writes into the gradients), as Horovod refuses it.
        """
        # kolo's pipeline zeroes the gradients it exchanges as torch's
        # zero_grad(set_to_none=False) would, after checking no exchange runs.
        if self._kolo_local:
            return super(self.__class__, self).zero_grad(set_to_none=set_to_none)
        self._kolo_pipeline().zero_grad()
        if set_to_none:
            super(self.__class__, self).zero_grad(set_to_none=True)

    def kolo_stats(self):
        """kolo's addition: counters of the exchange (steps, gradients sent from a
        hook inside backward(), gradients sent by synchronize(), gradients zero-filled)."""
        return self._kolo_pipeline().stats()

    def kolo_buckets(self):
        """kolo's addition: the buckets, as request names, in the order they go."""
        return self._kolo_pipeline().buckets()


def _optimizer_order(param_groups, named_parameters):
    """The optimizer's parameters with their names, in the optimizer's order,
    and an error message ("" if none)."""
    if named_parameters is None:
        named = [(f"{g}.{j}", p) for g, group in enumerate(param_groups)
                 for j, p in enumerate(group["params"])]
        return named, ""
    named_parameters = list(named_parameters)
    if any(not isinstance(item, tuple) or len(item) != 2 for item in named_parameters):
        return [], ("named_parameters should be a sequence of (name, parameter) tuples, usually "
                    "produced by model.named_parameters()")
    names = {}
    for name, p in named_parameters:
        if id(p) in names:
            continue  # a parameter shared by two modules: its first name
        names[id(p)] = name
    seen_names = [name for name, _ in named_parameters]
    duplicates = sorted({n for n in seen_names if seen_names.count(n) > 1})
    if duplicates:
        return [], f"named_parameters contains duplicate names: {', '.join(duplicates)}"
    named = []
    for g, group in enumerate(param_groups):
        for j, p in enumerate(group["params"]):
            if id(p) not in names:
                return [], (f"parameter {j} of parameter group {g} ({tuple(p.shape)}) has no name "
                            "in named_parameters; pass model.named_parameters() of the model "
                            "whose parameters the optimizer holds")
            named.append((names[id(p)], p))
    return named, ""


def DistributedOptimizer(optimizer, named_parameters=None, compression=Compression.none,
                         backward_passes_per_step=1, op=Average, gradient_predivide_factor=1.0,
                         num_groups=0, groups=None, sparse_as_dense=False,
                         process_set=global_process_set, bucket_cap_mb=None):
    """Wraps a torch.optim optimizer for data-parallel training (Horovod's).

    ``backward()`` hands each gradient to kolo's engine the moment it is
    accumulated (C++ hooks, in buckets of ``bucket_cap_mb``, default 25 MiB as
    DDP); ``step()`` waits for the averaged gradients, then steps the
    optimizer. ``op`` is Average or Sum; ``compression`` Compression.none,
    .fp16 or .bf16; ``backward_passes_per_step`` k accumulates k passes
    locally and divides by k; ``gradient_predivide_factor`` f divides by f
    before the sum and by size/f after it. ``num_groups`` / ``groups`` are
    accepted for Horovod's signature; kolo's buckets group the gradients.
    Sparse gradients (``nn.Embedding(sparse=True)``) are averaged dense and
    handed back sparse whatever ``sparse_as_dense`` says. Collective: every
    rank of ``process_set`` builds it at the same point, with the same
    parameters (checked); a rank outside ``process_set`` gets an optimizer
    that trains on its own gradients.
    """
    if groups is not None or num_groups:
        warnings.warn("kolo.torch.DistributedOptimizer: num_groups/groups are ignored; kolo "
                      "fuses gradients in buckets (bucket_cap_mb)")
    return wrap_optimizer(optimizer, _DistributedOptimizer, named_parameters, compression,
                          backward_passes_per_step, op, gradient_predivide_factor, process_set,
                          bucket_bytes_of(bucket_cap_mb))


def bucket_bytes_of(bucket_cap_mb):
    """The C++ options' bucket_bytes for a size in MiB (-1: the C++ default)."""
    return -1 if bucket_cap_mb is None else int(bucket_cap_mb * 1024 * 1024)


def wrap_optimizer(optimizer, methods, *args):
    """Horovod's way of wrapping: an instance of a subclass of the optimizer's own
    class (so isinstance checks, LR schedulers and state_dict() keep working)
    with the methods of ``methods``, built on the optimizer's parameter groups;
    ``methods.__init__`` receives them and ``args``."""
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,), dict(methods.__dict__))
    return cls(optimizer.param_groups, *args)
