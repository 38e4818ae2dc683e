// The shared libraries this process maps, read from /proc/self/maps: one
// process must map one libtorch, one NCCL, one libcudart and one Gloo
// (tests/torch/one_stack_test.cc, tests/gpu/gpu_test.cc).
#pragma once

#include <map>
#include <set>
#include <string>

namespace kolo::testing {

// Library name (file name up to ".so": "libnccl") -> every file of that name mapped.
std::map<std::string, std::set<std::string>> mapped_libraries();

}  // namespace kolo::testing
