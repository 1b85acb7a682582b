// What the binding files share (module.cpp and one bind_*.cpp per family): the array types the
// kernels take, the copies into and out of numpy, the argument check, and the one way a kernel is
// run: with the GIL released, stopped by its time limit or Ctrl-C (NOTE [ stopping a kernel ] in
// stop.hpp). Each family's file defines one bind_FAMILY(m), called by module.cpp's NB_MODULE.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
// Every type caster the bindings use: a caster must be seen where the function is bound.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <type_traits>
#include <utility>
#include <vector>

#include "stop.hpp"

namespace memplan::binding {

namespace nb = nanobind;

template <typename T>
using Vec = nb::ndarray<const T, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using I64 = Vec<int64_t>;
using F64 = Vec<double>;
// Any shape, read as its values in C order.
using Flat = nb::ndarray<const double, nb::c_contig, nb::device::cpu>;
using I64Flat = nb::ndarray<const int64_t, nb::c_contig, nb::device::cpu>;

template <typename T>
using Out1 = nb::ndarray<nb::numpy, T, nb::ndim<1>>;

// A numpy array owning ``values``.
template <typename T>
Out1<T> to_numpy(std::vector<T>&& values) {
  auto* heap = new std::vector<T>(std::move(values));
  nb::capsule owner(heap, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  return Out1<T>(heap->data(), {heap->size()}, owner);
}

template <typename T>
std::vector<T> to_vector(const Vec<T>& a) {
  return std::vector<T>(a.data(), a.data() + a.shape(0));
}

inline void expect(bool ok, const char* what) {
  if (!ok) throw std::invalid_argument(what);
}

// Run ``kernel(stop)`` in the calling thread with the GIL released, under a Stop of
// ``time_limit`` seconds (< 0: none) that polls for Ctrl-C itself, then raise the pending
// KeyboardInterrupt, if any (NOTE [ stopping a kernel ]); returns what the kernel returns.
template <typename Kernel>
auto released(double time_limit, Kernel&& kernel) {
  Stop stop(time_limit, true);
  using Result = decltype(kernel(stop));
  if constexpr (std::is_void_v<Result>) {
    {
      nb::gil_scoped_release release;
      kernel(stop);
    }
    stop.raise_if_interrupted();
  } else {
    Result result = [&] {
      nb::gil_scoped_release release;
      return kernel(stop);
    }();
    stop.raise_if_interrupted();
    return result;
  }
}

// The same for a kernel that recurses deeply: it runs on a thread of its own with a stack of
// ``stack_bytes`` while the calling thread waits, the GIL released, and watches for Ctrl-C
// (run_on_thread). The result must be default-constructible.
template <typename Kernel>
auto on_own_thread(double time_limit, std::size_t stack_bytes, Kernel&& kernel) {
  Stop stop(time_limit, false);
  decltype(kernel(stop)) result{};
  {
    nb::gil_scoped_release release;
    run_on_thread([&] { result = kernel(stop); }, stack_bytes, stop);
  }
  stop.raise_if_interrupted();
  return result;
}

}  // namespace memplan::binding

// One per family, in bind_FAMILY.cpp.
void bind_rotor(nanobind::module_& m);
void bind_pofo(nanobind::module_& m);
void bind_join(nanobind::module_& m);
void bind_alloc(nanobind::module_& m);
