// The skyline search: the exact allocation search for large parts (alloc_skyline.cpp).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "alloc.hpp"
#include "stop.hpp"

namespace memplan::alloc {

// The static data of an instance for the skyline search: per buffer its sections [first, end)
// and size, per section its total, per section boundary the buffers crossing it, the stacked
// twins and the ranks of the preorders TWA, TAW, WAT. No list of overlapping pairs or section
// incidences: its memory is O(n + sections) whatever the density of the instance.
using SkylineInstance = BufferTables;

class Skyline {
 public:
  // ``memo_slots``: entries of the failed-state table (a power of two >= 4), 0 for the default.
  Skyline(SkylineInstance instance, int64_t memo_slots);
  ~Skyline();
  Skyline(const Skyline&) = delete;
  Skyline& operator=(const Skyline&) = delete;

  // The static parts: section ranges [lo, hi) that no buffer crosses, each holding a buffer.
  std::vector<std::pair<int64_t, int64_t>> parts() const;
  // The buffers of sections [lo, hi) (those that start there), in the order of the offsets
  // that solve_part and run_once return.
  std::vector<int64_t> part_buffers(int64_t lo, int64_t hi) const;
  // The round robin of NOTE [ skyline search ] over part [lo, hi) at ``capacity``, first at the
  // part's own peak when ``tight``; ``node_budget`` < 0: none; ``nodes``: counted so far.
  // The solution holds the offsets of part_buffers(lo, hi) when FOUND.
  PartResult solve_part(int64_t lo, int64_t hi, int64_t capacity, int64_t node_budget,
                        int64_t nodes, bool tight, Stop& stop);
  // One run: preorder ``preorder`` (0 TWA, 1 TAW, 2 WAT) alone, under ``node_limit``.
  PartResult run_once(int64_t lo, int64_t hi, int64_t capacity, int preorder, bool twins,
                      int64_t salt, int64_t node_limit, Stop& stop);
  const SkylineInstance& instance() const { return inst_; }

 private:
  struct State;
  int rotate(int64_t lo, int64_t hi, int64_t capacity, int64_t salt, int64_t budget,
             int64_t& nodes, std::vector<int64_t>& solution, Stop& stop);
  int one_run(int64_t lo, int64_t hi, int64_t capacity, int preorder, bool twins, int64_t run_id,
              int64_t limit, int64_t& counted, std::vector<int64_t>& solution, Stop& stop);
  SkylineInstance inst_;
  std::vector<int64_t> order_, pos_, sec_pos_;  // buffers by first section; where each sits
  std::unique_ptr<State> state_;
  FailedStates memo_;
};

// The stack a search of ``n`` buffers over ``sections`` sections may need (it recurses once per
// placement and split).
std::size_t skyline_stack_bytes(int64_t n, int64_t sections);

}  // namespace memplan::alloc
