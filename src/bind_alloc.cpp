// memplan._core bindings of the allocation kernels (alloc.cpp, alloc_skyline.cpp,
// alloc_repair.cpp): each function checks its arrays, runs the kernel (binding.hpp: the GIL
// released, stopped by its time limit or Ctrl-C) and shapes the results; bind_alloc is called by
// module.cpp's NB_MODULE.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "binding.hpp"
#include "alloc.hpp"
#include "alloc_repair.hpp"
#include "alloc_skyline.hpp"

namespace nb = nanobind;
using namespace nb::literals;
using namespace memplan::binding;

namespace {

namespace alloc = memplan::alloc;

// What both searches read (alloc.hpp's BufferTables), checked; ``what`` names the class. The
// per-buffer arrays n entries (tw_start n + 1), the per-section ones ``sections`` (cuts one
// fewer), every buffer's sections within them and its size positive, the twins a CSR of buffer
// indices, each rank array a permutation of 0..n-1.
void read_tables(alloc::BufferTables& t, const std::string& what, int64_t sections,
                 const I64& first, const I64& end, const I64& size, const I64& section_total,
                 const I64& cuts, const I64& tw_start, const I64& tw_buf, const I64& rank_twa,
                 const I64& rank_taw, const I64& rank_wat) {
  const std::size_t n = size.shape(0);
  expect(first.shape(0) == n && end.shape(0) == n && tw_start.shape(0) == n + 1 &&
             rank_twa.shape(0) == n && rank_taw.shape(0) == n && rank_wat.shape(0) == n,
         (what + ": the per-buffer arrays do not match").c_str());
  expect(sections >= 0 && section_total.shape(0) == std::size_t(sections) &&
             cuts.shape(0) == std::size_t(std::max<int64_t>(sections - 1, 0)),
         (what + ": the per-section arrays do not match").c_str());
  t.n = int64_t(n);
  t.sections = sections;
  t.first = to_vector(first);
  t.end = to_vector(end);
  t.size = to_vector(size);
  t.section_total = to_vector(section_total);
  t.cuts = to_vector(cuts);
  t.tw_start = to_vector(tw_start);
  t.tw_buf = to_vector(tw_buf);
  for (std::size_t b = 0; b < n; ++b)
    expect(0 <= t.first[b] && t.first[b] < t.end[b] && t.end[b] <= sections && t.size[b] > 0,
           (what + ": a buffer's sections or size").c_str());
  expect(t.tw_start[0] == 0 && t.tw_start[n] == int64_t(tw_buf.shape(0)),
         (what + ": tw_start").c_str());
  for (std::size_t b = 0; b < n; ++b)
    expect(t.tw_start[b] <= t.tw_start[b + 1], (what + ": tw_start").c_str());
  for (int64_t u : t.tw_buf)
    expect(0 <= u && u < int64_t(n), (what + ": tw_buf index").c_str());
  const I64* ranks[3] = {&rank_twa, &rank_taw, &rank_wat};
  for (int k = 0; k < 3; ++k) {
    t.ranks[k] = to_vector(*ranks[k]);
    std::vector<char> seen(n, 0);
    for (int64_t r : t.ranks[k]) {
      expect(0 <= r && r < int64_t(n) && !seen[std::size_t(r)],
             (what + ": a rank array is not a permutation of 0..n-1").c_str());
      seen[std::size_t(r)] = 1;
    }
  }
}

// A section range [lo, hi) of the instance.
void expect_range(const alloc::BufferTables& t, int64_t lo, int64_t hi) {
  expect(0 <= lo && lo <= hi && hi <= t.sections, "alloc: section range");
}

// The buffers of a part, checked, and its section range.
std::vector<int64_t> part_of(const alloc::BufferTables& t, const I64& part, int64_t lo,
                             int64_t hi) {
  std::vector<int64_t> buffers = to_vector(part);
  for (int64_t b : buffers) expect(0 <= b && b < t.n, "alloc: buffer index");
  expect_range(t, lo, hi);
  return buffers;
}

// The stacks of the searches' threads: they recurse once per placement and split.
std::size_t search_stack_bytes(const alloc::Instance& inst) {
  return (std::size_t(64) << 20) + 4096 * std::size_t(inst.n + inst.sections);
}
std::size_t skyline_stack_bytes(const alloc::SkylineInstance& inst) {
  return alloc::skyline_stack_bytes(inst.n, inst.sections);
}

// (status, nodes counted so far, offsets) of a search.
auto part_result(alloc::PartResult& result) {
  return std::make_tuple(result.status, result.nodes, to_numpy(std::move(result.solution)));
}

}  // namespace

void bind_alloc(nb::module_& m) {
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
            alloc::Instance inst;
            read_tables(inst, "AllocSearch", sections, first, end, size, section_total, cuts,
                        tw_start, tw_buf, rank_twa, rank_taw, rank_wat);
            const std::size_t n = size.shape(0);
            expect(ov_start.shape(0) == n + 1 && width.shape(0) == n &&
                       sec_start.shape(0) == std::size_t(sections) + 1,
                   "AllocSearch: ov_start, width or sec_start do not match");
            inst.sec_start = to_vector(sec_start);
            inst.sec_buf = to_vector(sec_buf);
            inst.ov_start = to_vector(ov_start);
            inst.ov_buf = to_vector(ov_buf);
            inst.width = to_vector(width);
            inst.area.resize(n);
            inst.fsize.resize(n);
            for (std::size_t b = 0; b < n; ++b) {
              inst.fsize[b] = static_cast<double>(inst.size[b]);
              inst.area[b] = inst.width[b] * inst.fsize[b];
            }
            new (self) alloc::Search(std::move(inst), memo_slots);
          },
          "sections"_a, "first"_a, "end"_a, "size"_a, "sec_start"_a, "sec_buf"_a, "ov_start"_a,
          "ov_buf"_a, "tw_start"_a, "tw_buf"_a, "section_total"_a, "cuts"_a, "width"_a,
          "rank_twa"_a, "rank_taw"_a, "rank_wat"_a, "memo_slots"_a = 0)
      .def(
          "solve_part",
          [](alloc::Search& search, const I64& part, int64_t lo, int64_t hi, int64_t capacity,
             int64_t node_budget, int64_t nodes, bool tight, double time_limit) {
            const std::vector<int64_t> buffers = part_of(search.instance(), part, lo, hi);
            alloc::PartResult result = on_own_thread(
                time_limit, search_stack_bytes(search.instance()), [&](memplan::Stop& stop) {
                  return search.solve_part(buffers, lo, hi, capacity, node_budget, nodes, tight,
                                           stop);
                });
            return part_result(result);
          },
          "part"_a, "lo"_a, "hi"_a, "capacity"_a, "node_budget"_a, "nodes"_a, "tight"_a,
          "time_limit"_a,
          "Search one static part: (status, nodes counted so far, offsets of the instance).")
      .def(
          "run_once",
          [](alloc::Search& search, const I64& part, int64_t lo, int64_t hi, int64_t capacity,
             int run, int64_t salt, int64_t node_limit, int64_t stack_entries) {
            const std::vector<int64_t> buffers = part_of(search.instance(), part, lo, hi);
            alloc::PartResult result = on_own_thread(
                -1.0, search_stack_bytes(search.instance()), [&](memplan::Stop& stop) {
                  return search.run_once(buffers, lo, hi, capacity, run, salt, node_limit,
                                         stack_entries, stop);
                });
            return part_result(result);
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
            alloc::SkylineInstance inst;
            read_tables(inst, "AllocSkyline", sections, first, end, size, section_total, cuts,
                        tw_start, tw_buf, rank_twa, rank_taw, rank_wat);
            new (self) alloc::Skyline(std::move(inst), memo_slots);
          },
          "sections"_a, "first"_a, "end"_a, "size"_a, "section_total"_a, "cuts"_a, "tw_start"_a,
          "tw_buf"_a, "rank_twa"_a, "rank_taw"_a, "rank_wat"_a, "memo_slots"_a = 0)
      .def("parts", &alloc::Skyline::parts,
           "The static parts: section ranges (lo, hi) that no buffer crosses.")
      .def(
          "part_buffers",
          [](const alloc::Skyline& sky, int64_t lo, int64_t hi) {
            expect_range(sky.instance(), lo, hi);
            return to_numpy(sky.part_buffers(lo, hi));
          },
          "lo"_a, "hi"_a, "The buffers that start in sections [lo, hi), in the order of offsets.")
      .def(
          "solve_part",
          [](alloc::Skyline& sky, int64_t lo, int64_t hi, int64_t capacity, int64_t node_budget,
             int64_t nodes, bool tight, double time_limit) {
            expect_range(sky.instance(), lo, hi);
            alloc::PartResult result = on_own_thread(
                time_limit, skyline_stack_bytes(sky.instance()), [&](memplan::Stop& stop) {
                  return sky.solve_part(lo, hi, capacity, node_budget, nodes, tight, stop);
                });
            return part_result(result);
          },
          "lo"_a, "hi"_a, "capacity"_a, "node_budget"_a, "nodes"_a, "tight"_a, "time_limit"_a,
          "Search part [lo, hi): (status, nodes counted so far, offsets of part_buffers).")
      .def(
          "run_once",
          [](alloc::Skyline& sky, int64_t lo, int64_t hi, int64_t capacity, int preorder,
             bool twins, int64_t salt, int64_t node_limit, double time_limit) {
            expect_range(sky.instance(), lo, hi);
            alloc::PartResult result = on_own_thread(
                time_limit, skyline_stack_bytes(sky.instance()), [&](memplan::Stop& stop) {
                  return sky.run_once(lo, hi, capacity, preorder, twins, salt, node_limit, stop);
                });
            return part_result(result);
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
            return released(time_limit, [&](memplan::Stop& stop) {
              return repair.run(goal, max_moves, stop);
            });
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
         std::optional<I64> ov_start, std::optional<I64> ov_buf, int64_t limit, double time_limit,
         std::optional<I64> fixed, bool best_fit) {
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
        if (fixed) {
          expect(fixed->shape(0) == n, "alloc_first_fit: fixed needs n entries");
          offsets = to_vector(*fixed);
        }
        const alloc::Fit fit = best_fit ? alloc::Fit::best : alloc::Fit::first;
        const int64_t done = released(time_limit, [&](memplan::Stop& stop) {
          return alloc::first_fit(lower.data(), upper.data(), size.data(), int64_t(n),
                                  order.data(), int64_t(order.shape(0)), starts, buf,
                                  offsets.data(), limit, stop, fit);
        });
        return std::make_pair(done, to_numpy(std::move(offsets)));
      },
      "lower"_a, "upper"_a, "size"_a, "order"_a, "ov_start"_a.none(), "ov_buf"_a.none(),
      "limit"_a, "time_limit"_a, "fixed"_a = nb::none(), "best_fit"_a = false,
      "First fit in ``order`` (best fit: the smallest gap), around the ``fixed`` offsets (-1: "
      "free): (placed count, or -1 - count past ``limit``; offsets, -1 unplaced).");
}
