"""Horovod's helper functions (horovod/torch/functions.py) on kolo's engine.

Pickling is Python's; moving the bytes, the structure checks and the
agreement on errors are kolo's C++ (kolo/torch/tensor.h, broadcast.h): a
rank that cannot load what root sent makes every rank raise ContractError
naming it, instead of leaving the others waiting.
"""
import io
import pickle

import torch

from kolo import _kolo
from kolo._kolo import ContractError
from kolo.torch.mpi_ops import rank
from kolo.torch.process_sets import _set_id, _set_root, global_process_set

try:  # Horovod pickles with cloudpickle (lambdas, local classes); plain pickle otherwise
    import cloudpickle as _pickler
except ImportError:  # pragma: no cover - depends on the machine
    _pickler = pickle


def _dumps(obj):
    return _pickler.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


def _error_text(error):
    return f"{type(error).__name__}: {error}"


def broadcast_parameters(params, root_rank):
    """Overwrites every tensor of `params` with root's, in place, on every rank.

    `params`: a dict (``model.state_dict()``: sorted by name, as Horovod), or
    an iterable of tensors or of (name, tensor) pairs
    (``model.named_parameters()``). Every rank first compares names, dtypes
    and shapes with root's; a difference is a ContractError on every rank.
    """
    if isinstance(params, dict):
        named = sorted(params.items())
    else:
        try:
            items = list(params)
        except TypeError:
            raise ContractError(
                f"kolo.torch.broadcast_parameters: invalid params of type {type(params).__name__}; "
                "pass model.state_dict(), model.named_parameters() or a list of tensors") from None
        named = [p if isinstance(p, tuple) else (str(i), p) for i, p in enumerate(items)]
    for name, tensor in named:
        if not isinstance(tensor, torch.Tensor):
            raise ContractError(
                f"kolo.torch.broadcast_parameters: '{name}' is a {type(tensor).__name__}, not a "
                "tensor")
    _kolo.broadcast_parameters([(str(n), t) for n, t in named], root_rank, 0)


def broadcast_optimizer_state(optimizer, root_rank, model=None):
    """Makes every rank's optimizer state and options (lr, momentum, ...) equal to root's.

    Root's ``optimizer.state_dict()`` is serialised with torch.save and loaded
    on the others with ``load_state_dict``, so the state is bitwise root's,
    including state root created lazily (Adam's moments after the first
    step) and state Horovod cannot send (LBFGS). No optimizer step is taken.
    A different optimizer class or parameter groups on some rank is a
    ContractError on every rank. `model` is accepted for Horovod's signature
    and not needed.
    """
    kind = type(optimizer).__name__

    def produce():
        buffer = io.BytesIO()
        torch.save({"type": kind, "state_dict": optimizer.state_dict()}, buffer)
        return buffer.getvalue()

    payload = _kolo.broadcast_from_root(produce, root_rank, "broadcast_optimizer_state", 0)
    error = ""
    if rank() != root_rank:
        try:
            loaded = torch.load(io.BytesIO(payload))
            if loaded["type"] != kind:
                raise ContractError(
                    f"root rank {root_rank} has a {loaded['type']} optimizer, this rank a {kind}")
            optimizer.load_state_dict(loaded["state_dict"])
        except Exception as e:  # noqa: BLE001 - every failure is reported to every rank
            error = _error_text(e)
    _kolo.agree_on_outcome(error, "kolo.torch.broadcast_optimizer_state",
                           "broadcast_optimizer_state.check", 0)


def broadcast_object(obj, root_rank=0, name=None, process_set=global_process_set):
    """Returns root's `obj` on every rank (pickled; root gets its own `obj` back).

    A failure to pickle on root or to unpickle on any rank raises on every
    rank of the set.
    """
    if name is None:
        name = type(obj).__name__
    set_id = _set_id(process_set)
    root = _set_root(root_rank, process_set)
    payload = _kolo.broadcast_from_root(lambda: _dumps(obj), root, name, set_id)
    error = ""
    result = obj
    if rank() != root_rank:
        try:
            result = pickle.loads(payload)
        except Exception as e:  # noqa: BLE001
            error = _error_text(e)
    _kolo.agree_on_outcome(error, "kolo.torch.broadcast_object", name + ".check", set_id)
    return result


def allgather_object(obj, name=None, process_set=global_process_set):
    """Returns the list of every rank's `obj` (pickled), in rank order of the set."""
    if name is None:
        name = type(obj).__name__
    set_id = _set_id(process_set)
    try:
        mine = _dumps(obj)
        error = ""
    except Exception as e:  # noqa: BLE001
        mine, error = b"", _error_text(e)
    _kolo.agree_on_outcome(error, "kolo.torch.allgather_object", name + ".pickle", set_id)
    gathered = _kolo.allgather_bytes(mine, name, set_id)
    result, error = [], ""
    try:
        result = [pickle.loads(b) for b in gathered]
    except Exception as e:  # noqa: BLE001
        error = _error_text(e)
    _kolo.agree_on_outcome(error, "kolo.torch.allgather_object", name + ".check", set_id)
    return result
