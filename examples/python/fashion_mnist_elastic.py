"""Fashion-MNIST, elastic: training goes on while workers die or join.

Horovod's elastic recipe (hvd.elastic.run, TorchState, ElasticSampler) with
kolo: run it under kolorun's elastic mode,

    PYTHONPATH=build/python build/launcher/kolorun -np 3 --min-np 2 .venv/bin/python \\
        examples/python/fashion_mnist_elastic.py --epochs 2

and kill a worker while it trains (kill -9 <pid>): the others re-form the
world from the last commit and finish the epochs; a worker that joins later
starts from rank 0's state at the next commit.
"""
import argparse
import os

import torch
import torch.nn.functional as F

import kolo.torch as hvd
from fashion_mnist_common import Net, fashion_mnist

parser = argparse.ArgumentParser(description="Fashion-MNIST, elastic, Horovod-style")
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--batch-size", type=int, default=64, help="per worker")
parser.add_argument("--lr", type=float, default=1e-3, help="Adam's rate for one worker")
parser.add_argument("--batches-per-commit", type=int, default=20)
parser.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
parser.add_argument("--train-subset", type=int, default=0, help="0 = all 60000 images")
args = parser.parse_args()

hvd.init()  # under kolorun's elastic mode: joins the first world
torch.manual_seed(42)
torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))

train_dataset = fashion_mnist(args.data_dir, "train", args.train_subset)
# ElasticSampler re-shards what is left of the epoch whenever the world changes.
train_sampler = hvd.elastic.ElasticSampler(train_dataset, shuffle=True, seed=42)
train_loader = torch.utils.data.DataLoader(train_dataset, batch_size=args.batch_size,
                                           sampler=train_sampler)

model = Net()
optimizer = torch.optim.Adam(model.parameters(), lr=args.lr * hvd.size())
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())


@hvd.elastic.run
def train(state):
    # Called again after every change of the world, from the last commit.
    while state.epoch < args.epochs:
        model.train()
        for batch_idx, (data, target) in enumerate(train_loader):
            optimizer.zero_grad()
            loss = F.cross_entropy(model(data), target)
            loss.backward()
            optimizer.step()
            train_sampler.record_batch(batch_idx, args.batch_size)
            state.batch += 1
            if state.batch % args.batches_per_commit == 0:
                state.commit()  # the point to return to; raises if workers wait to join
            if hvd.rank() == 0 and state.batch % 100 == 0:
                print(f"epoch {state.epoch} batch {state.batch}: {hvd.size()} worker(s), "
                      f"loss {loss.item():.4f}", flush=True)
        state.epoch += 1
        state.batch = 0
        train_sampler.set_epoch(state.epoch)
        state.commit()


def on_state_reset():
    # The world changed: the learning rate follows the number of workers.
    for param_group in optimizer.param_groups:
        param_group["lr"] = args.lr * hvd.size()
    if hvd.rank() == 0:
        print(f"world re-formed: {hvd.size()} worker(s)", flush=True)


state = hvd.elastic.TorchState(model, optimizer, train_sampler=train_sampler, epoch=0, batch=0)
state.register_reset_callbacks([on_state_reset])
train(state)
if hvd.rank() == 0:
    print(f"done: {args.epochs} epoch(s) with {hvd.size()} worker(s) at the end", flush=True)
