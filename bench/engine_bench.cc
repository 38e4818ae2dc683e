#include "engine_bench.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <iostream>
#include <memory>
#include <numeric>

#include "bench_report.h"
#include "kolo/core/engine.h"
#include "kolo/kolo.h"

namespace kolo::bench {

std::vector<ParamShape> resnet50_parameters() {
  std::vector<ParamShape> params;
  auto conv = [&](const std::string& name, int64_t out, int64_t in, int64_t k) {
    params.push_back({name + ".weight", {out, in, k, k}});
  };
  auto bn = [&](const std::string& name, int64_t channels) {
    params.push_back({name + ".weight", {channels}});
    params.push_back({name + ".bias", {channels}});
  };
  conv("conv1", 64, 3, 7);
  bn("bn1", 64);
  // Bottleneck stages: (planes, blocks); each block is 1x1 -> 3x3 -> 1x1 (x4
  // expansion), and a stage's first block has a 1x1 downsample projection.
  const int64_t stages[4][2] = {{64, 3}, {128, 4}, {256, 6}, {512, 3}};
  int64_t inplanes = 64;
  for (int s = 0; s < 4; ++s) {
    const int64_t planes = stages[s][0];
    for (int64_t b = 0; b < stages[s][1]; ++b) {
      const std::string block = "layer" + std::to_string(s + 1) + "." + std::to_string(b);
      conv(block + ".conv1", planes, inplanes, 1);
      bn(block + ".bn1", planes);
      conv(block + ".conv2", planes, planes, 3);
      bn(block + ".bn2", planes);
      conv(block + ".conv3", planes * 4, planes, 1);
      bn(block + ".bn3", planes * 4);
      if (b == 0) {
        conv(block + ".downsample.0", planes * 4, inplanes, 1);
        bn(block + ".downsample.1", planes * 4);
      }
      inplanes = planes * 4;
    }
  }
  params.push_back({"fc.weight", {1000, 2048}});
  params.push_back({"fc.bias", {1000}});
  return params;
}

namespace {

constexpr std::chrono::seconds kStepTimeout{300};  // a broken engine fails, never hangs

// One gradient set: f32 tensors laid out back to back in one allocation, and
// the order a step submits them in.
struct Workload {
  std::string name;
  std::vector<std::string> tensor_names;
  std::vector<TensorView> views;
  std::vector<size_t> submit_order;
  std::vector<float> storage;
  size_t total_floats = 0;
};

Workload make_workload(const std::string& name, const EngineBenchOptions& options) {
  Workload w;
  w.name = name;
  std::vector<std::vector<int64_t>> shapes;
  if (name == "resnet50") {
    for (const ParamShape& p : resnet50_parameters()) {
      w.tensor_names.push_back("grad/" + p.name);
      shapes.push_back(p.shape);
    }
  } else if (name == "small") {
    const int64_t floats = static_cast<int64_t>(options.small_tensor_bytes / sizeof(float));
    for (int i = 0; i < options.small_tensors; ++i) {
      w.tensor_names.push_back("small/" + std::to_string(i));
      shapes.push_back({floats});
    }
  } else {
    throw ContractError("kolo-bench engine: unknown workload '" + name +
                        "'; use resnet50 or small");
  }
  std::vector<size_t> offsets;
  for (const auto& shape : shapes) {
    offsets.push_back(w.total_floats);
    w.total_floats += static_cast<size_t>(
        std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<int64_t>()));
  }
  w.storage.assign(w.total_floats, 0.0f);
  for (size_t i = 0; i < shapes.size(); ++i)
    w.views.push_back({w.storage.data() + offsets[i], DType::kF32, shapes[i]});
  w.submit_order.resize(shapes.size());
  std::iota(w.submit_order.begin(), w.submit_order.end(), size_t{0});
  // Backward produces the last layer's gradients first.
  if (name == "resnet50") std::reverse(w.submit_order.begin(), w.submit_order.end());
  return w;
}

// One training step's communication: every gradient averaged in place.
void run_step(Engine& engine, Workload& w, std::vector<Handle>& handles) {
  handles.clear();
  for (size_t i : w.submit_order)
    handles.push_back(engine.allreduce_async(w.tensor_names[i], w.views[i], w.views[i]));
  for (const Handle& h : handles) h.wait(kStepTimeout);
}

// Fills every gradient with rank + 1, runs one step and checks the average
// (n + 1) / 2 arrived everywhere: the numbers below are of a working engine.
void check_step(Engine& engine, Workload& w, int rank, int n, std::vector<Handle>& handles) {
  std::fill(w.storage.begin(), w.storage.end(), static_cast<float>(rank + 1));
  run_step(engine, w, handles);
  const float expected = static_cast<float>(n + 1) / 2.0f;
  for (size_t i = 0; i < w.storage.size(); ++i) {
    if (std::fabs(w.storage[i] - expected) > 1e-5f * expected)
      throw RuntimeFault("kolo-bench engine: workload " + w.name + " element " + std::to_string(i) +
                         " is " + std::to_string(w.storage[i]) +
                         " after one averaged step, expected " + std::to_string(expected) +
                         " (rank " + std::to_string(rank) + ")");
  }
}

// An engine on its own communicator (and its own store namespace, so the
// engines of one run never share keys). Engines are built and destroyed one
// at a time: an idle engine's thread would otherwise share the cores with the
// one being measured.
std::unique_ptr<Engine> make_engine(Runtime& runtime, const std::string& name,
                                    const EngineOptions& engine_options) {
  Communicator& world = runtime.world();
  const std::string backend = world.backend();
  const std::string prefix = "bench/engine/" + name;
  std::shared_ptr<Store> store = runtime.store();  // null under mpirun (mpi needs none)
  const int world_rank = world.rank();

  CommunicatorOptions comm_options;
  comm_options.rank = world_rank;
  comm_options.size = world.size();
  comm_options.store = store;
  comm_options.prefix = prefix;
  comm_options.check_args = false;  // the engine validates requests in its negotiation
  auto comm = make_communicator(backend, comm_options);

  CommunicatorFactory factory = [backend, store, prefix, world_rank](const std::vector<int>& ranks,
                                                                     int set_id) {
    const auto member = std::find(ranks.begin(), ranks.end(), world_rank);
    if (member == ranks.end())
      throw ContractError("kolo-bench engine: process set " + std::to_string(set_id) +
                          ": this rank is not a member");
    CommunicatorOptions set_options;
    set_options.rank = static_cast<int>(member - ranks.begin());
    set_options.size = static_cast<int>(ranks.size());
    set_options.store = store;
    set_options.prefix = prefix + "/set" + std::to_string(set_id);
    set_options.check_args = false;
    set_options.world_ranks = ranks;  // mpi builds the set from MPI_COMM_WORLD's group
    return make_communicator(backend, set_options);
  };
  return std::make_unique<Engine>(std::move(comm), factory, engine_options);
}

struct Row {
  std::string workload, mode;
  size_t tensors = 0, bytes = 0;
  double time_us = 0;
  double collectives_per_step = 0;  // engine modes only
};

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

// Median step time (slowest rank) of `workload` on a fresh engine (checked
// before and after), and the communicator calls one step made.
std::pair<double, double> measure_engine(Runtime& runtime, const std::string& name,
                                         const EngineOptions& engine_options, Workload& w,
                                         const EngineBenchOptions& options) {
  Communicator& world = runtime.world();
  auto engine = make_engine(runtime, name, engine_options);
  std::vector<Handle> handles;
  check_step(*engine, w, world.rank(), world.size(), handles);
  const Engine::Stats before = engine->stats();
  run_step(*engine, w, handles);
  const Engine::Stats after = engine->stats();

  TimingOptions timing = options.timing;
  timing.rep_ms = 0;  // one step per repetition
  const double time_us = time_collective_us(
      world, [&] { run_step(*engine, w, handles); }, timing);
  check_step(*engine, w, world.rank(), world.size(), handles);  // still right after the runs
  return {time_us, static_cast<double>(after.collectives - before.collectives)};
}

// The floor: one allreduce (average, in place) of the workload's total bytes.
double measure_single_buffer(Communicator& world, std::vector<float>& buffer,
                             const EngineBenchOptions& options) {
  AllreduceOptions average;
  average.op = ReduceOp::kAverage;
  TimingOptions timing = options.timing;
  timing.rep_ms = 0;
  return time_collective_us(
      world,
      [&] { world.allreduce(buffer.data(), buffer.data(), buffer.size(), DType::kF32, average); },
      timing);
}

}  // namespace

int run_engine_bench(const EngineBenchOptions& options) {
  kolo::init();
  Runtime& runtime = kolo::runtime();
  Communicator& world = runtime.world();
  const int n = world.size();
  const bool root = world.rank() == 0;
  const std::string backend = world.backend();

  std::vector<Workload> workloads;
  for (const std::string& name : options.workloads)
    workloads.push_back(make_workload(name, options));

  // Engines under test: the configured settings (KOLO_CYCLE_TIME_MS,
  // KOLO_FUSION_THRESHOLD_BYTES...: what kolo::runtime().engine() would use),
  // and the same with fusion off; timed runs never autotune or trace.
  EngineOptions fused = EngineOptions::from_config(runtime.config());
  fused.timeline_path.clear();
  fused.autotune = false;
  EngineOptions unfused = fused;
  unfused.fusion_threshold_bytes = 0;

  // The three modes take turns, round after round, and each mode's result is
  // the median of its rounds: a burst of load from other processes then hits
  // every mode alike instead of one. Only one engine is alive at a time (an
  // idle engine thread still negotiates every millisecond), so the engines are
  // the bench's own, built and destroyed per round rather than the runtime's
  // long-lived one.
  struct Samples {
    std::vector<double> fused_us, unfused_us, single_us;
    double fused_collectives = 0, unfused_collectives = 0;
  };
  std::vector<Samples> samples(workloads.size());
  for (int round = 0; round < options.rounds; ++round) {
    for (size_t i = 0; i < workloads.size(); ++i) {
      Workload& w = workloads[i];
      const std::string tag = w.name + "/" + std::to_string(round);
      {
        std::vector<float> buffer(w.total_floats, 1.0f);
        samples[i].single_us.push_back(measure_single_buffer(world, buffer, options));
      }
      auto [unfused_us, unfused_calls] =
          measure_engine(runtime, tag + "/unfused", unfused, w, options);
      samples[i].unfused_us.push_back(unfused_us);
      samples[i].unfused_collectives = unfused_calls;
      auto [fused_us, fused_calls] = measure_engine(runtime, tag + "/fused", fused, w, options);
      samples[i].fused_us.push_back(fused_us);
      samples[i].fused_collectives = fused_calls;
    }
  }
  std::vector<Row> rows;
  for (size_t i = 0; i < workloads.size(); ++i) {
    const Workload& w = workloads[i];
    const size_t bytes = w.total_floats * sizeof(float);
    rows.push_back({w.name, "fused", w.views.size(), bytes, median(samples[i].fused_us),
                    samples[i].fused_collectives});
    rows.push_back({w.name, "unfused", w.views.size(), bytes, median(samples[i].unfused_us),
                    samples[i].unfused_collectives});
    rows.push_back({w.name, "single_buffer", 1, bytes, median(samples[i].single_us), 1});
  }
  const int64_t threshold = fused.fusion_threshold_bytes;
  const double cycle_time_ms = fused.cycle_time_ms;

  // A timeline of a few untimed fused steps, recorded by rank 0.
  if (!options.timeline_path.empty()) {
    EngineOptions traced = EngineOptions::from_config(runtime.config());
    traced.timeline_path = root ? options.timeline_path : "";
    traced.timeline_all_ranks = false;
    traced.autotune = false;
    auto traced_engine = make_engine(runtime, "timeline", traced);
    std::vector<Handle> handles;
    for (Workload& w : workloads)
      for (int step = 0; step < options.timeline_steps; ++step)
        run_step(*traced_engine, w, handles);
    traced_engine.reset();  // closes the trace
    if (root)
      std::cerr << "kolo-bench engine: wrote the timeline " << options.timeline_path << "\n";
  }

  if (!root) {
    kolo::shutdown();
    return 0;
  }

  auto find = [&](const std::string& workload, const std::string& mode) -> const Row* {
    for (const Row& r : rows)
      if (r.workload == workload && r.mode == mode) return &r;
    return nullptr;
  };

  Report report;
  report.title = "engine step (f32 average, " + std::to_string(n) + " ranks, " + backend +
                 "): median step time, slowest rank";
  report.columns = {
      "workload",         "tensors",           "bytes", "mode", "step us", "x single buffer",
      "collectives/step", "overhead us/tensor"};
  for (const Row& r : rows) {
    const Row* single = find(r.workload, "single_buffer");
    const bool engine_mode = r.mode != "single_buffer";
    const Row* base = find(r.workload, "fused");
    const size_t tensors = base ? base->tensors : r.tensors;
    const double overhead =
        engine_mode && single ? (r.time_us - single->time_us) / static_cast<double>(tensors) : 0;
    nlohmann::json json = {{"workload", r.workload}, {"mode", r.mode},       {"backend", backend},
                           {"world_size", n},        {"time_us", r.time_us}, {"tensors", tensors},
                           {"bytes", r.bytes}};
    if (engine_mode) {
      json["collectives_per_step"] = r.collectives_per_step;
      json["overhead_us_per_tensor"] = overhead;
    }
    report.add_row({r.workload, std::to_string(tensors), format_bytes(static_cast<double>(r.bytes)),
                    r.mode, format_fixed(r.time_us, r.time_us < 100 ? 1 : 0),
                    single ? format_fixed(r.time_us / single->time_us, 2) : "",
                    engine_mode ? format_fixed(r.collectives_per_step, 0) : "1",
                    engine_mode ? format_fixed(overhead, 2) : ""},
                   json);
  }

  // The targets (2 ranks, shm).
  const Row* r_fused = find("resnet50", "fused");
  const Row* r_single = find("resnet50", "single_buffer");
  const Row* s_fused = find("small", "fused");
  const Row* s_unfused = find("small", "unfused");
  report.notes.push_back("fusion threshold " + format_bytes(static_cast<double>(threshold)) +
                         ", cycle time " + format_fixed(cycle_time_ms, 2) + " ms");
  if (r_fused && r_single) {
    const double ratio = r_fused->time_us / r_single->time_us;
    report.notes.push_back("resnet50 fused / single buffer: " + format_fixed(ratio, 2) +
                           "x (target <= 1.25x: " + (ratio <= 1.25 ? "met" : "NOT met") + ")");
  }
  if (s_fused && s_unfused) {
    const double speedup = s_unfused->time_us / s_fused->time_us;
    report.notes.push_back("small fused speed-up over unfused: " + format_fixed(speedup, 1) +
                           "x (target >= 10x: " + (speedup >= 10 ? "met" : "NOT met") + ")");
  }

  if (options.json) {
    for (const auto& row : report.json_rows) std::cout << row.dump() << "\n";
  } else {
    std::cout << report.text() << "\n";
  }
  if (!options.docs_path.empty()) {
    std::string body = "Command: `" + options.command_line + "` (" + std::to_string(n) +
                       " ranks, " + backend + "; median of " + std::to_string(options.rounds) +
                       " rounds, each the median of " + std::to_string(options.timing.repeats) +
                       " steps after " + std::to_string(options.timing.warmup) +
                       " warm-up steps, the modes taking turns; slowest rank counts; each engine "
                       "checks its averages before and after timing)\n\n" +
                       "The ResNet-50-like set is its 161 parameter tensors (25,557,032 f32) "
                       "submitted in reverse order, as backward produces them; the small set is " +
                       std::to_string(options.small_tensors) + " tensors of " +
                       format_bytes(static_cast<double>(options.small_tensor_bytes)) +
                       ". `single_buffer` is one allreduce of the same total bytes on the raw "
                       "world communicator; overhead per tensor = (engine step - single buffer) "
                       "/ tensors.\n\n" +
                       "**" + report.title + "**\n\n" + report.markdown() + "\n";
    write_docs_section(options.docs_path, "engine", body);
    std::cout << "wrote the engine section of " << options.docs_path << "\n";
  }
  kolo::shutdown();
  return 0;
}

}  // namespace kolo::bench
