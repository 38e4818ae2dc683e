"""A script that launches its own workers with kolo.run, as Horovod's
examples do with horovod.run: `train` is a function of this script, found
by the workers without re-running the block below."""
import sys

import torch

import kolo
import kolo.torch as hvd


def train(scale, offset=0):
    hvd.init()
    total = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum).item()
    return {"rank": hvd.rank(), "size": hvd.size(), "value": total * scale + offset}


if __name__ == "__main__":
    np = int(sys.argv[1])
    results = kolo.run(train, args=(2.0,), kwargs={"offset": 1}, np=np)
    print("RESULTS", results)
    expected_total = np * (np + 1) / 2
    assert results == [{"rank": r, "size": np, "value": expected_total * 2.0 + 1}
                       for r in range(np)], results
    print("RUN OK")
