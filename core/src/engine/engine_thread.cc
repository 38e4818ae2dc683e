// The Engine's background thread (engine_impl.h): cycles, negotiation
// outcomes, completion of handles, process sets, timeline phases.
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "engine/engine_impl.h"
#include "kolo/core/errors.h"

namespace kolo {

using detail::world_ranks_text;

namespace {

// An engine whose whole world has nothing pending in any set stops
// negotiating every cycle: after this many consecutive idle cycles it blocks
// until local work arrives, up to kIdleWait, and then sleeps one cycle to
// batch what follows. Training is idle through every forward pass; cycling
// through it woke each rank's engine thread every millisecond, each time for
// an allreduce in which a rank waits for its peer (spinning briefly) on cores
// the compute needs. (The Fashion-MNIST CNN at 2 workers on 2 cores used
// about 3% less CPU time per step without those wake-ups.)
// Since all ranks submit the same names, a rank that wakes for local work
// waits in the negotiation (asleep, after the communicator's short spin)
// only until its peers submit theirs.
constexpr int kIdleCyclesBeforeBackoff = 2;
// Bounds the wait, so that the stall inspector and an idle peer's late
// shutdown are still seen within this long.
constexpr std::chrono::milliseconds kIdleWait{20};

}  // namespace

// ---- engine thread ----------------------------------------------------------

void Engine::Impl::agree_options() {
  // Every rank must fuse with the same threshold and size its bit vector with
  // the same cache capacity: rank 0's settings win.
  struct Wire {
    double cycle_time_ms;
    int64_t fusion_threshold_bytes;
    int64_t cache_capacity;
    double stall_warning_seconds;
    double stall_shutdown_seconds;
  } wire{options.cycle_time_ms, options.fusion_threshold_bytes, options.cache_capacity,
         options.stall_warning_seconds, options.stall_shutdown_seconds};
  const Wire mine = wire;
  BroadcastOptions root0;
  world->broadcast(&wire, sizeof(wire), DType::kU8, root0);
  if (std::memcmp(&mine, &wire, sizeof(wire)) != 0) {
    logger.warning(
        "engine settings differ from rank 0's (KOLO_CYCLE_TIME_MS, KOLO_FUSION_THRESHOLD_BYTES, "
        "KOLO_CACHE_CAPACITY, KOLO_STALL_*); using rank 0's");
  }
  options.cycle_time_ms = wire.cycle_time_ms;
  options.fusion_threshold_bytes = wire.fusion_threshold_bytes;
  options.cache_capacity = static_cast<int>(wire.cache_capacity);
  options.stall_warning_seconds = wire.stall_warning_seconds;
  options.stall_shutdown_seconds = wire.stall_shutdown_seconds;
  current_cycle_time_ms = options.cycle_time_ms;
  current_fusion_threshold_bytes = options.fusion_threshold_bytes;
}

void Engine::Impl::run() {
  std::exception_ptr error;
  std::string reason = "the engine was shut down";
  try {
    agree_options();
    auto world_set = std::make_unique<SetState>();
    world_set->id = 0;
    for (int r = 0; r < size; ++r) world_set->ranks.push_back(r);
    world_set->set_rank = rank;
    world_set->comm = world.get();
    ControllerOptions co;
    co.process_set = 0;
    co.world_ranks = world_set->ranks;
    co.set_rank = rank;
    co.cache_capacity = options.cache_capacity;
    co.stall_warning_seconds = options.stall_warning_seconds;
    co.stall_shutdown_seconds = options.stall_shutdown_seconds;
    world_set->controller = std::make_unique<Controller>(*world, co, logger);
    active.push_back(std::move(world_set));

    if (options.autotune && rank == 0) {
      detail::Autotuner::Options ao;
      ao.initial.cycle_time_ms = options.cycle_time_ms;
      ao.initial.fusion_threshold_bytes = options.fusion_threshold_bytes;
      ao.log_path = options.autotune_log;
      ao.logger = detail::Logger(detail::LogLevel::kInfo, rank);
      autotuner = std::make_unique<detail::Autotuner>(ao);
    }

    // Sees a rank that does not negotiate at all (stall_inspector.h).
    detail::NegotiationWatch::Options watch_options;
    watch_options.warning_seconds = options.stall_warning_seconds;
    watch_options.shutdown_seconds = options.stall_shutdown_seconds;
    watch_options.on_abort = options.on_stall_abort;
    detail::NegotiationWatch watch(watch_options, logger);

    int idle_cycles = 0;
    for (;;) {
      const Clock::time_point start = Clock::now();
      cycle_bytes = 0;
      drain();
      bool stop = false;
      bool idle = false;
      for (size_t i = 0; i < active.size(); ++i) {
        SetState& set = *active[i];
        bool busy_elsewhere = false;  // requests pending in other sets keep set 0 cycling
        if (i == 0) {
          for (size_t j = 1; j < active.size(); ++j) busy_elsewhere |= !active[j]->pending.empty();
        }
        watch.enter(set.comm, &set.ranks, set.set_rank, set.id);
        Controller::Outcome outcome =
            set.controller->negotiate(i == 0 && shutdown_requested, busy_elsewhere);
        watch.leave();
        if (outcome.shutdown) {
          stop = true;
          break;
        }
        if (i == 0) idle = outcome.idle;
        if (timeline && i == 0 && (outcome.full_round || !outcome.responses.empty())) {
          timeline->mark("CYCLE_START");
        }
        run_set(set, outcome);
      }
      {
        std::lock_guard<std::mutex> lock(mutex);
        ++stats.cycles;
      }
      if (stop) {
        reason = "the engine was shut down (Engine destroyed on some rank)";
        break;
      }
      // Requests that went through a round without becoming ready now wait
      // for the other ranks.
      if (timeline) {
        for (auto& set : active) {
          for (Request* request = set->pending.first(); request; request = request->pending_next) {
            if (!request->negotiated_once) {
              request->negotiated_once = true;
              phase_begin(request, TimelinePhase::kWaitForOtherRanks);
            }
          }
        }
      }
      idle_cycles = idle ? idle_cycles + 1 : 0;
      const double cycle_ms = current_cycle_time_ms;
      const auto cycle = std::chrono::duration_cast<Clock::duration>(
          std::chrono::duration<double, std::milli>(cycle_ms));
      const auto elapsed = Clock::now() - start;
      if (idle_cycles >= kIdleCyclesBeforeBackoff) {
        if (queue.wait_for_work(kIdleWait) && cycle > Clock::duration::zero()) {
          waker->sleep_for(cycle);  // work arrived: gather a cycle's worth first
        }
      } else if (elapsed < cycle) {
        waker->sleep_for(cycle - elapsed);  // a caller blocking in wait() ends it early
      }
      if (autotuner) {
        const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
        const detail::Autotuner::Params p = autotuner->record(cycle_bytes, seconds);
        if (p.cycle_time_ms != current_cycle_time_ms ||
            p.fusion_threshold_bytes != current_fusion_threshold_bytes) {
          active[0]->controller->ship_params(p.cycle_time_ms, p.fusion_threshold_bytes);
        }
      }
    }
  } catch (const RuntimeFault& e) {
    error = std::current_exception();
    logger.error(std::string("engine stopped: ") + e.what());
  } catch (const std::exception& e) {
    // A broken invariant or a contract error outside any request (e.g. the
    // settings exchange); surfaced to every pending and later request.
    error = std::make_exception_ptr(RuntimeFault(std::string("kolo engine stopped: ") + e.what()));
    logger.error(std::string("engine stopped: ") + e.what());
  }
  {
    std::lock_guard<std::mutex> lock(mutex);
    stopped = true;
    stop_reason = reason;
    fault = error;
  }
  queue.close();  // submit() now fails; everything queued before is failed below
  fail_everything(error ? error
                        : std::make_exception_ptr(
                              RuntimeFault("kolo engine: " + reason + " before this request ran")));
  if (timeline) timeline->flush();
}

void Engine::Impl::fail_everything(std::exception_ptr error) {
  for (auto& set : active) {
    while (!set->pending.empty()) finish(*set, set->pending.first(), error);
  }
  wake_finished();
  for (auto& request : queue.drain()) {
    queue.release(request->process_set, request->info.name);
    request->handle->complete(error);
  }
}

void Engine::Impl::drain() {
  const Clock::time_point now = Clock::now();
  for (auto& request : queue.drain()) {
    SetState* set = nullptr;
    for (auto& s : active) {
      if (s->id == request->process_set) set = s.get();
    }
    if (set == nullptr) {
      queue.release(request->process_set, request->info.name);
      request->handle->complete(std::make_exception_ptr(ContractError(
          std::string("kolo::Engine: ") + request_kind_name(request->info.kind) + " of tensor '" +
          request->info.name + "': process set " + std::to_string(request->process_set) +
          " was removed before the request ran")));
      continue;
    }
    Request* r = request.get();
    set->controller->submit(r->info, r, now, r->name_state ? &r->name_state->cache_slot : nullptr);
    set->pending.push(std::move(request));
    phase_begin(r, TimelinePhase::kNegotiate);
  }
}

Request* Engine::Impl::local(SetState& set, const std::string& name) {
  return set.pending.find(name);
}

void Engine::Impl::finish(SetState& set, const std::string& name, std::exception_ptr error) {
  finish(set, set.pending.find(name), std::move(error));
}

void Engine::Impl::finish(SetState& set, Request* pending, std::exception_ptr error) {
  std::unique_ptr<Request> request = set.pending.take(pending);
  if (!request) return;  // not pending (this rank has none, or it finished already)
  if (request->staged) {
    // The results go back to the device before the handle completes.
    try {
      staging->stage_out(*request, error == nullptr);
    } catch (const std::exception&) {
      if (!error) error = std::current_exception();
    }
  }
  phases_close(request.get());
  finished.push_back({std::move(request), std::move(error)});
}

void Engine::Impl::wake_finished() {
  if (finished.empty()) return;
  // Names are released before any handle completes (a caller may resubmit a
  // name the moment its wait() returns), all under one lock of the queue.
  queue.release_all(finished);
  for (Finished& f : finished) {
    for (const std::string& message : f.request->handle->complete(f.error, false)) {
      logger.warning("a completion callback of '" + f.request->info.name + "' threw: " + message);
    }
  }
  // Woken once the whole batch is complete: a caller waiting on the batch's
  // handles one by one then blocks at most once.
  for (Finished& f : finished) f.request->handle->wake();
  queue.recycle(finished);
}

void Engine::Impl::count_collective(uint64_t bytes) {
  cycle_bytes += bytes;
  std::lock_guard<std::mutex> lock(mutex);
  ++stats.collectives;
}

void Engine::Impl::run_set(SetState& set, Controller::Outcome& outcome) {
  if (outcome.has_params) {
    current_cycle_time_ms = outcome.cycle_time_ms;
    current_fusion_threshold_bytes = outcome.fusion_threshold_bytes;
    logger.debug("engine parameters from rank 0: cycle " + std::to_string(outcome.cycle_time_ms) +
                 " ms, fusion threshold " + std::to_string(outcome.fusion_threshold_bytes) +
                 " bytes");
  }
  uint64_t data_responses = 0;
  std::vector<Item> data;
  data.reserve(outcome.responses.size());
  for (size_t i = 0; i < outcome.responses.size(); ++i) {
    const Response& r = *outcome.responses[i];
    Request* req = static_cast<Request*>(outcome.owners[i]);  // submit() passed Request*
    if (is_data_kind(r.kind)) ++data_responses;
    if (r.status != Response::Status::kOk) {
      if (!r.contributed.empty() && !r.contributed[set.set_rank]) continue;
      std::exception_ptr error =
          r.status == Response::Status::kStalled
              ? std::make_exception_ptr(RuntimeFault(r.error, r.failed_ranks))
              : std::make_exception_ptr(ContractError(r.error));
      if (req) {
        finish(set, req, error);
      } else {
        finish(set, r.kind == RequestKind::kJoin ? detail::kJoinName : r.name, error);
      }
      continue;
    }
    switch (r.kind) {
      case RequestKind::kAddProcessSet:
        add_set(r, set);
        break;
      case RequestKind::kRemoveProcessSet:
        remove_set(r, set);
        break;
      case RequestKind::kJoin:
        break;
      default:
        if (timeline) mark_ready(req);
        data.push_back({&r, req});
    }
  }
  {
    std::lock_guard<std::mutex> lock(mutex);
    stats.cache_hits += outcome.cache_hits;
    stats.cache_evictions += outcome.cache_evictions;
    if (outcome.full_round) ++stats.full_negotiations;
    stats.responses += data_responses;
  }
  if (!data.empty()) execute(set, data);
  if (outcome.join_finished) {
    Request* join = local(set, detail::kJoinName);
    if (join) join->handle->value = outcome.last_joined;
    finish(set, detail::kJoinName, nullptr);
  }
  wake_finished();
}

// ---- process sets ---------------------------------------------------------------

void Engine::Impl::add_set(const Response& r, SetState& world_set) {
  const int id = next_set_id++;
  std::vector<int> ranks(r.splits.begin(), r.splits.end());
  {
    std::lock_guard<std::mutex> lock(mutex);
    sets[id] = ranks;
  }
  std::exception_ptr error;
  auto pos = std::find(ranks.begin(), ranks.end(), rank);
  if (pos != ranks.end()) {
    try {
      if (!factory) {
        throw ContractError(
            "kolo::Engine::add_process_set: this engine has no CommunicatorFactory to build the "
            "set's communicator; construct the Engine with one (Runtime::engine() does)");
      }
      auto state = std::make_unique<SetState>();
      state->id = id;
      state->ranks = ranks;
      state->set_rank = static_cast<int>(pos - ranks.begin());
      state->own_comm = factory(ranks, id);
      if (!state->own_comm || state->own_comm->size() != static_cast<int>(ranks.size()) ||
          state->own_comm->rank() != state->set_rank) {
        throw ContractError(
            "kolo::Engine::add_process_set: the CommunicatorFactory returned a "
            "communicator that is not rank " +
            std::to_string(state->set_rank) + " of " + std::to_string(ranks.size()));
      }
      state->comm = state->own_comm.get();
      ControllerOptions co;
      co.process_set = id;
      co.world_ranks = ranks;
      co.set_rank = state->set_rank;
      co.cache_capacity = options.cache_capacity;
      co.stall_warning_seconds = options.stall_warning_seconds;
      co.stall_shutdown_seconds = options.stall_shutdown_seconds;
      state->controller = std::make_unique<Controller>(*state->comm, co, logger);
      active.push_back(std::move(state));
    } catch (const std::exception& e) {
      logger.error("process set " + std::to_string(id) + " " + world_ranks_text(ranks) +
                   " could not be created on this rank: " + e.what());
      error = std::current_exception();
      std::lock_guard<std::mutex> lock(mutex);
      sets.erase(id);
    }
  }
  Request* req = local(world_set, r.name);
  if (req) req->handle->value = id;
  finish(world_set, r.name, error);
}

void Engine::Impl::remove_set(const Response& r, SetState& world_set) {
  const int id = r.root;
  {
    std::lock_guard<std::mutex> lock(mutex);
    sets.erase(id);
  }
  for (size_t i = 1; i < active.size(); ++i) {
    if (active[i]->id != id) continue;
    SetState& doomed = *active[i];
    while (!doomed.pending.empty()) {
      Request* request = doomed.pending.first();
      finish(doomed, request,
             std::make_exception_ptr(ContractError("kolo::Engine: process set " +
                                                   std::to_string(id) + " was removed while '" +
                                                   request->info.name + "' was pending on it")));
    }
    active.erase(active.begin() + static_cast<long>(i));
    break;
  }
  finish(world_set, r.name, nullptr);
}

// ---- timeline ---------------------------------------------------------------------

void Engine::Impl::phase_begin(Request* r, TimelinePhase phase, const char* op) {
  if (!timeline || !r) return;
  timeline->begin(r->info.name, phase, op);
  r->open_phases.push_back(phase);
}

void Engine::Impl::phase_end(Request* r, TimelinePhase phase) {
  if (!timeline || !r) return;
  // Ends `phase` and anything still open inside it (strict nesting).
  auto it = std::find(r->open_phases.begin(), r->open_phases.end(), phase);
  if (it == r->open_phases.end()) return;
  while (r->open_phases.size() > static_cast<size_t>(it - r->open_phases.begin())) {
    timeline->end(r->info.name, r->open_phases.back());
    r->open_phases.pop_back();
  }
}

void Engine::Impl::phases_close(Request* r) {
  if (!timeline || !r) return;
  while (!r->open_phases.empty()) {
    timeline->end(r->info.name, r->open_phases.back());
    r->open_phases.pop_back();
  }
}

void Engine::Impl::mark_ready(Request* r) {
  if (!timeline || !r) return;
  phases_close(r);  // NEGOTIATE (and WAIT_FOR_OTHER_RANKS inside it)
  phase_begin(r, TimelinePhase::kQueue);
}

}  // namespace kolo
