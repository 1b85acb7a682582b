// The skyline search: the exact allocation search of alloc.cpp (canonical placements, inference,
// dominance, decomposition, failed states, stacked twins, hatless pruning; after Moffitt,
// *MiniMalloc*, ASPLOS 2023) with every node in O(log n) time and memory O(n + sections), for
// parts of thousands to hundreds of thousands of buffers.
//
// NOTE [ skyline search ]
// alloc.cpp's nodes scan their open buffers (O(n) per node) and read lists of overlapping pairs
// and of section incidences (O(n^2) memory on dense instances: 360 million pairs on a 62,185-buffer
// compiler trace). Here nothing is listed. In a canonical placement (NOTE [ canonical placements ]
// in memplan/alloc/search.py) a buffer's minimum offset is the highest top of the placed buffers
// live at the same time, that is, the highest *skyline* h[s] over its sections, h[s] being the
// highest top placed in section s. Three trees hold the state, each undone to a mark:
//
// * the section tree: per section h[s] and the unplaced total[s], with the maxima of h, total and
//   h + total over any range; placing b at m sets h = m + size over b's sections (every h there is
//   at most m, so this is the maximum) and takes its size off their totals: O(log S);
// * the cut tree: per section boundary the unplaced buffers crossing it, minimum over any range;
//   its zeros inside b's lifetime are where the rest splits (dynamic decomposition);
// * the candidate tree over the buffers ordered by first section (a part's buffers are then a
//   contiguous range): per buffer a *stored* minimum offset, a lower bound of the true one (the
//   skyline only rises along a branch), with the least (offset, rank) and offset + size over any
//   range. A stored offset is refreshed from the section tree when it is read: the least
//   candidate is found by asking for the least key, refreshing it, and asking again if it rose.
//   Refreshes are undone with the rest when the search backs up (the skyline falls back there).
//
// A node's candidates are the unplaced buffers of its part in (true offset, rank) order above the
// floor (the last placement's offset and rank); at the node's start the stored keys at or below
// the floor are refreshed, so that every key at or below the cursor of the loop is true and the
// next candidate is the least stored key above it, refreshed. The prunings are those of alloc.cpp
// but one: inference checks every section of the part with the skyline floor,
// max(h[s], offset) + total[s] <= capacity (a range maximum of the section tree), where alloc.cpp
// checks the sections the placement touched with the least minimum offset of their unplaced
// buffers. The failed-state memo keys a node by (run, capacity, part, floor, and a Zobrist hash of
// the placed buffers and their offsets): finer than alloc.cpp's key, so sound. Residual preorders
// are not used: the round robin runs TWA, TAW and WAT with the stacked-twin rule, as MiniMalloc
// does (its three preorders), first at the part's own peak like alloc.cpp.
//
// Each node costs O((1 + r) log n) for r refreshes, plus O(log S) per split; a descent of k
// buffers without backtracking is k nodes.
#include "alloc_skyline.hpp"

#include <algorithm>
#include <cstdlib>
#include <limits>
#include <stdexcept>
#include <utility>

namespace memplan::alloc {

namespace {

constexpr int64_t NEG = std::numeric_limits<int64_t>::min() / 4;

// Per section the skyline h (the highest top placed there): raised over a range to a value, the
// maximum of a range; every change is logged and can be undone. Iterative, without propagation:
// a node holds the value raised over its whole range (``tag``) and the maximum below it
// (``sub``); a section's h is the largest tag on its path to the root.
class SkylineTree {
 public:
  void build(int64_t n) {
    cap_ = 1;
    while (cap_ < std::max<int64_t>(n, 1)) cap_ *= 2;
    tag_.assign(std::size_t(2 * cap_), 0);
    sub_.assign(std::size_t(2 * cap_), 0);
    log_.clear();
  }
  // h = max(h, v) over [l, r).
  void raise(int64_t l, int64_t r, int64_t v) {
    if (l >= r) return;
    const int64_t l0 = l + cap_, r0 = r - 1 + cap_;
    for (l += cap_, r += cap_; l < r; l /= 2, r /= 2) {
      if (l & 1) touch(l++, v, true);
      if (r & 1) touch(--r, v, true);
    }
    for (int64_t i = l0 / 2; i >= 1; i /= 2) touch(i, v, false);
    for (int64_t i = r0 / 2; i >= 1; i /= 2) touch(i, v, false);
  }
  int64_t max(int64_t l, int64_t r) const {
    int64_t out = 0;
    const int64_t l0 = l + cap_, r0 = r - 1 + cap_;
    for (l += cap_, r += cap_; l < r; l /= 2, r /= 2) {
      if (l & 1) out = std::max(out, sub_[l++]);
      if (r & 1) out = std::max(out, sub_[--r]);
    }
    for (int64_t i = l0 / 2; i >= 1; i /= 2) out = std::max(out, tag_[i]);
    for (int64_t i = r0 / 2; i >= 1; i /= 2) out = std::max(out, tag_[i]);
    return out;
  }
  std::size_t mark() const { return log_.size(); }
  void rollback(std::size_t m) {
    while (log_.size() > m) {
      const Entry& x = log_.back();
      tag_[x.i] = x.tag;
      sub_[x.i] = x.sub;
      log_.pop_back();
    }
  }

 private:
  struct Entry {
    int64_t i, tag, sub;
  };
  void touch(int64_t i, int64_t v, bool whole) {
    if (sub_[i] >= v && (!whole || tag_[i] >= v)) return;
    log_.push_back({i, tag_[i], sub_[i]});
    sub_[i] = std::max(sub_[i], v);
    if (whole) tag_[i] = std::max(tag_[i], v);
  }
  int64_t cap_ = 1;
  std::vector<int64_t> tag_, sub_;
  std::vector<Entry> log_;
};

// Per section a value, added to over ranges; logged and undone like SkylineTree. A node's ``add``
// applies to its whole range; ``best`` is the best value below it (the larger with Larger, the
// smaller with Smaller), its own ``add`` included. Two uses follow: TotalTree and CutTree.
struct Larger {
  int64_t operator()(int64_t x, int64_t y) const { return std::max(x, y); }
};
struct Smaller {
  int64_t operator()(int64_t x, int64_t y) const { return std::min(x, y); }
};

template <class Best>
class RangeAddTree {
 public:
  void build(const std::vector<int64_t>& values) {
    n_ = int64_t(values.size());
    t_.assign(std::size_t(4 * std::max<int64_t>(n_, 1)), Node{});
    log_.clear();
    if (n_ > 0) build(1, 0, n_, values);
  }
  void add(int64_t a, int64_t e, int64_t d) {
    if (a < e) add(1, 0, n_, a, e, d);
  }
  std::size_t mark() const { return log_.size(); }
  void rollback(std::size_t m) {
    while (log_.size() > m) {
      t_[std::size_t(log_.back().first)] = log_.back().second;
      log_.pop_back();
    }
  }

 protected:
  struct Node {
    int64_t best = 0, add = 0;
  };
  int64_t n_ = 0;
  std::vector<Node> t_;

 private:
  void build(int64_t i, int64_t l, int64_t r, const std::vector<int64_t>& values) {
    if (r - l == 1) {
      t_[i] = Node{values[l], 0};
      return;
    }
    const int64_t m = (l + r) / 2;
    build(2 * i, l, m, values);
    build(2 * i + 1, m, r, values);
    t_[i].best = Best{}(t_[2 * i].best, t_[2 * i + 1].best);
  }
  void add(int64_t i, int64_t l, int64_t r, int64_t a, int64_t e, int64_t d) {
    log_.emplace_back(i, t_[i]);
    if (a <= l && r <= e) {
      t_[i].best += d;
      t_[i].add += d;
      return;
    }
    const int64_t m = (l + r) / 2;
    if (a < m) add(2 * i, l, m, a, e, d);
    if (e > m) add(2 * i + 1, m, r, a, e, d);
    t_[i].best = Best{}(t_[2 * i].best, t_[2 * i + 1].best) + t_[i].add;
  }
  std::vector<std::pair<int64_t, Node>> log_;
};

// Per section the unplaced total: the maximum of a range.
class TotalTree : public RangeAddTree<Larger> {
 public:
  int64_t max(int64_t a, int64_t e) const { return a < e ? max(1, 0, n_, a, e) : NEG; }

 private:
  int64_t max(int64_t i, int64_t l, int64_t r, int64_t a, int64_t e) const {
    if (a <= l && r <= e) return t_[i].best;
    const int64_t m = (l + r) / 2;
    int64_t out = NEG;
    if (a < m) out = std::max(out, max(2 * i, l, m, a, e));
    if (e > m) out = std::max(out, max(2 * i + 1, m, r, a, e));
    return out + t_[i].add;
  }
};

// Per section boundary: the unplaced buffers crossing it, and the zeros of a range.
class CutTree : public RangeAddTree<Smaller> {
 public:
  // Appends the boundaries of [a, e) at zero, ascending.
  void zeros(int64_t a, int64_t e, std::vector<int64_t>& out) const {
    if (a < e) zeros(1, 0, n_, a, e, 0, out);
  }

 private:
  void zeros(int64_t i, int64_t l, int64_t r, int64_t a, int64_t e, int64_t acc,
             std::vector<int64_t>& out) const {
    if (t_[i].best + acc > 0) return;
    if (r - l == 1) {
      out.push_back(l);
      return;
    }
    const int64_t m = (l + r) / 2, acc2 = acc + t_[i].add;
    if (a < m) zeros(2 * i, l, m, a, e, acc2, out);
    if (e > m) zeros(2 * i + 1, m, r, a, e, acc2, out);
  }
};

// The candidate tree: per position (buffers by first section) a stored minimum offset ``mu``
// (INF: placed or outside the run), its rank and size; the least (mu, rank) and the least
// mu + size of any range. Each node holds both minima with their positions (one cache line for
// a node's two children).
class CandidateTree {
 public:
  void build(int64_t n) {
    cap_ = 1;
    while (cap_ < std::max<int64_t>(n, 1)) cap_ *= 2;
    t_.assign(std::size_t(2 * cap_), Agg{});
    size_.assign(std::size_t(cap_), 0);
  }
  int64_t mu(int64_t p) const { return t_[p + cap_].mu; }
  int64_t rank(int64_t p) const { return t_[p + cap_].rank; }
  // Positions [l, r) get mu 0 and the given ranks and sizes.
  template <typename RankOf, typename SizeOf>
  void reset(int64_t l, int64_t r, RankOf rank_of, SizeOf size_of) {
    for (int64_t p = l; p < r; ++p) {
      size_[p] = size_of(p);
      t_[p + cap_].rank = rank_of(p);
      leaf(p, 0);
    }
    for (int64_t lo = (l + cap_) / 2, hi = (r - 1 + cap_) / 2; lo >= 1; lo /= 2, hi /= 2)
      for (int64_t i = lo; i <= hi; ++i) pull(i);
  }
  void set(int64_t p, int64_t mu) {
    leaf(p, mu);
    for (int64_t i = (p + cap_) / 2; i >= 1; i /= 2) pull(i);
  }
  // The position of the least (mu, rank) in [l, r), -1 if none.
  int64_t least(int64_t l, int64_t r) const {
    const Agg* best = nullptr;
    for (l += cap_, r += cap_; l < r; l /= 2, r /= 2) {
      if (l & 1) best = better(best, &t_[l++]);
      if (r & 1) best = better(&t_[--r], best);
    }
    return best == nullptr || best->mu >= INF ? -1 : best->pos;
  }
  // The least mu + size in [l, r) (INF if none) and its position.
  std::pair<int64_t, int64_t> lowest_top(int64_t l, int64_t r) const {
    std::pair<int64_t, int64_t> out{INF, -1};
    for (l += cap_, r += cap_; l < r; l /= 2, r /= 2) {
      if (l & 1) {
        if (t_[l].height < out.first) out = {t_[l].height, t_[l].hpos};
        ++l;
      }
      if (r & 1) {
        --r;
        if (t_[r].height < out.first) out = {t_[r].height, t_[r].hpos};
      }
    }
    return out;
  }
  // The position of the least key above (cm, cr) in [l, r), -1 if none.
  int64_t above(int64_t l, int64_t r, int64_t cm, int64_t cr) const {
    const Agg* found = above(1, 0, cap_, l, r, cm, cr);
    return found == nullptr ? -1 : found->pos;
  }
  // Appends the positions of [l, r) whose key is at or below (cm, cr).
  void at_or_below(int64_t l, int64_t r, int64_t cm, int64_t cr, std::vector<int64_t>& out) const {
    at_or_below(1, 0, cap_, l, r, cm, cr, out);
  }

 private:
  struct Agg {
    int64_t mu = INF, rank = 0, height = INF, pos = -1, hpos = -1;
  };
  static bool key_above(const Agg& x, int64_t cm, int64_t cr) {
    return x.mu > cm || (x.mu == cm && x.rank > cr);
  }
  static const Agg* better(const Agg* x, const Agg* y) {
    if (x == nullptr) return y;
    if (y == nullptr) return x;
    if (x->mu != y->mu) return x->mu < y->mu ? x : y;
    return x->rank <= y->rank ? x : y;
  }
  void leaf(int64_t p, int64_t mu) {
    Agg& x = t_[p + cap_];
    x.mu = mu;
    x.height = mu < INF ? mu + size_[p] : INF;
    x.pos = p;
    x.hpos = p;
  }
  void pull(int64_t i) {
    const Agg &x = t_[2 * i], &y = t_[2 * i + 1];
    Agg& z = t_[i];
    const Agg& k = (x.mu != y.mu ? x.mu < y.mu : x.rank <= y.rank) ? x : y;
    z.mu = k.mu;
    z.rank = k.rank;
    z.pos = k.pos;
    const Agg& h = x.height <= y.height ? x : y;
    z.height = h.height;
    z.hpos = h.hpos;
  }
  const Agg* above(int64_t i, int64_t nl, int64_t nr, int64_t l, int64_t r, int64_t cm,
                   int64_t cr) const {
    if (nr <= l || r <= nl || t_[i].mu >= INF) return nullptr;
    if (l <= nl && nr <= r && key_above(t_[i], cm, cr)) return &t_[i];
    if (nr - nl == 1) return nullptr;
    const int64_t m = (nl + nr) / 2;
    return better(above(2 * i, nl, m, l, r, cm, cr), above(2 * i + 1, m, nr, l, r, cm, cr));
  }
  void at_or_below(int64_t i, int64_t nl, int64_t nr, int64_t l, int64_t r, int64_t cm,
                   int64_t cr, std::vector<int64_t>& out) const {
    if (nr <= l || r <= nl || t_[i].mu >= INF || key_above(t_[i], cm, cr)) return;
    if (nr - nl == 1) {
      out.push_back(nl);
      return;
    }
    const int64_t m = (nl + nr) / 2;
    at_or_below(2 * i, nl, m, l, r, cm, cr, out);
    at_or_below(2 * i + 1, m, nr, l, r, cm, cr, out);
  }
  int64_t cap_ = 1;
  std::vector<Agg> t_;
  std::vector<int64_t> size_;
};

}  // namespace

// The mutable state of the search, built once per instance; every run undoes all it changes.
struct Skyline::State {
  SkylineTree skyline;
  TotalTree totals;
  CutTree cuts;
  CandidateTree cand;
  std::vector<std::pair<int64_t, int64_t>> trail;  // (position, stored mu before)
  std::vector<int64_t> offset, splits, scratch;
  // The run.
  const SkylineInstance* inst = nullptr;
  const int64_t* order = nullptr;
  const int64_t* sec_pos = nullptr;
  const int64_t* rank = nullptr;
  Stop* stop = nullptr;
  bool twins = true;
  int64_t capacity = 0, run = 0, nodes = 0, limit = 0;
  uint64_t placed_hash = 0;
  FailedStates* memo = nullptr;

  void undo_trail(std::size_t mark) {
    while (trail.size() > mark) {
      cand.set(trail.back().first, trail.back().second);
      trail.pop_back();
    }
  }
  // The true minimum offset of the buffer at position p; true if its stored one rose.
  bool refresh(int64_t p) {
    const int64_t b = order[p];
    const int64_t m = skyline.max(inst->first[b], inst->end[b]);
    const int64_t stored = cand.mu(p);
    if (m <= stored) return false;
    trail.emplace_back(p, stored);
    cand.set(p, m);
    return true;
  }
  int64_t true_lowest_top(int64_t l, int64_t r) {
    while (true) {
      auto [top, p] = cand.lowest_top(l, r);
      if (top >= INF || !refresh(p)) return top;
    }
  }
  bool mirrored(int64_t b, int64_t off) const {  // NOTE [ stacked twins ]
    for (int64_t t = inst->tw_start[b]; t < inst->tw_start[b + 1]; ++t) {
      const int64_t u = inst->tw_buf[t];
      if (offset[u] >= 0 && offset[u] + inst->size[u] == off && rank[u] > rank[b]) return true;
    }
    return false;
  }

  // The least key above (cm, cr) in [l, r), true, or -1.
  int64_t next_above(int64_t l, int64_t r, int64_t cm, int64_t cr) {
    while (true) {
      const int64_t p = cand.above(l, r, cm, cr);
      if (p < 0 || !refresh(p)) return p;
    }
  }

  // Search the unplaced buffers of sections [lo, hi) above the floor (o, last_rank).
  int node(int64_t lo, int64_t hi, int64_t o, int64_t last_rank) {
    if (++nodes > limit) return ABORTED;
    if (stop->due()) return TIMEOUT;  // a node can take milliseconds (nested lifetimes)
    const int64_t pl = sec_pos[lo], pr = sec_pos[hi];
    if (cand.least(pl, pr) < 0) return FOUND;
    const std::size_t mark = trail.size();
    // Every stored key at or below the floor made true; those still there cannot be placed
    // yet (submerged), and only they can be below the least candidate.
    bool submerged = false;
    if (o >= 0) {
      const std::size_t base = scratch.size();
      cand.at_or_below(pl, pr, o, last_rank, scratch);
      for (std::size_t k = base; k < scratch.size(); ++k) {
        const int64_t q = scratch[k];
        refresh(q);
        submerged = submerged || cand.mu(q) < o || (cand.mu(q) == o && cand.rank(q) <= last_rank);
      }
      scratch.resize(base);
    }
    int64_t p = next_above(pl, pr, o, last_rank);
    if (!submerged && (p < 0 || cand.mu(p) > o)) {  // NOTE [ failed states ]: the floor is moot
      o = -1;
      last_rank = -1;
    }
    uint64_t h1 = hash_mix(0x243F6A8885A308D3ULL, run);
    uint64_t h2 = hash_mix(0x13198A2E03707344ULL, run);
    for (int64_t x : {capacity, lo, hi, o + 1, last_rank + 1, int64_t(placed_hash)}) {
      h1 = hash_mix(h1, x);
      h2 = hash_mix(h2 ^ 0x5BE0CD19137E2179ULL, x);
    }
    if (h1 == 0) h1 = 1;
    if (memo->find(h1, h2)) {
      undo_trail(mark);
      return NOT_FOUND;
    }
    const int64_t peak = totals.max(lo, hi);
    // Dominance: no candidate at or above the least top of an unplaced buffer. The least
    // candidate is below it unless some buffer is submerged: the bound is found when needed.
    int64_t min_height = -1;
    for (bool first = true; p >= 0; p = next_above(pl, pr, cand.mu(p), cand.rank(p))) {
      const int64_t b = order[p], m = cand.mu(p);
      if (!first || submerged) {
        if (min_height < 0) min_height = true_lowest_top(pl, pr);
        if (m >= min_height) break;
      }
      first = false;
      if (m + peak > capacity) break;  // the floor's inference
      if (m + inst->size[b] > capacity) continue;
      if (twins && mirrored(b, m)) continue;
      bool hatless = false;
      const int status = place(p, b, m, lo, hi, hatless);
      if (status == FOUND) return FOUND;  // its placements stay (NOTE [ skyline search ])
      if (status != NOT_FOUND) {
        undo_trail(mark);
        return status;
      }
      if (hatless) break;  // MiniMalloc's hatless pruning
    }
    memo->add(h1, h2);
    undo_trail(mark);
    return NOT_FOUND;
  }

  // Place buffer b (at position p) at m and search on.
  int place(int64_t p, int64_t b, int64_t m, int64_t lo, int64_t hi, bool& hatless) {
    const int64_t a = inst->first[b], e = inst->end[b], top = m + inst->size[b];
    const std::size_t hmark = skyline.mark(), smark = totals.mark(), tmark = trail.size();
    const uint64_t hash_before = placed_hash;
    trail.emplace_back(p, cand.mu(p));
    cand.set(p, INF);
    offset[b] = m;
    skyline.raise(a, e, top);
    totals.add(a, e, -inst->size[b]);
    placed_hash ^= hash_mix(0x6A09E667F3BCC909ULL + uint64_t(b), m);
    const int64_t around = totals.max(a, e);
    hatless = around == 0;
    int status = NOT_FOUND;
    // NOTE [ skyline search ]: b's sections now stand at its top; the floor is m everywhere.
    if (top + around <= capacity && m + totals.max(lo, hi) <= capacity) {
      const std::size_t cmark = cuts.mark();
      const std::size_t zs = splits.size();
      if (e - 1 > a) {
        cuts.add(a, e - 1, -1);
        cuts.zeros(a, e - 1, splits);
      }
      const std::size_t ze = splits.size();
      if (ze == zs) {
        status = node(lo, hi, m, cand.rank(p));
      } else {
        status = FOUND;
        int64_t slo = lo;
        for (std::size_t k = zs; k <= ze && status == FOUND; ++k) {
          const int64_t shi = k < ze ? splits[k] + 1 : hi;
          if (cand.lowest_top(sec_pos[slo], sec_pos[shi]).first < INF)
            status = node(slo, shi, -1, -1);
          slo = shi;
        }
      }
      splits.resize(zs);
      if (status == FOUND) return FOUND;
      cuts.rollback(cmark);
    }
    skyline.rollback(hmark);
    totals.rollback(smark);
    undo_trail(tmark);
    placed_hash = hash_before;
    offset[b] = -1;
    return status;
  }

  // Sections [lo, hi), split first where no buffer crosses.
  int run_part(int64_t lo, int64_t hi) {
    const std::size_t zs = splits.size();
    if (hi - 1 > lo) cuts.zeros(lo, hi - 1, splits);
    const std::size_t ze = splits.size();
    int status = FOUND;
    int64_t slo = lo;
    for (std::size_t k = zs; k <= ze && status == FOUND; ++k) {
      const int64_t shi = k < ze ? splits[k] + 1 : hi;
      if (sec_pos[shi] > sec_pos[slo]) status = node(slo, shi, -1, -1);
      slo = shi;
    }
    splits.resize(zs);
    return status;
  }
};

Skyline::Skyline(SkylineInstance instance, int64_t memo_slots)
    : inst_(std::move(instance)), memo_(memo_slots, inst_.n, "AllocSkyline") {
  const int64_t n = inst_.n, S = inst_.sections;
  order_.resize(std::size_t(n));
  for (int64_t b = 0; b < n; ++b) order_[b] = b;
  std::stable_sort(order_.begin(), order_.end(),
                   [&](int64_t p, int64_t q) { return inst_.first[p] < inst_.first[q]; });
  pos_.resize(std::size_t(n));
  for (int64_t p = 0; p < n; ++p) pos_[order_[p]] = p;
  sec_pos_.assign(std::size_t(S + 1), 0);
  for (int64_t b = 0; b < n; ++b) ++sec_pos_[inst_.first[b] + 1];
  for (int64_t s = 0; s < S; ++s) sec_pos_[s + 1] += sec_pos_[s];
  state_ = std::make_unique<State>();
  state_->skyline.build(S);
  state_->totals.build(inst_.section_total);
  state_->cuts.build(inst_.cuts);
  state_->cand.build(n);
  state_->offset.assign(std::size_t(n), -1);
}

Skyline::~Skyline() = default;

std::vector<std::pair<int64_t, int64_t>> Skyline::parts() const {
  std::vector<std::pair<int64_t, int64_t>> out;
  int64_t lo = 0;
  for (int64_t s = 0; s < inst_.sections; ++s) {
    if (s == inst_.sections - 1 || inst_.cuts[s] == 0) {
      if (sec_pos_[s + 1] > sec_pos_[lo]) out.emplace_back(lo, s + 1);
      lo = s + 1;
    }
  }
  return out;
}

std::vector<int64_t> Skyline::part_buffers(int64_t lo, int64_t hi) const {
  return std::vector<int64_t>(order_.begin() + sec_pos_[lo], order_.begin() + sec_pos_[hi]);
}

int Skyline::one_run(int64_t lo, int64_t hi, int64_t capacity, int preorder, bool twins,
                     int64_t run_id, int64_t limit, int64_t& counted,
                     std::vector<int64_t>& solution, Stop& stop) {
  State& s = *state_;
  const int64_t pl = sec_pos_[lo], pr = sec_pos_[hi];
  const std::vector<int64_t>& rank = inst_.ranks[preorder];
  s.cand.reset(
      pl, pr, [&](int64_t p) { return rank[order_[p]]; },
      [&](int64_t p) { return inst_.size[order_[p]]; });
  s.inst = &inst_;
  s.order = order_.data();
  s.sec_pos = sec_pos_.data();
  s.rank = rank.data();
  s.stop = &stop;
  s.twins = twins;
  s.capacity = capacity;
  s.run = run_id;
  s.nodes = 0;
  s.limit = limit;
  s.placed_hash = 0;
  s.memo = &memo_;
  const std::size_t hmark = s.skyline.mark(), smark = s.totals.mark(), cmark = s.cuts.mark();
  const int status = s.run_part(lo, hi);
  counted = std::min(s.nodes, limit);
  if (status == FOUND) {  // the placements stay in the state: read, then undone at once
    solution.resize(std::size_t(pr - pl));
    for (int64_t p = pl; p < pr; ++p) {
      solution[p - pl] = s.offset[order_[p]];
      s.offset[order_[p]] = -1;
    }
    s.skyline.rollback(hmark);
    s.totals.rollback(smark);
    s.cuts.rollback(cmark);
    s.trail.clear();
  }
  return status;
}

int Skyline::rotate(int64_t lo, int64_t hi, int64_t capacity, int64_t salt, int64_t budget,
                    int64_t& nodes, std::vector<int64_t>& solution, Stop& stop) {
  int64_t limit = std::max<int64_t>(sec_pos_[hi] - sec_pos_[lo], 16);
  while (true) {
    limit *= 2;
    for (int index = 0; index < 3; ++index) {
      int64_t run_limit = limit;
      if (budget >= 0) {
        run_limit = std::min(limit, budget - nodes);
        if (run_limit <= 0) return ABORTED;
      }
      int64_t counted = 0;
      const int status = one_run(lo, hi, capacity, index, true, 2 * index + salt, run_limit,
                                 counted, solution, stop);
      nodes += counted;
      if (status == FOUND || status == NOT_FOUND || status == TIMEOUT) return status;
    }
  }
}

PartResult Skyline::solve_part(int64_t lo, int64_t hi, int64_t capacity, int64_t node_budget,
                               int64_t nodes, bool tight, Stop& stop) {
  PartResult result;
  const int64_t part_peak = state_->totals.max(lo, hi);
  if (tight && part_peak < capacity) {
    int64_t budget = nodes + 8 * (sec_pos_[hi] - sec_pos_[lo]);
    if (node_budget >= 0) budget = std::min(budget, node_budget);
    const int status = rotate(lo, hi, part_peak, 1, budget, nodes, result.solution, stop);
    if (status == FOUND || status == TIMEOUT) {
      result.status = status;
      result.nodes = nodes;
      return result;
    }
  }
  result.status = rotate(lo, hi, capacity, 0, node_budget, nodes, result.solution, stop);
  result.nodes = nodes;
  return result;
}

PartResult Skyline::run_once(int64_t lo, int64_t hi, int64_t capacity, int preorder, bool twins,
                             int64_t salt, int64_t node_limit, Stop& stop) {
  if (preorder < 0 || preorder >= 3) throw std::invalid_argument("preorder: expected 0..2");
  PartResult result;
  result.status = one_run(lo, hi, capacity, preorder, twins, 2 * preorder + salt, node_limit,
                          result.nodes, result.solution, stop);
  return result;
}

std::size_t skyline_stack_bytes(int64_t n, int64_t sections) {
  return (std::size_t(64) << 20) + 512 * std::size_t(2 * n + sections);
}

}  // namespace memplan::alloc
