"""Operator-level training graphs (OLLA, Steiner et al. 2022): reordering and address assignment.

Algorithms (see docs/graph.md): ``olla``, ``olla-order``, ``olla-address`` and the baselines
``framework`` and ``greedy-by-size`` (:mod:`.solvers`); the family is declared in :mod:`.entries`.
"""
