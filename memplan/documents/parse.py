"""Parse YAML and JSON documents fast and safely (profiles, schedules, GPU specs).

NOTE [ document parsing ]
Every file memplan reads goes through :func:`parse_document`, which holds the limits of hostile
input and is the fast path of huge input:

- **JSON first.** A document starting with ``{`` or ``[`` is parsed by :func:`json.loads` (C,
  about 100x faster than any YAML loader); when that fails it is parsed as YAML (a YAML flow
  mapping may start with ``{`` too). ``NaN`` and ``Infinity`` are not JSON and are refused.
- **YAML from the parser's events.** PyYAML's own loaders compose a node graph (recursively: the C
  composer overflows the C stack and kills the process on ~100 000 nested brackets) and then
  construct Python objects from it, which is where most of their time goes. Here the events of
  libyaml's C parser (``yaml.CSafeLoader``, or PyYAML's pure-Python parser where libyaml is
  missing) are turned into dicts, lists and scalars in one iterative loop. Plain scalars are
  resolved as ``yaml.safe_load`` resolves them (YAML 1.1: ``yes`` is True, ``1_000`` is 1000,
  ``2026-11-21`` a date), except that ``1e12`` and ``1.5e3`` are numbers as in YAML 1.2 and JSON
  (YAML 1.1 reads an exponent without a dot and a sign as text); merge keys (``<<: *base``) work; tags other than the core ones
  (``!!binary``, ``!!set``, ``!!python/...``, local tags) are refused: memplan files hold
  JSON-like data. A 4 MB graph profile loads about 5x faster than with ``CSafeLoader``
  (docs/benchmarks.md, "Parsing large profiles").
- **Limits** (exit 2, one line naming the file, line and column): nesting deeper than
  :data:`MAX_DEPTH`; aliases that would expand the document by more than :data:`ALIAS_FACTOR`
  times its own size or :data:`ALIAS_ALLOWANCE` nodes (an alias bomb: 735 bytes of ten nested
  levels of ten aliases are 10^10 nodes once expanded); an alias to a collection that contains it; more
  than one document in a stream. The size cap (:func:`max_input_bytes`) is applied by the
  readers in :mod:`memplan.profile.io`.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

import yaml
from yaml.events import (
    AliasEvent,
    DocumentEndEvent,
    DocumentStartEvent,
    MappingEndEvent,
    MappingStartEvent,
    ScalarEvent,
    SequenceEndEvent,
    SequenceStartEvent,
    StreamEndEvent,
    StreamStartEvent,
)
from yaml.nodes import ScalarNode

from memplan.errors import InputError

MAX_DEPTH = 100
"""The deepest nesting of mappings and lists accepted (a profile needs about 6)."""

ALIAS_FACTOR = 10
ALIAS_ALLOWANCE = 1_000_000
"""YAML aliases (and merge keys) may add ALIAS_FACTOR times the nodes a document writes, or
ALIAS_ALLOWANCE nodes when that is more (see NOTE above): ``<<: *defaults`` on every stage of a
10 000-stage profile is fine, ten levels of ten aliases (10^10 nodes) are not."""

DEFAULT_MAX_INPUT = 256 * 2**20
"""Largest input read, in bytes (256 MiB), unless ``MEMPLAN_MAX_INPUT`` says otherwise."""

_TAG = "tag:yaml.org,2002:"
_STR, _SEQ, _MAP, _MERGE = _TAG + "str", _TAG + "seq", _TAG + "map", _TAG + "merge"
_VALUE = _TAG + "value"  # a plain ``=``: text, as yaml.safe_load reads it
_FLOAT = _TAG + "float"
_EXPONENT = re.compile(r"[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)[eE][-+]?[0-9]+\Z")
"""``1e12``, ``1.5E3``: numbers in YAML 1.2 and JSON, text in YAML 1.1 (PyYAML)."""
_SCALAR_TAGS = frozenset(_TAG + t for t in ("str", "int", "float", "bool", "null", "timestamp"))
"""Scalar tags constructed (the rest, e.g. ``!!binary``, are refused)."""

_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
"""libyaml's parser when PyYAML was built with it, else the pure-Python one."""


def max_input_bytes() -> int:
    """The input size cap: ``MEMPLAN_MAX_INPUT`` (``512MiB``, ``1GB``, bytes) or 256 MiB."""
    text = os.environ.get("MEMPLAN_MAX_INPUT", "").strip()
    if not text:
        return DEFAULT_MAX_INPUT
    from memplan.units import parse_size

    try:
        return parse_size(text)
    except InputError as exc:
        raise InputError(f"MEMPLAN_MAX_INPUT: {exc}") from None


def parse_document(text: str, source: str) -> Any:
    """Parse one YAML or JSON document (see NOTE [ document parsing ]).

    Raises
    ------
    InputError
        One line: ``net.yaml: line 3, column 7: ...`` for malformed input or a broken limit.
    """
    start = len(text) - len(text.lstrip()) if text[:1].isspace() else 0
    if text[start : start + 1] in ("{", "["):
        try:
            data = json.loads(text, parse_constant=_no_constant)
        except (json.JSONDecodeError, _NotJson):
            pass  # not JSON: YAML flow syntax (where NaN is text), or malformed (YAML says where)
        except RecursionError:
            raise InputError(f"{source}: nested deeper than {MAX_DEPTH} levels") from None
        except ValueError as exc:  # e.g. an integer of more than 4300 digits
            raise InputError(f"{source}: malformed JSON: {' '.join(str(exc).split())}") from None
        else:
            _check_depth(data, source)
            return data
    return _parse_yaml(text, source)


class _NotJson(ValueError):
    pass


def _no_constant(name: str) -> Any:
    raise _NotJson(f"{name} is not a JSON number")


def _check_depth(data: Any, source: str) -> None:
    """Refuse JSON nested deeper than MAX_DEPTH (an iterative walk over the containers)."""
    todo = [(data, 1)] if isinstance(data, (dict, list)) else []
    while todo:
        item, depth = todo.pop()
        if depth > MAX_DEPTH:
            raise InputError(f"{source}: nested deeper than {MAX_DEPTH} levels")
        values = item.values() if isinstance(item, dict) else item
        todo.extend((v, depth + 1) for v in values if isinstance(v, (dict, list)))


def _where(source: str, mark: Any) -> str:
    if mark is None:
        return source
    return f"{source}: line {mark.line + 1}, column {mark.column + 1}"


def _parse_yaml(text: str, source: str) -> Any:
    """The document's data from ``_LOADER``'s events; where that parser stops deep nesting itself
    (libyaml 0.2.5 and newer, at 1000 flow levels), from PyYAML's pure-Python parser, which reads
    on until :func:`_build` stops at :data:`MAX_DEPTH`: the same message and position whatever
    PyYAML and libyaml the user has.
    """
    try:
        return _parse_with(_LOADER, text, source)
    except _ParserTooDeep:
        return _parse_with(yaml.SafeLoader, text, source)


class _ParserTooDeep(Exception):
    pass


def _parse_with(loader_class: Any, text: str, source: str) -> Any:
    loader = loader_class(text)
    try:
        return _build(loader, source)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        if "nesting depth" in problem:  # the parser's own limit, deeper than MAX_DEPTH
            if loader_class is not yaml.SafeLoader:
                raise _ParserTooDeep from None
            raise InputError(
                f"{_where(source, mark)}: nested deeper than {MAX_DEPTH} levels"
            ) from None
        raise InputError(f"{_where(source, mark)}: malformed YAML/JSON: {problem}") from None
    finally:
        loader.dispose()


class _Frame:
    """An open mapping or list: the container, the key waiting for its value, merges, size."""

    __slots__ = ("container", "is_map", "key", "has_key", "nodes", "anchor", "merges", "mark")

    def __init__(self, container: Any, is_map: bool, anchor: str | None, mark: Any) -> None:
        self.container = container
        self.is_map = is_map
        self.key: Any = None
        self.has_key = False
        self.nodes = 1  # this collection, plus its children (aliases expanded) as they close
        self.anchor = anchor
        self.merges: list[tuple[Any, Any]] | None = None
        self.mark = mark


def _build(loader: Any, source: str) -> Any:  # noqa: C901 - one loop over the events, its hot path inline
    """Turn the parser's events into Python data (one document; limits of the NOTE).

    One loop over the events, a branch per kind: a scalar, an alias or a closed collection is an
    item, added to the open collection on top of ``stack`` or, with none open, the document's
    root. Adding an item stays in the loop: as a helper called for every event it cost about 6%
    more CPU time parsing a 3 MB graph profile (benchmarks/bench_parse.py's; the best of 41 runs
    each, side by side, one thread).
    """
    get_event = loader.get_event
    event = get_event()
    assert isinstance(event, StreamStartEvent)
    event = get_event()
    if isinstance(event, StreamEndEvent):
        return None
    assert isinstance(event, DocumentStartEvent)
    scalar = _Scalars(loader, source)
    stack: list[_Frame] = []
    anchors: dict[str, tuple[Any, int | None]] = {}
    events = 0  # nodes actually written in the document
    expanded = 0  # nodes of the document once its aliases are expanded
    root: Any = None
    while True:
        event = get_event()
        kind = type(event)
        if kind is ScalarEvent:
            events += 1
            item, nodes = scalar.value(event), 1
            if event.anchor is not None:
                anchors[event.anchor] = (item, 1)
        elif kind is MappingStartEvent or kind is SequenceStartEvent:
            events += 1
            frame = _open(event, kind is MappingStartEvent, len(stack), source)
            if event.anchor is not None:
                anchors[event.anchor] = (frame.container, None)
            stack.append(frame)
            continue
        elif kind is MappingEndEvent or kind is SequenceEndEvent:
            frame = stack.pop()
            if frame.merges:
                _merge(frame, source)
            item, nodes = frame.container, frame.nodes
            if frame.anchor is not None:
                anchors[frame.anchor] = (item, nodes)
        elif kind is AliasEvent:
            item, nodes = _alias(anchors, event, source)
        elif kind is DocumentEndEvent:
            break
        else:  # pragma: no cover - the parser emits nothing else inside a document
            raise InputError(f"{_where(source, event.start_mark)}: unexpected YAML event")
        if not stack:
            root, expanded = item, nodes
            continue
        top = stack[-1]
        top.nodes += nodes
        if not top.is_map:
            if item is _MERGE_KEY:
                raise InputError(f"{_where(source, event.start_mark)}: '<<' is only a key")
            top.container.append(item)
        elif not top.has_key:
            if item is _MERGE_KEY:
                top.merges = top.merges or []
            top.key, top.has_key = item, True
        else:
            key, top.key, top.has_key = top.key, None, False
            if key is _MERGE_KEY:
                assert top.merges is not None
                top.merges.append((item, event.start_mark))
                continue
            if item is _MERGE_KEY:
                raise InputError(f"{_where(source, event.start_mark)}: '<<' is only a key")
            try:
                top.container[key] = item
            except TypeError:
                raise InputError(
                    f"{_where(source, top.mark)}: a mapping key must be a scalar, "
                    f"got a {type(key).__name__}"
                ) from None
    _check_end(get_event, root, events, expanded, source)
    return root


class _Scalars:
    """Scalar events to values, as ``yaml.safe_load`` reads them (the tags of plain scalars
    resolved once per distinct text).
    """

    def __init__(self, loader: Any, source: str) -> None:
        self.loader = loader
        self.resolve = loader.resolve
        self.constructors = loader.yaml_constructors
        self.source = source
        self.resolved: dict[str, str] = {}

    def value(self, event: Any) -> Any:
        value = event.value
        tag = event.tag
        if tag is None or tag == "!":
            if event.implicit[0]:
                tag = self.resolved.get(value)
                if tag is None:
                    tag = self.resolve(ScalarNode, value, (True, False))
                    if tag == _STR and _EXPONENT.match(value):
                        tag = _FLOAT
                    self.resolved[value] = tag
            else:
                tag = _STR
        if tag in (_STR, _VALUE):
            return value
        if tag == _MERGE:
            return _MERGE_KEY
        if tag in _SCALAR_TAGS:
            node = ScalarNode(tag, value, event.start_mark, event.end_mark, event.style)
            try:
                return self.constructors[tag](self.loader, node)
            except (ValueError, KeyError, TypeError, AttributeError, OverflowError):
                short = tag.replace(_TAG, "!!")  # `!!int abc`, `2026-13-45` (a bad date)
                raise InputError(
                    f"{_where(self.source, event.start_mark)}: cannot read {value!r} as {short}"
                ) from None
        raise InputError(f"{_where(self.source, event.start_mark)}: {_unsupported(tag)}")


def _open(event: Any, is_map: bool, depth: int, source: str) -> _Frame:
    """A mapping or a list opened at ``depth``: its tag checked, :data:`MAX_DEPTH` held."""
    if event.tag not in (None, "!", _MAP if is_map else _SEQ):
        raise InputError(f"{_where(source, event.start_mark)}: {_unsupported(event.tag)}")
    if depth >= MAX_DEPTH:
        raise InputError(
            f"{_where(source, event.start_mark)}: nested deeper than {MAX_DEPTH} levels"
        )
    return _Frame({} if is_map else [], is_map, event.anchor, event.start_mark)


def _alias(anchors: dict[str, tuple[Any, int | None]], event: Any, source: str) -> tuple[Any, int]:
    """The item an alias names and its nodes once expanded."""
    found = anchors.get(event.anchor)
    if found is None:
        raise InputError(
            f"{_where(source, event.start_mark)}: found undefined alias *{event.anchor}"
        )
    item, count = found
    if count is None:
        raise InputError(
            f"{_where(source, event.start_mark)}: alias *{event.anchor} refers to a "
            "collection that contains it"
        )
    return item, count


def _check_end(get_event: Any, root: Any, events: int, expanded: int, source: str) -> None:
    """After the document: no second one, a root that is not ``<<``, and aliases that expand
    the document by no more than the NOTE's limits.
    """
    if not isinstance(get_event(), StreamEndEvent):
        raise InputError(f"{source}: expected a single document, found another one")
    if root is _MERGE_KEY:
        raise InputError(f"{source}: '<<' is only a key")
    allowed = max(ALIAS_FACTOR * events, ALIAS_ALLOWANCE)
    if expanded - events > allowed:
        raise InputError(
            f"{source}: YAML aliases expand {events} nodes to {expanded} "
            f"(more than {allowed} extra nodes): write the values out"
        )


class _MergeKey:
    """The ``<<`` merge key while its mapping is open."""


_MERGE_KEY = _MergeKey()


def _merge(frame: _Frame, source: str) -> None:
    """Apply ``<<`` merge keys as ``yaml.safe_load`` does: explicit keys win, then earlier merges.

    ``<<: *a`` merges one mapping, ``<<: [*a, *b]`` several (``a`` wins over ``b``); of two ``<<``
    keys in one mapping the later wins.
    """
    merged: dict[Any, Any] = {}
    assert frame.merges is not None
    for value, mark in frame.merges:
        sources = value if isinstance(value, list) else [value]
        for part in reversed(sources):
            if not isinstance(part, dict):
                raise InputError(
                    f"{_where(source, mark)}: '<<' expects a mapping or a list of mappings, "
                    f"got a {type(part).__name__}"
                )
            merged.update(part)
    explicit = frame.container
    for key, value in explicit.items():
        merged[key] = value
    explicit.clear()
    explicit.update(merged)


def _unsupported(tag: str) -> str:
    short = tag.replace(_TAG, "!!")
    return f"YAML tag {short} is not supported (memplan files hold plain mappings, lists, scalars)"
