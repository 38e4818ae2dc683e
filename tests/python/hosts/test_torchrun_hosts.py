"""kolo under the real torchrun across two test hosts (scripts/test_hosts.sh:
network namespaces with their own names, addresses and sshd): one torchrun
agent per host, reached by ssh as a cluster user reaches a node, joining an
elastic rendezvous (``--rdzv-backend c10d --nnodes 1:2``) at the first host.
kolo's workers join torchrun's agent store and, their ranks spanning two
hosts, run the hierarchical backend (shm in each host, gloo between them).
ctest's fixture ``test_hosts`` brings the hosts up (as root) before this runs.
"""
import os
import re
import shlex
import socket
import subprocess
import sys
import uuid

import pytest
import torch

pytestmark = pytest.mark.skipif(
    tuple(int(p) for p in torch.__version__.split(".")[:2]) < (2, 4),
    reason=f"torchrun's agent store needs PyTorch >= 2.4, this is {torch.__version__}")

STATE = "/run/kolo-hosts/env"
KOLORUN = os.environ["KOLORUN"]
BUILD = os.path.dirname(os.path.dirname(KOLORUN))  # <build>/launcher/kolorun
SOURCE = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".."))
PYTHON_EXAMPLE = os.path.join(SOURCE, "examples", "python", "fashion_mnist.py")
CPP_EXAMPLE = os.path.join(BUILD, "examples", "fashion_mnist", "fashion_mnist")


def up_test_hosts(count):
    """The names and ssh command of the test hosts, or a skip saying why."""
    if not os.path.exists(STATE):
        pytest.skip(f"the test hosts are down ({STATE} is missing): run as root under ctest, "
                    "or scripts/test_hosts.sh up 2 first")
    env = {}
    with open(STATE) as f:
        for line in f:
            name, _, value = line.strip().partition("=")
            env[name] = " ".join(shlex.split(value))
    names = env["KOLO_TEST_HOSTS"].split(",")
    if len(names) < count:
        pytest.skip(f"{count} test hosts needed, {len(names)} are up")
    return names[:count], shlex.split(env["KOLO_TEST_SSH"])


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun_on_hosts(worker_argv, timeout=400):
    """Starts one torchrun agent (1 worker) on each of two hosts by ssh,
    waits for both; returns their outputs."""
    hosts, ssh = up_test_hosts(2)
    port, rdzv_id = free_port(), uuid.uuid4().hex[:12]
    env = {"OMP_NUM_THREADS": "1", "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
           "PYTHONDONTWRITEBYTECODE": "1", "KOLO_STALL_SHUTDOWN_SECONDS": "60"}
    agents = []
    for host in hosts:
        remote = ["cd", shlex.quote(SOURCE), "&&", "env",
                  *(f"{k}={shlex.quote(v)}" for k, v in env.items()),
                  shlex.quote(sys.executable), "-m", "torch.distributed.run",
                  "--nnodes", "1:2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
                  "--rdzv-endpoint", f"{hosts[0]}:{port}", "--rdzv-id", rdzv_id,
                  *(shlex.quote(a) for a in worker_argv)]
        agents.append(subprocess.Popen([*ssh, host, " ".join(remote)], stdout=subprocess.PIPE,
                                       stderr=subprocess.STDOUT, text=True))
    outputs = []
    try:
        for agent in agents:
            out, _ = agent.communicate(timeout=timeout)
            outputs.append(out)
    finally:
        for agent in agents:
            if agent.poll() is None:
                agent.kill()
    for host, agent, out in zip(hosts, agents, outputs):
        assert agent.returncode == 0, f"torchrun on {host} exited {agent.returncode}:\n{out}"
    return outputs


def test_python_example_across_two_hosts_under_torchrun_c10d_rendezvous():
    outs = torchrun_on_hosts([PYTHON_EXAMPLE, "--epochs", "1", "--train-subset", "1536",
                              "--test-subset", "600"])
    out = "\n".join(outs)
    assert "Fashion-MNIST: 2 worker(s), 1536 training images (768 per worker)" in out, out
    accuracies = [float(a) for a in re.findall(r"test accuracy ([0-9.]+)", out)]
    assert len(accuracies) == 1, out
    assert accuracies[0] > 0.4, out


def test_cpp_example_across_two_hosts_under_torchrun_c10d_rendezvous():
    if not os.path.exists(CPP_EXAMPLE):
        pytest.fail(f"{CPP_EXAMPLE} was not built")
    outs = torchrun_on_hosts(["--no-python", CPP_EXAMPLE, "--epochs", "1", "--train-subset",
                              "1536", "--test-subset", "600", "--threads", "1"])
    out = "\n".join(outs)
    assert "Fashion-MNIST: 2 worker(s) x 1 thread(s)" in out, out
    assert "launched by torchrun" in out, out
    accuracies = [float(a) for a in re.findall(r"test accuracy: ([0-9.]+)", out)]
    assert accuracies and accuracies[-1] > 0.4, out
