// RoundStore (round_store.h).
#include "elastic/round_store.h"

#include <algorithm>

#include "kolo/core/errors.h"

namespace kolo::elastic {

using std::chrono::milliseconds;

std::string failed_round_key(int64_t round) { return "elastic/failed/" + std::to_string(round); }

RoundStore::RoundStore(std::shared_ptr<Store> inner, int64_t round, milliseconds poll)
    : inner_(std::move(inner)), round_(round), poll_(poll) {}

void RoundStore::set(const std::string& key, const Bytes& value) { inner_->set(key, value); }

Bytes RoundStore::get(const std::string& key, milliseconds timeout) {
  wait({key}, timeout);
  return inner_->get(key, milliseconds(0));
}

int64_t RoundStore::add(const std::string& key, int64_t delta) { return inner_->add(key, delta); }

bool RoundStore::check(const std::vector<std::string>& keys) { return inner_->check(keys); }

bool RoundStore::erase(const std::string& key) { return inner_->erase(key); }

void RoundStore::wait(const std::vector<std::string>& keys, milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    const auto left =
        std::chrono::duration_cast<milliseconds>(deadline - std::chrono::steady_clock::now());
    try {
      inner_->wait(keys, std::max(milliseconds(0), std::min(left, poll_)));
      return;
    } catch (const TimeoutError&) {
      if (left <= poll_) throw;  // the caller's whole timeout has passed
    }
    std::string waited;
    for (const auto& key : keys) waited += (waited.empty() ? "'" : ", '") + key + "'";
    throw_if_failed("in the store for " + waited);
  }
}

void RoundStore::throw_if_failed(const std::string& waiting_for) {
  const std::string failed = failed_round_key(round_);
  if (!inner_->check({failed})) return;
  const std::string why = to_string(inner_->get(failed, milliseconds(0)));
  throw RuntimeFault("kolo elastic: kolorun gave up on round " + std::to_string(round_) + " (" +
                     why + ") while this worker waited " + waiting_for + "; rejoining");
}

}  // namespace kolo::elastic
