"""``--gradients``: the training loop a chain plan is made for, recorded in the schedule and
replayed as recorded (docs/model.md, "The training loop"; docs/formats.md, ``budget.gradients``)."""

from __future__ import annotations

import json

import yaml
from typer.testing import CliRunner

import memplan
from memplan.profile.synthetic import random_chain
from tests.strategies import with_loop_terms


def run(*args: str, stdin: str | None = None):
    from memplan.cli.app import app

    return CliRunner().invoke(app, [str(a) for a in args], input=stdin)


def _measured(tmp_path) -> tuple[str, memplan.Profile]:
    prof = with_loop_terms(random_chain(5, seed=3, max_size=50, overheads=True), 3)
    path = tmp_path / "net.yaml"
    path.write_text(yaml.safe_dump(prof.model_dump(mode="json", exclude_none=True)))
    return str(path), prof


def test_solve_records_the_loop_and_simulate_replays_it(tmp_path):
    path, prof = _measured(tmp_path)
    big = str(10**6)
    auto = json.loads(run("solve", path, "--algo", "store-all", "--mem", big, "-f", "json").stdout)
    kept = json.loads(
        run("solve", path, "-a", "store-all", "-m", big, "--gradients", "kept", "-f", "json").stdout
    )
    assert auto["budget"]["gradients"] == "at-backward"  # a measured profile: PyTorch's loop
    assert kept["budget"]["gradients"] == "kept"
    grads = sum(st.weight_grad_size for st in prof.stages)  # the gradients, static when kept
    assert kept["static_memory"] == auto["static_memory"] + grads
    for doc in (auto, kept):
        (tmp_path / "plan.json").write_text(json.dumps(doc))
        assert run("simulate", path, str(tmp_path / "plan.json")).exit_code == 0
    # replayed for the other loop: a valid plan, other figures (the claims are left out)
    other = run(
        "simulate", path, str(tmp_path / "plan.json"), "--gradients", "at-backward", "-f", "json"
    )
    assert other.exit_code == 0, other.stderr
    assert json.loads(other.stdout)["peak_memory"] != kept["peak_memory"]


def test_a_schedule_without_the_field_replays_as_before(tmp_path):
    """A schedule written before ``budget.gradients`` existed: the model before the loop's terms
    (gradients static, nothing freed), whatever the profile measured."""
    path, prof = _measured(tmp_path)
    doc = json.loads(
        run(
            "solve", path, "-a", "rotor", "-m", str(10**6), "--gradients", "kept", "-f", "json"
        ).stdout
    )
    del doc["budget"]["gradients"]
    old = memplan.Schedule.model_validate(doc)
    assert old.budget.gradients is None
    replay = memplan.simulate(prof, old, check_claims=False)
    assert replay.valid
    before = memplan.api.schedule_from_sequence(prof, [(o.op, o.stage) for o in old.ops])
    assert memplan.simulate(prof, before).peak_memory == replay.peak_memory


def test_a_bad_loop_is_a_usage_error(tmp_path):
    path, _ = _measured(tmp_path)
    result = run("solve", path, "-a", "rotor", "-m", "1MB", "--gradients", "never")
    assert result.exit_code == 2
    try:
        memplan.solve(path, "rotor", "1MB", gradients="never")
    except memplan.InputError as exc:
        assert "gradients='never'" in str(exc)  # the library names its parameter
    else:  # pragma: no cover - the check must raise
        raise AssertionError("gradients='never' was accepted")
