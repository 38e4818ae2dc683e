"""DistributedOptimizer: N ranks with batch B equal one process with batch
N*B (the reference every rank computes by itself), local accumulation,
compression, a parameter without a gradient on some rank, the C++ hooks,
and the errors."""
import warnings

import pytest
import torch

import kolo
import kolo.torch as hvd

B, FEATURES, STEPS = 4, 6, 5


def make_model(dtype):
    torch.manual_seed(1234)
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, 16), torch.nn.Tanh(),
                               torch.nn.Linear(16, 3)).to(dtype)


def batches(n, dtype, steps=STEPS):
    """Each step's global batch of n * B rows: rank r's rows are [r B, (r+1) B)."""
    generator = torch.Generator().manual_seed(99)
    x = torch.randn(steps, n * B, FEATURES, generator=generator).to(dtype)
    y = torch.randn(steps, n * B, 3, generator=generator).to(dtype)
    return x, y


OPTIMIZERS = {
    "SGD": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=1e-3),
    "Adam": lambda p: torch.optim.Adam(p, lr=0.01),
    "AdamW": lambda p: torch.optim.AdamW(p, lr=0.01),
    "RMSprop": lambda p: torch.optim.RMSprop(p, lr=0.01),
    "Adagrad": lambda p: torch.optim.Adagrad(p, lr=0.1),
}


def reference(make_optimizer, n, dtype, passes=1):
    """One process, the whole global batch of every step."""
    model = make_model(dtype)
    optimizer = make_optimizer(model.parameters())
    x, y = batches(n, dtype)
    for step in range(STEPS):
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x[step]), y[step]).backward()
        optimizer.step()
    return model


def distributed(world, make_optimizer, dtype, passes=1, **options):
    """This rank's share of every step, through hvd.DistributedOptimizer."""
    n, me = world.size(), world.rank()
    model = make_model(dtype)
    optimizer = hvd.DistributedOptimizer(make_optimizer(model.parameters()),
                                         named_parameters=model.named_parameters(),
                                         backward_passes_per_step=passes, **options)
    x, y = batches(n, dtype)
    for step in range(STEPS):
        optimizer.zero_grad()
        rows = slice(me * B, (me + 1) * B)
        for part in range(passes):  # `passes` slices of this rank's B rows
            cut = slice(me * B + part * B // passes, me * B + (part + 1) * B // passes)
            torch.nn.functional.mse_loss(model(x[step][cut]), y[step][cut]).backward()
        del rows
        optimizer.step()
    return model, optimizer


def assert_models_close(actual, expected, rtol, atol):
    for (name, a), (_, e) in zip(actual.named_parameters(), expected.named_parameters()):
        torch.testing.assert_close(a, e, rtol=rtol, atol=atol, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("kind", list(OPTIMIZERS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_n_ranks_with_batch_b_equal_one_process_with_n_times_b(world, kind, dtype):
    model, optimizer = distributed(world, OPTIMIZERS[kind], dtype)
    tolerance = (1e-5, 1e-6) if dtype == torch.float32 else (1e-10, 1e-12)
    assert_models_close(model, reference(OPTIMIZERS[kind], world.size(), dtype), *tolerance)
    assert isinstance(optimizer, OPTIMIZERS[kind](make_model(dtype).parameters()).__class__)
    stats = optimizer.kolo_stats()
    assert stats["steps"] == STEPS
    assert stats["hook_submissions"] == STEPS * 4  # every gradient went from its hook


@pytest.mark.parametrize("passes", [2, 4])
def test_backward_passes_per_step(world, passes):
    model, _ = distributed(world, OPTIMIZERS["Adam"], torch.float64, passes=passes)
    assert_models_close(model, reference(OPTIMIZERS["Adam"], world.size(), torch.float64),
                        1e-10, 1e-12)


@pytest.mark.parametrize("compression, tolerance", [("fp16", 2e-3), ("bf16", 2e-2)])
def test_compression_within_a_looser_tolerance(world, compression, tolerance):
    model, _ = distributed(world, OPTIMIZERS["SGD"], torch.float32,
                           compression=getattr(hvd.Compression, compression))
    assert_models_close(model, reference(OPTIMIZERS["SGD"], world.size(), torch.float32),
                        tolerance, tolerance)


def test_sum_and_predivide(world):
    n = world.size()
    # Sum over the ranks of per-rank means = n x the global mean: SGD with lr / n.
    model, _ = distributed(world, lambda p: torch.optim.SGD(p, lr=0.1 / n), torch.float64,
                           op=hvd.Sum)
    assert_models_close(model, reference(lambda p: torch.optim.SGD(p, lr=0.1), n, torch.float64),
                        1e-10, 1e-12)
    model, _ = distributed(world, OPTIMIZERS["SGD"], torch.float64, gradient_predivide_factor=2.0)
    assert_models_close(model, reference(OPTIMIZERS["SGD"], n, torch.float64), 1e-10, 1e-12)


class TwoBranches(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(5)
        self.trunk = torch.nn.Linear(3, 3)
        self.branch = torch.nn.Linear(3, 1)  # used by rank 0 only
        self.head = torch.nn.Linear(3, 1)

    def forward(self, x, use_branch):
        h = self.trunk(x)
        return self.head(h) + (self.branch(h) if use_branch else 0)


def test_a_parameter_without_a_gradient_on_some_ranks_is_sent_as_zeros(world):
    n, me = world.size(), world.rank()
    model = TwoBranches()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.0),
                                         named_parameters=model.named_parameters())
    x = torch.ones(2, 3) * (me + 1)
    optimizer.zero_grad(set_to_none=True)
    model(x, use_branch=me == 0).sum().backward()
    mine = model.branch.weight.grad.clone() if me == 0 else torch.zeros(1, 3)
    expected = hvd.allreduce(mine, op=hvd.Sum, name="branch.expected") / n
    optimizer.synchronize()  # no rank waits for the gradient the others never made
    assert torch.allclose(model.branch.weight.grad, expected)
    stats = optimizer.kolo_stats()
    assert stats["zero_filled"] == (0 if me == 0 else 2)  # branch.weight and branch.bias
    with optimizer.skip_synchronize():
        optimizer.step()


def test_hooks_hand_each_gradient_to_the_engine_inside_backward(world):
    model = make_model(torch.float32)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters(),
                                         bucket_cap_mb=0)  # every gradient its own bucket
    model(torch.randn(2, FEATURES)).sum().backward()
    # Before any Python call of the optimizer: the C++ hooks sent all four.
    assert optimizer.kolo_stats()["hook_submissions"] == 4
    assert len(optimizer.kolo_buckets()) == 4
    optimizer.step()
    assert optimizer.kolo_stats()["step_submissions"] == 0


def test_synchronize_then_clip_then_step(world):
    model = make_model(torch.float32)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters())
    model(torch.randn(2, FEATURES)).sum().backward()
    optimizer.synchronize()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)
    with optimizer.skip_synchronize():
        optimizer.step()
    model(torch.randn(2, FEATURES)).sum().backward()
    optimizer.synchronize()
    with pytest.warns(UserWarning, match="skip_synchronize"):
        optimizer.step()  # Horovod: warns, and synchronizes again


def test_contract_errors(world):
    model = make_model(torch.float32)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters())
    model(torch.randn(2, FEATURES)).sum().backward()
    with pytest.raises(kolo.ContractError, match="zero_grad"):
        optimizer.zero_grad()  # the exchange started by backward() still runs
    optimizer.step()
    optimizer.zero_grad()
    model(torch.randn(2, FEATURES)).sum().backward()
    with pytest.raises(RuntimeError, match="backward_passes_per_step"):
        model(torch.randn(2, FEATURES)).sum().backward()  # one pass too many
    optimizer.step()


def test_construction_mismatch_and_missing_names_raise_on_every_rank(world):
    odd = world.rank() == world.size() - 1
    model = make_model(torch.float32)
    extra = torch.nn.Parameter(torch.zeros(2))
    params = list(model.parameters()) + ([extra] if odd else [])
    named = list(model.named_parameters()) + ([("extra", extra)] if odd else [])
    with pytest.raises(kolo.ContractError, match="rank"):
        hvd.DistributedOptimizer(torch.optim.SGD(params, lr=0.1), named_parameters=named)
    unnamed = list(model.named_parameters())[1:] if odd else list(model.named_parameters())
    with pytest.raises(kolo.ContractError, match="has no name") as raised:
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                 named_parameters=unnamed)
    assert f"rank {world.size() - 1}" in str(raised.value)
    with pytest.raises(kolo.ContractError, match="Adasum"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), op=hvd.Adasum)


def test_works_with_broadcast_optimizer_state_and_after_a_reinit(world):
    n = world.size()
    model = make_model(torch.float64)
    optimizer = hvd.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=0.01),
                                         named_parameters=model.named_parameters())
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    x, y = batches(n, torch.float64)
    me = world.rank()

    def train_step(step):
        optimizer.zero_grad()
        rows = slice(me * B, (me + 1) * B)
        torch.nn.functional.mse_loss(model(x[step][rows]), y[step][rows]).backward()
        optimizer.step()

    train_step(0)
    # The optimizer survives a new runtime: its exchange is rebuilt on the new engine.
    hvd.shutdown()
    with pytest.raises(kolo.ContractError, match="shut down"):
        optimizer.synchronize()
    hvd.init()
    for step in range(1, STEPS):
        train_step(step)
    assert_models_close(model, reference(OPTIMIZERS["Adam"], n, torch.float64), 1e-10, 1e-12)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)
