// SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104), for authenticating the
// rendezvous store's messages with a per-job secret (store_tcp.cc). Small and
// self-contained so that libkolo_core needs no crypto library; checked against
// the FIPS and RFC 4231 test vectors (tests/unit/hmac_test.cc).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace kolo::detail {

using Digest = std::array<uint8_t, 32>;

// Incremental SHA-256.
class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t bytes);
  Digest finish();  // the object must not be used afterwards

 private:
  void block(const uint8_t* chunk);  // one 64-byte block
  uint32_t h_[8];
  uint8_t buffer_[64];
  size_t buffered_ = 0;
  uint64_t total_bytes_ = 0;
};

Digest sha256(const std::string& data);

// HMAC-SHA256 of `message` under `key` (any length).
Digest hmac_sha256(const std::string& key, const std::string& message);

// Constant-time comparison (a forged tag cannot be found byte by byte).
bool digest_equal(const uint8_t* a, const uint8_t* b, size_t bytes);

// Lower-case hex of bytes, and back ("" and false on a malformed string).
std::string to_hex(const uint8_t* data, size_t bytes);
bool from_hex(const std::string& hex, std::string* out);

}  // namespace kolo::detail
