"""The library API behind the CLI: ``load_profile``, ``solve``, ``simulate``, ``compare``.

Every plan that leaves :func:`solve` has been replayed by the simulator of its family (separate
code from the solvers); a disagreement between the two is a bug and raises :class:`InternalError`.
Nothing here knows a family: each declares its algorithms, simulator and options once
(:mod:`memplan.algorithms`), and :func:`solve` loads, checks the family, builds the request,
calls, replays and compares.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from memplan.algorithms import (
    FAMILIES,
    AlgorithmInfo,
    Family,
    SolveRequest,
    list_algorithms,
    options_for,
)
from memplan.algorithms import algorithm as lookup_algorithm
from memplan.algorithms.base import PROFILE_SHAPES
from memplan.algorithms.timeline import static_memory, timed_ops
from memplan.budget import MemoryBudget, check_memory
from memplan.describe import describe
from memplan.errors import ArgumentError, BudgetWarning, InputError, InternalError
from memplan.loop import Optimizer, TrainingLoop, check_gradients, parse_optimizer
from memplan.profile.io import load_profile
from memplan.profile.memory import loop_on, resolve_gradients
from memplan.profile.model import Profile
from memplan.profile.sharding import check_shards, for_ranks
from memplan.schedule import Budget, OpName, ProfileRef, Schedule, load_schedule
from memplan.simulator import claims
from memplan.simulator.replay import replay
from memplan.simulator.result import SimulationResult
from memplan.simulator.timing import close
from memplan.units import (
    DEVICE_RESERVE,
    DeviceShare,
    format_size,
    parse_size,
    usable_memory,
)

__all__ = ["compare", "list_algorithms", "load_profile", "simulate", "solve"]
"""The library's API (SPEC, "Python API"). The module's other functions serve the command line
(``memplan info``, ``compare``, ``simulate``) and the tests; they are not a promise."""

MAX_STEPS = 1000
"""The most budgets of one ``compare`` sweep (``--mem START:STOP:STEPS``, ``auto:STEPS``)."""


def schedule_from_sequence(
    profile: Profile | Mapping[str, Any] | str,
    sequence: Iterable[tuple[OpName, int]],
    *,
    algorithm: str = "custom",
    memory: int | str | None = None,
    optimizer: str | Optimizer = "sgd",
    gradients: str | None = None,
) -> Schedule:
    """Wrap a hand-written operation sequence (``[("F_ck", 0), ...]``) as a schedule to simulate.

    The figures (makespan, peak) are left for :func:`simulate` to compute. ``gradients``
    (``at-backward``, ``kept``, ``step-in-backward`` or ``auto``) replays it under the training
    loop's terms (docs/model.md); None: the model before them.
    """
    prof = load_profile(profile)
    chosen = parse_optimizer(optimizer)
    budget = None if memory is None else memory_budget(prof, check_memory(memory))
    gradients_loop = None if gradients is None else resolve_gradients(prof, gradients)
    loop = TrainingLoop(chosen, gradients_loop)
    return Schedule(
        algorithm=algorithm,
        profile=ProfileRef(model=prof.model, sha256=prof.sha256(), stages=prof.length),
        budget=Budget.of(budget, loop),
        feasible=True,
        lower_bound=prof.lower_bound,
        static_memory=static_memory(prof, loop),
        ops=timed_ops(prof, sequence),
    )


@dataclass(frozen=True)
class SolveArguments:
    """The arguments of a solve, checked once, typed.

    :func:`solve_arguments` makes them before any profile is read; everything below trusts them.
    """

    algorithm: AlgorithmInfo
    memory: MemoryBudget
    """The budget: bytes or a share of the profile's GPU, and its text for messages."""
    optimizer: Optimizer
    """Its step, when not given, is PyTorch's default on the profile's device."""
    gradients: str
    """``auto`` or a loop of :data:`memplan.loop.GRADIENTS` (``auto`` resolved on the profile)."""
    output_held: bool
    output_bytes: int | None
    """What the caller holds of the output, when told in bytes (None: the loss stage's input)."""
    options: Any
    """The family's options object (:func:`memplan.algorithms.options_for`)."""
    shards: int | None = None
    """The FSDP2 ranks the plan is one of (None: one GPU, the whole model; docs/sharding.md)."""

    def loop(self, profile: Profile, family: Family) -> TrainingLoop:
        """The loop the plan is made for on ``profile``.

        With its terms (the optimizer's step, the gradients' loop, the caller's output) for the
        families that plan in them (``Family.loop_terms``: chain, offloading, combined, join);
        before them for graph and pipeline.
        """
        return loop_on(
            profile,
            self.optimizer,
            self.gradients,
            self.output_held,
            terms=family.loop_terms,
            output_bytes=self.output_bytes,
        )


def solve_arguments(
    algo: str,
    memory: int | str | MemoryBudget | None,
    *,
    optimizer: str | Optimizer = "sgd",
    gradients: str | None = "auto",
    output_held: bool | int = False,
    shards: int | None = None,
    **options: Any,
) -> SolveArguments:
    """Check a solve's arguments, the one place that does (an error naming the parameter).

    Typed values (a :class:`MemoryBudget`, an :class:`Optimizer`) pass through as they are.
    """
    info = lookup_algorithm(algo)
    budget = check_memory(memory)
    family_options = options_for(info.name, options)
    if not isinstance(output_held, int) or output_held < 0:
        raise ArgumentError(
            "output_held", "expected True, False or the bytes the caller holds", output_held
        )
    held_bytes = None if isinstance(output_held, bool) else int(output_held)
    return SolveArguments(
        info,
        budget,
        parse_optimizer(optimizer),
        check_gradients(gradients),
        bool(output_held),
        held_bytes,
        family_options,
        check_shards(shards, algorithm=info),
    )


@dataclass(frozen=True)
class _Solved:
    """What :func:`_solve` returns: the schedule and the replay that checked it."""

    schedule: Schedule
    replay: SimulationResult | None
    """The simulator's replay of the plan (None when no plan fits)."""


def solve(
    profile: Profile | Mapping[str, Any] | str,
    algo: str = "rotor",
    memory: int | str | MemoryBudget | None = None,
    *,
    optimizer: str | Optimizer = "sgd",
    gradients: str = "auto",
    output_held: bool | int = False,
    progress: Callable[[str], None] | None = None,
    shards: int | None = None,
    **options: Any,
) -> Schedule:
    """Run one algorithm and return its schedule, replayed and checked by the simulator.

    Parameters
    ----------
    profile : Profile, dict, path, bundled name or YAML text
    algo : str
        A name from :func:`list_algorithms` (``store-all``, ``periodic``, ``revolve``,
        ``rotor``, ...).
    memory : int or str
        The budget for the whole iteration (``"8GB"``, ``"8GiB"`` or bytes), static memory
        included (per GPU for the pipeline family); or a share of the profile's GPU: ``"gpu"``
        (its memory less what the CUDA context and the allocator take,
        :data:`memplan.units.DEVICE_RESERVE`) or ``"90%"`` of that (see :func:`memory_budget`).
    optimizer : str
        ``none``, ``sgd``, ``momentum``, ``adam`` or ``adamw``, optionally with the step PyTorch
        runs: ``adamw:fused``, ``adam:foreach``, ``sgd:for-loop`` (default: PyTorch's on the
        profile's device, for-loop on a CPU, foreach on a GPU). Its state is static; every
        family that plans in the training loop counts its step after the backward too
        (docs/model.md).
    gradients : {"auto", "at-backward", "kept", "step-in-backward"}
        The training loop a plan is made for (docs/model.md): ``at-backward``, PyTorch's
        default ``zero_grad(set_to_none=True)``, where each stage's weight gradients appear at its
        backward; ``kept``, a loop that keeps them for the whole step
        (``zero_grad(set_to_none=False)``, gradient accumulation); ``step-in-backward``, the
        optimizer applied to each parameter as its gradient is complete. ``auto``:
        ``at-backward`` on a profile measured with ``weight_grad_size``, ``kept`` on one without.
        The chain, offloading, combined and join families plan in it; graph and pipeline with
        the gradients kept.
    output_held : bool or int
        The caller holds the model's output from one step to the next (``out = model(**batch)``
        in a loop): one copy of the loss stage's input is counted for the whole step (chain,
        offloading and combined families; the join family refuses it); a number: the bytes it
        holds of it (every tensor of a dict it keeps).
    progress : callable, optional
        Long solvers (CP-SAT) call it with one line of live progress at a time (the CLI prints
        them on stderr).
    shards : int, optional
        Plan one of ``shards`` GPUs training the model sharded with FSDP2 (``fully_shard`` per
        block and on the root), from the profile of the whole model: ``memory`` is one GPU's
        budget (docs/sharding.md). The schedule's ``budget.shards`` says so.
    **options
        The family's options, as each family declares them (``memplan algos NAME`` lists them;
        None: the default): ``slots`` (the DP algorithms: 2 to 100000 or ``"auto"``, rotor's
        default: exact in bytes when affordable; dynprog 500; pofo 2 to 10000, default 50),
        ``bandwidth`` (offloading and combined: ``"12GB/s"`` or bytes/s, default the profile's),
        ``gpus``, ``link_bandwidth`` (pipeline: bytes/s of each GPU-to-GPU link, default free
        transfers) and ``time_limit`` (CP-SAT solves, seconds). Options of other families are
        checked and ignored; an option no family declares is a TypeError.

    Returns
    -------
    Schedule
        ``feasible`` is False when no plan of this algorithm fits; ``min_memory`` then says the least
        budget that would fit, when known.

    Raises
    ------
    InputError
        A bad argument (:class:`~memplan.errors.ArgumentError`, naming the parameter; checked
        before the profile is read), a profile that cannot be read, a family that cannot serve
        it, or ``gpu``/``90%`` on a profile without GPU memory.

    Warns
    -----
    BudgetWarning
        The budget is more than the profile's GPU can give a plan (the plan is still made).
    """
    arguments = solve_arguments(
        algo,
        memory,
        optimizer=optimizer,
        gradients=gradients,
        output_held=output_held,
        shards=shards,
        **options,
    )
    return _solve(load_profile(profile), arguments, progress).schedule


def _solve(
    prof: Profile,
    arguments: SolveArguments,
    progress: Callable[[str], None] | None = None,
) -> _Solved:
    """Run the algorithm of ``arguments`` on ``prof``.

    The family is checked against the profile, the plan solved, replayed once, and its makespan
    compared once with the solver's own value. With ``shards``, the plan is one rank's: the
    profile is one rank's (:func:`memplan.profile.sharding.for_ranks`), and ``Solved.profile``.
    """
    info = arguments.algorithm
    family = FAMILIES[info.family]
    check_family(prof, family, info.name)
    loop = arguments.loop(prof, family)
    prof = for_ranks(prof, arguments.shards, loop.gradients)  # docs/sharding.md
    request = SolveRequest(
        memory=memory_budget(prof, arguments.memory),
        algorithm=info.name,
        family=family.name,
        options=arguments.options,
        static_memory=static_memory(prof, loop),
        loop=loop,
        progress=progress,
    )
    started = time.perf_counter()
    schedule = info.solve(prof, request)
    if arguments.shards is not None:
        budget = schedule.budget.model_copy(update={"shards": arguments.shards})
        schedule = schedule.model_copy(update={"budget": budget})
    if schedule.solver.seconds == 0.0:
        solver = schedule.solver.model_copy(update={"seconds": time.perf_counter() - started})
        schedule = schedule.model_copy(update={"solver": solver})
    if not schedule.feasible:
        return _Solved(schedule, None)
    replayed = _checked(prof, schedule, request.memory, info.name)
    checked = schedule.with_solver_makespan(None)  # the document alone from here on
    return _Solved(checked.model_copy(update={"peak_memory": replayed.peak_memory}), replayed)


def memory_budget(profile: Profile, memory: MemoryBudget) -> int:
    """The budget ``memory`` in bytes on ``profile``'s device.

    A size is taken as it is; ``gpu`` is the memory of the profile's GPU (a profile measured on
    CUDA or estimated for a GPU) less :data:`memplan.units.DEVICE_RESERVE`, what the CUDA context
    and the allocator take; ``90%`` is that share of it. A budget larger than that is kept, with a
    :class:`memplan.errors.BudgetWarning`: the plan will not fit on that GPU.

    Raises
    ------
    ArgumentError
        ``gpu``/``90%`` on a profile without GPU memory (a CPU profile).
    """
    form = memory.value
    device = profile.device
    gpu = None
    if device is not None and device.kind in ("cuda", "estimated") and device.memory:
        gpu = device.memory
    if isinstance(form, DeviceShare):
        if gpu is None:
            raise ArgumentError(
                "memory",
                f"{_no_gpu_memory(profile)}; give a size, e.g. 8GB, or use a profile of a GPU "
                "(measured on CUDA, or memplan profile MODEL --estimate a100)",
                memory.text,
            )
        budget = form.of(gpu)
    else:
        budget = form
    if gpu is not None and budget > usable_memory(gpu):
        gpu_name = (device.name if device is not None else None) or "GPU"
        detail = (
            f"{format_size(budget)} is more than the {gpu_name} can give a plan "
            f"({format_size(usable_memory(gpu))}: its {format_size(gpu)} less "
            f"{format_size(DEVICE_RESERVE)} for the CUDA context and the allocator, as a budget "
            "of gpu); the plan will not fit on that GPU"
        )
        warnings.warn(BudgetWarning(detail, memory.text), stacklevel=2)
    return budget


def _no_gpu_memory(profile: Profile) -> str:
    """Why ``profile`` has no GPU memory to take a share of, in words."""
    device = profile.device
    if device is None:
        return f"{profile.model} names no device, so no GPU memory to take a share of"
    named = f" ({device.name})" if device.name else ""
    if device.kind in ("cuda", "estimated"):
        return f"{profile.model}'s GPU{named} states no memory"
    what = "a CPU" if device.kind == "cpu" else f"a {device.kind} device"
    return f"{profile.model} was profiled on {what}{named}, which has no GPU memory to share"


def check_family(prof: Profile, family: Family, algo: str) -> None:
    """A usage error when ``algo`` (of ``family``) cannot serve this profile's shape."""
    if family.name in prof.families:
        return
    fits = ", ".join(prof.families)
    raise InputError(
        f"algorithm {algo} ({family.name} family) needs {PROFILE_SHAPES[family.profile_kind]}; "
        f"{prof.model} is {PROFILE_SHAPES[prof.kind]}: use an algorithm of the {fits} "
        f"famil{'ies' if ',' in fits else 'y'} (see `memplan algos`)"
    )


def _checked(prof: Profile, schedule: Schedule, budget: int, algo: str) -> SimulationResult:
    """Replay a solver's plan, which must be accepted and reproduce the solver's makespan.

    A rejected plan, or a makespan other than the solver's own value
    (:attr:`Schedule.claimed_makespan`), is a bug in memplan.
    """
    check = replay(prof, claims.with_replay_static_memory(prof, schedule), budget)
    if not check.valid:
        raise InternalError(f"{algo} produced a plan the simulator rejects: {check.violation}")
    claimed = schedule.claimed_makespan
    if claimed is not None and not close(claimed, check.makespan):
        raise InternalError(
            f"{algo}: solver value {claimed} != simulated makespan {check.makespan}"
        )
    return check


def with_gradients(profile: Profile, schedule: Schedule, gradients: str | None) -> Schedule:
    """``schedule`` as planned for another training loop (``simulate --gradients``).

    The ``budget.gradients`` of a schedule of a family that plans in the training loop (chain,
    offloading, combined, join) is replaced by ``gradients`` resolved on ``profile`` (``auto``,
    ``at-backward``, ``kept``, ``step-in-backward``), its static memory recomputed; other
    families' as they are.
    """
    family = FAMILIES.get(schedule.family)
    if gradients is None or family is None or not family.loop_terms:
        return schedule
    loop = resolve_gradients(profile, gradients)
    budget = schedule.budget.model_copy(update={"gradients": loop})
    static = static_memory(profile, budget.loop)
    return schedule.model_copy(
        update={"budget": budget, "static_memory": static, "peak_memory": None}
    )


def simulate(
    profile: Profile | Mapping[str, Any] | str,
    schedule: Schedule | Mapping[str, Any] | str,
    memory: int | str | None = None,
    *,
    check_claims: bool = True,
) -> SimulationResult:
    """Replay a schedule independently of the solvers, with its family's simulator.

    Returns a :class:`memplan.simulator.SimulationResult` with ``valid``, ``makespan``,
    ``peak_memory``, ``idle_time`` and ``violation`` (the first problem found, naming the
    operation). Offloading and combined schedules are replayed at their ``budget.bandwidth``. The
    budget is ``memory`` when given, else the schedule's own. The static memory is recomputed from
    the profile and ``budget.optimizer``, never taken from the schedule; with ``check_claims``, what
    the schedule states (static memory, makespan, peak, a pipeline's GPU peaks and throughput) must
    match the replay (NOTE [ schedule claims ] in :mod:`memplan.simulator.claims`).
    """
    claimed = load_schedule(schedule)
    made_for = claimed.budget  # a plan of one FSDP2 rank replays on that rank's profile
    prof = for_ranks(load_profile(profile), made_for.shards, made_for.gradients)
    sched = claims.with_replay_static_memory(prof, claimed)  # NOTE [ schedule claims ]
    if sched.family not in prof.families:
        raise InputError(
            f"schedule family {sched.family!r} does not fit {prof.model}, "
            f"{PROFILE_SHAPES[prof.kind]} (families: {', '.join(prof.families)})"
        )
    if sched.profile.stages is not None and sched.profile.stages != prof.length:
        raise InputError(
            f"schedule was made for a profile with {sched.profile.stages} stages, "
            f"this one has {prof.length} ({prof.model})"
        )
    given = None if memory is None else check_memory(memory)
    budget = memory_budget(prof, given) if given is not None else sched.budget.memory
    result = replay(prof, sched, budget)
    if check_claims:
        claims.check(prof, claimed, result)
    return result


@dataclass(frozen=True)
class CompareRow:
    """One (budget, algorithm) cell of a sweep."""

    memory: int
    algorithm: str
    feasible: bool
    makespan: float | None
    ratio: float | None
    peak_memory: int | None
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        """The row as a plain dict (field name -> value)."""
        return dict(self.__dict__)


def budgets_from_range(text: str) -> list[int]:
    """``START:STOP[:STEPS]`` -> evenly spaced budgets in bytes (STEPS defaults to 10)."""
    parts = text.split(":")
    if len(parts) not in (2, 3):
        raise InputError(f"--mem {text!r}: expected START:STOP[:STEPS], e.g. 2GB:8GB:10")
    start, stop = parse_size(parts[0]), parse_size(parts[1])
    try:
        steps = int(parts[2]) if len(parts) == 3 else 10
    except ValueError:
        raise InputError(f"--mem {text!r}: STEPS must be an integer, e.g. 2GB:8GB:10") from None
    if not 1 <= steps <= MAX_STEPS or stop < start:
        raise InputError(f"--mem {text!r}: expected START <= STOP and STEPS from 1 to {MAX_STEPS}")
    if steps == 1:
        return [start]
    return [round(start + (stop - start) * i / (steps - 1)) for i in range(steps)]


def auto_budgets(
    profile: Profile | Mapping[str, Any] | str,
    algos: Iterable[str],
    steps: int = 10,
    optimizer: str | Optimizer = "sgd",
    gradients: str = "auto",
) -> list[int]:
    """``steps`` budgets from the least memory any of ``algos`` runs with to the store-all need.

    The store-all need is M_peak (plus static memory): above it nothing is recomputed or
    offloaded. This is the range of Figure 5 of *Optimal GPU-CPU Offloading Strategies* (Euro-Par 2020) (``compare --mem auto:20``).
    Both come from the accounting of the training loop ``gradients`` (docs/model.md), the one
    every family plans in.
    """
    if not 1 <= steps <= MAX_STEPS:
        raise InputError(f"--mem auto:{steps}: STEPS must be from 1 to {MAX_STEPS}, e.g. auto:20")
    prof = load_profile(profile)
    families = {lookup_algorithm(name).family for name in algos}
    desc = describe(prof, optimizer, gradients)
    least = [desc["min_memory"][f] for f in families if f in desc["min_memory"]]
    start = min(least) if least else desc["store_all_memory"]
    stop = max(start, desc["store_all_memory"])
    if steps == 1:
        return [start]
    return [round(start + (stop - start) * i / (steps - 1)) for i in range(steps)]


def compare(
    profile: Profile | Mapping[str, Any] | str,
    algos: Iterable[str],
    budgets: Iterable[int | str],
    *,
    optimizer: str | Optimizer = "sgd",
    gradients: str = "auto",
    on_progress: Callable[[int, int], None] | None = None,
    **options: Any,
) -> list[CompareRow]:
    """Sweep algorithms over budgets; ``ratio`` is makespan / lower bound.

    Within one family the lower bound is each schedule's own: for the offloading family, LB of
    Proposition 3 at each budget and at ``bandwidth`` (default: the profile's), so the ratios are
    those of Figure 5 of *Optimal GPU-CPU Offloading Strategies* (Euro-Par 2020). When the algorithms span several families, every ratio uses
    the one bound valid for all of them, the compute lower bound (every forward and backward
    once, ``profile.lower_bound``), so that the columns compare. ``options`` are the families'
    options as for :func:`solve`, given to every algorithm (each takes those its family declares;
    the pipeline family's budgets are per GPU). They are checked for every algorithm before the
    sweep starts.
    """
    chosen, loop = parse_optimizer(optimizer), check_gradients(gradients)  # checked once
    prof = load_profile(profile)
    names = list(algos)
    for name in names:
        options_for(name, options)
    families = {lookup_algorithm(name).family for name in names}
    common = prof.lower_bound if len(families) > 1 and prof.lower_bound > 0 else None
    sizes = [parse_size(b) for b in budgets]
    rows: list[CompareRow] = []
    total, done = len(names) * len(sizes), 0
    for memory in sizes:
        for name in names:
            sched = solve(prof, name, memory, optimizer=chosen, gradients=loop, **options)
            rows.append(
                CompareRow(
                    memory=memory,
                    algorithm=name,
                    feasible=sched.feasible,
                    makespan=sched.makespan,
                    ratio=None
                    if sched.makespan is None
                    else sched.overhead
                    if common is None
                    else sched.makespan / common,
                    peak_memory=sched.peak_memory,
                    seconds=sched.solver.seconds,
                )
            )
            done += 1
            if on_progress is not None:
                on_progress(done, total)
    return rows
