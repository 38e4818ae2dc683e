// Joining a PyTorch c10d TCPStore that the launcher serves.
//
// Since PyTorch 2.4, torchrun's agent hosts a c10d TCPStore at
// MASTER_ADDR:MASTER_PORT and tells its workers so with
// TORCHELASTIC_USE_AGENT_STORE=True; kolo's rank 0 must then not serve its own
// store on that port. A program that links kolo::torch starts with
//
//   kolo::init_torch();   // instead of kolo::init(): the same otherwise
//
// which, when the topology says the launcher serves a c10d store
// (Topology::store_kind == "c10d": that variable, or KOLO_STORE=c10d), joins
// it as a client through libtorch's c10d::TCPStore and hands it to the core
// as InitOptions::store. Everything else is kolo::init()'s: kolorun, mpirun,
// Slurm and torchrun without the agent store behave as they always did.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "kolo/core/runtime.h"
#include "kolo/core/store.h"

#pragma GCC visibility push(default)  // the exported API: cmake/kolo_targets.cmake
namespace kolo {

// kolo::init(options), joining the launcher's c10d store when there is one
// (see above) and options.store is not set. Errors as kolo::init(); a c10d
// store that does not answer within the timeout (options.timeout, else
// KOLO_TIMEOUT_SECONDS) is a RuntimeFault naming its address.
void init_torch(const InitOptions& options = {});

// `options` with InitOptions::store set to a client of the launcher's c10d
// store when the topology says there is one and options.store is not set;
// otherwise `options` unchanged. init_torch() is init(with_launcher_store());
// the Python frontend's hvd.init() uses it before its elastic::init().
InitOptions with_launcher_store(const InitOptions& options);

// A kolo::Store over a c10d::TCPStore client of the server at host:port
// (connects with retries until `timeout`). Waits poll the server with
// check(), so one thread waiting never holds the connection from another;
// a wait or get past its timeout is a TimeoutError naming the missing keys,
// and any failure of the connection a RuntimeFault naming the address.
std::shared_ptr<Store> connect_c10d_store(const std::string& host, int port,
                                          std::chrono::milliseconds timeout);

}  // namespace kolo
#pragma GCC visibility pop
