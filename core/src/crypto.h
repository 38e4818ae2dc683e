// The cryptography kolo needs, from OpenSSL's libcrypto (Debian libssl-dev):
// HMAC-SHA256 (RFC 2104) authenticates the rendezvous store's messages with
// the per-job secret (store_protocol.cc), and random_bytes draws that secret
// (kolorun) and the store's session nonces from the system's CSPRNG.
// Checked against the FIPS 180-4 and RFC 4231 vectors (tests/unit/crypto_test.cc).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace kolo::detail {

using Digest = std::array<uint8_t, 32>;

// SHA-256 of `data`.
Digest sha256(const std::string& data);

// HMAC-SHA256 of `message` under `key` (any length).
Digest hmac_sha256(const std::string& key, const std::string& message);

// Constant-time comparison (a forged tag cannot be found byte by byte).
bool digest_equal(const uint8_t* a, const uint8_t* b, size_t bytes);

// `bytes` bytes from OpenSSL's CSPRNG (RAND_bytes, seeded by the kernel).
// Throws RuntimeFault if the generator cannot deliver (never a weak fallback).
std::string random_bytes(size_t bytes);

// Lower-case hex of bytes.
std::string to_hex(const uint8_t* data, size_t bytes);

}  // namespace kolo::detail
