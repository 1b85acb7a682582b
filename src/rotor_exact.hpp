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
// EXACT_STOPPED. ``ops`` stays empty when no plan fits the budget.
int exact_plan(const ChainRules& chain, int64_t budget, double work_limit, Stop& stop,
               std::vector<int64_t>& ops, double& makespan);

}  // namespace memplan::rotor
