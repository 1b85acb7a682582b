"""Profile validation (field paths in messages), lookup of bundled profiles, stdin, atomic writes."""

from __future__ import annotations

import io

import pytest

import memplan
from memplan import InputError, load_profile
from memplan.profile import io as profile_io
from memplan.profile.synthetic import random_chain


def _valid() -> dict:
    return random_chain(3, seed=1).to_dict()


def test_round_trip(tmp_path):
    prof = random_chain(4, seed=2)
    path = tmp_path / "p.yaml"
    memplan.save_profile(prof, path)
    assert load_profile(path) == prof
    assert load_profile(str(path)).sha256() == prof.sha256()
    assert load_profile(path.read_text()) == prof  # YAML text


@pytest.mark.parametrize(
    ("mutate", "pattern"),
    [
        (lambda d: d["stages"][2].update(output_size=-5), r"stages\[2\]\.output_size"),
        (lambda d: d["stages"][1].pop("forward_time"), r"stages\[1\]\.forward_time: missing"),
        (lambda d: d.update(colour="red"), r"colour: unknown field"),
        (lambda d: d["stages"][0].update(saved_size=0), r"stages\[0\]: .*must include the output"),
        (lambda d: d.update(format="memplan-profile/9"), r"format: expected"),
        (lambda d: d.pop("format"), r"format: missing"),
        (lambda d: d.update(stages=[]), r"stages: "),
        (lambda d: d["stages"][0].update(backward_time="slow"), r"stages\[0\]\.backward_time"),
        (lambda d: d.update(bandwidth=0), r"bandwidth"),
    ],
)
def test_bad_fields_name_the_path(mutate, pattern):
    data = _valid()
    mutate(data)
    with pytest.raises(InputError, match=pattern) as info:
        load_profile(data)
    assert "\n" not in str(info.value)


def test_extra_is_kept():
    data = _valid()
    data["extra"] = {"anything": [1, 2]}
    data["stages"][0]["extra"] = {"note": "x"}
    prof = load_profile(data)
    assert prof.extra == {"anything": [1, 2]}


def test_malformed_yaml_names_file_and_line(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("format: memplan-profile/1\nstages: [\n  - {a: 1\n")
    with pytest.raises(InputError, match=r"bad\.yaml:.*line \d+.*malformed"):
        load_profile(path)


def test_missing_file():
    with pytest.raises(InputError, match=r"nope\.yaml: no such file"):
        load_profile("nope.yaml")


def test_stdin(monkeypatch):
    text = memplan.save_profile(random_chain(2, seed=3))
    monkeypatch.setattr("sys.stdin", io.StringIO(text))
    assert load_profile("-").length == 2


def test_bundled_lookup_exact_then_prefix(tmp_path, monkeypatch):
    for name in ("net", "net@a100", "net@v100", "other"):
        memplan.save_profile(random_chain(2, seed=1), tmp_path / f"{name}.yaml")
    monkeypatch.setattr(profile_io, "BUNDLED_DIR", tmp_path)
    assert profile_io.resolve_bundled("net").name == "net.yaml"  # exact name wins
    assert profile_io.resolve_bundled("oth").name == "other.yaml"  # unique prefix
    with pytest.raises(InputError, match="ambiguous.*net@a100, net@v100"):
        profile_io.resolve_bundled("net@")
    with pytest.raises(InputError, match="no such file or bundled profile"):
        profile_io.resolve_bundled("zzz")


def test_every_bundled_profile_loads():
    bundled = profile_io.bundled_profiles()
    for name in bundled:
        prof = load_profile(name)
        assert prof.length >= 3
        assert prof.device is not None


def test_atomic_write_leaves_no_partial_file(tmp_path, monkeypatch):
    target = tmp_path / "out.yaml"
    target.write_text("old")

    def boom(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(profile_io.os, "replace", boom)
    with pytest.raises(KeyboardInterrupt):
        profile_io.write_atomic(target, "new content")
    assert target.read_text() == "old"
    assert list(tmp_path.iterdir()) == [target]


def _join_document(**changes):
    stage = {"name": "s", "forward_time": 1, "backward_time": 1, "output_size": 4, "saved_size": 4}
    doc = {
        "format": "memplan-profile/1",
        "model": "tiny-join",
        "branches": [{"name": "a", "input_size": 4, "stages": [stage]}],
        "turn": dict(stage, name="loss"),
    }
    doc.update(changes)
    return {k: v for k, v in doc.items() if v is not None}


def test_join_profile_shape_and_families():
    prof = memplan.load_profile(_join_document())
    assert prof.kind == "join" and prof.families == ("join",)
    assert prof.length == 2 and prof.lower_bound == 4.0
    chain = memplan.load_profile("resnet18")
    assert chain.kind == "chain" and "join" not in chain.families


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"turn": None}, "turn missing"),
        ({"stages": _join_document()["branches"][0]["stages"], "input_size": 4}, "either 'stages'"),
        ({"branches": None, "turn": None}, "expected 'stages'"),
    ],
)
def test_malformed_profile_shapes_are_one_line_errors(changes, message):
    with pytest.raises(memplan.InputError, match=message) as info:
        memplan.load_profile(_join_document(**changes))
    assert "\n" not in str(info.value)


def test_chain_without_input_size_names_the_field():
    doc = memplan.load_profile("resnet18").to_dict()
    del doc["input_size"]
    with pytest.raises(memplan.InputError, match=r"^<profile>: input_size: missing"):
        memplan.load_profile(doc)


def test_algorithm_of_another_family_is_a_usage_error_naming_the_fitting_family():
    with pytest.raises(memplan.InputError, match=r"rotor \(chain family\).*join family"):
        memplan.solve(_join_document(), algo="rotor", memory="1GB")
