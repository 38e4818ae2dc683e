// HMAC-SHA256, SHA-256 and random bytes through libcrypto (crypto.h).
#include "crypto.h"

#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include "kolo/core/errors.h"

namespace kolo::detail {
namespace {

std::string openssl_error() {
  char text[256] = "no error queued";
  if (const unsigned long code = ERR_get_error()) ERR_error_string_n(code, text, sizeof(text));
  return text;
}

}  // namespace

Digest sha256(const std::string& data) {
  Digest digest;
  unsigned int length = 0;
  if (EVP_Digest(data.data(), data.size(), digest.data(), &length, EVP_sha256(), nullptr) != 1 ||
      length != digest.size()) {
    throw RuntimeFault("kolo: SHA-256 failed in libcrypto: " + openssl_error());
  }
  return digest;
}

Digest hmac_sha256(const std::string& key, const std::string& message) {
  Digest digest;
  unsigned int length = 0;
  if (HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
           reinterpret_cast<const unsigned char*>(message.data()), message.size(), digest.data(),
           &length) == nullptr ||
      length != digest.size()) {
    throw RuntimeFault("kolo: HMAC-SHA256 failed in libcrypto: " + openssl_error());
  }
  return digest;
}

bool digest_equal(const uint8_t* a, const uint8_t* b, size_t bytes) {
  return CRYPTO_memcmp(a, b, bytes) == 0;
}

std::string random_bytes(size_t bytes) {
  std::string out(bytes, '\0');
  if (bytes > 0 &&
      RAND_bytes(reinterpret_cast<unsigned char*>(out.data()), static_cast<int>(bytes)) != 1) {
    throw RuntimeFault("kolo: the system's random generator (OpenSSL RAND_bytes) failed: " +
                       openssl_error());
  }
  return out;
}

std::string to_hex(const uint8_t* data, size_t bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  out.reserve(2 * bytes);
  for (size_t i = 0; i < bytes; ++i) {
    out += digits[data[i] >> 4];
    out += digits[data[i] & 15];
  }
  return out;
}

}  // namespace kolo::detail
