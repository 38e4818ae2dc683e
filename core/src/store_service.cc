// The rendezvous store's server side without sockets (store_service.h).
#include "store_service.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>

#include "store_protocol.h"

namespace kolo::detail {

namespace sp = store_protocol;

namespace {

// Bytes of a refused message skipped per receive() call: any number works
// (nothing is buffered); this only bounds one read.
constexpr size_t kSkipChunk = size_t{1} << 20;
// A received message's buffer is given back when it grew past this.
constexpr size_t kKeepCapacity = size_t{64} << 10;

}  // namespace

StoreService::StoreService(std::string secret, Limits limits,
                           std::function<void(const std::string&)> on_reject)
    : secret_(std::move(secret)), limits_(limits), on_reject_(std::move(on_reject)) {}

void StoreService::open(Session& s, const std::string& nonce) const {
  s.nonce = nonce;
  // The challenge itself is not signed.
  if (authenticated()) s.out += sp::seal("", 0, "", 0, nonce);
}

size_t StoreService::wanted(const Session& s) const {
  if (s.parked || s.out.size() > limits_.max_reply_backlog_bytes) return 0;
  if (s.skip > 0) return static_cast<size_t>(std::min<uint64_t>(s.skip, kSkipChunk));
  if (!s.in_message) return sp::header_bytes(authenticated()) - s.head.size();
  return s.message_bytes + (authenticated() ? sp::kTagBytes : 0) - s.message.size();
}

void StoreService::reject(const Session& s, const std::string& why) const {
  if (on_reject_) {
    on_reject_("rejected a connection from " + s.peer + ": " + why + " (request " +
               std::to_string(s.requests) + " on the connection)");
  }
}

bool StoreService::receive(Session& s, const char* data, size_t n, Clock::time_point now,
                           bool& changed) {
  if (s.skip > 0) {
    s.skip -= std::min<uint64_t>(s.skip, n);
    return true;
  }
  if (!s.in_message) {
    s.head.append(data, n);
    if (s.head.size() < sp::header_bytes(authenticated())) return true;
    const uint32_t bytes = sp::get_u32(s.head.data());
    if (authenticated() && !sp::header_valid(secret_, 'Q', s.nonce, s.requests, s.head.data())) {
      reject(s, "a message without a valid tag of this job's secret");
      return false;
    }
    s.head.clear();
    if (bytes > limits_.max_message_bytes) {
      // Answered, and its bytes skipped unread: the client gets a clear error.
      sp::Writer w;
      w.u8(sp::kError);
      w.str("a request of " + std::to_string(bytes) + " bytes is over this store's limit of " +
            std::to_string(limits_.max_message_bytes) +
            " bytes (KOLO_STORE_MAX_MESSAGE_BYTES of the process serving it)");
      reply(s, w.body());
      s.skip = uint64_t{bytes} + (authenticated() ? sp::kTagBytes : 0);
      return true;
    }
    s.in_message = true;
    s.message_bytes = bytes;
    // Only an empty unsigned message is complete already.
    if (bytes > 0 || authenticated()) return true;
  } else {
    s.message.append(data, n);
    if (s.message.size() < s.message_bytes + (authenticated() ? sp::kTagBytes : 0)) return true;
  }
  if (authenticated() &&
      !sp::message_valid(secret_, 'Q', s.nonce, s.requests, s.message.data(), s.message_bytes)) {
    reject(s, "a message whose tag does not match its contents");
    return false;
  }
  const bool ok = handle_message(s, now, changed);
  s.in_message = false;
  s.message.clear();
  if (s.message.capacity() > kKeepCapacity) std::string().swap(s.message);
  return ok;
}

bool StoreService::handle_message(Session& s, Clock::time_point now, bool& changed) {
  sp::Request request;
  try {
    request = sp::decode_request(s.message.data(), s.message_bytes);
  } catch (const sp::ProtocolError&) {
    return false;  // not our protocol, or a broken client: drop it
  }
  s.proven = true;
  sp::Writer w;
  switch (request.op) {
    case sp::kSet:
      data_[request.keys[0]] = std::move(request.value);
      changed = true;
      w.u8(sp::kOk);
      break;
    case sp::kGet:
    case sp::kWait:
      s.parked = true;
      s.parked_op = request.op;
      s.parked_keys = std::move(request.keys);
      {
        // A client's timeout, at most about 35 years and never past the
        // clock's end (now + timeout must not overflow the time_point).
        const int64_t room =
            std::chrono::duration_cast<std::chrono::milliseconds>(Clock::time_point::max() - now)
                .count();
        s.deadline = now + std::chrono::milliseconds(std::clamp<int64_t>(
                               request.number, 0, std::min(int64_t{1} << 40, room)));
      }
      try_unpark(s, Clock::time_point::min());  // answers at once if the keys exist
      return true;
    case sp::kAdd: {
      const std::string& key = request.keys[0];
      int64_t value = 0;
      auto it = data_.find(key);
      if (it != data_.end()) {
        const std::string text(it->second.begin(), it->second.end());
        char* end = nullptr;
        errno = 0;
        const long long parsed = std::strtoll(text.c_str(), &end, 10);
        if (text.empty() || *end != '\0' || errno != 0) {
          w.u8(sp::kError);
          w.str("add: the existing value of '" + key + "' is not a decimal integer");
          reply(s, w.body());
          return true;
        }
        value = parsed;
      }
      // Wraps like the two's-complement sum (no undefined overflow).
      value = static_cast<int64_t>(static_cast<uint64_t>(value) +
                                   static_cast<uint64_t>(request.number));
      const std::string text = std::to_string(value);
      data_[key] = Bytes(text.begin(), text.end());
      changed = true;
      w.u8(sp::kOk);
      w.i64(value);
      break;
    }
    case sp::kCheck: {
      bool present = true;
      for (const auto& key : request.keys) present = present && data_.count(key) > 0;
      w.u8(sp::kOk);
      w.u8(present ? 1 : 0);
      break;
    }
    case sp::kErase: {
      const bool existed = data_.erase(request.keys[0]) > 0;
      changed = changed || existed;
      w.u8(sp::kOk);
      w.u8(existed ? 1 : 0);
      break;
    }
  }
  reply(s, w.body());
  return true;
}

void StoreService::reply(Session& s, const std::string& message) {
  s.out += sp::seal(secret_, 'R', s.nonce, s.requests, message);
  ++s.requests;
}

void StoreService::try_unpark(Session& s, Clock::time_point now) {
  if (!s.parked) return;
  sp::Writer w;
  bool all = true;
  for (const auto& key : s.parked_keys) all = all && data_.count(key) > 0;
  if (all) {
    w.u8(sp::kOk);
    if (s.parked_op == sp::kGet) w.bytes(data_[s.parked_keys[0]]);
  } else if (now >= s.deadline) {
    w.u8(sp::kTimeout);
    if (s.parked_op == sp::kWait) {
      std::vector<std::string> missing;
      for (const auto& key : s.parked_keys) {
        if (!data_.count(key)) missing.push_back(key);
      }
      w.u32(static_cast<uint32_t>(missing.size()));
      for (const auto& key : missing) w.str(key);
    }
  } else {
    return;
  }
  reply(s, w.body());
  s.parked = false;
  s.parked_keys.clear();
}

}  // namespace kolo::detail
