"""broadcast_parameters, broadcast_optimizer_state, broadcast_object and allgather_object."""
import copy

import torch

import kolo.torch as hvd


def model_for(rank):
    torch.manual_seed(100 + rank)  # different weights on every rank
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3), torch.nn.Linear(3, 2))


def test_broadcast_parameters_forms(world):
    me = world.rank()
    root = world.size() - 1
    reference = model_for(root).state_dict()
    for form in ("state_dict", "named_parameters", "parameters"):
        model = model_for(me)
        if form == "state_dict":
            hvd.broadcast_parameters(model.state_dict(), root_rank=root)
            checked = model.state_dict().items()
        elif form == "named_parameters":
            hvd.broadcast_parameters(model.named_parameters(), root_rank=root)
            checked = model.named_parameters()
        else:
            hvd.broadcast_parameters(list(model.parameters()), root_rank=root)
            checked = model.named_parameters()
        for name, tensor in checked:
            assert torch.equal(tensor.detach(), reference[name]), (form, name)


def train_steps(model, optimizer, steps, seed):
    torch.manual_seed(seed)
    for _ in range(steps):
        optimizer.zero_grad()
        model(torch.randn(8, 4)).pow(2).mean().backward()
        optimizer.step()


def assert_states_bitwise_equal(a, b):
    assert a["param_groups"] == b["param_groups"]
    assert a["state"].keys() == b["state"].keys()
    for key in a["state"]:
        for name, value in a["state"][key].items():
            other = b["state"][key][name]
            if torch.is_tensor(value):
                assert value.dtype == other.dtype and torch.equal(value, other), (key, name)
            else:
                assert value == other, (key, name)


def test_broadcast_optimizer_state_is_bitwise_including_lazy_state(world):
    me = world.rank()
    for make in (lambda p: torch.optim.Adam(p, lr=1e-3 * (me + 1), betas=(0.8, 0.9)),
                 lambda p: torch.optim.SGD(p, lr=0.1 * (me + 1), momentum=0.9),
                 lambda p: torch.optim.RMSprop(p, lr=0.01),
                 lambda p: torch.optim.LBFGS(p, lr=1)):
        model = model_for(0)
        optimizer = make(model.parameters())
        if me == 0 and not isinstance(optimizer, torch.optim.LBFGS):
            # Only root has stepped: the other ranks have no state yet (Adam
            # creates its step and moments lazily).
            train_steps(model, optimizer, 3, seed=1)
        root_state = copy.deepcopy(optimizer.state_dict())
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)
        received = hvd.broadcast_object(root_state, root_rank=0, name="optimizer.reference")
        assert_states_bitwise_equal(optimizer.state_dict(), received)
        assert optimizer.param_groups[0]["lr"] == received["param_groups"][0]["lr"]


def test_broadcast_object_and_allgather_object(world):
    me, n = world.rank(), world.size()
    value = {"rank": me, "payload": list(range(me * 3)), "tensor": torch.arange(me + 1)}
    for root in range(n):
        got = hvd.broadcast_object(value, root_rank=root)
        assert got["rank"] == root and got["payload"] == list(range(root * 3))
        assert torch.equal(got["tensor"], torch.arange(root + 1))
    everyone = hvd.allgather_object(value)
    assert [v["rank"] for v in everyone] == list(range(n))
    assert [len(v["payload"]) for v in everyone] == [r * 3 for r in range(n)]
    assert hvd.broadcast_object(None) is None
    assert hvd.allgather_object(me * 1.5, name="floats") == [r * 1.5 for r in range(n)]
