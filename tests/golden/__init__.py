"""Golden schedules: the JSON of every bundled profile x algorithm at two budgets.

``cases.json`` lists the cases (profile, algorithm, budget, options); ``fixtures/`` holds what
``memplan.solve`` printed for each (``Schedule.to_json()``, ``solver.seconds`` stripped), or the
one-line error. ``python -m tests.golden.regenerate`` rebuilds both; tests/golden/test_golden.py solves
every case again and compares the text byte for byte. See NOTE [ golden schedules ] in
:mod:`tests.golden.cases`.
"""
