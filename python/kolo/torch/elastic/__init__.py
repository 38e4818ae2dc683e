"""Horovod's elastic API (horovod.torch.elastic) on kolo's elastic layer.

Run under ``kolorun -np 3 --min-np 2 python train.py``::

    hvd.init()                                   # joins the first world
    state = hvd.elastic.TorchState(model, optimizer, epoch=0, batch=0)
    state.register_reset_callbacks([on_reset])   # e.g. rescale the learning rate

    @hvd.elastic.run
    def train(state):
        for state.epoch in range(state.epoch, epochs):
            ...
            state.commit()                       # the point to return to

    train(state)

What is kolo's C++ (kolo/core/elastic.h, docs/elastic.md): commits,
restore, sync from rank 0, asking kolorun whether a newer world waits, and
the loop over worlds (leave on a RuntimeFault or MembershipChanged, join
the next world, restore, sync, reset callbacks, train again). What is
Python: turning models, optimizers, samplers and plain attributes into the
bytes a commit holds, and rebinding DistributedOptimizers to each world's
engine.
"""
import functools
import io
import pickle

import torch

from kolo import _kolo
from kolo._kolo import MembershipChanged, RuntimeFault
from kolo.torch import _lifecycle
from kolo.torch.mpi_ops import rank, size

# Horovod's names for the two interruptions elastic.run handles.
HorovodInternalError = RuntimeFault
HostsUpdatedInterrupt = MembershipChanged

__all__ = ["State", "ObjectState", "TorchState", "ElasticSampler", "run",
           "HorovodInternalError", "HostsUpdatedInterrupt"]


class State(_kolo.State):
    """Horovod's State on kolo::elastic::State.

    ``commit()`` snapshots the state and, inside run(), raises
    MembershipChanged (= HostsUpdatedInterrupt) on every member when kolorun
    has a newer world ready; ``restore()`` returns to the last commit;
    ``sync()`` gives every rank rank 0's state; ``epoch`` and ``batch`` are
    integers kept by every commit. Subclasses implement ``_serialize()`` ->
    bytes and ``_deserialize(bytes)``.
    """

    def __init__(self):
        _kolo.State.__init__(self)

    def register_reset_callbacks(self, callbacks):
        """Functions called after every change of the world, once the state is synced."""
        for callback in callbacks:
            self.on_reset(callback)

    def save(self):
        """Horovod's save(): commit() (outside run() it only snapshots)."""
        self.commit()

    def sync(self, root_rank=0):
        """Every rank takes root's current state (collective)."""
        _kolo.State.sync(self, root_rank)


class ObjectState(State):
    """State made of plain attributes, given as keyword arguments.

    ``epoch`` and ``batch`` are kept by kolo's State itself (integers); every
    other attribute is pickled at each commit. The constructor commits, so
    the state returns to its initial values after a fault before the first
    explicit commit (as Horovod's).
    """

    def __init__(self, bcast_object=None, get_rank=None, **kwargs):
        # bcast_object and get_rank: Horovod's internals, not needed here.
        State.__init__(self)
        for name in ("epoch", "batch"):
            if name in kwargs:
                setattr(self, name, int(kwargs.pop(name)))
        self._attributes = list(kwargs)
        for name, value in kwargs.items():
            setattr(self, name, value)
        if type(self) is ObjectState:
            self.commit()

    def _attribute_values(self):
        return {name: getattr(self, name) for name in self._attributes}

    def _set_attribute_values(self, values):
        for name, value in values.items():
            setattr(self, name, value)

    def _serialize(self):
        return pickle.dumps(self._attribute_values(), protocol=pickle.HIGHEST_PROTOCOL)

    def _deserialize(self, data):
        self._set_attribute_values(pickle.loads(data))


class TorchState(ObjectState):
    """Horovod's TorchState: a model, an optimizer and other attributes.

    Keyword arguments that are torch.nn.Modules, torch.optim.Optimizers
    (DistributedOptimizer included) or ElasticSamplers are kept through
    their state_dict(); restoring loads into the same objects in place, so
    references to their tensors stay valid. Others are attributes as in
    ObjectState.
    """

    def __init__(self, model=None, optimizer=None, **kwargs):
        kwargs.update(model=model, optimizer=optimizer)
        handled = {k: v for k, v in kwargs.items() if _has_state_dict(v)}
        plain = {k: v for k, v in kwargs.items() if k not in handled}
        object.__setattr__(self, "_handled", handled)
        ObjectState.__init__(self, **plain)
        for name, value in handled.items():
            object.__setattr__(self, name, value)
        self.commit()

    def __setattr__(self, name, value):
        handled = self.__dict__.get("_handled")
        if handled is not None and name in handled:
            handled[name] = value
        object.__setattr__(self, name, value)

    def _serialize(self):
        buffer = io.BytesIO()
        torch.save({"attributes": self._attribute_values(),
                    "state_dicts": {k: v.state_dict() for k, v in self._handled.items()}},
                   buffer)
        return buffer.getvalue()

    def _deserialize(self, data):
        saved = torch.load(io.BytesIO(data))
        self._set_attribute_values(saved["attributes"])
        for name, state_dict in saved["state_dicts"].items():
            self._handled[name].load_state_dict(state_dict)


def _has_state_dict(value):
    return isinstance(value, (torch.nn.Module, torch.optim.Optimizer, ElasticSampler))


class ElasticSampler(torch.utils.data.Sampler):
    """Horovod's ElasticSampler: shards a dataset among the ranks and, after a
    change of the world, shards only the samples not yet processed this epoch.

    Call ``record_batch(batch_idx, batch_size)`` after each batch and
    ``set_epoch(epoch)`` at the end of each epoch; keep it in a TorchState.
    The order is kolo's DistributedSampler's, i.e. that of
    torch.utils.data.DistributedSampler for the same seed (Horovod's uses
    Python's random.shuffle), padded to equal shards.
    """

    def __init__(self, dataset, shuffle=True, seed=0):
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.processed_num = 0
        self.reset()

    def set_epoch(self, epoch):
        """Selects the epoch's order and forgets what was processed."""
        self.epoch = epoch
        self.processed_num = 0
        self.reset()

    def record_batch(self, batch_idx, batch_size):
        """Counts a batch of `batch_size` samples processed by every rank."""
        self.processed_num += batch_size * self.num_replicas

    def state_dict(self):
        return {"epoch": self.epoch, "processed_num": self.processed_num}

    def load_state_dict(self, state_dict):
        self.epoch = state_dict["epoch"]
        self.processed_num = state_dict["processed_num"]
        self.reset()

    def reset(self):
        """Shards what is left of the epoch among the current world."""
        self.num_replicas = size() if _kolo.is_initialized() else 1
        self.rank = rank() if _kolo.is_initialized() else 0
        n = len(self.dataset)
        self._sampler = _kolo.DistributedSampler(n, self.rank, self.num_replicas, self.shuffle,
                                                 self.seed, False)
        self._sampler.set_epoch(self.epoch)
        self._sampler.set_epoch_start(min(self.processed_num, n))
        self.num_samples = len(self._sampler)

    def __iter__(self):
        return iter(self._sampler.indices())

    def __len__(self):
        return self.num_samples


def run(func):
    """Decorator: runs ``func(state, ...)`` elastically (Horovod's hvd.elastic.run).

    kolo::elastic::run calls it once per world: after a RuntimeFault (a peer
    died) or a MembershipChanged (workers joined, raised by commit()) it
    leaves the world, joins the next one, restores the last commit, syncs
    from rank 0, runs the reset callbacks and calls `func` again. A
    ContractError or any other exception propagates. Outside kolorun's
    elastic mode `func` runs once. Returns what `func` returns.
    """

    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        result = []

        def train():
            # DistributedOptimizers built outside run(), or for an earlier
            # world, are built on this world's engine first (collective,
            # every rank alike); process sets of an earlier world are gone.
            try:
                with _lifecycle.elastic_world():
                    result.append(func(state, *args, **kwargs))
            except (RuntimeFault, MembershipChanged):
                _lifecycle.stopping()  # the runtime goes next: unhook first
                raise

        _kolo.elastic_run(state, train)
        return result[-1]

    return wrapper
