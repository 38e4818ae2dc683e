// Symbol visibility of kolo's shared libraries (cmake/kolo_targets.cmake).
//
// The libraries are compiled with hidden visibility; each public header
// exports what it declares with `#pragma GCC visibility push(default)`.
// KOLO_HIDDEN marks the exceptions: a type a public header must name but only
// kolo's own code defines and uses (a pimpl, state shared with hooks). Its
// members and typeinfo then stay out of the exported symbols, like everything
// else of core/src and torch/src.
//
// Only kolo's own objects (compiled with KOLO_BUILDING_LIBRARY) need it; for
// everyone else it is empty, so that code compiled with default visibility
// (a program, the unit tests of internal classes) does not see a hidden type
// inside its own.
#pragma once

#if defined(KOLO_BUILDING_LIBRARY)
#define KOLO_HIDDEN __attribute__((visibility("hidden")))
#else
#define KOLO_HIDDEN
#endif
