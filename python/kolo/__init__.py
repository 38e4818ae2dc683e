"""kolo: distributed deep-learning training on one C++ engine.

Python programs use Horovod's PyTorch API: ``import kolo.torch as hvd``
(docs/python.md). This package holds what every frontend shares: the error
types of docs/errors.md.

    kolo.Error                  base of everything kolo raises (a RuntimeError)
    kolo.ContractError          the program broke a rule (also a ValueError): fix it
    kolo.RuntimeFault           the world failed (a peer died, a timeout): recoverable
    kolo.TimeoutError           a RuntimeFault: an operation did not finish in time
    kolo.MembershipChanged      elastic: a newer world waits (raised by State.commit)

and ``kolo.run(fn, args, np=N)``, Horovod's ``horovod.run`` on kolorun.
"""
# torch first: the extension links libtorch and converts torch.Tensor. It
# links the libtorch of one torch version: under another one it would fail to
# load, or load and crash, so that is refused here, naming both.
import torch as _torch

from kolo import _build

if _torch.__version__.split("+")[0] != _build.torch_version:
    raise ImportError(
        "kolo %s was built against torch %s, but this Python imports torch %s (%s): "
        "rebuild kolo against this torch (pip install . in kolo's source tree, or "
        "cmake -DKOLO_PYTHON=%s), or use the environment it was built for"
        % (_build.kolo_version, _build.torch_version, _torch.__version__,
           _torch.__file__, __import__("sys").executable)
    )

from kolo._kolo import (  # noqa: F401
    ContractError,
    Error,
    MembershipChanged,
    RuntimeFault,
    TimeoutError,
    __version__,
)

from kolo.runner import run  # noqa: E402 (after the version check)

__all__ = ["Error", "ContractError", "RuntimeFault", "TimeoutError", "MembershipChanged", "run"]
