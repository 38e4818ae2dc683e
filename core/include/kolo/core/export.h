// Symbol visibility of kolo's shared libraries (cmake/kolo_targets.cmake).
//
// The libraries are compiled with hidden visibility; each public header
// exports what it declares with `#pragma GCC visibility push(default)`.
// KOLO_HIDDEN marks the exceptions: a type a public header must name but only
// kolo's own code defines and uses (a pimpl, state shared with hooks). Its
// members and typeinfo then stay out of the exported symbols, like everything
// else of core/src and torch/src.
#pragma once

#define KOLO_HIDDEN __attribute__((visibility("hidden")))
