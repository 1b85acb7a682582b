"""Join networks (papers/003): Siamese and cross-modal networks joined by a loss.

``join`` (the optimal canonical schedule, Theorem 3 of Beaumont, Herrmann, Pallez & Shilova) and
``equiv-chain`` (the paper's baseline). Uniform profiles are solved in the paper's pebble model
(:mod:`memplan.algorithms.join.pebble`), others in the chain model of docs/model.md on every branch
(:mod:`memplan.algorithms.join.hetero`); see docs/join.md.
"""

from __future__ import annotations

from typing import Any


def describe_join(profile: Any, static_memory: int) -> dict[str, Any]:
    """What ``memplan info`` adds for a join profile: least memory, store-all need, c_min.

    For a uniform profile (docs/join.md) ``c_min`` is Theorem 2's, in slots of ``slot_size``
    bytes, and the memory figures are the pebble model's (``c_min`` and ``sum(l) + k`` slots);
    otherwise they are the chain model's (the least memory of a canonical plan, exact in bytes,
    and the store-all peak).
    """
    from memplan.algorithms.join.hetero import JoinNet, min_memory_plan
    from memplan.algorithms.join.pebble import c_min
    from memplan.algorithms.join.solve import uniform

    lengths = [len(b.stages) for b in profile.branches]
    found: dict[str, Any] = {
        "branches": ", ".join(f"{b.name} ({len(b.stages)})" for b in profile.branches),
        "branch_lengths": lengths,
        "input_size": sum(b.input_size for b in profile.branches),
        "stage_table": [
            {**st.model_dump(exclude_none=True), "name": f"{b.name}/{st.name}"}
            for b in profile.branches
            for st in b.stages
        ]
        + [{**profile.turn.model_dump(exclude_none=True), "name": f"turn/{profile.turn.name}"}],
    }
    u = uniform(profile)
    if u is not None:
        least = c_min(u.lengths)
        found.update(
            join_model="pebble",
            c_min=least,
            slot_size=u.size,
            store_all_memory=static_memory + (sum(lengths) + len(lengths)) * u.size,
            min_memory={"join": static_memory + least * u.size},
        )
        return found
    net = JoinNet.from_profile(profile)
    least, _ = min_memory_plan(net)
    found.update(
        join_model="chain",
        store_all_memory=static_memory + net.peak(net.store_all()),
        min_memory={"join": static_memory + least},
    )
    return found
