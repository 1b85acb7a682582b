// Ruin and recreate: local improvement of a placement for the least arena.
//
// NOTE [ ruin and recreate ]
// The exact search (alloc.cpp, alloc_skyline.cpp) proves arenas on instances of hundreds of
// buffers; on tens of thousands its probes below the first guess run out of nodes. This is the
// large-neighbourhood search of Schrimpf et al., *Record Breaking Optimization Results Using the
// Ruin and Recreate Principle* (J. Comput. Phys. 2000), on the placement itself: the best arena
// A found so far sets a target T < A, and the search lowers the *overflow*, the sum over the
// buffers of max(0, top - T), one move at a time. A move picks a buffer v above T at random and
// takes it out with some of the buffers live at the same time: three moves in four an
// *ejection* (v goes at a lower address y, the offset of one of them or a random one, and takes
// out every buffer in its way there), else 2 to 17 of them (the highest, or a random few of
// those above a floor under v, or of all). Then they go back one by one, v first at y in an
// ejection, the others in an order drawn among by size, by lifetime, at random and the lowest
// fit first (a descent over them), each at the lowest address free of the buffers in place
// (first fit), at or above the lowest offset any of them had (a hole further down is rare, and
// the buffers below need not be listed: thousands on dense compiler traces).
// A move is kept when the overflow does not grow and no top passes A (a move that leaves it
// equal is a step across the plateau); otherwise it is undone. At overflow 0 every top is at
// most T: a better placement, and T is lowered again. T starts a sixteenth of the gap to the goal
// (a lower bound, or a capacity) below A; when the overflow has not fallen for PATIENCE moves
// the cut is halved (down to ``step``, the sizes' greatest common divisor), then starts over.
// Every placement it keeps is valid by construction: a buffer goes only where none of the
// buffers live at the same time are (the caller checks the one it returns all the same).
//
// A move costs O(r d log d) for r buffers taken out and d live at the same time as each; the
// moves are drawn from a seeded generator (splitmix64): the same moves on every machine.
#include "alloc_repair.hpp"

#include <algorithm>
#include <stdexcept>
#include <utility>

namespace memplan::alloc {

namespace {

constexpr int64_t FEW = 2;          // buffers taken out with the one above the target, at least
constexpr int64_t MORE = 16;        // ... and up to FEW + MORE - 1 of them
constexpr int64_t EJECTIONS = 75;   // percent of the moves that are ejections
constexpr int64_t PATIENCE = 4000;  // moves without a fall of the overflow before the cut halves
constexpr int64_t FIRST_CUT = 16;   // the first target: A - (A - goal) / FIRST_CUT

int64_t round_up(int64_t value, int64_t step) { return (value + step - 1) / step * step; }

}  // namespace

TimeIndex::TimeIndex(const std::vector<int64_t>& lower, const std::vector<int64_t>& upper)
    : upper_(upper) {
  const int64_t n = int64_t(lower.size());
  std::vector<std::pair<int64_t, int64_t>> keyed;  // (group, buffer)
  keyed.reserve(std::size_t(n));
  for (int64_t b = 0; b < n; ++b) {
    int64_t width = std::max<int64_t>(upper[b] - lower[b], 1), group = 0;
    while (width > 1) {
      width >>= 1;
      ++group;
    }
    keyed.emplace_back(group, b);
  }
  std::sort(keyed.begin(), keyed.end(), [&](const auto& x, const auto& y) {
    if (x.first != y.first) return x.first < y.first;
    if (lower[x.second] != lower[y.second]) return lower[x.second] < lower[y.second];
    return x.second < y.second;
  });
  for (std::size_t k = 0; k < keyed.size(); ++k) {
    if (k == 0 || keyed[k].first != keyed[k - 1].first) groups_.emplace_back();
    Group& g = groups_.back();
    const int64_t b = keyed[k].second;
    g.lower.push_back(lower[b]);
    g.id.push_back(b);
    g.longest = std::max(g.longest, upper[b] - lower[b]);
  }
}

Repair::Repair(std::vector<int64_t> lower, std::vector<int64_t> upper, std::vector<int64_t> size,
               std::vector<int64_t> offsets, int64_t step, uint64_t seed)
    : lower_(std::move(lower)),
      upper_(std::move(upper)),
      size_(std::move(size)),
      offset_(std::move(offsets)),
      index_(lower_, upper_),
      n_(int64_t(size_.size())),
      step_(std::max<int64_t>(step, 1)),
      rng_(seed) {
  if (int64_t(lower_.size()) != n_ || int64_t(upper_.size()) != n_ ||
      int64_t(offset_.size()) != n_)
    throw std::invalid_argument("AllocRepair: the arrays' lengths differ");
  for (int64_t b = 0; b < n_; ++b)
    if (size_[b] <= 0 || lower_[b] >= upper_[b] || offset_[b] < 0)
      throw std::invalid_argument("AllocRepair: a buffer's lifetime, size or offset");
  while (cap_ < std::max<int64_t>(n_, 1)) cap_ *= 2;
  tree_.assign(std::size_t(2 * cap_), 0);
  for (int64_t b = 0; b < n_; ++b) tree_[std::size_t(cap_ + b)] = offset_[b] + size_[b];
  for (int64_t i = cap_ - 1; i >= 1; --i) tree_[i] = std::max(tree_[2 * i], tree_[2 * i + 1]);
  best_ = offset_;
  best_arena_ = tree_[1];
  removed_.assign(std::size_t(n_), 0);
  over_pos_.assign(std::size_t(n_), -1);
}

uint64_t Repair::next() {  // splitmix64
  uint64_t z = (rng_ += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

void Repair::set_top(int64_t b, int64_t offset) {
  offset_[b] = offset;
  const int64_t top = offset + size_[b];
  int64_t i = cap_ + b;
  tree_[std::size_t(i)] = top;
  for (i /= 2; i >= 1; i /= 2) tree_[i] = std::max(tree_[2 * i], tree_[2 * i + 1]);
  const bool above = top > target_;
  if (above && over_pos_[b] < 0) {
    over_pos_[b] = int64_t(over_.size());
    over_.push_back(b);
  } else if (!above && over_pos_[b] >= 0) {
    const int64_t last = over_.back();
    over_[std::size_t(over_pos_[b])] = last;
    over_pos_[last] = over_pos_[b];
    over_.pop_back();
    over_pos_[b] = -1;
  }
}

void Repair::retarget() {
  target_ = std::max(best_arena_ - cut_, goal_);
  over_.clear();
  for (int64_t b = 0; b < n_; ++b) {
    const int64_t top = offset_[b] + size_[b];
    over_pos_[b] = -1;
    if (top > target_) {
      over_pos_[b] = int64_t(over_.size());
      over_.push_back(b);
    }
  }
}

bool Repair::move() {
  const int64_t v = over_[std::size_t(below(int64_t(over_.size())))];
  // Ruin: v and some of the buffers live at the same time: those whose top is above a floor
  // under v (the slab), the highest or a random few of them, or a random few of all; or
  // (ejection) v goes at a lower address y and takes out the buffers there.
  const int kind = below(100) < EJECTIONS ? 3 : int(below(3));
  const int64_t slab = kind >= 2 ? -1 : offset_[v] - size_[v] * below(4);
  near_.clear();
  index_.each(lower_[v], upper_[v], [&](int64_t u) {
    if (u != v && offset_[u] + size_[u] > slab) near_.push_back(u);
  });
  int64_t y = -1;
  if (kind == 3) {
    if (near_.empty()) return false;
    const int64_t u = near_[std::size_t(below(int64_t(near_.size())))];
    y = offset_[u] < offset_[v] ? offset_[u] : below(offset_[v] + 1);
    ruin_.assign(1, v);
    for (int64_t w : near_)
      if (offset_[w] < y + size_[v] && offset_[w] + size_[w] > y) ruin_.push_back(w);
    if (int64_t(ruin_.size()) > FEW + MORE) return false;
  } else {
    const int64_t want = std::min<int64_t>(FEW + below(MORE), int64_t(near_.size()));
    if (kind == 0) {
      std::nth_element(near_.begin(), near_.begin() + want, near_.end(),
                       [&](int64_t a, int64_t b) {
                         return offset_[a] + size_[a] > offset_[b] + size_[b];
                       });
    } else {
      for (int64_t k = 0; k < want; ++k) {  // a partial shuffle: `want` of them at random
        const int64_t pick = k + below(int64_t(near_.size()) - k);
        std::swap(near_[std::size_t(k)], near_[std::size_t(pick)]);
      }
    }
    ruin_.assign(1, v);
    ruin_.insert(ruin_.end(), near_.begin(), near_.begin() + want);
  }
  const int64_t r = int64_t(ruin_.size());
  saved_.clear();
  saved_ids_.clear();
  __int128 before = 0, after = 0;
  for (int64_t b : ruin_) {
    saved_.push_back(offset_[b]);
    saved_ids_.push_back(b);
    removed_[b] = 1;
    before += std::max<int64_t>(offset_[b] + size_[b] - target_, 0);
  }
  // The buffers go back at or above the lowest address any of them had (or y): a hole further
  // down is rare, and the ranges below it need not be listed (thousands on dense instances).
  int64_t base = y >= 0 ? y : offset_[v];
  for (int64_t o : saved_) base = std::min(base, o);
  auto fit = [&](int64_t k) {
    int64_t x = base;
    const int64_t sz = size_[ruin_[k]];
    for (const auto& [start, end] : lists_[std::size_t(k)]) {
      if (start >= x + sz) break;
      x = std::max(x, end);
    }
    return x;
  };
  // Recreate: in an order drawn among by size, by lifetime, at random, and the lowest fit
  // first (a descent over the buffers taken out, the larger first on a tie).
  const int order = int(below(4));
  const auto first = ruin_.begin() + (y >= 0 ? 1 : 0);  // the ejection places v first, at y
  if (order == 0) {
    std::sort(first, ruin_.end(), [&](int64_t a, int64_t b) {
      return size_[a] != size_[b] ? size_[a] > size_[b] : a < b;
    });
  } else if (order == 1) {
    std::sort(first, ruin_.end(), [&](int64_t a, int64_t b) {
      const int64_t wa = upper_[a] - lower_[a], wb = upper_[b] - lower_[b];
      return wa != wb ? wa > wb : size_[a] > size_[b];
    });
  } else if (order == 2) {
    const std::size_t base = y >= 0 ? 1 : 0;
    for (std::size_t k = ruin_.size(); k > base + 1; --k)
      std::swap(ruin_[k - 1], ruin_[base + std::size_t(below(int64_t(k - base)))]);
  }
  // The address ranges each buffer taken out must avoid: the buffers in place live with it.
  if (int64_t(lists_.size()) < r) lists_.resize(std::size_t(r));
  for (int64_t k = 0; k < r; ++k) {
    const int64_t b = ruin_[k];
    auto& list = lists_[std::size_t(k)];
    list.clear();
    index_.each(lower_[b], upper_[b], [&](int64_t u) {
      if (!removed_[u] && offset_[u] + size_[u] > base)
        list.emplace_back(offset_[u], offset_[u] + size_[u]);
    });
    std::sort(list.begin(), list.end());
  }
  fits_.assign(std::size_t(r), 0);
  for (int64_t k = 0; k < r; ++k) fits_[k] = fit(k);
  if (y >= 0) fits_[0] = y;  // free: every buffer in place there was taken out
  bool keep = true;
  for (int64_t done = 0; done < r; ++done) {
    int64_t k = done;
    if (order == 3 && (y < 0 || done > 0)) {
      for (int64_t j = done + 1; j < r; ++j) {
        const bool lower = fits_[j] != fits_[k] ? fits_[j] < fits_[k]
                                                 : size_[ruin_[j]] > size_[ruin_[k]];
        if (lower) k = j;
      }
      std::swap(ruin_[std::size_t(k)], ruin_[std::size_t(done)]);
      std::swap(lists_[std::size_t(k)], lists_[std::size_t(done)]);
      std::swap(fits_[std::size_t(k)], fits_[std::size_t(done)]);
      k = done;
    }
    const int64_t b = ruin_[k], x = fits_[k], top = x + size_[b];
    offset_[b] = x;
    removed_[b] = 0;
    if (top > best_arena_) {  // never above the best arena
      keep = false;
      break;
    }
    after += std::max<int64_t>(top - target_, 0);
    for (int64_t j = done + 1; j < r; ++j) {
      const int64_t u = ruin_[j];
      if (lower_[u] >= upper_[b] || lower_[b] >= upper_[u]) continue;
      auto& list = lists_[std::size_t(j)];
      list.insert(std::upper_bound(list.begin(), list.end(), std::make_pair(x, top)),
                  std::make_pair(x, top));
      if (x < fits_[j] + size_[u] && top > fits_[j]) fits_[j] = fit(j);
    }
  }
  if (!keep || after > before) {
    for (std::size_t k = 0; k < saved_.size(); ++k) removed_[saved_ids_[k]] = 0;
    for (std::size_t k = 0; k < saved_.size(); ++k) offset_[saved_ids_[k]] = saved_[k];
    return false;
  }
  for (int64_t b : ruin_) set_top(b, offset_[b]);
  return after < before;
}

void Repair::offer(const std::vector<int64_t>& offsets) {
  if (int64_t(offsets.size()) != n_) throw std::invalid_argument("offer: length");
  int64_t arena = 0;
  for (int64_t b = 0; b < n_; ++b) arena = std::max(arena, offsets[b] + size_[b]);
  if (arena >= best_arena_) return;
  for (int64_t b = 0; b < n_; ++b) set_top(b, offsets[b]);
  best_ = offsets;
  best_arena_ = arena;
  cut_ = 0;
}

int64_t Repair::run(int64_t goal, int64_t max_moves, Stop& stop) {
  goal_ = goal;
  const int64_t first_cut = [&] {
    return std::max(step_, round_up(std::max<int64_t>(best_arena_ - goal_, 0) / FIRST_CUT, step_));
  }();
  if (cut_ <= 0) cut_ = first_cut;
  if (best_arena_ <= goal_ || n_ == 0) return best_arena_;
  retarget();
  for (int64_t done = 0; max_moves < 0 || done < max_moves; ++done) {
    if (over_.empty()) {  // every top at most the target: a better placement
      best_ = offset_;
      best_arena_ = tree_[1];
      if (best_arena_ <= goal_) break;
      cut_ = std::min(cut_, std::max(step_, round_up((best_arena_ - goal_) / 4, step_)));
      retarget();
      since_better_ = 0;
      continue;
    }
    if ((done & 31) == 0 && stop.due()) break;
    ++moves_;
    if (move()) {
      since_better_ = 0;
    } else if (++since_better_ > PATIENCE) {  // the cut halves, then starts over
      cut_ = cut_ > step_ ? std::max(step_, round_up(cut_ / 2, step_)) : first_cut;
      retarget();
      since_better_ = 0;
    }
  }
  return best_arena_;
}

}  // namespace memplan::alloc
