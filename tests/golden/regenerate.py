"""Rebuild the golden schedules: ``python -m tests.golden.regenerate [PROFILE ...]``.

Writes tests/golden/cases.json (every case, the OR-Tools version) and one fixture per case under
tests/golden/fixtures/PROFILE/ALGO-INDEX.json; with profile names, only their fixtures are
rewritten (the manifest still lists every case). Prints each case's time on stderr. Run it when a
change of output is intended (re-measured profiles, a solver's new rounding), then review the
diff: every changed fixture is a changed answer.
"""

from __future__ import annotations

import json
import sys
import time

from tests.golden.cases import (
    DETERMINISTIC_SECONDS,
    FIXTURES,
    MANIFEST,
    all_cases,
    deterministic_cpsat,
    fixture_path,
    heavy,
    ortools_version,
    render,
)


def main(argv: list[str]) -> int:
    only = set(argv)
    cases = all_cases()
    known = {case["profile"] for case in cases}
    unknown = only - known
    if unknown:
        print(f"unknown profile(s): {', '.join(sorted(unknown))}", file=sys.stderr)
        return 2
    manifest = {
        "ortools": ortools_version(),
        "deterministic_seconds": DETERMINISTIC_SECONDS,
        "cases": cases,
    }
    MANIFEST.write_text(json.dumps(manifest, indent=1) + "\n")
    FIXTURES.mkdir(exist_ok=True)
    total = 0.0
    with deterministic_cpsat():
        for case in cases:
            if only and case["profile"] not in only:
                continue
            started = time.perf_counter()
            text = render(case)
            seconds = time.perf_counter() - started
            total += seconds
            path = fixture_path(case)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            mark = " heavy" if heavy(case) else ""
            print(f"{seconds:8.3f} s  {case['id']}{mark}", file=sys.stderr, flush=True)
    print(f"{total:8.3f} s  in all", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
