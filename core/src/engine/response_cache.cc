#include "engine/response_cache.h"

namespace kolo::detail {

ResponseCache::ResponseCache(int capacity) : capacity_(capacity < 0 ? 0 : capacity) {}

int ResponseCache::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? -1 : it->second;
}

void ResponseCache::touch(int slot) {
  Slot& s = slots_[slot];
  lru_.splice(lru_.end(), lru_, s.lru);
}

int ResponseCache::put(ResponsePtr response, const RequestInfo& mine, std::string* evicted,
                       int* evicted_slot) {
  if (evicted) evicted->clear();
  if (evicted_slot) *evicted_slot = -1;
  if (capacity_ == 0) return -1;
  if (static_cast<int>(index_.size()) >= capacity_) {
    const int victim = lru_.front();
    const std::string victim_name = slots_[victim].response->name;
    if (evicted) *evicted = victim_name;
    if (evicted_slot) *evicted_slot = victim;
    erase(victim_name);
  }
  int slot;
  if (!free_.empty()) {
    slot = *free_.begin();
    free_.erase(free_.begin());
  } else {
    slot = static_cast<int>(slots_.size());
    slots_.emplace_back();
  }
  Slot& s = slots_[slot];
  s.used = true;
  index_[response->name] = slot;
  s.response = std::move(response);
  s.mine = mine;
  s.lru = lru_.insert(lru_.end(), slot);
  return slot;
}

void ResponseCache::erase(const std::string& name) {
  auto it = index_.find(name);
  if (it == index_.end()) return;
  const int slot = it->second;
  index_.erase(it);
  Slot& s = slots_[slot];
  lru_.erase(s.lru);
  s.used = false;
  s.response.reset();
  s.mine = RequestInfo{};
  free_.insert(slot);
}

}  // namespace kolo::detail
