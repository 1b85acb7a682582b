// memplan._core bindings of the join kernels (join_fill.cpp): each function checks its arrays, runs
// the kernel (binding.hpp: the GIL released, stopped by its time limit or Ctrl-C) and shapes the
// results; bind_join is called by module.cpp's NB_MODULE.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <string>
#include <vector>

#include "binding.hpp"
#include "join_fill.hpp"

namespace nb = nanobind;
using namespace nb::literals;
using namespace memplan::binding;

namespace {

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

}  // namespace

void bind_join(nb::module_& m) {
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
        auto* tables = new join::JoinTables();
        nb::capsule owner(tables, [](void* p) noexcept {
          delete static_cast<join::JoinTables*>(p);
        });
        const bool done = released(time_limit, [&](memplan::Stop& stop) {
          return join::join_fill(branches, g_turn, turn_need, t_turn, width, *tables, stop);
        });
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
        join::JoinLeast out;
        const bool done = released(time_limit, [&](memplan::Stop& stop) {
          return join::join_least(branches, least, g_turn, turn_need, out, stop);
        });
        return std::make_tuple(done, to_numpy(std::move(out.need)), to_numpy(std::move(out.kind)),
                               to_numpy(std::move(out.branch)), to_numpy(std::move(out.target)));
      },
      "x"_a, "s"_a, "g"_a, "fo"_a, "bo"_a, "fneed"_a, "lmt"_a, "g_turn"_a, "turn_need"_a,
      "time_limit"_a = -1.0,
      "The least memory of a canonical join plan from every state id: (done, need, kind, "
      "branch, target).");
}
