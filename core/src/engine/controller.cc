#include "engine/controller.h"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <stdexcept>

#include "kolo/core/errors.h"

namespace kolo::detail {

namespace {

constexpr int kFlagNothingToSend = 0;
constexpr int kFlagNotShuttingDown = 1;
constexpr int kFlagIdle = 2;
constexpr int kFlagCount = 3;

std::string double_text(double value) {
  char text[40];
  std::snprintf(text, sizeof(text), "%.17g", value);
  return text;
}

}  // namespace

Controller::Controller(Communicator& comm, ControllerOptions options, Logger logger)
    : comm_(comm),
      options_(std::move(options)),
      logger_(logger),
      cache_(options_.cache_capacity),
      joined_(options_.world_ranks.size(), 0) {
  if (options_.set_rank == 0) {
    StallInspector::Options stall;
    stall.warning_seconds = options_.stall_warning_seconds;
    stall.shutdown_seconds = options_.stall_shutdown_seconds;
    stall.process_set = options_.process_set;
    stall.world_ranks = options_.world_ranks;
    inspector_ = std::make_unique<StallInspector>(stall, logger_);
  }
}

std::string Controller::world_rank_text(int set_rank) const {
  return "rank " + std::to_string(options_.world_ranks[set_rank]);
}

void Controller::submit(const RequestInfo& info, void* owner, Clock::time_point now,
                        int* cache_slot_hint) {
  Local* local;
  if (free_locals_.empty()) {
    storage_.push_back(std::make_unique<Local>());
    local = storage_.back().get();
  } else {
    local = free_locals_.back();
    free_locals_.pop_back();
  }
  *local = Local{};
  local->info = &info;
  local->owner = owner;
  local->since = now;
  local->order = local_order_++;
  classify(*local, cache_slot_hint);
  local->next = head_;
  if (head_) head_->prev = local;
  head_ = local;
  ++local_count_;
  if (info.kind == RequestKind::kJoin) join_ = local;
}

void* Controller::remove(Local* local) {
  if (local->status == LocalStatus::kCached) by_slot_[local->slot] = nullptr;
  if (local == join_) join_ = nullptr;
  if (local->prev) local->prev->next = local->next;
  if (local->next) local->next->prev = local->prev;
  if (head_ == local) head_ = local->next;
  --local_count_;
  void* owner = local->owner;
  *local = Local{};
  free_locals_.push_back(local);
  return owner;
}

void Controller::classify(Local& local, int* cache_slot_hint) {
  local.status = LocalStatus::kToSend;
  local.slot = -1;
  if (!cache_usable() || !is_data_kind(local.info->kind)) return;
  int slot;
  if (cache_slot_hint && cache_.holds(*cache_slot_hint, local.info->name)) {
    slot = *cache_slot_hint;
  } else {
    slot = cache_.find(local.info->name);
    if (cache_slot_hint) *cache_slot_hint = slot;
  }
  // Here the slot's name is this one.
  if (slot >= 0 && cache_.mine(slot).same_except_name(*local.info)) {
    local.status = LocalStatus::kCached;
    local.slot = slot;
    if (by_slot_.size() <= static_cast<size_t>(slot)) by_slot_.resize(slot + 1, nullptr);
    by_slot_[slot] = &local;
  }
}

void Controller::to_send(Local& local) {
  if (local.status != LocalStatus::kCached) return;
  by_slot_[local.slot] = nullptr;
  local.status = LocalStatus::kToSend;
  local.slot = -1;
}

void Controller::uncache_local(const std::string& name) {
  const int slot = cache_.find(name);
  if (slot >= 0 && static_cast<size_t>(slot) < by_slot_.size() && by_slot_[slot]) {
    to_send(*by_slot_[slot]);
  }
}

void Controller::ship_params(double cycle_time_ms, int64_t fusion_threshold_bytes) {
  params_pending_ = true;
  params_cycle_time_ms_ = cycle_time_ms;
  params_fusion_threshold_bytes_ = fusion_threshold_bytes;
}

Controller::Outcome Controller::negotiate(bool shutting_down, bool busy_elsewhere) {
  Outcome out;
  const Clock::time_point now = Clock::now();

  // Requests stuck in the cached path for long go through a full round, so
  // that set rank 0 sees who lacks them (stall_inspector.h).
  bool to_send = params_pending_ || !verdicts_.empty();
  const Clock::duration report_after = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(options_.stall_warning_seconds / 2));
  // A join about to be sent takes this rank's cached requests along (ahead of
  // it, in submission order): once it has joined, the others would otherwise
  // count it as contributing nothing to them.
  const bool joining = join_ && join_->status == LocalStatus::kToSend;
  for (Local* local = head_; local; local = local->next) {
    if (local->status == LocalStatus::kCached && (joining || now - local->since > report_after)) {
      this->to_send(*local);
    }
    if (local->status == LocalStatus::kToSend) to_send = true;
  }

  // 1. The bit vector.
  const int slots = cache_.slot_count();
  bits_.assign(kFlagCount + slots, 0);
  bits_[kFlagNothingToSend] = to_send ? 0 : 1;
  bits_[kFlagNotShuttingDown] = shutting_down ? 0 : 1;
  bits_[kFlagIdle] = local_count_ == 0 && !busy_elsewhere ? 1 : 0;
  for (const Local* local = head_; local; local = local->next) {
    if (local->status == LocalStatus::kCached) bits_[kFlagCount + local->slot] = 1;
  }
  AllreduceOptions min;
  min.op = ReduceOp::kMin;
  comm_.allreduce(bits_.data(), bits_.data(), bits_.size(), DType::kU8, min);

  if (bits_[kFlagNotShuttingDown] == 0) {
    out.shutdown = true;
    return out;
  }
  out.idle = bits_[kFlagIdle] == 1;

  // Cache hits, in slot order.
  out.responses.reserve(local_count_);
  out.owners.reserve(local_count_);
  for (int slot = 0; slot < slots; ++slot) {
    if (bits_[kFlagCount + slot] == 0) continue;
    cache_.touch(slot);
    // The bit survived the MIN, so this rank set it: by_slot_ has its local.
    Local* local = static_cast<size_t>(slot) < by_slot_.size() ? by_slot_[slot] : nullptr;
    if (!local) {
      throw std::logic_error("kolo engine: cache slot " + std::to_string(slot) +
                             " agreed by every rank has no request on this rank");
    }
    out.responses.push_back(cache_.response(slot));
    out.owners.push_back(remove(local));
    ++out.cache_hits;
  }

  // 2. The full round.
  if (bits_[kFlagNothingToSend] == 0) {
    out.full_round = true;
    full_round(out, now);
  }
  if (inspector_) inspect_stalls(now);
  return out;
}

void Controller::full_round(Outcome& out, Clock::time_point now) {
  const int n = set_size();
  const int me = options_.set_rank;

  RequestList mine;
  std::vector<Local*> sending;
  for (Local* local = head_; local; local = local->next) {
    if (local->status == LocalStatus::kToSend) sending.push_back(local);
  }
  std::sort(sending.begin(), sending.end(),
            [](const Local* a, const Local* b) { return a->order < b->order; });
  for (Local* local : sending) {
    mine.requests.push_back(*local->info);
    local->status = LocalStatus::kSent;
  }
  if (me == 0) {
    mine.verdicts = std::move(verdicts_);
    verdicts_.clear();
    if (params_pending_) {
      mine.has_params = true;
      mine.cycle_time_ms = params_cycle_time_ms_;
      mine.fusion_threshold_bytes = params_fusion_threshold_bytes_;
      params_pending_ = false;
    }
  }
  const std::string bytes = serialize(mine);

  int64_t my_size = static_cast<int64_t>(bytes.size());
  list_sizes_.assign(n, 0);
  comm_.allgather(&my_size, list_sizes_.data(), 1, DType::kI64, CollectiveOptions{});
  std::vector<size_t> counts(n);
  size_t total = 0;
  for (int r = 0; r < n; ++r) {
    counts[r] = static_cast<size_t>(list_sizes_[r]);
    total += counts[r];
  }
  gathered_.resize(total);
  comm_.allgatherv(bytes.data(), gathered_.data(), counts, DType::kU8, CollectiveOptions{});

  std::vector<RequestList> lists(n);
  size_t offset = 0;
  for (int r = 0; r < n; ++r) {
    lists[r] = deserialize(reinterpret_cast<const uint8_t*>(gathered_.data()) + offset, counts[r]);
    offset += counts[r];
  }

  // a. Stall verdicts of set rank 0, before anything new enters the table.
  for (const StallVerdict& verdict : lists[0].verdicts) apply_verdict(verdict, out);
  // b. Parameters.
  if (lists[0].has_params) {
    out.has_params = true;
    out.cycle_time_ms = lists[0].cycle_time_ms;
    out.fusion_threshold_bytes = lists[0].fusion_threshold_bytes;
  }
  // c. Joins and requests, in rank order.
  const bool cache_was_usable = cache_usable();
  for (int r = 0; r < n; ++r) {
    size_t index = 0;  // lists[me].requests[index] was sent from sending[index]
    for (RequestInfo& info : lists[r].requests) {
      Local* sent = r == me ? sending[index++] : nullptr;
      if (info.kind == RequestKind::kJoin) {
        if (!joined_[r]) {
          if (joined_count_ == 0) first_join_ = now;
          joined_[r] = 1;
          ++joined_count_;
        }
        last_joined_ = r;
        continue;
      }
      auto [it, inserted] = table_.try_emplace(info.name);
      Entry& entry = it->second;
      if (inserted) {
        entry.seq = next_seq_++;
        entry.since = now;
        entry.infos.resize(n);
        entry.present.assign(n, 0);
        arrival_.emplace(entry.seq, info.name);
        uncache_local(info.name);
        cache_.erase(info.name);
      }
      if (!entry.present[r]) ++entry.count;
      entry.present[r] = 1;
      entry.infos[r] = std::move(info);
      if (sent) entry.mine = sent;
    }
  }
  if (cache_was_usable && !cache_usable()) {
    for (Local* local = head_; local; local = local->next) to_send(*local);
  }

  collect_ready(out);

  if (joined_count_ == n) {
    out.join_finished = true;
    out.last_joined = options_.world_ranks[last_joined_];
    std::fill(joined_.begin(), joined_.end(), 0);
    joined_count_ = 0;
    last_joined_ = -1;
    if (join_) remove(join_);
  }
}

void Controller::apply_verdict(const StallVerdict& verdict, Outcome& out) {
  verdicted_.erase(verdict.name);
  const int n = set_size();
  Response response;
  response.status = Response::Status::kStalled;
  response.name = verdict.name;
  response.contributed.assign(n, 0);
  std::string missing;
  for (int32_t r : verdict.missing) {
    if (r < 0 || r >= n) continue;
    response.failed_ranks.push_back(options_.world_ranks[r]);
    missing += (missing.empty() ? "" : ", ") + std::to_string(options_.world_ranks[r]);
  }
  const std::string where =
      options_.process_set == 0 ? "" : " in process set " + std::to_string(options_.process_set);
  char waited[32];
  std::snprintf(waited, sizeof(waited), "%.1f", verdict.waited_seconds);

  if (verdict.name == kJoinName) {
    if (joined_count_ == 0) return;
    response.kind = RequestKind::kJoin;
    response.contributed = joined_;
    response.contributors = joined_count_;
    response.error = std::string("kolo engine: join()") + where + " stalled: rank(s) " + missing +
                     " did not join within " + waited +
                     " s (KOLO_STALL_SHUTDOWN_SECONDS); every rank of the set must call join()";
    std::fill(joined_.begin(), joined_.end(), 0);
    joined_count_ = 0;
    last_joined_ = -1;
    out.responses.push_back(std::make_shared<const Response>(std::move(response)));
    out.owners.push_back(join_ ? remove(join_) : nullptr);
    return;
  }
  auto it = table_.find(verdict.name);
  if (it == table_.end()) return;
  const Entry& entry = it->second;
  for (int r = 0; r < n; ++r) {
    if (entry.present[r]) {
      response.kind = entry.infos[r].kind;
      break;
    }
  }
  response.contributed = entry.present;
  response.contributors = entry.count;
  response.error = std::string("kolo engine: ") + request_kind_name(response.kind) +
                   " of tensor '" + verdict.name + "'" + where + " stalled: rank(s) " + missing +
                   " did not submit it within " + waited +
                   " s (KOLO_STALL_SHUTDOWN_SECONDS); every rank of the set must submit every "
                   "named tensor";
  void* owner = entry.mine ? remove(entry.mine) : nullptr;
  arrival_.erase(entry.seq);
  table_.erase(it);
  out.responses.push_back(std::make_shared<const Response>(std::move(response)));
  out.owners.push_back(owner);
}

void Controller::collect_ready(Outcome& out) {
  const int n = set_size();
  const int me = options_.set_rank;
  for (auto it = arrival_.begin(); it != arrival_.end();) {
    auto entry_it = table_.find(it->second);
    const Entry& entry = entry_it->second;
    bool ready = true;
    for (int r = 0; r < n && ready; ++r) ready = entry.present[r] || joined_[r];
    if (!ready) {
      ++it;
      continue;
    }
    auto response = std::make_shared<const Response>(make_response(it->second, entry));
    if (response->status == Response::Status::kOk && response->contributors == n &&
        is_data_kind(response->kind) && cache_.capacity() > 0) {
      std::string evicted;
      int evicted_slot = -1;
      cache_.put(response, entry.infos[me], &evicted, &evicted_slot);
      if (evicted_slot >= 0) {
        ++out.cache_evictions;
        // Its CACHED local (if any) can no longer use the slot: send it.
        if (static_cast<size_t>(evicted_slot) < by_slot_.size() && by_slot_[evicted_slot]) {
          to_send(*by_slot_[evicted_slot]);
        }
      }
    }
    void* owner = entry.mine ? remove(entry.mine) : nullptr;
    table_.erase(entry_it);
    it = arrival_.erase(it);
    out.responses.push_back(std::move(response));
    out.owners.push_back(owner);
  }
}

Response Controller::make_response(const std::string& name, const Entry& entry) const {
  const int n = set_size();
  int ref = 0;
  while (!entry.present[ref]) ++ref;
  const RequestInfo& base = entry.infos[ref];

  Response response;
  response.kind = base.kind;
  response.name = name;
  response.dtype = base.dtype;
  response.device = base.device;
  response.op = base.op;
  response.root = base.root;
  response.prescale = base.prescale;
  response.postscale = base.postscale;
  response.shape = base.shape;
  response.contributed = entry.present;
  response.contributors = entry.count;

  const std::string where =
      options_.process_set == 0 ? "" : " in process set " + std::to_string(options_.process_set);
  const char* op_name = request_kind_name(base.kind);

  // Fails the response if `same(base, info)` is false for a submitting rank,
  // naming every such rank's `show(info)`: "Mismatched ALLREDUCE tensor
  // shapes for tensor 'w': rank 0 has [4], rank 1 has [5]". Texts are built
  // only for a mismatch.
  using Same = std::function<bool(const RequestInfo&, const RequestInfo&)>;
  using Text = std::function<std::string(const RequestInfo&)>;
  auto check = [&](const char* what, const char* field, const Same& same, const Text& show) {
    if (response.status != Response::Status::kOk) return;
    std::string differing;
    for (int r = 0; r < n; ++r) {
      if (!entry.present[r] || r == ref) continue;
      if (!same(base, entry.infos[r])) {
        differing += ", " + world_rank_text(r) + " has " + show(entry.infos[r]);
      }
    }
    if (differing.empty()) return;
    response.status = Response::Status::kMismatch;
    response.error = std::string("kolo engine: Mismatched ") + op_name + " " + what +
                     " for tensor '" + name + "'" + where + ": " + world_rank_text(ref) + " has " +
                     show(base) + differing + ". Every rank must submit '" + name +
                     "' with the same " + field + ".";
  };
  const Same same_dtype = [](const RequestInfo& a, const RequestInfo& b) {
    return a.dtype == b.dtype;
  };
  const Same same_shape = [](const RequestInfo& a, const RequestInfo& b) {
    return a.shape == b.shape;
  };
  const Same same_op = [](const RequestInfo& a, const RequestInfo& b) { return a.op == b.op; };
  const Same same_prescale = [](const RequestInfo& a, const RequestInfo& b) {
    return a.prescale == b.prescale;
  };
  const Same same_postscale = [](const RequestInfo& a, const RequestInfo& b) {
    return a.postscale == b.postscale;
  };
  const Text dtype_text = [](const RequestInfo& i) { return std::string(dtype_name(i.dtype)); };
  const Text full_shape = [](const RequestInfo& i) { return shape_text(i.shape); };
  const Text op_text = [](const RequestInfo& i) { return std::string(reduce_op_name(i.op)); };
  const Text prescale_text = [](const RequestInfo& i) { return double_text(i.prescale); };
  const Text postscale_text = [](const RequestInfo& i) { return double_text(i.postscale); };

  // The operation itself first: the other fields mean different things per kind.
  for (int r = 0; r < n && response.status == Response::Status::kOk; ++r) {
    if (!entry.present[r] || entry.infos[r].kind == base.kind) continue;
    response.status = Response::Status::kMismatch;
    response.error = std::string("kolo engine: Mismatched operations for tensor '") + name + "'" +
                     where + ": " + world_rank_text(ref) + " submitted " + op_name + ", " +
                     world_rank_text(r) + " submitted " + request_kind_name(entry.infos[r].kind) +
                     ". Every rank must submit '" + name + "' to the same collective.";
  }
  if (response.status != Response::Status::kOk) return response;
  if (is_data_kind(base.kind)) {
    const Same same_device = [](const RequestInfo& a, const RequestInfo& b) {
      return a.device == b.device;
    };
    const Text device_text = [](const RequestInfo& i) {
      return std::string("a ") + device_type_name(i.device) + " tensor";
    };
    check("devices", "device (all on the CPU, or all on their GPUs)", same_device, device_text);
  }

  switch (base.kind) {
    case RequestKind::kAllreduce:
    case RequestKind::kReducescatter:
      check("data types", "dtype", same_dtype, dtype_text);
      check("tensor shapes", "shape", same_shape, full_shape);
      check("reduction ops", "op", same_op, op_text);
      check("prescale factors", "prescale", same_prescale, prescale_text);
      check("postscale factors", "postscale", same_postscale, postscale_text);
      if (response.status == Response::Status::kOk && response.contributors < n &&
          base.op == ReduceOp::kProduct && base.prescale != 1.0) {
        response.status = Response::Status::kMismatch;
        response.error = std::string("kolo engine: ") + op_name + " of tensor '" + name + "'" +
                         where +
                         ": a product with a prescale factor has no neutral input for the ranks "
                         "that joined; scale after the reduction (postscale) instead";
      }
      break;
    case RequestKind::kBroadcast: {
      const Text root_text = [this](const RequestInfo& i) {
        return i.root >= 0 && i.root < set_size() ? world_rank_text(i.root)
                                                  : std::to_string(i.root);
      };
      const Same same_root = [](const RequestInfo& a, const RequestInfo& b) {
        return a.root == b.root;
      };
      check("data types", "dtype", same_dtype, dtype_text);
      check("tensor shapes", "shape", same_shape, full_shape);
      check("root ranks", "root", same_root, root_text);
      if (response.status == Response::Status::kOk && !entry.present[base.root]) {
        response.status = Response::Status::kMismatch;
        response.error = std::string("kolo engine: BROADCAST of tensor '") + name + "'" + where +
                         ": the root, " + world_rank_text(base.root) +
                         ", has joined (Engine::join) and has no data to send; broadcast from a "
                         "rank that has not joined";
      }
      break;
    }
    case RequestKind::kAllgather:
    case RequestKind::kAlltoall: {
      // All but the first dimension must agree.
      const Same same_trailing = [](const RequestInfo& a, const RequestInfo& b) {
        return a.shape.size() == b.shape.size() && !a.shape.empty() &&
               std::equal(a.shape.begin() + 1, a.shape.end(), b.shape.begin() + 1);
      };
      check("data types", "dtype", same_dtype, dtype_text);
      check("tensor shapes", "shape in all but the first dimension", same_trailing, full_shape);
      if (response.status != Response::Status::kOk) break;
      if (base.kind == RequestKind::kAllgather) {
        response.rows.assign(n, 0);
        for (int r = 0; r < n; ++r) {
          if (entry.present[r]) response.rows[r] = entry.infos[r].shape[0];
        }
      } else {
        response.splits.assign(static_cast<size_t>(n) * n, 0);
        for (int s = 0; s < n; ++s) {
          if (!entry.present[s]) continue;
          for (int d = 0; d < n; ++d) response.splits[s * n + d] = entry.infos[s].splits[d];
        }
      }
      break;
    }
    case RequestKind::kAddProcessSet: {
      const Same same_ranks = [](const RequestInfo& a, const RequestInfo& b) {
        return a.splits == b.splits;
      };
      const Text ranks_text = [](const RequestInfo& i) { return shape_text(i.splits); };
      check("process set ranks", "ranks", same_ranks, ranks_text);
      response.splits = base.splits;
      break;
    }
    case RequestKind::kRemoveProcessSet:
    case RequestKind::kJoin:
      break;
  }
  return response;
}

void Controller::inspect_stalls(Clock::time_point now) {
  const int n = set_size();
  std::vector<StallInspector::Waiting> stalled;
  const Clock::duration warning_after = inspector_->warning_after();
  for (const auto& [seq, name] : arrival_) {
    const Entry& entry = table_.at(name);
    if (now - entry.since < warning_after) break;  // arrival order = age order
    if (verdicted_.count(name) != 0) continue;
    StallInspector::Waiting w;
    w.name = name;
    w.since = entry.since;
    for (int r = 0; r < n; ++r) {
      if (entry.present[r]) {
        w.kind = entry.infos[r].kind;
        w.submitted.push_back(r);
      } else if (!joined_[r]) {
        w.missing.push_back(r);
      }
    }
    stalled.push_back(std::move(w));
  }
  if (joined_count_ > 0 && joined_count_ < n && now - first_join_ >= warning_after &&
      verdicted_.count(kJoinName) == 0) {
    StallInspector::Waiting w;
    w.name = kJoinName;
    w.kind = RequestKind::kJoin;
    w.since = first_join_;
    for (int r = 0; r < n; ++r) (joined_[r] ? w.submitted : w.missing).push_back(r);
    stalled.push_back(std::move(w));
  }
  for (StallVerdict& verdict : inspector_->inspect(stalled, now)) {
    verdicted_[verdict.name] = true;
    verdicts_.push_back(std::move(verdict));
  }
}

}  // namespace kolo::detail
