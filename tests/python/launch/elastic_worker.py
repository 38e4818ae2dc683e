"""A Horovod-style elastic training script, run by test_elastic.py under
``kolorun -np 3 --min-np 2``: linear regression on deterministic data with
TorchState, ElasticSampler, DistributedOptimizer and hvd.elastic.run.

Fault injection: ``--kill ID@STEP`` makes the worker with KOLO_WORKER_ID ID
SIGKILL itself before its global step STEP. Every worker appends what it does
to <journal>/worker<ID>: "step <epoch> <batch> <round> <size> <rank> <sample,...>"
per step and "done" at the end; rank 0 prints "final_w=<w0,w1,...>".
"""
import argparse
import os
import signal

import torch

import kolo.torch as hvd

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--samples", type=int, default=96)
parser.add_argument("--batch", type=int, default=4)
parser.add_argument("--commit-every", type=int, default=3)
parser.add_argument("--kill", default="")
parser.add_argument("--journal", required=True)
args = parser.parse_args()

worker_id = int(os.environ.get("KOLO_WORKER_ID", "0"))
kill_id, kill_step = (int(v) for v in args.kill.split("@")) if args.kill else (-1, -1)
journal = open(os.path.join(args.journal, f"worker{worker_id}"), "a", buffering=1)

hvd.init()
torch.set_num_threads(1)

# y = x . w_true + 0.5, for 4 features.
generator = torch.Generator().manual_seed(3)
features = torch.randn(args.samples, 4, generator=generator, dtype=torch.float64)
targets = features @ torch.tensor([1.0, -2.0, 0.5, 3.0], dtype=torch.float64) + 0.5
dataset = torch.utils.data.TensorDataset(torch.arange(args.samples), features, targets)

torch.manual_seed(0)
model = torch.nn.Linear(4, 1).double()
optimizer = torch.optim.SGD(model.parameters(), lr=0.05 * hvd.size())
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
hvd.broadcast_parameters(model.state_dict(), root_rank=0)

sampler = hvd.elastic.ElasticSampler(dataset, shuffle=True, seed=11)
loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch, sampler=sampler)


def on_state_reset():
    # The world changed: the learning rate follows its size.
    for group in optimizer.param_groups:
        group["lr"] = 0.05 * hvd.size()


state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0, batch=0)
state.register_reset_callbacks([on_state_reset])
global_step = 0


@hvd.elastic.run
def train(state):
    global global_step
    loss = None
    while state.epoch < args.epochs:
        for batch_idx, (index, x, y) in enumerate(loader):
            if worker_id == kill_id and global_step == kill_step:
                os.kill(os.getpid(), signal.SIGKILL)
            global_step += 1
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x).squeeze(1), y)
            loss.backward()
            optimizer.step()
            journal.write(f"step {state.epoch} {state.batch} {state.round} {hvd.size()} "
                          f"{hvd.rank()} {','.join(str(int(i)) for i in index)}\n")
            sampler.record_batch(batch_idx, args.batch)
            state.batch += 1
            if state.batch % args.commit_every == 0:
                state.commit()
        state.epoch += 1
        state.batch = 0
        sampler.set_epoch(state.epoch)
        state.commit()
    return loss.item()


final_loss = train(state)
weights = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
everyone = hvd.allgather(weights.unsqueeze(0))
assert all(torch.equal(row, weights) for row in everyone), "the ranks' models differ"
if hvd.rank() == 0:
    print("final_w=" + ",".join(f"{w:.17g}" for w in weights.tolist()), flush=True)
    print(f"final_loss={final_loss:.6g}", flush=True)
journal.write("done\n")
hvd.shutdown()
