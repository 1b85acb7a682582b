"""Test configuration.

Hypothesis runs with fixed examples under CI (``CI`` set, as `.ci/run` runs): a landing is then
judged on the same examples every time, while local runs keep drawing new ones to find bugs
(set ``HYPOTHESIS_PROFILE=ci`` to reproduce CI's).
"""

from __future__ import annotations

import os
import signal

import pytest
from hypothesis import settings

from memplan.profile.model import Profile, Stage

settings.register_profile("ci", derandomize=True, print_blob=True)
settings.register_profile("dev", print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))

if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    # Started in the background of a non-interactive shell (`make test &`, some CI runners), the
    # suite inherits SIGINT ignored, and so would every memplan process the tests start and then
    # interrupt (tests/cli/test_interrupts.py): Python's own handler gives them Ctrl-C back.
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture
def chain() -> Profile:
    """Four identical stages (2 ms forward, 3 ms backward, 4-byte outputs, 8 saved bytes,
    overheads 1 and 2) and a 5-byte input: the chain of the transfer simulators' tests."""
    stages = [
        Stage(
            name=f"s{k}",
            forward_time=2.0,
            backward_time=3.0,
            output_size=4,
            saved_size=8,
            forward_overhead=1,
            backward_overhead=2,
        )
        for k in range(4)
    ]
    return Profile(model="sim", input_size=5, stages=stages)
