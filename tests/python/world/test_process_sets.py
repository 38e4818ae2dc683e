"""Process sets: created on every rank, used by their members, roots as global ranks."""
import pytest
import torch

import kolo
import kolo.torch as hvd
from conftest import assert_matches, contribution


def test_collectives_on_a_process_set(world):
    n, me = world.size(), world.rank()
    members = [r for r in range(n) if r != 1] if n > 2 else [1]  # np2: [1]; np3: [0, 2]
    process_set = hvd.add_process_set(members)
    try:
        assert process_set.process_set_id not in (None, 0)
        assert process_set.size() == len(members)
        assert process_set.included() == (me in members)
        if me in members:
            assert process_set.rank() == members.index(me)
            out = hvd.allreduce(contribution(me, (3,), torch.float32), op=hvd.Sum,
                                process_set=process_set)
            assert_matches(out, sum(contribution(r, (3,), torch.float32) for r in members))
            gathered = hvd.allgather(torch.full((me + 1,), me), process_set=process_set)
            assert gathered.tolist() == [r for r in members for _ in range(r + 1)]
            root = members[-1]  # a global rank
            out = hvd.broadcast(torch.full((2,), float(me)), root_rank=root,
                                process_set=process_set)
            assert torch.equal(out, torch.full((2,), float(root)))
            assert hvd.broadcast_object(me, root_rank=root, process_set=process_set) == root
            assert hvd.allgather_object(me, process_set=process_set) == members
            hvd.barrier(process_set=process_set)
            with pytest.raises(kolo.ContractError, match="not a member"):
                hvd.broadcast(torch.ones(2), root_rank=1 if 1 not in members else 0,
                              process_set=process_set)
        else:
            with pytest.raises(kolo.ContractError, match="not part of"):
                process_set.rank()
            with pytest.raises(kolo.ContractError, match="not a member"):
                hvd.allreduce(torch.ones(2), process_set=process_set)
        with pytest.raises(kolo.ContractError, match="exists already"):
            hvd.add_process_set(list(members))
    finally:
        assert hvd.remove_process_set(process_set)
    assert process_set.process_set_id is None
    assert not hvd.remove_process_set(process_set)
    assert not hvd.remove_process_set(hvd.global_process_set)


def test_process_sets_given_to_init_exist_after_a_reinit(world):
    n = world.size()
    hvd.shutdown()
    assert not hvd.is_initialized()
    first = hvd.ProcessSet([0])
    everyone_but_first = hvd.ProcessSet(list(range(1, n)))
    hvd.init(process_sets=[first, everyone_but_first])
    try:
        assert first.process_set_id is not None and everyone_but_first.process_set_id is not None
        mine = first if world.rank() == 0 else everyone_but_first
        out = hvd.allreduce(torch.ones(2), op=hvd.Sum, process_set=mine)
        assert torch.equal(out, torch.full((2,), float(len(mine.ranks))))
    finally:
        hvd.remove_process_set(first)
        hvd.remove_process_set(everyone_but_first)
