"""The worker side of kolo.run (kolo/runner.py): unpickles the function from
$KOLO_RUN_PAYLOAD, calls it and prints its pickled result on a marker line."""
import base64
import os
import pickle
import runpy
import sys
import types


def _load_main(path):
    # pickle names functions of the launching script as __main__.<name>; the
    # script is loaded as a module under another name, so that its
    # `if __name__ == "__main__":` block (which called kolo.run) does not run.
    namespace = runpy.run_path(path, run_name="__kolo_run__")
    module = types.ModuleType("__main__")
    module.__dict__.update(namespace)
    sys.modules["__main__"] = module


def main():
    outer = pickle.loads(base64.b64decode(os.environ.pop("KOLO_RUN_PAYLOAD")))
    for entry in reversed(outer["sys_path"]):
        if entry not in sys.path:
            sys.path.insert(0, entry)
    body = outer["body"]
    try:
        func, args, kwargs = pickle.loads(body)
    except (AttributeError, ImportError):
        if not outer["main"]:
            raise
        _load_main(outer["main"])
        func, args, kwargs = pickle.loads(body)
    result = func(*args, **kwargs)
    rank = int(os.environ.get("KOLO_RANK", "0"))
    try:
        import kolo.torch as hvd
        if hvd.is_initialized():
            rank = hvd.rank()  # elastic rounds renumber the workers
    except ImportError:  # pragma: no cover
        pass
    encoded = base64.b64encode(pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL))
    sys.stdout.flush()
    sys.stdout.write(f"__kolo_run_result__ {rank} {encoded.decode('ascii')}\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
