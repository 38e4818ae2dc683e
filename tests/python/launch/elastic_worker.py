"""A Horovod-style elastic training script, run by test_elastic.py under
``kolorun -np 3 --min-np 2``: linear regression on deterministic data with
TorchState, ElasticSampler, DistributedOptimizer and hvd.elastic.run.

Fault injection: ``--kill ID@STEP`` makes the worker with KOLO_WORKER_ID ID
SIGKILL itself before its global step STEP. Growth: ``--grow FILE@STEP@TEXT``
makes rank 0 write TEXT into FILE (what the discovery script prints) before
global step STEP, and ``--until-size N`` keeps training past --epochs until
the world has N workers (a newcomer's Python start-up takes seconds). Every worker appends what it does
to <journal>/worker<ID>: "step <epoch> <batch> <round> <size> <rank> <sample,...>"
per step and "done" at the end; rank 0 prints "final_w=<w0,w1,...>".
"""
import argparse
import os
import signal
import time

import torch

import kolo.torch as hvd

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--samples", type=int, default=96)
parser.add_argument("--batch", type=int, default=4)
parser.add_argument("--commit-every", type=int, default=3)
parser.add_argument("--kill", default="")
parser.add_argument("--grow", default="")
parser.add_argument("--until-size", type=int, default=0)
parser.add_argument("--step-ms", type=int, default=0)
parser.add_argument("--journal", required=True)
args = parser.parse_args()

worker_id = int(os.environ.get("KOLO_WORKER_ID", "0"))
kill_id, kill_step = (int(v) for v in args.kill.split("@")) if args.kill else (-1, -1)
grow_file, grow_step, grow_text = args.grow.split("@") if args.grow else ("", "-1", "")
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
# No collectives out here (Horovod's rule for elastic scripts): a worker that
# joins later would run them while the others sync the state inside run().
# run() gives every worker rank 0's state before training.

sampler = hvd.elastic.ElasticSampler(dataset, shuffle=True, seed=11)
loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch, sampler=sampler)


def on_state_reset():
    # The world changed: the learning rate follows its size.
    for group in optimizer.param_groups:
        group["lr"] = 0.05 * hvd.size()


state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0, batch=0, grown_at=-1)
state.register_reset_callbacks([on_state_reset])
global_step = 0


@hvd.elastic.run
def train(state):
    global global_step
    loss = None
    def more_epochs():
        # --until-size: the epoch in which the world has grown, and one more
        # whole one (the growth may come with the epoch's last commit). Every
        # rank decides alike: the state and the world size are the same.
        if args.until_size and hvd.size() >= args.until_size and state.grown_at < 0:
            state.grown_at = state.epoch
        growing = args.until_size and (state.grown_at < 0 or state.epoch <= state.grown_at + 1)
        return state.epoch < args.epochs or (growing and state.epoch < 100)

    while more_epochs():
        for batch_idx, (index, x, y) in enumerate(loader):
            if worker_id == kill_id and global_step == kill_step:
                os.kill(os.getpid(), signal.SIGKILL)
            if hvd.rank() == 0 and global_step == int(grow_step):
                with open(grow_file, "w") as hosts:
                    hosts.write(grow_text + "\n")
            time.sleep(args.step_ms / 1000.0)
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
    return float("nan") if loss is None else loss.item()  # None: no step in this world


final_loss = train(state)
weights = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
everyone = hvd.allgather(weights.unsqueeze(0))
assert all(torch.equal(row, weights) for row in everyone), "the ranks' models differ"
if hvd.rank() == 0:
    print("final_w=" + ",".join(f"{w:.17g}" for w in weights.tolist()), flush=True)
    print(f"final_loss={final_loss:.6g}", flush=True)
journal.write("done\n")
hvd.shutdown()
