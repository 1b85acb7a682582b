// The rotor DP in bytes: no slots, no rounding (NOTE [ rotor in bytes ], rotor.py, and NOTE
// [ rotor in C++ ] in rotor.hpp).
//
// opt(a, b)(m) is a non-increasing step function of the budget m; this DP keeps its steps, the
// frontier of (a, b): the budgets M_0 < M_1 < ... at which the least makespan drops, with those
// makespans and the option taken. The options act on frontiers exactly: F_all a shifts the
// frontier of (a+1, b) by held_after(a, o) (raised to what F_all a needs; the shift is negative
// when F_all a frees more of x[a] than it saves, and then the steps of (a+1, b) above the budget
// that were dropped are only asked at budgets no plan of the top problem reaches) and adds
// ft[a] + bt[a], once for each option o of stage a (its saved bytes, overheads and backward
// time: ChainRules); the split
// x[j] adds opt(j, b)(m - x[j]) + fprefix[j] and opt(a, j-1)(m), a sum that can only drop at a
// step of one of them, so it is evaluated at the steps of both (raised to what its forward
// needs), minus fprefix[a]. The frontier of (a, b) is the lower envelope of all these points:
// sorted by (budget, makespan, option), a point is a step when its makespan is below every point
// before it. Steps above the budget asked for are dropped. The candidate points are counted as
// the reference counts them (tests/oracles/rotor.py, exact_frontiers), and the DP gives up past
// ``work_limit`` exactly where the reference does, so that --slots auto picks the same path.
#include "rotor_exact.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace memplan::rotor {

namespace {

struct Frontier {
  std::vector<int64_t> memory;
  std::vector<double> time;
  std::vector<int32_t> choice;

  // Index of the step in force at ``budget`` (-1: infeasible).
  int64_t at(int64_t budget) const {
    auto it = std::upper_bound(memory.begin(), memory.end(), budget);
    return int64_t(it - memory.begin()) - 1;
  }
  double value(int64_t budget) const {
    int64_t i = at(budget);
    return i < 0 ? std::numeric_limits<double>::infinity() : time[i];
  }
};

struct Point {
  int64_t memory;
  double time;
  int32_t choice;
};

// Ties (the same budget and makespan) go to F_all under option 0, then its other options, then
// the least split: a plan uses an option only where it pays.
int64_t tie_rank(int32_t choice) {
  return choice == CHOICE_F_ALL ? std::numeric_limits<int64_t>::min() : int64_t(choice);
}

void envelope(std::vector<Point>& points, int64_t budget, Frontier& out) {
  points.erase(std::remove_if(points.begin(), points.end(),
                              [&](const Point& p) { return p.memory > budget || !std::isfinite(p.time); }),
               points.end());
  std::sort(points.begin(), points.end(), [](const Point& p, const Point& q) {
    if (p.memory != q.memory) return p.memory < q.memory;
    if (p.time != q.time) return p.time < q.time;
    return tie_rank(p.choice) < tie_rank(q.choice);
  });
  double best = std::numeric_limits<double>::infinity();
  for (std::size_t i = 0; i < points.size(); ++i) {
    if (i == 0 || points[i].time < best) {
      out.memory.push_back(points[i].memory);
      out.time.push_back(points[i].time);
      out.choice.push_back(points[i].choice);
    }
    best = std::min(best, points[i].time);
  }
}

}  // namespace

int exact_plan(const ChainRules& c, int64_t budget, double work_limit, Stop& stop,
               std::vector<int64_t>& ops, std::vector<int32_t>& option_of_op, double& makespan,
               int64_t& least) {
  const int64_t L = c.L;
  ops.clear();
  option_of_op.clear();
  least = -1;
  makespan = std::numeric_limits<double>::infinity();
  // The reference keys (segment, budget) pairs as segment * (budget + 1) + budget in int64.
  if (static_cast<__int128>(budget + 1) * (L + 2) >= (static_cast<__int128>(1) << 62))
    return EXACT_WORK_LIMIT;
  std::vector<double> fprefix(L + 1, 0.0);
  for (int64_t k = 0; k < L; ++k) fprefix[k + 1] = fprefix[k] + c.ft[k];
  std::vector<Frontier> fronts(L * L);  // (a, b) at a * L + b
  auto front = [&](int64_t a, int64_t b) -> Frontier& { return fronts[a * L + b]; };
  std::vector<int64_t> fwd(L);
  std::vector<Point> points;
  double work = 0.0;
  for (int64_t b = 0; b < L; ++b) {
    const double projected = work * std::pow(double(L) / double(std::max<int64_t>(b, 1)), 3.0);
    if ((b >= 8 && projected > 2 * work_limit) || (3 * b >= L && projected > work_limit))
      return EXACT_WORK_LIMIT;
    // Steps of the right parts (j, b), j > a, shifted by x[j] and kept within the budget.
    int64_t col_steps = 0;
    int64_t row_steps = 0;  // steps of the left parts (a, a..b-1)
    for (int64_t a = b; a >= 0; --a) {
      if (stop.due()) return EXACT_STOPPED;
      const int options = c.options(int(a));
      Frontier& out = front(a, b);
      if (a == b && options == 1) {
        const int64_t need_fa = c.fall_need(int(a), int(b));
        if (need_fa <= budget) {
          out.memory.push_back(need_fa);
          out.time.push_back(c.ft[a] + c.bt[a]);
          out.choice.push_back(CHOICE_F_ALL);
        }
      } else if (a == b) {
        points.clear();
        for (int o = 0; o < options; ++o)
          points.push_back({c.fall_need(int(a), int(b), o), c.ft[a] + c.backward_time(int(a), o),
                            fall_choice(o)});
        envelope(points, budget, out);
      } else {
        points.clear();
        const Frontier& next = front(a + 1, b);
        // F_all a under each option: the frontier of (a+1, b) shifted by what it holds after.
        for (int o = 0; o < options; ++o) {
          const int64_t need_fa = c.fall_need(int(a), int(b), o);
          const int64_t held = c.held_after(int(a), o);
          const double fa_time = c.ft[a] + c.backward_time(int(a), o);
          for (std::size_t i = 0; i < next.memory.size(); ++i)
            points.push_back({std::max(next.memory[i] + held, need_fa), next.time[i] + fa_time,
                              fall_choice(o)});
        }
        row_steps = 0;
        for (int64_t cseg = a; cseg < b; ++cseg) row_steps += int64_t(front(a, cseg).memory.size());
        int64_t run = 0;
        for (int64_t r = 0; r < b - a; ++r) {
          run = r == 0 ? c.forward_step(int(a), 0) : std::max(run, c.forward_step(int(a), int(r)));
          fwd[r] = run + c.held_grads(int(b));
        }
        for (int64_t j = a + 1; j <= b; ++j) {
          const Frontier& right = front(j, b);
          const Frontier& left = front(a, j - 1);
          const int64_t xj = c.x[j];
          const double fpj = fprefix[j];
          const int64_t need = fwd[j - a - 1];
          // The left part at the right part's steps ...
          for (std::size_t i = 0; i < right.memory.size(); ++i) {
            const int64_t m = right.memory[i] + xj;
            if (m > budget) break;
            const double v = left.value(m) + (right.time[i] + fpj);
            points.push_back({std::max(m, need), v - fprefix[a], int32_t(j)});
          }
          // ... and the right part at the left part's steps.
          for (std::size_t i = 0; i < left.memory.size(); ++i) {
            const int64_t m = left.memory[i];
            const double rv = right.value(m - xj);
            const double v = (std::isfinite(rv) ? rv + fpj : rv) + left.time[i];
            points.push_back({std::max(m, need), v - fprefix[a], int32_t(j)});
          }
        }
        envelope(points, budget, out);
        work += double(col_steps + row_steps) + double(next.memory.size()) * options;
        if (work > work_limit) return EXACT_WORK_LIMIT;
      }
      if (a >= 1) {
        for (int64_t m : out.memory) col_steps += m + c.x[a] <= budget ? 1 : 0;
      }
    }
  }
  // The plan, from the options recorded at the steps.
  struct Item {
    int kind;
    int64_t a, b, m;
  };
  if (L > 0 && !front(0, L - 1).memory.empty()) least = front(0, L - 1).memory.front();
  if (L == 0 || front(0, L - 1).at(budget) < 0) return EXACT_OK;
  makespan = front(0, L - 1).value(budget);
  std::vector<Item> stack{{1, 0, L - 1, budget}};
  while (!stack.empty()) {
    Item it = stack.back();
    stack.pop_back();
    if (it.kind == 0) {
      ops.push_back(4 * it.a + B);
      option_of_op.push_back(0);
      continue;
    }
    const Frontier& f = front(it.a, it.b);
    const int64_t i = f.at(it.m);
    const int32_t pick = f.choice[i];
    if (it.a == it.b) {
      ops.push_back(4 * it.a + F_ALL);
      ops.push_back(4 * it.a + B);
      option_of_op.push_back(option_of(pick));
      option_of_op.push_back(0);
    } else if (is_fall(pick)) {
      ops.push_back(4 * it.a + F_ALL);
      option_of_op.push_back(option_of(pick));
      stack.push_back({0, it.a, it.a, 0});
      stack.push_back({1, it.a + 1, it.b, it.m - c.held_after(int(it.a), option_of(pick))});
    } else {
      const int64_t j = pick;
      ops.push_back(4 * it.a + F_CK);
      option_of_op.push_back(0);
      for (int64_t k = it.a + 1; k < j; ++k) {
        ops.push_back(4 * k + F_N);
        option_of_op.push_back(0);
      }
      stack.push_back({1, it.a, j - 1, it.m});
      stack.push_back({1, j, it.b, it.m - c.x[j]});
    }
  }
  return EXACT_OK;
}

}  // namespace memplan::rotor
