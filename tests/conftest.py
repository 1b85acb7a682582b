"""Test configuration.

Hypothesis runs with fixed examples under CI (``CI`` set, as `.ci/run` runs): a landing is then
judged on the same examples every time, while local runs keep drawing new ones to find bugs
(set ``HYPOTHESIS_PROFILE=ci`` to reproduce CI's).
"""

from __future__ import annotations

import os

from hypothesis import settings

settings.register_profile("ci", derandomize=True, print_blob=True)
settings.register_profile("dev", print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))
