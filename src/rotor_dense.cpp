// The dense rotor table that pofo and join read (NOTE [ rotor in C++ ] in rotor.hpp): opt(a, b)(m)
// and the option taken, for every sub-chain and every budget m = 0..capacity (slots).
//
// Only the budgets between a lower bound of the sub-chain's least memory and its store-all need
// are computed by the recurrence; from the store-all need on, the value is the sub-chain's lower
// bound (every forward and backward once), reached by F_all everywhere. The operations and their
// order are those of the reference (tests/oracles/rotor.py, dense_table): F_all a gives
// opt(a+1, b)(m - s[a]) + (ft[a] + bt[a]); the split x[j] gives (opt(j, b)(m - x[j]) + fprefix[j])
// + opt(a, j-1)(m), the least over j (the first on ties) minus fprefix[a]; F_all wins ties.
// O(L^3 S) time, O(L^2 S) memory.
#include "rotor_dense.hpp"

#include <algorithm>
#include <limits>

namespace memplan::rotor {

bool dense_table(const ChainRules& c, int64_t capacity, double* opt, int32_t* choice, Stop& stop) {
  const int64_t L = c.L, W = capacity + 1;
  const double inf = std::numeric_limits<double>::infinity();
  auto at = [&](int64_t a, int64_t b) { return (a * L + b) * W; };
  std::fill(opt, opt + L * L * W, inf);
  std::fill(choice, choice + L * L * W, CHOICE_NONE);
  std::vector<double> fprefix(L + 1, 0.0), tprefix(L + 1, 0.0);
  for (int64_t k = 0; k < L; ++k) {
    fprefix[k + 1] = fprefix[k] + c.ft[k];
    tprefix[k + 1] = tprefix[k] + (c.ft[k] + c.bt[k]);
  }
  std::vector<int64_t> hi(L * L, 0);
  std::vector<double> shifted((L + 1) * W);  // [j, m]: opt(j, b)(m - x[j]) + fprefix[j]
  std::vector<double> best(W);
  std::vector<int64_t> best_row(W);
  std::vector<int64_t> fwd_need(L);
  for (int64_t b = 0; b < L; ++b) {
    std::fill(shifted.begin(), shifted.end(), inf);
    int64_t backward_floor = 0;
    for (int64_t a = b; a >= 0; --a) {
      if (stop.due()) return false;
      backward_floor = std::max(backward_floor, c.backward_need(int(a), int(b)));
      const int64_t need_fa = c.fall_need(int(a), int(b));
      hi[a * L + b] = a == b ? need_fa : std::max(need_fa, c.s[a] + hi[(a + 1) * L + b]);
      const int64_t lo = c.least_bound(backward_floor, int(b));
      const int64_t top = std::min(hi[a * L + b], W);
      double* row = opt + at(a, b);
      int32_t* picks = choice + at(a, b);
      if (top < W) {
        const double lower_bound = tprefix[b + 1] - tprefix[a];
        std::fill(row + top, row + W, lower_bound);
        std::fill(picks + top, picks + W, CHOICE_F_ALL);
      }
      if (a < b && lo < top) {
        const double fa_time = c.ft[a] + c.bt[a];
        // Option 2: the least over the splits, the first on ties.
        std::fill(best.begin() + lo, best.begin() + top, inf);
        std::fill(best_row.begin() + lo, best_row.begin() + top, 0);
        int64_t run = 0;
        for (int64_t r = 0; r < b - a; ++r) {
          run = r == 0 ? c.forward_step(int(a), 0) : std::max(run, c.forward_step(int(a), int(r)));
          fwd_need[r] = c.g[b + 1] + run;
          const int64_t j = a + 1 + r;
          const double* right = shifted.data() + j * W;
          const double* left = opt + at(a, j - 1);
          const int64_t from = std::max(lo, std::min(fwd_need[r], top));
          for (int64_t m = from; m < top; ++m) {
            double cand = right[m] + left[m];
            if (cand < best[m]) {
              best[m] = cand;
              best_row[m] = r;
            }
          }
        }
        const double* next = opt + at(a + 1, b);
        const int64_t first = std::max(lo, std::max(c.s[a], need_fa));
        for (int64_t m = lo; m < top; ++m) {
          double fa = (m >= first ? next[m - c.s[a]] : inf) + fa_time;
          double split = best[m] - fprefix[a];
          if (fa <= split) {
            row[m] = fa;
            picks[m] = fa < inf ? CHOICE_F_ALL : CHOICE_NONE;
          } else {
            row[m] = split;
            picks[m] = split < inf ? int32_t(best_row[m] + a + 1) : CHOICE_NONE;
          }
        }
      }
      if (a >= 1 && c.x[a] < W) {
        double* to = shifted.data() + a * W;
        const double fa = fprefix[a];
        for (int64_t m = c.x[a]; m < W; ++m) to[m] = row[m - c.x[a]] + fa;
      }
    }
  }
  return true;
}

}  // namespace memplan::rotor
