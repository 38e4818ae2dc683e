// A fresh directory (under /tmp unless told) for one test, removed with everything in it
// when the object goes out of scope (tests that kill workers or fail an
// assertion still clean up).
#pragma once

#include <string>

namespace kolo::testing {

class TempDir {
 public:
  // Creates <parent>/<prefix>-XXXXXX. Throws std::runtime_error naming the
  // path and errno's message when mkdtemp fails.
  explicit TempDir(const std::string& prefix, const std::string& parent = "/tmp");
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  // path() + "/" + name
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// The one file in `dir` whose name starts with `prefix` and ends with
// `suffix` (a sharded checkpoint's "shard-1-of-2-<save id>.kolo"), as a
// path; "" when there is none or more than one.
std::string only_file_like(const std::string& dir, const std::string& prefix,
                           const std::string& suffix = ".kolo");

}  // namespace kolo::testing
