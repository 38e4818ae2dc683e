"""Objects bound to one runtime's engine, across init, shutdown and elastic rounds.

A DistributedOptimizer's C++ gradient pipeline belongs to the engine it was
built on; shutdown() destroys that engine, and every elastic round builds a
new one. Such objects register here and implement

    _kolo_unbind()   the runtime is about to go: remove hooks, drop C++ state

and build their C++ state again themselves at their first use in a new
runtime (compare their generation() with the current one). Not here at
init(): which objects are still alive differs between ranks (a failed test's
traceback keeps its optimizer alive on the rank that failed, a reference
cycle lives until the next collection), and a collective construction made
by one rank only would stall the others. The first use is the same on every
rank that trains with the object.

Under kolorun's elastic mode, objects built outside ``elastic.run`` bind
inside it instead: a worker that joins a running job builds its objects
before run() while the others are in run()'s sync of the state, and
collective construction there would wait for ranks that wait for it
(Horovod's rule: no collectives outside the elastic function).
"""
import contextlib
import weakref

from kolo import _kolo
from kolo.torch import process_sets

_bound = []
_generation = None  # the runtime the objects and process sets belong to
_in_elastic_run = False  # inside elastic.run's function


def register(obj):
    _bound.append(weakref.ref(obj))


def _live():
    alive = [ref() for ref in _bound]
    _bound[:] = [ref for ref, obj in zip(_bound, alive) if obj is not None]
    return [obj for obj in alive if obj is not None]


def generation():
    """Identifies the current runtime (see kolo/_kolo: runtime_generation)."""
    return _kolo.runtime_generation()


def binding_deferred():
    """Whether objects built now wait for elastic.run to bind them."""
    return not _in_elastic_run and _kolo.elastic_mode()


def sync_with_runtime():
    """Call when a runtime may have started (init(), each elastic world): if it
    is a new one, process sets of the old one are gone (registered objects
    rebind at their first use)."""
    global _generation
    current = generation()
    if current != _generation:
        _generation = current
        process_sets._after_shutdown()
        process_sets._after_init()


@contextlib.contextmanager
def elastic_world():
    """Inside elastic.run's function: objects bind as they are built or used."""
    global _in_elastic_run
    _in_elastic_run = True
    try:
        sync_with_runtime()
        yield
    finally:
        _in_elastic_run = False


def stopping():
    """The runtime is about to shut down (shutdown(), or leaving an elastic round)."""
    for obj in _live():
        obj._kolo_unbind()
    process_sets._after_shutdown()
