// The rotor DP on a slot grid, restricted to the budgets the top problem asks (rotor_grid.cpp).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "rotor.hpp"
#include "stop.hpp"

namespace memplan::rotor {

// Status of a grid solve (and of a trace).
constexpr int OK = 0, INFEASIBLE = 1, SKIPPED = 2, NO_OPTION = -3, UNBOUNDED = -4, STOPPED = -5;
constexpr int64_t INT64_SAFE = int64_t(1) << 62;

struct GridRequest {
  int64_t budget = 0;   // activation bytes besides x[0]
  int64_t slots = 1;    // grid of ``slots`` slots of budget / slots bytes (1 byte when budget <= slots)
  int64_t extra = 0;    // also the top budgets capacity + 1 .. capacity + extra
  bool trace = true;    // backtrack at the capacity
  bool reach = true;    // rows over the asked budgets only (false: every budget of each window)
  int64_t memory = -1;  // >= 0: first the chain's least-memory bounds and store-all peak
  bool single = false;  // float32 values
};

// A filled table: its plan, its top values, more backtracks (the Python face of the grid).
class GridResult {
 public:
  virtual ~GridResult() = default;
  int status = OK;
  int64_t capacity = 0;
  int64_t extra = 0;
  int64_t cells = 0;
  int64_t bounds[3] = {0, 0, 0};  // with memory: least-memory lower, upper bounds; store-all peak
  std::vector<int64_t> ops;       // operations of the last trace, 4 * stage + code
  virtual std::vector<double> top_values() const = 0;
  // Trace the plan at ``budget`` (slots) into ``ops``: OK, INFEASIBLE or NO_OPTION.
  virtual int trace(int64_t budget) = 0;
  virtual double value(int a, int b, int64_t m) const = 0;
  virtual std::vector<int64_t> asked(int a, int b) const = 0;
};

std::unique_ptr<GridResult> solve_grid(const ChainRules& raw, const GridRequest& request,
                                       Stop& stop);

// ceil(v * den / num) for every v (exact: 128-bit products).
void round_sizes(const int64_t* raw, int64_t* out, int64_t count, int64_t num, int64_t den);

// The least-memory bounds and store-all peak of the chain in bytes (least_memory.py); false when
// the sizes add up to INT64_SAFE or more (then a sum might not be exact in int64).
bool chain_bounds(const ChainRules& chain, int64_t out[3]);

}  // namespace memplan::rotor
