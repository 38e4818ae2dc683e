// The TCP rendezvous store's wire protocol (internal; store_tcp.cc serves and
// speaks it, store_service.h holds the server's side of it).
//
// All integers little-endian.
//   request  = u8 op, fields...      string = u32 length, bytes
//     kSet   key value               -> kOk
//     kGet   key i64 timeout_ms      -> kOk value | kTimeout
//     kAdd   key i64 delta           -> kOk i64 new_value
//     kCheck u32 n, n * key          -> kOk u8 all_present
//     kWait  u32 n, n * key, i64 timeout_ms -> kOk | kTimeout u32 n, n * missing key
//     kErase key                     -> kOk u8 existed
//   response = u8 status, fields...; any request may be answered
//     kError string (a request the store refuses: too large, add to a value
//     that is not a number), after which the connection goes on.
//
// Framing without a secret:  frame = u32 message_bytes, message.
// With a secret (Options::secret on both sides) the server first sends one
// unsigned frame holding a 16-byte random nonce; then every frame is
//   u32 message_bytes, header_tag, message, message_tag
//   header_tag  = HMAC-SHA256(secret, D + nonce + u64 n + u32 message_bytes)
//   message_tag = HMAC-SHA256(secret, d + nonce + u64 n + message)
// with (D, d) = ('Q', 'q') for requests and ('R', 'r') for replies and n the
// index of the request on this connection. The header tag lets a receiver
// check who sent a frame from its first 36 bytes, before it buffers or even
// reads the message: a peer without the secret is dropped after 36 bytes.
// A recorded frame cannot be replayed (the nonce and n differ).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kolo/core/errors.h"
#include "kolo/core/store.h"

namespace kolo::store_protocol {

enum Op : uint8_t { kSet = 1, kGet = 2, kAdd = 3, kCheck = 4, kWait = 5, kErase = 6 };
enum Status : uint8_t { kOk = 0, kTimeout = 1, kError = 2 };

constexpr size_t kNonceBytes = 16;
constexpr size_t kTagBytes = 32;
// Largest message either side ever sends (the u32 length's sanity bound);
// the server's own, lower limit is TcpStoreServer::Options::max_message_bytes.
constexpr uint32_t kMaxFrameBytes = 1u << 30;

// Thrown by Reader on a malformed message (the server drops such a client).
struct ProtocolError : RuntimeFault {
  explicit ProtocolError(const std::string& what)
      : RuntimeFault("kolo store: malformed message (" + what + ")") {}
};

class Writer {
 public:
  void u8(uint8_t v) { body_.push_back(static_cast<char>(v)); }
  void u32(uint32_t v);
  void i64(int64_t v);
  void str(const std::string& s);
  void bytes(const Bytes& b);
  const std::string& body() const { return body_; }

 private:
  std::string body_;
};

class Reader {
 public:
  Reader(const char* data, size_t size) : data_(data), size_(size) {}
  uint8_t u8();
  uint32_t u32();
  int64_t i64();
  std::string str();
  Bytes bytes();
  bool at_end() const { return pos_ == size_; }

 private:
  void need(size_t n) const {
    if (size_ - pos_ < n) throw ProtocolError("truncated");
  }
  const char* data_;
  size_t size_;
  size_t pos_ = 0;
};

uint32_t get_u32(const char* p);

// One decoded request.
struct Request {
  uint8_t op = 0;
  std::vector<std::string> keys;  // one for set/get/add/erase
  Bytes value;                    // set
  int64_t number = 0;             // get/wait: timeout_ms; add: delta
};
// ProtocolError on an unknown op, a truncated message or trailing bytes.
Request decode_request(const char* message, size_t bytes);

std::string random_nonce();

// Bytes of the header (u32 length + header tag) of a frame; 4 unsigned.
inline size_t header_bytes(bool authenticated) { return authenticated ? 4 + kTagBytes : 4; }

// A whole frame holding `message` ("" secret: unsigned). `upper` is the
// header tag's direction ('Q' or 'R'); the message tag uses its lower case.
std::string seal(const std::string& secret, char upper, const std::string& nonce, uint64_t counter,
                 const std::string& message);
// Whether the first header_bytes(true) bytes of a frame carry a valid header
// tag for direction `upper` and counter `counter`.
bool header_valid(const std::string& secret, char upper, const std::string& nonce, uint64_t counter,
                  const char* header);
// Whether `message` followed by its tag (message_bytes + kTagBytes bytes at
// `data`) carries a valid message tag.
bool message_valid(const std::string& secret, char upper, const std::string& nonce,
                   uint64_t counter, const char* data, size_t message_bytes);

}  // namespace kolo::store_protocol
