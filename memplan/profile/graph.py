"""The ``graph:`` section of a profile: an operator-level training graph (papers/002, OLLA).

A first shape after the SPEC (nodes and tensors); the graph family settles the details and
documents them in docs/formats.md.

- ``nodes``: operators in the order the framework runs them (``kind`` forward, backward,
  optimizer, weight or input; ``time`` in ms).
- ``tensors``: every buffer, its ``size`` in bytes, the node that produces it and the nodes that
  read it. A tensor lives from its producer to its last consumer.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from memplan.profile.fields import Bytes, Milliseconds, Strict

NodeKind = Literal["forward", "backward", "optimizer", "weight", "input"]


class GraphNode(Strict):
    """One operator of the training step."""

    name: str
    op: str = Field(description="the operator, e.g. aten.convolution")
    kind: NodeKind
    time: Milliseconds = 0.0
    extra: dict[str, Any] | None = None


class GraphTensor(Strict):
    """One buffer: produced by ``producer``, read by ``consumers``."""

    name: str
    size: Bytes
    producer: str
    consumers: list[str] = []
    extra: dict[str, Any] | None = None


class Graph(Strict):
    """A dataflow graph: operators and the tensors between them."""

    nodes: list[GraphNode] = Field(min_length=1)
    tensors: list[GraphTensor] = []
    extra: dict[str, Any] | None = None

    @property
    def weight_size(self) -> int:
        """Bytes of the tensors produced by ``weight`` nodes."""
        weights = {node.name for node in self.nodes if node.kind == "weight"}
        return sum(t.size for t in self.tensors if t.producer in weights)

    @property
    def compute_time(self) -> float:
        """Every operator once (ms)."""
        return sum(node.time for node in self.nodes)
