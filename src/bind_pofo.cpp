// memplan._core bindings of the pofo kernels (pofo_fractional.cpp): each function checks its
// arrays, runs the kernel (binding.hpp: the GIL released, stopped by its time limit or Ctrl-C) and
// shapes the results; bind_pofo is called by module.cpp's NB_MODULE.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <limits>
#include <optional>
#include <string>

#include "binding.hpp"
#include "pofo_fractional.hpp"

namespace nb = nanobind;
using namespace nb::literals;
using namespace memplan::binding;

namespace {

// pofo's chain in slots (the pofo kernels; ``what`` names the kernel), checked: x, g and fp
// L + 1 entries, s, fo, own_b, ft and bt L.
memplan::pofo::FractionalChain pofo_chain(const I64& x, const I64& s, const I64& g, const I64& fo,
                                          const I64& own_b, const F64& ft, const F64& bt,
                                          const F64& fp, int64_t capacity, int64_t depth,
                                          int64_t window, double beta, const std::string& what) {
  const std::size_t L = s.shape(0);
  expect(L >= 1 && capacity >= 0 && depth >= 1 && window >= 1,
         (what + ": L >= 1, capacity >= 0, depth >= 1, window >= 1").c_str());
  expect(x.shape(0) == L + 1 && g.shape(0) == L + 1 && fo.shape(0) == L &&
             own_b.shape(0) == L && ft.shape(0) == L && bt.shape(0) == L && fp.shape(0) == L + 1,
         (what + ": x, g and fp need L + 1 entries, s, fo, own_b, ft and bt L").c_str());
  memplan::pofo::FractionalChain c;
  c.L = int64_t(L);
  c.C = capacity;
  c.W = capacity + 1;
  c.D = depth;
  c.window = window;
  c.beta = beta;
  c.x = x.data();
  c.s = s.data();
  c.g = g.data();
  c.fo = fo.data();
  c.own_b = own_b.data();
  c.ft = ft.data();
  c.bt = bt.data();
  c.fp = fp.data();
  return c;
}

}  // namespace

void bind_pofo(nb::module_& m) {
  // ---- pofo -----------------------------------------------------------------------------------
  m.def(
      "pofo_backward",
      [](const I64& x, const I64& s, const I64& g, const I64& fo, const I64& own_b, const F64& ft,
         const F64& bt, const F64& fp, int64_t capacity, int64_t depth, int64_t window,
         double beta, double time_limit, std::optional<I64> fa) {
        namespace pofo = memplan::pofo;
        pofo::FractionalChain c = pofo_chain(x, s, g, fo, own_b, ft, bt, fp, capacity, depth,
                                             window, beta, "pofo_backward");
        expect(!fa || fa->shape(0) == std::size_t(c.L), "pofo_backward: fa needs L entries");
        c.fa = fa ? fa->data() : nullptr;
        auto* out = new pofo::FractionalBackward();
        nb::capsule owner(out, [](void* p) noexcept {
          delete static_cast<pofo::FractionalBackward*>(p);
        });
        const bool done = released(time_limit, [&](memplan::Stop& stop) {
          return pofo::fractional_backward(c, *out, stop);
        });
        using OutD = nb::ndarray<nb::numpy, double, nb::ndim<1>>;
        using OutS = nb::ndarray<nb::numpy, int16_t, nb::ndim<1>>;
        return std::make_tuple(done, OutD(out->near.data(), {out->near.size()}, owner),
                               OutS(out->near_choice.data(), {out->near_choice.size()}, owner),
                               OutD(out->last.data(), {out->last.size()}, owner),
                               OutS(out->last_choice.data(), {out->last_choice.size()}, owner));
      },
      "x"_a, "s"_a, "g"_a, "fo"_a, "own_b"_a, "ft"_a, "bt"_a, "fp"_a, "capacity"_a, "depth"_a,
      "window"_a, "beta"_a, "time_limit"_a = -1.0, "fa"_a = nb::none(),
      "The backward tables of pofo's Theorem 1 DP: (done, near, its choices, last, its choices), "
      "flat; ``fa``: F_all's own overhead (default ``fo``).");

  m.def(
      "pofo_forward",
      [](const I64& x, const I64& s, const I64& g, const I64& fo, const I64& own_b, const F64& ft,
         const F64& bt, const F64& fp, const Flat& near, const Flat& last,
         std::optional<Flat> relaxed, int64_t capacity, int64_t depth, int64_t window,
         double beta, double bound, int64_t beam, double tolerance, double time_limit,
         std::optional<I64> pinned, std::optional<I64> fa) {
        namespace pofo = memplan::pofo;
        pofo::FractionalChain c = pofo_chain(x, s, g, fo, own_b, ft, bt, fp, capacity, depth,
                                             window, beta, "pofo_forward");
        const std::size_t L = std::size_t(c.L), W = std::size_t(c.W), D = std::size_t(depth);
        expect(near.size() == (L - 1) * std::size_t(window) * W * D && last.size() == L * W * D,
               "pofo_forward: near needs (L-1) window W D values, last L W D");
        expect(!pinned || pinned->shape(0) == L, "pofo_forward: pinned needs L entries");
        expect(!fa || fa->shape(0) == L, "pofo_forward: fa needs L entries");
        c.pinned = pinned ? pinned->data() : nullptr;
        c.fa = fa ? fa->data() : nullptr;
        expect(!relaxed || relaxed->size() == (L + 1) * W,
               "pofo_forward: relaxed needs (L + 1) W values");
        expect(bound == std::numeric_limits<double>::infinity() || relaxed,
               "pofo_forward: a bound needs the relaxed times");
        c.near = near.data();
        c.last = last.data();
        c.relaxed = relaxed ? relaxed->data() : nullptr;
        pofo::FractionalForward out = released(time_limit, [&](memplan::Stop& stop) {
          return pofo::fractional_forward(c, bound, beam, tolerance, stop);
        });
        nb::list states, choices;  // None where a segment has no state
        for (std::size_t i = 0; i < out.states.size(); ++i) {
          if (out.stopped || out.states[i].empty()) {
            states.append(nb::none());
            choices.append(nb::none());
            continue;
          }
          states.append(to_numpy(std::move(out.states[i])));
          choices.append(to_numpy(std::move(out.choices[i])));
        }
        return std::make_tuple(out.stopped, out.value, out.evaluated, states, choices);
      },
      "x"_a, "s"_a, "g"_a, "fo"_a, "own_b"_a, "ft"_a, "bt"_a, "fp"_a, "near"_a, "last"_a,
      "relaxed"_a.none(), "capacity"_a, "depth"_a, "window"_a, "beta"_a, "bound"_a, "beam"_a,
      "tolerance"_a, "time_limit"_a = -1.0, "pinned"_a = nb::none(), "fa"_a = nb::none(),
      "The forward phase of pofo's Theorem 1 DP: (stopped, value, states evaluated, the states "
      "of each segment and input kind (index 2 a + kind; None: none), their decisions); "
      "``pinned[a]`` nonzero: segment a's input is never offloaded; ``fa``: F_all's own "
      "overhead (default ``fo``).");
}
