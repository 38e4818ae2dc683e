"""Objects bound to one runtime's engine, across init, shutdown and elastic rounds.

A DistributedOptimizer's C++ gradient pipeline belongs to the engine it was
built on; shutdown() destroys that engine, and every elastic round builds a
new one. Such objects register here and implement two methods:

    _kolo_unbind()   the runtime is about to go: remove hooks, drop C++ state
    _kolo_rebind()   a new runtime runs: build them again (collective)

Rebinding happens in creation order, which is the same on every rank, so
the collective checks inside line up.
"""
import weakref

from kolo import _kolo
from kolo.torch import process_sets

_bound = []
_generation = None  # the runtime the objects and process sets belong to


def register(obj):
    _bound.append(weakref.ref(obj))


def _live():
    alive = [ref() for ref in _bound]
    _bound[:] = [ref for ref, obj in zip(_bound, alive) if obj is not None]
    return [obj for obj in alive if obj is not None]


def generation():
    """Identifies the current runtime (see kolo/_kolo: runtime_generation)."""
    return _kolo.runtime_generation()


def sync_with_runtime():
    """Call when a runtime may have started (init(), each elastic round): if it
    is a new one, process sets of the old one are gone and bound objects are
    rebuilt on the new engine (collective: every rank calls this alike)."""
    global _generation
    current = generation()
    if current == _generation:
        return
    _generation = current
    process_sets._after_shutdown()
    process_sets._after_init()
    for obj in _live():
        obj._kolo_rebind()


def stopping():
    """The runtime is about to shut down (shutdown(), or leaving an elastic round)."""
    for obj in _live():
        obj._kolo_unbind()
    process_sets._after_shutdown()
