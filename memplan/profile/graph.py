"""The ``graph:`` section of a profile: an operator-level training graph (OLLA, Steiner et al. 2022).

The format is documented in docs/formats.md ("Graph profiles"); in short:

- ``nodes``: the operators of one training step (forward, backward, optimizer step), **in the
  order the framework runs them** (that order is the ``framework`` baseline). ``kind`` is
  ``forward``, ``backward``, ``optimizer``, ``weight`` (a parameter, buffer or optimizer state:
  persistent) or ``input`` (a batch tensor); ``time`` in ms (0 when the capture did not time it).
- ``tensors``: every *storage* (a view shares its base's storage and is not a tensor of its own),
  its ``size`` in bytes, the node that produces it and the nodes that read or write it. A tensor
  lives from its producer to its last consumer, both included; a tensor produced by a ``weight``
  node is resident during the whole step (it persists from one step to the next). A tensor of
  size 0 is a *control edge*: it orders its producer before its consumers and holds no memory
  (OLLA (Steiner et al. 2022) section 4.3 encodes control edges the same way).

The validator checks what the solvers and the simulator rely on: unique names, known producer and
consumer names, an acyclic graph, and nodes listed in an order that runs every producer before its
consumers. Each failure is one line naming the field (``tensors[3].consumers[0]``).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from memplan.profile.fields import Bytes, Milliseconds, Strict

NodeKind = Literal["forward", "backward", "optimizer", "weight", "input"]
PERSISTENT_KINDS = ("weight",)
"""Node kinds whose tensors are resident during the whole step."""


class GraphNode(Strict):
    """One operator of the training step."""

    name: str
    op: str = Field(description="the operator, e.g. aten.convolution")
    kind: NodeKind
    time: Milliseconds = 0.0
    extra: dict[str, Any] | None = None


class GraphTensor(Strict):
    """One storage: produced by ``producer``, read (or written in place) by ``consumers``."""

    name: str
    size: Bytes
    producer: str
    consumers: list[str] = []
    extra: dict[str, Any] | None = None


class Graph(Strict):
    """A dataflow graph: operators and the tensors between them (validated, acyclic)."""

    nodes: list[GraphNode] = Field(min_length=1)
    tensors: list[GraphTensor] = []
    extra: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _check_graph(self) -> Graph:
        index: dict[str, int] = {}
        for i, node in enumerate(self.nodes):
            if node.name in index:
                raise ValueError(
                    f"nodes[{i}].name: duplicate node name {node.name!r} "
                    f"(also nodes[{index[node.name]}])"
                )
            index[node.name] = i
        seen: dict[str, int] = {}
        for i, tensor in enumerate(self.tensors):
            if tensor.name in seen:
                raise ValueError(
                    f"tensors[{i}].name: duplicate tensor name {tensor.name!r} "
                    f"(also tensors[{seen[tensor.name]}])"
                )
            seen[tensor.name] = i
            if tensor.producer not in index:
                raise ValueError(
                    f"tensors[{i}].producer: unknown node {tensor.producer!r} "
                    f"(tensor {tensor.name!r})"
                )
            for j, consumer in enumerate(tensor.consumers):
                if consumer not in index:
                    raise ValueError(
                        f"tensors[{i}].consumers[{j}]: unknown node {consumer!r} "
                        f"(tensor {tensor.name!r})"
                    )
        cycle = _find_cycle(len(self.nodes), self.edges())
        if cycle is not None:
            path = " -> ".join(self.nodes[v].name for v in cycle)
            raise ValueError(f"tensors: the graph has a cycle: {path} (expected a DAG)")
        for i, tensor in enumerate(self.tensors):
            p = index[tensor.producer]
            for j, consumer in enumerate(tensor.consumers):
                c = index[consumer]
                if c < p:
                    raise ValueError(
                        f"tensors[{i}].consumers[{j}]: node {consumer!r} (nodes[{c}]) reads "
                        f"tensor {tensor.name!r} before its producer {tensor.producer!r} "
                        f"(nodes[{p}]) runs in the order of 'nodes'"
                    )
        return self

    def node_index(self) -> dict[str, int]:
        """Node name -> position in ``nodes`` (the framework order)."""
        return {node.name: i for i, node in enumerate(self.nodes)}

    def edges(self) -> list[tuple[int, int]]:
        """Distinct dependencies ``(producer index, consumer index)``, control edges included."""
        index = self.node_index()
        found: set[tuple[int, int]] = set()
        for tensor in self.tensors:
            p = index[tensor.producer]
            for consumer in tensor.consumers:
                found.add((p, index[consumer]))
        return sorted(found)

    @property
    def weight_size(self) -> int:
        """Bytes of the tensors produced by ``weight`` nodes (resident the whole step)."""
        weights = {node.name for node in self.nodes if node.kind in PERSISTENT_KINDS}
        return sum(t.size for t in self.tensors if t.producer in weights)

    @property
    def compute_time(self) -> float:
        """Every operator once (ms)."""
        return sum(node.time for node in self.nodes)


def _find_cycle(n: int, edges: list[tuple[int, int]]) -> list[int] | None:
    """One cycle ``[v0, v1, ..., v0]`` of the directed graph, or None when it is acyclic."""
    succ: list[list[int]] = [[] for _ in range(n)]
    for a, b in edges:
        succ[a].append(b)
    color = [0] * n  # 0 new, 1 on the stack, 2 done
    parent = [-1] * n
    for root in range(n):
        if color[root]:
            continue
        stack = [(root, 0)]
        color[root] = 1
        while stack:
            v, k = stack[-1]
            if k < len(succ[v]):
                stack[-1] = (v, k + 1)
                w = succ[v][k]
                if color[w] == 0:
                    color[w], parent[w] = 1, v
                    stack.append((w, 0))
                elif color[w] == 1:  # back edge v -> w closes a cycle
                    cycle = [v]
                    while cycle[-1] != w:
                        cycle.append(parent[cycle[-1]])
                    cycle.reverse()
                    return [*cycle, w]
            else:
                color[v] = 2
                stack.pop()
    return None
