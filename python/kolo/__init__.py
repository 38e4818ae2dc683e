"""kolo: distributed deep-learning training on one C++ engine.

Python programs use Horovod's PyTorch API: ``import kolo.torch as hvd``
(docs/python.md). This package holds what every frontend shares: the error
types of docs/errors.md.

    kolo.Error                  base of everything kolo raises (a RuntimeError)
    kolo.ContractError          the program broke a rule (also a ValueError): fix it
    kolo.RuntimeFault           the world failed (a peer died, a timeout): recoverable
    kolo.TimeoutError           a RuntimeFault: an operation did not finish in time
    kolo.MembershipChanged      elastic: a newer world waits (raised by State.commit)
"""
# torch first: the extension links libtorch and converts torch.Tensor.
import torch as _torch  # noqa: F401

from kolo._kolo import (  # noqa: F401
    ContractError,
    Error,
    MembershipChanged,
    RuntimeFault,
    TimeoutError,
    __version__,
)

__all__ = ["Error", "ContractError", "RuntimeFault", "TimeoutError", "MembershipChanged"]
