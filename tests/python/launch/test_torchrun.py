"""kolo under the real torchrun of the environment's torch (>= 2.4, whose
agent serves a c10d TCPStore: TORCHELASTIC_USE_AGENT_STORE=True): the Python
example (``hvd.init()`` joins the agent's store by itself) and the C++
example (``kolo::init_torch()``), started as a PyTorch user starts DDP."""
import os
import re
import socket
import subprocess
import sys

import pytest
import torch

# torchrun's agent serves the store its workers join since PyTorch 2.4; an
# older torchrun (Debian's 1.13, the second stack) serves a store on
# MASTER_PORT that kolo's rank 0 would also have to serve.
pytestmark = pytest.mark.skipif(
    tuple(int(p) for p in torch.__version__.split(".")[:2]) < (2, 4),
    reason=f"torchrun's agent store needs PyTorch >= 2.4, this is {torch.__version__}")

KOLORUN = os.environ["KOLORUN"]
BUILD = os.path.dirname(os.path.dirname(KOLORUN))  # <build>/launcher/kolorun
SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..")
PYTHON_EXAMPLE = os.path.join(SOURCE, "examples", "python", "fashion_mnist.py")
CPP_EXAMPLE = os.path.join(BUILD, "examples", "fashion_mnist", "fashion_mnist")
# torchrun is torch.distributed.run's console script: the same module, run
# by this interpreter, is the torchrun of this environment.
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(args, timeout=300, env=None):
    # Static rendezvous on a free loopback port (torchrun's default 29500
    # may be taken by a concurrent run); one thread per worker, as kolorun.
    env = dict(os.environ, OMP_NUM_THREADS="1", **(env or {}))
    command = [*TORCHRUN, "--master-addr", "127.0.0.1", "--master-port", str(free_port()), *args]
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
    assert result.returncode == 0, " ".join(command) + "\n" + result.stdout + result.stderr
    return result.stdout + result.stderr


@pytest.mark.parametrize("workers", [2, 3])
def test_python_example_under_torchrun(workers):
    out = torchrun(["--nproc-per-node", str(workers), PYTHON_EXAMPLE, "--epochs", "1",
                    "--train-subset", "1536", "--test-subset", "600"])
    assert (f"Fashion-MNIST: {workers} worker(s), 1536 training images "
            f"({1536 // workers} per worker)") in out, out
    accuracies = [float(a) for a in re.findall(r"test accuracy ([0-9.]+)", out)]
    assert len(accuracies) == 1, out
    assert accuracies[0] > 0.4, out  # about 0.6 after 1 epoch of 1536 images


@pytest.mark.parametrize("workers", [2, 3])
def test_cpp_example_under_torchrun(workers):
    if not os.path.exists(CPP_EXAMPLE):
        pytest.fail(f"{CPP_EXAMPLE} was not built")
    out = torchrun(["--nproc-per-node", str(workers), "--no-python", CPP_EXAMPLE, "--epochs", "1",
                    "--train-subset", "1536", "--test-subset", "600", "--threads", "1"])
    assert f"Fashion-MNIST: {workers} worker(s) x 1 thread(s)" in out, out
    assert "launched by torchrun" in out, out
    accuracies = [float(a) for a in re.findall(r"test accuracy: ([0-9.]+)", out)]
    assert accuracies and accuracies[-1] > 0.4, out


def test_kolo_gloo_and_torch_distributed_gloo_in_one_process():
    worker = os.path.join(os.path.dirname(os.path.abspath(__file__)), "two_gloos_worker.py")
    out = torchrun(["--nproc-per-node", "2", worker], env={"KOLO_BACKEND": "gloo"})
    assert out.count("both Gloo users agree") == 2, out


def children_of(pid):
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(c) for c in f.read().split()]


def test_a_killed_worker_under_max_restarts_resumes_from_the_last_checkpoint(tmp_path):
    """torchrun --max-restarts 1: SIGKILL one of 2 workers after the first
    epoch's checkpoint; torchrun stops the other, starts the group again with
    the same command line, and --resume-if-present continues from that
    checkpoint instead of from the start."""
    if not os.path.exists(CPP_EXAMPLE):
        pytest.fail(f"{CPP_EXAMPLE} was not built")
    checkpoint = tmp_path / "checkpoint"
    command = [*TORCHRUN, "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
               "--nproc-per-node", "2", "--max-restarts", "1", "--no-python", CPP_EXAMPLE,
               "--epochs", "3", "--train-subset", "6000", "--test-subset", "600",
               "--threads", "1", "--checkpoint-dir", str(checkpoint), "--resume-if-present"]
    agent = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             env=dict(os.environ, OMP_NUM_THREADS="1"))
    lines, killed = [], None
    try:
        for line in agent.stdout:
            lines.append(line)
            if killed is None and line.startswith("Saved "):
                workers = [c for c in children_of(agent.pid)
                           if os.path.basename(os.readlink(f"/proc/{c}/exe")) == "fashion_mnist"]
                assert len(workers) == 2, (workers, "".join(lines))
                killed = workers[-1]
                os.kill(killed, 9)
        agent.wait(timeout=300)
    finally:
        if agent.poll() is None:
            agent.kill()
    out = "".join(lines)
    assert killed is not None, "no checkpoint was saved:\n" + out
    assert agent.returncode == 0, out
    resumed = re.findall(r"Resumed from .* after epoch (\d+)", out)
    assert resumed and int(resumed[0]) >= 1, out
    # The restarted group trained only the epochs after the checkpoint.
    accuracies = [float(a) for a in re.findall(r"test accuracy: ([0-9.]+)", out)]
    assert len(accuracies) == 3, out
    assert accuracies[-1] > 0.6, out
