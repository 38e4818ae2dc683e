// One process maps one libtorch, one NCCL and one Gloo (DESIGN.md, PyTorch
// versions): where Debian's libtorch 1.13 and a torch wheel are both
// installed, a build that mixed them (Debian's libc10 beside the wheel's
// libtorch_cpu, the CUDA toolkit's libnccl beside the wheel's) loads two
// copies and crashes at exit or earlier. This reads the process's own maps.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>

#include "kolo/core/device.h"
#include "kolo/torch/compat.h"
#include "mapped_libraries.h"

namespace {

using kolo::testing::mapped_libraries;

std::string directory_of(const std::string& path) { return path.substr(0, path.rfind('/')); }

TEST(OneStack, EveryTorchNcclAndGlooLibraryIsMappedOnce) {
  // Use libtorch, so that what it loads lazily is loaded too, and kolo's
  // CUDA loader (it dlopens libcudart and, with a GPU, libnccl: it must get
  // libtorch's copies, not the CUDA toolkit's).
  const torch::Tensor sum = torch::ones({4}).sum();
  ASSERT_EQ(sum.item<float>(), 4.0F);
  (void)kolo::nccl_version();
  const auto libraries = mapped_libraries();
  ASSERT_TRUE(libraries.count("libc10")) << "libc10 is not mapped: is /proc mounted?";
  for (const char* name : {"libc10", "libc10_cuda", "libtorch", "libtorch_cpu", "libtorch_cuda",
                           "libtorch_python", "libnccl", "libgloo", "libcudart"}) {
    auto it = libraries.find(name);
    if (it == libraries.end()) continue;
    std::ostringstream paths;
    for (const std::string& p : it->second) paths << " " << p;
    EXPECT_EQ(it->second.size(), 1U)
        << name << " is mapped from more than one file:" << paths.str();
  }
  // libc10 and libtorch_cpu come from one libtorch (one folder).
  ASSERT_TRUE(libraries.count("libtorch_cpu"));
  EXPECT_EQ(directory_of(*libraries.at("libc10").begin()),
            directory_of(*libraries.at("libtorch_cpu").begin()))
      << "libc10 and libtorch_cpu come from two libtorch installations";
}

TEST(OneStack, TheHeadersAreTheLibrarysVersion) {
  // The compiled-in version (torch/version.h) against the loaded library's.
  const std::string headers =
      std::to_string(kolo::compat::kTorchMajor) + "." + std::to_string(kolo::compat::kTorchMinor);
  EXPECT_EQ(std::string(KOLO_TORCH_VERSION).rfind(headers, 0), 0U)
      << "compiled against libtorch headers " << headers << ", CMake found " << KOLO_TORCH_VERSION;
}

}  // namespace
