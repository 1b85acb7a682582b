"""Hostile and huge input files (issue 17 items 1, 3, 4 and 11): refused in one line, exit 2.

Every input is a small file made here: the alias bomb, deep nesting, tampered types, a BOM.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml
from typer.testing import CliRunner

import memplan
from memplan.cli.app import app
from memplan.documents import parse
from memplan.documents.parse import MAX_DEPTH, parse_document
from memplan.profile.synthetic import random_chain

runner = CliRunner()
PROFILE = random_chain(3, seed=1).to_dict()
PROFILE_YAML = yaml.safe_dump(PROFILE, sort_keys=False)


def _write(tmp_path, name: str, text: str):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def _bomb(levels: int = 10) -> str:
    """The billion laughs: ``levels`` nested lists of ten aliases each (10^levels leaves)."""
    lines = ['  a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for level in range(1, levels):
        name, previous = chr(ord("a") + level), chr(ord("a") + level - 1)
        lines.append(f"  {name}: &{name} [" + ", ".join([f"*{previous}"] * 10) + "]")
    return "extra:\n" + "\n".join(lines) + "\n"


def _one_line_exit_2(result) -> str:
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("memplan: error: "), result.stderr
    assert "Traceback" not in result.stderr
    return lines[0]


# --------------------------------------------------------------------------- item 1


def test_alias_bomb_in_extra_is_refused_in_one_line(tmp_path):
    path = _write(tmp_path, "bomb.yaml", PROFILE_YAML + _bomb())
    assert path.stat().st_size < 1500  # the bomb was 735 bytes
    line = _one_line_exit_2(runner.invoke(app, ["info", str(path)]))
    assert "bomb.yaml" in line and "aliases expand 96 nodes to 12345679086" in line


def test_alias_bomb_on_stdin_and_in_a_schedule_is_refused(tmp_path):
    line = _one_line_exit_2(runner.invoke(app, ["info", "-"], input=PROFILE_YAML + _bomb()))
    assert "<stdin>" in line and "aliases expand" in line
    prof = _write(tmp_path, "p.yaml", PROFILE_YAML)
    sched = memplan.solve(PROFILE, "rotor", "1GB", optimizer="none").to_yaml()
    bomb = _write(tmp_path, "s.yaml", sched.replace("solver:", _bomb() + "solver:", 1))
    line = _one_line_exit_2(runner.invoke(app, ["simulate", str(prof), str(bomb)]))
    assert "s.yaml" in line and "aliases expand" in line


def test_aliases_and_merge_keys_within_the_allowance_still_load():
    text = PROFILE_YAML.replace("stages:\n", "base: &base {forward_overhead: 0}\nstages:\n", 1)
    data = parse_document(text, "x")
    assert data["base"] == {"forward_overhead": 0}
    merged = parse_document("a: &a {x: 1, y: 2}\nb:\n  <<: *a\n  y: 3\n", "x")
    assert merged == yaml.safe_load("a: &a {x: 1, y: 2}\nb:\n  <<: *a\n  y: 3\n")
    with pytest.raises(memplan.InputError, match="contains it"):
        parse_document("a: &r [*r]\n", "x")


def test_merge_keys_on_every_stage_of_a_long_chain_load():
    """``<<: *defaults`` on 3000 stages adds 21 000 nodes: well within the allowance."""
    stages = "".join(
        f"- {{<<: *d, name: s{k}, output_size: 4, saved_size: 8}}\n" for k in range(3000)
    )
    text = (
        "format: memplan-profile/1\nmodel: merged\ninput_size: 4\n"
        "defaults: &d {forward_time: 1.0, backward_time: 2.0, weight_size: 16}\n"
        f"stages:\n{stages}"
    ).replace("defaults: &d", "extra: {defaults: &d", 1)
    text = text.replace("weight_size: 16}\n", "weight_size: 16}}\n", 1)
    prof = memplan.load_profile(text)
    assert prof.length == 3000 and prof.stages[-1].backward_time == 2.0
    assert prof.weight_size == 3000 * 16


def test_input_larger_than_the_cap_is_refused_before_parsing(tmp_path):
    path = _write(tmp_path, "big.yaml", PROFILE_YAML + "extra: {pad: '" + "x" * 4000 + "'}\n")
    env = {"MEMPLAN_MAX_INPUT": "2KiB"}
    line = _one_line_exit_2(runner.invoke(app, ["info", str(path)], env=env))
    assert "big.yaml" in line and "larger than 2 KiB," in line and "MEMPLAN_MAX_INPUT" in line
    text = path.read_text()
    line = _one_line_exit_2(runner.invoke(app, ["info", "-"], input=text, env=env))
    assert "<stdin>" in line and "larger than" in line
    assert runner.invoke(app, ["info", str(path)]).exit_code == 0  # the default cap: 256 MiB
    bad = _one_line_exit_2(runner.invoke(app, ["info", str(path)], env={"MEMPLAN_MAX_INPUT": "8G"}))
    assert "MEMPLAN_MAX_INPUT" in bad


# --------------------------------------------------------------------------- item 3


@pytest.mark.parametrize("kind", ["yaml", "json"])
def test_deep_nesting_is_refused_without_a_crash(tmp_path, kind):
    """100 000 nested lists: PyYAML's C composer overflowed the C stack (a segfault), the pure
    loader raised RecursionError (exit 70). Run in a subprocess: a crash must not take pytest."""
    depth = 100_000
    if kind == "yaml":
        text = PROFILE_YAML + "extra: " + "[" * depth + "]" * depth + "\n"
    else:
        doc = json.dumps(PROFILE)
        text = doc[:-1] + ', "extra": {"x": ' + "[" * depth + "]" * depth + "}}"
    path = _write(tmp_path, f"deep.{kind}", text)
    done = subprocess.run(
        [sys.executable, "-m", "memplan", "info", str(path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2, done.stderr
    assert f"nested deeper than {MAX_DEPTH} levels" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


class _ParserWithItsOwnLimit(yaml.SafeLoader):
    """A YAML parser that stops nesting itself at 3 levels, with its own message, as libyaml 0.2.5
    and newer do at 1000 levels (PyYAML 6.0.4's ``CSafeLoader``)."""

    depth = 0

    def get_event(self):
        event = super().get_event()
        if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            self.depth += 1
            if self.depth > 3:
                raise yaml.parser.ParserError(
                    None, None, "exceeded maximum nesting depth", event.start_mark
                )
        elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            self.depth -= 1
        return event


def test_a_parser_limit_changes_neither_the_limit_nor_the_message(monkeypatch):
    """Whatever limit the installed YAML parser has, memplan's is MAX_DEPTH, with its message."""
    text = "x: " + "[" * 150 + "]" * 150
    with pytest.raises(memplan.InputError) as plain:
        parse_document(text, "deep.yaml")
    monkeypatch.setattr(parse, "_LOADER", _ParserWithItsOwnLimit)
    with pytest.raises(memplan.InputError) as limited:
        parse_document(text, "deep.yaml")
    assert str(limited.value) == str(plain.value)
    assert (
        str(plain.value) == f"deep.yaml: line 1, column 103: nested deeper than {MAX_DEPTH} levels"
    )
    assert parse_document("x: [[[[[1]]]]]", "ok.yaml") == {"x": [[[[[1]]]]]}


def test_nesting_up_to_the_limit_loads():
    depth = MAX_DEPTH - 1  # the document's mapping is the first level
    data = parse_document("x: " + "[" * depth + "]" * depth, "x")
    for _ in range(depth):
        data = data["x"] if isinstance(data, dict) else data[0] if data else data
    assert data == []


@pytest.mark.parametrize("rate", ["1e-300", "1e300", "0", "inf", "nan"])
def test_extreme_bandwidths_are_usage_errors(rate):
    result = runner.invoke(
        app, ["solve", "resnet18", "--algo", "dynprog", "--mem", "400MB", "--bandwidth", rate]
    )
    line = _one_line_exit_2(result)
    assert "--bandwidth" in line and "Warning" not in result.stderr


@pytest.mark.parametrize("algo", ["dynprog", "greedy", "vdnn", "pofo"])
@pytest.mark.parametrize("rate", ["0.001", "1e15"])
def test_the_extreme_bandwidths_accepted_solve_cleanly(algo, rate):
    result = runner.invoke(
        app, ["solve", "resnet18", "--algo", algo, "--mem", "400MB", "--bandwidth", rate]
    )
    assert result.exit_code in (0, 1), result.stderr
    assert "Warning" not in result.stderr and "internal error" not in result.stderr


def test_a_profile_bandwidth_out_of_range_is_refused():
    with pytest.raises(memplan.InputError, match="bandwidth"):
        memplan.load_profile({**PROFILE, "bandwidth": 1e-300})


# --------------------------------------------------------------------------- item 4


def test_the_c_parser_is_used_when_pyyaml_has_it():
    if hasattr(yaml, "CSafeLoader"):
        assert parse._LOADER is yaml.CSafeLoader
    else:  # pragma: no cover - PyYAML built without libyaml
        assert parse._LOADER is yaml.SafeLoader


@pytest.mark.slow
def test_every_bundled_profile_parses_as_safe_load_reads_it():
    for name, path in memplan.profile.bundled_profiles().items():
        text = path.read_text(encoding="utf-8")
        assert parse_document(text, name) == yaml.safe_load(text), name


@pytest.mark.parametrize(
    "text",
    [
        "a: yes\nb: 1_000\nc: 0x1f\nd: 1:30\ne: .inf\nf: ~\ng: 2026-11-21\nh: '1'\ni: !!str 5\n",
        "a: &x 1\nb: *x\nc: [*x, {d: *x}]\n",
        "m1: &m1 {a: 1}\nm2: &m2 {a: 2, b: 2}\nc:\n  <<: [*m1, *m2]\n  e: 5\n",
        "",
        "- 1\n- [2, {a: b}]\n",
        "a: 1\na: 2\n",
        '{"a": [1, 2.5, null, true], "b": {"c": "d"}}',
        "{a: 1, b: [x, y]}",
    ],
)
def test_documents_parse_as_yaml_safe_load_does(text):
    assert parse_document(text, "x") == yaml.safe_load(text)


def test_json_schedules_round_trip_through_the_json_path(tmp_path):
    sched = memplan.solve("resnet18", "rotor", "1GB")
    path = _write(tmp_path, "s.json", sched.to_json())
    assert memplan.load_schedule(str(path)) == sched
    assert parse_document(" \n" + sched.to_json(), "s.json") == sched.to_dict()


def test_a_json_looking_yaml_flow_mapping_falls_back_to_yaml():
    assert parse_document("{a: 1, 'b': [x]}", "x") == {"a": 1, "b": ["x"]}
    assert parse_document('{"a": NaN}', "x") == {"a": "NaN"}  # as YAML reads it: text


@pytest.mark.parametrize("tag", ["!!binary aGk=", "!!set {a, b}", "!!python/tuple [1, 2]", "!x 1"])
def test_tags_beyond_plain_data_are_refused(tag):
    with pytest.raises(memplan.InputError, match="is not supported"):
        parse_document(f"a: {tag}\n", "x")


@pytest.mark.parametrize(
    ("text", "what"),
    [
        ("a: !!int abc", "'abc' as !!int"),
        ("a: !!bool maybe", "'maybe' as !!bool"),
        ("a: 2026-13-45", "'2026-13-45' as !!timestamp"),
        ("a: !!timestamp x", "'x' as !!timestamp"),
    ],
)
def test_scalars_that_do_not_read_as_their_tag_are_input_errors(text, what):
    with pytest.raises(memplan.InputError, match=f"line 1, column 4: cannot read {what}"):
        parse_document(text, "x")


def test_a_large_profile_loads(tmp_path):
    """10 000 stages (the most a profile holds): parsed and validated (no timing asserted; the
    speed is in docs/benchmarks.md)."""
    big = random_chain(10_000, seed=3)
    path = _write(tmp_path, "big.yaml", memplan.profile.save_profile(big))
    assert memplan.load_profile(str(path)) == big


# --------------------------------------------------------------------------- item 11


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("output_size", "6422528"),
        ("weight_size", True),
        ("saved_size", 4.0e6),
        ("forward_time", "1.5"),
        ("backward_time", False),
    ],
)
def test_strict_types_in_profiles(field, value):
    data = json.loads(json.dumps(PROFILE))
    data["stages"][1][field] = value
    with pytest.raises(memplan.InputError, match=rf"stages\[1\]\.{field}: Input should be"):
        memplan.load_profile(data)


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("budget", "memory"), "8000000000"),
        (("feasible",), "true"),
        (("ops", 0, "stage"), "0"),
        (("static_memory",), 1.5),
    ],
)
def test_strict_types_in_schedules(path, value):
    doc = memplan.solve(PROFILE, "rotor", "1GB", optimizer="none").to_dict()
    target = doc
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    with pytest.raises(memplan.InputError, match="Input should be"):
        memplan.load_schedule(doc)


def test_numbers_in_exponent_form_and_unquoted_dates_load():
    text = PROFILE_YAML.replace("model:", "bandwidth: 12.2e9\nmodel:", 1)
    text = text.replace("model:", "measured: {date: 2026-11-21T10:00:00Z}\nmodel:", 1)
    prof = memplan.load_profile(text)
    assert prof.bandwidth == 12.2e9 and prof.measured.date == "2026-11-21T10:00:00Z"


def test_csv_with_a_bom_loads_and_underscores_are_refused(tmp_path):
    bom = tmp_path / "bom.csv"
    bom.write_bytes("\ufeffid,lower,upper,size\na,0,2,4\nb,1,3,4\n".encode())
    placed = runner.invoke(app, ["alloc", str(bom)])
    assert placed.exit_code == 0, placed.stderr
    assert placed.stdout.splitlines()[0] == "id,lower,upper,size,offset"
    for bad in ("1_000", "٣", " 1 2"):
        csv = _write(tmp_path, "u.csv", f"id,lower,upper,size\na,0,2,{bad}\n")
        line = _one_line_exit_2(runner.invoke(app, ["alloc", str(csv)]))
        assert "line 2: size: expected an integer" in line


def test_yaml_profile_with_a_bom_loads(tmp_path):
    path = tmp_path / "bom.yaml"
    path.write_bytes(b"\xef\xbb\xbf" + PROFILE_YAML.encode())
    assert memplan.load_profile(str(path)).model == PROFILE["model"]
