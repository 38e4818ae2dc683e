"""One process, two Gloo users: kolo's gloo backend (Debian's libgloo, linked
by libkolo_core) and torch.distributed's ProcessGroupGloo (the Gloo inside
libtorch_cpu for a wheel; Debian's libgloo again for Debian's torch). Run
under torchrun with KOLO_BACKEND=gloo: each allreduces, interleaved, and
checks the sums; a process whose calls bound one library's symbols to the
other's would crash or compute garbage here."""
import torch
import torch.distributed as dist

import kolo.torch as hvd

dist.init_process_group("gloo")  # torchrun's variables (env://)
hvd.init()
assert hvd.backend() == "gloo", hvd.backend()
rank, size = dist.get_rank(), dist.get_world_size()
assert (hvd.rank(), hvd.size()) == (rank, size), (hvd.rank(), hvd.size(), rank, size)
expected = sum(range(1, size + 1))
for step in range(3):
    t = torch.full((1000,), float(rank + 1))
    dist.all_reduce(t)
    assert torch.all(t == expected), (step, t[:4])
    k = hvd.allreduce(torch.full((1000,), float(rank + 1)), op=hvd.Sum, name=f"sum.{step}")
    assert torch.all(k == expected), (step, k[:4])
dist.barrier()
hvd.shutdown()
dist.destroy_process_group()
print(f"rank {rank}: both Gloo users agree", flush=True)
