// kolo-zero-consolidate: merges the shards of a ZeRO checkpoint directory
// (kolo::save_zero_checkpoint) into one full, unsharded checkpoint directory
// with a single shard, loadable by a ZeRO run of any world size or, with
// kolo::load_zero_model, by a plain model.
//
//   kolo-zero-consolidate <checkpoint-dir> <output-dir>
#include <cstdio>
#include <exception>
#include <string>

#include "kolo/torch/zero.h"

int main(int argc, char** argv) {
  if (argc != 3 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h") {
    std::fprintf(stderr,
                 "usage: kolo-zero-consolidate <checkpoint-dir> <output-dir>\n"
                 "Merges every shard of a ZeRO checkpoint into one (shard-0-of-1.kolo).\n");
    return argc == 2 ? 0 : 2;
  }
  try {
    kolo::consolidate_zero_checkpoint(argv[1], argv[2]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kolo-zero-consolidate: %s\n", e.what());
    return 1;
  }
  std::printf("kolo-zero-consolidate: wrote %s\n", argv[2]);
  return 0;
}
