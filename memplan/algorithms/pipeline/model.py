"""The time and memory model of pipelined model parallelism (*Pipelined Model Parallelism*, Euro-Par 2021, sections 3 and 6.2).

NOTE [ pipeline memory model ]
A chain of ``L`` stages (``stages[k]`` reads ``x[k]``, writes ``x[k+1]``) is split over ``P`` GPUs
joined by a complete graph of links of ``link_bandwidth`` bytes/s (one link per pair of GPUs,
used by one transfer at a time). Stage ``k``'s forward ``F k`` and backward ``B k`` run on the
same GPU ``assignment[k]`` (constraint (4)). A *pattern* (Definition 1) holds every ``F k``,
``B k`` and transfer once (``batches_per_period`` times for GPipe); the operation with ``shift s``
runs, in the ``i``-th copy of the pattern, on mini-batch ``r i - s`` (``r = batches_per_period``).

What a GPU holds (the simulator replays exactly this, per mini-batch, unrolled):

* static: ``(f + v - 1) * W_g`` for ``f = OPTIMIZER_FACTORS[optimizer] > 0`` (weights, gradients,
  optimizer state, as everywhere in memplan) and ``v`` weight versions (2 as in PipeDream-2BW,
  section 6.2.3: with SGD this is the paper's three copies ``3 W_g``; GPipe keeps ``v = 1``);
  0 with ``--optimizer none``. ``W_g`` is the weight bytes of the stages on the GPU.
* the stash of stage ``k`` (section 6.2.2, "local activations"): ``saved_size[k]`` (plus the data
  ``x[0]`` for stage 0), from the start of ``F k`` to the end of ``B k`` of the same mini-batch.
  ``saved_size`` includes the output ``x[k+1]``, so the forward direct dependency of section 6.2.1
  is inside it.
* a received ``x[k]`` (stage ``k-1`` on another GPU): from the start of its transfer to the end of
  ``B k`` (the backward needs its input), on the receiver.
* the gradient ``g[k+1]`` between ``B k+1`` and ``B k`` (section 6.2.1 for backward tasks): on one
  GPU from the start of ``B k+1`` to the end of ``B k``; across GPUs from the start of ``B k+1`` to
  the end of the transfer on the sender and from the start of the transfer to the end of ``B k`` on
  the receiver (the communication buffers of section 6.2.4, sized by their real lifetimes).
* during ``F k`` / ``B k``: ``forward_overhead[k]`` / ``backward_overhead[k]``.

Lifetimes are half-open ``[start, end)``. The period is ``makespan``; the throughput is
``batches_per_period * batch_size / period`` samples per second.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from memplan.errors import ArgumentError
from memplan.profile.model import Profile
from memplan.schedule import OPTIMIZER_FACTORS, OptimizerName


def static_factor(optimizer: OptimizerName, versions: int) -> int:
    """Weight-sized copies a GPU keeps per weight byte (see NOTE [ pipeline memory model ])."""
    factor = OPTIMIZER_FACTORS[optimizer]
    return factor + versions - 1 if factor > 0 else 0


@dataclass(frozen=True)
class PipelineInstance:
    """A chain profile as the pipeline solvers see it (times in ms, sizes in bytes)."""

    forward: np.ndarray
    backward: np.ndarray
    stash: np.ndarray
    """Bytes kept from F k to B k: saved_size (plus x[0] for stage 0)."""
    x_size: np.ndarray
    """x_size[k] = bytes of x[k] (x[0] the input)."""
    g_size: np.ndarray
    """g_size[k] = bytes of g[k] (g[0] = 0: not computed)."""
    f_overhead: np.ndarray
    b_overhead: np.ndarray
    weights: np.ndarray
    gpus: int
    link_bandwidth: float | None
    """bytes/s; None: transfers are free (infinite bandwidth)."""
    optimizer: OptimizerName
    batch_size: int

    @property
    def length(self) -> int:
        return len(self.forward)

    @classmethod
    def from_profile(
        cls,
        profile: Profile,
        gpus: int | None,
        link_bandwidth: float | None,
        optimizer: OptimizerName = "sgd",
    ) -> PipelineInstance:
        """Check ``gpus`` and build the instance (InputError on bad input)."""
        if gpus is None:
            raise ArgumentError("gpus", "the pipeline family needs a number of GPUs, e.g. 4")
        if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
            raise ArgumentError("gpus", "expected a positive integer", gpus)
        if link_bandwidth is not None and not link_bandwidth > 0:
            raise ArgumentError("link_bandwidth", "expected a rate > 0", link_bandwidth)
        stages = profile.stages
        assert stages is not None and profile.input_size is not None
        stash = np.array([st.saved_size for st in stages], dtype=np.int64)
        stash[0] += profile.input_size
        return cls(
            forward=np.array([st.forward_time for st in stages], dtype=float),
            backward=np.array([st.backward_time for st in stages], dtype=float),
            stash=stash,
            x_size=np.array(profile.activation_sizes(), dtype=np.int64),
            g_size=np.array([0] + [st.gradient_size for st in stages], dtype=np.int64),
            f_overhead=np.array([st.forward_overhead for st in stages], dtype=np.int64),
            b_overhead=np.array([st.backward_overhead for st in stages], dtype=np.int64),
            weights=np.array([st.weight_size for st in stages], dtype=np.int64),
            gpus=gpus,
            link_bandwidth=link_bandwidth,
            optimizer=optimizer,
            batch_size=profile.batch_size or 1,
        )

    def transfer_time(self, nbytes: float) -> float:
        """Ms to send ``nbytes`` over one link (0 when the bandwidth is infinite)."""
        if self.link_bandwidth is None:
            return 0.0
        return float(nbytes) / self.link_bandwidth * 1e3

    def static_on(self, stages: list[int] | np.ndarray, versions: int = 2) -> int:
        """Static bytes of a GPU holding ``stages``."""
        return static_factor(self.optimizer, versions) * int(self.weights[list(stages)].sum())

    def min_static(self, versions: int = 2) -> int:
        """Static bytes of the heaviest single stage: no allocation needs less on its GPU."""
        return static_factor(self.optimizer, versions) * int(self.weights.max())

    def period_lower_bound(self) -> float:
        """No pattern on ``gpus`` GPUs has a shorter period: total work / P, and the longest stage."""
        work = self.forward + self.backward
        return float(max(work.sum() / self.gpus, work.max()))
