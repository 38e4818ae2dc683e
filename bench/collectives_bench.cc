#include "collectives_bench.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <map>
#include <memory>
#include <vector>

#include "baselines.h"
#include "bench_report.h"
#include "kolo/kolo.h"

namespace kolo::bench {
namespace {

// nccl-tests convention: "bytes" is the size of the largest buffer a rank
// handles (allreduce/broadcast: the buffer; allgather: the gathered output;
// reducescatter/alltoall: the input), algbw = bytes / time, and busbw scales
// algbw by the fraction of bytes each rank must move on a ring.
double bus_factor(const std::string& op, int n) {
  if (n <= 1) return 0.0;
  if (op == "allreduce") return 2.0 * (n - 1) / n;
  if (op == "broadcast") return 1.0;
  return static_cast<double>(n - 1) / n;  // allgather, reducescatter, alltoall
}

struct Measured {
  std::string backend, op;
  size_t bytes;
  double time_us;
};

// Buffers for one (op, bytes) pair: f32 elements, in and out sized for the op.
struct Buffers {
  std::vector<float> in, out;
};

std::function<void()> make_op(Communicator& comm, const std::string& op, size_t bytes,
                              Buffers& buffers) {
  const int n = comm.size();
  const size_t elems = std::max<size_t>(1, bytes / sizeof(float));
  if (op == "allreduce") {
    buffers.in.assign(elems, 1.0f);
    buffers.out.assign(elems, 0.0f);
    return [&comm, &buffers, elems] {
      comm.allreduce(buffers.in.data(), buffers.out.data(), elems, DType::kF32, {});
    };
  }
  if (op == "broadcast") {
    buffers.in.assign(elems, 1.0f);
    return [&comm, &buffers, elems] {
      comm.broadcast(buffers.in.data(), elems, DType::kF32, {});
    };
  }
  const size_t per_rank = std::max<size_t>(1, elems / n);
  if (op == "allgather") {
    buffers.in.assign(per_rank, 1.0f);
    buffers.out.assign(per_rank * n, 0.0f);
    return [&comm, &buffers, per_rank] {
      comm.allgather(buffers.in.data(), buffers.out.data(), per_rank, DType::kF32, {});
    };
  }
  if (op == "reducescatter") {
    buffers.in.assign(per_rank * n, 1.0f);
    buffers.out.assign(per_rank, 0.0f);
    return [&comm, &buffers, per_rank] {
      comm.reducescatter(buffers.in.data(), buffers.out.data(), per_rank, DType::kF32, {});
    };
  }
  if (op == "alltoall") {
    buffers.in.assign(per_rank * n, 1.0f);
    buffers.out.assign(per_rank * n, 0.0f);
    return [&comm, &buffers, per_rank] {
      comm.alltoall(buffers.in.data(), buffers.out.data(), per_rank, DType::kF32, {});
    };
  }
  throw ContractError("kolo-bench collectives: unknown op '" + op +
                      "'; use allreduce, allgather, reducescatter, broadcast or alltoall");
}

// One round trip of `bytes` between ranks 0 and 1 (the others do nothing).
std::function<void()> make_pingpong(Communicator& comm, std::vector<uint8_t>& buffer) {
  return [&comm, &buffer] {
    const size_t n = buffer.size();
    if (comm.rank() == 0) {
      comm.send(buffer.data(), n, DType::kU8, 1, {});
      comm.recv(buffer.data(), n, DType::kU8, 1, {});
    } else if (comm.rank() == 1) {
      comm.recv(buffer.data(), n, DType::kU8, 0, {});
      comm.send(buffer.data(), n, DType::kU8, 0, {});
    }
  };
}

// The store the extra backends rendezvous through: kolorun's, or (under
// mpirun, which provides none) one served by rank 0 and announced over the
// world communicator.
std::shared_ptr<Store> bench_store(Runtime& runtime, std::unique_ptr<TcpStoreServer>& server) {
  if (runtime.store()) return make_prefix_store(runtime.store(), "bench");
  int32_t port = 0;
  if (runtime.world().rank() == 0) {
    server = std::make_unique<TcpStoreServer>(TcpStoreServer::Options{});
    port = server->port();
  }
  runtime.world().broadcast(&port, 1, DType::kI32, {});
  return connect_tcp_store("127.0.0.1", port, std::chrono::seconds(30));
}

std::vector<size_t> sizes_of(const CollectivesOptions& options) {
  std::vector<size_t> sizes;
  for (size_t bytes = options.min_bytes; bytes <= options.max_bytes; bytes *= options.size_step)
    sizes.push_back(bytes);
  return sizes;
}

}  // namespace

int run_collectives(const CollectivesOptions& options) {
  kolo::init();
  Runtime& runtime = kolo::runtime();
  Communicator& world = runtime.world();
  const int n = world.size();
  const bool root = world.rank() == 0;
  const bool all_local = runtime.topology().local_size == n;

  // Communicators under test: the world's own backend first, then the others.
  std::unique_ptr<TcpStoreServer> server;
  std::shared_ptr<Store> store = bench_store(runtime, server);
  std::vector<std::pair<std::string, Communicator*>> comms = {{world.backend(), &world}};
  std::vector<std::unique_ptr<Communicator>> owned;
  std::vector<std::string> notes;
  const bool want_all = std::find(options.backends.begin(), options.backends.end(), "all") !=
                        options.backends.end();
  for (const std::string& backend : compiled_backends()) {
    if (backend == world.backend()) continue;
    const bool wanted = want_all || std::find(options.backends.begin(), options.backends.end(),
                                              backend) != options.backends.end();
    if (!wanted) continue;
    if (backend == "mpi") {  // only the launcher can give MPI its world
      notes.push_back("mpi: not measured (start under mpirun: kolorun --backend mpi)");
      continue;
    }
    if (backend == "shm" && !all_local) {
      notes.push_back("shm: not measured (ranks span several hosts)");
      continue;
    }
    CommunicatorOptions comm_options;
    comm_options.rank = world.rank();
    comm_options.size = n;
    comm_options.store = store;
    comm_options.prefix = "bench/" + backend;
    owned.push_back(make_communicator(backend, comm_options));
    comms.emplace_back(backend, owned.back().get());
  }

  const std::vector<size_t> sizes = sizes_of(options);
  std::vector<Measured> results;
  for (const std::string& op : options.ops) {
    for (auto& [backend, comm] : comms) {
      for (size_t bytes : sizes) {
        Buffers buffers;
        auto call = make_op(*comm, op, bytes, buffers);
        results.push_back({backend, op, bytes, time_collective_us(world, call, options.timing)});
      }
    }
  }

  // Ping-pong: one-way time = round trip / 2, for each backend and raw MPI.
  if (options.pingpong && n >= 2) {
    auto raw_mpi = options.baselines ? mpi_raw_pingpong_factory() : nullptr;
    if (options.baselines && !raw_mpi) {
      notes.push_back(
          "MPI_Send/MPI_Recv: not measured (start under mpirun: kolorun --backend mpi)");
    }
    for (size_t bytes : sizes) {
      std::vector<uint8_t> buffer(bytes, 1);
      for (auto& [backend, comm] : comms) {
        const double round_trip =
            time_collective_us(world, make_pingpong(*comm, buffer), options.timing);
        results.push_back({backend, "pingpong", bytes, round_trip / 2});
      }
      if (raw_mpi) {
        auto raw = raw_mpi(bytes);
        const double round_trip = time_collective_us(
            world, [&] { raw->run(); }, options.timing);
        results.push_back({"MPI_Send/MPI_Recv", "pingpong", bytes, round_trip / 2});
      }
    }
  }

  // Peers, f32 sum allreduce only.
  double memcpy_gbps = 0;      // one rank copying alone
  double memcpy_all_gbps = 0;  // every rank copying at once, summed
  if (options.baselines &&
      std::find(options.ops.begin(), options.ops.end(), "allreduce") != options.ops.end()) {
    std::vector<std::pair<std::string, std::function<std::unique_ptr<RawOp>(size_t)>>> peers;
    if (auto mpi = mpi_raw_allreduce_factory()) peers.emplace_back("MPI_Allreduce", mpi);
    else notes.push_back("MPI_Allreduce: not measured (start under mpirun: kolorun --backend mpi)");
    if (auto gloo = gloo_raw_allreduce_factory(make_prefix_store(store, "gloo_raw"),
                                               world.rank(), n))
      peers.emplace_back("gloo_ring_chunked", gloo);
    for (auto& [name, factory] : peers) {
      for (size_t bytes : sizes) {
        auto raw = factory(std::max<size_t>(1, bytes / sizeof(float)));
        results.push_back(
            {name, "allreduce", bytes, time_collective_us(world, [&] { raw->run(); },
                                                          options.timing)});
      }
    }
    // Memory bandwidth: one rank copying alone (others wait at the barrier),
    // then every rank copying at once; their sum is what the ranks of an
    // allreduce share, so it sets the bound below.
    if (root) memcpy_gbps = memcpy_bandwidth_gbps(size_t{64} << 20);
    world.barrier({});
    memcpy_all_gbps = memcpy_bandwidth_gbps(size_t{64} << 20);
    world.allreduce(&memcpy_all_gbps, &memcpy_all_gbps, 1, DType::kF64, {});
  }

  if (!root) {
    kolo::shutdown();
    return 0;
  }

  // One pivot table per op: a row per size, two columns (time, busbw) per backend.
  std::string docs_body = "Command: `" + options.command_line + "` (" + std::to_string(n) +
                          " ranks; f32; median of " + std::to_string(options.timing.repeats) +
                          " repetitions after warm-up; slowest rank counts)\n\n";
  std::map<std::pair<std::string, std::string>, double> by_key;  // (backend, op, bytes)
  std::vector<std::string> tables = options.ops;
  if (options.pingpong && n >= 2) tables.push_back("pingpong");
  for (const std::string& op : tables) {
    std::vector<std::string> backends;
    for (const auto& r : results)
      if (r.op == op && std::find(backends.begin(), backends.end(), r.backend) == backends.end())
        backends.push_back(r.backend);
    const bool pingpong = op == "pingpong";
    Report report;
    report.title = pingpong ? "pingpong (u8) between ranks 0 and 1: one-way time (round trip / "
                              "2) in us, bandwidth bytes / one-way time in GB/s"
                            : op + " (f32" + (op == "allreduce" ? ", sum" : "") + "), " +
                                  std::to_string(n) + " ranks: time in us, busbw in GB/s";
    report.columns = {"bytes"};
    for (const auto& b : backends) {
      report.columns.push_back(b + " us");
      report.columns.push_back(b + (pingpong ? " GB/s" : " busbw"));
    }
    for (size_t bytes : sizes) {
      std::vector<std::string> cells = {format_bytes(static_cast<double>(bytes))};
      for (const auto& b : backends) {
        for (const auto& r : results) {
          if (r.op != op || r.backend != b || r.bytes != bytes) continue;
          const double algbw = r.bytes / (r.time_us * 1e-6) / 1e9;
          const double busbw = pingpong ? algbw : algbw * bus_factor(op, n);
          cells.push_back(format_fixed(r.time_us, r.time_us < 100 ? 2 : 0));
          cells.push_back(format_fixed(busbw, 3));
          by_key[{b + "/" + op, std::to_string(bytes)}] = r.time_us;
          if (options.json) {
            nlohmann::json row = {{"backend", b},         {"op", op},
                                  {"bytes", bytes},       {"world_size", n},
                                  {"time_us", r.time_us}, {"algbw_gbps", algbw},
                                  {"busbw_gbps", busbw}};
            std::cout << row.dump() << "\n";
          }
        }
      }
      report.rows.push_back(cells);
    }
    if (!options.json) std::cout << report.text() << "\n";
    docs_body += "**" + report.title + "**\n\n" + report.markdown() + "\n";
  }

  // Ratios against the targets (allreduce f32 sum): 64 MiB bandwidth
  // and 4 KiB latency of shm versus the raw peers of the same run.
  auto lookup = [&](const std::string& backend, size_t bytes) {
    auto it = by_key.find({backend + "/allreduce", std::to_string(bytes)});
    return it == by_key.end() ? 0.0 : it->second;
  };
  const size_t big = size_t{64} << 20, small = 4096;
  std::vector<std::string> summary;
  if (memcpy_gbps > 0) {
    summary.push_back("memcpy (64 MiB, read+write counted): 1 thread " +
                      format_fixed(memcpy_gbps, 1) + " GB/s; all " + std::to_string(n) +
                      " ranks at once " + format_fixed(memcpy_all_gbps, 1) + " GB/s in sum");
  }
  const double shm_big = lookup("shm", big), shm_small = lookup("shm", small);
  if (shm_big > 0) {
    const double shm_algbw = big / (shm_big * 1e-6) / 1e9;
    std::string line = "shm allreduce 64 MiB: algbw " + format_fixed(shm_algbw, 2) + " GB/s";
    if (memcpy_all_gbps > 0) {
      // Each rank must at least read its input and write its output once (2 S of
      // DRAM traffic); n ranks share the memory system, so the bound is
      // algbw <= B / (2 n) with B the summed copy bandwidth of all ranks copying
      // at once, counted read + write.
      const double bound = memcpy_all_gbps / (2.0 * n);
      line += ", " + format_fixed(100.0 * shm_algbw / bound, 0) +
              "% of the memory bound B/(2n) = " + format_fixed(bound, 2) + " GB/s";
    }
    summary.push_back(line);
    for (const std::string peer : {"MPI_Allreduce", "gloo_ring_chunked", "gloo"}) {
      const double t = lookup(peer, big);
      if (t > 0)
        summary.push_back("  vs " + peer + " at 64 MiB: " + format_fixed(t / shm_big, 1) +
                          "x faster");
    }
  }
  if (shm_small > 0) {
    summary.push_back("shm allreduce 4 KiB: " + format_fixed(shm_small, 2) + " us");
    for (const std::string peer : {"MPI_Allreduce", "gloo_ring_chunked", "gloo"}) {
      const double t = lookup(peer, small);
      if (t > 0)
        summary.push_back("  vs " + peer + " at 4 KiB: " + format_fixed(shm_small / t, 2) +
                          "x its latency");
    }
  }
  // Ping-pong against raw MPI of the same run: latency at 4 bytes, bandwidth at 64 MiB.
  auto pingpong_us = [&](const std::string& backend, size_t bytes) {
    auto it = by_key.find({backend + "/pingpong", std::to_string(bytes)});
    return it == by_key.end() ? 0.0 : it->second;
  };
  for (const auto& [backend, comm] : comms) {
    const double latency = pingpong_us(backend, 4);
    const double big_us = pingpong_us(backend, big);
    if (latency <= 0 && big_us <= 0) continue;
    std::string line = "pingpong " + backend + ":";
    if (latency > 0) line += " one-way 4 B " + format_fixed(latency, 2) + " us";
    if (big_us > 0) line += ", 64 MiB at " + format_fixed(big / (big_us * 1e-6) / 1e9, 2) + " GB/s";
    const double mpi_latency = pingpong_us("MPI_Send/MPI_Recv", 4);
    const double mpi_big = pingpong_us("MPI_Send/MPI_Recv", big);
    if (mpi_latency > 0 && latency > 0) {
      line += " (MPI_Send/MPI_Recv: " + format_fixed(mpi_latency, 2) + " us";
      if (mpi_big > 0 && big_us > 0) {
        line += ", " + format_fixed(big / (mpi_big * 1e-6) / 1e9, 2) + " GB/s";
      }
      line += ")";
    }
    summary.push_back(line);
  }
  for (const auto& note : notes) summary.push_back(note);
  if (!options.json)
    for (const auto& line : summary) std::cout << line << "\n";
  docs_body += "Summary:\n\n";
  for (const auto& line : summary) docs_body += "    " + line + "\n";
  if (!options.docs_path.empty()) {
    write_docs_section(options.docs_path, "collectives", docs_body);
    std::cout << "wrote the collectives section of " << options.docs_path << "\n";
  }
  kolo::shutdown();
  return 0;
}

}  // namespace kolo::bench
