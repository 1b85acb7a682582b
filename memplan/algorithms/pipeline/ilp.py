"""``pipeline-ilp``: PipeDream's best plan, then CP-SAT on the period-minimizing ILP.

The model is :mod:`memplan.algorithms.pipeline.ilp_model` (section 6 of *Pipelined Model
Parallelism*, Euro-Par 2021). The search runs in two phases within the time limit (NOTE [ time
limits ]); the best of the ILP's plan and PipeDream's is returned (the message says which), with
CP-SAT's bound.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from ortools.sat.python import cp_model
from ortools.sat.python.cp_model_helper import CpSolverStatus as CpStatus

from memplan import interrupt
from memplan.algorithms.base import SolveRequest
from memplan.algorithms.pipeline.feasible import least_memory_plan
from memplan.algorithms.pipeline.ilp_model import (
    IlpModel,
    build_model,
    complete_hint,
    hint_plan,
    read_plan,
)
from memplan.algorithms.pipeline.model import PipelineInstance
from memplan.algorithms.pipeline.pipedream import solve_pipedream
from memplan.algorithms.pipeline.plan import PipelinePlan, evaluate, to_schedule
from memplan.profile.model import Profile
from memplan.schedule import Schedule, Status
from memplan.units import format_size


@dataclass
class IlpOutcome:
    """Both plans ``pipeline-ilp`` weighs: PipeDream's warm start and CP-SAT's own."""

    pd_plan: PipelinePlan | None
    pd_peaks: list[int] | None
    ilp_plan: PipelinePlan | None
    ilp_peaks: list[int] | None
    status: str
    """CP-SAT's final status, lower case (optimal, feasible, infeasible, unknown)."""
    bound: float | None
    """CP-SAT's proven bound on the period of its model (ms)."""
    first_plan: PipelinePlan | None = None
    """Where PipeDream has none: the feasibility-first plan (NOTE [ pipeline feasibility first ])."""
    first_peaks: list[int] | None = None


def solve_ilp(
    profile: Profile,
    inst: PipelineInstance,
    memory: int,
    time_limit: float,
    sink: Callable[[str], None] | None = None,
) -> IlpOutcome:
    """PipeDream's best plan, then CP-SAT in two phases within ``time_limit`` seconds.

    Phase 1 fixes PipeDream's assignment (a ``WARM_SHARE`` of the time) and starts from its times;
    phase 2 solves the whole model hinted with phase 1's complete solution. Where PipeDream has no
    plan, the feasibility-first plan (one mini-batch in flight on a packed allocation, replayed by
    the simulator) takes its place as the warm start.
    """
    started = time.perf_counter()
    deadline = started + time_limit  # every phase below stops by it (NOTE [ time limits ])
    pd_plan, pd_peaks, _ = solve_pipedream(
        profile, inst, memory, deadline=started + PIPEDREAM_SHARE * time_limit
    )
    progress = _Throttle(sink, u=1.0)
    first_plan: PipelinePlan | None = None
    first_peaks: list[int] | None = None
    warm = pd_plan
    if pd_plan is None:  # feasibility first (NOTE [ pipeline feasibility first ])
        left = deadline - time.perf_counter()
        seconds = min(FIRST_SECONDS, max(FIRST_SHARE * time_limit, FIRST_OF_LEFT * left))
        first_plan, first_peaks, _ = least_memory_plan(profile, inst, memory, seconds)
        warm = first_plan
    if warm is not None:  # progress: the plan to beat first, then CP-SAT's improvements on it
        progress.warm_start("pipedream" if warm is pd_plan else "feasibility-first", warm.period)
    search = _Search(inst, memory, deadline, progress)
    if warm is not None and time.perf_counter() < deadline:
        search.fixed_assignment(warm)
    if time.perf_counter() + search.build < deadline:
        search.whole_model(warm)
    if search.solver is None:  # no time left for CP-SAT at all
        search.status = cp_model.UNKNOWN
    ilp_plan: PipelinePlan | None = None
    ilp_peaks: list[int] | None = None
    if search.found is not None:
        solver, model = search.found
        ilp_plan = read_plan(solver, model, inst)
        check = evaluate(profile, inst, ilp_plan)
        if check.valid and check.peak_memory <= memory:
            ilp_peaks = check.gpu_peaks
        else:  # pragma: no cover - the model is conservative; keep PipeDream's plan then
            ilp_plan = None
    return IlpOutcome(
        pd_plan,
        pd_peaks,
        ilp_plan,
        ilp_peaks,
        cp_model.CpSolver().status_name(search.status).lower(),
        search.bound if search.found is not None else None,
        first_plan,
        first_peaks,
    )


class _Search:
    """The two CP-SAT phases of :func:`solve_ilp` and what they found."""

    def __init__(
        self, inst: PipelineInstance, memory: int, deadline: float, progress: _Throttle
    ) -> None:
        self.inst, self.memory, self.deadline, self.progress = inst, memory, deadline, progress
        self.solver: cp_model.CpSolver | None = None
        self.status: CpStatus = cp_model.UNKNOWN
        self.found: tuple[cp_model.CpSolver, IlpModel] | None = None
        """The solver and model of the last solution."""
        self.hint: list[int] | None = None
        self.bound = inst.period_lower_bound()  # until the whole model's search proves better
        self.build = 0.0  # seconds one model took to build: phase 2 is skipped when it cannot fit

    def fixed_assignment(self, warm: PipelinePlan) -> None:
        """Phase 1: the warm start's assignment fixed, its times as hints."""
        began = time.perf_counter()
        im = build_model(self.inst, self.memory)
        self.build = time.perf_counter() - began
        if not complete_hint(im, self.inst, warm):  # pragma: no cover
            hint_plan(im, warm, self.inst.length)
        order: dict[int, int] = {}
        for g in warm.assignment:
            order.setdefault(g, len(order))
        for k, g in enumerate(warm.assignment):
            im.model.add(im.vars.y[k] == order[g])
        left = self.deadline - time.perf_counter()
        self.progress.u = im.u
        if left > 0:
            solver, status = _solve(im.model, WARM_SHARE * left, self.progress, "warm start")
            self.solver, self.status = solver, status
            if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
                self.hint = list(solver.response_proto.solution)
                self.found = (solver, im)
                self.status = cp_model.FEASIBLE  # optimal for phase 1's fixed assignment only

    def whole_model(self, warm: PipelinePlan | None) -> None:
        """Phase 2: the whole model, hinted with phase 1's solution (or the warm start)."""
        im = build_model(self.inst, self.memory)
        if self.hint is not None:
            # the same variables in the same order: phase 1's solution is a complete hint
            im.model.proto.solution_hint.vars.extend(range(len(self.hint)))
            im.model.proto.solution_hint.values.extend(self.hint)
        elif warm is not None:
            complete_hint(im, self.inst, warm)
        self.progress.u = im.u
        left = self.deadline - time.perf_counter()
        if left > 0:
            solver, status = _solve(im.model, left, self.progress, "search")
            self.solver, self.status = solver, status
            self.bound = solver.best_objective_bound * im.u  # phase 1's does not bound the whole
            if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
                self.found = (solver, im)
            elif self.found is not None:  # no solution in the time left: keep phase 1's
                self.status = cp_model.FEASIBLE


def run_ilp(profile: Profile, request: SolveRequest, inst: PipelineInstance) -> Schedule:
    """``pipeline-ilp``: the best of CP-SAT's plan and PipeDream's, with CP-SAT's bound."""
    started = time.perf_counter()
    limit = request.options.time_limit
    memory = request.memory
    floor = inst.min_static()
    if memory < floor:
        return to_schedule(
            profile,
            memory,
            "pipeline-ilp",
            inst,
            None,
            status="infeasible",
            message=f"the heaviest stage alone needs {format_size(floor)} of weights per GPU "
            f"({inst.optimizer}, 2 weight versions)",
            started=started,
        )
    out = solve_ilp(profile, inst, memory, limit, request.progress)
    pd_text = "none" if out.pd_plan is None else f"{out.pd_plan.period:.4f} ms"
    if (
        out.ilp_plan is not None
        and (out.pd_plan is None or out.ilp_plan.period <= out.pd_plan.period + 1e-9)
        and (out.first_plan is None or out.ilp_plan.period <= out.first_plan.period + 1e-9)
    ):
        plan, peaks = out.ilp_plan, out.ilp_peaks
        text = f"CP-SAT {out.status}, bound {out.bound:.4f} ms; pipedream warm start: {pd_text}"
        if out.first_plan is not None:
            text += f"; feasibility-first plan {out.first_plan.period:.4f} ms"
        final: Status = "optimal" if out.status == "optimal" else "feasible"
    elif out.pd_plan is not None:
        plan, peaks = out.pd_plan, out.pd_peaks
        own = "none" if out.ilp_plan is None else f"{out.ilp_plan.period:.4f} ms"
        text = (
            f"CP-SAT {out.status} (its plan: {own}) did not beat the pipedream warm start "
            f"{pd_text}: returning pipedream's plan"
        )
        final = "feasible"
    elif out.first_plan is not None:
        plan, peaks = out.first_plan, out.first_peaks
        own = "no plan" if out.ilp_plan is None else f"its plan {out.ilp_plan.period:.4f} ms"
        text = (
            f"CP-SAT {out.status} ({own}) did not beat the feasibility-first plan (one "
            f"mini-batch in flight on a packed allocation); pipedream has none"
        )
        final = "feasible"
    else:
        why = (
            "CP-SAT proves that no pattern of its memory model fits"
            if out.status == "infeasible"
            else f"CP-SAT found no plan within {limit:g} s ({out.status}) and pipedream has none"
        )
        return to_schedule(
            profile,
            memory,
            "pipeline-ilp",
            inst,
            None,
            status="infeasible",
            message=why,
            started=started,
        )
    return to_schedule(
        profile,
        memory,
        "pipeline-ilp",
        inst,
        plan,
        status=final,
        message=f"{len(set(plan.assignment))} of {inst.gpus} GPUs; {text}",
        gpu_memory=peaks,
        started=started,
    )


WARM_SHARE = 0.3
"""Share of the time limit spent on PipeDream's assignment before the whole model."""
PIPEDREAM_SHARE = 0.5
"""Share of the time limit after which PipeDream's warm start stops timing candidates."""

# NOTE [ time limits ]
# ``--time-limit`` bounds the whole of pipeline-ilp, not only CP-SAT: PipeDream's candidates stop
# being timed at PIPEDREAM_SHARE of it (the best so far is the warm start); the feasibility-first
# plan gets FIRST_SHARE of it, or FIRST_OF_LEFT of what is left when that is more; the whole model
# is not built when building phase 1's took longer than the time left; and a CP-SAT phase whose
# model is ready after the deadline is not solved (phase 1's solution, or the warm start, is
# returned). What may overrun is one candidate or one model build, plus the final replay
# (docs/benchmarks.md, "Time limits").
FIRST_SHARE = 0.1
"""Share of the time limit (at most ``FIRST_SECONDS``) for the feasibility-first plan..."""
FIRST_OF_LEFT = 0.5
"""... or this share of the time PipeDream left, when larger (its packing needs rounds of a few
tenths of a second on ResNet-152 with 8 GPUs)."""
FIRST_SECONDS = 6.0


class _Throttle:
    """Live progress on stderr: the warm start's period first, then CP-SAT's improvements on it
    (at most one line a second; the last improvement of a phase is always shown).
    """

    def __init__(self, sink: Callable[[str], None] | None, u: float) -> None:
        self.sink = sink
        self.u = u
        self.last = -1e9
        self.best: float | None = None
        self.pending: str | None = None

    def warm_start(self, source: str, period: float) -> None:
        """The plan CP-SAT starts from (and must beat): one line, before any of CP-SAT's."""
        self.best = period
        if self.sink is not None:
            self.sink(f"pipeline-ilp (warm start): {source} plan, period {period:.4f} ms")

    def __call__(self, phase: str, wall: float, objective: float, bound: float) -> None:
        if self.sink is None:
            return
        value = objective * self.u
        if self.best is not None and value >= self.best:
            return
        self.best = value
        line = (
            f"pipeline-ilp ({phase}): {wall:6.1f} s  period {value:.4f} ms  "
            f"bound {bound * self.u:.4f} ms"
        )
        now = time.perf_counter()
        if now - self.last < 1.0:
            self.pending = line
            return
        self.last, self.pending = now, None
        self.sink(line)

    def flush(self) -> None:
        """Show the last improvement the one-a-second limit held back."""
        if self.sink is not None and self.pending is not None:
            self.sink(self.pending)
            self.last, self.pending = time.perf_counter(), None


def _solve(
    model: cp_model.CpModel, seconds: float, progress: _Throttle, phase: str
) -> tuple[cp_model.CpSolver, CpStatus]:
    """Solve with CP-SAT within ``seconds``, reporting improvements: the solver and its status."""

    class _Callback(cp_model.CpSolverSolutionCallback):
        def on_solution_callback(self) -> None:
            progress(phase, self.wall_time, self.objective_value, self.best_objective_bound)

    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(0.1, seconds)
    solver.parameters.num_workers = max(1, min(8, os.cpu_count() or 1))
    status = interrupt.solve(solver, model, _Callback())
    progress.flush()
    return solver, status
