// memplan._core: the compiled kernels of memplan, bound with nanobind.
//
// One function (or class) per kernel; each takes numpy arrays (the Python layer checks and shapes
// them: memplan/alloc/search.py, memplan/algorithms/chain/rotor.py), releases the GIL while it
// works and stops within a second on Ctrl-C or at its time limit (NOTE [ stopping a kernel ] in
// stop.hpp). The typed stub is memplan/_core.pyi.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <cstring>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "alloc.hpp"
#include "alloc_repair.hpp"
#include "alloc_skyline.hpp"
#include "rotor.hpp"
#include "rotor_dense.hpp"
#include "rotor_exact.hpp"
#include "join_fill.hpp"
#include "pofo_fractional.hpp"
#include "rotor_grid.hpp"
#include "stop.hpp"

namespace nb = nanobind;
using namespace nb::literals;

#ifndef MEMPLAN_CORE_VERSION
#define MEMPLAN_CORE_VERSION "unknown"
#endif
#ifndef MEMPLAN_BUILD_TYPE
#define MEMPLAN_BUILD_TYPE "unknown"
#endif
#ifndef MEMPLAN_COMPILER
#define MEMPLAN_COMPILER "unknown"
#endif

namespace {

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

void expect(bool ok, const char* what) {
  if (!ok) throw std::invalid_argument(what);
}

// The chain of rotor's kernels: sizes x (L+1), s, fo, bo (L), g (L+1), times ft, bt (L).
memplan::rotor::ChainRules chain_of(const I64& x, const I64& s, const I64& g, const I64& fo,
                                    const I64& bo, const F64& ft, const F64& bt) {
  const std::size_t L = s.shape(0);
  expect(L >= 1, "rotor: a chain has at least one stage");
  expect(x.shape(0) == L + 1 && g.shape(0) == L + 1 && fo.shape(0) == L && bo.shape(0) == L &&
             ft.shape(0) == L && bt.shape(0) == L,
         "rotor: x and g need L + 1 entries, s, fo, bo, ft and bt L");
  memplan::rotor::ChainRules c;
  c.L = int(L);
  c.x = x.data();
  c.s = s.data();
  c.g = g.data();
  c.fo = fo.data();
  c.bo = bo.data();
  c.ft = ft.data();
  c.bt = bt.data();
  return c;
}

// The branches of a join, checked (``what`` names the kernel): one array of each per branch, 1 to
// 8 branches; x and g L + 1 entries, s, fo and bo L, fneed (L + 1)^2.
std::vector<memplan::join::JoinBranch> join_branches(
    const std::vector<I64>& x, const std::vector<I64>& s, const std::vector<I64>& g,
    const std::vector<I64>& fo, const std::vector<I64>& bo, const std::vector<I64Flat>& fneed,
    const std::string& what) {
  const std::size_t k = x.size();
  expect(k >= 1 && k <= 8 && s.size() == k && g.size() == k && fo.size() == k &&
             bo.size() == k && fneed.size() == k,
         (what + ": one array of each per branch, 1 to 8 branches").c_str());
  std::vector<memplan::join::JoinBranch> branches(k);
  for (std::size_t j = 0; j < k; ++j) {
    const std::size_t L = s[j].shape(0);
    expect(L >= 1 && L < 32767, (what + ": a branch has 1 to 32766 stages").c_str());
    expect(x[j].shape(0) == L + 1 && g[j].shape(0) == L + 1 && fo[j].shape(0) == L &&
               bo[j].shape(0) == L && fneed[j].size() == (L + 1) * (L + 1),
           (what + ": x, g need L + 1 entries, s, fo, bo L, fneed (L + 1)^2").c_str());
    memplan::join::JoinBranch& b = branches[j];
    b.L = int64_t(L);
    b.x = x[j].data();
    b.s = s[j].data();
    b.g = g[j].data();
    b.fo = fo[j].data();
    b.bo = bo[j].data();
    b.fneed = fneed[j].data();
  }
  return branches;
}

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

using Terms = std::optional<I64>;

// The chain with the training loop's terms (rotor.hpp; all three or none): fa and fr L entries,
// wh L + 1.
memplan::rotor::ChainRules with_terms(memplan::rotor::ChainRules c, const Terms& fa,
                                      const Terms& wh, const Terms& fr) {
  const std::size_t L = std::size_t(c.L);
  expect(fa.has_value() == wh.has_value() && wh.has_value() == fr.has_value(),
         "rotor: fa, wh and fr go together");
  if (!fa) return c;
  expect(fa->shape(0) == L && wh->shape(0) == L + 1 && fr->shape(0) == L,
         "rotor: fa and fr need L entries, wh L + 1");
  c.fa = fa->data();
  c.wh = wh->data();
  c.fr = fr->data();
  return c;
}

nb::object ops_or_none(const memplan::rotor::GridResult& grid, int status) {
  if (status != memplan::rotor::OK) return nb::none();
  std::vector<int64_t> ops(grid.ops);
  return nb::cast(to_numpy(std::move(ops)));
}

}  // namespace

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

  // ---- rotor ----------------------------------------------------------------------------------
  namespace rotor = memplan::rotor;
  m.attr("ROTOR_OK") = rotor::OK;
  m.attr("ROTOR_INFEASIBLE") = rotor::INFEASIBLE;
  m.attr("ROTOR_SKIPPED") = rotor::SKIPPED;
  m.attr("ROTOR_NO_OPTION") = rotor::NO_OPTION;
  m.attr("ROTOR_UNBOUNDED") = rotor::UNBOUNDED;
  m.attr("CHOICE_F_ALL") = rotor::CHOICE_F_ALL;
  m.attr("CHOICE_NONE") = rotor::CHOICE_NONE;

  nb::class_<rotor::GridResult>(m, "RotorGrid",
                                "A rotor table on a slot grid (rotor_grid.cpp): its status, its "
                                "budget in slots, its plan, its top values, more backtracks.")
      .def_ro("status", &rotor::GridResult::status)
      .def_ro("capacity", &rotor::GridResult::capacity)
      .def_ro("extra", &rotor::GridResult::extra)
      .def_ro("cells", &rotor::GridResult::cells)
      .def_prop_ro("bounds",
                   [](const rotor::GridResult& g) {
                     return std::make_tuple(g.bounds[0], g.bounds[1], g.bounds[2]);
                   })
      .def_prop_ro("ops",
                   [](const rotor::GridResult& g) {
                     return ops_or_none(g, g.status == rotor::OK && !g.ops.empty()
                                               ? rotor::OK
                                               : rotor::INFEASIBLE);
                   })
      .def("top_values", &rotor::GridResult::top_values)
      .def(
          "trace",
          [](rotor::GridResult& g, int64_t budget) {
            int status = g.trace(budget);
            if (status == rotor::NO_OPTION)
              throw std::runtime_error("rotor grid: no option reaches a value of the table");
            return ops_or_none(g, status);
          },
          "budget"_a)
      .def("value", &rotor::GridResult::value, "a"_a, "b"_a, "m"_a)
      .def("asked", &rotor::GridResult::asked, "a"_a, "b"_a);

  m.def(
      "rotor_grid",
      [](const I64& x, const I64& s, const I64& g, const I64& fo, const I64& bo, const F64& ft,
         const F64& bt, int64_t budget, int64_t slots, int64_t extra, bool single, bool trace,
         bool reach, int64_t memory, const Terms& fa, const Terms& wh, const Terms& fr) {
        rotor::ChainRules chain = with_terms(chain_of(x, s, g, fo, bo, ft, bt), fa, wh, fr);
        expect(slots >= 1 && extra >= 0, "rotor_grid: slots >= 1 and extra >= 0");
        rotor::GridRequest request;
        request.budget = budget;
        request.slots = slots;
        request.extra = extra;
        request.single = single;
        request.trace = trace;
        request.reach = reach;
        request.memory = memory;
        memplan::Stop stop(-1.0, true);
        std::unique_ptr<rotor::GridResult> result;
        {
          nb::gil_scoped_release release;
          result = rotor::solve_grid(chain, request, stop);
        }
        stop.raise_if_interrupted();
        if (result->status == rotor::NO_OPTION)
          throw std::runtime_error("rotor grid: no option reaches a value of the table");
        return result;
      },
      "x"_a, "s"_a, "g"_a, "fo"_a, "bo"_a, "ft"_a, "bt"_a, "budget"_a, "slots"_a, "extra"_a = 0,
      "single"_a = false, "trace"_a = true, "reach"_a = true, "memory"_a = -1,
      "fa"_a = nb::none(), "wh"_a = nb::none(), "fr"_a = nb::none(),
      "The rotor DP on a grid of ``slots`` slots of the activation ``budget`` (bytes).");

  m.def(
      "rotor_dense",
      [](const I64& x, const I64& s, const I64& g, const I64& fo, const I64& bo, const F64& ft,
         const F64& bt, int64_t capacity) {
        rotor::ChainRules chain = chain_of(x, s, g, fo, bo, ft, bt);
        expect(capacity >= 0, "rotor_dense: capacity >= 0");
        const std::size_t L = std::size_t(chain.L), W = std::size_t(capacity) + 1;
        const std::size_t cells = L * L * W;
        auto* opt = new double[cells];
        auto* choice = new int32_t[cells];
        nb::capsule opt_owner(opt, [](void* p) noexcept { delete[] static_cast<double*>(p); });
        nb::capsule choice_owner(choice,
                                 [](void* p) noexcept { delete[] static_cast<int32_t*>(p); });
        memplan::Stop stop(-1.0, true);
        {
          nb::gil_scoped_release release;
          rotor::dense_table(chain, capacity, opt, choice, stop);
        }
        stop.raise_if_interrupted();
        using Out3d = nb::ndarray<nb::numpy, double, nb::ndim<3>>;
        using Out3i = nb::ndarray<nb::numpy, int32_t, nb::ndim<3>>;
        return std::make_pair(Out3d(opt, {L, L, W}, opt_owner),
                              Out3i(choice, {L, L, W}, choice_owner));
      },
      "x"_a, "s"_a, "g"_a, "fo"_a, "bo"_a, "ft"_a, "bt"_a, "capacity"_a,
      "The dense rotor table: opt[a, b, m] and choice[a, b, m] for m = 0..capacity slots.");

  m.def(
      "rotor_exact",
      [](const I64& x, const I64& s, const I64& g, const I64& fo, const I64& bo, const F64& ft,
         const F64& bt, int64_t budget, double work_limit, const Terms& fa, const Terms& wh,
         const Terms& fr) {
        rotor::ChainRules chain = with_terms(chain_of(x, s, g, fo, bo, ft, bt), fa, wh, fr);
        memplan::Stop stop(-1.0, true);
        std::vector<int64_t> ops;
        std::vector<int32_t> options;
        double makespan = 0.0;
        int64_t least = -1;
        int status;
        {
          nb::gil_scoped_release release;
          status = rotor::exact_plan(chain, budget, work_limit, stop, ops, options, makespan, least);
        }
        stop.raise_if_interrupted();
        return std::make_tuple(status, to_numpy(std::move(ops)), makespan);
      },
      "x"_a, "s"_a, "g"_a, "fo"_a, "bo"_a, "ft"_a, "bt"_a, "budget"_a, "work_limit"_a,
      "fa"_a = nb::none(), "wh"_a = nb::none(), "fr"_a = nb::none(),
      "The rotor DP in bytes: (status, operations, makespan); status 1 past the work limit.");

  m.def(
      "rotor_exact_options",
      [](const I64& x, const I64& s, const I64& g, const I64& fo, const I64& bo, const F64& ft,
         const F64& bt, const I64& ostart, const I64& os, const I64& ofo, const I64& obo,
         const F64& obt, int64_t budget, double work_limit, const Terms& fa, const Terms& wh,
         const Terms& fr) {
        rotor::ChainRules chain = with_terms(chain_of(x, s, g, fo, bo, ft, bt), fa, wh, fr);
        const std::size_t L = s.shape(0), n = os.shape(0);
        expect(ostart.shape(0) == L + 1 && ofo.shape(0) == n && obo.shape(0) == n &&
                   obt.shape(0) == n,
               "rotor: option_start needs L + 1 entries, the option arrays one per option");
        for (std::size_t k = 0; k < L; ++k)
          expect(ostart.data()[0] == 0 && ostart.data()[k] <= ostart.data()[k + 1] &&
                     ostart.data()[L] == int64_t(n),
                 "rotor: option_start must rise from 0 to the number of options");
        chain.ostart = ostart.data();
        chain.os = os.data();
        chain.ofo = ofo.data();
        chain.obo = obo.data();
        chain.obt = obt.data();
        memplan::Stop stop(-1.0, true);
        std::vector<int64_t> ops;
        std::vector<int32_t> options;
        double makespan = 0.0;
        int64_t least = -1;
        int status;
        {
          nb::gil_scoped_release release;
          status = rotor::exact_plan(chain, budget, work_limit, stop, ops, options, makespan, least);
        }
        stop.raise_if_interrupted();
        return std::make_tuple(status, to_numpy(std::move(ops)), to_numpy(std::move(options)),
                               makespan, least);
      },
      "x"_a, "s"_a, "g"_a, "fo"_a, "bo"_a, "ft"_a, "bt"_a, "option_start"_a, "option_s"_a,
      "option_fo"_a, "option_bo"_a, "option_bt"_a, "budget"_a, "work_limit"_a,
      "fa"_a = nb::none(), "wh"_a = nb::none(), "fr"_a = nb::none(),
      "The rotor DP in bytes with options of F_all (selective checkpointing): (status, "
      "operations, the option of each operation, makespan, least budget within the budget or -1).");

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
        memplan::Stop stop(time_limit, true);
        auto* out = new pofo::FractionalBackward();
        bool done;
        {
          nb::gil_scoped_release release;
          done = pofo::fractional_backward(c, *out, stop);
        }
        nb::capsule owner(out, [](void* p) noexcept {
          delete static_cast<pofo::FractionalBackward*>(p);
        });
        stop.raise_if_interrupted();
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
        memplan::Stop stop(time_limit, true);
        pofo::FractionalForward out;
        {
          nb::gil_scoped_release release;
          out = pofo::fractional_forward(c, bound, beam, tolerance, stop);
        }
        stop.raise_if_interrupted();
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

  // ---- join -----------------------------------------------------------------------------------
  m.def(
      "join_fill",
      [](const std::vector<I64>& x, const std::vector<I64>& s, const std::vector<I64>& g,
         const std::vector<I64>& fo, const std::vector<I64>& bo, const std::vector<F64>& ft,
         const std::vector<F64>& bt, const std::vector<Flat>& opt,
         const std::vector<I64Flat>& fneed, int64_t g_turn, int64_t turn_need, double t_turn,
         int64_t width, double time_limit) {
        namespace join = memplan::join;
        std::vector<join::JoinBranch> branches =
            join_branches(x, s, g, fo, bo, fneed, "join_fill");
        const std::size_t k = branches.size(), W = std::size_t(width);
        expect(width >= 1 && ft.size() == k && bt.size() == k && opt.size() == k,
               "join_fill: width >= 1, one ft, bt and opt per branch");
        for (std::size_t j = 0; j < k; ++j) {
          const std::size_t L = std::size_t(branches[j].L);
          expect(ft[j].shape(0) == L && bt[j].shape(0) == L && opt[j].size() == L * L * W,
                 "join_fill: ft, bt need L entries, opt L L W");
          branches[j].ft = ft[j].data();
          branches[j].bt = bt[j].data();
          branches[j].opt = opt[j].data();
        }
        memplan::Stop stop(time_limit, true);
        auto* tables = new join::JoinTables();
        bool done;
        {
          nb::gil_scoped_release release;
          done = join::join_fill(branches, g_turn, turn_need, t_turn, width, *tables, stop);
        }
        nb::capsule owner(tables, [](void* p) noexcept {
          delete static_cast<join::JoinTables*>(p);
        });
        stop.raise_if_interrupted();
        const std::size_t rows = tables->value.size() / std::size_t(width);
        using Out1i = nb::ndarray<nb::numpy, int64_t, nb::ndim<1>>;
        using Out2d = nb::ndarray<nb::numpy, double, nb::ndim<2>>;
        using Out2s = nb::ndarray<nb::numpy, int16_t, nb::ndim<2>>;
        return std::make_tuple(done, Out1i(tables->row.data(), {tables->row.size()}, owner),
                               Out2d(tables->value.data(), {rows, W}, owner),
                               Out2s(tables->branch.data(), {rows, W}, owner),
                               Out2s(tables->target.data(), {rows, W}, owner));
      },
      "x"_a, "s"_a, "g"_a, "fo"_a, "bo"_a, "ft"_a, "bt"_a, "opt"_a, "fneed"_a, "g_turn"_a,
      "turn_need"_a, "t_turn"_a, "width"_a, "time_limit"_a = -1.0,
      "The chain-model join DP: (done, row of each state id, value, branch, target), "
      "rows x width each.");

  m.def(
      "join_least",
      [](const std::vector<I64>& x, const std::vector<I64>& s, const std::vector<I64>& g,
         const std::vector<I64>& fo, const std::vector<I64>& bo,
         const std::vector<I64Flat>& fneed, const std::vector<I64Flat>& lmt, int64_t g_turn,
         int64_t turn_need, double time_limit) {
        namespace join = memplan::join;
        std::vector<join::JoinBranch> branches =
            join_branches(x, s, g, fo, bo, fneed, "join_least");
        const std::size_t k = branches.size();
        expect(lmt.size() == k, "join_least: one lmt per branch");
        std::vector<const int64_t*> least(k);
        for (std::size_t j = 0; j < k; ++j) {
          const std::size_t L = std::size_t(branches[j].L);
          expect(lmt[j].size() == L * L, "join_least: lmt needs L^2 entries");
          least[j] = lmt[j].data();
        }
        memplan::Stop stop(time_limit, true);
        join::JoinLeast out;
        bool done;
        {
          nb::gil_scoped_release release;
          done = join::join_least(branches, least, g_turn, turn_need, out, stop);
        }
        stop.raise_if_interrupted();
        return std::make_tuple(done, to_numpy(std::move(out.need)), to_numpy(std::move(out.kind)),
                               to_numpy(std::move(out.branch)), to_numpy(std::move(out.target)));
      },
      "x"_a, "s"_a, "g"_a, "fo"_a, "bo"_a, "fneed"_a, "lmt"_a, "g_turn"_a, "turn_need"_a,
      "time_limit"_a = -1.0,
      "The least memory of a canonical join plan from every state id: (done, need, kind, "
      "branch, target).");

  // ---- alloc ----------------------------------------------------------------------------------
  namespace alloc = memplan::alloc;
  m.attr("ALLOC_FOUND") = alloc::FOUND;
  m.attr("ALLOC_NOT_FOUND") = alloc::NOT_FOUND;
  m.attr("ALLOC_ABORTED") = alloc::ABORTED;
  m.attr("ALLOC_TIMEOUT") = alloc::TIMEOUT;

  nb::class_<alloc::Search>(m, "AllocSearch",
                            "One exact allocation search of an instance (alloc.cpp); its "
                            "failed-state memo lives across the parts and capacities.")
      .def(
          "__init__",
          [](alloc::Search* self, int64_t sections, const I64& first, const I64& end,
             const I64& size, const I64& sec_start, const I64& sec_buf, const I64& ov_start,
             const I64& ov_buf, const I64& tw_start, const I64& tw_buf, const I64& section_total,
             const I64& cuts, const F64& width, const I64& rank_twa, const I64& rank_taw,
             const I64& rank_wat, int64_t memo_slots) {
            const std::size_t n = size.shape(0);
            expect(first.shape(0) == n && end.shape(0) == n && ov_start.shape(0) == n + 1 &&
                       tw_start.shape(0) == n + 1 && width.shape(0) == n &&
                       rank_twa.shape(0) == n && rank_taw.shape(0) == n &&
                       rank_wat.shape(0) == n,
                   "AllocSearch: the per-buffer arrays do not match");
            expect(sections >= 0 && sec_start.shape(0) == std::size_t(sections) + 1 &&
                       section_total.shape(0) == std::size_t(sections),
                   "AllocSearch: the per-section arrays do not match");
            alloc::Instance inst;
            inst.n = int64_t(n);
            inst.sections = sections;
            inst.first = to_vector(first);
            inst.end = to_vector(end);
            inst.size = to_vector(size);
            inst.sec_start = to_vector(sec_start);
            inst.sec_buf = to_vector(sec_buf);
            inst.ov_start = to_vector(ov_start);
            inst.ov_buf = to_vector(ov_buf);
            inst.tw_start = to_vector(tw_start);
            inst.tw_buf = to_vector(tw_buf);
            inst.section_total = to_vector(section_total);
            inst.cuts = to_vector(cuts);
            inst.width = to_vector(width);
            inst.area.resize(n);
            inst.fsize.resize(n);
            for (std::size_t b = 0; b < n; ++b) {
              inst.fsize[b] = static_cast<double>(inst.size[b]);
              inst.area[b] = inst.width[b] * inst.fsize[b];
            }
            inst.ranks[0] = to_vector(rank_twa);
            inst.ranks[1] = to_vector(rank_taw);
            inst.ranks[2] = to_vector(rank_wat);
            new (self) alloc::Search(std::move(inst), memo_slots);
          },
          "sections"_a, "first"_a, "end"_a, "size"_a, "sec_start"_a, "sec_buf"_a, "ov_start"_a,
          "ov_buf"_a, "tw_start"_a, "tw_buf"_a, "section_total"_a, "cuts"_a, "width"_a,
          "rank_twa"_a, "rank_taw"_a, "rank_wat"_a, "memo_slots"_a = 0)
      .def(
          "solve_part",
          [](alloc::Search& search, const I64& part, int64_t lo, int64_t hi, int64_t capacity,
             int64_t node_budget, int64_t nodes, bool tight, double time_limit) {
            std::vector<int64_t> buffers = to_vector(part);
            const alloc::Instance& inst = search.instance();
            for (int64_t b : buffers) expect(0 <= b && b < inst.n, "solve_part: buffer index");
            expect(0 <= lo && lo <= hi && hi <= inst.sections, "solve_part: section range");
            memplan::Stop stop(time_limit, false);
            alloc::PartResult result;
            const std::size_t stack = (std::size_t(64) << 20) +
                                      4096 * std::size_t(inst.n + inst.sections);
            {
              nb::gil_scoped_release release;
              memplan::run_on_thread(
                  [&] {
                    result = search.solve_part(buffers, lo, hi, capacity, node_budget, nodes,
                                               tight, stop);
                  },
                  stack, stop);
            }
            stop.raise_if_interrupted();
            return std::make_tuple(result.status, result.nodes,
                                   to_numpy(std::move(result.solution)));
          },
          "part"_a, "lo"_a, "hi"_a, "capacity"_a, "node_budget"_a, "nodes"_a, "tight"_a,
          "time_limit"_a,
          "Search one static part: (status, nodes counted so far, offsets of the instance).")
      .def(
          "run_once",
          [](alloc::Search& search, const I64& part, int64_t lo, int64_t hi, int64_t capacity,
             int run, int64_t salt, int64_t node_limit, int64_t stack_entries) {
            std::vector<int64_t> buffers = to_vector(part);
            const alloc::Instance& inst = search.instance();
            for (int64_t b : buffers) expect(0 <= b && b < inst.n, "run_once: buffer index");
            expect(0 <= lo && lo <= hi && hi <= inst.sections, "run_once: section range");
            memplan::Stop stop(-1.0, false);
            alloc::PartResult result;
            {
              nb::gil_scoped_release release;
              memplan::run_on_thread(
                  [&] {
                    result = search.run_once(buffers, lo, hi, capacity, run, salt, node_limit,
                                             stack_entries, stop);
                  },
                  (std::size_t(64) << 20) + 4096 * std::size_t(inst.n + inst.sections), stop);
            }
            stop.raise_if_interrupted();
            return std::make_tuple(result.status, result.nodes,
                                   to_numpy(std::move(result.solution)));
          },
          "part"_a, "lo"_a, "hi"_a, "capacity"_a, "run"_a, "salt"_a, "node_limit"_a,
          "stack_entries"_a = 0,
          "One run of the round robin alone (for the tests): (status, nodes, offsets).");

  nb::class_<alloc::Skyline>(m, "AllocSkyline",
                             "The skyline search of an instance (alloc_skyline.cpp): the exact "
                             "search for large parts, O(log n) per node, O(n + sections) memory.")
      .def(
          "__init__",
          [](alloc::Skyline* self, int64_t sections, const I64& first, const I64& end,
             const I64& size, const I64& section_total, const I64& cuts, const I64& tw_start,
             const I64& tw_buf, const I64& rank_twa, const I64& rank_taw, const I64& rank_wat,
             int64_t memo_slots) {
            const std::size_t n = size.shape(0);
            expect(first.shape(0) == n && end.shape(0) == n && tw_start.shape(0) == n + 1 &&
                       rank_twa.shape(0) == n && rank_taw.shape(0) == n &&
                       rank_wat.shape(0) == n,
                   "AllocSkyline: the per-buffer arrays do not match");
            expect(sections >= 0 && section_total.shape(0) == std::size_t(sections) &&
                       cuts.shape(0) == std::size_t(std::max<int64_t>(sections - 1, 0)),
                   "AllocSkyline: the per-section arrays do not match");
            alloc::SkylineInstance inst;
            inst.n = int64_t(n);
            inst.sections = sections;
            inst.first = to_vector(first);
            inst.end = to_vector(end);
            inst.size = to_vector(size);
            inst.section_total = to_vector(section_total);
            inst.cuts = to_vector(cuts);
            inst.tw_start = to_vector(tw_start);
            inst.tw_buf = to_vector(tw_buf);
            for (std::size_t b = 0; b < n; ++b)
              expect(0 <= inst.first[b] && inst.first[b] < inst.end[b] &&
                         inst.end[b] <= sections && inst.size[b] > 0,
                     "AllocSkyline: a buffer's sections or size");
            expect(inst.tw_start[0] == 0 && inst.tw_start[n] == int64_t(tw_buf.shape(0)),
                   "AllocSkyline: tw_start");
            for (std::size_t b = 0; b < n; ++b)
              expect(inst.tw_start[b] <= inst.tw_start[b + 1], "AllocSkyline: tw_start");
            for (int64_t u : inst.tw_buf)
              expect(0 <= u && u < int64_t(n), "AllocSkyline: tw_buf index");
            const I64* ranks[3] = {&rank_twa, &rank_taw, &rank_wat};
            for (int k = 0; k < 3; ++k) {
              inst.ranks[k] = to_vector(*ranks[k]);
              std::vector<char> seen(n, 0);
              for (int64_t r : inst.ranks[k]) {
                expect(0 <= r && r < int64_t(n) && !seen[std::size_t(r)],
                       "AllocSkyline: a rank array is not a permutation of 0..n-1");
                seen[std::size_t(r)] = 1;
              }
            }
            new (self) alloc::Skyline(std::move(inst), memo_slots);
          },
          "sections"_a, "first"_a, "end"_a, "size"_a, "section_total"_a, "cuts"_a, "tw_start"_a,
          "tw_buf"_a, "rank_twa"_a, "rank_taw"_a, "rank_wat"_a, "memo_slots"_a = 0)
      .def("parts", &alloc::Skyline::parts,
           "The static parts: section ranges (lo, hi) that no buffer crosses.")
      .def(
          "part_buffers",
          [](const alloc::Skyline& sky, int64_t lo, int64_t hi) {
            expect(0 <= lo && lo <= hi && hi <= sky.instance().sections,
                   "part_buffers: section range");
            return to_numpy(sky.part_buffers(lo, hi));
          },
          "lo"_a, "hi"_a, "The buffers that start in sections [lo, hi), in the order of offsets.")
      .def(
          "solve_part",
          [](alloc::Skyline& sky, int64_t lo, int64_t hi, int64_t capacity, int64_t node_budget,
             int64_t nodes, bool tight, double time_limit) {
            const alloc::SkylineInstance& inst = sky.instance();
            expect(0 <= lo && lo <= hi && hi <= inst.sections, "solve_part: section range");
            memplan::Stop stop(time_limit, false);
            alloc::PartResult result;
            {
              nb::gil_scoped_release release;
              memplan::run_on_thread(
                  [&] {
                    result = sky.solve_part(lo, hi, capacity, node_budget, nodes, tight, stop);
                  },
                  alloc::skyline_stack_bytes(inst.n, inst.sections), stop);
            }
            stop.raise_if_interrupted();
            return std::make_tuple(result.status, result.nodes,
                                   to_numpy(std::move(result.solution)));
          },
          "lo"_a, "hi"_a, "capacity"_a, "node_budget"_a, "nodes"_a, "tight"_a, "time_limit"_a,
          "Search part [lo, hi): (status, nodes counted so far, offsets of part_buffers).")
      .def(
          "run_once",
          [](alloc::Skyline& sky, int64_t lo, int64_t hi, int64_t capacity, int preorder,
             bool twins, int64_t salt, int64_t node_limit, double time_limit) {
            const alloc::SkylineInstance& inst = sky.instance();
            expect(0 <= lo && lo <= hi && hi <= inst.sections, "run_once: section range");
            memplan::Stop stop(time_limit, false);
            alloc::PartResult result;
            {
              nb::gil_scoped_release release;
              memplan::run_on_thread(
                  [&] {
                    result = sky.run_once(lo, hi, capacity, preorder, twins, salt, node_limit,
                                          stop);
                  },
                  alloc::skyline_stack_bytes(inst.n, inst.sections), stop);
            }
            stop.raise_if_interrupted();
            return std::make_tuple(result.status, result.nodes,
                                   to_numpy(std::move(result.solution)));
          },
          "lo"_a, "hi"_a, "capacity"_a, "preorder"_a, "twins"_a, "salt"_a, "node_limit"_a,
          "time_limit"_a = -1.0,
          "One run (preorder 0 TWA, 1 TAW, 2 WAT): (status, nodes, offsets of part_buffers).");

  nb::class_<alloc::Repair>(m, "AllocRepair",
                            "Ruin and recreate (alloc_repair.cpp): local improvement of a "
                            "placement of buffers of positive size.")
      .def(
          "__init__",
          [](alloc::Repair* self, const I64& lower, const I64& upper, const I64& size,
             const I64& offsets, int64_t step, uint64_t seed) {
            const std::size_t n = size.shape(0);
            expect(lower.shape(0) == n && upper.shape(0) == n && offsets.shape(0) == n,
                   "AllocRepair: lengths differ");
            new (self) alloc::Repair(to_vector(lower), to_vector(upper), to_vector(size),
                                     to_vector(offsets), step, seed);
          },
          "lower"_a, "upper"_a, "size"_a, "offsets"_a, "step"_a, "seed"_a)
      .def(
          "run",
          [](alloc::Repair& repair, int64_t goal, int64_t max_moves, double time_limit) {
            memplan::Stop stop(time_limit, true);
            int64_t arena;
            {
              nb::gil_scoped_release release;
              arena = repair.run(goal, max_moves, stop);
            }
            stop.raise_if_interrupted();
            return arena;
          },
          "goal"_a, "max_moves"_a, "time_limit"_a,
          "Improve until the arena is at most ``goal``, ``max_moves`` moves (< 0: no limit) or "
          "``time_limit`` seconds (< 0: none): the best arena.")
      .def(
          "offer",
          [](alloc::Repair& repair, const I64& offsets) { repair.offer(to_vector(offsets)); },
          "offsets"_a, "Start again from ``offsets`` when their arena is below the best.")
      .def(
          "best",
          [](const alloc::Repair& repair) {
            return to_numpy(std::vector<int64_t>(repair.best()));
          },
          "The best placement found (offsets).")
      .def_prop_ro("best_arena", &alloc::Repair::best_arena)
      .def_prop_ro("moves", &alloc::Repair::moves);

  m.def(
      "alloc_first_fit",
      [](const I64& lower, const I64& upper, const I64& size, const I64& order,
         std::optional<I64> ov_start, std::optional<I64> ov_buf, int64_t limit,
         double time_limit) {
        const std::size_t n = size.shape(0);
        expect(lower.shape(0) == n && upper.shape(0) == n, "alloc_first_fit: lengths differ");
        for (std::size_t k = 0; k < order.shape(0); ++k)
          expect(0 <= order.data()[k] && std::size_t(order.data()[k]) < n,
                 "alloc_first_fit: order index");
        const int64_t* starts = nullptr;
        const int64_t* buf = nullptr;
        if (ov_start && ov_buf) {
          expect(ov_start->shape(0) == n + 1, "alloc_first_fit: ov_start needs n + 1 entries");
          starts = ov_start->data();
          buf = ov_buf->data();
        }
        std::vector<int64_t> offsets(n, -1);
        memplan::Stop stop(time_limit, true);
        int64_t done;
        {
          nb::gil_scoped_release release;
          done = alloc::first_fit(lower.data(), upper.data(), size.data(), int64_t(n),
                                  order.data(), int64_t(order.shape(0)), starts, buf,
                                  offsets.data(), limit, stop);
        }
        stop.raise_if_interrupted();
        return std::make_pair(done, to_numpy(std::move(offsets)));
      },
      "lower"_a, "upper"_a, "size"_a, "order"_a, "ov_start"_a.none(), "ov_buf"_a.none(),
      "limit"_a, "time_limit"_a,
      "First fit in ``order``: (placed count, or -1 - count past ``limit``; offsets, -1 unplaced).");
}
