// memplan._core: the compiled kernels of memplan, bound with nanobind.
//
// One function (or class) per kernel, bound in one file per family: bind_rotor.cpp,
// bind_pofo.cpp, bind_join.cpp, bind_alloc.cpp (what they share: binding.hpp). Each takes numpy
// arrays (the Python layer checks and shapes them: memplan/alloc/search.py,
// memplan/algorithms/chain/rotor.py), releases the GIL while it works and stops within a second
// on Ctrl-C or at its time limit (NOTE [ stopping a kernel ] in stop.hpp). The typed stub is
// memplan/_core.pyi.
#include <nanobind/nanobind.h>

#include <string>

#include "binding.hpp"

namespace nb = nanobind;

#ifndef MEMPLAN_CORE_VERSION
#define MEMPLAN_CORE_VERSION "unknown"
#endif
#ifndef MEMPLAN_BUILD_TYPE
#define MEMPLAN_BUILD_TYPE "unknown"
#endif
#ifndef MEMPLAN_COMPILER
#define MEMPLAN_COMPILER "unknown"
#endif

NB_MODULE(_core, m) {
  m.doc() = "memplan's compiled kernels: rotor's dynamic programs and the allocation search.";

  m.def(
      "build_info",
      []() {
        nb::dict info;
        info["version"] = MEMPLAN_CORE_VERSION;
        info["compiler"] = MEMPLAN_COMPILER;
        info["build_type"] = MEMPLAN_BUILD_TYPE;
        info["nanobind"] = std::to_string(NB_VERSION_MAJOR) + "." +
                           std::to_string(NB_VERSION_MINOR) + "." +
                           std::to_string(NB_VERSION_PATCH);
        return info;
      },
      "The core's build: memplan version, compiler, build type, nanobind version.");

  bind_rotor(m);
  bind_pofo(m);
  bind_join(m);
  bind_alloc(m);
}
