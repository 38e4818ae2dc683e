#include "collectives_bench.h"

#include <unistd.h>

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
#include "link_rate.h"

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
    return [&comm, &buffers, elems] { comm.broadcast(buffers.in.data(), elems, DType::kF32, {}); };
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
// world communicator: on loopback when every rank is on this host, else on
// every interface at rank 0's host name.
std::shared_ptr<Store> bench_store(Runtime& runtime, std::unique_ptr<TcpStoreServer>& server) {
  if (runtime.store()) return make_prefix_store(runtime.store(), "bench");
  const bool across_hosts = runtime.topology().cross_size > 1;
  int32_t port = 0;
  char host[256] = "127.0.0.1";
  if (runtime.world().rank() == 0) {
    TcpStoreServer::Options options;
    if (across_hosts) {
      options.bind_address = "0.0.0.0";
      if (gethostname(host, sizeof(host) - 1) != 0) std::strcpy(host, "localhost");
    }
    server = std::make_unique<TcpStoreServer>(options);
    port = server->port();
  }
  runtime.world().broadcast(&port, 1, DType::kI32, {});
  runtime.world().broadcast(host, sizeof(host), DType::kU8, {});
  return connect_tcp_store(host, port, std::chrono::seconds(30));
}

// One communicator under test: its column label, the backend and algorithm
// of the JSON rows.
struct UnderTest {
  std::string label, backend, algorithm;
  Communicator* comm;
};

// Bytes that leave each host per allreduce of `bytes` with `ranks_per_host`
// ranks on each of `hosts` hosts, ranks placed host by host: a flat ring over
// all ranks leaves each host once per ring pass (2 (n-1)/n of the buffer);
// the hierarchical path sends each local rank's 1/L slice around a ring of
// the hosts, 2 (h-1)/h of it, L slices per host. The link-bound time is
// these bytes over the link's rate (full duplex: each direction carries them).
double cross_host_bytes(const std::string& algorithm, double bytes, int hosts, int ranks_per_host) {
  const int n = hosts * ranks_per_host;
  if (algorithm == "hierarchical") return 2.0 * (hosts - 1) / hosts * bytes;
  return 2.0 * (n - 1) / n * bytes;
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
  const Topology& topology = runtime.topology();
  const bool across_hosts = topology.cross_size > 1;
  std::vector<UnderTest> comms;
  std::vector<std::unique_ptr<Communicator>> owned;
  std::vector<std::string> notes;
  const bool want_all =
      std::find(options.backends.begin(), options.backends.end(), "all") != options.backends.end();
  const bool want_gloo = want_all || std::find(options.backends.begin(), options.backends.end(),
                                               "gloo") != options.backends.end();
  std::vector<int> rank_hosts(n);
  if (across_hosts) {
    // The cross-host algorithms, each built explicitly (whatever
    // KOLO_HIERARCHICAL made of the world): kolo's flat mpi when started by
    // mpirun; unless --backends leaves gloo out, gloo's flat ring and the
    // hierarchical shm + gloo composition when every host runs the same
    // number (> 1) of ranks.
    int32_t mine = topology.cross_rank;
    world.allgather(&mine, rank_hosts.data(), 1, DType::kI32, {});
    CommunicatorOptions base;
    base.rank = world.rank();
    base.size = n;
    base.store = store;
    base.gloo_iface = runtime.config().get_string("KOLO_GLOO_IFACE");
    if (runtime.config().is_set("KOLO_HOSTNAME"))
      base.host_name = runtime.config().get_string("KOLO_HOSTNAME");
    for (int r = 0; r < n; ++r) base.world_ranks.push_back(r);
    auto add = [&](const std::string& label, const std::string& backend,
                   const std::string& algorithm, bool hierarchical) {
      CommunicatorOptions o = base;
      o.prefix = "bench/" + label;
      if (hierarchical) {
        o.hierarchical = "on";
        o.rank_hosts = rank_hosts;
      }
      owned.push_back(make_communicator(backend, o));
      comms.push_back({label, backend, algorithm, owned.back().get()});
    };
    if (world.backend() == std::string("mpi")) add("mpi", "mpi", "flat", false);
    if (!want_gloo) {
      notes.push_back("gloo: not measured (--backends)");
    } else if (add("gloo_ring", "gloo", "flat_ring", false);
               topology.local_size > 1 && topology.homogeneous) {
      add("hierarchical", "gloo", "hierarchical", true);
    } else {
      notes.push_back(
          "hierarchical: not measured (needs more than one rank on every host, the "
          "same number on each)");
    }
  } else {
    comms.push_back({world.backend(), world.backend(), "flat", &world});
  }
  for (const std::string& backend : compiled_backends()) {
    if (across_hosts) break;
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
    comms.push_back({backend, backend, "flat", owned.back().get()});
  }

  // The link's own rate, between rank 0 and the first rank of the second
  // host, before the collectives load it.
  std::vector<std::pair<int, double>> link_rates;  // (streams, bytes/s)
  if (across_hosts) {
    LinkRateOptions link;
    link.receiver =
        static_cast<int>(std::find(rank_hosts.begin(), rank_hosts.end(), 1) - rank_hosts.begin());
    for (int streams : {1, options.link_streams}) {
      link.streams = streams;
      link.key = "link_rate/" + std::to_string(streams);
      link_rates.emplace_back(streams, measure_link_rate(world, *store, link));
    }
  }

  const std::vector<size_t> sizes = sizes_of(options);
  std::vector<Measured> results;
  for (const std::string& op : options.ops) {
    for (auto& test : comms) {
      for (size_t bytes : sizes) {
        Buffers buffers;
        auto call = make_op(*test.comm, op, bytes, buffers);
        results.push_back({test.label, op, bytes, time_collective_us(world, call, options.timing)});
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
      for (auto& test : comms) {
        const double round_trip =
            time_collective_us(world, make_pingpong(*test.comm, buffer), options.timing);
        results.push_back({test.label, "pingpong", bytes, round_trip / 2});
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
    if (auto mpi = mpi_raw_allreduce_factory())
      peers.emplace_back("MPI_Allreduce", mpi);
    else
      notes.push_back("MPI_Allreduce: not measured (start under mpirun: kolorun --backend mpi)");
    char host[256] = {};
    if (gethostname(host, sizeof(host) - 1) != 0) std::strcpy(host, "localhost");
    const std::string address = across_hosts ? reachable_address(host, {}) : "127.0.0.1";
    auto gloo = want_gloo ? gloo_raw_allreduce_factory(make_prefix_store(store, "gloo_raw"),
                                                       world.rank(), n, address)
                          : nullptr;
    if (gloo) peers.emplace_back("gloo_ring_chunked", gloo);
    for (auto& [name, factory] : peers) {
      for (size_t bytes : sizes) {
        auto raw = factory(std::max<size_t>(1, bytes / sizeof(float)));
        results.push_back({name, "allreduce", bytes,
                           time_collective_us(
                               world, [&] { raw->run(); }, options.timing)});
      }
    }
  }
  // Memory bandwidth: one rank copying alone (others wait at the barrier),
  // then every rank copying at once; their sum is what the ranks of an
  // allreduce share, so it sets the shm bound below (not measured across
  // hosts, where the link's rate is the bound).
  if (options.baselines && !across_hosts &&
      std::find(options.ops.begin(), options.ops.end(), "allreduce") != options.ops.end()) {
    if (root) memcpy_gbps = memcpy_bandwidth_gbps(size_t{64} << 20);
    world.barrier({});
    memcpy_all_gbps = memcpy_bandwidth_gbps(size_t{64} << 20);
    world.allreduce(&memcpy_all_gbps, &memcpy_all_gbps, 1, DType::kF64, {});
  }

  if (!root) {
    kolo::shutdown();
    return 0;
  }

  // Backend and algorithm of each column label, for the JSON rows.
  std::map<std::string, std::pair<std::string, std::string>> kinds = {
      {"MPI_Allreduce", {"mpi", "MPI_Allreduce"}},
      {"MPI_Send/MPI_Recv", {"mpi", "MPI_Send/MPI_Recv"}},
      {"gloo_ring_chunked", {"gloo", "raw_ring_chunked"}}};
  for (const auto& test : comms) kinds[test.label] = {test.backend, test.algorithm};
  auto kind_of = [&](const std::string& label) { return kinds.at(label); };

  // The link's TCP rate: a table and JSON rows of their own.
  double link_bytes_per_s = 0;  // the best of the stream counts: what the link can carry
  std::string link_line;
  for (const auto& [streams, rate] : link_rates) {
    link_bytes_per_s = std::max(link_bytes_per_s, rate);
    link_line += (link_line.empty() ? "" : ", ") + std::to_string(streams) + " TCP stream" +
                 (streams > 1 ? "s " : " ") + format_fixed(rate * 8e-9, 2) + " Gbit/s";
    if (options.json) {
      nlohmann::json row = {{"label", "tcp"},
                            {"op", "link_rate"},
                            {"streams", streams},
                            {"hosts", topology.cross_size},
                            {"ranks_per_host", topology.local_size},
                            {"link", options.link},
                            {"rate_gbps", rate * 8e-9}};
      std::cout << row.dump() << "\n";
    }
  }

  // One pivot table per op: a row per size, two columns (time, busbw) per backend.
  std::string docs_body =
      "Command: `" + options.command_line + "` (" + std::to_string(n) + " ranks";
  if (across_hosts)
    docs_body += " on " + std::to_string(topology.cross_size) + " hosts x " +
                 std::to_string(topology.local_size) + ", link " + options.link + ": " + link_line;
  docs_body += "; f32; median of " + std::to_string(options.timing.repeats) +
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
            const auto& [backend, algorithm] = kind_of(b);
            nlohmann::json row = {{"label", b},
                                  {"backend", backend},
                                  {"algorithm", algorithm},
                                  {"op", op},
                                  {"bytes", bytes},
                                  {"world_size", n},
                                  {"hosts", topology.cross_size},
                                  {"ranks_per_host", topology.local_size},
                                  {"link", options.link},
                                  {"time_us", r.time_us},
                                  {"algbw_gbps", algbw},
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
  for (const auto& test : comms) {
    const std::string& backend = test.label;
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
  // Across hosts: each algorithm at >= 16 MiB against the link-bound time
  // (its cross-host bytes over the link's measured rate), hierarchical
  // against gloo's flat ring, and kolo's gloo ring against raw gloo.
  if (across_hosts && link_bytes_per_s > 0) {
    for (size_t bytes : sizes) {
      if (bytes < (size_t{16} << 20)) continue;
      std::string line = format_bytes(static_cast<double>(bytes)) + ":";
      for (const auto& test : comms) {
        const double t = lookup(test.label, bytes);
        if (t <= 0) continue;
        const double bound_us = cross_host_bytes(test.algorithm, static_cast<double>(bytes),
                                                 topology.cross_size, topology.local_size) /
                                link_bytes_per_s * 1e6;
        line += " " + test.label + " " + format_fixed(100.0 * bound_us / t, 0) + "% of link-bound;";
      }
      const double hier = lookup("hierarchical", bytes), ring = lookup("gloo_ring", bytes),
                   raw = lookup("gloo_ring_chunked", bytes);
      if (hier > 0 && ring > 0)
        line += " hierarchical " + format_fixed(ring / hier, 2) + "x gloo_ring;";
      if (ring > 0 && raw > 0)
        line += " gloo_ring " + format_fixed(raw / ring, 2) + "x raw gloo_ring_chunked's speed";
      summary.push_back(line);
    }
    summary.push_back(
        "link-bound = bytes leaving each host (flat ring 2(n-1)/n S, hierarchical "
        "2(h-1)/h S) / the best measured TCP rate (" +
        format_fixed(link_bytes_per_s * 8e-9, 2) + " Gbit/s)");
  }
  for (const auto& note : notes) summary.push_back(note);
  if (!options.json)
    for (const auto& line : summary) std::cout << line << "\n";
  docs_body += "Summary:\n\n";
  for (const auto& line : summary) docs_body += "    " + line + "\n";
  if (!options.docs_path.empty()) {
    // Across hosts, one section per placement, link and world backend.
    const std::string section = across_hosts ? "hosts-" + std::to_string(topology.cross_size) +
                                                   "x" + std::to_string(topology.local_size) + "-" +
                                                   options.link + "-" + world.backend()
                                             : "collectives";
    write_docs_section(options.docs_path, section, docs_body);
    if (!options.json)
      std::cout << "wrote the " << section << " section of " << options.docs_path << "\n";
  }
  kolo::shutdown();
  return 0;
}

}  // namespace kolo::bench
