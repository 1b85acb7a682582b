// pofo's Theorem 1 DP (memplan/algorithms/combined/fractional.py, NOTE [ pofo fractional
// recurrences ] and NOTE [ pofo pruning ] there), in slots: the backward tables CA (B.3) and the
// forward phase (B.1, B.2), the states (K, F, B) that each top-level segment reaches and the value
// and decision of each.
#pragma once

#include <cstdint>
#include <vector>

#include "stop.hpp"

namespace memplan::pofo {

// The DP's chain in slots and its backward tables (read only; the caller owns them).
struct FractionalChain {
  int64_t L = 0, W = 0, D = 0, C = 0, window = 0;
  double beta = 0.0;  // slots per ms (0: no transfers)
  const int64_t* x = nullptr;      // L + 1 (x[0] is the credit of x[0])
  const int64_t* s = nullptr;      // L
  const int64_t* g = nullptr;      // L + 1
  const int64_t* fo = nullptr;     // L: the forward's overhead (F_ck, F_n; F_all's without fa)
  const int64_t* fa = nullptr;     // L (or null): F_all's own overhead (the training loop's)
  const int64_t* own_b = nullptr;  // L: g[k+1] + s[k] + g[k] + bo[k]
  const double* ft = nullptr;      // L
  const double* bt = nullptr;      // L
  const double* fp = nullptr;      // L + 1: prefix sums of ft
  const double* near = nullptr;    // (L - 1) x window x W x D: CA[a][a + r]
  const double* last = nullptr;    // L x W x D: CA[a][L - 1]
  const double* relaxed = nullptr; // (L + 1) x W: the lower bound R (bounded search only)
  // L (or null): nonzero where segment a's input is never offloaded (autograd frees it after
  // F_all a: T6 of docs/combined.md).
  const int64_t* pinned = nullptr;
};

// What the forward phase found: per segment a and input kind (index 2 a + kind), the sorted flat
// indices (K D + F) D + B of its states and the decision of each (2 j + v, -2 the tail, -3 none).
struct FractionalForward {
  bool stopped = false;
  double value = 0.0;  // OC[0][x[0]][0][0][0], rounded to float32 as the tables keep it
  int64_t evaluated = 0;
  std::vector<std::vector<int64_t>> states;
  std::vector<std::vector<int16_t>> choices;
};

// The backward tables CA[a][b][m][D] for b - a < window (``near``, (L - 1) x window x W x D) and
// b = L - 1 (``last``, L x W x D), with their choices (-1 F_all, j the checkpoint x[j], -3 none);
// ``near``, ``last`` of ``chain`` are ignored. False when stopped.
struct FractionalBackward {
  std::vector<double> near, last;
  std::vector<int16_t> near_choice, last_choice;
};
bool fractional_backward(const FractionalChain& chain, FractionalBackward& out, Stop& stop);

// bound = inf: every reachable state; otherwise the states within the bound (the beam search of
// ``beam`` states per segment first tightens it). ``tolerance``: the relative and absolute slack.
FractionalForward fractional_forward(const FractionalChain& chain, double bound, int64_t beam,
                                     double tolerance, Stop& stop);

}  // namespace memplan::pofo
