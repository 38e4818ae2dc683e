// The TCP rendezvous store's wire protocol (store_protocol.h).
#include "store_protocol.h"

#include <cctype>

#include "crypto.h"

namespace kolo::store_protocol {

void Writer::u32(uint32_t v) {
  for (int i = 0; i < 4; ++i) body_.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

void Writer::i64(int64_t v) {
  const uint64_t u = static_cast<uint64_t>(v);
  for (int i = 0; i < 8; ++i) body_.push_back(static_cast<char>((u >> (8 * i)) & 0xff));
}

void Writer::str(const std::string& s) {
  u32(static_cast<uint32_t>(s.size()));
  body_.append(s);
}

void Writer::bytes(const Bytes& b) {
  u32(static_cast<uint32_t>(b.size()));
  body_.append(reinterpret_cast<const char*>(b.data()), b.size());
}

uint32_t get_u32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t(static_cast<uint8_t>(p[i])) << (8 * i);
  return v;
}

uint8_t Reader::u8() {
  need(1);
  return static_cast<uint8_t>(data_[pos_++]);
}

uint32_t Reader::u32() {
  need(4);
  const uint32_t v = get_u32(data_ + pos_);
  pos_ += 4;
  return v;
}

int64_t Reader::i64() {
  need(8);
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t(static_cast<uint8_t>(data_[pos_ + i])) << (8 * i);
  pos_ += 8;
  return static_cast<int64_t>(v);
}

std::string Reader::str() {
  const uint32_t n = u32();
  need(n);
  std::string s(data_ + pos_, n);
  pos_ += n;
  return s;
}

Bytes Reader::bytes() {
  const uint32_t n = u32();
  need(n);
  Bytes b(reinterpret_cast<const uint8_t*>(data_ + pos_),
          reinterpret_cast<const uint8_t*>(data_ + pos_ + n));
  pos_ += n;
  return b;
}

Request decode_request(const char* message, size_t bytes) {
  Reader r(message, bytes);
  Request request;
  request.op = r.u8();
  switch (request.op) {
    case kSet:
      request.keys = {r.str()};
      request.value = r.bytes();
      break;
    case kGet:
    case kAdd:
      request.keys = {r.str()};
      request.number = r.i64();
      break;
    case kErase:
      request.keys = {r.str()};
      break;
    case kCheck:
    case kWait: {
      const uint32_t n = r.u32();
      // Each key takes at least its 4-byte length: a count beyond what the
      // message can hold is malformed (and must not size an allocation).
      if (n > (bytes - 5) / 4) throw ProtocolError("key count beyond the message");
      request.keys.reserve(n);
      for (uint32_t i = 0; i < n; ++i) request.keys.push_back(r.str());
      if (request.op == kWait) request.number = r.i64();
      break;
    }
    default:
      throw ProtocolError("unknown op " + std::to_string(request.op));
  }
  if (!r.at_end()) throw ProtocolError("trailing bytes");
  return request;
}

std::string random_nonce() { return detail::random_bytes(kNonceBytes); }

namespace {

std::string tag_of(const std::string& secret, char direction, const std::string& nonce,
                   uint64_t counter, const char* data, size_t bytes) {
  std::string text;
  text.reserve(1 + nonce.size() + 8 + bytes);
  text += direction;
  text += nonce;
  for (int i = 0; i < 8; ++i) text += static_cast<char>((counter >> (8 * i)) & 0xff);
  text.append(data, bytes);
  const detail::Digest digest = detail::hmac_sha256(secret, text);
  return std::string(reinterpret_cast<const char*>(digest.data()), digest.size());
}

std::string length_prefix(size_t bytes) {
  std::string prefix(4, '\0');
  for (int i = 0; i < 4; ++i) prefix[i] = static_cast<char>((bytes >> (8 * i)) & 0xff);
  return prefix;
}

char lower(char upper) {
  return static_cast<char>(std::tolower(static_cast<unsigned char>(upper)));
}

}  // namespace

std::string seal(const std::string& secret, char upper, const std::string& nonce, uint64_t counter,
                 const std::string& message) {
  const std::string prefix = length_prefix(message.size());
  if (secret.empty()) return prefix + message;
  return prefix + tag_of(secret, upper, nonce, counter, prefix.data(), 4) + message +
         tag_of(secret, lower(upper), nonce, counter, message.data(), message.size());
}

bool header_valid(const std::string& secret, char upper, const std::string& nonce, uint64_t counter,
                  const char* header) {
  const std::string tag = tag_of(secret, upper, nonce, counter, header, 4);
  return detail::digest_equal(reinterpret_cast<const uint8_t*>(header + 4),
                              reinterpret_cast<const uint8_t*>(tag.data()), kTagBytes);
}

bool message_valid(const std::string& secret, char upper, const std::string& nonce,
                   uint64_t counter, const char* data, size_t message_bytes) {
  const std::string tag = tag_of(secret, lower(upper), nonce, counter, data, message_bytes);
  return detail::digest_equal(reinterpret_cast<const uint8_t*>(data + message_bytes),
                              reinterpret_cast<const uint8_t*>(tag.data()), kTagBytes);
}

}  // namespace kolo::store_protocol
