"""Contract errors: arguments that differ across ranks raise on every rank
with the ranks and values named, and the next call works; bad local
arguments raise the same ContractError on every rank."""
import threading

import pytest
import torch

import kolo
import kolo.torch as hvd


def odd_one_out(world):
    """The last rank disagrees with the others."""
    return world.rank() == world.size() - 1


def expect_next_call_works(world):
    out = world.allreduce(torch.ones(3), op=world.Sum, name="after.mismatch")
    assert torch.equal(out, torch.full((3,), float(world.size())))


@pytest.mark.parametrize("case", ["shape", "dtype", "op", "root", "operation", "prescale"])
def test_mismatch_across_ranks_raises_on_every_rank(world, case):
    odd = odd_one_out(world)
    last = world.size() - 1
    name = f"mismatch.{case}"
    with pytest.raises(kolo.ContractError) as raised:
        if case == "shape":
            world.allreduce(torch.ones((2, 3) if odd else (6,)), name=name)
        elif case == "dtype":
            world.allreduce(torch.ones(4, dtype=torch.int32 if odd else torch.float32), name=name)
        elif case == "op":
            world.allreduce(torch.ones(4), op=world.Max if odd else world.Sum, name=name)
        elif case == "root":
            world.broadcast(torch.ones(4), root_rank=1 if odd else 0, name=name)
        elif case == "operation":
            if odd:
                world.allgather(torch.ones(4), name=name)
            else:
                world.allreduce(torch.ones(4), name=name)
        else:
            world.allreduce(torch.ones(4), prescale_factor=0.5 if odd else 1.0, name=name)
    message = str(raised.value)
    assert name in message, message
    expected = {"shape": ["tensor shapes", "[2, 3]", "[6]"],
                "dtype": ["data types", "f32", "i32"],
                "op": ["reduction ops", "sum", "max"],
                "root": ["root ranks", "rank 0", "rank 1"],
                "operation": ["Mismatched operations", "ALLREDUCE", "ALLGATHER"],
                "prescale": ["prescale factors", "0.5"]}[case]
    for part in expected:
        assert part in message, (part, message)
    assert f"rank {last}" in message or f"ranks {last}" in message or str(last) in message, message
    expect_next_call_works(world)


def test_allgather_trailing_shape_mismatch(world):
    odd = odd_one_out(world)
    with pytest.raises(kolo.ContractError, match="all but the first dimension"):
        world.allgather(torch.ones((1, 3) if odd else (2, 2)), name="mismatch.allgather")
    expect_next_call_works(world)


@pytest.mark.parametrize("call, match", [
    (lambda w: w.allreduce_(torch.ones(4, 3).t()), "not contiguous"),
    (lambda w: w.allreduce(torch.ones(3, dtype=torch.bool)), "dtype Bool"),
    (lambda w: w.allreduce(torch.ones(3), op=w.Adasum), "Adasum is not supported"),
    (lambda w: w.allreduce(torch.ones(3), op=17), "not a reduction"),
    (lambda w: w.allreduce(torch.ones(3), op=w.Sum, average=True), "supersedes"),
    (lambda w: w.allreduce([1.0, 2.0]), "expected a torch.Tensor"),
    (lambda w: w.allreduce(torch.ones(3), process_set=w.ProcessSet([0])), "does not exist"),
    (lambda w: w.broadcast(torch.ones(3), root_rank=w.size()), "not a rank|root"),
    (lambda w: w.reducescatter(torch.ones(())), "0-dimensional"),
    (lambda w: w.alltoall(torch.ones(w.size() + 1)), "divide|split"),
    (lambda w: w.init(comm=[0]), "comm is not supported"),
    (lambda w: w.allreduce(torch.ones(3), name=123), "name must be a str"),
    (lambda w: w.synchronize(None), "expected the handle"),
    (lambda w: w.poll("handle"), "expected the handle"),
], ids=["non_contiguous", "bool", "adasum", "bad_op", "op_and_average", "not_a_tensor",
        "unknown_set", "root_out_of_range", "reducescatter_0d", "alltoall_uneven", "comm",
        "name_not_str", "synchronize_none", "poll_not_a_handle"])
def test_bad_arguments_raise_contract_error_on_every_rank(world, call, match):
    with pytest.raises(kolo.ContractError, match=match):
        call(world)
    expect_next_call_works(world)


def test_broadcast_parameters_structure_mismatch(world):
    odd = odd_one_out(world)
    model = torch.nn.Linear(3, 2 if odd else 4)
    with pytest.raises(kolo.ContractError) as raised:
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    message = str(raised.value)
    assert f"rank {world.size() - 1}" in message and "differs from root rank 0" in message
    expect_next_call_works(world)


def test_optimizer_state_from_another_kind_of_optimizer(world):
    odd = odd_one_out(world)
    model = torch.nn.Linear(3, 2)
    optimizer = (torch.optim.SGD if odd else torch.optim.Adam)(model.parameters(), lr=0.1)
    with pytest.raises(kolo.ContractError) as raised:
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    assert "Adam" in str(raised.value) and "SGD" in str(raised.value)
    expect_next_call_works(world)


def test_unpicklable_object_raises_on_every_rank(world):
    with pytest.raises(TypeError if world.rank() == 0 else kolo.ContractError) as raised:
        hvd.broadcast_object(threading.Lock(), root_rank=0, name="unpicklable")
    assert "pickle" in str(raised.value)
    if world.rank() != 0:
        assert "root rank 0" in str(raised.value)
    expect_next_call_works(world)


def test_a_wait_that_times_out_raises_timeout_error_and_the_request_goes_on(world):
    me = world.rank()
    if me == 0:
        handle = hvd.allreduce_async(torch.ones(2), name="late", op=hvd.Sum)
        with pytest.raises(kolo.TimeoutError) as raised:
            handle.wait(timeout_seconds=0.05)  # the others submit "late" after the barrier
        assert isinstance(raised.value, kolo.RuntimeFault)
        assert raised.value.failed_ranks == []
        world.barrier()
    else:
        world.barrier()
        handle = hvd.allreduce_async(torch.ones(2), name="late", op=hvd.Sum)
    assert torch.equal(hvd.synchronize(handle), torch.full((2,), float(world.size())))


def test_resize_or_set_during_an_async_request_raises_instead_of_crashing(world):
    """allreduce_async_ hands the engine the tensor's memory until synchronize.
    A resize_ that would move it raises (the storage is pinned) and a set_
    that swaps it leaves the request's memory alive and fails synchronize
    naming what happened; before, either freed the memory under the engine
    (SIGSEGV). Rank 0 holds the request back behind a barrier so that the
    tensor is surely in flight when it is touched."""
    me = world.rank()
    n = 1 << 16
    x = torch.ones(n)
    if me == 0:
        handle = hvd.allreduce_async_(x, name="pinned.resize", op=hvd.Sum)
        with pytest.raises(RuntimeError, match="not resizable"):
            x.resize_(4 * n)
        # torch has set the new sizes before its storage refused to grow;
        # the memory is intact, so shrinking back (no reallocation) works.
        x.resize_(n)
        world.barrier()
    else:
        world.barrier()
        handle = hvd.allreduce_async_(x, name="pinned.resize", op=hvd.Sum)
    out = hvd.synchronize(handle)
    assert torch.equal(out, torch.full((n,), float(world.size())))
    x.resize_(4 * n)  # unpinned once the request completed

    y = torch.ones(n)
    if me == 0:
        handle = hvd.allreduce_async_(y, name="pinned.set", op=hvd.Sum)
        y.set_(torch.zeros(8))
        world.barrier()
        with pytest.raises(kolo.ContractError, match="given another storage"):
            hvd.synchronize(handle)
    else:
        world.barrier()
        hvd.synchronize(hvd.allreduce_async_(y, name="pinned.set", op=hvd.Sum))
    expect_next_call_works(world)
