#!/usr/bin/env python3
"""The torch.distributed.pipelining peer of `kolo-bench pipeline`: one stage
of PyTorch's own pipeline schedules (ScheduleGPipe, Schedule1F1B) on the gloo
backend, one rank per stage, started by the real torchrun of the build's
interpreter:

  .venv/bin/python -m torch.distributed.run --standalone --nproc-per-node 2 \\
      bench/pipeline_worker_torch.py --schedules gpipe,1f1b --micro-batches 1,2,4,8

The model and loop are those of kolo's pipeline worker (bench/pipeline_worker.cc):
--blocks MLP blocks, each Linear(hidden, ffn), GELU, Linear(ffn, hidden),
split evenly over the stages (stage s holds blocks [s B / p, (s + 1) B / p));
Adam(lr 1e-4) on each stage's parameters; a global batch of --batch rows
(the same on every rank, seed 7), MSE against random targets, cut into m
micro-batches by the schedule. Per configuration (schedule, m) a fresh stage
and schedule train --warmup-steps untimed and --steps timed steps; each rank
prints one JSON object: {"system": "torch", "schedule", "micro_batches",
"stages", "stage", "batch", "timed_steps", "step_seconds"} (the mean wall
time of schedule.step() on this rank: forward, backward and the transfers,
as kolo's Pipeline::Stats::step_seconds counts train_step). A configuration
PyTorch refuses (its 1F1B needs at least as many micro-batches as stages)
prints step_seconds null and "unsupported": PyTorch's message.
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
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe  # noqa: E402

SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}



def emit(row):
    """One JSON line in a single write(2): the ranks share torchrun's (or
    kolorun's) stdout, and a line written in pieces could interleave with
    another rank's, which the driver could then not parse."""
    os.write(1, (json.dumps(row) + "\n").encode())

def build_stage_module(args, stage, stages):
    torch.manual_seed(42)  # the whole model from one seed on every rank, then this stage's part
    blocks = [nn.Sequential(nn.Linear(args.hidden, args.ffn), nn.GELU(),
                            nn.Linear(args.ffn, args.hidden)) for _ in range(args.blocks)]
    per_stage = args.blocks // stages
    return nn.Sequential(*blocks[stage * per_stage:(stage + 1) * per_stage])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schedules", default="gpipe,1f1b")
    parser.add_argument("--micro-batches", default="1,2,4,8,16")
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--ffn", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=128, help="global rows per step")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup-steps", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo")
    stage, stages = dist.get_rank(), dist.get_world_size()
    if args.blocks % stages != 0:
        raise SystemExit(f"pipeline_worker_torch.py: --blocks {args.blocks} must divide by the "
                         f"{stages} stages")
    module = build_stage_module(args, stage, stages)
    optimizer = torch.optim.Adam(module.parameters(), lr=1e-4)
    torch.manual_seed(7)
    x = torch.randn(args.batch, args.hidden)
    y = torch.randn(args.batch, args.hidden)
    first, last = stage == 0, stage == stages - 1

    for name in args.schedules.split(","):
        for m in (int(v) for v in args.micro_batches.split(",")):
            if args.batch % m != 0:
                raise SystemExit(f"pipeline_worker_torch.py: --batch {args.batch} must divide by "
                                 f"{m} micro-batches")
            pipe_stage = PipelineStage(module, stage, stages, torch.device("cpu"))
            try:
                schedule = SCHEDULES[name](pipe_stage, n_microbatches=m, loss_fn=F.mse_loss)
            except ValueError as e:  # e.g. its 1F1B needs m >= stages
                emit({"system": "torch", "schedule": name, "micro_batches": m,
                                  "stages": stages, "stage": stage, "batch": args.batch,
                                  "timed_steps": 0, "step_seconds": None,
                                  "unsupported": str(e)})
                continue
            seconds = 0.0
            for i in range(args.warmup_steps + args.steps):
                optimizer.zero_grad()
                start = time.perf_counter()
                if first:
                    schedule.step(x)
                elif last:
                    schedule.step(target=y)
                else:
                    schedule.step()
                if i >= args.warmup_steps:
                    seconds += time.perf_counter() - start
                optimizer.step()
            emit({"system": "torch", "schedule": name, "micro_batches": m,
                              "stages": stages, "stage": stage, "batch": args.batch,
                              "timed_steps": args.steps,
                              "step_seconds": seconds / args.steps})
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
