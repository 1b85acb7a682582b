"""One class per name in memplan/ (issue 39 item 5): a name read in a traceback, a docstring or a
review names one class, wherever it is defined.

Read from the source with :mod:`ast` (nothing is imported): every class statement under memplan/,
private and nested ones too.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

from tests.paths import ROOT

PACKAGE = ROOT / "memplan"


def class_definitions(package: Path = PACKAGE) -> dict[str, list[str]]:
    """Where each class name of ``package`` is defined: ``path:line``, in path order."""
    found: dict[str, list[str]] = defaultdict(list)
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ClassDef):
                found[node.name].append(f"{path.relative_to(package.parent)}:{node.lineno}")
    return dict(found)


def test_no_two_classes_share_a_name():
    shared = {name: where for name, where in class_definitions().items() if len(where) > 1}
    assert not shared, "class names defined more than once: " + "; ".join(
        f"{name} ({', '.join(where)})" for name, where in sorted(shared.items())
    )


def test_the_check_sees_nested_and_private_classes(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "a.py").write_text("class _State:\n    pass\n")
    (package / "b.py").write_text("def f():\n    class _State:\n        pass\n")
    assert class_definitions(package) == {"_State": ["pkg/a.py:1", "pkg/b.py:2"]}
