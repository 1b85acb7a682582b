"""memplan/_core.pyi, the typed stub of the compiled core, says what the core binds: the same
names at the top and in each class, and every function and method with the same parameters, in
the same order, the same ones optional (read from nanobind's signatures)."""

from __future__ import annotations

import ast

import pytest

from memplan import _core
from tests.paths import ROOT

STUB = ast.parse((ROOT / "memplan" / "_core.pyi").read_text())


def _stubbed(body: list[ast.stmt]) -> dict[str, ast.stmt]:
    found: dict[str, ast.stmt] = {}
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            found[node.name] = node
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            found[node.target.id] = node
    return found


def _stub_parameters(node: ast.FunctionDef) -> list[tuple[str, bool]]:
    """(name, has a default) of each parameter of a stubbed function, ``self`` left out."""
    args = node.args.args
    defaults = [False] * (len(args) - len(node.args.defaults)) + [True] * len(node.args.defaults)
    return [(a.arg, d) for a, d in zip(args, defaults, strict=True) if a.arg != "self"]


def _core_parameters(function: object) -> list[tuple[str, bool]]:
    """(name, has a default) of each parameter in nanobind's signature ``def f(a: T, b: U = v)``."""
    text = function.__nb_signature__[0][0]  # type: ignore[attr-defined]
    parts: list[tuple[str, bool]] = []  # (text before any ':' or '=', a '=' outside brackets)
    depth, current, default = 0, "", False
    for char in text[text.index("(") + 1 :]:
        if char in "([{":
            depth += 1
        elif char in ")]}":
            if depth == 0:
                break
            depth -= 1
        if depth == 0 and char == ",":
            parts.append((current, default))
            current, default = "", False
            continue
        default = default or (depth == 0 and char == "=")
        current += char
    parts.append((current, default))
    found = []
    for part, has_default in parts:
        name = part.split(":")[0].split("=")[0].strip()
        if name and name not in ("self", "*", "/"):
            found.append((name, has_default))
    return found


def _public(obj: object) -> set[str]:
    return {name for name in vars(obj) if not name.startswith("_")}


def test_the_stub_names_what_the_core_binds() -> None:
    assert set(_stubbed(STUB.body)) == _public(_core)


CLASSES = [name for name, node in _stubbed(STUB.body).items() if isinstance(node, ast.ClassDef)]
FUNCTIONS = [
    name for name, node in _stubbed(STUB.body).items() if isinstance(node, ast.FunctionDef)
]


@pytest.mark.parametrize("name", CLASSES)
def test_each_class_has_the_stubbed_members(name: str) -> None:
    node = _stubbed(STUB.body)[name]
    assert isinstance(node, ast.ClassDef)
    members = _stubbed(node.body)
    cls = getattr(_core, name)
    assert set(members) - {"__init__"} == _public(cls)
    for member, stub in members.items():
        if isinstance(stub, ast.FunctionDef) and not any(
            isinstance(d, ast.Name) and d.id == "property" for d in stub.decorator_list
        ):
            assert _stub_parameters(stub) == _core_parameters(getattr(cls, member)), member


@pytest.mark.parametrize("name", FUNCTIONS)
def test_each_function_has_the_stubbed_parameters(name: str) -> None:
    node = _stubbed(STUB.body)[name]
    assert isinstance(node, ast.FunctionDef)
    assert _stub_parameters(node) == _core_parameters(getattr(_core, name))
