// The exact allocation search: a branch-and-bound over canonical placements, after Moffitt,
// *MiniMalloc: A Lightweight Memory Allocator for Hardware-Accelerated Machine Learning* (ASPLOS
// 2023). The rules are the NOTEs of memplan/alloc/search.py (canonical placements, inference and
// dominance, decomposition, residual preorders, failed states, stacked twins, compiled restarts),
// plus MiniMalloc's *hatless pruning*: when the buffer just tried has no unplaced buffer live at
// the same time, it sits at its minimum offset in some form of every completion, whose canonical
// order then starts with a candidate at or before it; once it has failed, the later candidates are
// not tried. Its Python reference, operation for operation (the same nodes, the same placements),
// is tests/oracles/alloc.py.
//
// NOTE [ compiled failed-state memo ]
// The memo of failed states keys a node by (run, part range, floor, tie position, the unplaced
// buffers of the part in rank order and their minimum offsets), and stores two independent 64-bit
// hashes of the key in a fixed-size table instead of the key itself: a wrong prune would need both
// hashes of two different keys to agree (probability about 2^-128 per pair of states). The table
// is lossy (a full bucket overwrites its oldest slot), which only costs nodes, never soundness.
//
// NOTE [ kernel work stack ]
// The arrays a node needs (its open buffers, its candidates, the buffers of a part split off, the
// ranks a residual preorder replaces, the scratch of the sorts) are taken from one int64 work stack
// and one float64 scratch. A node with k open buffers keeps at most 5k entries while its subtree
// runs and needs at most 4k more for a moment; a child has fewer open buffers than its parent, so a
// part of p buffers never needs more than 5p(p+1)/2 + 5p + 1 entries. The stack is sized from that
// bound (untouched pages cost nothing), capped at 2^25 entries; should a search still run out, it
// returns OVERFLOW and runs again with a stack twice as large.
//
// The search recurses once per placed buffer and split: it runs on a thread of its own with a
// stack sized for the part (module.cpp), and stops within 256 nodes once Stop::due().
#include "alloc.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>

#include "alloc_repair.hpp"

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace memplan::alloc {

namespace {

constexpr int64_t NODES = 0, LIMIT = 1, TRAIL = 2, STAMP = 3, TOP = 4, PEAK = 5;
constexpr int64_t STACK_CAP = int64_t(1) << 25;
constexpr int RUN = 16;  // runs this short are sorted by insertion before the merges

// The round robin (NOTE [ compiled restarts ]): preorder (index into Instance::ranks, keys as
// letters 0 W, 1 A, 2 T), residual preorders, stacked twins.
struct RunSpec {
  int rank;
  int letters[3];
  bool residual;
  bool twins;
};
constexpr RunSpec RUNS[6] = {
    {0, {2, 0, 1}, false, true}, {0, {2, 0, 1}, true, false},  // TWA
    {1, {2, 1, 0}, false, true}, {1, {2, 1, 0}, true, false},  // TAW
    {2, {0, 1, 2}, false, true}, {2, {0, 1, 2}, true, false},  // WAT
};

int64_t stack_size(int64_t part) { return 5 * part * (part + 1) / 2 + 5 * part + 1; }

inline uint64_t mix(uint64_t h, int64_t x) { return hash_mix(h, x); }

// A stable sort of a[0..n) by ``less`` (insertion runs, then merges through tmp): the order that
// numpy's stable sorts give.
template <typename Less>
void stable_sort(int64_t* a, int64_t n, int64_t* tmp, Less less) {
  for (int64_t lo = 0; lo < n; lo += RUN) {
    int64_t hi = std::min<int64_t>(lo + RUN, n);
    for (int64_t i = lo + 1; i < hi; ++i) {
      int64_t x = a[i], j = i - 1;
      while (j >= lo && less(x, a[j])) {
        a[j + 1] = a[j];
        --j;
      }
      a[j + 1] = x;
    }
  }
  bool in_tmp = false;
  for (int64_t width = RUN; width < n; width *= 2) {
    int64_t* src = in_tmp ? tmp : a;
    int64_t* dst = in_tmp ? a : tmp;
    for (int64_t lo = 0; lo < n; lo += 2 * width) {
      int64_t mid = std::min(lo + width, n), hi = std::min(lo + 2 * width, n);
      int64_t i = lo, j = mid;
      for (int64_t k = lo; k < hi; ++k) {
        if (j < hi && (i >= mid || less(src[j], src[i]))) {
          dst[k] = src[j++];
        } else {
          dst[k] = src[i++];
        }
      }
    }
    in_tmp = !in_tmp;
  }
  if (in_tmp) std::copy(tmp, tmp + n, a);
}

// The state of one run: static data by reference, the placement state, the work stack.
struct Run {
  const Instance& inst;
  Stop& stop;
  int64_t capacity;
  bool residual;
  int64_t run;
  const int* letters;
  int nkeys;
  const int64_t* tw_start;
  const int64_t* tw_buf;
  std::vector<int64_t> maxm, mu, offset, solution, total, cuts, rank, trail_buf, trail_old,
      sec_stamp;
  FailedStates& memo;
  int64_t count[6] = {0, 0, 0, 0, 0, 0};
  int64_t* ws;
  int64_t ws_size;
  std::vector<double> fws;

  int64_t push(int64_t k) {
    int64_t base = count[TOP];
    if (base + k > ws_size) return -1;
    count[TOP] = base + k;
    count[PEAK] = std::max(count[PEAK], base + k);
    return base;
  }

  void record() {
    for (int64_t b = 0; b < inst.n; ++b)
      if (offset[b] >= 0) solution[b] = offset[b];
  }

  // Section inference: some unplaced buffer of section s can start low enough for all its
  // unplaced bytes to fit above it.
  bool section_fits(int64_t s) const {
    int64_t tot = total[s];
    if (tot <= 0) return true;
    int64_t threshold = capacity - tot;
    for (int64_t i = inst.sec_start[s]; i < inst.sec_start[s + 1]; ++i)
      if (mu[inst.sec_buf[i]] <= threshold) return true;
    return false;
  }

  // NOTE [ residual preorders ]: sub[0..k) re-sorted by the preorder's keys with T from the
  // unplaced totals of [lo, hi); its buffers get its old rank values in that order.
  int rerank(int64_t* sub, int64_t k, int64_t lo, int64_t hi) {
    int64_t base = push(4 * k);
    if (base < 0) return OVERFLOW;
    int64_t* order = ws + base;
    int64_t* tmp = ws + base + k;
    int64_t* values = ws + base + 2 * k;
    int64_t* new_sub = ws + base + 3 * k;
    if (int64_t(fws.size()) < nkeys * k) fws.resize(nkeys * k);
    double* keys = fws.data();
    for (int64_t j = 0; j < k; ++j) {
      int64_t b = sub[j];
      values[j] = rank[b];
      order[j] = j;
      for (int li = 0; li < nkeys; ++li) {
        double key;
        switch (letters[li]) {
          case 0:
            key = -inst.width[b];
            break;
          case 1:
            key = -inst.area[b];
            break;
          case 3:
            key = -inst.fsize[b];
            break;
          default: {
            int64_t best = 0;
            for (int64_t s = std::max(inst.first[b], lo); s < std::min(inst.end[b], hi); ++s)
              best = std::max(best, total[s]);
            key = -static_cast<double>(best);
          }
        }
        keys[li * k + j] = key;
      }
    }
    stable_sort(order, k, tmp, [&](int64_t p, int64_t q) {
      for (int li = 0; li < nkeys; ++li) {
        double x = keys[li * k + p], y = keys[li * k + q];
        if (x < y) return true;
        if (y < x) return false;
      }
      return false;
    });
    for (int64_t i = 1; i < k; ++i) {  // the rank values, increasing
      int64_t x = values[i], j = i - 1;
      while (j >= 0 && values[j] > x) {
        values[j + 1] = values[j];
        --j;
      }
      values[j + 1] = x;
    }
    for (int64_t j = 0; j < k; ++j) {
      new_sub[j] = sub[order[j]];
      rank[new_sub[j]] = values[j];
    }
    std::copy(new_sub, new_sub + k, sub);
    count[TOP] = base;
    return FOUND;
  }

  // Search below a node: part[0..np) (in rank order) over sections [lo, hi), floor (o, rank).
  int node(const int64_t* part, int64_t np, int64_t lo, int64_t hi, int64_t o,
           int64_t last_rank) {
    count[NODES] += 1;
    if (count[NODES] > count[LIMIT]) return ABORTED;
    if ((count[NODES] & 255) == 0 && stop.due()) return TIMEOUT;
    int64_t k = 0, least = INF;
    for (int64_t i = 0; i < np; ++i) {
      int64_t m = mu[part[i]];
      if (m < INF) {
        ++k;
        least = std::min(least, m);
      }
    }
    if (k == 0) {
      record();
      return FOUND;
    }
    const int64_t frame = push(2 * k);
    if (frame < 0) return OVERFLOW;
    int64_t* opn = ws + frame;
    for (int64_t i = 0, j = 0; i < np; ++i)
      if (mu[part[i]] < INF) opn[j++] = part[i];
    // NOTE [ failed states ]: o and last_rank matter only through the buffers at or below o.
    if (least > o) {
      o = -1;
      last_rank = -1;
    }
    int64_t tie = -1;
    if (o >= 0) {
      tie = 0;
      for (int64_t i = 0; i < k; ++i)
        if (rank[opn[i]] <= last_rank) ++tie;
    }
    uint64_t h1 = mix(0x243F6A8885A308D3ULL, run);
    uint64_t h2 = mix(0x13198A2E03707344ULL, run);
    for (int64_t x : {lo, hi, o + 1, tie + 1}) {
      h1 = mix(h1, x);
      h2 = mix(h2, x);
    }
    for (int64_t i = 0; i < k; ++i) {
      int64_t b = opn[i];
      h1 = mix(mix(h1, b), mu[b]);
      h2 = mix(mix(h2, mu[b]), b);
    }
    if (h1 == 0) h1 = 1;
    if (memo.find(h1, h2)) {
      count[TOP] = frame;
      return NOT_FOUND;
    }
    // The candidates: NOTE [ canonical placements ], NOTE [ inference and dominance ].
    int64_t min_height = INF;
    for (int64_t i = 0; i < k; ++i) min_height = std::min(min_height, mu[opn[i]] + inst.size[opn[i]]);
    int64_t peak = 0;
    for (int64_t s = lo; s < hi; ++s) peak = std::max(peak, total[s]);
    int64_t* cands = ws + frame + k;
    int64_t nc = 0;
    for (int64_t i = 0; i < k; ++i) {
      int64_t b = opn[i], m = mu[b];
      if (m >= min_height || m + peak > capacity || m > maxm[b]) continue;
      if (m < o || (m == o && rank[b] <= last_rank)) continue;
      cands[nc++] = b;
    }
    const int64_t scratch = push(nc);
    if (scratch < 0) {
      count[TOP] = frame;
      return OVERFLOW;
    }
    stable_sort(cands, nc, ws + scratch, [&](int64_t p, int64_t q) { return mu[p] < mu[q]; });
    count[TOP] = scratch;
    int status = NOT_FOUND;
    for (int64_t idx = 0; idx < nc; ++idx) {
      const int64_t b = cands[idx];
      const int64_t off = mu[b], sz = inst.size[b];
      bool mirrored = false;  // NOTE [ stacked twins ]
      for (int64_t t = tw_start[b]; t < tw_start[b + 1]; ++t) {
        int64_t u = tw_buf[t];
        if (offset[u] >= 0 && offset[u] + inst.size[u] == off && rank[u] > rank[b]) {
          mirrored = true;
          break;
        }
      }
      if (mirrored) continue;
      const int64_t top = off + sz, a = inst.first[b], e = inst.end[b];
      offset[b] = off;
      mu[b] = INF;
      const int64_t trail0 = count[TRAIL];
      int64_t tp = trail0;
      bool hatless = true, fail = false;
      for (int64_t t = inst.ov_start[b]; t < inst.ov_start[b + 1]; ++t) {
        int64_t u = inst.ov_buf[t], m = mu[u];
        if (m < INF) {
          hatless = false;
          if (m < top) {
            trail_buf[tp] = u;
            trail_old[tp] = m;
            ++tp;
            mu[u] = top;
            if (top > maxm[u] && inst.first[u] < hi && inst.end[u] > lo) fail = true;
          }
        }
      }
      count[TRAIL] = tp;
      for (int64_t s = a; s < e; ++s) total[s] -= sz;
      if (!fail) {
        // Only the sections of b and of the buffers it raised can have changed.
        const int64_t stamp = ++count[STAMP];
        for (int64_t s = std::max(a, lo); s < std::min(e, hi); ++s) {
          sec_stamp[s] = stamp;
          if (!section_fits(s)) {
            fail = true;
            break;
          }
        }
        for (int64_t t = trail0; !fail && t < tp; ++t) {
          int64_t u = trail_buf[t];
          for (int64_t s = std::max(inst.first[u], lo); s < std::min(inst.end[u], hi); ++s) {
            if (sec_stamp[s] != stamp) {
              sec_stamp[s] = stamp;
              if (top + total[s] > capacity && !section_fits(s)) {
                fail = true;
                break;
              }
            }
          }
        }
      }
      status = NOT_FOUND;
      if (!fail) {
        int64_t nzero = 0;
        for (int64_t s = a; s < e - 1; ++s)
          if (--cuts[s] == 0) ++nzero;
        if (nzero == 0) {
          status = node(opn, k, lo, hi, off, rank[b]);
        } else {
          status = FOUND;
          int64_t nrest = 0;
          for (int64_t i = 0; i < k; ++i)
            if (mu[opn[i]] < INF) ++nrest;
          if (nrest == 0) record();
          int64_t slo = lo, s = a;
          const int64_t pieces = nrest > 0 ? nzero + 1 : 0;
          for (int64_t piece = 0; piece < pieces; ++piece) {
            int64_t shi = hi;
            while (s < e - 1) {
              ++s;
              if (cuts[s - 1] == 0) {
                shi = s;
                break;
              }
            }
            int64_t cnt = 0;
            for (int64_t i = 0; i < k; ++i) {
              int64_t u = opn[i];
              if (mu[u] < INF && slo <= inst.first[u] && inst.first[u] < shi) ++cnt;
            }
            if (cnt > 0) {
              const bool re = residual && cnt > 1;
              const int64_t base = push(re ? 3 * cnt : cnt);
              if (base < 0) {
                status = OVERFLOW;
                break;
              }
              int64_t* sub = ws + base;
              for (int64_t i = 0, j = 0; i < k; ++i) {
                int64_t u = opn[i];
                if (mu[u] < INF && slo <= inst.first[u] && inst.first[u] < shi) sub[j++] = u;
              }
              if (re) {  // NOTE [ residual preorders ]: its own ranks while it runs
                int64_t* given = ws + base + cnt;
                int64_t* old = ws + base + 2 * cnt;
                for (int64_t q = 0; q < cnt; ++q) {
                  given[q] = sub[q];
                  old[q] = rank[sub[q]];
                }
                status = rerank(sub, cnt, slo, shi);
                if (status == FOUND) status = node(sub, cnt, slo, shi, -1, -1);
                for (int64_t q = 0; q < cnt; ++q) rank[given[q]] = old[q];
              } else {
                status = node(sub, cnt, slo, shi, -1, -1);
              }
              count[TOP] = base;
              if (status != FOUND) break;
            }
            slo = shi;
          }
        }
        for (int64_t s2 = a; s2 < e - 1; ++s2) ++cuts[s2];
      }
      for (int64_t s = a; s < e; ++s) total[s] += sz;
      for (int64_t t = tp - 1; t >= trail0; --t) mu[trail_buf[t]] = trail_old[t];
      count[TRAIL] = trail0;
      mu[b] = off;
      offset[b] = -1;
      if (status != NOT_FOUND) {
        count[TOP] = frame;
        return status;
      }
      if (hatless) break;  // MiniMalloc's hatless pruning
    }
    memo.add(h1, h2);
    count[TOP] = frame;
    return NOT_FOUND;
  }

  // Search part[0..np) (in rank order) over [lo, hi), split first where no buffer crosses.
  int run_part(const int64_t* part, int64_t np, int64_t lo, int64_t hi) {
    int status = FOUND;
    int64_t start = lo;
    for (int64_t s = lo; s < hi; ++s) {
      if (s == hi - 1 || cuts[s] == 0) {
        int64_t cnt = 0;
        for (int64_t i = 0; i < np; ++i)
          if (start <= inst.first[part[i]] && inst.first[part[i]] <= s) ++cnt;
        if (cnt > 0) {
          const int64_t base = push(cnt);
          if (base < 0) return OVERFLOW;
          int64_t* sub = ws + base;
          for (int64_t i = 0, j = 0; i < np; ++i)
            if (start <= inst.first[part[i]] && inst.first[part[i]] <= s) sub[j++] = part[i];
          status = node(sub, cnt, start, s + 1, -1, -1);
          count[TOP] = base;
          if (status != FOUND) return status;
        }
        start = s + 1;
      }
    }
    return status;
  }
};

struct WorkStack {
  std::unique_ptr<int64_t[]> data;
  int64_t size = 0;
  explicit WorkStack(int64_t entries) : data(new int64_t[entries]), size(entries) {}
  void grow() {
    size = 2 * size + 1;
    data.reset(new int64_t[size]);
  }
};

// A zeroed table of ``slots`` 64-bit entries for the failed-state memo, freed with std::free. Its
// slots are hit at random, so on Linux it asks for transparent huge pages (as numpy does for
// large arrays): a 16 MiB table then costs 8 page faults instead of thousands, each of which would
// zero a 4 KiB page.
uint64_t* zeroed_table(int64_t slots) {
  const std::size_t bytes = static_cast<std::size_t>(slots) * sizeof(uint64_t);
  void* p = nullptr;
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  if (bytes >= (std::size_t(4) << 20) && posix_memalign(&p, std::size_t(2) << 20, bytes) == 0) {
    madvise(p, bytes, MADV_HUGEPAGE);
    std::memset(p, 0, bytes);
    return static_cast<uint64_t*>(p);
  }
#endif
  p = std::calloc(bytes / sizeof(uint64_t), sizeof(uint64_t));
  if (p == nullptr) throw std::bad_alloc();
  return static_cast<uint64_t*>(p);
}

}  // namespace

FailedStates::FailedStates(int64_t slots, int64_t buffers, const char* what)
    : slots_(slots > 0 ? slots : buffers >= 64 ? int64_t(1) << 20 : int64_t(1) << 12),
      h1_(nullptr, std::free),
      h2_(nullptr, std::free) {
  if (slots_ < 4 || (slots_ & (slots_ - 1)) != 0)
    throw std::invalid_argument(std::string(what) + ": memo_slots must be a power of two >= 4");
  h1_.reset(zeroed_table(slots_));
  h2_.reset(zeroed_table(slots_));
}

Search::Search(Instance instance, int64_t memo_slots)
    : inst_(std::move(instance)), memo_(memo_slots, inst_.n, "AllocSearch") {}

namespace {

// The state of the runs at one capacity, allocated once and reset for each run.
struct RunState {
  std::vector<int64_t> maxm, trail_buf, trail_old, sec_stamp, empty_twins;
  std::vector<double> fws;
  int64_t stamp = 0;  // section stamps only need to differ: they go on rising across runs
  RunState(const Instance& inst, int64_t capacity)
      : maxm(inst.n),
        trail_buf(inst.ov_buf.size() + 1),
        trail_old(inst.ov_buf.size() + 1),
        sec_stamp(inst.sections, 0),
        empty_twins(inst.n + 1, 0),
        fws(3 * inst.n, 0.0) {
    for (int64_t b = 0; b < inst.n; ++b) maxm[b] = capacity - inst.size[b];
  }
};

int one_run(const Instance& inst, const std::vector<int64_t>& part, int64_t lo, int64_t hi,
            int64_t capacity, int index, int64_t run_id, int64_t limit, WorkStack& stack,
            RunState& state, FailedStates& memo, Stop& stop,
            int64_t& counted, std::vector<int64_t>& solution) {
  const RunSpec& spec = RUNS[index];
  const std::vector<int64_t>& rank = inst.ranks[spec.rank];
  std::vector<int64_t> ordered(part);
  std::stable_sort(ordered.begin(), ordered.end(),
                   [&](int64_t p, int64_t q) { return rank[p] < rank[q]; });
  static const int64_t no_twins[1] = {0};
  while (true) {
    Run r{inst, stop, capacity, spec.residual, run_id, spec.letters, 3, nullptr, nullptr,
          {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, memo, {0, 0, 0, 0, 0, 0},
          stack.data.get(), stack.size, {}};
    r.tw_start = spec.twins ? inst.tw_start.data() : state.empty_twins.data();
    r.tw_buf = spec.twins ? inst.tw_buf.data() : no_twins;
    r.maxm.swap(state.maxm);
    r.trail_buf.swap(state.trail_buf);
    r.trail_old.swap(state.trail_old);
    r.sec_stamp.swap(state.sec_stamp);
    r.fws.swap(state.fws);
    r.mu.assign(inst.n, 0);
    r.offset.assign(inst.n, -1);
    r.solution.assign(inst.n, -1);
    r.total = inst.section_total;
    r.cuts = inst.cuts;
    r.rank = rank;
    r.count[LIMIT] = limit;
    r.count[STAMP] = state.stamp;
    int status = r.run_part(ordered.data(), int64_t(ordered.size()), lo, hi);
    state.stamp = r.count[STAMP];
    r.maxm.swap(state.maxm);
    r.trail_buf.swap(state.trail_buf);
    r.trail_old.swap(state.trail_old);
    r.sec_stamp.swap(state.sec_stamp);
    r.fws.swap(state.fws);
    if (status == OVERFLOW) {  // NOTE [ kernel work stack ]: again, with room to go deeper
      stack.grow();
      continue;
    }
    counted = std::min(r.count[NODES], limit);
    if (status == FOUND) solution = std::move(r.solution);
    return status;
  }
}

}  // namespace

int Search::rotate(const std::vector<int64_t>& buffers, int64_t lo, int64_t hi, int64_t capacity,
                   int64_t salt, int64_t budget, int64_t& nodes, std::vector<int64_t>& solution,
                   Stop& stop) {
  WorkStack stack(std::min(stack_size(int64_t(buffers.size())), STACK_CAP));
  RunState state(inst_, capacity);
  int64_t limit = std::max<int64_t>(int64_t(buffers.size()), 16);
  while (true) {
    limit *= 2;
    for (int index = 0; index < 6; ++index) {
      int64_t run_limit = limit;
      if (budget >= 0) {
        run_limit = std::min(limit, budget - nodes);
        if (run_limit <= 0) return ABORTED;
      }
      int64_t counted = 0;
      int status = one_run(inst_, buffers, lo, hi, capacity, index, 2 * index + salt, run_limit,
                           stack, state, memo_, stop, counted, solution);
      nodes += counted;
      if (status == FOUND || status == NOT_FOUND || status == TIMEOUT) return status;
    }
  }
}

PartResult Search::solve_part(const std::vector<int64_t>& part, int64_t lo, int64_t hi,
                              int64_t capacity, int64_t node_budget, int64_t nodes, bool tight,
                              Stop& stop) {
  PartResult result;
  int64_t part_peak = 0;
  for (int64_t s = lo; s < hi; ++s) part_peak = std::max(part_peak, inst_.section_total[s]);
  if (tight && part_peak < capacity) {
    // At the part's own peak live load first, briefly (NOTE [ compiled restarts ]).
    int64_t budget = nodes + 8 * int64_t(part.size());
    if (node_budget >= 0) budget = std::min(budget, node_budget);
    int status = rotate(part, lo, hi, part_peak, 1, budget, nodes, result.solution, stop);
    if (status == FOUND || status == TIMEOUT) {
      result.status = status;
      result.nodes = nodes;
      return result;
    }
  }
  result.status = rotate(part, lo, hi, capacity, 0, node_budget, nodes, result.solution, stop);
  result.nodes = nodes;
  return result;
}

PartResult Search::run_once(const std::vector<int64_t>& part, int64_t lo, int64_t hi,
                            int64_t capacity, int run, int64_t salt, int64_t node_limit,
                            int64_t stack_entries, Stop& stop) {
  if (run < 0 || run >= 6) throw std::invalid_argument("run: expected 0..5");
  PartResult result;
  WorkStack stack(stack_entries > 0 ? stack_entries
                                    : std::min(stack_size(int64_t(part.size())), STACK_CAP));
  RunState state(inst_, capacity);
  result.status = one_run(inst_, part, lo, hi, capacity, run, 2 * run + salt, node_limit, stack,
                          state, memo_, stop, result.nodes, result.solution);
  return result;
}

int64_t first_fit(const int64_t* lower, const int64_t* upper, const int64_t* size, int64_t n,
                  const int64_t* order, int64_t n_order, const int64_t* ov_start,
                  const int64_t* ov_buf, int64_t* offsets, int64_t limit, Stop& stop, Fit fit) {
  std::vector<int64_t> top(n, -1);  // -1 until placed (a buffer of size 0 stays at -1)
  for (int64_t b = 0; b < n; ++b)
    if (offsets[b] >= 0 && size[b] > 0) top[b] = offsets[b] + size[b];
  std::vector<int64_t> starts, ends, spans, tmp;
  // Without the list of overlaps, the buffers live at the same time come from an index of the
  // lifetimes (alloc_repair.hpp), not from a scan of all n.
  std::vector<int64_t> lows, ups;
  std::unique_ptr<TimeIndex> window;
  if (ov_start == nullptr) {
    lows.assign(lower, lower + n);
    ups.assign(upper, upper + n);
    window = std::make_unique<TimeIndex>(lows, ups);
  }
  for (int64_t k = 0; k < n_order; ++k) {
    if ((k & (ov_start != nullptr ? 1023 : 63)) == 0 && stop.due()) return k;
    const int64_t b = order[k], sz = size[b];
    if (offsets[b] >= 0) continue;  // placed beforehand
    if (sz <= 0) {
      offsets[b] = 0;
      continue;
    }
    starts.clear();
    ends.clear();
    auto meet = [&](int64_t u) {
      if (top[u] >= 0) {
        starts.push_back(offsets[u]);
        ends.push_back(top[u]);
      }
    };
    if (ov_start != nullptr) {
      for (int64_t t = ov_start[b]; t < ov_start[b + 1]; ++t) meet(ov_buf[t]);
    } else {
      window->each(lower[b], upper[b], [&](int64_t u) {
        if (u != b) meet(u);
      });
    }
    const int64_t cnt = int64_t(starts.size());
    spans.resize(cnt);
    tmp.resize(cnt);
    for (int64_t i = 0; i < cnt; ++i) spans[i] = i;
    // By start (the order of equal starts changes nothing below).
    stable_sort(spans.data(), cnt, tmp.data(),
                [&](int64_t p, int64_t q) { return starts[p] < starts[q]; });
    // x: the top of the buffers below the gap before spans[i]; the gaps in address order.
    int64_t x = 0, gap = -1, at = -1;
    for (int64_t i = 0; i < cnt; ++i) {
      const int64_t j = spans[i];
      if (starts[j] >= x + sz) {
        if (fit == Fit::first) break;
        if (gap < 0 || starts[j] - x < gap) gap = starts[j] - x, at = x;
      }
      if (ends[j] > x) x = ends[j];
    }
    if (at >= 0) x = at;  // best fit: the smallest gap, else the top of them all
    if (x + sz > limit) return -1 - k;
    offsets[b] = x;
    top[b] = x + sz;
  }
  return n_order;
}

}  // namespace memplan::alloc
