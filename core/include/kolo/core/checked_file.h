// Files kolo writes and later reads back: one container for all of them, so
// that no state on disk is ever loaded silently when it is wrong.
//
// Users: plain checkpoints and ZeRO shards and index ("KOLOCKPT",
// kolo/torch/checkpoint.h), elastic commits ("KOLOCMIT", kolo/core/elastic.h),
// file-store values ("KOLOSTOR", make_file_store). Files meant for people or
// other tools (timelines, logs, autotune CSV, benchmark tables) are not kolo
// state and keep their own formats.
//
// Layout (all integers little-endian):
//   offset  0  8 bytes  magic: what kind of file this is
//   offset  8  u32      container version (1)
//   offset 12  u32      header size in bytes (32)
//   offset 16  u64      payload size in bytes
//   offset 24  u32      CRC-32 (IEEE, zlib's crc32) of the payload
//   offset 28  u32      CRC-32 of header bytes 0..27
//   offset 32  payload
// Version 1 is the layout kolo's checkpoints have always had (their CRC-32 was
// hand-written until it moved here; the values are zlib's), so every
// checkpoint written before stays readable. A payload carries its own format
// version where its structure can change (the checkpoint archive's "format").
//
// Writing: a temporary file in the same directory, write (+ fsync), rename
// over the target (+ fsync of the directory); a crash leaves either the old
// file or the new one, never a torn one. Reading checks, in order: a regular
// file that can be read, the header is complete, magic, version, header
// checksum, that the file holds exactly the payload size, the payload
// checksum. Any failure is a ContractError that names the file and what is
// wrong.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#pragma GCC visibility push(default)  // the exported API: cmake/kolo_targets.cmake
namespace kolo {

// CRC-32 (IEEE 802.3 polynomial, reflected: the value zlib's crc32 returns,
// computed by zlib). Continue a running checksum by passing the previous
// result as `crc`.
uint32_t crc32(const void* data, size_t size, uint32_t crc = 0);

// One kind of file: its magic and how messages call it.
struct FileKind {
  char magic[8];     // e.g. {'K','O','L','O','C','K','P','T'}
  const char* what;  // e.g. "kolo checkpoint": messages read "<what> '<path>': ..."
};

// The kinds kolo writes.
extern const FileKind kCheckpointFile;     // "KOLOCKPT": checkpoints, ZeRO shards and index
extern const FileKind kElasticCommitFile;  // "KOLOCMIT": elastic::State commits
extern const FileKind kStoreValueFile;     // "KOLOSTOR": file-store values

struct CheckedWriteOptions {
  // fsync the file and its directory before returning (a power loss after
  // the call keeps the new file). Off for transient files (file-store values).
  bool durable = true;
};

// The header + payload as bytes, and back. decode_checked() only parses
// (it is the fuzzers' entry point): ContractError "<kind.what> '<source>':
// ..." on anything that is not exactly a `kind` file holding a payload.
std::string encode_checked(const FileKind& kind, const std::string& payload);
std::string decode_checked(const FileKind& kind, const std::string& bytes,
                           const std::string& source);

// Writes encode_checked(kind, payload) to `path` atomically (see above).
// ContractError naming the file and the failing system call on an I/O error.
void write_checked_file(const std::string& path, const FileKind& kind, const std::string& payload,
                        const CheckedWriteOptions& options = {});
// Reads and verifies `path`; returns the payload. A FIFO, device or
// directory is refused before it is opened for reading (it could block).
std::string read_checked_file(const std::string& path, const FileKind& kind);

}  // namespace kolo
#pragma GCC visibility pop
