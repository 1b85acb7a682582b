// The dense rotor table of pofo and join (rotor_dense.cpp).
#pragma once

#include <cstdint>

#include "rotor.hpp"
#include "stop.hpp"

namespace memplan::rotor {

// Fill opt[a, b, m] and choice[a, b, m] (L x L x (capacity + 1), C order) for sizes in slots:
// choice is CHOICE_F_ALL, the split j >= 1, or CHOICE_NONE (no plan). False when stopped.
bool dense_table(const ChainRules& chain, int64_t capacity, double* opt, int32_t* choice,
                 Stop& stop);

}  // namespace memplan::rotor
