#!/usr/bin/env python3
"""The Python workers of `kolo-bench scaling` (the torch of the build's KOLO_PYTHON).

Trains the same two models as the C++ workers (bench/scaling_models.h) and
prints one JSON line per rank: {"rank", "world", "threads", "batch",
"images_per_sec", "step_ms"}. Two systems:

  --system ddp    PyTorch DistributedDataParallel on the gloo backend
                  (the `pytorch_ddp` rows)
  --system kolo   kolo's Python frontend: hvd.DistributedOptimizer under
                  kolorun (the `kolo_python` rows), written as a Horovod
                  user writes it

The driver starts DDP's ranks with the interpreter's real torchrun (torch
>= 2.4; by hand with RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT for an
older one, whose agent fails under Python 3.11):

  .venv/bin/python -m torch.distributed.run --standalone --nproc-per-node 2 \
      bench/scaling_worker.py --model cnn

and kolo's by kolorun:

  PYTHONPATH=build/python build/launcher/kolorun -np 2 .venv/bin/python \
      bench/scaling_worker.py --system kolo --model cnn

Without WORLD_SIZE (or with 1) a ddp worker trains alone, with no process group.
"""
import argparse
import json
import os
import sys
import time

# The repository has a torch/ directory; never let it shadow the package.
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(
    os.path.dirname(os.path.abspath(__file__)))]

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

# The CNN and the data reader are the Python examples' (as the C++ workers
# use examples/fashion_mnist's).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "examples", "python"))
from fashion_mnist_common import Net as Cnn, fashion_mnist_uint8  # noqa: E402


class Mlp(nn.Module):
    """784-4096-4096-10."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(784, 4096)
        self.fc2 = nn.Linear(4096, 4096)
        self.fc3 = nn.Linear(4096, 10)

    def forward(self, x):
        x = x.flatten(1)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)



def emit(row):
    """One JSON line in a single write(2): the ranks share torchrun's (or
    kolorun's) stdout, and a line written in pieces could interleave with
    another rank's, which the driver could then not parse."""
    os.write(1, (json.dumps(row) + "\n").encode())

def load(args):
    if args.synthetic:
        torch.manual_seed(7)
        return (torch.randint(0, 256, (4096, 1, 28, 28), dtype=torch.uint8),
                torch.randint(0, 10, (4096,), dtype=torch.long))
    return fashion_mnist_uint8(args.data_dir, "train")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--system", choices=["ddp", "kolo"], default="ddp")
    parser.add_argument("--model", choices=["cnn", "mlp"], default="cnn")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--warmup-steps", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=None,
                        help="per rank (default 64 for the CNN, 16 for the MLP)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--bucket-bytes", type=int, default=-1,
                        help="kolo: DistributedOptimizer's bucket size; < 0 = kolo's default")
    parser.add_argument("--synthetic", action="store_true")
    parser.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    args = parser.parse_args()
    batch = args.batch_size or (64 if args.model == "cnn" else 16)

    torch.set_num_threads(args.threads)
    if args.system == "kolo":
        import kolo.torch as hvd
        hvd.init()
        rank, world = hvd.rank(), hvd.size()
    else:
        rank = int(os.environ.get("RANK", "0"))
        world = int(os.environ.get("WORLD_SIZE", "1"))
    images, labels = load(args)

    torch.manual_seed(42)
    model = Cnn() if args.model == "cnn" else Mlp()
    if args.system == "ddp" and world > 1:
        dist.init_process_group("gloo", rank=rank, world_size=world)
        model = nn.parallel.DistributedDataParallel(model)  # broadcasts rank 0's weights
    if args.model == "cnn":
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    else:
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    if args.system == "kolo":
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        bucket = None if args.bucket_bytes < 0 else args.bucket_bytes / (1024 * 1024)
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                             bucket_cap_mb=bucket)
    torch.manual_seed(1000 + rank)
    model.train()

    n = images.shape[0]
    step_index = 0

    def train_step():
        nonlocal step_index
        start = ((step_index * world + rank) * batch) % (n - batch)
        step_index += 1
        x = images[start:start + batch].float().div_(255.0)
        y = labels[start:start + batch]
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()  # DDP's reducer / kolo's hooks exchange buckets during backward
        optimizer.step()

    for _ in range(args.warmup_steps):
        train_step()
    if args.system == "ddp" and world > 1:
        dist.barrier()
    start = time.perf_counter()
    for _ in range(args.steps):
        train_step()
    elapsed = time.perf_counter() - start
    emit({"rank": rank, "world": world, "threads": args.threads, "batch": batch,
                      "images_per_sec": args.steps * batch / elapsed,
                      "step_ms": 1000.0 * elapsed / args.steps})
    if args.system == "ddp" and world > 1:
        dist.barrier()
        dist.destroy_process_group()
    if args.system == "kolo":
        hvd.shutdown()


if __name__ == "__main__":
    main()
