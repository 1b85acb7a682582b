"""Golden plans: every bundled profile x algorithm at two budgets, as memplan.solve answers them.

``cases.json`` lists the cases (profile, algorithm, budget, options); ``summary.txt`` holds one line
per case (outcome, makespan, peak and least memory, status, digests of the plan and of the rest of
the schedule's JSON) and ``schedules/`` the whole JSON of a handful of small cases.
``python -m tests.golden.regenerate`` rebuilds them; tests/golden/test_golden.py solves the cases
again and compares. See NOTE [ golden schedules ] in :mod:`tests.golden.cases`.
"""
