"""Horovod's PyTorch API on kolo's engine: ``import kolo.torch as hvd``.

A Horovod training script runs with only its import line changed, launched
by ``kolorun -np N python train.py`` (or mpirun, or torchrun). Collectives,
fusion, the gradient pipeline, the timeline and elastic training are the
C++ engine's that kolo's C++ programs use (docs/python.md lists every
difference from Horovod).
"""
from kolo._kolo import (  # noqa: F401
    ContractError,
    Error,
    MembershipChanged,
    RuntimeFault,
    TimeoutError,
)
from kolo.torch import elastic  # noqa: F401
from kolo.torch.compression import Compression  # noqa: F401
from kolo.torch.functions import (  # noqa: F401
    allgather_object,
    broadcast_object,
    broadcast_optimizer_state,
    broadcast_parameters,
)
from kolo.torch.optimizer import DistributedOptimizer  # noqa: F401
from kolo.torch.zero import ZeroOptimizer  # noqa: F401
from kolo.torch.mpi_ops import (  # noqa: F401
    Adasum,
    Average,
    HorovodInternalError,
    Max,
    Min,
    Product,
    ProcessSet,
    Sum,
    add_process_set,
    allgather,
    allgather_async,
    allreduce,
    allreduce_,
    allreduce_async,
    allreduce_async_,
    alltoall,
    alltoall_async,
    backend,
    barrier,
    broadcast,
    broadcast_,
    broadcast_async,
    broadcast_async_,
    ccl_built,
    cross_rank,
    cross_size,
    cuda_built,
    ddl_built,
    global_process_set,
    gloo_built,
    gloo_enabled,
    grouped_allgather,
    grouped_allgather_async,
    grouped_allreduce,
    grouped_allreduce_,
    grouped_allreduce_async,
    grouped_allreduce_async_,
    grouped_reducescatter,
    grouped_reducescatter_async,
    init,
    is_homogeneous,
    is_initialized,
    join,
    local_rank,
    local_size,
    mpi_built,
    mpi_enabled,
    mpi_threads_supported,
    nccl_built,
    poll,
    rank,
    reducescatter,
    reducescatter_async,
    remove_process_set,
    rocm_built,
    shutdown,
    sparse_allreduce_async,
    size,
    start_timeline,
    stop_timeline,
    synchronize,
)
