"""Oracles for the graph family: random DAGs and an exhaustive search over topological orders.

Independent of memplan.algorithms and memplan.simulator: lifetimes and resident memory are counted
here from the definitions of papers/002 (section 2.2): a tensor is resident from the step of its
producer to the step of its last consumer, both included; a tensor produced by a ``weight`` node
during the whole step.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence
from typing import Any

from memplan.profile.model import Profile


def graph_profile(
    nodes: list[tuple[str, str]], tensors: list[tuple[str, int, str, list[str]]], model: str = "toy"
) -> Profile:
    """A graph-only profile from ``(name, kind)`` nodes and ``(name, size, producer, consumers)``."""
    return Profile.model_validate(
        {
            "model": model,
            "graph": {
                "nodes": [{"name": n, "op": "op", "kind": k, "time": 1.0} for n, k in nodes],
                "tensors": [
                    {"name": t, "size": s, "producer": p, "consumers": list(c)}
                    for t, s, p, c in tensors
                ],
            },
        }
    )


def random_dag(seed: int, n: int, max_size: int = 50, weights: int = 0) -> Profile:
    """``n`` forward nodes in topological order, each producing one or two tensors read by one to
    three later nodes (some by none), plus ``weights`` weight nodes read by random nodes."""
    rng = random.Random(seed)
    nodes = [(f"w{k}", "weight") for k in range(weights)] + [(f"v{k}", "forward") for k in range(n)]
    tensors = []
    for k in range(weights):
        readers = sorted({f"v{rng.randrange(n)}" for _ in range(rng.randint(1, 2))})
        tensors.append((f"W{k}", rng.randint(1, max_size), f"w{k}", readers))
    for k in range(n):
        for out in range(rng.choice((1, 1, 1, 2))):
            later = list(range(k + 1, n))
            count = min(len(later), rng.choice((0, 1, 1, 2, 3))) if later else 0
            readers = sorted(rng.sample(later, count)) if count else []
            tensors.append(
                (f"t{k}.{out}", rng.randint(0, max_size), f"v{k}", [f"v{r}" for r in readers])
            )
    return graph_profile(nodes, tensors, model=f"dag{seed}")


def peak_resident(profile: Profile, order: list[str]) -> int:
    """Peak over the steps of ``order`` of the bytes resident (hand count, no numpy)."""
    graph = profile.graph
    assert graph is not None
    kind = {node.name: node.kind for node in graph.nodes}
    pos = {name: k for k, name in enumerate(order)}
    best = 0
    for step in range(len(order)):
        total = 0
        for t in graph.tensors:
            if kind[t.producer] == "weight":
                total += t.size
                continue
            first = pos[t.producer]
            last = max([first, *(pos[c] for c in t.consumers)])
            if first <= step <= last:
                total += t.size
        best = max(best, total)
    return best


def topological_orders(profile: Profile, weights_first: bool = False):
    """Every topological order of the graph (exponential: small graphs only).

    With ``weights_first``, the weight nodes (whose tensors are resident during the whole step
    wherever they run) come first in a fixed order, and only the other nodes are permuted.
    """
    graph = profile.graph
    assert graph is not None
    names = [node.name for node in graph.nodes]
    head = [node.name for node in graph.nodes if weights_first and node.kind == "weight"]
    names = [name for name in names if name not in head]
    preds: dict[str, set[str]] = {name: set() for name in names}
    for t in graph.tensors:
        for c in t.consumers:
            if t.producer not in head:
                preds[c].add(t.producer)

    def extend(done: list[str], left: set[str]):
        if not left:
            yield list(done)
            return
        for v in sorted(left):
            if preds[v] <= set(done):
                done.append(v)
                left.remove(v)
                yield from extend(done, left)
                left.add(v)
                done.pop()

    for order in extend([], set(names)):
        yield head + order


def best_order(profile: Profile, weights_first: bool = False) -> tuple[int, list[str]]:
    """The least peak resident memory over all topological orders, and one order reaching it."""
    orders = topological_orders(profile, weights_first)
    return min(((peak_resident(profile, o), o) for o in orders), key=lambda x: x[0])


def overlaps(profile: Profile, order: list[str], addresses: dict[str, int]) -> list[Any]:
    """Pairs of tensors live at a common step whose byte ranges intersect (should be none)."""
    graph = profile.graph
    assert graph is not None
    kind = {node.name: node.kind for node in graph.nodes}
    pos = {name: k for k, name in enumerate(order)}
    spans = {}
    for t in graph.tensors:
        if t.size == 0:
            continue
        if kind[t.producer] == "weight":
            spans[t.name] = (0, len(order) - 1, t.size)
        else:
            first = pos[t.producer]
            spans[t.name] = (first, max([first, *(pos[c] for c in t.consumers)]), t.size)
    bad = []
    for (a, (s1, e1, z1)), (b, (s2, e2, z2)) in itertools.combinations(spans.items(), 2):
        if s1 <= e2 and s2 <= e1:
            x, y = addresses[a], addresses[b]
            if x < y + z2 and y < x + z1:
                bad.append((a, b))
    return bad


def lowest_fit_arena(spans: list[tuple[int, int, int]], perm: Sequence[int]) -> int:
    """Place ``spans`` (first step, last step, size) in the order ``perm``, each at the lowest
    offset clear of the tensors already placed that share a step with it; return the arena.

    Over all permutations, the least such arena is the optimum: sorting an optimal placement by
    offset and placing in that order puts each tensor at or below its optimal offset.
    """
    placed: list[tuple[int, int, int, int]] = []  # first, last, low, high
    arena = 0
    for k in perm:
        s, e, size = spans[k]
        busy = sorted((lo, hi) for (s2, e2, lo, hi) in placed if s2 <= e and s <= e2)
        offset = 0
        for lo, hi in busy:
            if offset + size <= lo:
                break
            offset = max(offset, hi)
        placed.append((s, e, offset, offset + size))
        arena = max(arena, offset + size)
    return arena


def best_arena(profile: Profile, weights_first: bool = True) -> int:
    """The least arena over every topological order and every placement (exhaustive)."""
    graph = profile.graph
    assert graph is not None
    kind = {node.name: node.kind for node in graph.nodes}
    best = None
    for order in topological_orders(profile, weights_first):
        pos = {name: k for k, name in enumerate(order)}
        spans = []
        for t in graph.tensors:
            if t.size == 0:
                continue
            if kind[t.producer] == "weight":
                spans.append((0, len(order) - 1, t.size))
            else:
                first = pos[t.producer]
                spans.append((first, max([first, *(pos[c] for c in t.consumers)]), t.size))
        for perm in itertools.permutations(range(len(spans))):
            value = lowest_fit_arena(spans, perm)
            if best is None or value < best:
                best = value
    return 0 if best is None else best
