#!/usr/bin/env python3
"""The FSDP2 peer of `kolo-bench zero` (its `fsdp2` rows): one rank of
PyTorch's fully_shard (torch.distributed.fsdp, torch >= 2.6) on the gloo
backend, started by the real torchrun of the build's interpreter:

  .venv/bin/python -m torch.distributed.run --standalone --nproc-per-node 2 \\
      bench/zero_worker_fsdp2.py --layers 6 --width 4096 --batch 8 --steps 3

The model, data and loop are those of kolo's zero worker (bench/zero_worker.cc):
--layers Linear(width, width) with ReLU between them, each Linear one
fully_shard unit (kolo's ShardedUnit) and the root one more, Adam(lr 1e-4),
the same weights on every rank (seed 42), rank r's rows from seed 1000 + r,
MSE against random targets; --warmup-steps untimed steps (Adam creates its
state in the first), then --steps timed ones. Prints one JSON object with the
fields kolo's worker prints: the bytes of parameters, gradients and Adam
state this rank holds after the last step (the local shards), the peak of the
parameters held at once (sampled in each Linear's forward and backward, when
FSDP2 has gathered it: the sharded parameters plus every unit whose
parameters are unsharded at that moment), peak RSS (VmHWM), the resident set
before the model was built, and the mean step time.
"""
import argparse
import json
import os
import sys
import time
import warnings

# The repository has a torch/ directory; never let it shadow the package.
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(
    os.path.dirname(os.path.abspath(__file__)))]

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.fsdp import fully_shard  # noqa: E402
from torch.distributed.tensor import DTensor  # noqa: E402



def emit(row):
    """One JSON line in a single write(2): the ranks share torchrun's (or
    kolorun's) stdout, and a line written in pieces could interleave with
    another rank's, which the driver could then not parse."""
    os.write(1, (json.dumps(row) + "\n").encode())

def status_bytes(field):
    """A field of /proc/self/status (VmHWM, VmRSS) in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return -1


def local_bytes(t):
    """Bytes this rank holds of `t`: the local shard of a DTensor."""
    if t is None:
        return 0
    if isinstance(t, DTensor):
        t = t.to_local()
    return t.numel() * t.element_size()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--width", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=8, help="rows per rank per step")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--warmup-steps", type=int, default=1)
    args = parser.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    start_rss = status_bytes("VmRSS")
    mesh = init_device_mesh("cpu", (world,))

    torch.manual_seed(42)
    layers = [nn.Linear(args.width, args.width) for _ in range(args.layers)]
    modules = []
    for i, layer in enumerate(layers):
        modules.append(layer)
        if i + 1 < args.layers:
            modules.append(nn.ReLU())
    model = nn.Sequential(*modules)
    full_unit_bytes = [sum(p.numel() * p.element_size() for p in layer.parameters())
                       for layer in layers]
    for layer in layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    sharded_bytes = sum(local_bytes(p) for p in model.parameters())

    # FSDP2 swaps a unit's registered parameters from sharded DTensors to
    # plain tensors while it is gathered; hooks registered after fully_shard's
    # own run once the unit is gathered.
    peak_params = [sharded_bytes]

    def sample(*_):
        held = sharded_bytes
        for layer, full in zip(layers, full_unit_bytes):
            if not any(isinstance(p, DTensor) for p in layer.parameters()):
                held += full
        peak_params[0] = max(peak_params[0], held)

    # The first Linear's input needs no gradient: its backward hook then
    # fires on the output's gradient, which is all the sample needs.
    warnings.filterwarnings("ignore", message="Full backward hook is firing")
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module")  # the root returns a view
    for layer in layers:
        layer.register_forward_hook(sample)
        layer.register_full_backward_hook(sample)

    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    torch.manual_seed(1000 + rank)
    x = torch.randn(args.batch, args.width)
    y = torch.randn(args.batch, args.width)

    def step():
        optimizer.zero_grad(set_to_none=False)
        F.mse_loss(model(x), y).backward()
        optimizer.step()

    for _ in range(args.warmup_steps):
        step()
    peak_params[0] = sharded_bytes
    dist.barrier()
    start = time.perf_counter()
    for _ in range(args.steps):
        step()
    step_ms = 1000.0 * (time.perf_counter() - start) / args.steps

    params = sum(local_bytes(p) for p in model.parameters())
    grads = sum(local_bytes(p.grad) for p in model.parameters())
    state = sum(local_bytes(v) for s in optimizer.state.values() for v in s.values()
                if torch.is_tensor(v) and v.dim() > 0)
    emit({
        "rank": rank, "world_size": world, "mode": "fsdp2", "prefetch": True,
        "step_ms": step_ms,
        "param_bytes": params, "grad_bytes": grads, "optimizer_state_bytes": state,
        "peak_param_bytes": peak_params[0], "peak_grad_bytes": grads,
        "peak_total_bytes": peak_params[0] + grads + state,
        "largest_unit_bytes": max(full_unit_bytes),
        "peak_rss_bytes": status_bytes("VmHWM"), "start_rss_bytes": start_rss})
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
