"""The pipeline family (*Pipelined Model Parallelism*, Euro-Par 2021): its options and algorithms, declared once.

One adapter per algorithm, as in every family (:mod:`memplan.algorithms.chain.entries`); the
pipeline solvers (:func:`.ilp.run_ilp`, :func:`.heuristics.run`) return finished schedules.
Budgets are per GPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from memplan.algorithms.base import AlgorithmInfo, Family, SolveRequest
from memplan.algorithms.options import option, positive_integer, rate, time_limit_option

if TYPE_CHECKING:  # annotations only: declaring the family loads no model
    from memplan.profile.model import Profile
    from memplan.schedule import Schedule

REFERENCE = (
    "Beaumont, Eyraud-Dubois & Shilova 2021, Pipelined model parallelism: complexity results "
    "and memory considerations"
)


DEFAULT_TIME_LIMIT = 60.0
"""Seconds of ``pipeline-ilp``'s CP-SAT solves when ``--time-limit`` is not set."""


@dataclass(frozen=True)
class PipelineOptions:
    """Options of the pipeline family."""

    gpus: int | None = option(
        flag="--gpus",
        metavar="N",
        cli_type=int,
        help="Number of GPUs of the pipeline (--mem is then per GPU).",
        accepts="an integer >= 1",
        default=None,
        default_text="required",
        parse=positive_integer("gpus"),
        commands=("solve", "compare"),
    )
    link_bandwidth: float | None = option(
        flag="--link-bandwidth",
        metavar="RATE",
        help="Bandwidth of each GPU-to-GPU link: 25GB/s.",
        accepts="a rate: 25GB/s, bytes/s",
        default=None,
        default_text="transfers are free",
        parse=rate("link_bandwidth"),
        commands=("solve", "compare"),
    )
    time_limit: float = time_limit_option(DEFAULT_TIME_LIMIT)


def solve_pipeline_ilp(profile: Profile, request: SolveRequest) -> Schedule:
    """``pipeline-ilp``: the period-minimizing ILP with CP-SAT (:func:`.ilp.run_ilp`)."""
    from memplan.algorithms.pipeline import heuristics, ilp

    return ilp.run_ilp(profile, request, heuristics.instance(profile, request))


def solve_pipedream(profile: Profile, request: SolveRequest) -> Schedule:
    """``pipedream``: contiguous DP partition + 1F1B (:mod:`.pipedream`)."""
    from memplan.algorithms.pipeline import heuristics, pipedream

    return heuristics.run(profile, request, pipedream.solve_pipedream)


def solve_gpipe(profile: Profile, request: SolveRequest) -> Schedule:
    """``gpipe``: fill-drain rounds on the DP partition (:mod:`.gpipe`)."""
    from memplan.algorithms.pipeline import gpipe, heuristics

    return heuristics.run(profile, request, gpipe.solve_gpipe)


FAMILY = Family(
    name="pipeline",
    profile_kind="chain",
    options=PipelineOptions,
    algorithms=(
        AlgorithmInfo(
            name="pipeline-ilp",
            exact=False,
            needs="profile, --gpus, --mem per GPU, --link-bandwidth, --time-limit",
            summary="period-minimizing ILP of §6 (any allocation, 1F1B pattern) with CP-SAT, "
            "warm-started from pipedream",
            short="period-minimizing ILP (CP-SAT, §6)",
            reference=REFERENCE + ", §6",
            solve=solve_pipeline_ilp,
        ),
        AlgorithmInfo(
            name="pipedream",
            exact=False,
            needs="profile, --gpus, --mem per GPU, --link-bandwidth",
            summary="contiguous DP partition + 1F1B, NOAM swept, judged by the simulated peak (§7)",
            short="contiguous DP partition + 1F1B (§7)",
            reference="Narayanan et al. 2019, PipeDream; evaluated as in " + REFERENCE + ", §7",
            solve=solve_pipedream,
        ),
        AlgorithmInfo(
            name="gpipe",
            exact=False,
            needs="profile, --gpus, --mem per GPU, --link-bandwidth",
            summary="fill-drain rounds of M mini-batches on the DP partition (baseline)",
            short="fill-drain rounds on the DP partition",
            reference="Huang et al. 2019, GPipe",
            solve=solve_gpipe,
        ),
    ),
)
