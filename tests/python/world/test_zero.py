"""ZeroOptimizer (stages 1, 2): N ranks with batch B equal one process with
batch N*B (the reference every rank computes by itself, as in
test_optimizer.py), with buckets small enough that parameters straddle two
ranks' slices; local accumulation; each rank steps only its slices; errors."""
import pytest
import torch

import kolo
import kolo.torch as hvd
from test_optimizer import B, OPTIMIZERS, STEPS, assert_models_close, batches, make_model, reference

# 256-byte buckets: the model's 6x16 + 16 + 16x3 + 3 parameters make several
# buckets, and each bucket's split across the ranks cuts through parameters.
BUCKET_MB = 256 / (1024 * 1024)


def sharded(world, make_optimizer, dtype, stage, passes=1):
    """This rank's share of every step, through hvd.ZeroOptimizer."""
    n, me = world.size(), world.rank()
    model = make_model(dtype)
    optimizer = hvd.ZeroOptimizer(make_optimizer(model.parameters()), model, stage=stage,
                                  backward_passes_per_step=passes, bucket_cap_mb=BUCKET_MB)
    x, y = batches(n, dtype)
    for step in range(STEPS):
        optimizer.zero_grad()
        for part in range(passes):  # `passes` slices of this rank's B rows
            cut = slice(me * B + part * B // passes, me * B + (part + 1) * B // passes)
            torch.nn.functional.mse_loss(model(x[step][cut]), y[step][cut]).backward()
        optimizer.step()
    return model, optimizer


@pytest.mark.parametrize("stage", [1, 2])
@pytest.mark.parametrize("kind", ["SGD", "Adam", "AdamW"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_n_ranks_with_batch_b_equal_one_process_with_n_times_b(world, stage, kind, dtype):
    model, optimizer = sharded(world, OPTIMIZERS[kind], dtype, stage)
    tolerance = (1e-5, 1e-6) if dtype == torch.float32 else (1e-10, 1e-12)
    assert_models_close(model, reference(OPTIMIZERS[kind], world.size(), dtype), *tolerance)
    assert isinstance(optimizer, OPTIMIZERS[kind](make_model(dtype).parameters()).__class__)
    buckets = optimizer.kolo_buckets()
    assert len(buckets) > 1, buckets
    # The optimizer steps this rank's slices only, and holds state for them only.
    pieces = [p for group in optimizer.param_groups for p in group["params"]]
    mine = sum(b["shard_numel"] for b in buckets)
    assert sum(p.numel() for p in pieces) == mine
    total = sum(p.numel() for p in model.parameters())
    assert sum(b["numel"] for b in buckets) == total
    assert mine <= total // world.size() + len(buckets)
    for p in pieces:
        for value in optimizer.state[p].values():
            if torch.is_tensor(value) and value.dim() > 0:
                assert value.numel() == p.numel()


@pytest.mark.parametrize("stage", [1, 2])
def test_backward_passes_per_step(world, stage):
    model, _ = sharded(world, OPTIMIZERS["Adam"], torch.float64, stage, passes=2)
    assert_models_close(model, reference(OPTIMIZERS["Adam"], world.size(), torch.float64),
                        1e-10, 1e-12)


def test_synchronize_then_step_clips_the_averaged_gradients(world):
    n, me = world.size(), world.rank()
    model = make_model(torch.float64)
    optimizer = hvd.ZeroOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model, stage=2,
                                  bucket_cap_mb=BUCKET_MB)
    expected = make_model(torch.float64)
    reference_sgd = torch.optim.SGD(expected.parameters(), lr=0.1)
    x, y = batches(n, torch.float64, steps=1)
    torch.nn.functional.mse_loss(model(x[0][me * B:(me + 1) * B]),
                                 y[0][me * B:(me + 1) * B]).backward()
    optimizer.synchronize()
    for group in optimizer.param_groups:
        for piece in group["params"]:
            piece.grad.clamp_(-0.01, 0.01)
    optimizer.step()  # does not reduce again
    torch.nn.functional.mse_loss(expected(x[0]), y[0]).backward()
    for p in expected.parameters():
        p.grad.clamp_(-0.01, 0.01)
    reference_sgd.step()
    assert_models_close(model, expected, 1e-10, 1e-12)


def test_errors_on_every_rank(world):
    model = make_model(torch.float32)
    with pytest.raises(kolo.ContractError, match="stage 3 is not available from Python"):
        hvd.ZeroOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model, stage=3)
    stepped = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.ones(1, 6)).sum().backward()
    stepped.step()
    with pytest.raises(kolo.ContractError, match="has state already"):
        hvd.ZeroOptimizer(stepped, model)
    other = make_model(torch.float32)
    with pytest.raises(kolo.ContractError, match="not a parameter of the model"):
        hvd.ZeroOptimizer(torch.optim.SGD(other.parameters(), lr=0.1), model)
    # Stages that differ across ranks: rank 0's is compared with everyone's.
    with pytest.raises(kolo.ContractError, match="rank 0"):
        hvd.ZeroOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model,
                          stage=1 if world.rank() == 0 else 2)
    optimizer = hvd.ZeroOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model)
    with pytest.raises(kolo.ContractError, match="closure"):
        optimizer.step(lambda: 0.0)
