"""The offloading model of Beaumont, Eyraud-Dubois & Shilova (Euro-Par 2020, §3).

One compute stream runs the forwards ``F_0 .. F_{n-1}`` then the backwards ``B_{n-1} .. B_0``; one
transfer channel moves activations between the GPU and the host, one transfer at a time, at
``beta`` bytes per ms (assumptions A-E of §3.1).

Mapping from a chain profile (docs/offload.md has the full table)
----------------------------------------------------------------
The paper's activations ``x_0 .. x_{L+1}`` of ``L + 1`` operations are, for our ``n`` stages
(``n = L + 1``):

* ``a[0] = input_size``: the chain input ``x[0]``, read by ``F_0``;
* ``a[k+1] = stages[k].saved_size``: ``s[k]``, what the forward of stage ``k`` keeps for its
  backward (it contains ``x[k+1]``, the input of stage ``k+1``);
* ``g[0] = 0`` and ``g[k+1] = stages[k].gradient_size`` (the paper's ``y``);
* ``eF[k] = forward_overhead + g[n]`` (the loss gradient is held through the forward, docs/model.md),
  ``eB[k] = backward_overhead``; ``uF[k]``, ``uB[k]`` the forward and backward times.

``F_k`` reads ``a[k]`` and produces ``a[k+1]``; ``B_k`` needs ``a[k]``, ``a[k+1]`` and ``g[k+1]``,
produces ``g[k]`` and frees ``a[k+1]`` and ``g[k+1]`` (``B_0`` also frees ``a[0]``). The activations
that may be offloaded are ``a[0] .. a[n-1]``; ``a[n]`` (what the loss keeps) is needed right after it
is produced and is never offloaded, as in Algorithm 1 of the paper.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from memplan.profile.model import Profile

MS_PER_SECOND = 1000.0


@dataclass(frozen=True)
class OffloadInstance:
    """Sizes (bytes), times (ms) and bandwidth (bytes/ms) of a chain in the offload model.

    Attributes
    ----------
    a : ndarray of int64, shape (n + 1,)
        Activation sizes ``a[0] .. a[n]`` (``a[0]`` the chain input, ``a[k+1]`` the saved data of
        stage ``k``).
    g : ndarray of int64, shape (n + 1,)
        Gradient sizes, ``g[0] = 0``.
    fo, bo : ndarray of int64, shape (n,)
        Forward and backward temporary memory (the profile's overheads).
    uf, ub : ndarray of float64, shape (n,)
        Forward and backward times (ms).
    beta : float
        Bandwidth in bytes per millisecond.
    """

    a: np.ndarray
    g: np.ndarray
    fo: np.ndarray
    bo: np.ndarray
    uf: np.ndarray
    ub: np.ndarray
    beta: float
    names: list[str] = field(default_factory=list)

    @classmethod
    def from_profile(cls, profile: Profile, bandwidth: float) -> OffloadInstance:
        """Build the instance; ``bandwidth`` is in bytes per second (the profile's unit)."""
        st = profile.stages
        return cls(
            a=np.array([profile.input_size] + [s.saved_size for s in st], dtype=np.int64),
            g=np.array([0] + [s.gradient_size for s in st], dtype=np.int64),
            fo=np.array([s.forward_overhead for s in st], dtype=np.int64),
            bo=np.array([s.backward_overhead for s in st], dtype=np.int64),
            uf=np.array([s.forward_time for s in st], dtype=np.float64),
            ub=np.array([s.backward_time for s in st], dtype=np.float64),
            beta=float(bandwidth) / MS_PER_SECOND,
            names=[s.name for s in st],
        )

    @property
    def n(self) -> int:
        """Number of stages (the paper's ``L + 1``)."""
        return len(self.fo)

    @property
    def ef(self) -> np.ndarray:
        """``ex^F``: forward overhead plus the loss gradient ``g[n]`` held through the forward."""
        return self.fo + self.g[self.n]

    @property
    def compute_time(self) -> float:
        """``sum_i u_{F_i} + u_{B_i}``: the makespan without any idle time (ms)."""
        return float(self.uf.sum() + self.ub.sum())

    def forward_needs(self) -> np.ndarray:
        """``m_{F_k}``: bytes on both devices during ``F_k`` (§3.2), ``sum_{j<=k+1} a[j] + eF[k]``."""
        prefix = np.cumsum(self.a)  # prefix[k] = a[0] + .. + a[k]
        return prefix[1:] + self.ef

    def backward_needs(self) -> np.ndarray:
        """``m_{B_k} = sum_{j<=k+1} a[j] + g[k] + g[k+1] + eB[k]`` (§3.2)."""
        prefix = np.cumsum(self.a)
        return prefix[1:] + self.g[:-1] + self.g[1:] + self.bo

    def peak(self) -> int:
        """``M_peak``: the memory of the schedule without offloading (the store-all peak).

        Summed in Python ints (exact: int64 prefix sums overflow on thousands of 2**50-byte
        stages), as :meth:`forward_needs` and :meth:`backward_needs` would give it otherwise.
        """
        a, g, ef, bo = (v.tolist() for v in (self.a, self.g, self.ef, self.bo))
        peak, prefix = 0, a[0]
        for k in range(self.n):
            prefix += a[k + 1]  # a[0] + .. + a[k+1]
            peak = max(peak, prefix + ef[k], prefix + g[k] + g[k + 1] + bo[k])
        return peak

    def min_memory(self) -> int:
        """The least memory in which any offloading schedule runs: everything offloaded.

        ``F_k`` needs ``a[k]`` (its input), ``a[k+1]`` and ``eF[k]``; ``B_k`` needs ``a[k]``,
        ``a[k+1]``, ``g[k]``, ``g[k+1]`` and ``eB[k]``. With every ``a[j]``, ``j < n``, offloaded and
        waited for, nothing else is on the GPU, so this is the least budget of any set
        (Proposition 2 with full offloading).
        """
        a, g = self.a, self.g
        forward = a[:-1] + a[1:] + self.ef
        backward = a[:-1] + a[1:] + g[:-1] + g[1:] + self.bo
        return int(max(forward.max(), backward.max()))

    def feasible(self, offloaded: np.ndarray | list[bool], memory: int) -> bool:
        """Whether some schedule offloading exactly ``offloaded`` fits ``memory`` bytes.

        Waiting long enough, every offload completes before the operation that needs the room and
        every prefetch starts after the backward before it, so only the activations kept on the GPU
        count: ``F_k`` needs ``eF[k] + a[k] + a[k+1] + kept(0..k-1)``, ``B_k`` needs
        ``g[k] + g[k+1] + eB[k] + a[k] + a[k+1] + kept(0..k-1)``. This holds in both the
        interruptible model (Problem 2) and the real one (Problem 1).
        """
        kept = self.kept_prefix(offloaded)
        a, g = self.a, self.g
        forward = kept[:-1] + a[:-1] + a[1:] + self.ef
        backward = kept[:-1] + a[:-1] + a[1:] + g[:-1] + g[1:] + self.bo
        return bool(forward.max() <= memory and backward.max() <= memory)

    def kept_prefix(self, offloaded: np.ndarray | list[bool]) -> np.ndarray:
        """``N[k]``: bytes of ``a[0] .. a[k-1]`` kept on the GPU, for ``k = 0 .. n``."""
        keep = np.where(np.asarray(offloaded, dtype=bool), 0, self.a[: self.n])
        return np.concatenate(([0], np.cumsum(keep)))

    def transfer_time(self, nbytes: int | float) -> float:
        """Time to move ``nbytes`` over the channel, ``|x|/beta`` (assumption C), in ms."""
        return float(nbytes) / self.beta


def offload_mask(n: int, indices) -> np.ndarray:
    """A boolean mask of the offloaded activations ``a[0] .. a[n-1]`` from their indices."""
    mask = np.zeros(n, dtype=bool)
    for i in indices:
        mask[int(i)] = True
    return mask
