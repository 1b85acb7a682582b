"""The nodes of an autograd graph, each once: what the profiler and the cut walk to find the
tensors a stage's graph accumulates into and which node leads to which.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

__all__ = ["graph_nodes"]


def graph_nodes(root: Any) -> Iterator[Any]:
    """The nodes reachable from ``root`` (a ``grad_fn``; None gives none), depth first, each
    once, ``root`` first. The walk goes on from a node only after it is yielded, so a caller
    may stop it anywhere.
    """
    seen: set[int] = set()
    stack = [root]
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        yield node
        stack.extend(next_node for next_node, _ in node.next_functions)
