"""The graph family's view of a training graph: indices, lifetimes, resident memory (OLLA, Steiner et al. 2022).

:class:`GraphProblem` turns the profile's ``graph`` (names) into integer arrays that the
heuristics and the CP-SAT models share: tensor sizes, producers, consumers, dependencies between
nodes and the framework order. Lifetimes follow section 2.2 of the paper: a tensor is resident from
the step its producer runs to the step its last consumer runs (both included); a tensor produced by
a ``weight`` node is resident during the whole step (weights, buffers and optimizer state persist
from one training step to the next).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from memplan.profile.model import Profile


@dataclass
class GraphProblem:
    """A training graph as arrays; node ``i`` is ``profile.graph.nodes[i]`` (framework order)."""

    names: list[str]
    kinds: list[str]
    times: np.ndarray
    tensor_names: list[str]
    sizes: np.ndarray
    producer: np.ndarray
    consumers: list[list[int]]
    succ: list[list[int]] = field(default_factory=list)
    pred: list[list[int]] = field(default_factory=list)

    @classmethod
    def from_profile(cls, profile: Profile) -> GraphProblem:
        graph = profile.graph
        assert graph is not None, "a graph profile"
        index = graph.node_index()
        n = len(graph.nodes)
        producer = np.array([index[t.producer] for t in graph.tensors], dtype=np.int64)
        consumers = [[index[c] for c in t.consumers] for t in graph.tensors]
        succ_sets: list[set[int]] = [set() for _ in range(n)]
        for p, cs in zip(producer.tolist(), consumers, strict=True):
            succ_sets[p].update(cs)
        succ = [sorted(s) for s in succ_sets]
        pred: list[list[int]] = [[] for _ in range(n)]
        for v, ws in enumerate(succ):
            for w in ws:
                pred[w].append(v)
        return cls(
            names=[node.name for node in graph.nodes],
            kinds=[node.kind for node in graph.nodes],
            times=np.array([node.time for node in graph.nodes], dtype=float),
            tensor_names=[t.name for t in graph.tensors],
            sizes=np.array([t.size for t in graph.tensors], dtype=np.int64),
            producer=producer,
            consumers=consumers,
            succ=succ,
            pred=pred,
        )

    @property
    def n_nodes(self) -> int:
        return len(self.names)

    @property
    def persistent(self) -> np.ndarray:
        """Mask of the tensors resident during the whole step (produced by ``weight`` nodes)."""
        weight = np.array([k == "weight" for k in self.kinds], dtype=bool)
        return weight[self.producer] if len(self.producer) else np.zeros(0, dtype=bool)

    @property
    def persistent_bytes(self) -> int:
        return int(self.sizes[self.persistent].sum())

    @property
    def framework_order(self) -> list[int]:
        """The order the framework runs the nodes (the order of ``nodes``)."""
        return list(range(self.n_nodes))

    def lifetimes(self, order: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """``(first step, last step)`` of every tensor when the nodes run in ``order``."""
        position = np.empty(self.n_nodes, dtype=np.int64)
        position[np.asarray(order, dtype=np.int64)] = np.arange(len(order))
        start = position[self.producer]
        end = start.copy()
        for i, cs in enumerate(self.consumers):
            if cs:
                end[i] = max(end[i], int(position[cs].max()))
        persistent = self.persistent
        start[persistent] = 0
        end[persistent] = len(order) - 1
        return start, end

    def resident(self, order: Sequence[int]) -> np.ndarray:
        """Bytes resident at each step of ``order`` (eq. 13 of OLLA (Steiner et al. 2022) for one order)."""
        start, end = self.lifetimes(order)
        delta = np.zeros(len(order) + 1, dtype=np.int64)
        np.add.at(delta, start, self.sizes)
        np.add.at(delta, end + 1, -self.sizes)
        return np.cumsum(delta[:-1])

    def peak_resident(self, order: Sequence[int]) -> int:
        """Peak resident memory of ``order``, without fragmentation."""
        return int(self.resident(order).max()) if len(order) else 0

    def is_topological(self, order: Sequence[int], extra: Sequence[tuple[int, int]] = ()) -> bool:
        """Whether ``order`` runs every node once and every dependency (and ``extra``) in order."""
        if sorted(order) != list(range(self.n_nodes)):
            return False
        position = {v: k for k, v in enumerate(order)}
        edges = [(v, w) for v in range(self.n_nodes) for w in self.succ[v]] + list(extra)
        return all(position[v] < position[w] for v, w in edges)

    def topological_order(
        self, priority: Sequence[int] | None = None, extra: Sequence[tuple[int, int]] = ()
    ) -> list[int]:
        """The topological order that always runs the ready node of least ``priority``.

        With the default priority (the framework position) and no ``extra`` edges this is the
        framework order itself; with ``extra`` control edges it is the framework order bent as
        little as the edges require.
        """
        import heapq

        prio = list(range(self.n_nodes)) if priority is None else list(priority)
        succ = [list(s) for s in self.succ]
        for v, w in extra:
            succ[v].append(w)
        indeg = [0] * self.n_nodes
        for ws in succ:
            for w in ws:
                indeg[w] += 1
        ready = [(prio[v], v) for v in range(self.n_nodes) if indeg[v] == 0]
        heapq.heapify(ready)
        order: list[int] = []
        while ready:
            _, v = heapq.heappop(ready)
            order.append(v)
            for w in succ[v]:
                indeg[w] -= 1
                if indeg[w] == 0:
                    heapq.heappush(ready, (prio[w], w))
        if len(order) != self.n_nodes:  # pragma: no cover - the profile validator rejects cycles
            raise ValueError("the graph (with its control edges) has a cycle")
        return order
