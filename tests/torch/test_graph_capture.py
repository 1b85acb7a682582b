"""Capture of a training step as a graph (make_fx + FakeTensorMode): views, in-place ops, kinds."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

import memplan  # noqa: E402
from memplan.algorithms.graph.problem import GraphProblem  # noqa: E402
from memplan.profile.model import Profile  # noqa: E402
from memplan.torch.profiler.graph import capture_graph, profile_graph  # noqa: E402

pytestmark = pytest.mark.torch


class Tiny(nn.Module):
    """A view of the input, a linear layer, an in-place ReLU, a second linear layer."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x):
        h = self.fc1(x.view(x.shape[0], -1))
        return self.fc2(torch.relu_(h))


def _reaches(problem: GraphProblem, a: int, b: int) -> bool:
    stack, seen = [a], set()
    while stack:
        v = stack.pop()
        if v == b:
            return True
        if v not in seen:
            seen.add(v)
            stack.extend(problem.succ[v])
    return False


def test_tiny_model_graph_rules():
    graph, info = capture_graph(Tiny(), batch_size=3, input_shape=(2, 4))
    assert info["batch_size"] == 3 and info["input_shape"] == [2, 4]
    nodes = {n.name: n for n in graph.nodes}
    tensors = {t.name: t for t in graph.tensors}
    weights = [n for n in graph.nodes if n.kind == "weight"]
    assert sorted(n.name for n in weights) == ["fc1.bias", "fc1.weight", "fc2.bias", "fc2.weight"]
    assert tensors["fc1.weight"].size == 16 * 8 * 4 and tensors["fc2.bias"].size == 4 * 4
    assert tensors["input"].size == 3 * 8 * 4 and tensors["target"].size == 3 * 8
    # rule 1: views create no node and no tensor
    assert not {n.op for n in graph.nodes} & {"aten.view", "aten.t", "aten.detach", "aten.expand"}
    # the input is read through its view by the forward addmm and the weight-gradient mm
    readers = {nodes[c].op for c in tensors["input"].consumers}
    assert "aten.addmm" in readers and "aten.mm" in readers
    # rule 2: relu_ writes the addmm output in place: a consumer that creates nothing
    relu = [n for n in graph.nodes if n.op == "aten.relu_"]
    assert len(relu) == 1
    assert not any(t.producer == relu[0].name and t.size > 0 for t in graph.tensors)
    hidden = [t for t in graph.tensors if relu[0].name in t.consumers and t.size == 3 * 16 * 4]
    assert len(hidden) == 1 and nodes[hidden[0].producer].op == "aten.addmm"
    # kinds: one SGD update per parameter, after the backward
    updates = [n for n in graph.nodes if n.kind == "optimizer"]
    assert len(updates) == 4 and all(n.op == "aten.add_" for n in updates)
    assert {n.kind for n in graph.nodes} == {"weight", "input", "forward", "backward", "optimizer"}
    # rule 3: every reader of a weight runs before the update that overwrites it
    problem = GraphProblem.from_profile(Profile(model="t", graph=graph))
    index = {name: k for k, name in enumerate(problem.names)}
    for w in weights:
        update = next(c for c in tensors[w.name].consumers if nodes[c].kind == "optimizer")
        for reader in tensors[w.name].consumers:
            if reader != update:
                assert _reaches(problem, index[reader], index[update]), (reader, update)
    # each gradient is read by its update only, and is as large as its parameter
    for u in updates:
        grads = [t for t in graph.tensors if u.name in t.consumers and t.producer != "fc1.weight"]
        assert any(t.size in (16 * 8 * 4, 16 * 4, 4 * 16 * 4, 4 * 4) for t in grads)


def test_gpt_tiny_capture_solves():
    prof = profile_graph("gpt-tiny", batch_size=2)
    assert prof.kind == "graph" and prof.batch_size == 2
    framework = memplan.solve(prof, "framework", 10**12)
    olla = memplan.solve(prof, "olla-order", 10**12, time_limit=20)
    assert olla.peak_resident <= framework.peak_resident
    assert framework.static_memory == sum(p.numel() * 4 for p in _gpt_tiny().parameters())


def _gpt_tiny():
    from memplan.torch.models.registry import MODELS

    with torch.device("meta"):
        return MODELS["gpt-tiny"]()


def test_cli_profile_graph(tmp_path):
    from typer.testing import CliRunner

    from memplan.cli.app import app

    out = tmp_path / "g.yaml"
    result = CliRunner().invoke(
        app, ["profile", "alexnet", "--graph", "--batch-size", "2", "-o", str(out)]
    )
    assert result.exit_code == 0, result.output
    prof = memplan.load_profile(str(out))
    assert prof.kind == "graph" and prof.model == "alexnet" and prof.batch_size == 2
    bad = CliRunner().invoke(app, ["profile", "alexnet", "--graph", "--repeats", "3"])
    assert bad.exit_code == 2 and "--graph" in bad.output
