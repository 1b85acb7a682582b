// memplan._core bindings of the rotor kernels (rotor_grid.cpp, rotor_dense.cpp, rotor_exact.cpp):
// each function checks its arrays, runs the kernel (binding.hpp: the GIL released, stopped by its
// time limit or Ctrl-C) and shapes the results; bind_rotor is called by module.cpp's NB_MODULE.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <memory>
#include <optional>
#include <stdexcept>
#include <vector>

#include "binding.hpp"
#include "rotor.hpp"
#include "rotor_dense.hpp"
#include "rotor_exact.hpp"
#include "rotor_grid.hpp"

namespace nb = nanobind;
using namespace nb::literals;
using namespace memplan::binding;

namespace {

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

void bind_rotor(nb::module_& m) {
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
        std::unique_ptr<rotor::GridResult> result = released(
            -1.0, [&](memplan::Stop& stop) { return rotor::solve_grid(chain, request, stop); });
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
        released(-1.0, [&](memplan::Stop& stop) {
          rotor::dense_table(chain, capacity, opt, choice, stop);
        });
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
        std::vector<int64_t> ops;
        std::vector<int32_t> options;
        double makespan = 0.0;
        int64_t least = -1;
        const int status = released(-1.0, [&](memplan::Stop& stop) {
          return rotor::exact_plan(chain, budget, work_limit, stop, ops, options, makespan, least);
        });
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
        std::vector<int64_t> ops;
        std::vector<int32_t> options;
        double makespan = 0.0;
        int64_t least = -1;
        const int status = released(-1.0, [&](memplan::Stop& stop) {
          return rotor::exact_plan(chain, budget, work_limit, stop, ops, options, makespan, least);
        });
        return std::make_tuple(status, to_numpy(std::move(ops)), to_numpy(std::move(options)),
                               makespan, least);
      },
      "x"_a, "s"_a, "g"_a, "fo"_a, "bo"_a, "ft"_a, "bt"_a, "option_start"_a, "option_s"_a,
      "option_fo"_a, "option_bo"_a, "option_bt"_a, "budget"_a, "work_limit"_a,
      "fa"_a = nb::none(), "wh"_a = nb::none(), "fr"_a = nb::none(),
      "The rotor DP in bytes with options of F_all (selective checkpointing): (status, "
      "operations, the option of each operation, makespan, least budget within the budget or -1).");
}
