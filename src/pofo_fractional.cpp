// pofo's Theorem 1 DP: NOTE [ pofo fractional recurrences ] (B.1, B.2, B.3) and NOTE [ pofo
// pruning ] in memplan/algorithms/combined/fractional.py. The operations, their order and the
// float32 rounding of the forward tables are those of the references
// (tests/oracles/pofo_forward.py), so that values and decisions are the same, entry for entry and
// state for state. Backward: per (m, D), F_all a, then the checkpoints x[j] (the first of
// equals), F_all winning ties. Forward: per state, the options in the order F_all a (kept,
// offloaded), then F_ck a .. F_n j-1 for j = a+1 .. a + window (kept, offloaded), the first of
// equals kept.
#include "pofo_fractional.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

namespace memplan::pofo {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kEps = 1e-9;
constexpr int32_t kTail = -2;
constexpr int32_t kNone = -3;
constexpr int32_t kFAll = -1;

// What F_all a adds beyond s[a]: its own overhead when the chain has one, else the forward's.
inline int64_t fall_overhead(const FractionalChain& c, int64_t a) {
  return c.fa != nullptr ? c.fa[a] : c.fo[a];
}

// Lemma 1's idle time max(0, excess) / beta (with no bandwidth, only excess <= 0 is free).
inline double idle_time(double excess, double beta) {
  if (beta > 0) return excess > 0 ? excess / beta : 0.0;
  return excess > 0 ? kInf : 0.0;
}

// Slots still to move: ceil(v - eps) clipped to [0, 2^30] (-inf is 0), without a call to ceil.
inline int64_t slots_to_move(double v) {
  const double o = v - kEps;
  constexpr int64_t most = int64_t(1) << 30;
  if (!(o > 0)) return 0;
  if (o >= double(most)) return most;
  int64_t i = int64_t(o);
  return double(i) < o ? i + 1 : i;
}

// One first operation of a segment, what does not depend on the state.
struct Option {
  int64_t j;           // a for F_all a, else the checkpoint x[j]
  int64_t next;        // 2 a' + kind' of the next segment
  int64_t nt;          // slots of the next segment's input
  double lem;          // Lemma 1's peak over the forwards (without the state)
  double window;       // forward time of the segment
  int64_t first, rest;  // F_ck: the first forward's need, the others' (F_all: both the need)
  const double* back;  // F_ck: CA[a][j-1] (W x D); F_all: nullptr
};

class Forward {
 public:
  Forward(const FractionalChain& c, Stop& stop)
      : c_(c), stop_(stop), size_(c.W * c.D * c.D), versions_(c.beta > 0 ? 2 : 1) {}

  FractionalForward run(double bound, int64_t beam, double tolerance) {
    FractionalForward out;
    if (bound == kInf) {
      if (!reachable(out)) return stopped(out);
    } else {
      const double slack = 1 + tolerance;
      double limit = bound * slack + tolerance;
      double found = kInf;
      if (!reach(limit, beam, out, found)) return stopped(out);
      limit = std::min(limit, found * slack + tolerance);
      if (!reach(limit, 0, out, found)) return stopped(out);
    }
    if (!evaluate(out)) return stopped(out);
    return out;
  }

 private:
  const FractionalChain& c_;
  Stop& stop_;
  const int64_t size_;
  const int versions_;

  static FractionalForward& stopped(FractionalForward& out) {
    out.stopped = true;
    return out;
  }

  int64_t t_size(int64_t a, int kind) const { return kind == 0 ? c_.x[a] : c_.s[a - 1]; }

  double idle(double excess) const { return idle_time(excess, c_.beta); }

  static int64_t ceil_slots(double v) { return slots_to_move(v); }

  // The options of segment a < L - 1 (NOTE [ pofo fractional recurrences ], B.1).
  std::vector<Option> options(int64_t a) const {
    const int64_t L = c_.L, gL = c_.g[L];
    std::vector<Option> found;
    const int64_t nF = gL + c_.s[a] + fall_overhead(c_, a), nB = c_.own_b[a];
    const int64_t need = std::max(nF, nB);
    found.push_back({a, 2 * (a + 1) + 1, c_.s[a], double(nF), c_.ft[a], need, need, nullptr});
    const int64_t top = std::min(L - 1, a + c_.window);
    double lem = -kInf;
    int64_t first = 0, rest = 0;
    for (int64_t j = a + 1; j <= top; ++j) {
      const int64_t i = j - a - 1;  // the forward of stage a + i joins the segment
      const int64_t n = i == 0 ? gL + c_.x[a + 1] + c_.fo[a]
                               : gL + c_.x[a + i] + c_.x[a + i + 1] + c_.fo[a + i];
      if (i == 0) {
        first = n;
      } else {
        rest = std::max(rest, n);
      }
      lem = std::max(lem, double(n) - c_.beta * (c_.fp[a + i] - c_.fp[a]));
      const double* back = c_.near + ((a * c_.window) + (j - 1 - a)) * c_.W * c_.D;
      found.push_back({j, 2 * j, c_.x[j], lem, c_.fp[j] - c_.fp[a], first, rest, back});
    }
    return found;
  }

  // Every option from state (K, F, B) of segment a with input t: visit(code, next, index, cost)
  // for the valid ones, in order.
  template <typename Visit>
  void each(const std::vector<Option>& opts, int64_t t, int64_t K, int64_t F, int64_t B,
            Visit&& visit) const {
    const int64_t D = c_.D, C = c_.C, avail = C - t - K;
    const int64_t row = std::min(std::max(avail, int64_t(0)), c_.W - 1) * D + B;
    // The segment's input stays when pinned (its first option's stage is the segment's).
    const int versions =
        !opts.empty() && c_.pinned != nullptr && c_.pinned[opts.front().j] ? 1 : versions_;
    for (const Option& o : opts) {
      bool fit[2];
      double back;
      if (o.back == nullptr) {  // F_all a: B a needs T back, kept or prefetched
        const int64_t a = o.j;
        back = c_.bt[a] + idle(double(c_.own_b[a] - avail + B));
        fit[0] = fit[1] = avail >= o.first;
      } else {
        back = o.back[row];
        fit[0] = avail >= std::max(o.first, o.rest);
        fit[1] = avail >= o.first && avail + t >= o.rest;
      }
      const double eps_f = idle((o.lem - double(avail)) + double(F));
      const double spent = o.window + eps_f;
      const double cost = spent + back;
      if (!std::isfinite(cost)) continue;
      int64_t moved_b = 0;
      double moved_f = 0.0;
      if (c_.beta > 0) {
        moved_f = c_.beta * spent;
        moved_b = ceil_slots(double(B) - c_.beta * back);
      }
      for (int v = 0; v < versions; ++v) {
        const int64_t K2 = K + (1 - v) * t;
        if (!fit[v] || K2 + o.nt > C) continue;
        int64_t index = K2 * D * D;
        if (c_.beta > 0) {
          const int64_t F2 = ceil_slots((double(F) + double(v * t)) - moved_f);
          const int64_t B2 = moved_b + v * t;
          if (F2 >= D || B2 >= D) continue;
          index = (K2 * D + F2) * D + B2;
        }
        visit(2 * o.j + v, o.next, index, cost);
      }
    }
  }

  // The loss (B.2) at a = L - 1, or the tail CA[a][L-1] before it.
  double last_time(int64_t a, int64_t t, int64_t K, int64_t F, int64_t B) const {
    const int64_t L = c_.L, avail = c_.C - t - K;
    const double beta = c_.beta;
    if (a == L - 1) {
      const int64_t nF = c_.g[L] + c_.s[a] + fall_overhead(c_, a), nB = c_.own_b[a];
      if (avail < std::max(nF, nB)) return kInf;
      const double eps_f = idle(double(nF - avail) + double(F));
      const double eps_b = idle(double(nB - avail) + double(B));
      double val = ((c_.ft[a] + c_.bt[a]) + eps_f) + eps_b;
      if (beta > 0)
        val = val + (std::max(double(F) - beta * (c_.ft[a] + eps_f), 0.0) +
                     std::max(double(B) - beta * (c_.bt[a] + eps_b), 0.0)) /
                        beta;
      return val;
    }
    if (avail < 0) return kInf;
    const int64_t row = std::min(avail, c_.W - 1);
    double tail = c_.last[(a * c_.W + row) * c_.D + B];
    if (beta > 0) tail = tail + (double(F) + std::max(double(B) - beta * tail, 0.0)) / beta;
    return tail;
  }

  void split(int64_t s, int64_t& K, int64_t& F, int64_t& B) const {
    const int64_t D = c_.D;
    K = s / (D * D);
    F = (s / D) % D;
    B = s % D;
  }

  // Every state that some choice of the segments before reaches.
  bool reachable(FractionalForward& out) {
    const int64_t L = c_.L;
    out.states.assign(2 * L, {});
    std::vector<std::vector<char>> marks(2 * L);
    marks[0].assign(size_, 0);
    marks[0][0] = 1;
    for (int64_t a = 0; a < L; ++a) {
      if (stop_.due()) return false;
      const std::vector<Option> opts = a < L - 1 ? options(a) : std::vector<Option>{};
      for (int kind = 0; kind < 2; ++kind) {
        std::vector<int64_t>& S = out.states[2 * a + kind];
        std::vector<char> mark = std::move(marks[2 * a + kind]);
        if (!mark.empty()) {
          S.reserve(std::count(mark.begin(), mark.end(), 1));
          for (int64_t s = 0; s < size_; ++s)
            if (mark[s]) S.push_back(s);
          mark = std::vector<char>();
        }
        if (a == L - 1) continue;
        const int64_t t = t_size(a, kind);
        for (int64_t s : S) {
          int64_t K, F, B;
          split(s, K, F, B);
          each(opts, t, K, F, B, [&](int64_t, int64_t next, int64_t index, double) {
            if (marks[next].empty()) marks[next].assign(size_, 0);
            marks[next][index] = 1;
          });
        }
      }
    }
    return true;
  }

  // The states reached within ``limit`` (time so far plus the lower bound R); with ``beam``, the
  // ``beam`` most promising of each segment only, and ``found`` the least time of a plan ended
  // from one of them.
  bool reach(double limit, int64_t beam, FractionalForward& out, double& found) {
    const int64_t L = c_.L, C = c_.C, W = c_.W, DD = c_.D * c_.D;
    const double* R = c_.relaxed;
    out.states.assign(2 * L, {});
    std::vector<std::vector<double>> so_far(2 * L);
    so_far[0].assign(size_, kInf);
    so_far[0][0] = 0.0;
    found = kInf;
    std::vector<std::pair<double, int64_t>> ranked;
    for (int64_t a = 0; a < L; ++a) {
      if (stop_.due()) return false;
      const std::vector<Option> opts = a < L - 1 ? options(a) : std::vector<Option>{};
      for (int kind = 0; kind < 2; ++kind) {
        std::vector<int64_t>& S = out.states[2 * a + kind];
        std::vector<double> times = std::move(so_far[2 * a + kind]);
        if (!times.empty()) {
          auto kept = [&](int64_t s) {
            if (!std::isfinite(times[s])) return false;
            const double promise = times[s] + R[a * W + C - s / DD];
            return promise <= limit && promise < kInf;
          };
          int64_t count = 0;
          for (int64_t s = 0; s < size_; ++s) count += kept(s);
          S.reserve(beam > 0 ? std::min(count, beam) : count);
          if (beam > 0 && count > beam) {
            ranked.clear();
            for (int64_t s = 0; s < size_; ++s)
              if (kept(s)) ranked.emplace_back(times[s] + R[a * W + C - s / DD], s);
            std::nth_element(ranked.begin(), ranked.begin() + beam, ranked.end());
            for (int64_t r = 0; r < beam; ++r) S.push_back(ranked[r].second);
            std::sort(S.begin(), S.end());
          } else {
            for (int64_t s = 0; s < size_; ++s)
              if (kept(s)) S.push_back(s);
          }
        }
        const int64_t t = t_size(a, kind);
        for (int64_t s : S) {
          int64_t K, F, B;
          split(s, K, F, B);
          const double before = times[s];
          if (beam > 0) found = std::min(found, before + last_time(a, t, K, F, B));
          if (a == L - 1) continue;
          each(opts, t, K, F, B, [&](int64_t, int64_t next, int64_t index, double cost) {
            const double total = before + cost;
            const int64_t kept = std::min(std::max(index / DD, int64_t(0)), C);
            const double promise = total + R[(next / 2) * W + C - kept];
            if (!(promise <= limit && promise < kInf)) return;
            std::vector<double>& into = so_far[next];
            if (into.empty()) into.assign(size_, kInf);
            into[index] = std::min(into[index], total);
          });
        }
      }
    }
    return true;
  }

  // OC on the states found, from the last segment back (flat float32 tables, INF where absent).
  bool evaluate(FractionalForward& out) {
    const int64_t L = c_.L;
    std::vector<std::vector<float>> flats(2 * L);
    out.choices.assign(2 * L, {});
    out.value = kInf;
    for (int64_t a = L - 1; a >= 0; --a) {
      if (stop_.due()) return false;
      const std::vector<Option> opts = a < L - 1 ? options(a) : std::vector<Option>{};
      for (int kind = 0; kind < 2; ++kind) {
        const std::vector<int64_t>& S = out.states[2 * a + kind];
        if (S.empty()) continue;
        out.evaluated += int64_t(S.size());
        std::vector<int16_t>& choice = out.choices[2 * a + kind];
        choice.assign(S.size(), int16_t(kNone));
        const int64_t t = t_size(a, kind);
        std::vector<float> flat(size_, std::numeric_limits<float>::infinity());
        for (std::size_t i = 0; i < S.size(); ++i) {
          int64_t K, F, B;
          split(S[i], K, F, B);
          double best = last_time(a, t, K, F, B);
          int32_t picked = std::isfinite(best) ? kTail : kNone;
          if (a < L - 1) {
            each(opts, t, K, F, B, [&](int64_t code, int64_t next, int64_t index, double cost) {
              const std::vector<float>& table = flats[next];
              if (table.empty()) return;
              const double total = cost + double(table[index]);
              if (total < best) {
                best = total;
                picked = int32_t(code);
              }
            });
          }
          flat[S[i]] = float(best);
          choice[i] = int16_t(picked);
        }
        if (a == 0 && kind == 0) out.value = double(flat[0]);
        flats[2 * a + kind] = std::move(flat);
      }
      // No segment before a reaches a + window: its tables are freed (a move, not ``= {}``,
      // which would keep the capacity).
      for (int64_t k = a + c_.window; k < std::min(L, a + c_.window + 1); ++k)
        flats[2 * k] = std::vector<float>(), flats[2 * k + 1] = std::vector<float>();
    }
    return true;
  }
};

}  // namespace

bool fractional_backward(const FractionalChain& c, FractionalBackward& out, Stop& stop) {
  const int64_t L = c.L, W = c.W, D = c.D, w = c.window;
  const double beta = c.beta;
  const int64_t plane = W * D;
  out.near.assign(std::max<int64_t>(L - 1, 0) * w * plane, kInf);
  out.near_choice.assign(out.near.size(), int16_t(kNone));
  out.last.assign(L * plane, kInf);
  out.last_choice.assign(out.last.size(), int16_t(kNone));
  auto idle = [&](double excess) { return idle_time(excess, beta); };
  auto ceil_slots = [](double v) { return slots_to_move(v); };
  // CA[a][b] (b - a < w, or b = L - 1).
  auto table = [&](int64_t a, int64_t b) -> double* {
    return b == L - 1 ? out.last.data() + a * plane : out.near.data() + (a * w + (b - a)) * plane;
  };
  auto picks = [&](int64_t a, int64_t b) -> int16_t* {
    return b == L - 1 ? out.last_choice.data() + a * plane
                      : out.near_choice.data() + (a * w + (b - a)) * plane;
  };
  std::vector<double> fa(plane), lem(w + 1);
  std::vector<int64_t> top(w + 1);
  std::vector<const double*> t2s(w + 1), t1s(w + 1);
  for (int64_t b = 0; b < L; ++b) {
    if (stop.due()) return false;
    int64_t floor = 0;
    const bool tail = b == L - 1;
    const int64_t stop_a = tail ? -1 : std::max<int64_t>(-1, b - w);
    for (int64_t a = b; a > stop_a; --a) {
      double* values = table(a, b);
      int16_t* choices = picks(a, b);
      const int64_t nF = c.g[b + 1] + c.s[a] + fall_overhead(c, a), nB = c.own_b[a];
      floor = std::max(floor, nB);
      const int64_t lo = std::max(floor, c.g[b + 1] + c.s[b] + fall_overhead(c, b));  // as rotor
      if (lo >= W) continue;
      if (a == b) {
        const double own = c.ft[a] + c.bt[a];
        const double nf = double(nF) - c.bt[a] * beta;
        for (int64_t m = lo; m < W; ++m) {
          for (int64_t d = 0; d < D; ++d) {
            double val = own + std::max(idle((nf - double(m)) + double(d)),
                                        idle((double(nB) - double(m)) + double(d)));
            if (d > m) val = kInf;
            values[m * D + d] = val;
            choices[m * D + d] = int16_t(std::isfinite(val) ? kFAll : kNone);
          }
        }
        continue;
      }
      // F_all a, then a+1..b with m - s[a], then B a.
      const double* next = table(a + 1, b);
      const int64_t need = std::max(nF, nB);
      const double own = c.ft[a] + c.bt[a];
      for (int64_t m = lo; m < W; ++m) {
        for (int64_t d = 0; d < D; ++d) {
          const double eps_b = idle((double(nB) - double(m)) + double(d));
          const int64_t d1 = beta > 0 ? ceil_slots(double(d) - beta * (c.bt[a] + eps_b)) : 0;
          const int64_t mi = m - c.s[a];
          const double sub = (mi >= 0 && d1 < D) ? next[mi * D + d1] : kInf;
          const int64_t d2 = beta > 0 ? ceil_slots(double(d1) - beta * sub) : d1;
          double v = ((own + sub) + idle((double(nF) - double(m)) + double(d2))) + eps_b;
          if (m < need) v = kInf;
          fa[m * D + d] = v;
        }
      }
      // F_ck a, F_n .. j-1 keeping x[j], j = a+1 .. a+n (row i = j - a - 1).
      const int64_t n = std::min(b, a + w) - a;
      double acc = -kInf;
      int64_t run = 0;
      for (int64_t i = 0; i < n; ++i) {
        const int64_t need_i = i == 0 ? c.g[b + 1] + c.x[a + 1] + c.fo[a]
                                      : c.g[b + 1] + c.x[a + i] + c.x[a + i + 1] + c.fo[a + i];
        acc = std::max(acc, double(need_i) + beta * c.fp[a + i + 1]);
        lem[i] = acc - beta * c.fp[a + i + 1];
        run = i == 0 ? need_i : std::max(run, need_i);
        top[i] = run;
        t2s[i] = table(a, a + i);     // CA[a][j-1]
        t1s[i] = table(a + 1 + i, b);  // CA[j][b]
      }
      for (int64_t m = lo; m < W; ++m) {
        for (int64_t d = 0; d < D; ++d) {
          double low = kInf;
          int64_t at = 0;
          bool first = true;
          for (int64_t i = 0; i < n; ++i) {
            const int64_t j = a + 1 + i;
            const double t2 = t2s[i][m * D + d];
            const int64_t d1 = beta > 0 ? ceil_slots(double(d) - beta * t2) : 0;
            const int64_t mi = m - c.x[j];
            const double t1 = (mi >= 0 && d1 < D) ? t1s[i][mi * D + d1] : kInf;
            const int64_t d2 = beta > 0 ? ceil_slots(double(d1) - beta * t1) : d1;
            double ck = idle((lem[i] - double(m)) + double(d2));
            ck += c.fp[a + i + 1] - c.fp[a];
            ck += t1;
            ck += t2;
            if (m < top[i]) ck = kInf;
            if (first || ck < low) low = ck, at = i, first = false;
          }
          const double f = fa[m * D + d];
          const bool take_fa = f <= low;
          double val = take_fa ? f : low;
          if (d > m) val = kInf;
          values[m * D + d] = val;
          choices[m * D + d] =
              int16_t(std::isfinite(val) ? (take_fa ? kFAll : int32_t(at + a + 1)) : kNone);
        }
      }
    }
  }
  return true;
}

FractionalForward fractional_forward(const FractionalChain& chain, double bound, int64_t beam,
                                     double tolerance, Stop& stop) {
  return Forward(chain, stop).run(bound, beam, tolerance);
}

}  // namespace memplan::pofo
