// Running agreed responses (engine_impl.h): fusion batches packed into the
// fusion buffer, joined ranks' neutral inputs, the communicator calls, and
// unpacking into each request's output.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <tuple>
#include <vector>

#include "engine/engine_impl.h"
#include "kolo/core/errors.h"
#include "kolo/core/split.h"

namespace kolo {

namespace {

// Requests larger than this run alone, directly on the caller's buffers,
// instead of being packed into a fusion buffer. Packing costs two extra
// copies of the tensor (in and out); on shm a 256 KiB copy costs about what
// one collective's fixed latency does, so beyond it fusion loses (measured
// on 2 shm ranks: the ResNet-50 gradient set packed whole ran ~2.9x the
// single-buffer allreduce, since pack + unpack triple the memory traffic of
// shm's cache-pipelined allreduce).
constexpr int64_t kMaxFusedTensorBytes = 256 << 10;

// The reduction a response runs: averages over the ranks that contributed
// (ranks that joined add neutral zeros and are not counted).
AllreduceOptions reduce_options(const Response& r, int set_size) {
  AllreduceOptions o;
  o.op = r.op;
  o.prescale = r.prescale;
  o.postscale = r.postscale;
  if (r.op == ReduceOp::kAverage && r.contributors < set_size) {
    o.op = ReduceOp::kSum;
    o.postscale = r.postscale / r.contributors;
  }
  return o;
}

}  // namespace

// ---- execution ----------------------------------------------------------------

void Engine::Impl::execute(SetState& set, std::vector<Item>& data) {
  // Batches: allreduces with the same dtype and reduction, allgathers, and
  // broadcasts with the same root are packed together up to the fusion
  // threshold (greedy, in response order); the rest run one by one. Batches
  // run in the order of their first response, identically on every rank.
  const int n = static_cast<int>(set.ranks.size());
  const int64_t threshold = current_fusion_threshold_bytes;
  struct Batch {
    std::vector<Item> items;
    int64_t bytes = 0;
    bool open = true;
  };
  std::vector<Batch> batches;
  // Fusion key: kind, dtype, reduction, scales, root. Responses with equal
  // keys may share a batch.
  using Key = std::tuple<int, int, int, double, double, int>;
  std::map<Key, size_t> open_batch;  // key -> index in batches
  for (const Item& item : data) {
    const Response* r = item.r;
    int64_t bytes = 0;
    bool fusable = true;
    // Host and device tensors never share a batch (nor do their buffers).
    const int kind_key = static_cast<int>(r->kind) * kNumDeviceTypes + static_cast<int>(r->device);
    Key key{kind_key, 0, 0, 0.0, 0.0, 0};
    const int64_t esize = static_cast<int64_t>(dtype_size(r->dtype));
    switch (r->kind) {
      case RequestKind::kAllreduce: {
        const AllreduceOptions o = reduce_options(*r, n);
        bytes = r->elements() * esize;
        key = Key{
            kind_key, static_cast<int>(r->dtype), static_cast<int>(o.op), o.prescale, o.postscale,
            0};
        break;
      }
      case RequestKind::kAllgather: {  // fused as bytes: any dtypes together
        int64_t rows = 0;
        for (int64_t v : r->rows) rows += v;
        bytes = rows * r->row_elements() * esize;
        break;
      }
      case RequestKind::kBroadcast:  // fused as bytes, per root
        bytes = r->elements() * esize;
        std::get<5>(key) = r->root;
        break;
      default:
        fusable = false;
        break;
    }
    // Packing costs two extra copies of the tensor; above this size they cost
    // more than the collective's fixed latency that fusion saves. A native
    // segmented allreduce (shm) packs nothing, so there every allreduce fuses.
    if (bytes > kMaxFusedTensorBytes &&
        !(r->kind == RequestKind::kAllreduce && r->device == DeviceType::kCPU &&
          set.comm->native_segments())) {
      fusable = false;
    }
    if (fusable && threshold > 0) {
      auto it = open_batch.find(key);
      if (it != open_batch.end()) {
        Batch& b = batches[it->second];
        if (b.bytes + bytes <= threshold) {
          b.items.push_back(item);
          b.bytes += bytes;
          continue;
        }
      }
      open_batch[key] = batches.size();
    }
    batches.push_back(Batch{{item}, bytes, true});
  }

  for (Batch& b : batches) {
    const Item& first = b.items.front();
    try {
      const Route where = route(set, *first.r);
      prepare_device_inputs(set, where, b.items);
      switch (first.r->kind) {
        case RequestKind::kAllreduce:
          run_allreduce(set, where, b.items);
          break;
        case RequestKind::kAllgather:
          run_allgather(set, where, b.items);
          break;
        case RequestKind::kBroadcast:
          run_broadcast(set, where, b.items);
          break;
        case RequestKind::kReducescatter:
          run_reducescatter(set, where, first);
          break;
        case RequestKind::kAlltoall:
          run_alltoall(set, where, first);
          break;
        default:
          break;
      }
    } catch (const RuntimeFault&) {
      throw;  // the communicator is gone: the run loop fails everything
    } catch (const std::exception& e) {
      // A communicator's ContractError is raised on every rank alike, so the
      // engine stays in step: fail this batch and go on.
      const auto error = std::make_exception_ptr(ContractError(e.what()));
      for (const Item& item : b.items) finish(set, item.req, error);
    }
    wake_finished();
  }
}

// ---- CUDA routes ----------------------------------------------------------------

namespace {

uint64_t fnv1a(const std::string& text) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : text) h = (h ^ c) * 1099511628211ull;
  return h;
}

}  // namespace

Engine::Impl::Route Engine::Impl::route(SetState& set, const Response& first) {
  if (first.device == DeviceType::kCPU) return Route{set.comm, &host_memory, false};
  if (set.cuda_route == SetState::CudaRoute::kUndecided) decide_cuda_route(set);
  bool nccl = set.cuda_route == SetState::CudaRoute::kNccl;
  if (nccl &&
      (first.kind == RequestKind::kAllreduce || first.kind == RequestKind::kReducescatter)) {
    // What NCCL cannot reduce exactly as the host backends do is staged.
    const AllreduceOptions o = reduce_options(first, static_cast<int>(set.ranks.size()));
    if (first.dtype == DType::kI16 || o.prescale != 1.0 || o.postscale != 1.0) nccl = false;
  }
  if (nccl) return Route{set.nccl.get(), set.nccl_memory.get(), false};
  return Route{set.comm, &host_memory, true};
}

void Engine::Impl::decide_cuda_route(SetState& set) {
  // Every member votes (an allgather on the set's host communicator, at the
  // same response on every member): whether it can run NCCL, and which
  // physical GPU it uses. NCCL needs all able and no GPU shared.
  const std::string& mode = options.cuda_comm;
  const int n = static_cast<int>(set.ranks.size());
  int device_index = 0;
  DeviceRuntime* runtime = nullptr;
  {
    std::lock_guard<std::mutex> lock(device_mutex);
    device_index = std::max(bound_device, 0);
    runtime = device.get();
  }
  struct Vote {
    uint64_t gpu = 0;
    uint64_t able = 0;
  } mine;
  if (mode != "staged" && options.device_communicators && runtime) {
    try {
      mine.gpu = fnv1a(runtime->identity(device_index));
      mine.able = 1;
    } catch (const std::exception& e) {
      logger.info(std::string("NCCL is not usable here: ") + e.what());
    }
  }
  std::vector<Vote> votes(n);
  set.comm->allgather(&mine, votes.data(), sizeof(Vote), DType::kU8, CollectiveOptions{});
  std::string unable, shared;
  for (int k = 0; k < n; ++k) {
    if (!votes[k].able) unable += (unable.empty() ? "" : ", ") + std::to_string(set.ranks[k]);
    for (int j = 0; j < k; ++j) {
      if (votes[k].able && votes[j].able && votes[k].gpu == votes[j].gpu) {
        shared += (shared.empty() ? "" : ", ") + std::to_string(set.ranks[j]) + " and " +
                  std::to_string(set.ranks[k]);
      }
    }
  }
  if (mode == "staged" || !unable.empty() || !shared.empty()) {
    if (mode == "nccl") {
      std::string why = !unable.empty()
                            ? "rank(s) " + unable +
                                  " cannot run NCCL (kolo built without CUDA, no NCCL library, "
                                  "or a device runtime that is not CUDA's)"
                            : "ranks " + shared +
                                  " share one GPU, and NCCL cannot run two "
                                  "ranks on one GPU";
      throw ContractError("kolo engine: KOLO_CUDA_COMM=nccl, but " + why +
                          "; give each rank a GPU of its own (KOLO_LOCAL_RANK picks it), or "
                          "set KOLO_CUDA_COMM=auto to stage CUDA tensors through the host "
                          "backend");
    }
    set.cuda_route = SetState::CudaRoute::kStaged;
    logger.info("CUDA tensors of process set " + std::to_string(set.id) +
                " are staged through the " + set.comm->backend() + " backend");
    return;
  }
  set.nccl = options.device_communicators(set.ranks, set.id, device_index);
  set.nccl_memory = std::make_unique<detail::BatchMemory>(runtime, device_index);
  set.cuda_route = SetState::CudaRoute::kNccl;
  logger.info("CUDA tensors of process set " + std::to_string(set.id) + " run on NCCL");
}

void Engine::Impl::prepare_device_inputs(SetState& set, const Route& where,
                                         const std::vector<Item>& batch) {
  if (!where.staged && !where.mem->on_device()) return;
  const int n = static_cast<int>(set.ranks.size());
  for (const Item& item : batch) {
    Request* req = item.req;
    if (!req) continue;
    if (!where.staged) {
      staging->runtime()->wait(req->ready);
      continue;
    }
    const size_t esize = dtype_size(item.r->dtype);
    int64_t in_elements = 1;
    for (int64_t d : req->info.shape) in_elements *= d;
    size_t out_bytes = 0;
    if (item.r->kind == RequestKind::kAllreduce) out_bytes = in_elements * esize;
    if (item.r->kind == RequestKind::kReducescatter) {
      int64_t out_elements = 1;
      for (int64_t d : Engine::reducescatter_shape(req->info.shape, n, set.set_rank)) {
        out_elements *= d;
      }
      out_bytes = static_cast<size_t>(out_elements) * esize;
    }
    staging->stage_in(*req, static_cast<size_t>(in_elements) * esize, out_bytes);
  }
}

TensorView Engine::Impl::allocate_output(Request* request, const std::vector<int64_t>& shape,
                                         std::exception_ptr* error) {
  TensorView view;
  try {
    if (!request->allocate) throw ContractError("no AllocateOutput was given");
    view = request->allocate(shape);
    int64_t numel = 1;
    for (int64_t d : shape) numel *= d;
    if (view.dtype != request->in.dtype) {
      throw ContractError(std::string("the allocated output has dtype ") + dtype_name(view.dtype) +
                          ", expected " + dtype_name(request->in.dtype));
    }
    if (view.numel() != numel) {
      throw ContractError("the allocated output has " + std::to_string(view.numel()) +
                          " elements, expected " + std::to_string(numel) + " (shape " +
                          detail::shape_text(shape) + ")");
    }
    if (numel > 0 && view.data == nullptr) {
      throw ContractError("the allocated output's data is null");
    }
    return view;
  } catch (const std::exception& e) {
    *error = std::make_exception_ptr(ContractError(
        std::string("kolo engine: ") + request_kind_name(request->info.kind) + " of tensor '" +
        request->info.name + "': AllocateOutput failed: " + e.what()));
    return TensorView{};
  }
}

void Engine::Impl::run_allreduce(SetState& set, const Route& route,
                                 const std::vector<Item>& batch) {
  const int n = static_cast<int>(set.ranks.size());
  const Response& first = *batch.front().r;
  const AllreduceOptions o = reduce_options(first, n);
  const size_t esize = dtype_size(first.dtype);
  if (batch.size() == 1) {
    Request* req = batch.front().req;
    const size_t count = static_cast<size_t>(first.elements());
    const void* in;
    void* out;
    if (req) {
      in = req->in.data;
      out = req->out.data;
    } else {
      out = route.mem->scratch.get(count * esize);
      route.mem->fill_neutral(out, count, first.dtype, first.op, first.prescale);
      in = out;
    }
    phase_end(req, TimelinePhase::kQueue);
    phase_begin(req, TimelinePhase::kCollective, "ALLREDUCE");
    route.comm->allreduce(in, out, count, first.dtype, o);
    count_collective(count * esize);
    phase_end(req, TimelinePhase::kCollective);
    finish(set, req, nullptr);
    return;
  }
  if (route.comm->native_segments()) {
    run_allreduce_segments(set, route, batch, o);
    return;
  }
  size_t total = 0;
  for (const Item& item : batch) total += static_cast<size_t>(item.r->elements());
  uint8_t* buffer = route.mem->fusion.get(total * esize);
  size_t offset = 0;
  for (const Item& item : batch) {
    const Response* r = item.r;
    Request* req = item.req;
    const size_t bytes = static_cast<size_t>(r->elements()) * esize;
    phase_end(req, TimelinePhase::kQueue);
    phase_begin(req, TimelinePhase::kMemcpyInFusionBuffer);
    if (req) {
      if (bytes) route.mem->copy(buffer + offset, req->in.data, bytes);
    } else {
      route.mem->fill_neutral(buffer + offset, static_cast<size_t>(r->elements()), r->dtype, r->op,
                              r->prescale);
    }
    phase_end(req, TimelinePhase::kMemcpyInFusionBuffer);
    phase_begin(req, TimelinePhase::kCollective, "ALLREDUCE");
    offset += bytes;
  }
  route.comm->allreduce(buffer, buffer, total, first.dtype, o);
  count_collective(total * esize);
  offset = 0;
  for (const Item& item : batch) {
    const Response* r = item.r;
    Request* req = item.req;
    const size_t bytes = static_cast<size_t>(r->elements()) * esize;
    phase_end(req, TimelinePhase::kCollective);
    phase_begin(req, TimelinePhase::kMemcpyOutFusionBuffer);
    if (req && bytes) route.mem->copy(req->out.data, buffer + offset, bytes);
    phase_end(req, TimelinePhase::kMemcpyOutFusionBuffer);
    offset += bytes;
    finish(set, req, nullptr);
  }
}

// A fused batch on a backend with a native segmented allreduce (shm): the
// communicator reads every request's input and writes its output in place, so
// the copy into its shared memory is the packing and no fusion buffer is
// involved. Joined ranks' neutral inputs live in the scratch buffer.
void Engine::Impl::run_allreduce_segments(SetState& set, const Route& route,
                                          const std::vector<Item>& batch,
                                          const AllreduceOptions& o) {
  const Response& first = *batch.front().r;
  const size_t esize = dtype_size(first.dtype);
  size_t neutral = 0;  // elements of the requests this rank does not have
  for (const Item& item : batch) {
    if (!item.req) neutral += static_cast<size_t>(item.r->elements());
  }
  uint8_t* spare = neutral ? route.mem->scratch.get(neutral * esize) : nullptr;
  segments.clear();
  for (const Item& item : batch) {
    const Response* r = item.r;
    Request* req = item.req;
    const size_t count = static_cast<size_t>(r->elements());
    if (req) {
      segments.push_back({req->in.data, req->out.data, count});
    } else {
      route.mem->fill_neutral(spare, count, r->dtype, r->op, r->prescale);
      segments.push_back({spare, spare, count});
      spare += count * esize;
    }
    phase_end(req, TimelinePhase::kQueue);
    phase_begin(req, TimelinePhase::kCollective, "ALLREDUCE");
  }
  size_t total = 0;
  for (const AllreduceSegment& segment : segments) total += segment.count;
  route.comm->allreduce_segments(segments, first.dtype, o);
  count_collective(total * esize);
  for (const Item& item : batch) {
    phase_end(item.req, TimelinePhase::kCollective);
    finish(set, item.req, nullptr);
  }
}

void Engine::Impl::run_allgather(SetState& set, const Route& route,
                                 const std::vector<Item>& batch) {
  const int n = static_cast<int>(set.ranks.size());
  const int me = set.set_rank;
  struct Gathered {
    const Response* r;
    Request* req;
    TensorView out;
    std::exception_ptr error;
    size_t row_bytes;
    size_t total_rows;
  };
  std::vector<Gathered> items;
  size_t total_bytes = 0;
  for (const Item& item : batch) {
    const Response* r = item.r;
    Gathered it{r, item.req, {}, nullptr, 0, 0};
    it.row_bytes = static_cast<size_t>(r->row_elements()) * dtype_size(r->dtype);
    for (int64_t rows : r->rows) it.total_rows += static_cast<size_t>(rows);
    if (it.req) {
      std::vector<int64_t> shape = it.req->info.shape;
      shape[0] = static_cast<int64_t>(it.total_rows);
      it.out = allocate_output(it.req, shape, &it.error);
    }
    total_bytes += it.total_rows * it.row_bytes;
    items.push_back(it);
  }
  if (items.size() == 1) {
    Gathered& it = items.front();
    const size_t row_elements = static_cast<size_t>(it.r->row_elements());
    std::vector<size_t> counts(n);
    for (int k = 0; k < n; ++k) counts[k] = static_cast<size_t>(it.r->rows[k]) * row_elements;
    const void* in = it.req && it.req->in.data ? it.req->in.data : route.mem->scratch.get(1);
    void* out =
        it.out.data && !it.error ? it.out.data : route.mem->scratch_out.get(total_bytes + 1);
    phase_end(it.req, TimelinePhase::kQueue);
    phase_begin(it.req, TimelinePhase::kCollective, "ALLGATHER");
    route.comm->allgatherv(in, out, counts, it.r->dtype, CollectiveOptions{});
    count_collective(total_bytes);
    phase_end(it.req, TimelinePhase::kCollective);
  } else {
    // Rank k's block holds its rows of every tensor, in batch order.
    std::vector<size_t> block(n, 0);
    for (const Gathered& it : items) {
      for (int k = 0; k < n; ++k) block[k] += static_cast<size_t>(it.r->rows[k]) * it.row_bytes;
    }
    uint8_t* packed = route.mem->fusion.get(block[me] + 1);
    uint8_t* gathered = route.mem->fusion_out.get(total_bytes + 1);
    size_t offset = 0;
    for (Gathered& it : items) {
      const size_t bytes = static_cast<size_t>(it.r->rows[me]) * it.row_bytes;
      phase_end(it.req, TimelinePhase::kQueue);
      phase_begin(it.req, TimelinePhase::kMemcpyInFusionBuffer);
      if (bytes) route.mem->copy(packed + offset, it.req->in.data, bytes);
      offset += bytes;
      phase_end(it.req, TimelinePhase::kMemcpyInFusionBuffer);
      phase_begin(it.req, TimelinePhase::kCollective, "ALLGATHER");
    }
    route.comm->allgatherv(packed, gathered, block, DType::kU8, CollectiveOptions{});
    count_collective(total_bytes);
    // Unpack: tensor t's rows from rank k follow the earlier tensors' rows in k's block.
    std::vector<size_t> block_start(n, 0);
    for (int k = 1; k < n; ++k) block_start[k] = block_start[k - 1] + block[k - 1];
    std::vector<size_t> within(n, 0);
    for (Gathered& it : items) {
      phase_end(it.req, TimelinePhase::kCollective);
      phase_begin(it.req, TimelinePhase::kMemcpyOutFusionBuffer);
      size_t out_offset = 0;
      for (int k = 0; k < n; ++k) {
        const size_t bytes = static_cast<size_t>(it.r->rows[k]) * it.row_bytes;
        if (it.req && !it.error && bytes) {
          route.mem->copy(static_cast<uint8_t*>(it.out.data) + out_offset,
                          gathered + block_start[k] + within[k], bytes);
        }
        within[k] += bytes;
        out_offset += bytes;
      }
      phase_end(it.req, TimelinePhase::kMemcpyOutFusionBuffer);
    }
  }
  for (Gathered& it : items) {
    if (it.req) {
      std::lock_guard<std::mutex> lock(it.req->handle->mutex);
      it.req->handle->received_splits = it.r->rows;
      it.req->handle->output = it.out;
    }
    finish(set, it.req, it.error);
  }
}

void Engine::Impl::run_broadcast(SetState& set, const Route& route,
                                 const std::vector<Item>& batch) {
  const Response& first = *batch.front().r;
  const int root = first.root;
  const bool is_root = set.set_rank == root;
  BroadcastOptions bo;
  bo.root = root;
  if (batch.size() == 1) {
    Request* req = batch.front().req;
    const size_t count = static_cast<size_t>(first.elements());
    void* buffer = req ? req->in.data : route.mem->scratch.get(count * dtype_size(first.dtype) + 1);
    if (buffer == nullptr) buffer = route.mem->scratch.get(1);
    phase_end(req, TimelinePhase::kQueue);
    phase_begin(req, TimelinePhase::kCollective, "BROADCAST");
    route.comm->broadcast(buffer, count, first.dtype, bo);
    count_collective(count * dtype_size(first.dtype));
    phase_end(req, TimelinePhase::kCollective);
    finish(set, req, nullptr);
    return;
  }
  size_t total = 0;
  for (const Item& item : batch)
    total += static_cast<size_t>(item.r->elements()) * dtype_size(item.r->dtype);
  uint8_t* buffer = route.mem->fusion.get(total + 1);
  size_t offset = 0;
  for (const Item& item : batch) {
    const Response* r = item.r;
    Request* req = item.req;
    const size_t bytes = static_cast<size_t>(r->elements()) * dtype_size(r->dtype);
    phase_end(req, TimelinePhase::kQueue);
    if (is_root) {
      phase_begin(req, TimelinePhase::kMemcpyInFusionBuffer);
      if (bytes) route.mem->copy(buffer + offset, req->in.data, bytes);
      phase_end(req, TimelinePhase::kMemcpyInFusionBuffer);
    }
    phase_begin(req, TimelinePhase::kCollective, "BROADCAST");
    offset += bytes;
  }
  route.comm->broadcast(buffer, total, DType::kU8, bo);
  count_collective(total);
  offset = 0;
  for (const Item& item : batch) {
    const Response* r = item.r;
    Request* req = item.req;
    const size_t bytes = static_cast<size_t>(r->elements()) * dtype_size(r->dtype);
    phase_end(req, TimelinePhase::kCollective);
    if (!is_root && req) {
      phase_begin(req, TimelinePhase::kMemcpyOutFusionBuffer);
      if (bytes) route.mem->copy(req->in.data, buffer + offset, bytes);
      phase_end(req, TimelinePhase::kMemcpyOutFusionBuffer);
    }
    offset += bytes;
    finish(set, req, nullptr);
  }
}

void Engine::Impl::run_reducescatter(SetState& set, const Route& route, const Item& item) {
  const Response& r = *item.r;
  const int n = static_cast<int>(set.ranks.size());
  const int me = set.set_rank;
  const AllreduceOptions o = reduce_options(r, n);
  const size_t esize = dtype_size(r.dtype);
  const size_t rows = static_cast<size_t>(r.shape[0]);
  const size_t row_elements = static_cast<size_t>(r.row_elements());
  const size_t base = rows / n;
  const size_t extra = rows % n;
  auto rows_of = [&](int k) { return static_cast<size_t>(even_split(rows, n, k).count); };

  Request* req = item.req;
  const void* in;
  void* out;
  if (req) {
    in = req->in.data;
    out = req->out.data;
  } else {
    void* neutral = route.mem->scratch.get(rows * row_elements * esize + 1);
    route.mem->fill_neutral(neutral, rows * row_elements, r.dtype, r.op, r.prescale);
    in = neutral;
    out = route.mem->scratch_out.get(rows_of(me) * row_elements * esize + 1);
  }
  phase_end(req, TimelinePhase::kQueue);
  if (extra == 0) {
    phase_begin(req, TimelinePhase::kCollective, "REDUCESCATTER");
    route.comm->reducescatter(in ? in : route.mem->scratch.get(1),
                              out ? out : route.mem->scratch_out.get(1), base * row_elements,
                              r.dtype, o);
    phase_end(req, TimelinePhase::kCollective);
  } else {
    // Uneven split: pad every rank's share to base + 1 rows, reduce-scatter
    // the padded buffer in place, copy this rank's rows out.
    const size_t block = (base + 1) * row_elements * esize;
    uint8_t* padded = route.mem->fusion.get(block * n);
    phase_begin(req, TimelinePhase::kMemcpyInFusionBuffer);
    size_t from = 0;
    for (int k = 0; k < n; ++k) {
      const size_t bytes = rows_of(k) * row_elements * esize;
      if (bytes) route.mem->copy(padded + k * block, static_cast<const uint8_t*>(in) + from, bytes);
      if (bytes < block) route.mem->zero(padded + k * block + bytes, block - bytes);
      from += bytes;
    }
    phase_end(req, TimelinePhase::kMemcpyInFusionBuffer);
    phase_begin(req, TimelinePhase::kCollective, "REDUCESCATTER");
    route.comm->reducescatter(padded, padded, (base + 1) * row_elements, r.dtype, o);
    phase_end(req, TimelinePhase::kCollective);
    phase_begin(req, TimelinePhase::kMemcpyOutFusionBuffer);
    const size_t mine = rows_of(me) * row_elements * esize;
    if (mine) route.mem->copy(out, padded, mine);
    phase_end(req, TimelinePhase::kMemcpyOutFusionBuffer);
  }
  count_collective(rows * row_elements * esize);
  finish(set, req, nullptr);
}

void Engine::Impl::run_alltoall(SetState& set, const Route& route, const Item& item) {
  const Response& r = *item.r;
  const int n = static_cast<int>(set.ranks.size());
  const int me = set.set_rank;
  const size_t row_elements = static_cast<size_t>(r.row_elements());
  const size_t esize = dtype_size(r.dtype);
  std::vector<size_t> send(n), recv(n);
  std::vector<int64_t> received(n);
  size_t recv_rows = 0;
  for (int k = 0; k < n; ++k) {
    send[k] = static_cast<size_t>(r.splits[me * n + k]) * row_elements;
    received[k] = r.splits[k * n + me];
    recv[k] = static_cast<size_t>(received[k]) * row_elements;
    recv_rows += static_cast<size_t>(received[k]);
  }
  Request* req = item.req;
  TensorView out;
  std::exception_ptr error;
  if (req) {
    std::vector<int64_t> shape = req->info.shape;
    shape[0] = static_cast<int64_t>(recv_rows);
    out = allocate_output(req, shape, &error);
  }
  const void* in = req && req->in.data ? req->in.data : route.mem->scratch.get(1);
  void* out_data = out.data && !error
                       ? out.data
                       : route.mem->scratch_out.get(recv_rows * row_elements * esize + 1);
  phase_end(req, TimelinePhase::kQueue);
  phase_begin(req, TimelinePhase::kCollective, "ALLTOALL");
  route.comm->alltoallv(in, send, out_data, recv, r.dtype, CollectiveOptions{});
  phase_end(req, TimelinePhase::kCollective);
  size_t bytes = 0;
  for (int k = 0; k < n; ++k) bytes += (send[k] + recv[k]) * esize;
  count_collective(bytes / 2);
  if (req) {
    std::lock_guard<std::mutex> lock(req->handle->mutex);
    req->handle->received_splits = received;
    req->handle->output = out;
  }
  finish(set, req, error);
}

}  // namespace kolo
