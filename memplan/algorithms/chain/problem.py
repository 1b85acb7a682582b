"""A numeric view of a chain profile, shared by the chain algorithms (not by the simulator)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from memplan.profile.model import Profile

from memplan.algorithms.base import Sequence


@dataclass(frozen=True)
class Chain:
    """Sizes (bytes) and times (ms) of a chain in the notation of docs/model.md.

    ``x[k]`` for k = 0..L (x[0] is the input), ``s[k]``, ``fo[k]``, ``bo[k]``, ``ft[k]``, ``bt[k]``
    for stages k = 0..L-1, ``g[k]`` for k = 0..L with ``g[0] = 0``.
    """

    x: np.ndarray
    s: np.ndarray
    g: np.ndarray
    fo: np.ndarray
    bo: np.ndarray
    ft: np.ndarray
    bt: np.ndarray
    names: list[str] = field(default_factory=list)

    @property
    def length(self) -> int:
        return len(self.s)

    @classmethod
    def from_profile(cls, profile: Profile) -> Chain:
        st = profile.stages
        return cls(
            x=np.array([profile.input_size] + [s.output_size for s in st], dtype=np.int64),
            s=np.array([s.saved_size for s in st], dtype=np.int64),
            g=np.array([0] + [s.gradient_size for s in st], dtype=np.int64),
            fo=np.array([s.forward_overhead for s in st], dtype=np.int64),
            bo=np.array([s.backward_overhead for s in st], dtype=np.int64),
            ft=np.array([s.forward_time for s in st], dtype=np.float64),
            bt=np.array([s.backward_time for s in st], dtype=np.float64),
            names=[s.name for s in st],
        )

    def duration(self, op: str, stage: int) -> float:
        return float(self.bt[stage] if op == "B" else self.ft[stage])

    def makespan(self, sequence: Sequence) -> float:
        return float(sum(self.duration(op, k) for op, k in sequence))

    @property
    def lower_bound(self) -> float:
        return float(self.ft.sum() + self.bt.sum())

    def store_all_sequence(self) -> Sequence:
        """F_all on every stage, then every backward: no recomputation."""
        L = self.length
        return [("F_all", k) for k in range(L)] + [("B", k) for k in reversed(range(L))]

    def store_all_peak(self) -> int:
        """Peak activation bytes of :meth:`store_all_sequence` (x[0] and g[L] included).

        Forward of stage k holds x[0], s[0..k-1], g[L] plus s[k] and its overhead; the backward of
        stage k holds x[0], s[0..k], g[k+1] plus g[k] and its overhead.
        """
        L = self.length
        held_before = int(self.x[0]) + np.concatenate(([0], np.cumsum(self.s)))  # before F_all k
        fwd = held_before[:L] + self.g[L] + self.s + self.fo
        bwd = held_before[1:] + self.g[1:] + self.g[:L] + self.bo
        return int(max(fwd.max(), bwd.max()))
