// --strategy mirrored: --replicas workers per process as threads
// (kolo::MirroredStrategy, docs/strategies.md), all reading the process's
// one copy of the data set; under kolorun every process runs them, and all
// replicas of all processes train one model.
#pragma once

#include <functional>

#include "flags.h"
#include "kolo/core/engine.h"

namespace fashion_mnist {

// Runs fit(where) once per replica, each on its own thread with --threads
// intra-op threads (default: $OMP_NUM_THREADS / --replicas, at least 1), and
// `where` pointing kolo's calls at the replica's engine. After kolo::init.
void run_replicas(const Flags& flags, const std::function<void(const kolo::CallOptions&)>& fit);

}  // namespace fashion_mnist
