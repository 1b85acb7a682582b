"""The combined family: rematerialization and offloading together (Efficient Combination of Rematerialization and Offloading, NeurIPS 2021; docs/combined.md).

``pofo`` (:mod:`.solve`) returns the fastest of the Theorem 1 DP's schedule (:mod:`.fractional`,
realized with whole tensors by :mod:`.realize`), the window DP's (:mod:`.pofo`), rotor's and
dynprog's; the family is declared in :mod:`.entries`.
"""
