// Fuzz target: the rendezvous store's server side (core/src/store_service.h)
// fed what a client could send, with and without a job secret, and the
// request decoder (store_protocol.h) on its own.
//
// Input: byte 0 bit 0 = authenticated store; then records
//   u8 kind, u16 length, `length` bytes:
//   kind % 4 == 0: raw bytes on the connection (any framing, any tags);
//   kind % 4 == 1: one request message, framed and signed properly (so that
//                  the fuzzer reaches the decoder and the handlers behind the
//                  authentication);
//   kind % 4 == 2: the client reads every reply, and `length` ms pass;
//   kind % 4 == 3: the bytes go to decode_request() directly.
// Invariants checked on every step (abort = finding): the session buffers at
// most one header, one message of at most max_message_bytes and its tag, and
// unsent replies of at most the backlog limit plus one reply.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "store_protocol.h"
#include "store_service.h"

namespace {

namespace sp = kolo::store_protocol;
using kolo::detail::StoreService;

constexpr size_t kMaxMessage = 4096;
constexpr size_t kBacklog = 8192;
const std::string kSecret = "fuzz-secret";

struct Harness {
  explicit Harness(bool authenticated)
      : secret(authenticated ? kSecret : ""),
        service(secret, StoreService::Limits{kMaxMessage, kBacklog}, nullptr) {
    reopen();
  }
  void reopen() {
    session = StoreService::Session{};
    service.open(session, secret.empty() ? "" : std::string(sp::kNonceBytes, 'n'));
    session.out.clear();  // the client read the nonce
  }
  void check() const {
    if (session.head.size() > sp::header_bytes(!secret.empty())) std::abort();
    if (session.message.size() > kMaxMessage + sp::kTagBytes) std::abort();
    // One reply of a get is at most a stored value (< max message) + framing.
    if (session.out.size() > kBacklog + kMaxMessage + 256) std::abort();
  }
  // Feeds `bytes` as far as the session takes them; lets time pass and the
  // client read when it stalls.
  void feed(const std::string& bytes) {
    size_t at = 0;
    int stalls = 0;
    while (at < bytes.size()) {
      const size_t want = service.wanted(session);
      if (want == 0) {
        if (++stalls > 2) return;  // a far deadline: the client gives up
        session.out.clear();
        if (session.parked) now = std::max(now, session.deadline);
        service.try_unpark(session, now);
        continue;
      }
      const size_t n = std::min(want, bytes.size() - at);
      bool changed = false;
      if (!service.receive(session, bytes.data() + at, n, now, changed)) {
        reopen();
        return;
      }
      check();
      at += n;
      if (changed) service.try_unpark(session, now);
    }
  }

  std::string secret;
  StoreService service;
  StoreService::Session session;
  StoreService::Clock::time_point now{};
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  Harness h(data[0] & 1);
  size_t at = 1;
  while (at + 3 <= size) {
    const uint8_t kind = data[at];
    const size_t length = std::min<size_t>(data[at + 1] | (data[at + 2] << 8), size - at - 3);
    const std::string bytes(reinterpret_cast<const char*>(data) + at + 3, length);
    at += 3 + length;
    switch (kind % 4) {
      case 0:
        h.feed(bytes);
        break;
      case 1:
        h.feed(sp::seal(h.secret, 'Q', h.session.nonce, h.session.requests, bytes));
        break;
      case 2: {
        h.session.out.clear();
        // At most 65535 ms per record, saturating: parked deadlines can move
        // `now` close to the clock's end.
        const auto step = std::chrono::milliseconds(length);
        h.now = StoreService::Clock::time_point::max() - h.now > step
                    ? h.now + step
                    : StoreService::Clock::time_point::max();
        h.service.try_unpark(h.session, h.now);
        break;
      }
      case 3:
        try {
          sp::decode_request(bytes.data(), bytes.size());
        } catch (const sp::ProtocolError&) {
        }
        break;
    }
    h.check();
  }
  return 0;
}
