// The rotor DP in bytes (rotor_exact.cpp).
#pragma once

#include <cstdint>
#include <vector>

#include "rotor.hpp"
#include "stop.hpp"

namespace memplan::rotor {

constexpr int EXACT_OK = 0, EXACT_WORK_LIMIT = 1, EXACT_STOPPED = -5;

// The plan of opt(0, L-1)(budget) in bytes into ``ops`` (4 * stage + code): EXACT_OK,
// EXACT_WORK_LIMIT after ``work_limit`` candidate points (or a projection past it), or
// EXACT_STOPPED. ``ops`` stays empty when no plan fits the budget. ``option_of_op`` gets the
// option of each operation (that of its F_all's, 0 for the others); ``least`` the least budget
// of the whole chain within ``budget`` (-1: none).
int exact_plan(const ChainRules& chain, int64_t budget, double work_limit, Stop& stop,
               std::vector<int64_t>& ops, std::vector<int32_t>& option_of_op, double& makespan,
               int64_t& least);

}  // namespace memplan::rotor
