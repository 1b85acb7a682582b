"""No production function over 80 lines without a reason in its docstring (issue 39 item 5).

Read from the source with :mod:`ast` (nothing is imported): every function and method under
memplan/, nested ones too. A function's length is its lines from ``def`` to its last line (the
signature counts: a command's options are part of the command) less its docstring, which says
what the function does and why and is never a reason to cut one. A function over
:data:`MOST_LINES` passes only when its docstring has a line that starts with :data:`MARKER` and
says why it is one function: a split that would scatter one algorithm (a CP-SAT model in its
paper's order, one loop inlined for speed) is such a reason; length itself is not.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.paths import ROOT

PACKAGE = ROOT / "memplan"
MOST_LINES = 80
"""Lines a function may have (docstring apart) without saying why it is longer."""
MARKER = "Long because:"
"""How a docstring line giving the reason for a long function starts."""
Function = ast.FunctionDef | ast.AsyncFunctionDef


def function_lines(node: Function) -> int:
    """Lines of ``node`` from its ``def`` to its end, its docstring left out (decorators too)."""
    assert node.end_lineno is not None
    lines = node.end_lineno - node.lineno + 1
    first = node.body[0]
    if (
        isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
    ):
        assert first.end_lineno is not None
        lines -= first.end_lineno - first.lineno + 1
    return lines


def has_reason(node: Function) -> bool:
    """Whether the docstring of ``node`` has a line that starts with :data:`MARKER` and a reason."""
    doc = ast.get_docstring(node) or ""
    for line in doc.splitlines():
        text = line.strip()
        if text.startswith(MARKER) and len(text) > len(MARKER) + 10:
            return True
    return False


def long_functions(package: Path = PACKAGE) -> list[tuple[str, int, bool]]:
    """``(path:line name, lines, has a reason)`` of every function of ``package`` over the bound."""
    found = []
    for path in sorted(package.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = function_lines(node)
                if lines > MOST_LINES:
                    where = f"{path.relative_to(package.parent)}:{node.lineno} {node.name}"
                    found.append((where, lines, has_reason(node)))
    return found


def test_every_long_function_says_why():
    unexplained = [f"{where} ({lines} lines)" for where, lines, why in long_functions() if not why]
    assert not unexplained, (
        f"functions over {MOST_LINES} lines (docstring apart) without a '{MARKER}' line in their "
        "docstring: split them, or say why they are one function\n" + "\n".join(unexplained)
    )


def test_a_reason_is_given_only_where_it_is_needed():
    """A function cut below the bound keeps no stale reason (the marker would say nothing)."""
    stale = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            is_function = isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            if is_function and has_reason(node) and function_lines(node) <= MOST_LINES:
                stale.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}")
    assert not stale, f"'{MARKER}' on functions of {MOST_LINES} lines or fewer: " + ", ".join(stale)


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("def f():\n" + "    x = 1\n" * 79, []),
        ("def f():\n" + "    x = 1\n" * 80, [("m.py:1 f", 81, False)]),
        ('def f():\n    """Doc.\n\n    More.\n    """\n' + "    x = 1\n" * 79, []),
        (
            'class C:\n    def g(self):\n        """Do.\n\n        Long because: one model in '
            'the paper\'s order.\n        """\n' + "        x = 1\n" * 81,
            [("m.py:2 g", 82, True)],
        ),
        (
            'def f():\n    """Long because:"""\n' + "    x = 1\n" * 80,
            [("m.py:1 f", 81, False)],  # a marker without a reason is none
        ),
    ],
    ids=["at the bound", "over it", "docstring apart", "a method with its reason", "no reason"],
)
def test_the_count(tmp_path, source, expected):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "m.py").write_text(source)
    found = long_functions(package)
    assert [(where.split("/")[-1], lines, why) for where, lines, why in found] == expected
