"""Horovod's basic API and collectives (horovod/torch/mpi_ops.py) on kolo's engine.

The module keeps Horovod's name so that ``from horovod.torch.mpi_ops import
...`` lines port by changing the package. Every collective here hands the
tensor to the C++ engine (kolo/torch/tensor.h) through ``kolo._kolo``; what is
Python is Horovod's argument handling, the autograd wrappers and the mapping
of global root ranks to ranks of a process set. Differences from Horovod are
listed in docs/python.md.
"""
import atexit
import numbers
import warnings

import torch

from kolo import _kolo
from kolo._kolo import ContractError, RuntimeFault
from kolo.torch import _lifecycle
from kolo.torch.compression import Compression
from kolo.torch.process_sets import (  # noqa: F401 (re-exported)
    ProcessSet,
    _set_id,
    _set_root,
    add_process_set,
    global_process_set,
    remove_process_set,
)

# Horovod's exception for a failed collective, recoverable under elastic
# training: kolo's RuntimeFault itself. Contract errors (mismatched shapes,
# dtypes, ops or roots across ranks; bad arguments) are kolo.ContractError.
HorovodInternalError = RuntimeFault

# Reduction ops, with Horovod's values.
Average = 0
Sum = 1
Adasum = 2
Min = 3
Max = 4
Product = 5

# --- Initialisation and placement -------------------------------------------


def init(comm=None, process_sets=None):
    """Initialises kolo: rank and size from kolorun, mpirun, srun or torchrun.

    Under kolorun's elastic mode it joins the first world (the script then
    trains inside ``kolo.torch.elastic.run``). Does nothing if kolo is
    already initialised (as Horovod), unless its engine stopped after a fault
    (a peer's shutdown, a stall shutdown): then it shuts down and starts a new
    runtime, as ``shutdown()`` + ``init()`` would; every rank calls it, as
    every rank calls init(). ``process_sets``: ProcessSet objects to
    create right away (every set can also be added later), or "dynamic".
    ``comm`` (a sub-communicator of the world) is not supported: pass None.
    """
    if comm is not None and comm != []:
        raise ContractError(
            "kolo.torch.init: comm is not supported (kolo's world is every rank the launcher "
            "started); pass comm=None and use process sets for subsets")
    if isinstance(process_sets, str):
        if process_sets.lower() != "dynamic":
            raise ContractError(
                f"kolo.torch.init: process_sets={process_sets!r}; pass a list of ProcessSet "
                "objects, None or \"dynamic\"")
        process_sets = None
    if _kolo.is_initialized():
        if not _kolo.engine_stopped():
            return
        shutdown()
    _kolo.init()
    _lifecycle.sync_with_runtime()
    for process_set in process_sets or []:
        add_process_set(process_set)


def shutdown():
    """Stops kolo: waits for nothing, closes the engine and the communicators.

    Asynchronous requests still running fail with RuntimeFault. Does nothing
    if kolo is not initialised.
    """
    if not _kolo.is_initialized():
        return
    _lifecycle.stopping()
    _kolo.shutdown()


atexit.register(shutdown)

is_initialized = _kolo.is_initialized
size = _kolo.size
local_size = _kolo.local_size
cross_size = _kolo.cross_size
rank = _kolo.rank
local_rank = _kolo.local_rank
cross_rank = _kolo.cross_rank
is_homogeneous = _kolo.is_homogeneous


def backend():
    """kolo's addition: the world's backend, "shm", "gloo" or "mpi"."""
    return _kolo.backend()


def mpi_built():
    """Whether kolo was built with its mpi backend."""
    return "mpi" in _kolo.compiled_backends()


def gloo_built():
    """Whether kolo was built with its gloo backend."""
    return "gloo" in _kolo.compiled_backends()


def mpi_enabled():
    """Whether the running world uses the mpi backend (False before init)."""
    return _kolo.is_initialized() and _kolo.backend() == "mpi"


def gloo_enabled():
    """Whether the running world uses the gloo backend (False before init; the
    shm backend, kolo's default on one host, is neither mpi nor gloo)."""
    return _kolo.is_initialized() and _kolo.backend() == "gloo"


def mpi_threads_supported():
    """Whether MPI may be called from several threads; kolo calls MPI from its
    engine thread only, so this is True exactly when the mpi backend runs."""
    if not mpi_enabled():
        raise ContractError(
            "kolo.torch.mpi_threads_supported: the mpi backend is not running (start the job "
            "with mpirun, or KOLO_BACKEND=mpi)")
    return True


def nccl_built():
    """The NCCL version code kolo runs CUDA tensors on (e.g. 22809), 0 without one."""
    return _kolo.nccl_version()


def ddl_built():
    return False


def ccl_built():
    return False


def cuda_built():
    """Whether kolo was built with its CUDA path (CUDA tensors: NCCL or host staging)."""
    return _kolo.cuda_compiled()


def rocm_built():
    return False


def start_timeline(file_path, mark_cycles=False):
    """Not supported: kolo's timeline is set before init with KOLO_TIMELINE=<path>."""
    raise ContractError(
        "kolo.torch.start_timeline: kolo records a timeline for the whole run when "
        "KOLO_TIMELINE=<path> is set before init() (docs/timeline.md); it cannot be started "
        "later")


def stop_timeline():
    """Not supported: see start_timeline."""
    raise ContractError(
        "kolo.torch.stop_timeline: kolo's timeline (KOLO_TIMELINE) covers the whole run")


# --- Arguments ----------------------------------------------------------------


def _op(op, average, default=Average):
    # Horovod's handle_average_backwards_compatibility.
    if op is not None and average is not None:
        raise ContractError("kolo.torch: the op parameter supersedes average; pass only op")
    if average is not None:
        warnings.warn("Parameter `average` has been replaced with `op` and will be removed",
                      DeprecationWarning)
        return Average if average else Sum
    return default if op is None else op


def _reduction(op, prescale_factor, postscale_factor, process_set):
    """(op, prescale, postscale) as the engine receives them.

    Horovod divides an Average by the size of the whole process set, ranks
    that joined included (kolo's engine divides by the ranks that
    contributed), so an Average goes to the engine as a Sum with the
    postscale divided by the set's size: the same values without join, and
    Horovod's with it (integers: the postscale truncates, as Horovod's does).
    """
    size = process_set.size() if isinstance(process_set, ProcessSet) else None
    if op == Average and size:
        return Sum, prescale_factor, postscale_factor / size
    return op, prescale_factor, postscale_factor


def _check_tensor(tensor, op):
    if not isinstance(tensor, torch.Tensor):
        raise ContractError(f"kolo.torch.{op}: expected a torch.Tensor, got {type(tensor).__name__}")


# --- Handles --------------------------------------------------------------------


def poll(handle):
    """True once the asynchronous operation behind `handle` finished (never blocks)."""
    _check_handle(handle, "poll")
    return handle.poll()


def _check_handle(handle, call):
    if not isinstance(handle, (_kolo.Handle, _SparseHandle)):
        raise ContractError(f"kolo.torch.{call}: expected the handle an *_async call returned, "
                            f"got {type(handle).__name__} {handle!r}")


def synchronize(handle):
    """Waits for an asynchronous operation and returns its result.

    A tensor (allreduce, allgather, broadcast, reducescatter), a list of
    tensors (grouped_*), alltoall's output or (output, received_splits). A
    failed operation raises kolo.ContractError (mismatch across ranks) or
    kolo.RuntimeFault (= HorovodInternalError: a peer died, a timeout). A
    handle already synchronized returns None, as in Horovod.
    """
    _check_handle(handle, "synchronize")
    return handle.wait()


# --- Allreduce --------------------------------------------------------------------


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                    postscale_factor=1.0, process_set=global_process_set):
    """Starts reducing `tensor` over the ranks into a new tensor; returns a handle."""
    _check_tensor(tensor, "allreduce_async")
    return _kolo.allreduce_async(tensor, name,
                                 *_reduction(_op(op, average), prescale_factor, postscale_factor,
                                             process_set), _set_id(process_set), False)


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                     postscale_factor=1.0, process_set=global_process_set):
    """Starts reducing `tensor` in place; returns a handle."""
    _check_tensor(tensor, "allreduce_async_")
    return _kolo.allreduce_async(tensor, name,
                                 *_reduction(_op(op, average), prescale_factor, postscale_factor,
                                             process_set), _set_id(process_set), True)


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
               postscale_factor=1.0, process_set=global_process_set):
    """Reduces `tensor` in place over the ranks and returns it."""
    return synchronize(allreduce_async_(tensor, average, name, op, prescale_factor,
                                        postscale_factor, process_set))


class _Allreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, average, name, op, prescale_factor, postscale_factor, process_set):
        ctx.op = _op(op, average)
        ctx.scales = (prescale_factor, postscale_factor)
        ctx.process_set = process_set
        return synchronize(allreduce_async(tensor.contiguous(), None, name, ctx.op,
                                           prescale_factor, postscale_factor, process_set))

    @staticmethod
    def backward(ctx, grad_output):
        grad = allreduce(grad_output, op=ctx.op, prescale_factor=ctx.scales[0],
                         postscale_factor=ctx.scales[1], process_set=ctx.process_set)
        return grad, None, None, None, None, None, None


def allreduce(tensor, average=None, name=None, compression=Compression.none, op=None,
              prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set):
    """Returns `tensor` reduced over the ranks (Average by default); the input is unchanged.

    Differentiable: the gradient is reduced the same way. `compression`
    casts floating-point tensors (Compression.fp16 / bf16) for the exchange.
    """
    _check_tensor(tensor, "allreduce")
    compressed, ctx = compression.compress(tensor)
    reduced = _Allreduce.apply(compressed, average, name, op, prescale_factor, postscale_factor,
                               process_set)
    return compression.decompress(reduced, ctx)


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                            postscale_factor=1.0, process_set=global_process_set):
    """Starts reducing every tensor of the list into new tensors; returns one handle.

    The tensors are requests "<name>.<i>", submitted together; the engine
    fuses them when they are ready together on every rank.
    """
    return _kolo.grouped_allreduce_async(list(tensors), name,
                                         *_reduction(_op(op, average), prescale_factor,
                                                     postscale_factor, process_set),
                                         _set_id(process_set), False)


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                             postscale_factor=1.0, process_set=global_process_set):
    """In-place form of grouped_allreduce_async."""
    return _kolo.grouped_allreduce_async(list(tensors), name,
                                         *_reduction(_op(op, average), prescale_factor,
                                                     postscale_factor, process_set),
                                         _set_id(process_set), True)


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                       postscale_factor=1.0, process_set=global_process_set):
    """Reduces every tensor of the list in place; returns the list."""
    return synchronize(grouped_allreduce_async_(tensors, average, name, op, prescale_factor,
                                                postscale_factor, process_set))


class _GroupedAllreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, average, name, op, prescale_factor, postscale_factor, process_set, *tensors):
        ctx.op = _op(op, average)
        ctx.scales = (prescale_factor, postscale_factor)
        ctx.process_set = process_set
        return tuple(synchronize(grouped_allreduce_async(
            [t.contiguous() for t in tensors], None, name, ctx.op, prescale_factor,
            postscale_factor, process_set)))

    @staticmethod
    def backward(ctx, *grad_outputs):
        grads = grouped_allreduce(list(grad_outputs), op=ctx.op, prescale_factor=ctx.scales[0],
                                  postscale_factor=ctx.scales[1], process_set=ctx.process_set)
        return (None, None, None, None, None, None, *grads)


def grouped_allreduce(tensors, average=None, name=None, compression=Compression.none, op=None,
                      prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set):
    """Returns every tensor of the list reduced over the ranks (differentiable)."""
    compressed, ctxs = zip(*[compression.compress(t) for t in tensors]) if tensors else ((), ())
    reduced = _GroupedAllreduce.apply(average, name, op, prescale_factor, postscale_factor,
                                      process_set, *compressed)
    return [compression.decompress(t, c) for t, c in zip(reduced, ctxs)]


class _SparseHandle:
    """The handle of sparse_allreduce_async: call it (as Horovod's) or pass it
    to synchronize() / poll() for the reduced sparse tensor."""

    def __init__(self, tensor, gather, op, process_set):
        self._tensor = tensor
        self._gather = gather  # one handle: the allgathers of (indices, values)
        self._op = op
        self._process_set = process_set
        self._result = None

    def poll(self):
        return self._gather.poll()

    def wait(self):
        if self._result is None:
            indices, values = self._gather.wait()
            if self._op == Average:
                values = values / self._process_set.size()
            self._result = torch.sparse_coo_tensor(indices.transpose(0, 1), values,
                                                   self._tensor.size()).coalesce()
        return self._result

    def __call__(self):
        return self.wait()


def sparse_allreduce_async(tensor, name=None, op=Average, process_set=global_process_set):
    """Starts reducing a sparse COO tensor over the ranks, as Horovod does: an
    allgather of every rank's indices and values (the sum of sparse tensors is
    their concatenation). Returns a handle; calling it (or synchronize) gives
    the reduced sparse tensor, coalesced. `op` is Average or Sum."""
    _check_tensor(tensor, "sparse_allreduce_async")
    if not tensor.is_sparse:
        raise ContractError("kolo.torch.sparse_allreduce_async: expected a sparse COO tensor "
                            f"(tensor.to_sparse()), got layout {tensor.layout}; use allreduce_async "
                            "for dense tensors")
    op = _op(op, None)
    if op not in (Average, Sum):
        raise ContractError("kolo.torch.sparse_allreduce_async: op must be Average or Sum, "
                            f"got {op}")
    tensor = tensor.coalesce()
    # Dim 0 of the allgather is the entry: indices go as (nnz, sparse_dim).
    gather = _kolo.grouped_allgather_async(
        [tensor.indices().transpose(0, 1).contiguous(), tensor.values().contiguous()], name,
        _set_id(process_set))
    return _SparseHandle(tensor, gather, op, process_set)


# --- Allgather --------------------------------------------------------------------


def allgather_async(tensor, name=None, process_set=global_process_set):
    """Starts concatenating every rank's `tensor` along dim 0; returns a handle."""
    _check_tensor(tensor, "allgather_async")
    return _kolo.allgather_async(tensor, name, _set_id(process_set))


def _allgather_grads(grad_outputs, shapes, process_set):
    """Backward of an allgather of tensors of `shapes` (Horovod's): every
    rank's gradient of the gathered tensors is averaged, and this rank keeps
    the rows it contributed."""
    grads = synchronize(grouped_allreduce_async([g.contiguous() for g in grad_outputs],
                                                op=Average, process_set=process_set))
    rows = [shape[0] if len(shape) > 0 else 1 for shape in shapes]
    every_rank = synchronize(allgather_async(torch.tensor([rows], dtype=torch.int64),
                                             process_set=process_set))
    offsets = every_rank[:process_set.rank()].sum(0).tolist()
    return [grad.narrow(0, int(offset), count).reshape(shape)
            for grad, offset, count, shape in zip(grads, offsets, rows, shapes)]


class _Allgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, process_set):
        ctx.shape = tensor.shape
        ctx.process_set = process_set
        return synchronize(allgather_async(tensor.contiguous(), name, process_set))

    @staticmethod
    def backward(ctx, grad_output):
        grad, = _allgather_grads([grad_output], [ctx.shape], ctx.process_set)
        return grad, None, None


def allgather(tensor, name=None, process_set=global_process_set):
    """Returns every rank's `tensor` concatenated along dim 0, in rank order.

    The first dimension may differ per rank; the others and the dtype must
    agree. A 0-d tensor counts as one row. Differentiable.
    """
    _check_tensor(tensor, "allgather")
    return _Allgather.apply(tensor, name, process_set)


def grouped_allgather_async(tensors, name=None, process_set=global_process_set):
    """Starts an allgather of every tensor of the list; returns one handle."""
    return _kolo.grouped_allgather_async(list(tensors), name, _set_id(process_set))


class _GroupedAllgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, process_set, *tensors):
        ctx.shapes = [t.shape for t in tensors]
        ctx.process_set = process_set
        return tuple(synchronize(grouped_allgather_async([t.contiguous() for t in tensors], name,
                                                         process_set)))

    @staticmethod
    def backward(ctx, *grad_outputs):
        return (None, None, *_allgather_grads(grad_outputs, ctx.shapes, ctx.process_set))


def grouped_allgather(tensors, name=None, process_set=global_process_set):
    """Returns the allgather of every tensor of the list (differentiable)."""
    return list(_GroupedAllgather.apply(name, process_set, *tensors))


# --- Broadcast --------------------------------------------------------------------


def broadcast_async(tensor, root_rank, name=None, process_set=global_process_set):
    """Starts copying root's `tensor` into a new tensor on every rank; returns a handle.

    `root_rank` is a global rank (a member of `process_set`), as in Horovod.
    """
    _check_tensor(tensor, "broadcast_async")
    return _kolo.broadcast_async(tensor, _set_root(root_rank, process_set), name,
                                 _set_id(process_set), False)


def broadcast_async_(tensor, root_rank, name=None, process_set=global_process_set):
    """Starts overwriting `tensor` with root's on every rank; returns a handle."""
    _check_tensor(tensor, "broadcast_async_")
    return _kolo.broadcast_async(tensor, _set_root(root_rank, process_set), name,
                                 _set_id(process_set), True)


def broadcast_(tensor, root_rank, name=None, process_set=global_process_set):
    """Overwrites `tensor` with root's on every rank and returns it."""
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))


class _Broadcast(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, root_rank, name, process_set):
        ctx.root_rank = root_rank
        ctx.process_set = process_set
        return synchronize(broadcast_async(tensor.contiguous(), root_rank, name, process_set))

    @staticmethod
    def backward(ctx, grad_output):
        grad = allreduce(grad_output, op=Average, process_set=ctx.process_set)
        if _kolo.rank() != ctx.root_rank:
            grad = grad * 0
        return grad, None, None, None


def broadcast(tensor, root_rank, name=None, process_set=global_process_set):
    """Returns a copy of root's `tensor` on every rank (differentiable)."""
    _check_tensor(tensor, "broadcast")
    return _Broadcast.apply(tensor, root_rank, name, process_set)


# --- Alltoall -----------------------------------------------------------------------


def _splits(splits, call):
    """`splits` as a list of ints; anything but integers is refused here, on the
    rank that passed it, before anything reaches the engine."""
    if splits is None:
        return None
    if isinstance(splits, torch.Tensor):
        if splits.is_floating_point() or splits.is_complex() or splits.dtype == torch.bool:
            raise ContractError(f"kolo.torch.{call}: splits must be a tensor of integers, got "
                                f"{splits.dtype}; pass e.g. torch.tensor(splits, dtype=torch.int32)")
        return [int(s) for s in splits.reshape(-1).tolist()]
    values = list(splits)
    for value in values:
        if not isinstance(value, numbers.Integral) or isinstance(value, bool):
            raise ContractError(f"kolo.torch.{call}: splits must be integers, got "
                                f"{type(value).__name__} {value!r}")
    return [int(s) for s in values]


def alltoall_async(tensor, splits=None, name=None, process_set=global_process_set):
    """Starts an alltoall: splits[k] rows of `tensor` go to rank k of the set.

    Without `splits` dim 0 is split equally. The handle's result is
    (received rows, received splits), as Horovod's, with or without `splits`.
    """
    _check_tensor(tensor, "alltoall_async")
    return _kolo.alltoall_async(tensor, _splits(splits, "alltoall_async"), name,
                                _set_id(process_set))


class _Alltoall(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, splits, name, process_set):
        ctx.process_set = process_set
        output, received = synchronize(alltoall_async(tensor.contiguous(), splits, name,
                                                      process_set))
        # The rows received from each rank: what the backward pass sends back.
        ctx.received = received
        if splits is None:
            return output
        ctx.mark_non_differentiable(received)
        return output, received

    @staticmethod
    def backward(ctx, grad_output, *unused):
        grad, _ = synchronize(alltoall_async(grad_output.contiguous(), ctx.received,
                                             process_set=ctx.process_set))
        return grad, None, None, None


def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    """Scatters rows of `tensor` to every rank and gathers theirs (differentiable).

    Returns the received rows, or (rows, received_splits) when `splits` is
    given (a list or an int tensor of one count per rank of the set).
    """
    _check_tensor(tensor, "alltoall")
    return _Alltoall.apply(tensor, splits, name, process_set)


# --- Reducescatter --------------------------------------------------------------


def reducescatter_async(tensor, name=None, op=Average, process_set=global_process_set,
                        prescale_factor=1.0, postscale_factor=1.0):
    """Starts a reducescatter; returns a handle whose result is this rank's rows."""
    _check_tensor(tensor, "reducescatter_async")
    return _kolo.reducescatter_async(tensor, name,
                                     *_reduction(_op(op, None), prescale_factor, postscale_factor,
                                                 process_set), _set_id(process_set))


def _reducescatter_grads(grad_outputs, op, scale, process_set):
    """Backward of a reducescatter (Horovod's): every rank's gradient rows,
    gathered, times the set's size for a Sum and times the scale factors."""
    factor = scale * (process_set.size() if op == Sum else 1)
    grads = [g * factor if factor != 1.0 else g for g in grad_outputs]
    return synchronize(grouped_allgather_async([g.contiguous() for g in grads],
                                               process_set=process_set))


class _Reducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, process_set, prescale_factor, postscale_factor):
        ctx.op = op
        ctx.scale = prescale_factor * postscale_factor
        ctx.process_set = process_set
        return synchronize(reducescatter_async(tensor.contiguous(), name, op, process_set,
                                               prescale_factor, postscale_factor))

    @staticmethod
    def backward(ctx, grad_output):
        grad, = _reducescatter_grads([grad_output], ctx.op, ctx.scale, ctx.process_set)
        return grad, None, None, None, None, None


def reducescatter(tensor, name=None, compression=Compression.none, op=Average,
                  process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0):
    """Reduces `tensor` over the ranks and returns this rank's rows (differentiable).

    Dim 0 is split as evenly as possible; the first `rows % n` ranks get one
    more row.
    """
    _check_tensor(tensor, "reducescatter")
    compressed, ctx = compression.compress(tensor)
    reduced = _Reducescatter.apply(compressed, name, op, process_set, prescale_factor,
                                   postscale_factor)
    return compression.decompress(reduced, ctx)


def grouped_reducescatter_async(tensors, name=None, op=Average, process_set=global_process_set,
                                prescale_factor=1.0, postscale_factor=1.0):
    """Starts a reducescatter of every tensor of the list; returns one handle."""
    return _kolo.grouped_reducescatter_async(list(tensors), name,
                                             *_reduction(_op(op, None), prescale_factor,
                                                         postscale_factor, process_set),
                                             _set_id(process_set))


class _GroupedReducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, op, process_set, prescale_factor, postscale_factor, *tensors):
        ctx.op = op
        ctx.scale = prescale_factor * postscale_factor
        ctx.process_set = process_set
        return tuple(synchronize(grouped_reducescatter_async(
            [t.contiguous() for t in tensors], name, op, process_set, prescale_factor,
            postscale_factor)))

    @staticmethod
    def backward(ctx, *grad_outputs):
        grads = _reducescatter_grads(grad_outputs, ctx.op, ctx.scale, ctx.process_set)
        return (None, None, None, None, None, *grads)


def grouped_reducescatter(tensors, name=None, compression=Compression.none, op=Average,
                          process_set=global_process_set, prescale_factor=1.0,
                          postscale_factor=1.0):
    """Returns the reducescatter of every tensor of the list (differentiable)."""
    compressed, ctxs = zip(*[compression.compress(t) for t in tensors]) if tensors else ((), ())
    reduced = _GroupedReducescatter.apply(name, op, process_set, prescale_factor,
                                          postscale_factor, *compressed)
    return [compression.decompress(t, c) for t, c in zip(reduced, ctxs)]


# --- Synchronisation ----------------------------------------------------------


def join(device=-1):
    """This rank has no more data: until every rank joined, it takes part in the
    others' collectives with neutral contributions. Returns the last rank to join."""
    return _kolo.join(0)


def barrier(process_set=global_process_set):
    """Returns once every rank of the process set called barrier()."""
    _kolo.barrier(_set_id(process_set))
