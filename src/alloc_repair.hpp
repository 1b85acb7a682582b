// Ruin and recreate: local improvement of a placement (alloc_repair.cpp).
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "stop.hpp"

namespace memplan::alloc {

// The buffers live in a time window, without a list of pairs: the buffers grouped by the power of
// two of their lifetime, each group sorted by start. A query visits the buffers of each group
// that start within the group's longest lifetime before the window: O(groups log n + answers
// + the ones of about the same length that end just before the window).
class TimeIndex {
 public:
  // ``upper`` must outlive the index (it is read, not copied).
  TimeIndex(const std::vector<int64_t>& lower, const std::vector<int64_t>& upper);
  // Calls visit(b) for every buffer b with lower[b] < t1 and upper[b] > t0.
  template <class Visit>
  void each(int64_t t0, int64_t t1, Visit&& visit) const;

 private:
  struct Group {
    int64_t longest = 0;
    std::vector<int64_t> lower, id;
  };
  const std::vector<int64_t>& upper_;
  std::vector<Group> groups_;
};

// NOTE [ ruin and recreate ] in alloc_repair.cpp. Buffers of positive size; ``offsets`` a valid
// placement of them. run() improves it until ``goal`` (an arena at which to stop: a lower bound,
// or a capacity), ``max_moves`` moves (< 0: none) or ``stop``; best() is the best placement met.
class Repair {
 public:
  Repair(std::vector<int64_t> lower, std::vector<int64_t> upper, std::vector<int64_t> size,
         std::vector<int64_t> offsets, int64_t step, uint64_t seed);
  Repair(const Repair&) = delete;  // index_ refers to upper_
  Repair& operator=(const Repair&) = delete;
  // Returns the best arena.
  int64_t run(int64_t goal, int64_t max_moves, Stop& stop);
  // Starts again from ``offsets`` (a valid placement) when its arena is below the best.
  void offer(const std::vector<int64_t>& offsets);
  const std::vector<int64_t>& best() const { return best_; }
  int64_t best_arena() const { return best_arena_; }
  int64_t moves() const { return moves_; }

 private:
  bool move();
  void retarget();
  void set_top(int64_t b, int64_t offset);
  uint64_t next();
  int64_t below(int64_t bound) { return int64_t(next() % uint64_t(bound)); }

  std::vector<int64_t> lower_, upper_, size_, offset_, best_;
  TimeIndex index_;
  int64_t n_ = 0, step_ = 1, best_arena_ = 0, goal_ = 0, target_ = 0, cut_ = 0, moves_ = 0;
  int64_t since_better_ = 0;  // moves since the overflow (sum of max(0, top - target)) fell
  uint64_t rng_ = 0;
  std::vector<int64_t> over_, over_pos_;  // buffers above the target, where each sits there
  std::vector<int64_t> tree_;             // maximum top over ranges of buffers
  int64_t cap_ = 1;
  std::vector<char> removed_;
  std::vector<int64_t> ruin_, saved_, saved_ids_, near_, fits_;
  std::vector<std::vector<std::pair<int64_t, int64_t>>> lists_;
};

template <class Visit>
void TimeIndex::each(int64_t t0, int64_t t1, Visit&& visit) const {
  for (const Group& g : groups_) {
    // A buffer of the group starting at or before t0 - longest ends at or before t0.
    auto k = std::upper_bound(g.lower.begin(), g.lower.end(), t0 - g.longest) - g.lower.begin();
    for (; k < int64_t(g.lower.size()) && g.lower[std::size_t(k)] < t1; ++k) {
      const int64_t b = g.id[std::size_t(k)];
      if (upper_[std::size_t(b)] > t0) visit(b);
    }
  }
}

}  // namespace memplan::alloc
