"""kolo.run, Horovod's horovod.run: a script starts its own workers through
kolorun and gets their results back in rank order; a failing worker makes
the call raise; bad arguments are refused before anything starts."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

import kolo

HERE = Path(__file__).resolve().parent


@pytest.mark.parametrize("np", [1, 3])
def test_a_script_runs_its_function_on_np_workers(np):
    result = subprocess.run([sys.executable, str(HERE / "run_script.py"), str(np)],
                            capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "RUN OK" in result.stdout
    assert result.stdout.count("RUN OK") == 1  # the workers did not rerun the script's main


def _fails_on_rank_one():
    if os.environ["KOLO_RANK"] == "1":
        raise SystemExit(3)
    return 0


def test_a_failing_worker_raises():
    with pytest.raises(RuntimeError, match="kolorun exited with status"):
        kolo.run(_fails_on_rank_one, np=2)


def test_bad_arguments_are_refused():
    with pytest.raises(kolo.ContractError, match="np must be a positive int"):
        kolo.run(print, np=0)
    with pytest.raises(kolo.ContractError, match="hostfile not supported"):
        kolo.run(print, np=1, hostfile="hosts.txt")
    with pytest.raises(kolo.ContractError, match="callable"):
        kolo.run("train", np=1)
