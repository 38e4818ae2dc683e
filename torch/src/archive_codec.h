// kolo's own encoding of a torch archive, for every archive kolo stores on
// disk (checkpoint payloads, ZeRO index and shards, the optimizer state and
// hook state inside them). Internal.
//
// Why: libtorch's archive reader (zip + pickle) is unsafe on hostile bytes:
// it allocates what a record declares (up to 4 GiB) and crashes on crafted
// archives. With this codec bytes read from a file never reach it: they are
// decoded by kolo, every size checked against the bytes that remain before
// anything is allocated; the result is written into a fresh OutputArchive by
// kolo, serialised by libtorch and read back by libtorch, so libtorch only
// ever reads bytes it has just written itself from well-formed objects.
// (archive_to_bytes / archive_from_bytes in common.h stay libtorch's own
// format, for bytes that never leave the job's processes.)
//
// Encoding (version 1), little-endian throughout:
//   "KOLOARCH" u32 version, then one node, then nothing.
//   node:   u32 count, count entries (keys unique, in the archive's order).
//   entry:  u32 key length, key bytes (1..kMaxKeyBytes of [A-Za-z0-9_/-],
//           not a Python keyword, not "training", not starting with "__":
//           libtorch declares keys in TorchScript source), u8 kind: 1
//           tensor, 2 value, 3 node (a nested archive).
//   tensor: u8 dtype (uint8 int8 int16 int32 int64 float16 bfloat16 float32
//           float64 bool complex64 complex128 = 1..12), u8 requires_grad
//           (0/1, 1 only for floating dtypes), u8 rank (<= kMaxRank),
//           rank x i64 sizes (>= 0), then numel x itemsize bytes of a
//           contiguous CPU tensor (bool bytes 0/1).
//   value:  u8 tag: 0 None, 1 bool (u8 0/1), 2 int (i64), 3 double (f64),
//           4 string (u32 length, bytes), 5 tensor, 6 list (u8 element tag
//           1..5, u32 count, count values of that tag without their tag),
//           7 tuple (u32 count, count values).
// Nodes and values nest at most kMaxDepth deep. What the encoder meets that
// has no encoding (a dict, an object, a sparse tensor, ...) is a
// ContractError naming the key at save time.
#pragma once

#include <cstdint>
#include <string>

namespace torch::serialize {
class InputArchive;
class OutputArchive;
}  // namespace torch::serialize

namespace kolo::detail {

constexpr uint32_t kArchiveCodecVersion = 1;
constexpr int kArchiveMaxDepth = 32;
constexpr uint32_t kArchiveMaxKeyBytes = 4096;
constexpr int kArchiveMaxRank = 64;

// The archive's contents in kolo's encoding. ContractError "kolo archive:
// key 'a/b': ..." for what cannot be encoded.
std::string encode_archive(torch::serialize::OutputArchive& archive);

// Decodes `bytes` (encode_archive's) into `archive`. ContractError "kolo
// archive: ..." naming what is wrong and the byte offset when the bytes are
// truncated, malformed or exceed a bound; a payload in libtorch's own format
// (a zip, what kolo wrote before its files' format 3) is refused with a
// message saying an older kolo wrote it. Callers prefix the file's name.
void decode_archive(const std::string& bytes, torch::serialize::InputArchive& archive);

// That `bytes` decode (the checks of decode_archive, without building the
// archive): for archives nested in a file as bytes, checked while the file
// is decoded so that the error names the file.
void check_archive(const std::string& bytes);

}  // namespace kolo::detail
