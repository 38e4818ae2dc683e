"""Horovod's basic API and collectives (horovod/torch/mpi_ops.py) on kolo's engine.

The module keeps Horovod's name so that ``from horovod.torch.mpi_ops import
...`` lines port by changing the package. Every collective here hands the
tensor to the C++ engine (kolo/torch/tensor.h) through ``kolo._kolo``; what is
Python is Horovod's argument handling, the autograd wrappers and the mapping
of global root ranks to ranks of a process set. Differences from Horovod are
listed in docs/python.md.
"""
import atexit
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
    already initialised (as Horovod). ``process_sets``: ProcessSet objects to
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
        return
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
    """0: kolo has no NCCL (CPU only)."""
    return 0


def ddl_built():
    return False


def ccl_built():
    return False


def cuda_built():
    return False


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


def _check_tensor(tensor, op):
    if not isinstance(tensor, torch.Tensor):
        raise ContractError(f"kolo.torch.{op}: expected a torch.Tensor, got {type(tensor).__name__}")


# --- Handles --------------------------------------------------------------------


def poll(handle):
    """True once the asynchronous operation behind `handle` finished (never blocks)."""
    _check_handle(handle, "poll")
    return handle.poll()


def _check_handle(handle, call):
    if not isinstance(handle, _kolo.Handle):
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
    return _kolo.allreduce_async(tensor, name, _op(op, average), prescale_factor,
                                 postscale_factor, _set_id(process_set), False)


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                     postscale_factor=1.0, process_set=global_process_set):
    """Starts reducing `tensor` in place; returns a handle."""
    _check_tensor(tensor, "allreduce_async_")
    return _kolo.allreduce_async(tensor, name, _op(op, average), prescale_factor,
                                 postscale_factor, _set_id(process_set), True)


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
    return _kolo.grouped_allreduce_async(list(tensors), name, _op(op, average), prescale_factor,
                                         postscale_factor, _set_id(process_set), False)


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                             postscale_factor=1.0, process_set=global_process_set):
    """In-place form of grouped_allreduce_async."""
    return _kolo.grouped_allreduce_async(list(tensors), name, _op(op, average), prescale_factor,
                                         postscale_factor, _set_id(process_set), True)


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


# --- Allgather --------------------------------------------------------------------


def allgather_async(tensor, name=None, process_set=global_process_set):
    """Starts concatenating every rank's `tensor` along dim 0; returns a handle."""
    _check_tensor(tensor, "allgather_async")
    return _kolo.allgather_async(tensor, name, _set_id(process_set))


class _Allgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, process_set):
        ctx.rows = tensor.shape[0] if tensor.dim() > 0 else 1
        ctx.scalar = tensor.dim() == 0
        ctx.process_set = process_set
        return synchronize(allgather_async(tensor.contiguous(), name, process_set))

    @staticmethod
    def backward(ctx, grad_output):
        grad = allreduce(grad_output, op=Average, process_set=ctx.process_set)
        rows = allgather(torch.tensor([ctx.rows], dtype=torch.int64),
                         process_set=ctx.process_set)
        offset = int(rows[:ctx.process_set.rank()].sum())
        grad = grad.narrow(0, offset, ctx.rows)
        return (grad.reshape(()) if ctx.scalar else grad), None, None


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


def grouped_allgather(tensors, name=None, process_set=global_process_set):
    """Returns the allgather of every tensor of the list (not differentiable)."""
    return synchronize(grouped_allgather_async(tensors, name, process_set))


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


def _splits(splits):
    if splits is None:
        return None
    if isinstance(splits, torch.Tensor):
        return [int(s) for s in splits.reshape(-1).tolist()]
    return [int(s) for s in splits]


def alltoall_async(tensor, splits=None, name=None, process_set=global_process_set):
    """Starts an alltoall: splits[k] rows of `tensor` go to rank k of the set.

    Without `splits` dim 0 is split equally. The handle's result is the
    received rows, plus the received splits when `splits` was given.
    """
    _check_tensor(tensor, "alltoall_async")
    return _kolo.alltoall_async(tensor, _splits(splits), name, _set_id(process_set))


class _Alltoall(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, splits, name, process_set):
        ctx.process_set = process_set
        result = synchronize(alltoall_async(tensor.contiguous(), splits, name, process_set))
        if splits is None:
            # The rows received from each rank, for the backward pass.
            ctx.received = None
            return result
        output, received = result
        ctx.received = received
        ctx.mark_non_differentiable(received)
        return output, received

    @staticmethod
    def backward(ctx, grad_output, *unused):
        grad = alltoall(grad_output, splits=ctx.received, process_set=ctx.process_set)
        if ctx.received is not None:
            grad = grad[0]
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
    return _kolo.reducescatter_async(tensor, name, _op(op, None), prescale_factor,
                                     postscale_factor, _set_id(process_set))


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
        if ctx.op == Sum:
            grad_output = grad_output * ctx.process_set.size()
        if ctx.scale != 1.0:
            grad_output = grad_output * ctx.scale
        return allgather(grad_output, process_set=ctx.process_set), None, None, None, None, None


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
    return _kolo.grouped_reducescatter_async(list(tensors), name, _op(op, None), prescale_factor,
                                             postscale_factor, _set_id(process_set))


def grouped_reducescatter(tensors, name=None, compression=Compression.none, op=Average,
                          process_set=global_process_set, prescale_factor=1.0,
                          postscale_factor=1.0):
    """Returns the reducescatter of every tensor of the list (not differentiable)."""
    compressed, ctxs = zip(*[compression.compress(t) for t in tensors]) if tensors else ((), ())
    reduced = synchronize(grouped_reducescatter_async(compressed, name, op, process_set,
                                                      prescale_factor, postscale_factor))
    return [compression.decompress(t, c) for t, c in zip(reduced, ctxs)]


# --- Synchronisation ----------------------------------------------------------


def join(device=-1):
    """This rank has no more data: until every rank joined, it takes part in the
    others' collectives with neutral contributions. Returns the last rank to join."""
    return _kolo.join(0)


def barrier(process_set=global_process_set):
    """Returns once every rank of the process set called barrier()."""
    _kolo.barrier(_set_id(process_set))
