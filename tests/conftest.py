"""Test configuration.

Hypothesis runs with fixed examples under CI (``CI`` set, as `.ci/run` runs): a landing is then
judged on the same examples every time, while local runs keep drawing new ones to find bugs
(set ``HYPOTHESIS_PROFILE=ci`` to reproduce CI's). By default a property test draws a third of
its examples (``examples(N)`` in tests/strategies.py); ``--run-slow`` draws them all (the
``ci-full``/``dev-full`` profiles, also selectable with ``HYPOTHESIS_PROFILE``).

Tests marked ``slow`` (full-size models, README commands that profile, the heavy golden cases,
long hypothesis runs) are left out unless ``--run-slow`` is given (``make test-all``) or the ``-m``
expression names them; every test under tests/torch/ is marked ``torch``. pytest-randomly runs
the tests in a random order: the seed is printed at the end (``--randomly-seed=N`` repeats it,
``-p no:randomly`` keeps the files' order). torch runs one thread (``OMP_NUM_THREADS``, below).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

# One thread per kernel unless told otherwise (`make test-kernels THREADS=2`), here and in every
# process the tests start: torch's idle OpenMP threads spin, which costs the suite several times
# its CPU time on a busy machine, and the plans do not depend on the thread count.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest
from hypothesis import settings

from memplan.profile.model import Profile, Stage
from tests.strategies import FULL_EXAMPLES

DEFAULT_EXAMPLES = FULL_EXAMPLES // 3

# `make test` draws a third of the examples a property test asks for (``examples(N)`` in
# tests/strategies.py, at least 10); ``--run-slow`` (`make test-all`) switches to the ``-full``
# profile of the same name: every example, hypothesis's default of 100 for the others.
settings.register_profile("ci", derandomize=True, print_blob=True, max_examples=DEFAULT_EXAMPLES)
settings.register_profile("dev", print_blob=True, max_examples=DEFAULT_EXAMPLES)
settings.register_profile("ci-full", derandomize=True, print_blob=True, max_examples=FULL_EXAMPLES)
settings.register_profile("dev-full", print_blob=True, max_examples=FULL_EXAMPLES)
PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev")
settings.load_profile(PROFILE)

if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    # Started in the background of a non-interactive shell (`make test &`, some CI runners), the
    # suite inherits SIGINT ignored, and so would every memplan process the tests start and then
    # interrupt (tests/cli/test_interrupts.py): Python's own handler gives them Ctrl-C back.
    signal.signal(signal.SIGINT, signal.default_int_handler)

TORCH_TESTS = Path(__file__).parent / "torch"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--run-slow",
        action="store_true",
        help="also run the tests marked slow (make test-all)",
    )


def pytest_configure(config: pytest.Config) -> None:
    # Before the test modules are imported: their settings read the loaded profile.
    if config.getoption("--run-slow") and PROFILE in ("ci", "dev"):
        settings.load_profile(f"{PROFILE}-full")


def pytest_itemcollected(item: pytest.Item) -> None:
    if TORCH_TESTS in item.path.parents:
        item.add_marker(pytest.mark.torch)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--run-slow") or "slow" in (config.option.markexpr or ""):
        return
    slow = [item for item in items if item.get_closest_marker("slow")]
    if slow:
        items[:] = [item for item in items if not item.get_closest_marker("slow")]
        config.hook.pytest_deselected(items=slow)
        config.stash[_SLOW_LEFT] = len(slow)


_SLOW_LEFT = pytest.StashKey[int]()


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    left = config.stash.get(_SLOW_LEFT, 0)
    if left:
        terminalreporter.write_line(f"{left} tests marked slow not run: --run-slow (make test-all)")
    seed = getattr(config.option, "randomly_seed", None)
    if config.pluginmanager.has_plugin("randomly") and isinstance(seed, int):
        terminalreporter.write_line(f"random order: --randomly-seed={seed} repeats it")


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
