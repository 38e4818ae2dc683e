"""kolo.torch.elastic's states in a fixed world: commit, restore, sync,
reset callbacks, ElasticSampler's sharding. (Membership changes under
kolorun's elastic mode: tests/python/launch/test_elastic.py.)"""
import torch

import kolo.torch as hvd


def make_model(seed):
    torch.manual_seed(seed)
    return torch.nn.Linear(4, 2)


def test_torch_state_commit_restore_sync(world):
    me = world.rank()
    model = make_model(10 + me)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    state = hvd.elastic.TorchState(model, optimizer, epoch=3, batch=4, note=f"rank{me}")
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    assert (state.epoch, state.batch, state.note) == (3, 4, f"rank{me}")

    # Train a step, change everything, then go back to the constructor's commit.
    model(torch.randn(2, 4)).sum().backward()
    optimizer.step()
    state.epoch, state.batch, state.note = 7, 1, "changed"
    state.restore()
    assert (state.epoch, state.batch, state.note) == (3, 4, f"rank{me}")
    for name, value in model.state_dict().items():
        assert torch.equal(value, initial[name])
    assert optimizer.state_dict()["state"] == {}

    # Commit a trained state on every rank, then take rank 0's.
    model(torch.randn(2, 4)).sum().backward()
    optimizer.step()
    state.batch = 10 + me
    state.commit()
    weight = model.weight
    state.sync()
    assert model.weight is weight, "restored in place"
    root = hvd.broadcast_object({k: v for k, v in model.state_dict().items()}, root_rank=0)
    for name, value in model.state_dict().items():
        assert torch.equal(value, root[name])
    assert state.batch == 10 and state.note == "rank0"
    exp_avg = optimizer.state_dict()["state"][0]["exp_avg"]
    assert torch.equal(exp_avg, hvd.broadcast(exp_avg, root_rank=0))


def test_object_state_and_run_outside_elastic_mode(world):
    state = hvd.elastic.ObjectState(epoch=1, batch=0, losses=[1.0])
    calls = []
    state.register_reset_callbacks([lambda: calls.append("reset")])

    @hvd.elastic.run
    def train(state, factor):
        calls.append("train")
        state.losses.append(2.0 * factor)
        state.commit()
        return len(state.losses)

    assert train(state, 3) == 2
    assert calls == ["train"]  # one world: no reset
    assert state.losses == [1.0, 6.0]
    state.losses = []
    state.restore()
    assert state.losses == [1.0, 6.0]


def test_elastic_sampler_shards_what_is_left(world):
    n, me = world.size(), world.rank()
    dataset = list(range(23))
    sampler = hvd.elastic.ElasticSampler(dataset, shuffle=True, seed=5)
    sampler.set_epoch(2)
    # The order of torch.utils.data.DistributedSampler for the same seed and epoch.
    reference = torch.utils.data.DistributedSampler(dataset, num_replicas=n, rank=me, shuffle=True,
                                                    seed=5)
    reference.set_epoch(2)
    assert list(sampler) == list(reference)
    assert len(sampler) == len(reference)
    # After two batches of 3 per rank, a reset shards only what is left.
    sampler.record_batch(0, 3)
    sampler.record_batch(1, 3)
    sampler.reset()
    order = torch.randperm(23, generator=torch.Generator().manual_seed(5 + 2)).tolist()
    left = order[6 * n:]
    mine = list(sampler)
    everyone = hvd.allgather_object(mine)
    taken = [i for shard in everyone for i in shard]
    assert set(taken) == set(left)
    assert len(mine) == -(-len(left) // n)
    assert sampler.state_dict() == {"epoch": 2, "processed_num": 6 * n}
