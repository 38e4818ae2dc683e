#include "scale_model.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "bench_report.h"
#include "kolo/core/errors.h"

namespace kolo::bench {
namespace {

constexpr size_t kParams = 5;
using Features = std::array<double, kParams>;

// Time = features . (alpha_cross, link_factor, net_per_byte, alpha_local,
// local_per_byte): linear in the parameters, so they are fitted by least
// squares.
Features features(const std::string& algorithm, double bytes, const Placement& p) {
  const int h = p.hosts, l = p.ranks_per_host, n = h * l;
  const double link = p.link_bytes_per_s > 0 ? 1.0 / p.link_bytes_per_s : 0.0;
  Features f{};
  if (n <= 1) return f;
  if (algorithm == "flat_ring") {
    // 2(n-1) steps, each rank sends (and receives) 2(n-1)/n S; one ring
    // edge leaves each host, carrying 2(n-1)/n S.
    const double moved = 2.0 * (n - 1) / n * bytes;
    if (h > 1) {
      f[0] = 2.0 * (n - 1);
      f[1] = moved * link;
      f[2] = moved;
    } else {
      f[3] = 2.0 * (n - 1);
      f[4] = moved;
    }
  } else if (algorithm == "hierarchical") {
    // Reduce-scatter and allgather over shm (each rank moves 2(L-1)/L S),
    // then each local rank's S/L slice around a ring of the h hosts; the L
    // rings share the host's link, which carries 2(h-1)/h S in all.
    if (h > 1) {
      f[0] = 2.0 * (h - 1);
      f[1] = 2.0 * (h - 1) / h * bytes * link;
      f[2] = 2.0 * (h - 1) / h * bytes / l;
    }
    if (l > 1) {
      f[3] = 2.0;
      f[4] = 2.0 * (l - 1) / l * bytes;
    }
  } else if (algorithm == "tree") {
    // Binomial reduce then broadcast over all ranks: 2 ceil(log2 n) steps,
    // each moving the whole buffer; ceil(log2 h) levels of each cross hosts.
    const double levels = std::ceil(std::log2(static_cast<double>(n)));
    const double cross_levels = std::ceil(std::log2(static_cast<double>(h)));
    f[0] = 2.0 * levels;
    f[1] = 2.0 * cross_levels * bytes * link;
    f[2] = 2.0 * levels * bytes;
  } else {
    throw ContractError("kolo-bench model: unknown algorithm '" + algorithm +
                        "'; use flat_ring, hierarchical or tree");
  }
  return f;
}

Features as_vector(const CostParams& c) {
  return {c.alpha_cross, c.link_factor, c.net_per_byte, c.alpha_local, c.local_per_byte};
}

CostParams from_vector(const Features& v) { return {v[0], v[1], v[2], v[3], v[4]}; }

// Solves the square system a x = b (Gaussian elimination, partial pivoting);
// false when singular.
bool solve(std::vector<std::vector<double>> a, std::vector<double> b, std::vector<double>& x) {
  const size_t n = b.size();
  for (size_t c = 0; c < n; ++c) {
    size_t pivot = c;
    for (size_t r = c + 1; r < n; ++r)
      if (std::abs(a[r][c]) > std::abs(a[pivot][c])) pivot = r;
    if (std::abs(a[pivot][c]) < 1e-12) return false;
    std::swap(a[c], a[pivot]);
    std::swap(b[c], b[pivot]);
    for (size_t r = c + 1; r < n; ++r) {
      const double k = a[r][c] / a[c][c];
      for (size_t j = c; j < n; ++j) a[r][j] -= k * a[c][j];
      b[r] -= k * b[c];
    }
  }
  x.assign(n, 0.0);
  for (size_t c = n; c-- > 0;) {
    double s = b[c];
    for (size_t j = c + 1; j < n; ++j) s -= a[c][j] * x[j];
    x[c] = s / a[c][c];
  }
  return true;
}

}  // namespace

// Non-negative least squares of the relative error sum ((pred - t) / t)^2:
// every subset of the parameters is solved unconstrained (columns scaled to
// unit norm) and the best subset whose solution is non-negative wins; with
// five parameters that is 31 small solves.
CostParams fit_cost_params(const std::vector<AllreduceSample>& samples, double* rms_relative) {
  std::vector<Features> rows;
  std::vector<double> targets;
  for (const auto& s : samples) {
    Features f = features(s.algorithm, s.bytes, s.placement);
    for (double& v : f) v /= s.seconds;  // relative error weighting
    rows.push_back(f);
    targets.push_back(1.0);
  }
  Features norm{};
  for (const auto& r : rows)
    for (size_t j = 0; j < kParams; ++j) norm[j] += r[j] * r[j];
  for (double& v : norm) v = std::sqrt(v);
  double best_error = INFINITY;
  Features best{};
  for (unsigned mask = 1; mask < (1u << kParams); ++mask) {
    std::vector<size_t> cols;
    for (size_t j = 0; j < kParams; ++j)
      if ((mask >> j & 1) && norm[j] > 0) cols.push_back(j);
    if (cols.empty()) continue;
    const size_t m = cols.size();
    std::vector<std::vector<double>> ata(m, std::vector<double>(m, 0.0));
    std::vector<double> atb(m, 0.0), x;
    for (size_t r = 0; r < rows.size(); ++r) {
      for (size_t i = 0; i < m; ++i) {
        const double ri = rows[r][cols[i]] / norm[cols[i]];
        atb[i] += ri * targets[r];
        for (size_t k = 0; k < m; ++k) ata[i][k] += ri * rows[r][cols[k]] / norm[cols[k]];
      }
    }
    if (!solve(ata, atb, x)) continue;
    if (std::any_of(x.begin(), x.end(), [](double v) { return v < 0; })) continue;
    Features theta{};
    for (size_t i = 0; i < m; ++i) theta[cols[i]] = x[i] / norm[cols[i]];
    double error = 0;
    for (size_t r = 0; r < rows.size(); ++r) {
      double pred = 0;
      for (size_t j = 0; j < kParams; ++j) pred += rows[r][j] * theta[j];
      error += (pred - 1.0) * (pred - 1.0);
    }
    if (error < best_error) {
      best_error = error;
      best = theta;
    }
  }
  if (!std::isfinite(best_error)) {
    throw ContractError("kolo-bench model: no non-negative fit of the " +
                        std::to_string(samples.size()) +
                        " measurements; measure more configurations (scripts/bench_hosts.sh)");
  }
  *rms_relative = std::sqrt(best_error / rows.size());
  return from_vector(best);
}

namespace {

// "1gbit" -> bytes per second; 0 for "unshaped" or anything else.
double nominal_rate(const std::string& link) {
  double value = 0;
  char unit = 0;
  if (std::sscanf(link.c_str(), "%lf%cbit", &value, &unit) != 2) return 0;
  const double scale = unit == 'g' ? 1e9 : unit == 'm' ? 1e6 : unit == 'k' ? 1e3 : 0;
  return value * scale / 8.0;
}

struct Loaded {
  std::vector<AllreduceSample> samples;
  // (tbf rate, measured TCP rate) of each shaped run, and the fastest TCP
  // rate of an unshaped run (what the machine itself can move), bytes/s.
  std::vector<std::pair<double, double>> shaped;
  double unshaped = 0;

  // What TCP gets of a link: measured / tbf rate over the runs whose shaping
  // binds (tbf rate at most half what the unshaped link moved; a faster tbf
  // rate measures this machine, not the link). 0 when there is none.
  double tcp_efficiency() const {
    double sum = 0;
    int count = 0;
    for (auto [nominal, measured] : shaped) {
      if (unshaped > 0 && nominal > unshaped / 2) continue;
      sum += measured / nominal;
      ++count;
    }
    return count ? sum / count : 0.0;
  }
};

Loaded load(const std::string& dir) {
  namespace fs = std::filesystem;
  if (!fs::is_directory(dir)) {
    throw ContractError("kolo-bench model: '" + dir +
                        "' is not a directory of measurements; run scripts/bench_hosts.sh "
                        "first, or pass --data DIR");
  }
  Loaded out;
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(dir))
    if (entry.path().extension() == ".jsonl") files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  for (const auto& path : files) {
    std::ifstream in(path);
    std::vector<nlohmann::json> rows;
    double rate = 0;  // best TCP rate of this run, bytes/s
    for (std::string line; std::getline(in, line);) {
      if (line.empty() || line[0] != '{') continue;
      nlohmann::json row = nlohmann::json::parse(line, nullptr, false);
      if (row.is_discarded()) {
        throw ContractError("kolo-bench model: " + path.string() +
                            ": a line is not JSON: " + line.substr(0, 80));
      }
      if (row.value("op", "") == "link_rate")
        rate = std::max(rate, row.value("rate_gbps", 0.0) * 1e9 / 8);
      else
        rows.push_back(row);
    }
    for (const auto& row : rows) {
      const std::string algorithm = row.value("algorithm", "");
      if (row.value("op", "") != "allreduce" ||
          (algorithm != "flat_ring" && algorithm != "hierarchical"))
        continue;
      AllreduceSample s;
      s.algorithm = algorithm;
      s.placement = {row.value("hosts", 1), row.value("ranks_per_host", 1), rate};
      s.bytes = row.value("bytes", 0.0);
      s.seconds = row.value("time_us", 0.0) * 1e-6;
      const std::string link = row.value("link", "");
      s.config = std::to_string(s.placement.hosts) + "x" +
                 std::to_string(s.placement.ranks_per_host) + "-" + link;
      if (s.seconds > 0 && rate > 0) out.samples.push_back(s);
    }
    if (!rows.empty()) {
      const std::string link = rows.front().value("link", "");
      const double nominal = nominal_rate(link);
      if (nominal > 0 && rate > 0) out.shaped.emplace_back(nominal, rate);
      if (link == "unshaped") out.unshaped = std::max(out.unshaped, rate);
    }
  }
  if (out.samples.empty()) {
    throw ContractError("kolo-bench model: no allreduce measurements across hosts in '" + dir +
                        "'; run scripts/bench_hosts.sh first");
  }
  return out;
}

// ---- The projection --------------------------------------------------------

// A model's gradient tensors (elements each, in the order backward produces
// them: last layer first) and its published single-GPU training throughput.
struct Workload {
  std::string name;
  std::vector<double> tensors;
  double images_per_s;  // one GPU, batch `batch`
  int batch;
};

// ResNet-50 (He et al. 2015, torchvision's layout): 161 tensors, 25.6 M.
std::vector<double> resnet50_tensors() {
  std::vector<double> t;
  auto conv_bn = [&](double in, double out, double k) {
    t.push_back(in * out * k * k);
    t.push_back(out);  // batch-norm weight
    t.push_back(out);  // batch-norm bias
  };
  conv_bn(3, 64, 7);
  double in = 64;
  const int blocks[] = {3, 4, 6, 3};
  for (int stage = 0; stage < 4; ++stage) {
    const double width = 64.0 * (1 << stage);
    for (int b = 0; b < blocks[stage]; ++b) {
      conv_bn(in, width, 1);
      conv_bn(width, width, 3);
      conv_bn(width, 4 * width, 1);
      if (b == 0) conv_bn(in, 4 * width, 1);  // projection shortcut
      in = 4 * width;
    }
  }
  t.push_back(2048.0 * 1000);
  t.push_back(1000);
  std::reverse(t.begin(), t.end());
  return t;
}

// VGG-16 (Simonyan & Zisserman 2014, configuration D): 32 tensors, 138.4 M.
std::vector<double> vgg16_tensors() {
  std::vector<double> t;
  double in = 3;
  for (double out : {64, 64, 128, 128, 256, 256, 256, 512, 512, 512, 512, 512, 512}) {
    t.push_back(in * out * 9);
    t.push_back(out);
    in = out;
  }
  for (auto [a, b] : {std::pair{25088.0, 4096.0}, {4096.0, 4096.0}, {4096.0, 1000.0}}) {
    t.push_back(a * b);
    t.push_back(b);
  }
  std::reverse(t.begin(), t.end());
  return t;
}

// How the projected job communicates.
struct Variant {
  std::string name;
  bool fusion, hierarchy, fp16;
};

struct Cluster {
  int workers, per_host;
  double link_bytes_per_s;
};

// Seconds of one message: the cheaper of the ring (hierarchical or flat) and
// the tree, as a tuned library picks per size.
double message_seconds(double bytes, const Cluster& c, bool hierarchy, const CostParams& p) {
  const Placement placement{c.workers / c.per_host, c.per_host, c.link_bytes_per_s};
  const double ring =
      allreduce_seconds(hierarchy ? "hierarchical" : "flat_ring", bytes, placement, p);
  return std::min(ring, allreduce_seconds("tree", bytes, placement, p));
}

// Step time over compute time: gradients become ready uniformly over the
// backward pass (2/3 of the step's compute), messages (fusion: 25 MiB
// buckets in backward order, kolo's DistributedOptimizer default; no
// fusion: one per tensor) go out as they are ready and one at a time, and
// the step ends when the last is done.
double efficiency(const Workload& w, const Variant& v, const Cluster& c, const CostParams& p) {
  const double compute = w.batch / w.images_per_s;
  const double backward = compute * 2.0 / 3.0, forward = compute - backward;
  const double element = v.fp16 ? 2.0 : 4.0;
  double total = 0;
  for (double e : w.tensors) total += e;
  const double bucket_bytes = 25.0 * (1 << 20);
  double ready = 0, done = 0, pending = 0, pending_ready = 0;
  auto send = [&](double bytes, double at) {
    done = std::max(done, at) + message_seconds(bytes, c, v.hierarchy, p);
  };
  for (double e : w.tensors) {
    ready += e;
    const double at = forward + backward * ready / total;
    if (!v.fusion) {
      send(e * element, at);
      continue;
    }
    pending += e * element;
    pending_ready = at;
    if (pending >= bucket_bytes) {
      send(pending, pending_ready);
      pending = 0;
    }
  }
  if (pending > 0) send(pending, pending_ready);
  return compute / std::max(compute, done);
}

}  // namespace

double allreduce_seconds(const std::string& algorithm, double bytes, const Placement& placement,
                         const CostParams& params) {
  const Features f = features(algorithm, bytes, placement);
  const Features theta = as_vector(params);
  double seconds = 0;
  for (size_t j = 0; j < kParams; ++j) seconds += f[j] * theta[j];
  return seconds;
}

int run_model_bench(const ModelBenchOptions& options) {
  const Loaded loaded = load(options.data_dir);
  const std::set<std::string> held_configs(options.held_out.begin(), options.held_out.end());
  auto held_size = [&](double bytes) {
    return std::find(options.held_out_bytes.begin(), options.held_out_bytes.end(), bytes) !=
           options.held_out_bytes.end();
  };
  std::vector<AllreduceSample> train, test;
  for (const auto& s : loaded.samples) {
    (held_configs.count(s.config) || held_size(s.bytes) ? test : train).push_back(s);
  }
  double rms = 0;
  const CostParams params = fit_cost_params(train, &rms);
  std::string docs = "Command: `" + options.command_line + "` (data: `" + options.data_dir +
                     "`, from `scripts/bench_hosts.sh` on a shared 2-core machine)\n\n";

  Report fitted;
  fitted.title = "Fitted parameters (" + std::to_string(train.size()) +
                 " measurements; RMS relative error of the fit " + format_fixed(100 * rms, 1) +
                 "%)";
  fitted.columns = {"parameter", "value", "meaning"};
  auto add_param = [&](const std::string& name, double value, const std::string& shown,
                       const std::string& meaning) {
    fitted.add_row({name, shown, meaning}, {{"parameter", name}, {"value", value}});
  };
  add_param("alpha_cross", params.alpha_cross, format_fixed(params.alpha_cross * 1e6, 1) + " us",
            "per ring/tree step across hosts");
  add_param("link_factor", params.link_factor, format_fixed(params.link_factor, 3),
            "link time = factor x bytes over the link / measured TCP rate");
  add_param("net_per_byte", params.net_per_byte,
            params.net_per_byte > 0 ? format_fixed(1e-9 / params.net_per_byte, 2) + " GB/s" : "0",
            "TCP cost per byte a rank sends or receives, reduction included (as a rate)");
  add_param("alpha_local", params.alpha_local, format_fixed(params.alpha_local * 1e6, 1) + " us",
            "per shm phase");
  add_param(
      "local_per_byte", params.local_per_byte,
      params.local_per_byte > 0 ? format_fixed(1e-9 / params.local_per_byte, 2) + " GB/s" : "0",
      "shm traffic per rank, reduction included (as a rate)");

  Report check;
  check.title = "Held out of the fit: predicted against measured allreduce time";
  check.columns = {"config", "algorithm", "bytes", "measured us", "predicted us", "error"};
  int within = 0, within_big = 0, big = 0;
  std::vector<AllreduceSample> sorted = test;
  std::sort(sorted.begin(), sorted.end(), [](const AllreduceSample& a, const AllreduceSample& b) {
    return std::tie(a.config, a.algorithm, a.bytes) < std::tie(b.config, b.algorithm, b.bytes);
  });
  for (const auto& s : sorted) {
    const double predicted = allreduce_seconds(s.algorithm, s.bytes, s.placement, params);
    const double error = (predicted - s.seconds) / s.seconds;
    within += std::abs(error) <= 0.15;
    if (s.bytes >= (1 << 20)) {
      ++big;
      within_big += std::abs(error) <= 0.15;
    }
    check.add_row({s.config, s.algorithm, format_bytes(s.bytes), format_fixed(s.seconds * 1e6, 0),
                   format_fixed(predicted * 1e6, 0),
                   (error >= 0 ? "+" : "") + format_fixed(100 * error, 1) + "%"},
                  {{"config", s.config},
                   {"algorithm", s.algorithm},
                   {"bytes", s.bytes},
                   {"measured_us", s.seconds * 1e6},
                   {"predicted_us", predicted * 1e6},
                   {"error", error}});
  }
  check.notes.push_back("within 15%: " + std::to_string(within) + " of " +
                        std::to_string(test.size()) + " held-out measurements; " +
                        std::to_string(within_big) + " of " + std::to_string(big) + " at >= 1 MiB");

  // Projection (docs/scale.md states the assumptions).
  double tcp_efficiency = loaded.tcp_efficiency();
  if (tcp_efficiency <= 0) {
    throw ContractError(
        "kolo-bench model: no run on a link shaped below what this machine moves "
        "unshaped; measure one (scripts/bench_hosts.sh 2x2@1gbit)");
  }
  CostParams cluster_params;
  cluster_params.alpha_cross = 25e-6;
  cluster_params.link_factor = params.link_factor;
  cluster_params.alpha_local = 10e-6;
  cluster_params.local_per_byte = 1.0 / 10e9;
  const std::vector<Workload> workloads = {
      {"ResNet-50", resnet50_tensors(), 219, 64},
      {"VGG-16", vgg16_tensors(), 154, 64},
  };
  const std::vector<Variant> variants = {
      {"nothing (flat ring, per tensor, fp32)", false, false, false},
      {"fusion", true, false, false},
      {"fusion + hierarchy", true, true, false},
      {"fusion + hierarchy + fp16", true, true, true},
      {"hierarchy + fp16, no fusion", false, true, true},
  };
  const std::vector<int> worker_counts = {8, 16, 32, 64, 128, 256, 512};
  Report projection;
  projection.title =
      "Projected scaling efficiency (8 workers per host; per-worker throughput "
      "relative to one GPU alone)";
  projection.columns = {"model", "link", "communication"};
  for (int n : worker_counts) projection.columns.push_back(std::to_string(n));
  for (const auto& w : workloads) {
    for (double gbit : {25.0, 100.0}) {
      for (const auto& v : variants) {
        std::vector<std::string> cells = {w.name, format_fixed(gbit, 0) + " Gbit/s", v.name};
        nlohmann::json row = {{"model", w.name}, {"link_gbit", gbit}, {"variant", v.name}};
        for (int n : worker_counts) {
          const Cluster c{n, 8, gbit * 1e9 / 8 * tcp_efficiency};
          const double e = efficiency(w, v, c, cluster_params);
          cells.push_back(format_fixed(100 * e, 0) + "%");
          row["efficiency_" + std::to_string(n)] = e;
        }
        projection.add_row(cells, row);
      }
    }
  }
  double params_m[2] = {0, 0};
  for (int k = 0; k < 2; ++k)
    for (double e : workloads[k].tensors) params_m[k] += e / 1e6;
  projection.notes.push_back(
      "ResNet-50 " + format_fixed(params_m[0], 1) + " M parameters in " +
      std::to_string(workloads[0].tensors.size()) + " tensors, VGG-16 " +
      format_fixed(params_m[1], 1) + " M in " + std::to_string(workloads[1].tensors.size()) +
      "; compute per step = 64 / published P100 images/s (219, 154); link = nominal x " +
      format_fixed(tcp_efficiency, 3) +
      " (TCP's share of the shaped links measured here) x "
      "the fitted link_factor; alpha_cross 25 us, shm/PCIe 10 GB/s per rank, reduction and "
      "TCP copies free (on the GPU, or overlapped)");

  for (Report* r : {&fitted, &check, &projection}) {
    if (options.json) {
      for (const auto& row : r->json_rows) std::cout << row.dump() << "\n";
    } else {
      std::cout << r->text() << "\n";
    }
  }
  if (!options.docs_path.empty()) {
    // markdown() ends with the report's notes as a list.
    auto body = [&](const Report& r) { return docs + "**" + r.title + "**\n\n" + r.markdown(); };
    write_docs_section(options.docs_path, "model-fit", body(fitted));
    write_docs_section(options.docs_path, "model-check", body(check));
    write_docs_section(options.docs_path, "model-projection", body(projection));
    if (!options.json) std::cout << "wrote the model sections of " << options.docs_path << "\n";
  }
  return 0;
}

}  // namespace kolo::bench
