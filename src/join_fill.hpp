// The chain-model join DPs (memplan/algorithms/join/hetero.py, NOTE [ heterogeneous join
// recurrences ] there): V(p, m) for every state (p, flags) and every budget m in slots, and the
// least memory of a canonical plan from every state.
#pragma once

#include <cstdint>
#include <vector>

#include "stop.hpp"

namespace memplan::join {

// One branch in slots, with its dense rotor table and its forward needs (read only).
struct JoinBranch {
  int64_t L = 0;
  const int64_t* x = nullptr;      // L + 1
  const int64_t* s = nullptr;      // L
  const int64_t* g = nullptr;      // L + 1
  const int64_t* fo = nullptr;     // L
  const int64_t* bo = nullptr;     // L
  const double* ft = nullptr;      // L
  const double* bt = nullptr;      // L
  const double* opt = nullptr;     // L x L x W: rotor's opt[a][b][m]
  const int64_t* fneed = nullptr;  // (L + 1) x (L + 1): forward need of F_ck p .. F_n q-1 at [p, q]
};

struct JoinTables {
  std::vector<int64_t> row;     // dense state id -> row (-1: not a state)
  std::vector<double> value;    // rows x W
  std::vector<int16_t> branch;  // rows x W: the branch moved, -2 the turn, -1 none
  std::vector<int16_t> target;  // rows x W: q of F_ck .. x[q], 0 for F_all
};

// The tables of every state, sub-states first; false when stopped.
bool join_fill(const std::vector<JoinBranch>& branches, int64_t g_turn, int64_t turn_need,
               double t_turn, int64_t width, JoinTables& out, Stop& stop);

// The least memory of a canonical plan from every state (max/min instead of sum/min, exact in
// bytes; each branch's segments by its least-memory table ``lmt`` (L x L, beyond x[a])), and
// the decision reaching it: kind 1 the turn, 2 F_all on ``branch``, 3 F_ck .. x[``target``].
struct JoinLeast {
  std::vector<int64_t> need;    // per dense state id
  std::vector<int8_t> kind;     // 0: not a state
  std::vector<int16_t> branch;
  std::vector<int16_t> target;
};

bool join_least(const std::vector<JoinBranch>& branches, const std::vector<const int64_t*>& lmt,
                int64_t g_turn, int64_t turn_need, JoinLeast& out, Stop& stop);

}  // namespace memplan::join
