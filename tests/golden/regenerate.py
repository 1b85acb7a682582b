"""Rebuild the golden plans: ``python -m tests.golden.regenerate [PROFILE ...]``.

Writes tests/golden/cases.json (every case, the OR-Tools version), tests/golden/summary.txt (one
line per case) and the whole JSON of the cases of ``FULL_SCHEDULES`` under tests/golden/schedules/;
with profile names, only their cases are solved again (the other lines are kept as recorded).
Prints each case's time on stderr. Run it when a change of output is intended (re-measured
profiles, a solver's new rounding), then review the diff of summary.txt: every changed line is a
changed answer, and its fields say what changed (a plan of the same cost, a new makespan...).
"""

from __future__ import annotations

import json
import sys
import time

from tests.golden.cases import (
    DETERMINISTIC_SECONDS,
    FULL_SCHEDULES,
    MANIFEST,
    SUMMARY,
    all_cases,
    deterministic_cpsat,
    heavy,
    ortools_version,
    read_summary,
    render,
    schedule_path,
    summary_line,
    write_summary,
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
    lines = read_summary() if only and SUMMARY.exists() else {}
    total = 0.0
    with deterministic_cpsat():
        for case in cases:
            if only and case["profile"] not in only:
                continue
            started = time.perf_counter()
            text = render(case)
            seconds = time.perf_counter() - started
            total += seconds
            lines[case["id"]] = summary_line(case["id"], text)
            if case["id"] in FULL_SCHEDULES:
                path = schedule_path(case["id"])
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text)
            mark = " heavy" if heavy(case) else ""
            print(f"{seconds:8.3f} s  {case['id']}{mark}", file=sys.stderr, flush=True)
    missing = [case["id"] for case in cases if case["id"] not in lines]
    if missing:
        print(f"new cases not solved ({', '.join(missing)}): run without names", file=sys.stderr)
        return 2
    write_summary(lines, [case["id"] for case in cases])
    print(f"{total:8.3f} s  in all", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
