// kolo's archive encoding (torch/src/archive_codec.h): the round trip of every
// kind it stores, and every bound of the decoder on crafted bytes (each a
// clear ContractError before anything is allocated; before this codec the
// payload went to libtorch's zip reader, which allocated what a record
// declared and crashed on crafted archives).
#include "archive_codec.h"

#include <gtest/gtest.h>
#include <torch/serialize/archive.h>
#include <torch/torch.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "kolo/core/errors.h"

namespace kolo::detail {
namespace {

std::string error_of(const std::string& bytes) {
  try {
    check_archive(bytes);
    torch::serialize::InputArchive in;
    decode_archive(bytes, in);
  } catch (const ContractError& e) {
    return e.what();
  }
  return "";
}

// Hand-made encodings (the layout of archive_codec.h).
std::string u8(int v) { return std::string(1, static_cast<char>(v)); }
std::string u32(uint32_t v) {
  std::string s(4, '\0');
  std::memcpy(s.data(), &v, 4);
  return s;
}
std::string i64(int64_t v) {
  std::string s(8, '\0');
  std::memcpy(s.data(), &v, 8);
  return s;
}
std::string header() { return std::string("KOLOARCH") + u32(1); }
std::string key(const std::string& k) { return u32(static_cast<uint32_t>(k.size())) + k; }
// A whole archive of one tensor entry "t": dtype, requires_grad, sizes, data.
std::string one_tensor(int dtype, int grad, const std::vector<int64_t>& sizes,
                       const std::string& data) {
  std::string s = header() + u32(1) + key("t") + u8(1) + u8(dtype) + u8(grad) +
                  u8(static_cast<int>(sizes.size()));
  for (int64_t d : sizes) s += i64(d);
  return s + data;
}

TEST(ArchiveCodec, RoundTripOfEveryKind) {
  torch::serialize::OutputArchive out;
  out.write("int", c10::IValue(int64_t{-7}));
  out.write("double", c10::IValue(2.5));
  out.write("bool", c10::IValue(true));
  out.write("string", c10::IValue(std::string("a\0b", 3)));
  out.write("none", c10::IValue());
  out.write("ints", c10::IValue(std::vector<int64_t>{1, 2, 3}));
  out.write("strings", c10::IValue(std::vector<std::string>{"x", ""}));
  out.write("empty", c10::IValue(c10::List<double>()));
  out.write("tensors", c10::IValue(c10::List<at::Tensor>({torch::ones({2}), torch::zeros({0})})));
  out.write("tuple", c10::IValue(std::make_tuple(0.9, 0.999)));
  out.write("nested_tuple",
            c10::IValue(c10::ivalue::Tuple::create(
                {c10::IValue(int64_t{1}), c10::IValue(std::make_tuple(true)), c10::IValue()})));
  const torch::Tensor weight = torch::randn({3, 4}).t().set_requires_grad(true);  // not contiguous
  out.write("weight", weight);
  out.write("flags", torch::tensor({true, false}), /*is_buffer=*/true);
  out.write("half", c10::IValue(torch::randn({5}).to(torch::kBFloat16)));
  out.write("scalar", c10::IValue(torch::tensor(int64_t{42})));
  out.write("hollow", c10::IValue(torch::empty({0, 3})));
  torch::serialize::OutputArchive inner(out.compilation_unit());
  torch::serialize::OutputArchive innermost(out.compilation_unit());
  innermost.write("step", c10::IValue(int64_t{9}));
  inner.write("exp_avg", c10::IValue(torch::arange(6).to(torch::kDouble)));
  inner.write("deeper", innermost);
  out.write("state", inner);

  const std::string bytes = encode_archive(out);
  EXPECT_EQ(encode_archive(out), bytes);  // deterministic
  torch::serialize::InputArchive in;
  decode_archive(bytes, in);
  c10::IValue v;
  in.read("int", v);
  EXPECT_EQ(v.toInt(), -7);
  in.read("double", v);
  EXPECT_EQ(v.toDouble(), 2.5);
  in.read("bool", v);
  EXPECT_TRUE(v.toBool());
  in.read("string", v);
  EXPECT_EQ(v.toStringRef(), std::string("a\0b", 3));
  in.read("none", v);
  EXPECT_TRUE(v.isNone());
  in.read("ints", v);
  EXPECT_EQ(v.toIntVector(), (std::vector<int64_t>{1, 2, 3}));
  in.read("strings", v);
  ASSERT_EQ(v.toListRef().size(), 2u);
  EXPECT_EQ(v.toListRef()[0].toStringRef(), "x");
  in.read("empty", v);
  EXPECT_TRUE(v.isDoubleList());
  EXPECT_EQ(v.toListRef().size(), 0u);
  in.read("tensors", v);
  ASSERT_TRUE(v.isTensorList());
  EXPECT_TRUE(torch::equal(v.toTensorVector()[0], torch::ones({2})));
  EXPECT_EQ(v.toTensorVector()[1].sizes(), torch::IntArrayRef({0}));
  in.read("tuple", v);
  ASSERT_TRUE(v.isTuple());
  EXPECT_EQ(v.toTupleRef().elements()[1].toDouble(), 0.999);
  in.read("nested_tuple", v);
  EXPECT_TRUE(v.toTupleRef().elements()[1].toTupleRef().elements()[0].toBool());
  EXPECT_TRUE(v.toTupleRef().elements()[2].isNone());
  torch::Tensor t, flags;
  in.read("weight", t);
  EXPECT_TRUE(torch::equal(t, weight));
  EXPECT_TRUE(t.requires_grad());
  in.read("flags", flags, /*is_buffer=*/true);
  EXPECT_TRUE(torch::equal(flags, torch::tensor({true, false})));
  in.read("half", v);
  EXPECT_EQ(v.toTensor().scalar_type(), torch::kBFloat16);
  in.read("scalar", v);
  EXPECT_EQ(v.toTensor().dim(), 0);
  EXPECT_EQ(v.toTensor().item<int64_t>(), 42);
  in.read("hollow", v);
  EXPECT_EQ(v.toTensor().sizes(), torch::IntArrayRef({0, 3}));
  torch::serialize::InputArchive state, deeper;
  in.read("state", state);
  state.read("exp_avg", v);
  EXPECT_TRUE(torch::equal(v.toTensor(), torch::arange(6).to(torch::kDouble)));
  state.read("deeper", deeper);
  deeper.read("step", v);
  EXPECT_EQ(v.toInt(), 9);
  EXPECT_EQ(error_of(bytes), "");
}

TEST(ArchiveCodec, WhatItCannotStoreIsAnErrorNamingTheKey) {
  torch::serialize::OutputArchive out;
  torch::serialize::OutputArchive inner(out.compilation_unit());
  c10::Dict<std::string, int64_t> dict;
  dict.insert("a", 1);
  inner.write("lookup", c10::IValue(dict));
  out.write("options", inner);
  try {
    encode_archive(out);
    FAIL() << "a dict was encoded";
  } catch (const ContractError& e) {
    EXPECT_NE(std::string(e.what()).find("key 'options/lookup'"), std::string::npos) << e.what();
  }
}

TEST(ArchiveCodec, ATensorDeclaringMoreBytesThanThePayloadHoldsIsRefused) {
  // 2^40 floats; the payload holds 8 bytes.
  const std::string message = error_of(one_tensor(8, 0, {int64_t{1} << 40}, std::string(8, 'x')));
  EXPECT_NE(message.find("more elements than the"), std::string::npos) << message;
  // Sizes whose product overflows 64 bits.
  EXPECT_NE(error_of(one_tensor(8, 0, {int64_t{1} << 40, int64_t{1} << 40}, "")).find("size"),
            std::string::npos);
  // A zero size does not lift the bound on the others (the strides).
  EXPECT_NE(error_of(one_tensor(8, 0, {0, int64_t{1} << 62, int64_t{1} << 62}, ""))
                .find("more elements than the"),
            std::string::npos);
  // Exactly enough bytes is fine.
  EXPECT_EQ(error_of(one_tensor(8, 0, {2}, std::string(8, '\0'))), "");
}

TEST(ArchiveCodec, AbsurdRankNegativeSizeUnknownDtypeAndBadFlagsAreRefused) {
  EXPECT_NE(error_of(one_tensor(8, 0, std::vector<int64_t>(65, 1), "xxxx")).find("rank 65"),
            std::string::npos);
  EXPECT_NE(error_of(one_tensor(8, 0, {-1}, "")).find("size -1"), std::string::npos);
  EXPECT_NE(error_of(one_tensor(99, 0, {1}, "x")).find("unknown dtype 99"), std::string::npos);
  EXPECT_NE(error_of(one_tensor(5, 1, {1}, std::string(8, '\0'))).find("requires_grad"),
            std::string::npos);  // an int64 tensor cannot require grad
  EXPECT_NE(error_of(one_tensor(10, 0, {2}, "\x01\x02")).find("bool tensor 't' holds byte 2"),
            std::string::npos);
}

TEST(ArchiveCodec, NestingDeeperThanTheBoundIsRefused) {
  // 40 archives each holding the next.
  std::string bytes = header();
  for (int i = 0; i < 40; ++i) bytes += u32(1) + key("n") + u8(3);
  bytes += u32(0);
  EXPECT_NE(error_of(bytes).find("nests deeper"), std::string::npos) << error_of(bytes);
  // So are tuples in tuples.
  bytes = header() + u32(1) + key("v") + u8(2) + u8(7);
  for (int i = 0; i < 40; ++i) bytes += u32(1) + u8(7);
  bytes += u32(0);
  EXPECT_NE(error_of(bytes).find("nests deeper"), std::string::npos) << error_of(bytes);
}

TEST(ArchiveCodec, TruncatedBytesAreRefusedAtEveryLength) {
  torch::serialize::OutputArchive out;
  out.write("a", c10::IValue(std::vector<int64_t>{1, 2}));
  out.write("t", torch::ones({2, 2}));
  torch::serialize::OutputArchive inner(out.compilation_unit());
  inner.write("s", c10::IValue(std::string("hello")));
  out.write("inner", inner);
  const std::string bytes = encode_archive(out);
  for (size_t n = 0; n < bytes.size(); ++n) {
    EXPECT_NE(error_of(bytes.substr(0, n)), "") << "a prefix of " << n << " bytes decoded";
  }
  EXPECT_NE(error_of(bytes + "x").find("1 bytes after the archive"), std::string::npos);
}

TEST(ArchiveCodec, CountsBeyondTheBytesKeysAndTheHeaderAreChecked) {
  EXPECT_NE(error_of(header() + u32(0xffffffffu)).find("more than the 0 remaining bytes"),
            std::string::npos);
  const std::string list = header() + u32(1) + key("l") + u8(2) + u8(6) + u8(2) + u32(1u << 30);
  EXPECT_NE(error_of(list).find("declares 1073741824 items"), std::string::npos) << error_of(list);
  const std::string twice = header() + u32(2) + key("a") + u8(2) + u8(0) + key("a") + u8(2) + u8(0);
  EXPECT_NE(error_of(twice).find("key 'a' twice"), std::string::npos);
  EXPECT_NE(
      error_of(header() + u32(1) + key("training") + u8(2) + u8(1) + u8(1)).find("not a valid"),
      std::string::npos);
  for (const char* bad : {"a.b", "in", "__x", "a b", "a\"b", "a\nb"}) {
    EXPECT_NE(error_of(header() + u32(1) + key(bad) + u8(2) + u8(0)).find("not a valid"),
              std::string::npos)
        << bad;
  }
  EXPECT_NE(error_of(header() + u32(1) + u32(1u << 20) + std::string(10, 'x')).find("at most 4096"),
            std::string::npos);
  EXPECT_NE(error_of("KOLOARCX" + u32(1) + u32(0)).find("not a kolo archive"), std::string::npos);
  EXPECT_NE(error_of("KOLOARCH" + u32(2) + u32(0)).find("encoding version 2"), std::string::npos);
  EXPECT_EQ(error_of(header() + u32(0)), "");
}

TEST(ArchiveCodec, ALibtorchZipIsRefusedAsWrittenByAnOlderKolo) {
  torch::serialize::OutputArchive out;
  out.write("format", c10::IValue(int64_t{2}));
  std::string zip;
  out.save_to([&zip](const void* data, size_t n) {
    zip.append(static_cast<const char*>(data), n);
    return n;
  });
  EXPECT_NE(error_of(zip).find("written by an older kolo"), std::string::npos) << error_of(zip);
}

}  // namespace
}  // namespace kolo::detail
