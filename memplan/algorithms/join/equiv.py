"""EQUIV-CHAIN in the chain model: the join as one chain of levels (Optimal Memory-aware Backpropagation of Deep Join Networks, Phil. Trans. R. Soc. A 2020; Figure 9a).

Stages at equal distance from the turn are grouped into one *level*: a join whose longest branch
has ``n`` stages becomes a chain of ``n + 1`` stages, the last one being the turn (the loss). A
branch of ``l`` stages starts at level ``n - l``; the inputs of the branches that start after level
0 are held from the start (``pinned``) and never freed by a forward. Each level's sizes, overheads
and times are the sums over the branches present; rotor (the best chain algorithm) plans that
chain and every level operation is expanded back into one operation per branch present, in level
order, which never needs more memory than the level operation (docs/join.md).
"""

from __future__ import annotations

import numpy as np

from memplan.algorithms.base import Sequence
from memplan.algorithms.chain.problem import ChainInstance
from memplan.algorithms.join.hetero import JoinNet
from memplan.algorithms.join.pebble import JoinOp


def equivalent_chain(net: JoinNet) -> tuple[ChainInstance, list[int], int]:
    """The chain of levels, the level at which each branch starts, and the pinned input bytes."""
    n = max(net.lengths)
    starts = [n - length for length in net.lengths]
    x = np.zeros(n + 2, dtype=np.int64)
    g = np.zeros(n + 2, dtype=np.int64)
    s, fo, bo = (np.zeros(n + 1, dtype=np.int64) for _ in range(3))
    ft, bt = np.zeros(n + 1), np.zeros(n + 1)
    pinned = 0
    for j, c in enumerate(net.chains):
        a = starts[j]
        if a == 0:
            x[0] += c.x[0]
        else:
            pinned += int(c.x[0])
        x[a + 1 : n + 1] += c.x[1:]
        # g[j][0] too: under the loop's terms the weight gradients held at the end (NOTE
        # [ join loop terms ]); 0 before them
        g[a : n + 1] += c.g
        s[a:n] += c.s
        fo[a:n] += c.fo
        bo[a:n] += c.bo
        ft[a:n] += c.ft
        bt[a:n] += c.bt
    s[n], fo[n], bo[n], g[n + 1] = net.s_turn, net.fo_turn, net.bo_turn, net.g_turn
    ft[n] = net.t_turn
    return ChainInstance(x, s, g, fo, bo, ft, bt), starts, pinned


def expand(net: JoinNet, starts: list[int], sequence: Sequence) -> list[JoinOp]:
    """Expand a plan of the chain of levels into the join's operations (level order)."""
    n = max(net.lengths)
    plan: list[JoinOp] = []
    for op, level in sequence:
        if level == n:
            if op == "B":
                plan.append(("turn", None, 0))
            continue  # the F_all of the loss is part of the turn
        for j in range(len(net.chains)):
            if level < starts[j]:
                continue
            stage = level - starts[j]
            plan.append(("F_ck" if op == "F_n" and stage == 0 else op, j, stage))
    return plan
