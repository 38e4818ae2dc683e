// The parameter server's messages and clocks (ps_protocol.h).
#include "ps_protocol.h"

#include <algorithm>
#include <climits>
#include <cstddef>

#include "kolo/core/errors.h"

namespace kolo::ps {

std::vector<int64_t> Header::encode() const {
  return {static_cast<int64_t>(kind), clock, count, fingerprint, value, status};
}

Header Header::decode(const int64_t* words, const std::string& source) {
  Header h;
  const int64_t kind = words[0];
  if (kind < static_cast<int64_t>(Kind::kHello) || kind > static_cast<int64_t>(Kind::kRejoin)) {
    throw ContractError(source + ": not a parameter-server message (kind " + std::to_string(kind) +
                        "); is the peer running the same kolo?");
  }
  h.kind = static_cast<Kind>(kind);
  h.clock = words[1];
  h.count = words[2];
  h.fingerprint = words[3];
  h.value = words[4];
  h.status = words[5];
  if (h.clock < 0 || h.count < 0) {
    throw ContractError(source + ": message with a negative clock (" + std::to_string(h.clock) +
                        ") or count (" + std::to_string(h.count) + ")");
  }
  return h;
}

// ---- ServerClocks ----

namespace {
constexpr size_t kStalenessBins = 64;
}

ServerClocks::ServerClocks(int workers, Mode mode, int max_staleness)
    : mode_(mode),
      max_staleness_(max_staleness),
      clocks_(workers, 0),
      read_at_(workers, 0),
      live_(workers, true) {
  if (max_staleness < 0) {
    throw ContractError("kolo::ps: max_staleness must be >= 0, got " +
                        std::to_string(max_staleness));
  }
  stats_.counts.assign(kStalenessBins, 0);
  stats_.worker_updates.assign(workers, 0);
  stats_.rejoins.assign(workers, 0);
}

int64_t ServerClocks::slowest_live_clock() const {
  int64_t slowest = INT64_MAX;
  for (size_t w = 0; w < clocks_.size(); ++w) {
    if (live_[w]) slowest = std::min(slowest, clocks_[w]);
  }
  return slowest;
}

int ServerClocks::live_workers() const {
  return static_cast<int>(std::count(live_.begin(), live_.end(), true));
}

bool ServerClocks::may_serve_pull(int64_t clock) const {
  switch (mode_) {
    case Mode::kSync:
      return rounds_ >= clock;
    case Mode::kSsp:
      return slowest_live_clock() >= clock - max_staleness_;
    case Mode::kAsync:
      return true;
  }
  return true;
}

std::vector<int> ServerClocks::holding_back(int64_t clock) const {
  std::vector<int> workers;
  if (mode_ == Mode::kAsync) return workers;
  const int64_t needed = mode_ == Mode::kSync ? clock : clock - max_staleness_;
  for (size_t w = 0; w < clocks_.size(); ++w) {
    if (live_[w] && clocks_[w] < needed) workers.push_back(static_cast<int>(w));
  }
  return workers;
}

int64_t ServerClocks::served_pull(int worker, int64_t clock) {
  const int64_t slowest = slowest_live_clock();
  const int64_t staleness = slowest == INT64_MAX ? 0 : std::max<int64_t>(0, clock - slowest);
  read_at_[worker] = staleness;
  return staleness;
}

bool ServerClocks::pushed(int worker, int64_t clock) {
  if (clock != clocks_[worker]) {
    throw ContractError("kolo::ps server: worker " + std::to_string(worker) + " pushed step " +
                        std::to_string(clock) + " but its next step is " +
                        std::to_string(clocks_[worker]) +
                        "; call pull() and push() once per step, in that order");
  }
  clocks_[worker] = clock + 1;
  const int64_t staleness = read_at_[worker];
  stats_.updates += 1;
  stats_.worker_updates[worker] += 1;
  stats_.max_staleness = std::max(stats_.max_staleness, staleness);
  stats_.counts[std::min<size_t>(static_cast<size_t>(staleness), kStalenessBins - 1)] += 1;
  if (mode_ != Mode::kSync) return false;
  round_pushes_ += 1;
  return round_complete();
}

bool ServerClocks::round_complete() const {
  if (mode_ != Mode::kSync || round_pushes_ == 0) return false;
  for (size_t w = 0; w < clocks_.size(); ++w) {
    if (live_[w] && clocks_[w] <= rounds_) return false;
  }
  return true;
}

void ServerClocks::round_applied() {
  rounds_ += 1;
  round_pushes_ = 0;
}

void ServerClocks::left(int worker) { live_[worker] = false; }

int64_t ServerClocks::rejoin_clock(int worker) const {
  const int64_t slowest = slowest_live_clock();
  return slowest == INT64_MAX ? clocks_[worker] : slowest;
}

void ServerClocks::rejoined(int worker, int64_t clock) {
  live_[worker] = true;
  clocks_[worker] = clock;
  read_at_[worker] = 0;
  stats_.rejoins[worker] += 1;
}

void ServerClocks::resume(int64_t step) {
  for (int64_t& clock : clocks_) clock = step;
  rounds_ = step;
}

}  // namespace kolo::ps
