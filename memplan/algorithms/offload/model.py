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

NOTE [ offload loop terms ]
Under the training loop's terms (docs/model.md, "The training loop"; the solvers' figures from
memplan/profile/memory.py), the offloading model counts what the chain family counts, with every
forward an ``F_all``: ``eF[k] = forward_overhead_all[k] + g[n]``; ``eB[k] = wh[k+1] +
max(0, g[k] + wg[k] + bo[k]) - g[k]``, where ``wg[k]`` is the weight gradients ``B_k`` creates
(at its start; they stay), ``wh[k+1]`` those of every later stage, held already, and ``bo[k]``
the loop's backward overhead: ``g[k] + eB[k]`` is what ``B_k`` adds to the memory held before it
starts, or nothing when that is negative (a backward that frees more than it makes: the moment
before it starts is then the most, and a prefetch overlapping it must fit there too). Where autograd frees ``x[k]`` after ``F_k`` (``fr[k] > 0``),
``a[k]`` (``s[k-1]``, which holds it) counts ``ac[k] = a[k] - fr[k]`` bytes from the end of
``F_k`` on: ``F_k`` needs ``a[k]``, every later operation counts ``ac[k]`` (``B_k`` needs
``ac[k]`` and ``ac[k+1]``); such an activation is *pinned*, never offloaded (T6 of
docs/combined.md). In the model before the loop's terms ``ac = a`` and nothing is pinned. Under
``step-in-backward`` the step in the backward comes folded into the terms (``StageTerms``,
memplan/profile/memory.py): ``bo[k]`` holds the gradients ``B_k`` steps and frees at its end and
the step's temporaries, ``wg[k]`` is what ``B_k`` leaves held (negative where it completes a
gradient a later stage created). The optimizer's step after the backward is no term of this
model: it bounds the schedule (``step_bound`` in memplan/algorithms/timeline.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from memplan.loop import TrainingLoop
from memplan.profile.memory import stage_terms
from memplan.profile.model import Profile

MS_PER_SECOND = 1000.0


@dataclass(frozen=True)
class OffloadInstance:
    """Sizes (bytes), times (ms) and bandwidth (bytes/ms) of a chain in the offload model.

    Attributes
    ----------
    a : ndarray of int64, shape (n + 1,)
        Activation sizes ``a[0] .. a[n]`` (``a[0]`` the chain input, ``a[k+1]`` the saved data of
        stage ``k``), as ``F_k`` produces them.
    g : ndarray of int64, shape (n + 1,)
        Gradient sizes, ``g[0] = 0``.
    fo, bo : ndarray of int64, shape (n,)
        What ``F_k`` adds beyond ``a[k+1]`` (its temporary memory) and what ``B_k`` adds beyond
        ``g[k]`` and the activations (its temporary memory and the weight gradients held:
        ``eB[k]``, NOTE [ offload loop terms ]).
    uf, ub : ndarray of float64, shape (n,)
        Forward and backward times (ms).
    beta : float
        Bandwidth in bytes per millisecond.
    """

    a: npt.NDArray[np.int64]
    g: npt.NDArray[np.int64]
    fo: npt.NDArray[np.int64]
    bo: npt.NDArray[np.int64]
    uf: npt.NDArray[np.float64]
    ub: npt.NDArray[np.float64]
    beta: float
    names: list[str] = field(default_factory=list)
    fr: npt.NDArray[np.int64] | None = None
    """``fr[k]``, the bytes of ``a[k]`` autograd frees at the end of ``F_k`` (NOTE [ offload loop
    terms ]; shape (n,), ``fr[0] = 0``); None: nothing is freed."""

    @classmethod
    def from_profile(
        cls, profile: Profile, bandwidth: float, loop: TrainingLoop | None = None
    ) -> OffloadInstance:
        """Build the instance; ``bandwidth`` is in bytes per second (the profile's unit);
        ``loop``: the training loop whose terms it counts (NOTE [ offload loop terms ]; None, or
        a loop without ``gradients``: the model before them).
        """
        st = profile.chain_stages
        terms = stage_terms(st, loop)
        created = np.array(terms.weight_grads, dtype=np.int64)
        after = np.append(np.cumsum(created[::-1])[::-1], 0)[1:]  # wh[k+1]: stages k+1 .. n-1
        g = np.array([0] + [s.gradient_size for s in st], dtype=np.int64)
        own = g[:-1] + created + np.array(terms.backward, dtype=np.int64)
        freed = np.array(terms.freed_input, dtype=np.int64)
        return cls(
            a=np.array([profile.input_size] + [s.saved_size for s in st], dtype=np.int64),
            g=g,
            fo=np.array(terms.forward_all, dtype=np.int64),
            bo=after + np.maximum(own, 0) - g[:-1],
            uf=np.array([s.forward_time for s in st], dtype=np.float64),
            ub=np.array([s.backward_time for s in st], dtype=np.float64),
            beta=float(bandwidth) / MS_PER_SECOND,
            names=[s.name for s in st],
            fr=freed if freed.any() else None,
        )

    @property
    def n(self) -> int:
        """Number of stages (the paper's ``L + 1``)."""
        return len(self.fo)

    @property
    def ac(self) -> npt.NDArray[np.int64]:
        """``ac[k]``: the bytes ``a[k]`` holds from the end of ``F_k`` on (NOTE [ offload loop
        terms ]); ``a`` when nothing is freed.
        """
        if self.fr is None:
            return self.a
        ac: npt.NDArray[np.int64] = self.a - np.append(self.fr, 0)
        return ac

    @property
    def pinned(self) -> npt.NDArray[np.bool_]:
        """Whether each ``a[0] .. a[n-1]`` stays on the GPU (autograd frees part of it)."""
        if self.fr is None:
            return np.zeros(self.n, dtype=bool)
        pinned: npt.NDArray[np.bool_] = self.fr > 0
        return pinned

    def movable(self, offloaded: npt.NDArray[np.bool_] | list[bool]) -> npt.NDArray[np.bool_]:
        """``offloaded`` less what cannot move: pinned activations and empty ones (moving zero
        bytes changes nothing, and the schedule has no empty transfers).
        """
        mask: npt.NDArray[np.bool_] = (
            np.asarray(offloaded, dtype=bool) & (self.a[: self.n] > 0) & ~self.pinned
        )
        return mask

    @property
    def ef(self) -> npt.NDArray[np.int64]:
        """``ex^F``: forward overhead plus the loss gradient ``g[n]`` held through the forward."""
        ef: npt.NDArray[np.int64] = self.fo + self.g[self.n]
        return ef

    @property
    def compute_time(self) -> float:
        """``sum_i u_{F_i} + u_{B_i}``: the makespan without any idle time (ms)."""
        return float(self.uf.sum() + self.ub.sum())

    def forward_needs(self) -> npt.NDArray[np.int64]:
        """``m_{F_k}``: bytes on both devices during ``F_k`` (§3.2),
        ``sum_{j<k} ac[j] + a[k] + a[k+1] + eF[k]``.
        """
        below = np.concatenate(([0], np.cumsum(self.ac)))[:-1]  # ac[0] + .. + ac[k-1]
        needs: npt.NDArray[np.int64] = below[: self.n] + self.a[:-1] + self.a[1:] + self.ef
        return needs

    def backward_needs(self) -> npt.NDArray[np.int64]:
        """``m_{B_k} = sum_{j<k} ac[j] + ac[k] + ac[k+1] + g[k] + g[k+1] + eB[k]`` (§3.2)."""
        ac = self.ac
        below = np.concatenate(([0], np.cumsum(ac)))[: self.n]
        needs: npt.NDArray[np.int64] = below + ac[:-1] + ac[1:] + self.g[:-1] + self.g[1:] + self.bo
        return needs

    def peak(self) -> int:
        """``M_peak``: the memory of the schedule without offloading (the store-all peak).

        Summed in Python ints (exact: int64 prefix sums overflow on thousands of 2**50-byte
        stages), as :meth:`forward_needs` and :meth:`backward_needs` would give it otherwise.
        """
        a, ac, g, ef, bo = (v.tolist() for v in (self.a, self.ac, self.g, self.ef, self.bo))
        peak, below = 0, 0
        for k in range(self.n):
            forward = below + a[k] + a[k + 1] + ef[k]
            backward = below + ac[k] + ac[k + 1] + g[k] + g[k + 1] + bo[k]
            peak = max(peak, forward, backward)
            below += ac[k]  # ac[0] + .. + ac[k]
        return peak

    def min_memory(self) -> int:
        """The least memory in which any offloading schedule runs: everything offloaded.

        ``F_k`` needs ``a[k]`` (its input), ``a[k+1]`` and ``eF[k]``; ``B_k`` needs ``ac[k]``,
        ``ac[k+1]``, ``g[k]``, ``g[k+1]`` and ``eB[k]``. With every movable ``a[j]``, ``j < n``,
        offloaded and waited for, only the pinned ones below stay on the GPU, so this is the least
        budget of any set (Proposition 2 with full offloading).
        """
        return self.least_with(self.kept_prefix(np.ones(self.n, dtype=bool)))

    def least_with(self, kept: npt.NDArray[np.int64]) -> int:
        """The most any operation needs with ``kept[k]`` bytes of ``a[0..k-1]`` kept below it."""
        forward, backward = self.needs(kept)
        return int(max(forward.max(), backward.max()))

    def needs(
        self, kept: npt.NDArray[np.int64]
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """Bytes of every ``F_k`` and ``B_k`` with ``kept[k]`` bytes kept below them."""
        a, ac, g = self.a, self.ac, self.g
        forward = kept[:-1] + a[:-1] + a[1:] + self.ef
        backward = kept[:-1] + ac[:-1] + ac[1:] + g[:-1] + g[1:] + self.bo
        return forward, backward

    def feasible(self, offloaded: npt.NDArray[np.bool_] | list[bool], memory: int) -> bool:
        """Whether some schedule offloading exactly ``offloaded`` fits ``memory`` bytes.

        Waiting long enough, every offload completes before the operation that needs the room and
        every prefetch starts after the backward before it, so only the activations kept on the GPU
        count: ``F_k`` needs ``eF[k] + a[k] + a[k+1] + kept(0..k-1)``, ``B_k`` needs
        ``g[k] + g[k+1] + eB[k] + ac[k] + ac[k+1] + kept(0..k-1)``. This holds in both the
        interruptible model (Problem 2) and the real one (Problem 1). A pinned activation
        offloaded does not fit (it cannot move).
        """
        if np.any(np.asarray(offloaded, dtype=bool) & (self.a[: self.n] > 0) & self.pinned):
            return False
        forward, backward = self.needs(self.kept_prefix(offloaded))
        return bool(forward.max() <= memory and backward.max() <= memory)

    def kept_prefix(self, offloaded: npt.NDArray[np.bool_] | list[bool]) -> npt.NDArray[np.int64]:
        """``N[k]``: bytes of ``a[0] .. a[k-1]`` kept on the GPU (as ``ac``), for ``k = 0 .. n``;
        pinned activations are kept whatever ``offloaded`` says.
        """
        mask = self.movable(offloaded)
        keep = np.where(mask, 0, self.ac[: self.n])
        return np.concatenate(([0], np.cumsum(keep)))

    def transfer_time(self, nbytes: int | float) -> float:
        """Time to move ``nbytes`` over the channel, ``|x|/beta`` (assumption C), in ms."""
        return float(nbytes) / self.beta


def offload_mask(n: int, indices: Iterable[int | np.integer[Any]]) -> npt.NDArray[np.bool_]:
    """A boolean mask of the offloaded activations ``a[0] .. a[n-1]`` from their indices."""
    mask = np.zeros(n, dtype=bool)
    for i in indices:
        mask[int(i)] = True
    return mask
