"""The graph section of a profile: validation (one line naming the field), CLI exit codes."""

from __future__ import annotations

import pytest
import yaml
from typer.testing import CliRunner

import memplan
from memplan.cli.app import app
from memplan.errors import InputError


def _doc(nodes, tensors):
    return {
        "format": "memplan-profile/1",
        "model": "toy",
        "graph": {
            "nodes": [{"name": n, "op": "op", "kind": k} for n, k in nodes],
            "tensors": [
                {"name": t, "size": s, "producer": p, "consumers": c} for t, s, p, c in tensors
            ],
        },
    }


GOOD = _doc(
    [("w", "weight"), ("a", "input"), ("b", "forward"), ("c", "backward")],
    [("W", 8, "w", ["b"]), ("x", 4, "a", ["b", "c"]), ("y", 2, "b", ["c"])],
)


def test_a_valid_graph_loads_and_describes():
    prof = memplan.load_profile(GOOD)
    assert prof.kind == "graph" and prof.families == ("graph",)
    assert prof.weight_size == 8 and prof.length == 4
    desc = memplan.api.describe(prof)
    assert desc["graph"]["nodes"] == 4
    # framework order w a b c: step 2 (b) holds W, x, y
    assert desc["graph"]["framework_peak_resident"] == 14


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        (
            _doc(
                [("a", "forward"), ("b", "forward")], [("x", 1, "a", ["b"]), ("y", 1, "b", ["a"])]
            ),
            r"graph: tensors: the graph has a cycle: (a -> b -> a|b -> a -> b)",
        ),
        (
            _doc([("a", "forward"), ("b", "forward")], [("x", 1, "b", ["a"])]),
            r"graph: tensors\[0\]\.consumers\[0\]: node 'a' \(nodes\[0\]\) reads tensor 'x' "
            r"before its producer 'b'",
        ),
        (
            _doc([("a", "forward")], [("x", 1, "nope", [])]),
            r"graph: tensors\[0\]\.producer: unknown node 'nope'",
        ),
        (
            _doc([("a", "forward")], [("x", 1, "a", ["zz"])]),
            r"graph: tensors\[0\]\.consumers\[0\]: unknown node 'zz'",
        ),
        (
            _doc([("a", "forward"), ("a", "forward")], []),
            r"graph: nodes\[1\]\.name: duplicate node name 'a'",
        ),
        (
            _doc([("a", "forward")], [("x", 1, "a", []), ("x", 2, "a", [])]),
            r"graph: tensors\[1\]\.name: duplicate tensor name 'x'",
        ),
        (
            _doc([("a", "forward")], [("x", -1, "a", [])]),
            r"graph\.tensors\[0\]\.size",
        ),
        (
            _doc([("a", "sideways")], []),
            r"graph\.nodes\[0\]\.kind",
        ),
    ],
)
def test_bad_graphs_are_one_line_input_errors(doc, message):
    with pytest.raises(InputError, match=message) as info:
        memplan.load_profile(doc)
    assert "\n" not in str(info.value)


def test_self_loop_is_a_cycle():
    doc = _doc([("a", "forward")], [("x", 1, "a", ["a"])])
    with pytest.raises(InputError, match="cycle: a -> a"):
        memplan.load_profile(doc)


@pytest.mark.parametrize(
    ("doc", "needle"),
    [
        (
            _doc(
                [("a", "forward"), ("b", "forward")], [("x", 1, "a", ["b"]), ("y", 1, "b", ["a"])]
            ),
            "cycle",
        ),
        (_doc([("a", "forward"), ("b", "forward")], [("x", 1, "b", ["a"])]), "before its producer"),
    ],
)
def test_cli_exit_2_one_line_no_traceback(tmp_path, doc, needle):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(doc))
    for args in (["solve", str(path), "--algo", "olla", "--mem", "1GB"], ["info", str(path)]):
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 2, result.output
        lines = [line for line in result.output.splitlines() if line.strip()]
        assert len(lines) == 1 and needle in lines[0] and "bad.yaml" in lines[0]
        assert "Traceback" not in result.output


def test_chain_algorithm_on_a_graph_profile_is_a_usage_error():
    with pytest.raises(InputError, match="graph famil"):
        memplan.solve(GOOD, algo="rotor", memory="1GB")
