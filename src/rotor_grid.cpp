// The rotor DP on a slot grid (NOTE [ rotor in C++ ] in rotor.hpp).
//
// NOTE [ rotor grid layout ]
// The sizes are rounded up to slots (rotor.py's slot_sizes). A sub-chain (a, b) keeps a row only
// over [start, top): ``start`` the least budget the top problem asks of it (NOTE [ rotor grid
// reach ]), ``top = min(hi, W)``, ``hi`` its store-all need. Reading (a, b) at m gives infinity
// below ``start``, its lower bound ``tp`` (every forward and backward once, its store-all plan)
// from ``top`` on, the stored cell between; stored budgets beyond the last one asked are
// infinite. A budget asked of a sub-chain only asks its parts for budgets asked of them, or below
// their least memory (infinite in both), or from their ``hi`` on (``tp`` in both), so every value
// that the top problem and the backtrack read is the dense reference's, operation for operation
// (tests/oracles/rotor.py: grid_table, grid_backtrack).
//
// NOTE [ rotor grid reach ]
// The budgets a sub-chain is asked are propagated from the top, row a by row, on bit sets (64
// budgets a word): (a, b) is asked, within its window [lo, hi), the budgets that (a, b' >= b) is
// asked by the rows above it ((a' < a, b') with x[a] more, (a - 1, b') with s[a - 1] more). On 10
// stages at 500 slots this leaves 5-15% of the cells of the full windows. Each row is then filled
// over its whole asked range at once, budgets innermost, in loops the compiler vectorizes.
//
// O(L^3 S) time in the worst case, O(L^2 S) memory for L stages and S slots.
#include "rotor_grid.hpp"

#include <algorithm>
#include <limits>

namespace memplan::rotor {

void round_sizes(const int64_t* raw, int64_t* out, int64_t count, int64_t num, int64_t den) {
  for (int64_t i = 0; i < count; ++i) {
    __int128 p = static_cast<__int128>(raw[i]) * den;
    __int128 q = p / num;
    if (q * num < p) q += 1;
    out[i] = static_cast<int64_t>(q);
  }
}

bool chain_bounds(const ChainRules& c, int64_t out[3]) {
  const int L = c.L;
  if (c.has_terms()) return false;  // the bounds are those of the model before the loop's terms
  int64_t total = 0;
  auto add = [&](const int64_t* v, int n) {
    for (int i = 0; i < n; ++i) {
      if (v[i] >= INT64_SAFE - total) return false;
      total += v[i];
    }
    return true;
  };
  if (!add(c.x, L + 1) || !add(c.s, L) || !add(c.g, L + 1) || !add(c.fo, L) || !add(c.bo, L))
    return false;
  const int64_t* x = c.x;
  const int64_t* s = c.s;
  const int64_t* g = c.g;
  const int64_t* fo = c.fo;
  std::vector<int64_t> later(L > 0 ? L : 1, 0);  // min over c > k of g[c + 1]
  int64_t smallest = g[L];
  for (int k = L - 2; k >= 0; --k) {
    smallest = std::min(smallest, g[k + 2]);
    later[k] = smallest;
  }
  const int64_t x0 = x[0];
  int64_t lower = x0 + g[L], upper = x0 + g[L], transient = 0;
  for (int k = 0; k < L; ++k) {
    int64_t own = c.own_backward(k);
    int64_t av = k > 0 ? std::min(x[k], s[k - 1]) : 0;
    int64_t forward_now = x0 + av + g[k + 1] + s[k] + fo[k];
    if (k < L - 1) {
      int64_t earlier = x0 + std::max(av + s[k] + fo[k] + later[k], s[k] + c.own_backward(k + 1));
      forward_now = std::min(forward_now, earlier);
    }
    lower = std::max({lower, x0 + av + own, forward_now});
    int64_t held_input = k > 0 ? x[k] : 0;
    upper = std::max({upper, x0 + held_input + g[k + 1] + s[k] + fo[k], x0 + held_input + own,
                      k > 0 ? x0 + g[k + 1] + transient : int64_t(0)});
    transient = std::max(transient, x[k + 1] + fo[k] + (k > 0 ? x[k] : 0));
  }
  int64_t held = x0, peak = x0 + g[L];
  for (int k = 0; k < L; ++k) {
    peak = std::max({peak, held + g[L] + s[k] + fo[k], held + s[k] + g[k + 1] + g[k] + c.bo[k]});
    held += s[k];
  }
  out[0] = lower;
  out[1] = upper;
  out[2] = peak;
  return true;
}

namespace {

constexpr uint64_t ALL = ~uint64_t(0);

inline uint64_t below(int64_t k) { return k >= 64 ? ALL : (uint64_t(1) << k) - 1; }

inline uint64_t span(int64_t w, int64_t first, int64_t end) {
  int64_t low = std::min<int64_t>(std::max<int64_t>(first - 64 * w, 0), 64);
  int64_t high = std::min<int64_t>(std::max<int64_t>(end - 64 * w, 0), 64);
  return below(high) & ~below(low);
}

// Word w of the bit set at bits[src..] shifted down by k budgets (up when k < 0).
inline uint64_t shifted_word(const uint64_t* bits, int64_t k, int64_t words, int64_t w) {
  int64_t i = w + (k >> 6);  // floor(k / 64)
  if (i >= words || i < -1) return 0;
  unsigned r = static_cast<unsigned>(k & 63);
  uint64_t v = i >= 0 ? bits[i] >> r : 0;
  if (r != 0 && i + 1 < words && i + 1 >= 0) v |= bits[i + 1] << (64 - r);
  return v;
}

inline int low_bit(uint64_t v) { return __builtin_ctzll(v); }
inline int high_bit(uint64_t v) { return 63 - __builtin_clzll(v); }

template <typename T>
class Grid final : public GridResult {
 public:
  Grid(const ChainRules& raw, const GridRequest& request) : request_(request) {
    L_ = raw.L;
    terms_ = raw.has_terms();
    // x, s, g, fo, bo, then (with the loop's terms) fa, wh, fr: rounded up but fr, rounded down.
    const int64_t n = (terms_ ? 8 : 5) * int64_t(L_) + (terms_ ? 3 : 2);
    raw_.assign(n, 0);
    std::copy(raw.x, raw.x + L_ + 1, raw_.begin());
    std::copy(raw.s, raw.s + L_, raw_.begin() + L_ + 1);
    std::copy(raw.g, raw.g + L_ + 1, raw_.begin() + 2 * L_ + 1);
    std::copy(raw.fo, raw.fo + L_, raw_.begin() + 3 * L_ + 2);
    std::copy(raw.bo, raw.bo + L_, raw_.begin() + 4 * L_ + 2);
    if (terms_) {
      for (int k = 0; k < L_; ++k) {
        raw_[5 * L_ + 2 + k] = raw.fall_overhead(k);
        raw_[7 * L_ + 3 + k] = raw.freed(k);
      }
      for (int k = 0; k <= L_; ++k) raw_[6 * L_ + 2 + k] = raw.wh ? raw.wh[k] : 0;
    }
    ft_.assign(raw.ft, raw.ft + L_);
    bt_.assign(raw.bt, raw.bt + L_);
    extra = request.extra;
  }

  int solve(Stop& stop) {
    if (request_.memory >= 0) {
      ChainRules bytes = rules(raw_);
      if (!chain_bounds(bytes, bounds)) return status = UNBOUNDED;
      if (request_.memory < bounds[0] || bounds[2] <= request_.memory) return status = SKIPPED;
    }
    const int64_t budget = std::max<int64_t>(request_.budget, 0);
    int64_t num = 1, den = 1;
    if (budget <= request_.slots) {
      capacity = budget;
    } else {
      num = budget;
      den = request_.slots;
      capacity = request_.slots;
    }
    W_ = capacity + extra + 1;
    sizes_.assign(raw_.size(), 0);
    const int64_t up = terms_ ? 7 * int64_t(L_) + 3 : int64_t(raw_.size());
    round_sizes(raw_.data(), sizes_.data(), up, num, den);
    for (int64_t i = up; i < int64_t(raw_.size()); ++i)  // the freed bytes: rounded down
      sizes_[i] = static_cast<int64_t>(static_cast<__int128>(raw_[i]) * den / num);
    c_ = rules(sizes_);
    const int64_t LL = int64_t(L_) * L_;
    lo_.assign(LL, 0);
    hi_.assign(LL, 0);
    first_.assign(LL, 0);
    last_.assign(LL, 0);
    start_.assign(LL, 0);
    top_.assign(LL, 0);
    base_.assign(LL, 0);
    sub_chain_bounds();
    if (!asked_budgets(stop)) return status = STOPPED;
    if (!fill_table(stop)) return status = STOPPED;
    tops_.resize(extra + 1);
    for (int64_t k = 0; k <= extra; ++k) tops_[k] = read(L_ - 1, capacity + k);
    if (!request_.trace) return status = OK;
    return status = trace(capacity);
  }

  std::vector<double> top_values() const override {
    return std::vector<double>(tops_.begin(), tops_.end());
  }

  int trace(int64_t budget) override {
    ops.clear();
    if (L_ == 0 || budget < 0 || budget >= W_) return INFEASIBLE;
    if (read(L_ - 1, budget) == inf()) return INFEASIBLE;
    return backtrack(budget);
  }

  double value(int a, int b, int64_t m) const override {
    return static_cast<double>(read(int64_t(a) * L_ + b, m));
  }

  std::vector<int64_t> asked(int a, int b) const override {
    std::vector<int64_t> found;
    const int64_t words = (W_ + 63) / 64;
    const uint64_t* mine = &bits_[(int64_t(a) * L_ + b) * words];
    for (int64_t w = 0; w < words; ++w)
      for (int i = 0; i < 64; ++i)
        if ((mine[w] >> i) & 1) found.push_back(64 * w + i);
    return found;
  }

 private:
  static T inf() { return std::numeric_limits<T>::infinity(); }

  ChainRules rules(const std::vector<int64_t>& v) const {
    ChainRules r;
    r.L = L_;
    r.x = v.data();
    r.s = v.data() + L_ + 1;
    r.g = v.data() + 2 * L_ + 1;
    r.fo = v.data() + 3 * L_ + 2;
    r.bo = v.data() + 4 * L_ + 2;
    r.ft = ft_.data();
    r.bt = bt_.data();
    if (terms_) {
      r.fa = v.data() + 5 * L_ + 2;
      r.wh = v.data() + 6 * L_ + 2;
      r.fr = v.data() + 7 * L_ + 3;
    }
    return r;
  }

  // lo[a, b]: a lower bound of the sub-chain's least memory; hi[a, b]: its store-all need.
  void sub_chain_bounds() {
    for (int b = 0; b < L_; ++b) {
      int64_t floor = 0, above = 0;
      for (int a = b; a >= 0; --a) {
        floor = std::max(floor, c_.backward_need(a, b));
        int64_t need_fa = c_.fall_need(a, b);
        above = a == b ? need_fa : std::max(need_fa, c_.held_after(a) + above);
        lo_[int64_t(a) * L_ + b] = c_.least_bound(floor, b);
        hi_[int64_t(a) * L_ + b] = above;
      }
    }
  }

  // NOTE [ rotor grid reach ].
  bool asked_budgets(Stop& stop) {
    const int64_t W = W_, L = L_;
    const int64_t words = (W + 63) / 64;
    const int64_t above = L * L * words;
    const int64_t inh = above + L * words;
    bits_.assign(inh + words, 0);
    const int64_t ask_from = capacity, ask_to = capacity + extra;
    for (int64_t a = 0; a < L; ++a) {
      if (stop.due()) return false;
      std::fill(bits_.begin() + inh, bits_.begin() + inh + words, 0);
      for (int64_t b = L - 1; b >= a; --b) {
        const int64_t ab = a * L + b;
        const int64_t mine = ab * words;
        const int64_t before = above + b * words;
        const int64_t up = (ab - L) * words;
        const int64_t w_lo = std::min(std::max<int64_t>(lo_[ab], 0), W);
        const int64_t w_hi = std::min(std::max(hi_[ab], w_lo), W);
        int64_t f = W, t = -1;
        if (w_lo < w_hi) {
          const int64_t w0 = w_lo / 64, w1 = (w_hi - 1) / 64;
          const uint64_t low_edge = ~below(w_lo - 64 * w0);
          const uint64_t high_edge = below(w_hi - 64 * w1);
          for (int64_t w = w0; w <= w1; ++w) {
            uint64_t window = ALL;
            if (w == w0) window &= low_edge;
            if (w == w1) window &= high_edge;
            uint64_t v;
            if (!request_.reach) {
              v = window;
            } else {
              uint64_t asked = 0;
              if (a == 0) {
                if (b == L - 1) asked = span(w, ask_from, ask_to + 1);
              } else {
                asked = shifted_word(&bits_[before], c_.x[a], words, w);
                asked |= shifted_word(&bits_[up], c_.held_after(int(a - 1)), words, w);
              }
              uint64_t direct = asked & window;
              v = direct | (bits_[inh + w] & window);
              bits_[inh + w] |= direct;
            }
            bits_[mine + w] = v;
            bits_[before + w] |= v;
            if (v != 0) {
              if (f == W) f = 64 * w + low_bit(v);
              t = 64 * w;
            }
          }
          if (t >= 0) t += high_bit(bits_[mine + t / 64]);
        }
        first_[ab] = f;
        last_[ab] = t;
      }
    }
    return true;
  }

  // The value of (a + 1, b) after F_all a at budget m of (a, b): at m - held_after(a), clamped
  // to the largest budget of the table (pessimistic, hence a plan that fits; only budgets that no
  // plan of the top problem reaches are clamped, NOTE [ rotor in bytes ] in rotor.py).
  T read_after_fall(int64_t a, int64_t b, int64_t m) const {
    return read((a + 1) * L_ + b, std::min(m - c_.held_after(int(a)), W_ - 1));
  }

  // The value of pair ab at budget m (NOTE [ rotor grid layout ]).
  T read(int64_t ab, int64_t m) const {
    if (m >= top_[ab]) return tp_[ab];
    if (m < start_[ab]) return inf();
    return table_[base_[ab] + m - start_[ab]];
  }

  bool fill_table(Stop& stop) {
    const int64_t L = L_, W = W_;
    int64_t total = 0;
    for (int64_t b = 0; b < L; ++b) {
      for (int64_t a = b; a >= 0; --a) {
        const int64_t ab = a * L + b;
        const int64_t t_top = std::min(hi_[ab], W);
        base_[ab] = total;
        if (first_[ab] <= last_[ab]) {
          start_[ab] = first_[ab];
          top_[ab] = t_top;
          total += t_top - first_[ab];
        } else {
          start_[ab] = t_top;
          top_[ab] = t_top;
        }
      }
    }
    cells = total;
    table_.assign(total, inf());
    tp_.assign(L * L, inf());
    found_.assign(W, inf());
    fprefix_.assign(L + 1, T(0));
    fa_times_.assign(L, T(0));
    std::vector<double> tprefix(L + 1, 0.0);
    double acc = 0.0, tacc = 0.0;
    for (int64_t k = 0; k < L; ++k) {
      acc += ft_[k];
      fprefix_[k + 1] = static_cast<T>(acc);
      double both = ft_[k] + bt_[k];
      tacc += both;
      tprefix[k + 1] = tacc;
      fa_times_[k] = static_cast<T>(both);
    }
    for (int64_t b = 0; b < L; ++b) {
      for (int64_t a = b; a >= 0; --a) {
        const int64_t ab = a * L + b;
        tp_[ab] = static_cast<T>(tprefix[b + 1] - tprefix[a]);
        if (a == b || first_[ab] > last_[ab]) continue;
        if (stop.due()) return false;
        row(a, b);
      }
    }
    return true;
  }

  // found[m] = min(found[m], (R(m) + fp_j) + L(m)) for m0 <= m < m1: the candidate of the split
  // x[j], R the right part (j, b) at m - x[j], L the left part (a, j - 1) at m, each a stored
  // cell or a constant (its tp).
  static void scan(T* found, int64_t m0, int64_t m1, const T* right, int64_t roff, T rconst,
                   bool rstored, const T* left, int64_t loff, T lconst, bool lstored, T fp_j) {
    const int64_t n = m1 - m0;
    T* out = found + m0;
    if (rstored && lstored) {
      const T* rv = right + (m0 - roff);
      const T* lv = left + (m0 - loff);
      for (int64_t i = 0; i < n; ++i) {
        T c = (rv[i] + fp_j) + lv[i];
        out[i] = c < out[i] ? c : out[i];
      }
    } else if (rstored) {
      const T* rv = right + (m0 - roff);
      for (int64_t i = 0; i < n; ++i) {
        T c = (rv[i] + fp_j) + lconst;
        out[i] = c < out[i] ? c : out[i];
      }
    } else if (lstored) {
      const T rc = rconst + fp_j;
      const T* lv = left + (m0 - loff);
      for (int64_t i = 0; i < n; ++i) {
        T c = rc + lv[i];
        out[i] = c < out[i] ? c : out[i];
      }
    } else {
      const T c = (rconst + fp_j) + lconst;
      for (int64_t i = 0; i < n; ++i) out[i] = c < out[i] ? c : out[i];
    }
  }

  // Row (a, b) at every budget from its first asked to its last, budgets innermost.
  void row(int64_t a, int64_t b) {
    const int64_t L = L_;
    const int64_t ab = a * L + b;
    const int64_t grad = c_.held_grads(int(b));
    const int64_t st = start_[ab], en = last_[ab] + 1;
    T* out = table_.data() + base_[ab];
    std::fill(out + (en - st), out + (top_[ab] - st), inf());
    // Option 1: F_all a, then a+1..b with m - held_after(a) slots.
    const int64_t sa = c_.held_after(int(a));
    const int64_t fa_from = std::min(std::max(st, std::max(sa, c_.fall_need(a, b))), en);
    std::fill(out, out + (fa_from - st), inf());
    if (fa_from < en && sa < 0) {  // F_all a frees more than it saves: read (a + 1, b) clamped
      for (int64_t m = fa_from; m < en; ++m) out[m - st] = read_after_fall(a, b, m) + fa_times_[a];
    } else if (fa_from < en) {
      const int64_t ch = ab + L;  // (a + 1, b)
      const int64_t cs = start_[ch], ct = top_[ch];
      const T ctp = tp_[ch];
      const T* child = table_.data() + base_[ch];
      const T fat = fa_times_[a];
      const int64_t m1 = std::min(std::max(cs + sa, fa_from), en);
      std::fill(out + (fa_from - st), out + (m1 - st), inf());
      const int64_t m2 = std::min(std::max(ct + sa, m1), en);
      T* into = out + (m1 - st);
      const T* from = child + (m1 - sa - cs);
      for (int64_t i = 0; i < m2 - m1; ++i) into[i] = from[i] + fat;
      std::fill(out + (m2 - st), out + (en - st), ctp + fat);
    }
    // Option 2: checkpoint x[j], j = a+1..b.
    T* found = found_.data();
    std::fill(found + st, found + en, inf());
    int64_t run = 0;
    for (int64_t r = 0; r < b - a; ++r) {
      const int64_t j = a + 1 + r;
      run = r == 0 ? c_.forward_step(int(a), 0) : std::max(run, c_.forward_step(int(a), int(r)));
      const int64_t fw = run + grad;
      if (fw >= en) break;  // the forward grows with j: no later split fits either
      const int64_t xj = c_.x[j];
      const int64_t rr = j * L + b;
      const int64_t ll = ab - b + j - 1;  // (a, j - 1)
      const int64_t rs = start_[rr], rt = top_[rr], ls = start_[ll], lt = top_[ll];
      int64_t p = std::max(std::max(st, fw), std::max(xj + rs, ls));
      const T* right = table_.data() + base_[rr];
      const T* left = table_.data() + base_[ll];
      const int64_t q_right = rt + xj;  // from here on the right part reads its tp
      const T fp_j = fprefix_[j];
      while (p < en) {
        const bool rstored = p < q_right, lstored = p < lt;
        int64_t next = en;
        if (rstored) next = std::min(next, q_right);
        if (lstored) next = std::min(next, lt);
        scan(found, p, next, right, xj + rs, tp_[rr], rstored, left, ls, tp_[ll], lstored, fp_j);
        p = next;
      }
    }
    const T fpa = fprefix_[a];
    for (int64_t i = 0; i < en - st; ++i) {
      T v = found[st + i] - fpa;
      out[i] = v < out[i] ? v : out[i];
    }
  }

  // The operations of opt(0, L-1)(budget): at each visited (a, b, m) the options are evaluated
  // with the table's operations, F_all a first, then the least j reaching the stored value.
  int backtrack(int64_t budget) {
    const int64_t L = L_;
    struct Item {
      int kind;  // 0: B a; 1: solve (a, b, m)
      int64_t a, b, m;
    };
    std::vector<Item> stack{{1, 0, L - 1, budget}};
    while (!stack.empty()) {
      Item it = stack.back();
      stack.pop_back();
      const int64_t a = it.a, b = it.b, m = it.m;
      if (it.kind == 0) {
        ops.push_back(4 * a + B);
        continue;
      }
      const int64_t ab = a * L + b;
      if (a == b || m >= hi_[ab]) {  // one stage, or the sub-chain's store-all fits
        for (int64_t k = a; k <= b; ++k) ops.push_back(4 * k + F_ALL);
        for (int64_t k = b; k >= a; --k) ops.push_back(4 * k + B);
        continue;
      }
      const T target = read(ab, m);
      const int64_t sa = c_.held_after(int(a));
      if (m >= c_.fall_need(int(a), int(b)) && m >= sa) {
        T fa = read_after_fall(a, b, m) + fa_times_[a];
        if (fa == target) {
          ops.push_back(4 * a + F_ALL);
          stack.push_back({0, a, a, 0});
          stack.push_back({1, a + 1, b, std::min(m - sa, W_ - 1)});
          continue;
        }
      }
      int64_t split = -1, run = 0;
      for (int64_t r = 0; r < b - a; ++r) {
        const int64_t j = a + 1 + r;
        run = r == 0 ? c_.forward_step(int(a), 0) : std::max(run, c_.forward_step(int(a), int(r)));
        if (run + c_.held_grads(int(b)) <= m && m - c_.x[j] >= 0) {
          T right = read(j * L + b, m - c_.x[j]);
          T left = read(ab - b + j - 1, m);
          T option = ((right + fprefix_[j]) + left) - fprefix_[a];
          if (option == target) {
            split = j;
            break;
          }
        }
      }
      if (split < 0) return NO_OPTION;
      ops.push_back(4 * a + F_CK);
      for (int64_t k = a + 1; k < split; ++k) ops.push_back(4 * k + F_N);
      stack.push_back({1, a, split - 1, m});
      stack.push_back({1, split, b, m - c_.x[split]});
    }
    return OK;
  }

  GridRequest request_;
  int L_ = 0;
  bool terms_ = false;
  int64_t W_ = 1;
  std::vector<int64_t> raw_, sizes_;
  std::vector<double> ft_, bt_;
  ChainRules c_;
  std::vector<int64_t> lo_, hi_, first_, last_, start_, top_, base_;
  std::vector<uint64_t> bits_;
  std::vector<T> table_, tp_, found_, fprefix_, fa_times_, tops_;
};

template <typename T>
std::unique_ptr<GridResult> run(const ChainRules& raw, const GridRequest& request, Stop& stop) {
  auto grid = std::make_unique<Grid<T>>(raw, request);
  grid->solve(stop);
  return grid;
}

}  // namespace

std::unique_ptr<GridResult> solve_grid(const ChainRules& raw, const GridRequest& request,
                                       Stop& stop) {
  if (request.single) return run<float>(raw, request, stop);
  return run<double>(raw, request, stop);
}

}  // namespace memplan::rotor
