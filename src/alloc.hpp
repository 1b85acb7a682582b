// The exact allocation search and the greedy first fit (alloc.cpp).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "stop.hpp"

namespace memplan::alloc {

constexpr int FOUND = 1, NOT_FOUND = 0, ABORTED = -1, TIMEOUT = -2, OVERFLOW = -3;
constexpr int64_t INF = int64_t(1) << 62;

// The static data of one instance (memplan/alloc/instance.py builds it): buffers of positive size,
// their sections, the CSRs of the section incidences, the overlaps and the stacked twins.
struct Instance {
  int64_t n = 0, sections = 0;
  std::vector<int64_t> first, end, size, sec_start, sec_buf, ov_start, ov_buf, tw_start, tw_buf;
  std::vector<int64_t> section_total, cuts;
  std::vector<double> width, area, fsize;  // keys of the residual preorders (W, A, Z)
  // Ranks of the buffers under MiniMalloc's preorders TWA, TAW, WAT (NOTE [ compiled restarts ]).
  std::vector<int64_t> ranks[3];
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
  std::unique_ptr<uint64_t, void (*)(void*)> memo1_, memo2_;
  int64_t memo_slots_ = 0;
};

// A zeroed table of ``slots`` 64-bit entries for a failed-state memo (NOTE [ compiled failed-state
// memo ] in alloc.cpp), freed with std::free.
uint64_t* zeroed_table(int64_t slots);

// One step of the hashes of the failed-state memo (splitmix64 of h ^ x).
inline uint64_t hash_mix(uint64_t h, int64_t x) {
  uint64_t z = (h ^ static_cast<uint64_t>(x)) * 0x9E3779B97F4A7C15ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// First fit of the buffers in ``order``, each at its lowest free address (memplan/alloc/greedy.py):
// fills ``offsets`` (-1 for buffers not placed) and returns how many of ``order`` it placed
// (fewer when stopped; -1 - that count when an arena would pass ``limit``). With an overlap CSR
// (``ov_start`` of n + 1 entries) the neighbours are read from it, else found by a scan of every
// buffer (lower, upper: lifetimes).
int64_t first_fit(const int64_t* lower, const int64_t* upper, const int64_t* size, int64_t n,
                  const int64_t* order, int64_t n_order, const int64_t* ov_start,
                  const int64_t* ov_buf, int64_t* offsets, int64_t limit, Stop& stop);

}  // namespace memplan::alloc
