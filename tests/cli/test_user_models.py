"""The user's model: its errors are bad input (exit 2, one line naming it), memplan's are bugs (70).

NOTE [ whose error ] in memplan/torch/blame.py: building the model and its first forward on the
example input are the user's; a failure in memplan's own code, then or later, is memplan's bug.
Also: the current directory is on the import path only while a factory's module is imported.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from typer.testing import CliRunner  # noqa: E402

import memplan  # noqa: E402
import memplan.torch  # noqa: E402
import memplan.units  # noqa: E402
from memplan.cli.app import app  # noqa: E402
from memplan.errors import BUG_NOTE, InputError  # noqa: E402
from memplan.torch.base import blame  # noqa: E402
from memplan.torch.models import registry as torch_models  # noqa: E402
from memplan.torch.models.registry import build_model  # noqa: E402

pytestmark = pytest.mark.torch

FACTORIES = """
    import torch
    from torch import nn


    def raises():
        raise ValueError("hidden size must be even")


    def asserts():
        assert False, "the user's own assertion"


    class KeyedNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(4, 4)

        def forward(self, x):
            return {"y": self.linear(x)}["missing"]


    def fails_forward():
        return KeyedNet(), torch.randn(2, 4)


    def tiny():
        return nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4)), torch.randn(4, 8)
"""


def run(*args: str):
    return CliRunner().invoke(app, [str(a) for a in args])


@pytest.fixture
def factories(tmp_path, monkeypatch) -> str:
    """A module of factories in the current directory (found from there, as with python -m)."""
    name = f"memplan_user_factories_{os.getpid()}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(FACTORIES))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    monkeypatch.delitem(sys.modules, name, raising=False)
    yield name
    sys.modules.pop(name, None)


def _one_line(result, code: int, *needles: str) -> str:
    assert result.exit_code == code, (result.exit_code, result.stderr)
    assert "Traceback" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    for needle in needles:
        assert needle in last, (needle, last)
    return last


# --------------------------------------------------------------------------- the user's errors


@pytest.mark.parametrize(
    ("factory", "needles"),
    [
        ("raises", ("cannot be built: ValueError: hidden size must be even", "line 7, in raises")),
        ("asserts", ("cannot be built: AssertionError: the user's own assertion",)),
        ("fails_forward", ("fails on its example input: KeyError: 'missing'", "in forward")),
    ],
)
@pytest.mark.parametrize("command", ["profile", "run"])
def test_errors_of_the_users_model_are_bad_input(factories, command, factory, needles):
    spec = f"{factories}:{factory}"
    args = [command, spec] + (["--mem", "1GB"] if command == "run" else ["--repeats", "1"])
    line = _one_line(run(*args), 2, f"memplan: error: model '{spec}'", *needles)
    assert "bug" not in line


def test_the_library_names_the_model_too(factories):
    with pytest.raises(InputError, match=rf"model '{factories}:raises' cannot be built"):
        build_model(f"{factories}:raises")
    with pytest.raises(InputError, match=rf"model '{factories}:fails_forward' fails on its"):
        memplan.torch.profile_model(f"{factories}:fails_forward", repeats=1)
    with pytest.raises(InputError, match=rf"model '{factories}:fails_forward' fails on its"):
        memplan.torch.fit(f"{factories}:fails_forward", memory="1GB")


def test_a_config_the_model_rejects_is_bad_input():
    """The issue's case: phi3 with a vocabulary smaller than its padding index."""
    transformers = pytest.importorskip("transformers")
    if "phi3" not in transformers.CONFIG_MAPPING:
        pytest.skip("this transformers has no phi3")
    config = "num_hidden_layers=1,hidden_size=64,intermediate_size=128,num_attention_heads=2"
    config += ",num_key_value_heads=2,vocab_size=1000"
    result = run("profile", "hf:phi3", "--config", config, "-b", "1", "--input-shape", "8")
    _one_line(
        result,
        2,
        "memplan: error: model 'hf:phi3' with --config",
        "vocab_size=1000",
        "cannot be built",
        "within num_embeddings",
    )


# --------------------------------------------------------------------------- memplan's errors


def test_memplans_own_error_while_building_is_a_bug(factories, monkeypatch):
    """A memplan function called wrongly (a TypeError raised on memplan's own line)."""
    monkeypatch.setattr(torch_models, "example_input", memplan.units.parse_config)
    result = run("profile", "resnet18", "-b", "1", "--input-shape", "3,32,32", "--repeats", "1")
    _one_line(result, 70, "internal error: TypeError", BUG_NOTE)


def test_memplans_own_error_after_the_first_forward_is_a_bug(factories, monkeypatch):
    """Past the first forward, even an error inside the model's layers is memplan's (it ran the
    model wrongly): profiling is memplan's work."""

    def broken(chain, x, **kwargs):
        chain.stages[0][1](x[:, :3])  # a wrong input, given by memplan

    monkeypatch.setattr(
        "memplan.torch.profiler.model.profile_stages", broken
    )  # after the first forward
    result = run("profile", f"{factories}:tiny", "--repeats", "1")
    _one_line(result, 70, "internal error: RuntimeError", BUG_NOTE)


def test_raised_by_model_reads_the_traceback():
    def users_code():
        raise KeyError("k")

    try:
        users_code()
    except KeyError as exc:
        assert blame.raised_by_model(exc, through_module_call=False)
        assert not blame.raised_by_model(exc, through_module_call=True)  # no module call
    try:
        memplan.units.parse_config(object())  # raises on memplan's own line
    except AttributeError as exc:
        assert not blame.raised_by_model(exc, through_module_call=False)


# --------------------------------------------------------------------------- the import path


def test_the_current_directory_is_on_the_path_only_while_importing(factories):
    cwd = os.getcwd()
    model, x, _ = build_model(f"{factories}:tiny")
    assert tuple(x.shape) == (4, 8)
    assert cwd not in sys.path and "" not in sys.path


def test_a_module_of_the_current_directory_does_not_stand_in_for_torchs(tmp_path):
    """A ``sympy.py`` beside the factory: torch imports sympy while profiling, after the factory
    was imported; the real one must come (a real process, launched as the ``memplan`` script is:
    the current directory is not on its path)."""
    (tmp_path / "sympy.py").write_text(
        'raise ImportError("the sympy.py of the cwd was imported")\n'
    )
    (tmp_path / "tinyfactory.py").write_text(textwrap.dedent(FACTORIES))
    launcher = "import sys; del sys.path[0]; from memplan.cli.app import main; main()"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run(
        [sys.executable, "-c", launcher, "profile", "tinyfactory:tiny", "--repeats", "1"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert memplan.load_profile(result.stdout).model == "tinyfactory:tiny"
    assert "cwd was imported" not in result.stderr
    assert Path(tmp_path / "sympy.py").exists()
