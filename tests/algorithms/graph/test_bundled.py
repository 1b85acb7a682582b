"""The bundled graph profiles (MODEL-graph-bB): what they hold, and the baselines and OLLA on them."""

from __future__ import annotations

import pytest

import memplan
from memplan.profile import bundled_profiles
from tests.oracles.graph import overlaps

GRAPHS = sorted(n for n in bundled_profiles() if "-graph-" in n)
BIG = 10**15


def test_the_issue_list_is_bundled():
    models = ("alexnet", "resnet18", "resnet50", "mobilenet_v2", "vgg16", "gpt-small")
    assert {f"{m}-graph-b{b}" for m in models for b in (1, 32)} <= set(GRAPHS)


@pytest.mark.parametrize("name", GRAPHS)
def test_bundled_graph_profile(name):
    prof = memplan.load_profile(name)
    assert prof.kind == "graph" and prof.device.kind == "cpu"
    assert prof.batch_size == int(name.rsplit("-b", 1)[1])
    kinds = {node.kind for node in prof.graph.nodes}
    assert kinds == {"weight", "input", "forward", "backward", "optimizer"}
    framework = memplan.solve(prof, "framework", BIG)
    greedy = memplan.solve(prof, "greedy-by-size", BIG)
    for sched in (framework, greedy):
        assert sched.feasible and sched.peak_resident == framework.peak_resident
        assert sched.arena >= sched.peak_resident >= prof.weight_size
    assert framework.static_memory == prof.weight_size


@pytest.mark.parametrize("name", ["alexnet-graph-b1", "resnet18-graph-b32"])
def test_olla_on_bundled_graphs(name):
    prof = memplan.load_profile(name)
    framework = memplan.solve(prof, "framework", BIG)
    sched = memplan.solve(prof, "olla", BIG, time_limit=20)
    assert sched.peak_resident <= framework.peak_resident
    assert sched.arena <= framework.arena
    assert overlaps(prof, sched.order, sched.addresses) == []
