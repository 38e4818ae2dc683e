// kolo::version() (kolo/version.h).
#include "kolo/version.h"

namespace kolo {

const char* version() { return KOLO_VERSION_STRING; }

}  // namespace kolo
