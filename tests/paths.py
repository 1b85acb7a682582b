"""Paths the tests read, from wherever a test file sits in the tree."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
"""The repository's root (README.md, docs/, profiles/)."""

MINIMALLOC = ROOT.parent / "shared" / "benchmarks" / "minimalloc"
"""The MiniMalloc benchmark instances, beside the checkout when present."""
