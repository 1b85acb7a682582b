// The chain-model join DP: NOTE [ heterogeneous join recurrences ] in
// memplan/algorithms/join/hetero.py. The states, their order, the operations and the ties are
// those of the reference (tests/oracles/join_table.py), so that every value and every decision
// is the same: per state, the branches in order, on each F_all a first, then the checkpoints
// x[q], q = a+1 .. l (the first of equals), a later option replacing an earlier one only when
// strictly faster. O(prod(l + 1) 2^k sum(l) W) time, O(prod(l + 1) 2^k W) memory.
#include "join_fill.hpp"

#include <algorithm>
#include <limits>
#include <tuple>

namespace memplan::join {

namespace {
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr int16_t kTurn = -2;
constexpr int16_t kNone = -1;

// The dense ids of the states (p, flags): ``(sum_j p_j stride_j) << k`` plus flag bit j.
struct Layout {
  int k;
  std::vector<int64_t> shape, stride;
  int64_t positions = 1;

  explicit Layout(const std::vector<JoinBranch>& br) : k(int(br.size())), shape(k), stride(k) {
    for (int j = k - 1; j >= 0; --j) {
      shape[j] = br[j].L + 1;
      stride[j] = positions;
      positions *= shape[j];
    }
  }
  int64_t ids() const { return positions << k; }
  int64_t id(const std::vector<int64_t>& p, unsigned flags) const {
    int64_t position = 0;
    for (int j = 0; j < k; ++j) position += p[j] * stride[j];
    return (position << k) | int64_t(flags);
  }
  void coordinates(int64_t position, std::vector<int64_t>& p) const {
    for (int j = 0; j < k; ++j) p[j] = (position / stride[j]) % shape[j];
  }
  // The states, sub-states first: p in decreasing lexicographic order, then the flags in
  // increasing lexicographic order (flags[0] most significant); a branch at 0 is standalone.
  std::vector<std::pair<int64_t, unsigned>> states() const {
    std::vector<std::pair<int64_t, unsigned>> found;  // (position, flag bits)
    for (int64_t position = positions - 1; position >= 0; --position) {
      for (unsigned lex = 0; lex < (1u << k); ++lex) {
        unsigned flags = 0;
        bool ok = true;
        for (int j = 0; j < k; ++j) {
          const unsigned f = (lex >> (k - 1 - j)) & 1u;
          flags |= f << j;
          if (f == 0 && (position / stride[j]) % shape[j] == 0) ok = false;
        }
        if (ok) found.emplace_back(position, flags);
      }
    }
    return found;
  }
};
// At state (p, flags): the standalone starts held, the gradients held, whether every branch is
// at its end (the turn is next).
std::tuple<int64_t, int64_t, bool> at_state(const std::vector<JoinBranch>& br,
                                            const std::vector<int64_t>& p, unsigned flags) {
  int64_t held = 0, total_g = 0;
  bool done = true;
  for (std::size_t j = 0; j < br.size(); ++j) {
    held += br[j].x[p[j]] * int64_t((flags >> j) & 1u);
    total_g += br[j].g[p[j]];
    done = done && p[j] == br[j].L;
  }
  return {held, total_g, done};
}
}  // namespace

bool join_fill(const std::vector<JoinBranch>& br, int64_t g_turn, int64_t turn_need,
               double t_turn, int64_t W, JoinTables& out, Stop& stop) {
  const Layout layout(br);
  const int k = layout.k;
  const int64_t ids = layout.ids();
  auto id_of = [&](const std::vector<int64_t>& p, unsigned flags) { return layout.id(p, flags); };
  const std::vector<std::pair<int64_t, unsigned>> states = layout.states();
  const int64_t n = int64_t(states.size());
  out.row.assign(ids, -1);
  for (int64_t r = 0; r < n; ++r) out.row[(states[r].first << k) | states[r].second] = r;
  out.value.assign(n * W, kInf);
  out.branch.assign(n * W, kNone);
  out.target.assign(n * W, 0);
  std::vector<int64_t> p(k);
  std::vector<double> low(W), forward;
  std::vector<int64_t> pick(W);
  for (int64_t r = 0; r < n; ++r) {
    if ((r & 63) == 0 && stop.due()) return false;
    const auto [position, flags] = states[r];
    layout.coordinates(position, p);
    double* val = out.value.data() + r * W;
    int16_t* bch = out.branch.data() + r * W;
    int16_t* tgt = out.target.data() + r * W;
    const auto [held, total_g, done] = at_state(br, p, flags);
    if (done) {
      for (int64_t m = held + turn_need; m < W; ++m) val[m] = t_turn, bch[m] = kTurn;
      continue;
    }
    for (int j = 0; j < k; ++j) {
      const JoinBranch& c = br[j];
      const int64_t a = p[j];
      if (a == c.L) continue;
      const int64_t others = total_g - c.g[a];
      const int64_t mine = c.x[a] * int64_t((flags >> j) & 1u);
      // (a) F_all a, the rest with branch j inside s[a], B a
      const int64_t s = c.s[a];
      const int64_t need = std::max({held + g_turn + s + c.fo[a],
                                     mine + s + others + c.g[a + 1] + c.g[a] + c.bo[a], mine + s});
      if (need < W) {
        p[j] = a + 1;
        const double* sub = out.value.data() + out.row[id_of(p, flags & ~(1u << j))] * W;
        p[j] = a;
        const int64_t shift = mine + s;
        const double own = c.ft[a] + c.bt[a];
        for (int64_t m = need; m < W; ++m) {
          const double cand = sub[m - shift] + own;
          if (cand < val[m]) val[m] = cand, bch[m] = int16_t(j), tgt[m] = 0;
        }
      }
      // (b) F_ck a, F_n .. up to the checkpoint x[q], q = a+1 .. l, the first of equals
      const int64_t seg = mine + others;
      std::fill(low.begin(), low.end(), kInf);
      double run = 0.0;
      bool any = false;
      for (int64_t q = a + 1; q <= c.L; ++q) {
        run = q == a + 1 ? c.ft[a] : run + c.ft[q - 1];  // sum ft[a..q-1], a running sum
        const int64_t needs = std::max(std::max(held + g_turn + c.fneed[a * (c.L + 1) + q], mine),
                                       seg);
        if (needs >= W) continue;
        any = true;
        p[j] = q;
        const double* sub = out.value.data() + out.row[id_of(p, flags | (1u << j))] * W;
        p[j] = a;
        const double* opt = c.opt + (a * c.L + (q - 1)) * W;
        for (int64_t m = needs; m < W; ++m) {
          const double cand = (run + sub[m - mine]) + opt[m - seg];
          if (cand < low[m]) low[m] = cand, pick[m] = q;
        }
      }
      if (!any) continue;
      for (int64_t m = 0; m < W; ++m)
        if (low[m] < val[m]) val[m] = low[m], bch[m] = int16_t(j), tgt[m] = int16_t(pick[m]);
    }
  }
  return true;
}

bool join_least(const std::vector<JoinBranch>& br, const std::vector<const int64_t*>& lmt,
                int64_t g_turn, int64_t turn_need, JoinLeast& out, Stop& stop) {
  const Layout layout(br);
  const int k = layout.k;
  const int64_t ids = layout.ids();
  out.need.assign(ids, 0);
  out.kind.assign(ids, 0);
  out.branch.assign(ids, 0);
  out.target.assign(ids, 0);
  std::vector<int64_t> p(k);
  int64_t count = 0;
  for (const auto& [position, flags] : layout.states()) {
    if ((count++ & 255) == 0 && stop.due()) return false;
    layout.coordinates(position, p);
    const int64_t here = layout.id(p, flags);
    const auto [held, total_g, done] = at_state(br, p, flags);
    if (done) {
      out.need[here] = held + turn_need;
      out.kind[here] = 1;
      continue;
    }
    bool found = false;
    int64_t best = 0;
    for (int j = 0; j < k; ++j) {
      const JoinBranch& c = br[j];
      const int64_t a = p[j];
      if (a == c.L) continue;
      const int64_t others = total_g - c.g[a];
      const int64_t mine = c.x[a] * int64_t((flags >> j) & 1u);
      const int64_t s = c.s[a];
      p[j] = a + 1;
      const int64_t next = out.need[layout.id(p, flags & ~(1u << j))];
      p[j] = a;
      const int64_t n_a = std::max({held + g_turn + s + c.fo[a], mine + s + next,
                                    mine + s + others + c.g[a + 1] + c.g[a] + c.bo[a]});
      if (!found || n_a < best) {
        found = true;
        best = n_a;
        out.kind[here] = 2, out.branch[here] = int16_t(j), out.target[here] = 0;
      }
      // The checkpoints x[q], q = a+1 .. l: the least (the first of equals) must beat F_all.
      int64_t least = 0, at = -1;
      for (int64_t q = a + 1; q <= c.L; ++q) {
        p[j] = q;
        const int64_t sub = out.need[layout.id(p, flags | (1u << j))];
        p[j] = a;
        const int64_t forward = held + g_turn + c.fneed[a * (c.L + 1) + q];
        const int64_t n_b = std::max(std::max(forward, mine + sub),
                                     mine + others + lmt[j][a * c.L + (q - 1)]);
        if (at < 0 || n_b < least) least = n_b, at = q;
      }
      if (least < best) {
        best = least;
        out.kind[here] = 3, out.branch[here] = int16_t(j), out.target[here] = int16_t(at);
      }
    }
    out.need[here] = best;
  }
  return true;
}

}  // namespace memplan::join
