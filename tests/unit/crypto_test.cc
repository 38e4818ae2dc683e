// kolo's libcrypto wrappers (core/src/crypto.h): SHA-256 against FIPS 180-4
// examples, HMAC-SHA256 against RFC 4231, random bytes.
#include "crypto.h"

#include <gtest/gtest.h>

#include <set>

namespace kolo::detail {
namespace {

std::string hex(const Digest& d) { return to_hex(d.data(), d.size()); }

TEST(Sha256, FipsExamples) {
  EXPECT_EQ(hex(sha256("")), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(hex(sha256("abc")), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(hex(sha256("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq")),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

TEST(HmacSha256, Rfc4231TestCases) {
  EXPECT_EQ(hex(hmac_sha256(std::string(20, '\x0b'), "Hi There")),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  EXPECT_EQ(hex(hmac_sha256("Jefe", "what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  EXPECT_EQ(hex(hmac_sha256(std::string(20, '\xaa'), std::string(50, '\xdd'))),
            "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe");
  std::string key4;
  for (int i = 1; i <= 25; ++i) key4 += static_cast<char>(i);
  EXPECT_EQ(hex(hmac_sha256(key4, std::string(50, '\xcd'))),
            "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b");
  // Keys longer than a block are hashed first (test cases 6 and 7).
  EXPECT_EQ(hex(hmac_sha256(std::string(131, '\xaa'),
                            "Test Using Larger Than Block-Size Key - Hash Key First")),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
  EXPECT_EQ(hex(hmac_sha256(std::string(131, '\xaa'),
                            "This is a test using a larger than block-size key and a larger than "
                            "block-size data. The key needs to be hashed before being used by the "
                            "HMAC algorithm.")),
            "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2");
}

TEST(HmacSha256, HexAndComparison) {
  const uint8_t bytes[] = {0x00, 0xff, 0x10};
  EXPECT_EQ(to_hex(bytes, 3), "00ff10");
  const Digest a = sha256("a"), b = sha256("b");
  EXPECT_TRUE(digest_equal(a.data(), a.data(), a.size()));
  EXPECT_FALSE(digest_equal(a.data(), b.data(), a.size()));
}

TEST(RandomBytes, LengthsAndNoRepeats) {
  EXPECT_EQ(random_bytes(0), "");
  EXPECT_EQ(random_bytes(1).size(), 1u);
  EXPECT_EQ(random_bytes(1000).size(), 1000u);
  // 100 draws of 128 bits: a repeat would mean a broken generator.
  std::set<std::string> seen;
  for (int i = 0; i < 100; ++i) seen.insert(random_bytes(16));
  EXPECT_EQ(seen.size(), 100u);
}

}  // namespace
}  // namespace kolo::detail
