"""Fashion-MNIST with the seed's Keras-style CNN, data-parallel with Horovod's API.

This is a Horovod PyTorch training script: the import line is the only
thing that says kolo. Run it on 2 local workers with the interpreter kolo
was built for (the project's .venv), under kolorun or torchrun:

    PYTHONPATH=build/python build/launcher/kolorun -np 2 .venv/bin/python \\
        examples/python/fashion_mnist.py --epochs 2
    PYTHONPATH=build/python .venv/bin/torchrun --nproc-per-node 2 \\
        examples/python/fashion_mnist.py --epochs 2

The data are Debian's dataset-fashion-mnist files
(/usr/share/datasets/fashion-mnist). Every worker trains on its shard of
them (DistributedSampler); DistributedOptimizer averages the gradients over
the workers while backward() runs, so all of them keep the same weights and
together train one model on a global batch of workers x --batch-size images.
"""
import argparse
import os
import time

import torch
import torch.nn.functional as F
import torch.utils.data.distributed

import kolo.torch as hvd
from fashion_mnist_common import Net, fashion_mnist

parser = argparse.ArgumentParser(description="Fashion-MNIST, Horovod-style")
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--batch-size", type=int, default=64, help="per worker")
parser.add_argument("--test-batch-size", type=int, default=100)
parser.add_argument("--lr", type=float, default=1e-3, help="Adam's rate for one worker")
parser.add_argument("--seed", type=int, default=42)
parser.add_argument("--log-interval", type=int, default=100, help="batches between log lines")
parser.add_argument("--fp16-allreduce", action="store_true", help="fp16 gradients on the wire")
parser.add_argument("--use-adasum", action="store_true", help="Adasum instead of averaging")
parser.add_argument("--gradient-predivide-factor", type=float, default=1.0)
parser.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
parser.add_argument("--train-subset", type=int, default=0, help="0 = all 60000 images")
parser.add_argument("--test-subset", type=int, default=0, help="0 = all 10000 images")


def metric_average(value, name):
    return hvd.allreduce(torch.tensor(value), name=name).item()


def train(epoch):
    model.train()
    train_sampler.set_epoch(epoch)  # a new shuffle, the same on every worker
    loss_sum, correct, seen = 0.0, 0, 0
    start = time.perf_counter()
    for batch_idx, (data, target) in enumerate(train_loader):
        optimizer.zero_grad()
        output = model(data)
        loss = F.cross_entropy(output, target)
        loss.backward()  # the gradients' allreduces start while backward runs
        optimizer.step()  # waits for the averaged gradients, then steps Adam
        loss_sum += loss.item() * len(data)
        correct += output.argmax(1).eq(target).sum().item()
        seen += len(data)
        if batch_idx % args.log_interval == 0 and hvd.rank() == 0:
            print(f"Train Epoch: {epoch} [{batch_idx * len(data)}/{len(train_sampler)} "
                  f"({100.0 * batch_idx / len(train_loader):.0f}%)]\tLoss: {loss.item():.6f}",
                  flush=True)
    seconds = time.perf_counter() - start
    images_per_sec = metric_average(float(seen), "images") * hvd.size() / seconds
    return (metric_average(loss_sum / seen, "train_loss"),
            metric_average(correct / seen, "train_accuracy"), seconds, images_per_sec)


def test():
    model.eval()
    loss_sum, correct = 0.0, 0
    with torch.no_grad():
        for data, target in test_loader:
            output = model(data)
            loss_sum += F.cross_entropy(output, target, reduction="sum").item()
            correct += output.argmax(1).eq(target).sum().item()
    # Each worker tested its shard: average over the workers.
    return (metric_average(loss_sum / len(test_sampler), "avg_loss"),
            metric_average(correct / len(test_sampler), "avg_accuracy"))


if __name__ == "__main__":
    args = parser.parse_args()

    # Horovod: initialize the library, and one thread per worker unless the
    # launcher says otherwise (kolorun divides the cores among the workers).
    hvd.init()
    torch.manual_seed(args.seed)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))

    # Horovod: each worker reads the files and trains on its own shard.
    train_dataset = fashion_mnist(args.data_dir, "train", args.train_subset)
    train_sampler = torch.utils.data.distributed.DistributedSampler(
        train_dataset, num_replicas=hvd.size(), rank=hvd.rank(), seed=args.seed)
    train_loader = torch.utils.data.DataLoader(train_dataset, batch_size=args.batch_size,
                                               sampler=train_sampler)
    test_dataset = fashion_mnist(args.data_dir, "t10k", args.test_subset)
    test_sampler = torch.utils.data.distributed.DistributedSampler(
        test_dataset, num_replicas=hvd.size(), rank=hvd.rank(), shuffle=False)
    test_loader = torch.utils.data.DataLoader(test_dataset, batch_size=args.test_batch_size,
                                              sampler=test_sampler)

    model = Net()

    # Horovod: scale the learning rate by the number of workers (the global
    # batch is that much larger); Adasum does not need it.
    lr_scaler = 1 if args.use_adasum else hvd.size()
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr * lr_scaler)

    # Horovod: start every worker from rank 0's weights and optimizer state.
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    # Horovod: wrap the optimizer to average the gradients over the workers.
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=compression,
                                         op=hvd.Adasum if args.use_adasum else hvd.Average,
                                         gradient_predivide_factor=args.gradient_predivide_factor)

    # Dropout masks differ per worker (the weights are already identical).
    torch.manual_seed(args.seed + 1000003 * (hvd.rank() + 1))
    if hvd.rank() == 0:
        print(f"Fashion-MNIST: {hvd.size()} worker(s), {len(train_dataset)} training images "
              f"({len(train_sampler)} per worker), batch {args.batch_size} per worker", flush=True)
    for epoch in range(1, args.epochs + 1):
        train_loss, train_accuracy, seconds, images_per_sec = train(epoch)
        test_loss, test_accuracy = test()
        if hvd.rank() == 0:
            print(f"Epoch {epoch}: {seconds:.1f} s, {images_per_sec:.1f} images/sec, "
                  f"train loss {train_loss:.4f}, train accuracy {train_accuracy:.4f}, "
                  f"test loss {test_loss:.4f}, test accuracy {test_accuracy:.4f}", flush=True)
