"""Operator-level training graphs (papers/002, OLLA): reordering and address assignment.

Algorithms (see docs/graph.md): ``olla``, ``olla-order``, ``olla-address`` and the baselines
``framework`` and ``greedy-by-size`` (:mod:`.solvers`); the family is declared in :mod:`.entries`.
"""
