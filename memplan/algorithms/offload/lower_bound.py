"""M_peak and the lower bound LB of Proposition 3 (Beaumont, Eyraud-Dubois & Shilova, Euro-Par 2020).

``M_peak`` is the largest memory of any operation when nothing is offloaded (§3.2,
``max(max_i m_{F_i}, max_i m_{B_i})``). Any valid schedule offloads at least
``M_peak - M_GPU`` bytes (Proposition 2) and moves them twice (offload and prefetch), and runs every
operation once, so (Proposition 3)::

    LB = max( sum_i (u_{F_i} + u_{B_i}),  2 (M_peak - M_GPU) / beta )
"""

from __future__ import annotations

from memplan.algorithms.offload.model import OffloadInstance


def peak_memory(inst: OffloadInstance) -> int:
    """``M_peak`` in bytes (activations only; the store-all peak of the chain)."""
    return inst.peak()


def lower_bound(inst: OffloadInstance, memory: int) -> float:
    """``LB`` of Proposition 3 (ms) for an activation budget of ``memory`` bytes.

    Parameters
    ----------
    inst : OffloadInstance
        The chain, with its bandwidth.
    memory : int
        ``M_GPU``: bytes available to activations (static memory excluded).

    Returns
    -------
    float
        ``max(compute time, 2 * (M_peak - memory) / beta)``; the compute time when no offloading
        is needed.
    """
    return max(inst.compute_time, 2.0 * max(0, inst.peak() - memory) / inst.beta)
