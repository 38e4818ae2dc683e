// --strategy mirrored (mirrored.h).
#include "mirrored.h"

#include <algorithm>
#include <cstdio>

#include "kolo/torch.h"
#include "training.h"

namespace fashion_mnist {

void run_replicas(const Flags& flags, const std::function<void(const kolo::CallOptions&)>& fit) {
  kolo::MirroredOptions options;
  options.replicas = flags.replicas;
  // The process's cores (kolorun's share of them) divided among its replicas.
  options.threads_per_replica =
      flags.threads > 0 ? flags.threads : std::max(1, threads_of(flags) / flags.replicas);
  kolo::MirroredStrategy strategy(options);
  if (kolo::rank() == 0) {
    std::printf(
        "Mirrored: %d process(es) x %d replica(s) x %d thread(s), one copy of the data "
        "per process\n",
        kolo::size(), strategy.replicas(), strategy.threads_per_replica());
    std::fflush(stdout);
  }
  // Each replica builds its model, optimizer and Trainer in fit(); they meet
  // in its broadcast of rank 0's weights and in every gradient exchange.
  strategy.run([&](kolo::ReplicaContext& replica) { fit(replica.options()); });
}

}  // namespace fashion_mnist
