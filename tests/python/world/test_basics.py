"""init, placement and what was compiled in."""
import os

import kolo.torch as hvd


def test_rank_and_size_come_from_kolorun(world):
    assert world.is_initialized()
    assert world.size() == int(os.environ["KOLO_SIZE"])
    assert world.rank() == int(os.environ["KOLO_RANK"])
    # One host: every rank is local, one host, the same number on each.
    assert world.local_size() == world.size()
    assert world.local_rank() == world.rank()
    assert (world.cross_rank(), world.cross_size()) == (0, 1)
    assert world.is_homogeneous()


def test_backend_and_flags(world):
    assert world.backend() == "shm"  # kolo's default on one host
    assert not world.mpi_enabled() and not world.gloo_enabled()
    assert world.global_process_set.ranks == list(range(world.size()))
    assert world.global_process_set.size() == world.size()
    assert world.global_process_set.rank() == world.rank()


def test_init_again_does_nothing(world):
    rank = world.rank()
    world.init()
    assert world.rank() == rank


def test_timeline_cannot_start_later(world):
    try:
        world.start_timeline("/tmp/x.json")
    except hvd.ContractError as e:
        assert "KOLO_TIMELINE" in str(e)
    else:
        raise AssertionError("start_timeline did not raise")
