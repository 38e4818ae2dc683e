"""Process sets, as Horovod's ``hvd.ProcessSet`` (horovod/common/process_sets.py).

A process set is a subset of the world's ranks that runs collectives on its
own. kolo's engine creates it (``Engine::add_process_set``, collective over
every world rank) and returns its id; this object remembers the id and the
ranks. Every set is dynamic: ``add_process_set`` works at any time after
``init()``, no ``HOROVOD_DYNAMIC_PROCESS_SETS`` needed.
"""
from kolo import _kolo
from kolo._kolo import ContractError


class ProcessSet:
    """A set of world ranks that run collectives together.

    Build it from a list of ranks, then pass it to ``init(process_sets=[...])``
    or ``add_process_set``. ``process_set_id`` is set once it exists in the
    engine (None before and after removal).
    """

    process_set_id = None
    ranks = None
    mpi_comm = None

    def __init__(self, ranks_or_comm):
        try:
            ranks = sorted(ranks_or_comm)
        except TypeError:
            raise ContractError(
                "kolo.torch.ProcessSet: expected a list of world ranks, got "
                f"{type(ranks_or_comm).__name__}; kolo builds process sets from rank lists "
                "(an mpi4py communicator is not supported)") from None
        if any(not isinstance(r, int) for r in ranks):
            raise ContractError(f"kolo.torch.ProcessSet: ranks must be integers, got {ranks}")
        self.ranks = ranks

    def _invalidate(self):
        self.process_set_id = None

    def size(self):
        """Number of ranks in the set, or None if it does not exist (yet)."""
        if self.process_set_id is None:
            return None
        return len(self.ranks)

    def rank(self):
        """This process's index in the set, or None if the set does not exist (yet).

        Collectives still take global ranks as roots (as in Horovod).
        """
        if self.process_set_id is None:
            return None
        me = _kolo.rank()
        if me not in self.ranks:
            raise ContractError(
                f"kolo.torch.ProcessSet.rank: rank {me} is not part of the process set "
                f"{self.ranks}")
        return self.ranks.index(me)

    def included(self):
        """Whether this process is in the set (None before the ranks are known)."""
        if self.ranks is None:
            return None
        return _kolo.rank() in self.ranks

    def __str__(self):
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks})"

    __repr__ = __str__


# All ranks: id 0. Its ranks are filled in by init().
global_process_set = ProcessSet([])
global_process_set.process_set_id = 0

# Sets that exist in the current runtime, by id (not the global one).
_added = {}


def add_process_set(process_set):
    """Creates a process set of the given ranks (a ProcessSet or a list) and returns it.

    Collective: every world rank calls it with the same ranks, in the same
    order as its other add/remove calls. A set with the same ranks as an
    existing one is a ContractError (Horovod: ValueError).
    """
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    if process_set.process_set_id is not None:
        raise ContractError(f"kolo.torch.add_process_set: {process_set} was already added")
    existing = [s for s in [global_process_set, *_added.values()] if s.ranks == process_set.ranks]
    if existing:
        raise ContractError(
            f"kolo.torch.add_process_set: a process set with ranks {process_set.ranks} exists "
            f"already ({existing[0]})")
    process_set.process_set_id = _kolo.add_process_set(process_set.ranks)
    _added[process_set.process_set_id] = process_set
    return process_set


def remove_process_set(process_set):
    """Removes a process set; returns whether it existed. Collective over every world rank."""
    process_set_id = process_set.process_set_id
    if process_set_id is None or process_set_id == 0 or process_set_id not in _added:
        return False
    _kolo.remove_process_set(process_set_id)
    del _added[process_set_id]
    process_set._invalidate()
    return True


def _set_id(process_set):
    """The engine's id of a ProcessSet argument."""
    if not isinstance(process_set, ProcessSet):
        raise ContractError(
            f"kolo.torch: process_set must be a kolo.torch.ProcessSet, got "
            f"{type(process_set).__name__}")
    if process_set.process_set_id is None:
        raise ContractError(
            f"kolo.torch: {process_set} does not exist; create it with "
            "kolo.torch.add_process_set() (or init(process_sets=[...])) on every rank first")
    return process_set.process_set_id


def _set_root(root_rank, process_set):
    """A global root rank as the rank of the set that kolo's engine takes."""
    if process_set.process_set_id == 0:
        return root_rank
    if root_rank not in process_set.ranks:
        raise ContractError(
            f"kolo.torch: root_rank {root_rank} is not a member of {process_set}; roots are "
            "global ranks of the set's members")
    return process_set.ranks.index(root_rank)


def _after_init():
    """A runtime started: the global set holds every rank."""
    global_process_set.ranks = list(range(_kolo.size()))


def _after_shutdown():
    """The runtime goes: the sets it created are gone with its engine."""
    for process_set in _added.values():
        process_set._invalidate()
    _added.clear()
    global_process_set.ranks = []
