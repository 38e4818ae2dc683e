// Shared by the consumers of tests/package (main.cc, core_main.cc).
#pragma once

#include <cstdio>
#include <cstring>

#include "kolo/kolo.h"

// True when the headers this program was compiled against and the library it
// runs with are the same kolo; otherwise says so on stderr, naming `rank`.
inline bool same_kolo(int rank) {
  if (std::strcmp(kolo::version(), KOLO_VERSION_STRING) == 0) return true;
  std::fprintf(stderr, "rank %d: headers of kolo %s, library of kolo %s\n", rank,
               KOLO_VERSION_STRING, kolo::version());
  return false;
}
