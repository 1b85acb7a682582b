// The rotor dynamic programs: one chain model, three tables of the same recurrences.
//
// NOTE [ rotor in C++ ]
// The recurrences are those of NOTE [ rotor recurrences ] (memplan/algorithms/chain/rotor.py).
// Every memory need of an option of a sub-chain (a, b) is written once, in ChainRules below; the
// three tables call it: the slot grid restricted to the budgets the top problem asks
// (rotor_grid.cpp), the dense grid of every budget of every sub-chain that pofo and join read
// (rotor_dense.cpp), and the DP in bytes that keeps the steps of each sub-chain's value
// (rotor_exact.cpp). Each keeps the floating-point operations, and their order, of its Python
// reference in tests/oracles/rotor.py, so that the plans are those of the references exactly.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

namespace memplan::rotor {

constexpr int F_ALL = 0, F_CK = 1, F_N = 2, B = 3;  // operation codes: 4 * stage + code
constexpr int32_t CHOICE_F_ALL = -1, CHOICE_NONE = -2;
// The choice "F_all under option o" of the DP in bytes: CHOICE_F_ALL for option 0, -2 - o beyond.
constexpr int32_t fall_choice(int o) { return o == 0 ? CHOICE_F_ALL : -2 - o; }
constexpr bool is_fall(int32_t choice) { return choice == CHOICE_F_ALL || choice <= -3; }
constexpr int option_of(int32_t choice) { return choice == CHOICE_F_ALL ? 0 : -2 - choice; }

// The sizes (bytes or slots) and times of a chain of L stages: x[0..L], s, fo, bo [0..L-1],
// g[0..L], ft, bt [0..L-1] (docs/model.md), and the terms of the training loop (NOTE
// [ training-loop memory terms ], memplan/profile/memory.py), null in the model before them:
// fa[0..L-1] what F_all a adds beyond s[a] (else fo), wh[0..L] the weight gradients held once
// B k has run (else 0), fr[0..L-1] the bytes of x[a] that F_all a frees (else 0).
struct ChainRules {
  int L = 0;
  const int64_t* x = nullptr;
  const int64_t* s = nullptr;
  const int64_t* g = nullptr;
  const int64_t* fo = nullptr;
  const int64_t* bo = nullptr;
  const double* ft = nullptr;
  const double* bt = nullptr;
  // More ways to run F_all a (selective checkpointing, docs/model.md "Options of a stage"):
  // option o >= 1 of stage a is entry ostart[a] + o - 1 of os, ofo, obo, obt. Option 0 is s, fa
  // (else fo), bo, bt. Without options (ostart null) every stage has option 0 only. Read by the
  // DP in bytes.
  const int64_t* ostart = nullptr;
  const int64_t* os = nullptr;
  const int64_t* ofo = nullptr;
  const int64_t* obo = nullptr;
  const double* obt = nullptr;
  const int64_t* fa = nullptr;
  const int64_t* wh = nullptr;
  const int64_t* fr = nullptr;

  int options(int a) const { return ostart == nullptr ? 1 : 1 + int(ostart[a + 1] - ostart[a]); }
  int64_t saved(int a, int o = 0) const { return o == 0 ? s[a] : os[ostart[a] + o - 1]; }
  int64_t bwd_overhead(int a, int o = 0) const { return o == 0 ? bo[a] : obo[ostart[a] + o - 1]; }
  double backward_time(int a, int o = 0) const { return o == 0 ? bt[a] : obt[ostart[a] + o - 1]; }
  // What F_all a (option o) adds beyond what it saves.
  int64_t fall_overhead(int a, int o = 0) const {
    return o != 0 ? ofo[ostart[a] + o - 1] : (fa ? fa[a] : fo[a]);
  }
  // The bytes of x[a] F_all a frees (the caller's x[a] counts them until then).
  int64_t freed(int a) const { return fr ? fr[a] : 0; }
  // The gradients held while the sub-chain (a, b) runs: g[b+1] (pitfall 1) and the weight
  // gradients of the stages after b, whose backwards have run.
  int64_t held_grads(int b) const { return g[b + 1] + (wh ? wh[b + 1] : 0); }
  // Memory of B a besides x[a] (under option o of F_all a): held_grads(a) + what F_all a saved +
  // g[a] + stage a's weight gradients + its backward overhead, less what F_all a freed of x[a].
  int64_t own_backward(int a, int o = 0) const {
    return g[a + 1] + saved(a, o) + g[a] + bwd_overhead(a, o) + (wh ? wh[a] : 0) - freed(a);
  }
  // What F_all a (option o) takes from the budget of the rest of its sub-chain: what it saved,
  // less the freed x[a] (negative when a stage saves less than the input it frees).
  int64_t held_after(int a, int o = 0) const { return saved(a, o) - freed(a); }
  // Memory of B a besides x[a] as the last operation of the sub-chain (a, b): when a < b, F_all
  // a+1 ran while s[a] was held and freed x[a+1] from it.
  int64_t backward_need(int a, int b, int o = 0) const {
    return own_backward(a, o) - (a < b ? freed(a + 1) : 0);
  }
  // Least budget of F_all a (option o) in the sub-chain (a, b): its forward runs while
  // held_grads(b) is held (pitfall 1), and its backward needs backward_need(a, b, o).
  int64_t fall_need(int a, int b, int o = 0) const {
    return std::max(held_grads(b) + saved(a, o) + fall_overhead(a, o), backward_need(a, b, o));
  }
  // Memory of F_ck a (r = 0) or F_n a+r (r >= 1) besides the held gradient, as needed to reach
  // the checkpoint x[a+1+r]: x[a+1] + fo[a], then x[a+r] + x[a+r+1] + fo[a+r].
  int64_t forward_step(int a, int r) const {
    return r == 0 ? x[a + 1] + fo[a] : x[a + r] + x[a + r + 1] + fo[a + r];
  }
  // The lowest budget of the sub-chain (a, b) below which no plan exists (a lower bound of its
  // least memory: the backward peaks of its stages and the forward of its last stage).
  // ``floor`` is the running max of backward_need(k, b) over k = a..b (the caller walks a down
  // from b).
  int64_t least_bound(int64_t floor, int b) const {
    return std::max(floor, held_grads(b) + s[b] + fall_overhead(b));
  }
  // Whether any term of the training loop is given.
  bool has_terms() const { return fa != nullptr || wh != nullptr || fr != nullptr; }
};

}  // namespace memplan::rotor
