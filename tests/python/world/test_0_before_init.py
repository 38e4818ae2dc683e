"""Before init(): every call that needs the runtime raises a clear ContractError.

Runs first (file order), before any test initialises kolo.
"""
import pytest
import torch

import kolo
import kolo.torch as hvd


@pytest.mark.parametrize("call", [
    lambda: hvd.rank(),
    lambda: hvd.size(),
    lambda: hvd.local_rank(),
    lambda: hvd.is_homogeneous(),
    lambda: hvd.allreduce(torch.ones(2)),
    lambda: hvd.allgather(torch.ones(2)),
    lambda: hvd.broadcast_(torch.ones(2), 0),
    lambda: hvd.barrier(),
    lambda: hvd.join(),
    lambda: hvd.broadcast_object(1),
    lambda: hvd.add_process_set([0]),
], ids=["rank", "size", "local_rank", "is_homogeneous", "allreduce", "allgather", "broadcast_",
        "barrier", "join", "broadcast_object", "add_process_set"])
def test_use_before_init_raises_contract_error(call):
    assert not hvd.is_initialized()
    with pytest.raises(kolo.ContractError, match="init"):
        call()


def test_built_flags_answer_without_init():
    assert not hvd.mpi_enabled() and not hvd.gloo_enabled()
    assert isinstance(hvd.mpi_built(), bool) and isinstance(hvd.gloo_built(), bool)
    assert isinstance(hvd.cuda_built(), bool) and isinstance(hvd.nccl_built(), int)
    # NCCL counts only where it can run: built with CUDA, a GPU present.
    if not torch.cuda.is_available():
        assert hvd.nccl_built() == 0
    if not hvd.cuda_built():
        assert hvd.nccl_built() == 0


def test_error_classes():
    assert issubclass(kolo.ContractError, kolo.Error)
    assert issubclass(kolo.ContractError, ValueError)
    assert issubclass(kolo.RuntimeFault, RuntimeError)
    assert issubclass(kolo.TimeoutError, kolo.RuntimeFault)
    assert hvd.HorovodInternalError is kolo.RuntimeFault
    assert hvd.elastic.HorovodInternalError is kolo.RuntimeFault
