"""Bad input never crashes: random damage to a valid profile gives InputError or a valid profile."""

from __future__ import annotations

import copy

import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

import memplan
from memplan.profile.synthetic import random_chain
from tests.strategies import examples

VALID = random_chain(4, seed=7).to_dict()
KEYS = ["model", "input_size", "stages", "format", "batch_size", "device", "bandwidth", "extra"]
STAGE_KEYS = list(VALID["stages"][0]) + ["grad_size", "bogus"]
JUNK = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**20), max_value=10**20),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=5),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)


@st.composite
def damaged_profiles(draw):
    data = copy.deepcopy(VALID)
    for _ in range(draw(st.integers(1, 3))):
        if draw(st.booleans()):
            key = draw(st.sampled_from(KEYS))
            if draw(st.booleans()):
                data.pop(key, None)
            else:
                data[key] = draw(JUNK)
        elif isinstance(data.get("stages"), list) and data["stages"]:
            stage = data["stages"][draw(st.integers(0, len(data["stages"]) - 1))]
            if isinstance(stage, dict):
                key = draw(st.sampled_from(STAGE_KEYS))
                if draw(st.booleans()):
                    stage.pop(key, None)
                else:
                    stage[key] = draw(JUNK)
    return data


@settings(max_examples=examples(300), deadline=None)
@given(damaged_profiles())
def test_damaged_profiles_raise_input_error_or_load(data):
    try:
        prof = memplan.load_profile(data)
    except memplan.InputError as error:
        assert "\n" not in str(error)
        return
    sched = memplan.solve(prof, "rotor", "1GB", optimizer="none")
    assert memplan.simulate(prof, sched).valid == sched.feasible


@settings(max_examples=examples(200), deadline=None)
@given(st.text(max_size=200))
def test_arbitrary_text_never_crashes(text):
    try:
        memplan.load_profile(text if "\n" in text else text + "\n")
    except memplan.InputError as error:
        assert "\n" not in str(error)


def test_yaml_with_python_tags_is_refused():
    text = yaml.safe_dump(VALID) + "extra: !!python/object/apply:os.system ['true']\n"
    try:
        memplan.load_profile(text)
    except memplan.InputError as error:
        assert "!!python/object/apply:os.system is not supported" in str(error)
    else:  # pragma: no cover
        raise AssertionError("an unsafe YAML tag was accepted")
