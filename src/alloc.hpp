// The exact allocation search and the greedy first fit (alloc.cpp).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "stop.hpp"

namespace memplan::alloc {

constexpr int FOUND = 1, NOT_FOUND = 0, ABORTED = -1, TIMEOUT = -2, OVERFLOW = -3;
constexpr int64_t INF = int64_t(1) << 62;

// What both exact searches read of an instance (memplan/alloc/instance.py builds it): buffers of
// positive size, their sections [first, end), per section its total, per section boundary the
// buffers crossing it, the stacked twins (CSR) and the ranks of the buffers under MiniMalloc's
// preorders TWA, TAW, WAT (NOTE [ compiled restarts ]).
struct BufferTables {
  int64_t n = 0, sections = 0;
  std::vector<int64_t> first, end, size, section_total, cuts, tw_start, tw_buf;
  std::vector<int64_t> ranks[3];
};

// The static data of the compiled search: the tables, plus the CSRs of the section incidences
// and of the overlaps, and the keys of the residual preorders.
struct Instance : BufferTables {
  std::vector<int64_t> sec_start, sec_buf, ov_start, ov_buf;
  std::vector<double> width, area, fsize;  // keys of the residual preorders (W, A, Z)
};

// The failed-state memo of both exact searches (NOTE [ compiled failed-state memo ] in
// alloc.cpp): two 64-bit hashes of each state in a table of buckets of four slots that forgets
// the oldest state of a full bucket.
class FailedStates {
 public:
  // ``slots``: a power of two >= 4, or 0 for the default (2^20 from 64 buffers on, else 2^12);
  // ``what`` names the search in the error.
  FailedStates(int64_t slots, int64_t buffers, const char* what);
  bool find(uint64_t h1, uint64_t h2) const {
    const int64_t base = bucket(h1);
    for (int k = 0; k < 4; ++k)
      if (h1_.get()[base + k] == h1 && h2_.get()[base + k] == h2) return true;
    return false;
  }
  void add(uint64_t h1, uint64_t h2) {
    uint64_t* one = h1_.get();
    uint64_t* two = h2_.get();
    const int64_t base = bucket(h1);
    for (int k = 0; k < 4; ++k) {
      if (one[base + k] == 0) {
        one[base + k] = h1;
        two[base + k] = h2;
        return;
      }
    }
    for (int k = 3; k > 0; --k) {  // full bucket: the oldest state is forgotten
      one[base + k] = one[base + k - 1];
      two[base + k] = two[base + k - 1];
    }
    one[base] = h1;
    two[base] = h2;
  }

 private:
  int64_t bucket(uint64_t h1) const { return static_cast<int64_t>(h1 & uint64_t(slots_ - 4)); }
  int64_t slots_;
  std::unique_ptr<uint64_t, void (*)(void*)> h1_, h2_;
};

struct PartResult {
  int status = NOT_FOUND;
  int64_t nodes = 0;             // nodes searched so far (the caller's count plus this part's)
  std::vector<int64_t> solution;  // offsets of the part's buffers (-1 elsewhere) when FOUND
};

// One search of an instance: its failed-state memo lives across the parts and capacities.
class Search {
 public:
  // ``memo_slots``: entries of the failed-state table (a power of two >= 4), 0 for the default.
  Search(Instance instance, int64_t memo_slots);
  // Search ``part`` (buffer indices) over sections [lo, hi) at ``capacity``: the round robin of
  // NOTE [ compiled restarts ], first at the part's own peak live load with ``tight``.
  // ``node_budget`` < 0: none; ``nodes``: the nodes counted so far against it.
  PartResult solve_part(const std::vector<int64_t>& part, int64_t lo, int64_t hi,
                        int64_t capacity, int64_t node_budget, int64_t nodes, bool tight,
                        Stop& stop);
  // One run (tests): ``run`` of the round robin alone at ``capacity`` under ``node_limit``.
  PartResult run_once(const std::vector<int64_t>& part, int64_t lo, int64_t hi, int64_t capacity,
                      int run, int64_t salt, int64_t node_limit, int64_t stack_entries,
                      Stop& stop);
  const Instance& instance() const { return inst_; }

 private:
  int rotate(const std::vector<int64_t>& buffers, int64_t lo, int64_t hi, int64_t capacity,
             int64_t salt, int64_t budget, int64_t& nodes, std::vector<int64_t>& solution,
             Stop& stop);
  Instance inst_;
  FailedStates memo_;
};

// One step of the hashes of the failed-state memo (splitmix64 of h ^ x).
inline uint64_t hash_mix(uint64_t h, int64_t x) {
  uint64_t z = (h ^ static_cast<uint64_t>(x)) * 0x9E3779B97F4A7C15ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// Where a greedy puts a buffer among the gaps the buffers live at the same time leave: the lowest
// that fits (first fit), or the smallest that fits, the lowest of equal ones (best fit, TFLite's
// greedy by size); on top of them all when none does.
enum class Fit { first, best };

// A greedy placement of the buffers in ``order`` (memplan/alloc/greedy.py): each goes in the gap
// ``fit`` picks among the buffers already placed that are live at the same time. ``offsets``
// holds on entry the buffers placed beforehand (their offsets; -1 for the others, which keep -1
// until placed); the buffers of ``order`` placed beforehand are skipped. Returns how many of
// ``order`` it went through (fewer when stopped; -1 - that count when an arena would pass
// ``limit``). With an overlap CSR (``ov_start`` of n + 1 entries) the neighbours are read from
// it, else found in an index of the lifetimes (lower, upper).
int64_t first_fit(const int64_t* lower, const int64_t* upper, const int64_t* size, int64_t n,
                  const int64_t* order, int64_t n_order, const int64_t* ov_start,
                  const int64_t* ov_buf, int64_t* offsets, int64_t limit, Stop& stop,
                  Fit fit = Fit::first);

}  // namespace memplan::alloc
