"""The import graph of memplan/: imports point one way (no circle, no private name crossing a module).

Read from the source with :mod:`ast` (nothing is imported): every ``import`` statement, at the top
of a module or inside a function, is an arrow from the module that holds it to the module it names
(except under ``if TYPE_CHECKING:``, which never runs: type checkers read annotations lazily).
The compiled kernels, ``memplan._core`` (an extension module, private by the usual convention), are
imported by their one public wrapper, :mod:`memplan.core`, alone.
A package's ``__init__`` is not an arrow target when a submodule is named (importing
``memplan.torch.split.linearize`` runs ``memplan/torch/__init__.py`` first, as for any package).
The torch layer is also held to its floors, lowest first, as ``memplan/torch/__init__.py`` states.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.paths import ROOT

PACKAGE = ROOT / "memplan"

TORCH_FLOORS = (
    ("memplan.torch.base",),
    ("memplan.torch.zoo", "memplan.torch.estimate"),
    ("memplan.torch.models",),
    ("memplan.torch.split",),
    ("memplan.torch.runtime",),
    ("memplan.torch.measure",),
    ("memplan.torch.profiler",),
    ("memplan.torch.planner", "memplan.torch.compare"),
)
"""The torch layer's floors, lowest first: a module imports from its own floor or those below."""


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _is_package(name: str) -> bool:
    return MODULES[name].name == "__init__.py"


def _target(name: str) -> str | None:
    """The memplan module that ``name`` (a module, or a module's attribute) lives in."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


COMPILED = "memplan._core"
"""The compiled kernels' extension module (src/module.cpp), wrapped by :mod:`memplan.core`."""


def _type_checking_only(tree: ast.Module) -> set[int]:
    """The ``id`` of every node under an ``if TYPE_CHECKING:`` block."""
    hidden: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            hidden |= {id(sub) for stmt in node.body for sub in ast.walk(stmt)}
    return hidden


def _imports(name: str) -> list[tuple[str, list[str], int]]:
    """``(module, names imported from it, line)`` for every import statement of module ``name``
    that runs (not those under ``if TYPE_CHECKING:``)."""
    tree = ast.parse(MODULES[name].read_text(), filename=str(MODULES[name]))
    hidden = _type_checking_only(tree)
    found = []
    for node in ast.walk(tree):
        if id(node) in hidden:
            continue
        if isinstance(node, ast.Import):
            found += [(alias.name, [], node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name if _is_package(name) else name.rpartition(".")[0]
                for _ in range(node.level - 1):
                    anchor = anchor.rpartition(".")[0]
                base = f"{anchor}.{base}" if base else anchor
            found.append((base, [alias.name for alias in node.names], node.lineno))
    return found


def _arrows(name: str) -> set[str]:
    arrows = set()
    for module, names, _ in _imports(name):
        if not module.startswith("memplan"):
            continue
        full = [f"{module}.{n}" for n in names]
        if COMPILED in full or module == COMPILED:
            continue  # an extension module, not a source module that could import back
        targets = [_target(f) for f in full] or [_target(module)]
        arrows |= {t for t in targets if t and t != name}
    return arrows


GRAPH = {name: _arrows(name) for name in MODULES}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_memplan_has_no_import_circle() -> None:
    assert _cycles(GRAPH) == []


def test_no_private_name_is_imported_from_another_module() -> None:
    crossing = [
        f"{name}:{line} imports {module}.{n}"
        for name in MODULES
        for module, names, line in _imports(name)
        if module.startswith("memplan")
        for n in names
        if n.startswith("_") and not n.startswith("__")
        if not (name == "memplan.core" and f"{module}.{n}" == COMPILED)
    ]
    assert crossing == []


def test_the_torch_layer_has_no_import_circle() -> None:
    torch_graph = {
        name: {t for t in arrows if t.startswith("memplan.torch")}
        for name, arrows in GRAPH.items()
        if name.startswith("memplan.torch")
    }
    assert _cycles(torch_graph) == []


def _floor(name: str) -> int | None:
    for i, floor in enumerate(TORCH_FLOORS):
        if any(name == p or name.startswith(p + ".") for p in floor):
            return i
    return None


def test_every_torch_module_sits_on_a_floor() -> None:
    assert [
        name for name in MODULES if name.startswith("memplan.torch.") and _floor(name) is None
    ] == []


def test_the_torch_layer_imports_point_down() -> None:
    upward = [
        f"{name} (floor {_floor(name)}) imports {target} (floor {_floor(target)})"
        for name, arrows in GRAPH.items()
        if name.startswith("memplan.torch.")
        for target in arrows
        if target.startswith("memplan.torch.") and _floor(target) > _floor(name)  # type: ignore[operator]
    ]
    assert upward == []


def test_the_cycle_finder_finds_a_circle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


# -- the oracles stand alone ------------------------------------------------------------------------

ORACLES = ROOT / "tests" / "oracles"
CHECKED = ("memplan.algorithms", "memplan.alloc", "memplan.core", "memplan._core")
"""What the oracles check: the algorithms, the allocator and the compiled core."""
DATA_TYPES = {
    "memplan.algorithms.base": {"Sequence"},  # a plan: list of (operation, stage)
    "memplan.algorithms.chain.problem": {"ChainInstance"},  # a chain's sizes and times
}
"""The only names an oracle may take from :data:`CHECKED`: the documented data types of the
problems (docs/formats.md, docs/model.md), no code that computes an answer."""


def _oracle_imports(path: Path) -> list[tuple[str, str, int]]:
    """``(module, name, line)`` of every name an oracle imports from memplan (a plain ``import
    memplan.x`` counts as the name ``*``)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found += [(node.module, alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [(alias.name, "*", node.lineno) for alias in node.names]
    return [(module, name, line) for module, name, line in found if module.startswith("memplan")]


def test_no_oracle_imports_the_code_it_checks() -> None:
    """An oracle computes its answer on its own: from the algorithms, the allocator and the core
    it takes only data types (tests/oracles/*.py)."""
    borrowed = [
        f"{path.name}:{line} imports {name} from {module}"
        for path in sorted(ORACLES.glob("*.py"))
        for module, name, line in _oracle_imports(path)
        if any(module == c or module.startswith(c + ".") for c in CHECKED)
        and name not in DATA_TYPES.get(module, set())
    ]
    assert borrowed == []


def test_the_oracle_check_sees_a_borrowed_kernel(tmp_path: Path) -> None:
    source = "from memplan.algorithms.chain import rotor\nfrom memplan.schedule import Op\n"
    (tmp_path / "oracle.py").write_text(source)
    assert _oracle_imports(tmp_path / "oracle.py") == [
        ("memplan.algorithms.chain", "rotor", 1),
        ("memplan.schedule", "Op", 2),
    ]


def test_profiles_and_schedules_read_their_documents_from_below() -> None:
    """Issue 39: no loop between memplan/profile/ and memplan/schedule.py, even through late
    imports; the document helpers they share live below both (memplan/documents/), and so do
    the training loop's names (memplan/loop.py)."""
    profile = [name for name in MODULES if name.startswith("memplan.profile")]
    assert not [name for name in profile if "memplan.schedule" in GRAPH[name]]
    for name in ("memplan.schedule", "memplan.gpu", "memplan.loop", "memplan.documents.io"):
        assert not [t for t in GRAPH[name] if t.startswith("memplan.profile")], name
    assert "memplan.schedule" not in GRAPH["memplan.loop"]
