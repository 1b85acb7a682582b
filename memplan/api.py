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
    REGISTRY,
    AlgorithmInfo,
    Family,
    SolveRequest,
    options_for,
)
from memplan.algorithms import algorithm as lookup_algorithm
from memplan.algorithms.base import PROFILE_SHAPES
from memplan.algorithms.options import resolve_bandwidth
from memplan.algorithms.timeline import check_optimizer, static_memory, timed_ops
from memplan.describe import describe
from memplan.errors import BudgetWarning, InputError, InternalError
from memplan.profile.io import load_profile
from memplan.profile.memory import check_gradients, resolve_gradients
from memplan.profile.model import Profile
from memplan.profile.sharding import check_shards, for_ranks
from memplan.schedule import (
    OPTIMIZER_FACTORS,
    Budget,
    OpName,
    OptimizerName,
    ProfileRef,
    Schedule,
    load_schedule,
)
from memplan.simulator import claims
from memplan.simulator.replay import replay
from memplan.simulator.result import SimulationResult
from memplan.simulator.timing import close
from memplan.units import (
    DEVICE_RESERVE,
    DeviceShare,
    format_size,
    parse_budget,
    parse_rate,
    parse_size,
    usable_memory,
)

__all__ = [
    "OPTIMIZER_FACTORS",
    "CompareRow",
    "SolveArguments",
    "Solved",
    "algorithm_details",
    "list_algorithms",
    "auto_budgets",
    "budgets_from_range",
    "check_arguments",
    "check_budget",
    "check_family",
    "compare",
    "describe",
    "load_profile",
    "memory_budget",
    "parse_rate",
    "resolve_bandwidth",
    "schedule_from_sequence",
    "simulate",
    "solve",
    "solve_and_replay",
    "solve_checked",
    "static_memory",
    "timed_ops",
]

MAX_STEPS = 1000
"""The most budgets of one ``compare`` sweep (``--mem START:STOP:STEPS``, ``auto:STEPS``)."""


def list_algorithms() -> list[dict[str, Any]]:
    """Every algorithm memplan knows: name, family, exact or heuristic, what it needs."""
    return [info.to_dict() for info in REGISTRY.values()]


def algorithm_details(name: str) -> dict[str, Any]:
    """``memplan algos NAME``: the algorithm's entry and its family's declared options."""
    from memplan.algorithms.options import declared

    info = lookup_algorithm(name)
    family = FAMILIES[info.family]
    options = [
        {
            "option": spec.flag,
            "metavar": spec.metavar,
            "default": spec.default_text,
            "accepts": spec.accepts,
            "help": spec.help,
            "commands": list(spec.commands),
            "keyword": spec.name,
        }
        for spec in declared(family.options, family.name)
    ]
    return {**info.to_dict(), "profile": PROFILE_SHAPES[family.profile_kind], "options": options}


def schedule_from_sequence(
    profile: Profile | Mapping[str, Any] | str,
    sequence: Iterable[tuple[OpName, int]],
    *,
    algorithm: str = "custom",
    memory: int | str | None = None,
    optimizer: str = "sgd",
    gradients: str | None = None,
) -> Schedule:
    """Wrap a hand-written operation sequence (``[("F_ck", 0), ...]``) as a schedule to simulate.

    The figures (makespan, peak) are left for :func:`simulate` to compute. ``gradients``
    (``at-backward``, ``kept`` or ``auto``) replays it under the training loop's terms
    (docs/model.md); None: the model before them.
    """
    prof = load_profile(profile)
    name = check_optimizer(optimizer)
    budget = None if memory is None else memory_budget(prof, memory)
    loop = None if gradients is None else resolve_gradients(prof, gradients)
    return Schedule(
        algorithm=algorithm,
        profile=ProfileRef(model=prof.model, sha256=prof.sha256(), stages=prof.length),
        budget=Budget(memory=budget, optimizer=name, gradients=loop),
        feasible=True,
        lower_bound=prof.lower_bound,
        static_memory=static_memory(prof, name, loop),
        ops=timed_ops(prof, sequence),
    )


@dataclass(frozen=True)
class Solved:
    """What :func:`solve_checked` returns: everything :func:`solve` read and made."""

    profile: Profile
    """The profile, as loaded (once)."""
    schedule: Schedule
    """The schedule (``peak_memory`` the replay's), feasible or not."""
    replay: SimulationResult | None
    """The simulator's replay of the plan that checked it (None when no plan fits): its
    ``memory_curve`` is the one ``--trace`` draws."""


def solve(
    profile: Profile | Mapping[str, Any] | str,
    algo: str = "rotor",
    memory: int | str | None = None,
    *,
    optimizer: str = "sgd",
    gradients: str = "auto",
    progress: Callable[[str], None] | None = None,
    shards: int | None = None,
    **options: Any,
) -> Schedule:
    """Run one algorithm and return its schedule, replayed and checked by the simulator.

    Parameters
    ----------
    profile : Profile, dict, path, bundled name or YAML text
    algo : str
        A name from :func:`algorithms` (``store-all``, ``periodic``, ``revolve``, ``rotor``, ...).
    memory : int or str
        The budget for the whole iteration (``"8GB"``, ``"8GiB"`` or bytes), static memory
        included (per GPU for the pipeline family); or a share of the profile's GPU: ``"gpu"``
        (its memory less what the CUDA context and the allocator take,
        :data:`memplan.units.DEVICE_RESERVE`) or ``"90%"`` of that (see :func:`memory_budget`).
    optimizer : {"none", "sgd", "momentum", "adam"}
        Which static memory is counted (docs/model.md).
    gradients : {"auto", "at-backward", "kept"}
        The training loop a chain plan is made for (docs/model.md): ``at-backward``, PyTorch's
        default ``zero_grad(set_to_none=True)``, where each stage's weight gradients appear at its
        backward; ``kept``, a loop that keeps them for the whole step
        (``zero_grad(set_to_none=False)``, gradient accumulation). ``auto``: ``at-backward`` on a
        profile measured with ``weight_grad_size``, ``kept`` on one without. The other families
        plan with the gradients kept.
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
        A bad argument (checked before the profile is read, :func:`check_arguments`), a profile
        that cannot be read, a family that cannot serve it, or ``gpu``/``90%`` on a profile
        without GPU memory.

    Warns
    -----
    BudgetWarning
        The budget is more than the profile's GPU can give a plan (the plan is still made).
    """
    return solve_and_replay(
        profile,
        algo,
        memory,
        optimizer=optimizer,
        gradients=gradients,
        progress=progress,
        shards=shards,
        **options,
    ).schedule


def solve_and_replay(
    profile: Profile | Mapping[str, Any] | str,
    algo: str = "rotor",
    memory: int | str | None = None,
    *,
    optimizer: str = "sgd",
    gradients: str = "auto",
    progress: Callable[[str], None] | None = None,
    shards: int | None = None,
    **options: Any,
) -> Solved:
    """:func:`solve`, returning the profile it read and the replay that checked the plan too.

    The arguments are checked (:func:`check_arguments`) before the profile is read (a profile
    piped in may take minutes to arrive), then :func:`solve_checked` runs the algorithm.
    """
    arguments = check_arguments(
        algo, memory, optimizer=optimizer, gradients=gradients, shards=shards, **options
    )
    return solve_checked(load_profile(profile), arguments, progress)


@dataclass(frozen=True)
class SolveArguments:
    """The arguments of a solve, checked (:func:`check_arguments`), before any profile is read."""

    algorithm: AlgorithmInfo
    memory: int | DeviceShare
    """The budget: bytes, or a share of the profile's GPU (:func:`memory_budget`)."""
    memory_text: str
    """The budget as given, for messages."""
    options: Any
    """The family's options object (:func:`memplan.algorithms.options_for`)."""
    optimizer: OptimizerName
    gradients: str = "auto"
    """``auto``, ``at-backward`` or ``kept`` (resolved against the profile when it is read)."""
    shards: int | None = None
    """The FSDP2 ranks the plan is one of (None: one GPU, the whole model)."""


def check_arguments(
    algo: str,
    memory: int | str | None,
    *,
    optimizer: str = "sgd",
    gradients: str | None = "auto",
    shards: int | None = None,
    **options: Any,
) -> SolveArguments:
    """Validate a solve's arguments, the one place that does (InputError naming the option).

    The algorithm, the budget, the family's options and the optimizer are checked. The command
    line calls this, then reads the profile, then :func:`solve_checked`, and maps the errors to
    exit codes.
    """
    info = lookup_algorithm(algo)
    if memory is None:
        raise InputError("--mem: a memory budget is required, e.g. --mem 8GB")
    budget = check_budget(memory)
    family_options = options_for(info.name, options)
    name = check_optimizer(optimizer)
    loop = check_gradients(gradients)
    ranks = check_shards(shards, algorithm=info)
    return SolveArguments(info, budget, str(memory).strip(), family_options, name, loop, ranks)


def solve_checked(
    prof: Profile,
    arguments: SolveArguments,
    progress: Callable[[str], None] | None = None,
) -> Solved:
    """Run the algorithm of ``arguments`` on ``prof``.

    The family is checked against the profile, the plan solved, replayed once, and its makespan
    compared once with the solver's own value. With ``shards``, the plan is one rank's: the
    profile is one rank's (:func:`memplan.profile.sharding.for_ranks`), and ``Solved.profile``.
    """
    info = arguments.algorithm
    family = FAMILIES[info.family]
    check_family(prof, family, info.name)
    # Only the chain family plans under the training loop's terms (docs/model.md).
    loop = resolve_gradients(prof, arguments.gradients) if family.loop_terms else None
    prof = for_ranks(prof, arguments.shards, loop)  # docs/sharding.md
    request = SolveRequest(
        memory=memory_budget(prof, arguments.memory, given=arguments.memory_text),
        algorithm=info.name,
        family=family.name,
        options=arguments.options,
        static_memory=static_memory(prof, arguments.optimizer, loop),
        optimizer=arguments.optimizer,
        progress=progress,
        gradients=loop,
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
        return Solved(prof, schedule, None)
    replayed = _checked(prof, schedule, request.memory, info.name)
    checked = schedule.with_solver_makespan(None)  # the document alone from here on
    return Solved(prof, checked.model_copy(update={"peak_memory": replayed.peak_memory}), replayed)


def check_budget(value: int | str, option: str = "--mem") -> int | DeviceShare:
    """A budget's form, before any profile is read.

    A size in bytes (``8GB``) or a share of the GPU (``gpu``, ``90%``); the message names the
    option (as the command line's).
    """
    try:
        return parse_budget(value)
    except InputError as exc:
        raise InputError(f"{option}: {exc}") from None


def memory_budget(
    profile: Profile,
    memory: int | str | DeviceShare,
    option: str = "--mem",
    given: str | None = None,
) -> int:
    """The budget ``memory`` in bytes on ``profile``'s device.

    A size is taken as it is; ``gpu`` is the memory of the profile's GPU (a profile measured on
    CUDA or estimated for a GPU) less :data:`memplan.units.DEVICE_RESERVE`, what the CUDA context
    and the allocator take; ``90%`` is that share of it. A budget larger than that is kept, with a
    :class:`memplan.errors.BudgetWarning`: the plan will not fit on that GPU. ``given`` is the
    budget as typed, for the messages (default: ``memory``).

    Raises
    ------
    InputError
        A malformed budget, or ``gpu``/``90%`` on a profile without GPU memory (a CPU profile).
    """
    form = memory if isinstance(memory, DeviceShare) else check_budget(memory, option)
    device = profile.device
    gpu = None
    if device is not None and device.kind in ("cuda", "estimated") and device.memory:
        gpu = device.memory
    if isinstance(form, DeviceShare):
        if gpu is None:
            raise InputError(
                f"{option} {form.text}: {_no_gpu_memory(profile)}; give a size, e.g. {option} 8GB, "
                "or use a profile of a GPU (measured on CUDA, or memplan profile MODEL --estimate "
                "a100)"
            )
        budget = form.of(gpu)
    else:
        budget = form
    if gpu is not None and budget > usable_memory(gpu):
        typed = given or (form.text if isinstance(form, DeviceShare) else str(memory).strip())
        gpu_name = (device.name if device is not None else None) or "GPU"
        warnings.warn(
            f"{option} {typed}: {format_size(budget)} is more than the {gpu_name} can "
            f"give a plan ({format_size(usable_memory(gpu))}: its {format_size(gpu)} less "
            f"{format_size(DEVICE_RESERVE)} for the CUDA context and the allocator, as "
            f"{option} gpu); the plan will not fit on that GPU",
            BudgetWarning,
            stacklevel=2,
        )
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

    A chain schedule's ``budget.gradients`` is replaced by ``gradients`` resolved on ``profile``
    (``auto``, ``at-backward``, ``kept``), its static memory recomputed; other families' as they
    are.
    """
    family = FAMILIES.get(schedule.family)
    if gradients is None or family is None or not family.loop_terms:
        return schedule
    loop = resolve_gradients(profile, gradients)
    budget = schedule.budget.model_copy(update={"gradients": loop})
    optimizer = schedule.budget.optimizer or claims.DEFAULT_OPTIMIZER
    static = static_memory(profile, optimizer, loop)
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
    budget = memory_budget(prof, memory) if memory is not None else sched.budget.memory
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
    optimizer: str = "sgd",
) -> list[int]:
    """``steps`` budgets from the least memory any of ``algos`` runs with to the store-all need.

    The store-all need is M_peak (plus static memory): above it nothing is recomputed or
    offloaded. This is the range of Figure 5 of *Optimal GPU-CPU Offloading Strategies* (Euro-Par 2020) (``compare --mem auto:20``).
    """
    if not 1 <= steps <= MAX_STEPS:
        raise InputError(f"--mem auto:{steps}: STEPS must be from 1 to {MAX_STEPS}, e.g. auto:20")
    prof = load_profile(profile)
    families = {lookup_algorithm(name).family for name in algos}
    desc = describe(prof, optimizer)
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
    optimizer: str = "sgd",
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
            sched = solve(prof, name, memory, optimizer=optimizer, gradients=gradients, **options)
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
