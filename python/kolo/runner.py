"""kolo.run: Horovod's programmatic launcher (horovod.run) on kolorun.

``kolo.run(fn, args=(), kwargs=None, np=2)`` starts ``np`` workers with
kolorun, calls ``fn(*args, **kwargs)`` in each and returns the results as a
list in rank order, as ``horovod.run`` does. The function travels to the
workers pickled (cloudpickle when it is installed, so lambdas and closures
work; otherwise pickle, which names module-level functions: a function of
the launching script is found by loading that script in the worker under the
name ``__kolo_run__``, so its ``if __name__ == "__main__":`` block does not
run again). Each worker's return value comes back pickled on a marker line
of its standard output; every other line is passed through.
"""
import base64
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

from kolo._kolo import ContractError

try:  # optional: pickles lambdas, closures and functions of __main__ by value
    import cloudpickle as _pickler
except ImportError:  # pragma: no cover - depends on the environment
    _pickler = pickle

# Marker of a result line: "<marker> <rank> <base64 pickle>".
RESULT_MARKER = "__kolo_run_result__"
PAYLOAD_VARIABLE = "KOLO_RUN_PAYLOAD"
# A single environment string may hold 128 KiB on Linux (MAX_ARG_STRLEN).
_MAX_PAYLOAD_BYTES = 96 * 1024


def _kolorun():
    """kolorun's path: $KOLORUN, then PATH, then the build tree beside this package."""
    explicit = os.environ.get("KOLORUN")
    if explicit:
        return explicit
    found = shutil.which("kolorun")
    if found:
        return found
    # build/python/kolo/runner.py -> build/launcher/kolorun
    beside = Path(__file__).resolve().parents[2] / "launcher" / "kolorun"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    raise ContractError("kolo.run: kolorun was not found: put it on PATH or set KOLORUN to its "
                        "path (a build tree has it at build/launcher/kolorun)")


def _main_script():
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    return os.path.abspath(path) if path else None


def run(func, args=(), kwargs=None, np=1, min_np=None, max_np=None, slots=None, reset_limit=None,
        hosts=None, hostfile=None, start_timeout=None, ssh_port=None, ssh_identity_file=None,
        disable_cache=None, output_filename=None, verbose=None, use_gloo=None, use_mpi=None,
        mpi_args=None, network_interface=None, executable=None):
    """Runs ``func(*args, **kwargs)`` on ``np`` workers; returns their results, rank order.

    Horovod's signature. Supported: ``np``, ``hosts`` ("host:slots,..."),
    ``min_np`` / ``max_np`` / ``reset_limit`` (elastic, with ``hosts``),
    ``start_timeout`` (kolorun's --timeout, seconds), ``verbose``,
    ``use_gloo`` / ``use_mpi`` (the backend), ``executable`` (the worker's
    Python). Others raise ContractError rather than being ignored. A worker
    that fails makes the call raise RuntimeError with kolorun's exit status.
    """
    unsupported = {"slots": slots, "hostfile": hostfile, "ssh_port": ssh_port,
                   "ssh_identity_file": ssh_identity_file, "output_filename": output_filename,
                   "mpi_args": mpi_args, "network_interface": network_interface}
    given = [name for name, value in unsupported.items() if value is not None]
    if given:
        raise ContractError(f"kolo.run: {', '.join(given)} not supported; give hosts as "
                            "'host:slots,...' and run kolorun directly for its other options "
                            "(docs/kolorun.md)")
    if not callable(func):
        raise ContractError(f"kolo.run: func must be callable, got {type(func).__name__}")
    if isinstance(np, bool) or not isinstance(np, int) or np < 1:
        raise ContractError(f"kolo.run: np must be a positive int, got {np!r}")
    if use_gloo and use_mpi:
        raise ContractError("kolo.run: use_gloo and use_mpi contradict each other: give one")

    body = _pickler.dumps((func, tuple(args), dict(kwargs or {})),
                          protocol=pickle.HIGHEST_PROTOCOL)
    payload = base64.b64encode(pickle.dumps(
        {"body": body, "main": _main_script(), "sys_path": list(sys.path)},
        protocol=pickle.HIGHEST_PROTOCOL)).decode("ascii")
    if len(payload) > _MAX_PAYLOAD_BYTES:
        raise ContractError(
            f"kolo.run: the pickled function and arguments take {len(payload)} bytes, more than "
            f"the {_MAX_PAYLOAD_BYTES} an environment variable carries to the workers; pass "
            "large data as a file path and load it in the function")

    command = [_kolorun(), "-np", str(np)]
    if hosts:
        command += ["-H", hosts]
    if min_np is not None:
        command += ["--min-np", str(min_np)]
    if max_np is not None:
        command += ["--max-np", str(max_np)]
    if reset_limit is not None:
        command += ["--max-restarts", str(reset_limit)]
    if start_timeout is not None:
        command += ["--timeout", str(start_timeout)]
    if use_gloo:
        command += ["--backend", "gloo"]
    if use_mpi:
        command += ["--backend", "mpi"]
    if verbose:
        command += ["--verbose"]
    command += ["-x", f"{PAYLOAD_VARIABLE}={payload}",
                executable or sys.executable, "-m", "kolo._run_worker"]

    env = dict(os.environ)
    package_root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(
        [package_root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    results = {}
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env)
    for line in process.stdout:
        at = line.find(RESULT_MARKER + " ")
        if at < 0:
            sys.stdout.write(line)
            continue
        rank, encoded = line[at + len(RESULT_MARKER) + 1:].split()
        results[int(rank)] = pickle.loads(base64.b64decode(encoded))
    status = process.wait()
    if status != 0:
        raise RuntimeError(f"kolo.run: kolorun exited with status {status} (the workers' "
                           "output above says why)")
    missing = [rank for rank in range(len(results)) if rank not in results]
    if not results or missing:
        raise RuntimeError("kolo.run: kolorun succeeded but the results of ranks "
                           f"{missing or 'all'} did not come back")
    return [results[rank] for rank in sorted(results)]
