"""Every collective, on every dtype kolo supports, on 0-d, empty and
multi-dimensional tensors, in place and out of place, synchronous and
asynchronous, against values computed here from every rank's contribution."""
import pytest
import torch

from conftest import DTYPES, FLOATS, assert_matches, contribution, truncate

import kolo.torch as hvd

SHAPES = [(), (0,), (5,), (2, 3, 4)]
SHAPE_IDS = ["0d", "empty", "1d", "3d"]
OPS = {"Sum": hvd.Sum, "Average": hvd.Average, "Min": hvd.Min, "Max": hvd.Max,
       "Product": hvd.Product}


def expected_reduction(op, shape, dtype, n, prescale=1.0, postscale=1.0):
    """The reduction of every rank's contribution, in float64, stored as `dtype`
    (integers as Horovod computes them: each prescaled value truncated, an
    Average a Sum whose postscale is divided by the set's size, the result
    truncated)."""
    integer = not dtype.is_floating_point
    inputs = torch.stack([contribution(r, shape, dtype).double() * prescale for r in range(n)])
    if integer and prescale != 1.0:
        inputs = truncate(inputs)
    if op == "Sum":
        out = inputs.sum(0)
    elif op == "Average" and integer:
        out = inputs.sum(0)
        postscale = postscale / n
    elif op == "Average":
        out = inputs.sum(0) / n
    elif op == "Min":
        out = inputs.min(0).values
    elif op == "Max":
        out = inputs.max(0).values
    else:
        out = inputs.prod(0)
    out = out * postscale
    if integer:
        out = truncate(out)
    return out.to(dtype)


@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("op", list(OPS))
def test_allreduce(world, op, dtype, shape):
    n, me = world.size(), world.rank()
    expected = expected_reduction(op, shape, dtype, n)
    mine = contribution(me, shape, dtype)

    out = world.allreduce(mine, op=OPS[op], name=f"ar.{op}")
    assert_matches(out, expected)
    assert torch.equal(mine, contribution(me, shape, dtype)), "out of place changed its input"

    in_place = contribution(me, shape, dtype)
    returned = world.allreduce_(in_place, op=OPS[op], name=f"ar_.{op}")
    assert returned is in_place or returned.data_ptr() == in_place.data_ptr()
    assert_matches(in_place, expected)

    handle = world.allreduce_async(mine, op=OPS[op])  # unnamed
    assert_matches(world.synchronize(handle), expected)
    assert world.poll(handle)

    in_place = contribution(me, shape, dtype)
    world.synchronize(world.allreduce_async_(in_place, op=OPS[op]))
    assert_matches(in_place, expected)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_allreduce_scale_factors(world, dtype):
    n, me = world.size(), world.rank()
    for op in ("Sum", "Average"):
        expected = expected_reduction(op, (4, 3), dtype, n, prescale=0.5, postscale=3.0)
        out = world.allreduce(contribution(me, (4, 3), dtype), op=OPS[op], prescale_factor=0.5,
                              postscale_factor=3.0)
        assert_matches(out, expected)


def test_allreduce_average_argument_and_default(world):
    n, me = world.size(), world.rank()
    x = contribution(me, (3,), torch.float64)
    assert_matches(world.allreduce(x), expected_reduction("Average", (3,), torch.float64, n))
    with pytest.warns(DeprecationWarning):
        out = world.allreduce(x, average=False)
    assert_matches(out, expected_reduction("Sum", (3,), torch.float64, n))


@pytest.mark.parametrize("compression", ["fp16", "bf16"])
def test_allreduce_compression(world, compression):
    n, me = world.size(), world.rank()
    x = torch.linspace(-1, 1, 50, dtype=torch.float32) * (me + 1)
    expected = sum(torch.linspace(-1, 1, 50) * (r + 1) for r in range(n)) / n
    out = world.allreduce(x, compression=getattr(world.Compression, compression))
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, expected, rtol=2e-2, atol=2e-2)


def test_grouped_allreduce(world):
    n, me = world.size(), world.rank()
    shapes = [(), (3,), (2, 2), (0,)]
    dtypes = [torch.float32, torch.int32, torch.float64, torch.bfloat16]
    tensors = [contribution(me, s, d) for s, d in zip(shapes, dtypes)]
    expected = [expected_reduction("Sum", s, d, n) for s, d in zip(shapes, dtypes)]
    for out, e in zip(world.grouped_allreduce(tensors, op=world.Sum, name="group"), expected):
        assert_matches(out, e)
    handle = world.grouped_allreduce_async(tensors, op=world.Sum)
    for out, e in zip(world.synchronize(handle), expected):
        assert_matches(out, e)
    copies = [t.clone() for t in tensors]
    world.grouped_allreduce_(copies, op=world.Sum)
    for out, e in zip(copies, expected):
        assert_matches(out, e)


def gather_rows(rank):
    """Rows rank `rank` contributes to an allgather: they differ per rank, rank 0 has none."""
    return rank * 2 % 5


@pytest.mark.parametrize("trailing", [(), (3,), (2, 4)], ids=["rows", "rows_x3", "rows_x2x4"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_allgather_with_a_different_first_dimension_per_rank(world, dtype, trailing):
    n, me = world.size(), world.rank()
    expected = torch.cat([contribution(r, (gather_rows(r), *trailing), dtype) for r in range(n)])
    mine = contribution(me, (gather_rows(me), *trailing), dtype)
    assert_matches(world.allgather(mine), expected)
    assert_matches(world.synchronize(world.allgather_async(mine, name="ag")), expected)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_allgather_of_0d_tensors(world, dtype):
    n, me = world.size(), world.rank()
    expected = torch.stack([contribution(r, (), dtype) for r in range(n)])
    assert_matches(world.allgather(contribution(me, (), dtype)), expected)


def test_grouped_allgather(world):
    n, me = world.size(), world.rank()
    tensors = [contribution(me, (gather_rows(me), 2), torch.float32),
               contribution(me, (1,), torch.int64)]
    out = world.grouped_allgather(tensors)
    assert_matches(out[0], torch.cat([contribution(r, (gather_rows(r), 2), torch.float32)
                                      for r in range(n)]))
    assert_matches(out[1], torch.cat([contribution(r, (1,), torch.int64) for r in range(n)]))


@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
@pytest.mark.parametrize("dtype", DTYPES + [torch.bool, torch.complex64], ids=str)
def test_broadcast_from_every_root(world, dtype, shape):
    n, me = world.size(), world.rank()
    for root in range(n):
        expected = contribution(root, shape, dtype)
        mine = contribution(me, shape, dtype)
        assert_matches(world.broadcast(mine, root), expected)
        assert torch.equal(mine, contribution(me, shape, dtype))
        world.broadcast_(mine, root, name=f"bc_.{root}")
        assert_matches(mine, expected)
        mine = contribution(me, shape, dtype)
        assert_matches(world.synchronize(world.broadcast_async(mine, root)), expected)
        world.synchronize(world.broadcast_async_(mine, root))
        assert_matches(mine, expected)


def send_splits(rank, n):
    """Rows `rank` sends to each rank k: uneven, some zero."""
    return [(rank + k) % 3 for k in range(n)]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_alltoall_with_splits(world, dtype):
    n, me = world.size(), world.rank()
    rows = {r: contribution(r, (sum(send_splits(r, n)), 2), dtype) +
            torch.arange(sum(send_splits(r, n))).reshape(-1, 1).to(dtype) for r in range(n)}
    pieces = []
    for k in range(n):
        offset = sum(send_splits(k, n)[:me])
        pieces.append(rows[k][offset:offset + send_splits(k, n)[me]])
    expected = torch.cat(pieces)
    received_counts = [send_splits(k, n)[me] for k in range(n)]

    out, received = world.alltoall(rows[me], splits=send_splits(me, n))
    assert_matches(out, expected)
    assert received.tolist() == received_counts
    out, received = world.alltoall(rows[me], splits=torch.tensor(send_splits(me, n),
                                                                   dtype=torch.int32))
    assert_matches(out, expected)
    out, received = world.synchronize(world.alltoall_async(rows[me], splits=send_splits(me, n)))
    assert_matches(out, expected)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_alltoall_equal_split(world, dtype):
    n, me = world.size(), world.rank()
    # Rank r sends rows [2k, 2k+2) of its tensor to rank k.
    tensors = {r: contribution(r, (2 * n, 3), dtype) + torch.arange(2 * n).reshape(-1, 1).to(dtype)
               for r in range(n)}
    expected = torch.cat([tensors[k][2 * me:2 * me + 2] for k in range(n)])
    assert_matches(world.alltoall(tensors[me]), expected)
    # Horovod's handle gives the received splits with or without splits.
    out, received = world.synchronize(world.alltoall_async(tensors[me]))
    assert_matches(out, expected)
    assert received.tolist() == [2] * n


@pytest.mark.parametrize("trailing", [(), (3,)], ids=["rows", "rows_x3"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("op", ["Sum", "Average", "Max"])
def test_reducescatter(world, op, dtype, trailing):
    n, me = world.size(), world.rank()
    rows = 2 * n + 1  # uneven: the first rows % n ranks get one more row
    full = expected_reduction(op, (rows, *trailing), dtype, n)
    counts = [rows // n + (1 if r < rows % n else 0) for r in range(n)]
    start = sum(counts[:me])
    expected = full[start:start + counts[me]]
    mine = contribution(me, (rows, *trailing), dtype)
    assert_matches(world.reducescatter(mine, op=OPS[op]), expected)
    assert_matches(world.synchronize(world.reducescatter_async(mine, op=OPS[op])), expected)


def test_grouped_reducescatter(world):
    n, me = world.size(), world.rank()
    out = world.grouped_reducescatter([contribution(me, (n, 2), torch.float32),
                                       contribution(me, (n,), torch.int64)], op=world.Sum)
    assert_matches(out[0], expected_reduction("Sum", (n, 2), torch.float32, n)[me:me + 1])
    assert_matches(out[1], expected_reduction("Sum", (n,), torch.int64, n)[me:me + 1])


def test_autograd_through_collectives(world):
    n, me = world.size(), world.rank()
    x = torch.full((3,), float(me + 1), requires_grad=True)
    world.allreduce(x, op=world.Sum).sum().backward()
    assert torch.equal(x.grad, torch.full((3,), float(n)))  # the Sum of every rank's ones

    x = torch.full((me + 1, 2), 1.0, requires_grad=True)
    gathered = world.allgather(x)
    assert gathered.shape[0] == sum(r + 1 for r in range(n))
    (gathered * 2).sum().backward()
    assert torch.equal(x.grad, torch.full((me + 1, 2), 2.0))  # averaged: every rank's is 2

    x = torch.ones(4, requires_grad=True)
    world.broadcast(x, root_rank=0).sum().backward()
    assert torch.equal(x.grad, torch.ones(4) if me == 0 else torch.zeros(4))


def test_barrier_and_join(world):
    world.barrier()
    # Rank r runs r + 1 allreduces, then joins; the joined ranks contribute
    # nothing to the later ones, which average over the ranks that did.
    n, me = world.size(), world.rank()
    for step in range(me + 1):
        out = world.allreduce(torch.full((2,), float(me)), op=world.Sum, name=f"join.{step}")
        contributors = [r for r in range(n) if r >= step]
        assert torch.equal(out, torch.full((2,), float(sum(contributors))))
    assert world.join() == n - 1  # the rank with the most data joins last
    world.barrier()
