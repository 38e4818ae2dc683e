"""Elastic training of a Horovod-style script under kolorun: one of 3
workers is SIGKILLed mid-epoch, the other two re-form the world and finish."""
import collections
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
KOLORUN = os.environ["KOLORUN"]
EPOCHS, SAMPLES, BATCH, COMMIT_EVERY = 3, 96, 4, 3


def run_kolorun(args, timeout=240):
    return subprocess.run([KOLORUN, *args],
                          capture_output=True, text=True, timeout=timeout)


def journal_steps(directory):
    steps = collections.defaultdict(list)  # worker id -> [(epoch, batch, round, size, samples)]
    done = set()
    for name in os.listdir(directory):
        worker = int(name[len("worker"):])
        with open(os.path.join(directory, name)) as f:
            for line in f:
                parts = line.split()
                if parts[0] == "done":
                    done.add(worker)
                elif parts[0] == "step":
                    epoch, batch, rnd, size, _ = (int(p) for p in parts[1:6])
                    samples = [int(s) for s in parts[6].split(",")] if len(parts) > 6 else []
                    steps[worker].append((epoch, batch, rnd, size, samples))
    return steps, done


def test_one_of_three_workers_killed_mid_epoch_training_completes():
    with tempfile.TemporaryDirectory(prefix="kolo-python-elastic-") as journal:
        result = run_kolorun(["-np", "3", "--min-np", "2", "--cooldown", "60",
                              sys.executable, os.path.join(HERE, "elastic_worker.py"),
                              "--epochs", str(EPOCHS), "--samples", str(SAMPLES),
                              "--batch", str(BATCH), "--commit-every", str(COMMIT_EVERY),
                              "--kill", "2@10", "--journal", journal])
        assert result.returncode == 0, result.stdout + result.stderr
        assert "round 1: 3 workers" in result.stderr, result.stderr
        assert "killed by signal 9" in result.stderr, result.stderr
        assert "round 2: 2 workers (ids 0,1)" in result.stderr, result.stderr
        assert "final_w=" in result.stdout, result.stdout

        steps, done = journal_steps(journal)
        assert done == {0, 1}, "the survivors finished, the killed worker did not"
        # Every sample of every epoch was trained on, across both worlds.
        for epoch in range(EPOCHS):
            seen = {s for worker in steps.values() for (e, _, _, _, samples) in worker
                    if e == epoch for s in samples}
            assert seen == set(range(SAMPLES)), f"epoch {epoch} missed {set(range(SAMPLES)) - seen}"
        # The survivors trained in a world of 3, then in one of 2.
        sizes = {size for (_, _, _, size, _) in steps[0]}
        assert sizes == {3, 2}, sizes
        # Steps redone after the fault: at most the commit interval.
        runs = collections.Counter((e, b, r) for (e, b, r, _, _) in steps[0])
        redone = len({(e, b) for (e, b, r) in runs}) - len(runs)
        assert -redone <= COMMIT_EVERY, runs


def test_a_worker_offered_by_discovery_joins_a_running_job():
    with tempfile.TemporaryDirectory(prefix="kolo-python-elastic-") as journal:
        hosts = os.path.join(journal, "hosts")
        with open(hosts, "w") as f:
            f.write("localhost:2\n")
        discover = os.path.join(journal, "discover.sh")
        with open(discover, "w") as f:
            f.write(f"#!/bin/sh\ncat {hosts}\n")
        os.chmod(discover, 0o755)
        records = os.path.join(journal, "records")
        os.mkdir(records)
        # Rank 0 offers a third slot before step 4; the two keep training
        # until the newcomer (a fresh Python process) is in the world.
        result = run_kolorun(["--host-discovery-script", discover, "--discovery-interval", "0.05",
                              "--min-np", "2", "--max-np", "3",
                              sys.executable, os.path.join(HERE, "elastic_worker.py"),
                              "--epochs", "1", "--samples", str(SAMPLES), "--batch", str(BATCH),
                              "--commit-every", str(COMMIT_EVERY), "--step-ms", "20",
                              "--grow", f"{hosts}@4@localhost:3", "--until-size", "3",
                              "--journal", records])
        assert result.returncode == 0, result.stdout + result.stderr
        assert "round 1: 2 workers" in result.stderr, result.stderr
        assert "round 2: 3 workers (ids 0,1,2); workers joining" in result.stderr, result.stderr
        steps, done = journal_steps(records)
        assert done == {0, 1, 2}
        # The newcomer trained in the world of 3 (at least one whole epoch of
        # 8 steps), from the state it received.
        assert len(steps[2]) >= SAMPLES // (3 * BATCH), steps[2]
        assert all(size == 3 for (_, _, _, size, _) in steps[2]), steps[2]
        assert {size for (_, _, _, size, _) in steps[0]} == {2, 3}
