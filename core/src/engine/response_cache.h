// Response cache (internal): responses agreed in earlier negotiations, by name.
//
// Every rank of a process set holds a cache with the same names in the same
// slots and the same LRU order, because every change is driven by the agreed
// negotiation results, applied in the same order on every rank: put() for new
// responses in response order, touch() for responses agreed through the bit
// vector in slot order, erase() for names that reappear in a full negotiation.
// Slot numbers are therefore global: bit c of the per-cycle bit vector means
// "my pending request is the one cached in slot c" on every rank.
//
// Each rank also keeps its own RequestInfo for the name (`mine`): a new
// request hits the cache only if it equals what this rank sent last time, and
// when every rank hits, the cached response is exactly what a full negotiation
// would compute again.
#pragma once

#include <cstdint>
#include <list>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/message.h"

namespace kolo::detail {

class ResponseCache {
 public:
  explicit ResponseCache(int capacity);

  int capacity() const { return capacity_; }
  // Slots in use or ever used: the bit vector's length (same on every rank).
  int slot_count() const { return static_cast<int>(slots_.size()); }
  int size() const { return static_cast<int>(index_.size()); }

  // Slot holding `name`, or -1.
  int find(const std::string& name) const;
  // Whether `slot` (any int) holds `name`: checks a remembered slot without
  // the lookup by name.
  bool holds(int slot, const std::string& name) const {
    return slot >= 0 && slot < slot_count() && slots_[slot].used &&
           slots_[slot].response->name == name;
  }
  const ResponsePtr& response(int slot) const { return slots_[slot].response; }
  const RequestInfo& mine(int slot) const { return slots_[slot].mine; }

  // Marks `slot` most recently used.
  void touch(int slot);
  // Caches `response` (its name must not be cached). When full, evicts the
  // least recently used entry first and returns its name in *evicted and its
  // slot in *evicted_slot (else leaves them empty and -1). Returns the slot:
  // the lowest free one (possibly the evicted one).
  int put(ResponsePtr response, const RequestInfo& mine, std::string* evicted,
          int* evicted_slot = nullptr);
  void erase(const std::string& name);

 private:
  struct Slot {
    bool used = false;
    ResponsePtr response;
    RequestInfo mine;
    std::list<int>::iterator lru;
  };
  int capacity_;
  std::vector<Slot> slots_;
  std::unordered_map<std::string, int> index_;
  std::list<int> lru_;  // front = least recently used
  std::set<int> free_;  // freed slots below slots_.size()
};

}  // namespace kolo::detail
