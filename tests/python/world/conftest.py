"""The world tier of kolo.torch's tests: every rank of ``kolorun -np N`` runs
this same pytest session (tests/CMakeLists.txt registers N = 2 and 3), so
every test must make the same collective calls on every rank, in the same
order. Expected values are computed here from what each rank contributed,
never by kolo.

A test that fails on one rank between two collectives leaves the others
waiting: KOLO_STALL_SHUTDOWN_SECONDS (set by ctest) then fails the stuck
request on every rank instead of letting the run hang.
"""
import pytest
import torch

import kolo.torch as hvd

DTYPES = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
          torch.float16, torch.bfloat16, torch.float32, torch.float64]
FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]


@pytest.fixture(scope="session")
def world():
    """kolo.torch, initialised once for the session (rank and size from kolorun)."""
    torch.manual_seed(0)
    hvd.init()
    yield hvd
    hvd.shutdown()


def contribution(rank, shape, dtype, low=1, span=3):
    """What `rank` contributes: small integers, exact in every dtype, that
    differ per rank and per element (low .. low + span, plus rank % 2)."""
    numel = 1
    for d in shape:
        numel *= d
    if dtype == torch.bool:  # a pattern that differs per rank
        return ((torch.arange(numel) + rank) % 2 == 0).reshape(shape)
    values = torch.arange(numel, dtype=torch.float64) % span + low + (rank % 2)
    return values.reshape(shape).to(dtype)


def tolerance(dtype):
    """(rtol, atol) for a result computed in float64 and rounded to `dtype`."""
    return {torch.float16: (2e-3, 1e-3), torch.bfloat16: (1e-2, 1e-2),
            torch.float32: (1e-6, 1e-6), torch.float64: (1e-12, 1e-12)}.get(dtype, (0, 0))


def assert_matches(actual, expected):
    """Same dtype and shape; equal (integers) or close within the dtype's rounding."""
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    rtol, atol = tolerance(expected.dtype)
    if rtol == 0:
        assert torch.equal(actual, expected), (actual, expected)
    else:
        torch.testing.assert_close(actual.double(), expected.double(), rtol=rtol, atol=atol)


def truncate(x):
    """How kolo stores a scaled integer, as Horovod does (kolo/core/dtype.h):
    toward zero."""
    return torch.trunc(x)
