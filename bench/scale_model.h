// `kolo-bench model`: an alpha-beta-gamma cost model of allreduce (flat ring,
// hierarchical, and a binomial tree for small messages) fitted to the
// measurements of scripts/bench_hosts.sh, checked on configurations left out
// of the fit, and used to project data-parallel training to 8..512 workers
// (docs/scale.md states every assumption).
#pragma once

#include <string>
#include <vector>

namespace kolo::bench {

// Where an allreduce runs: `hosts` hosts of `ranks_per_host` ranks, ranks
// placed host by host, joined by links of `link_bytes_per_s` in each
// direction (full duplex).
struct Placement {
  int hosts = 1;
  int ranks_per_host = 1;
  double link_bytes_per_s = 0;
};

// The fitted parameters, in seconds and seconds per byte. Every term adds
// (no overlap is assumed between the phases of one allreduce). The
// reduction cost (gamma) has no term of its own: in every algorithm here
// each byte a rank receives is reduced once (ring: 2(n-1)/n S moved,
// (n-1)/n S reduced), so gamma cannot be told apart from the per-byte
// transfer costs and is part of them.
struct CostParams {
  double alpha_cross = 0;     // per step of a ring or tree across hosts
  double link_factor = 1;     // link time = link_factor * bytes over the link / link rate
  double net_per_byte = 0;    // per byte a rank sends or receives over TCP, reduction included
  double alpha_local = 0;     // per phase of the intra-host (shm) part
  double local_per_byte = 0;  // per byte a rank moves through shared memory, reduction included
};

// Seconds of one allreduce of `bytes` by `algorithm`: "flat_ring" (a ring
// over every rank), "hierarchical" (shm reduce-scatter in each host, a ring
// of the hosts per local rank, shm allgather) or "tree" (binomial reduce
// then broadcast over every rank, for small messages). Throws ContractError
// for another name.
double allreduce_seconds(const std::string& algorithm, double bytes, const Placement& placement,
                         const CostParams& params);

// One measured allreduce (a row of scripts/bench_hosts.sh).
struct AllreduceSample {
  std::string config;     // "2x2-1gbit": HOSTSxRANKS-LINK
  std::string algorithm;  // "flat_ring" or "hierarchical"
  Placement placement;    // link_bytes_per_s: the TCP rate measured in the same run
  double bytes = 0;
  double seconds = 0;
};

// The parameters (all >= 0) that minimise the summed squared relative error
// of allreduce_seconds over `samples`; `rms_relative` receives the root mean
// square of those relative errors. Throws ContractError when no
// non-negative fit exists (too few or degenerate samples).
CostParams fit_cost_params(const std::vector<AllreduceSample>& samples, double* rms_relative);

struct ModelBenchOptions {
  std::string data_dir = "docs/hosts_data";  // *.jsonl of scripts/bench_hosts.sh
  bool json = false;
  std::string docs_path;     // when set, rewrites the model sections of this file
  std::string command_line;  // recorded in the docs sections
  // Configurations left out of the fit ("HOSTSxRANKS-LINK"), and sizes left
  // out of the fitted configurations: both are predicted and compared.
  std::vector<std::string> held_out = {"2x2-2gbit", "3x2-1gbit"};
  std::vector<double> held_out_bytes = {16384, 262144, 4194304, 67108864};
};

// A plain process: reads the rows, fits, prints the tables.
int run_model_bench(const ModelBenchOptions& options);

}  // namespace kolo::bench
