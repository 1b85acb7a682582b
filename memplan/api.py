"""The library API behind the CLI: ``load_profile``, ``solve``, ``simulate``, ``compare``.

Every plan that leaves :func:`solve` has been replayed by the simulator (separate code from the
solvers); a disagreement between the two is a bug and raises :class:`InternalError`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from memplan.errors import InputError, InternalError
from memplan.profile.io import load_profile
from memplan.profile.model import CHAIN_FAMILIES, Profile
from memplan.schedule import Budget, Op, ProfileRef, Schedule, SolverInfo, load_schedule
from memplan.units import parse_rate, parse_size

OPTIMIZER_FACTORS = {"none": 0, "sgd": 2, "momentum": 3, "adam": 4}
"""Static memory as a multiple of the weight bytes: weights + gradients + optimizer state."""

DEFAULT_SLOTS = 500
MAX_SLOTS = 100_000
_TIME_TOLERANCE = 1e-6


def static_memory(profile: Profile, optimizer: str = "sgd") -> int:
    """Bytes present during the whole iteration: weights, their gradients, optimizer state."""
    if optimizer not in OPTIMIZER_FACTORS:
        raise InputError(
            f"--optimizer {optimizer!r}: expected one of {', '.join(OPTIMIZER_FACTORS)}"
        )
    if profile.kind == "graph":  # the graph holds its own weights, gradients, optimizer state
        return profile.weight_size
    return OPTIMIZER_FACTORS[optimizer] * profile.weight_size


def algorithms() -> list[dict[str, Any]]:
    """Every algorithm memplan knows: name, family, exact or heuristic, what it needs."""
    from memplan.algorithms import REGISTRY

    return [info.to_dict() for info in REGISTRY.values()]


def _algorithm(name: str):
    from memplan.algorithms import REGISTRY

    if name not in REGISTRY:
        raise InputError(f"unknown algorithm {name!r}; choose one of: {', '.join(REGISTRY)}")
    return REGISTRY[name]


def _check_slots(slots: int | str | None, family: str = "chain") -> int | str:
    """``--slots``, validated for the family (None: the family's default).

    The combined family (pofo) defaults to ``"auto"`` (50 slots as in the experiments of papers/000,
    and the Theorem 1 DP's finest grid too on short chains, docs/algorithms.md) and accepts 2 to
    10000 (its DP has O(L^2 S) states per budget); the offloading family (dynprog) defaults to
    ``"auto"`` (docs/offload.md, NOTE [ offload slots auto ]) and accepts 2 to 100000; the chain
    family defaults to 500 and accepts 2 to 100000.
    """
    if family == "combined":
        default, most = "auto", 10_000
    elif family == "offload":
        default, most = "auto", MAX_SLOTS
    else:
        default, most = DEFAULT_SLOTS, MAX_SLOTS
    if slots is None:
        return default
    if family in ("offload", "combined") and slots == "auto":
        return slots
    if isinstance(slots, bool) or not isinstance(slots, int) or not 2 <= slots <= most:
        which = " for the combined family (pofo)" if family == "combined" else ""
        if family == "offload":
            which = ", or auto"
        elif family == "combined":
            which += ", or auto"
        raise InputError(f"--slots {slots!r}: expected an integer from 2 to {most}{which}")
    return slots


def timed_ops(profile: Profile, sequence: Iterable[tuple[str, int]]) -> list[Op]:
    """Lay an operation sequence back to back on the compute stream."""
    ops, clock = [], 0.0
    for name, stage in sequence:
        st = profile.stages[stage]
        duration = st.backward_time if name == "B" else st.forward_time
        ops.append(Op(op=name, stage=stage, start=clock, end=clock + duration))
        clock += duration
    return ops


def schedule_from_sequence(
    profile: Profile | Mapping[str, Any] | str,
    sequence: Iterable[tuple[str, int]],
    *,
    algorithm: str = "custom",
    memory: int | str | None = None,
    optimizer: str = "sgd",
) -> Schedule:
    """Wrap a hand-written operation sequence (``[("F_ck", 0), ...]``) as a schedule to simulate.

    The figures (makespan, peak) are left for :func:`simulate` to compute.
    """
    prof = load_profile(profile)
    return Schedule(
        algorithm=algorithm,
        profile=ProfileRef(model=prof.model, sha256=prof.sha256(), stages=prof.length),
        budget=Budget(memory=None if memory is None else parse_size(memory), optimizer=optimizer),
        feasible=True,
        lower_bound=prof.lower_bound,
        static_memory=static_memory(prof, optimizer),
        ops=timed_ops(prof, sequence),
    )


def solve(
    profile: Profile | Mapping[str, Any] | str,
    algo: str = "rotor",
    memory: int | str | None = None,
    *,
    slots: int | str | None = None,
    optimizer: str = "sgd",
    bandwidth: float | str | None = None,
    gpus: int | None = None,
    time_limit: float | None = None,
    progress: Callable[[str], None] | None = None,
    link_bandwidth: float | str | None = None,
) -> Schedule:
    """Run one algorithm and return its schedule, replayed and checked by the simulator.

    Parameters
    ----------
    profile : Profile, dict, path, bundled name or YAML text
    algo : str
        A name from :func:`algorithms` (``store-all``, ``periodic``, ``revolve``, ``rotor``).
    memory : int or str
        The budget for the whole iteration (``"8GB"``, ``"8GiB"`` or bytes), static memory included.
    slots : int or "auto", optional
        Memory discretization of the DP algorithms: 2 to 100000, default 500 (rotor); 2 to
        100000 or ``"auto"`` (the default: finer grids while they are cheap, docs/offload.md) for
        dynprog; 2 to 10000 or ``"auto"`` (the default: 50 as in papers/000, and 64 too on chains
        of at most 24 stages) for pofo.
    optimizer : {"none", "sgd", "momentum", "adam"}
        Which static memory is counted (docs/model.md).
    bandwidth : float or str, optional
        Host<->device bandwidth of the offloading family (``"12GB/s"`` or bytes/s); defaults to
        the profile's ``bandwidth``. The chain algorithms do not use it.
    gpus, time_limit
        For the pipeline and ILP families; the chain and offloading algorithms do not use them.
    progress : callable, optional
        Long solvers (CP-SAT) call it with one line of live progress at a time (the CLI prints
        them on stderr).
    link_bandwidth : float or str, optional
        Pipeline family: bandwidth of each GPU-to-GPU link (``"25GB/s"`` or bytes/s); None:
        transfers between GPUs are free.

    Returns
    -------
    Schedule
        ``feasible`` is False when no plan of this algorithm fits; ``min_memory`` then says the least
        budget that would fit, when known.
    """
    prof = load_profile(profile)
    info = _algorithm(algo)
    check_family(prof, info.family, info.name)
    if memory is None:
        raise InputError("--mem: a memory budget is required, e.g. --mem 8GB")
    budget = parse_size(memory)
    if info.family in _schedule_families():
        return _solve_schedule_family(
            prof,
            info,
            budget,
            optimizer=optimizer,
            slots=slots,
            bandwidth=bandwidth,
            gpus=gpus,
            time_limit=time_limit,
            progress=progress,
            link_bandwidth=link_bandwidth,
        )
    slots = _check_slots(slots, info.family)
    static = static_memory(prof, optimizer)
    if info.family in ("offload", "combined"):
        rate = resolve_bandwidth(prof, info.name, bandwidth)
        # pofo's rotor candidate: at the same slots when given, else (auto) at rotor's default.
        return _solve_offload(prof, info, budget, static, slots, optimizer, rate)
    ref = ProfileRef(model=prof.model, sha256=prof.sha256(), stages=prof.length)
    started = time.perf_counter()
    plan = info.run(prof, budget - static, slots=slots, time_limit=time_limit)
    seconds = time.perf_counter() - started
    common = dict(
        family=info.family,
        algorithm=info.name,
        profile=ref,
        budget=Budget(memory=budget, optimizer=optimizer),
        lower_bound=prof.lower_bound,
        static_memory=static,
    )
    if plan.sequence is None:
        min_memory = None if plan.min_memory is None else plan.min_memory + static
        return Schedule(
            feasible=False,
            min_memory=min_memory,
            solver=SolverInfo(
                seconds=seconds, status="infeasible", slots=plan.slots, message=plan.message
            ),
            **common,
        )
    ops = timed_ops(prof, plan.sequence)
    makespan = ops[-1].end if ops else 0.0
    schedule = Schedule(
        feasible=True,
        makespan=makespan,
        overhead=makespan / prof.lower_bound if prof.lower_bound > 0 else 1.0,
        min_memory=None if plan.min_memory is None else plan.min_memory + static,
        solver=SolverInfo(
            seconds=seconds, status=plan.status, slots=plan.slots, message=plan.message
        ),
        ops=ops,
        **common,
    )
    return _checked(prof, schedule, budget, algo, plan.claimed_makespan)


FAMILY_NAMES = {
    "chain": "a chain profile (stages)",
    "join": "a join profile (branches and turn)",
    "graph": "a graph profile (graph)",
}


def check_family(prof: Profile, family: str, algo: str) -> None:
    """A usage error when ``algo`` (of ``family``) cannot serve this profile's shape."""
    if family in prof.families:
        return
    needs = FAMILY_NAMES["chain" if family in CHAIN_FAMILIES else family]
    fits = ", ".join(prof.families)
    raise InputError(
        f"algorithm {algo} ({family} family) needs {needs}; {prof.model} is "
        f"{FAMILY_NAMES[prof.kind]}: use an algorithm of the {fits} famil{'ies' if ',' in fits else 'y'} (see `memplan algos`)"
    )


def _schedule_families() -> tuple[str, ...]:
    from memplan.algorithms import SCHEDULE_FAMILIES

    return SCHEDULE_FAMILIES


def _solve_schedule_family(
    prof: Profile,
    info: Any,
    budget: int,
    *,
    optimizer: str,
    slots: int | None,
    bandwidth: float | str | None,
    gpus: int | None,
    time_limit: float | None,
    progress: Callable[[str], None] | None,
    link_bandwidth: float | str | None = None,
) -> Schedule:
    """Join, graph and pipeline algorithms build their whole schedule; replay and check it."""
    from memplan.algorithms import SolveRequest

    request = SolveRequest(
        memory=budget,
        static_memory=static_memory(prof, optimizer),
        optimizer=optimizer,
        slots=slots,
        bandwidth=None if bandwidth is None else parse_rate(bandwidth),
        gpus=gpus,
        time_limit=time_limit,
        progress=progress,
        link_bandwidth=None if link_bandwidth is None else parse_rate(link_bandwidth),
    )
    started = time.perf_counter()
    schedule = info.run(prof, request)
    if schedule.solver.seconds == 0.0:
        solver = schedule.solver.model_copy(update={"seconds": time.perf_counter() - started})
        schedule = schedule.model_copy(update={"solver": solver})
    if not schedule.feasible:
        return schedule
    return _checked(prof, schedule, budget, info.name, schedule.makespan)


SIMULATORS = {
    "join": "memplan.simulator.join:simulate_join",
    "graph": "memplan.simulator.graph:simulate_graph",
    "pipeline": "memplan.simulator.pipeline:simulate_pipeline",
}
"""family -> ``module:function(profile, schedule, memory) -> SimulationResult`` (lazy imports)."""


def _family_simulator(family: str) -> Callable[..., Any]:
    import importlib

    module, _, function = SIMULATORS[family].partition(":")
    return getattr(importlib.import_module(module), function)


def resolve_bandwidth(profile: Profile, algo: str, bandwidth: float | str | None) -> float:
    """The bandwidth (bytes/s) of an offloading run: the argument, else the profile's own."""
    if bandwidth is not None:
        return parse_rate(bandwidth)
    if profile.bandwidth is not None:
        return float(profile.bandwidth)
    raise InputError(
        f"algorithm {algo} needs a bandwidth: give --bandwidth 12GB/s or use a profile with a "
        "measured/estimated bandwidth (e.g. resnet50@a100)"
    )


def _solve_offload(
    prof: Profile,
    info: Any,
    budget: int,
    static: int,
    slots: int | str,
    optimizer: str,
    rate: float,
    **options: Any,
) -> Schedule:
    """Run an offloading (papers/004) or combined (papers/000) algorithm; wrap its timed plan."""
    started = time.perf_counter()
    plan = info.run(prof, budget - static, slots=slots, bandwidth=rate, **options)
    seconds = time.perf_counter() - started
    common = dict(
        family=info.family,
        algorithm=info.name,
        profile=ProfileRef(model=prof.model, sha256=prof.sha256(), stages=prof.length),
        budget=Budget(memory=budget, bandwidth=rate, optimizer=optimizer),
        lower_bound=plan.lower_bound,
        static_memory=static,
        min_memory=None if plan.min_memory is None else plan.min_memory + static,
    )
    if plan.ops is None:
        return Schedule(
            feasible=False,
            solver=SolverInfo(
                seconds=seconds, status="infeasible", slots=plan.slots, message=plan.message
            ),
            **common,
        )
    ops = [
        Op(op=name, stage=stage, start=start, end=end, stream=stream, tensor=tensor)
        for name, stage, start, end, stream, tensor in plan.ops
    ]
    makespan = max(op.end for op in ops)
    schedule = Schedule(
        feasible=True,
        makespan=makespan,
        overhead=makespan / plan.lower_bound if plan.lower_bound > 0 else 1.0,
        solver=SolverInfo(
            seconds=seconds, status=plan.status, slots=plan.slots, message=plan.message
        ),
        ops=ops,
        **common,
    )
    return _checked(prof, schedule, budget, info.name, plan.claimed_makespan)


def _checked(
    prof: Profile, schedule: Schedule, budget: int, algo: str, claimed: float | None
) -> Schedule:
    """Replay a solver's plan; a rejected plan or a different makespan is a bug in memplan."""
    check = simulate(prof, schedule, memory=budget, check_claims=False)
    if not check.valid:
        raise InternalError(
            f"{algo} produced a plan the simulator rejects: {check.violation} "
            "(this is a bug in memplan; please report it)"
        )
    if claimed is not None and not _close(claimed, check.makespan):
        raise InternalError(
            f"{algo}: solver value {claimed} != simulated makespan {check.makespan} "
            "(this is a bug in memplan; please report it)"
        )
    return schedule.model_copy(update={"peak_memory": check.peak_memory})


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=_TIME_TOLERANCE, abs_tol=_TIME_TOLERANCE)


def simulate(
    profile: Profile | Mapping[str, Any] | str,
    schedule: Schedule | Mapping[str, Any] | str,
    memory: int | str | None = None,
    *,
    check_claims: bool = True,
):
    """Replay a schedule independently of the solvers.

    Returns a :class:`memplan.simulator.SimulationResult` with ``valid``, ``makespan``,
    ``peak_memory``, ``idle_time`` and ``violation`` (the first problem found, naming the
    operation); chains go to :func:`memplan.simulator.simulate_chain`, offloading schedules to
    :func:`memplan.simulator.simulate_offload` and combined ones (docs/combined.md) to
    :func:`memplan.simulator.simulate_combined` (at the schedule's ``budget.bandwidth``). The budget is
    ``memory`` when given, else the schedule's own. With ``check_claims``, the makespan and peak the
    schedule states must match the replay.
    """
    from memplan.simulator import simulate_chain, simulate_combined, simulate_offload

    prof = load_profile(profile)
    sched = load_schedule(schedule)
    if sched.family not in prof.families:
        raise InputError(
            f"schedule family {sched.family!r} does not fit {prof.model}, "
            f"{FAMILY_NAMES[prof.kind]} (families: {', '.join(prof.families)})"
        )
    if sched.profile.stages is not None and sched.profile.stages != prof.length:
        raise InputError(
            f"schedule was made for a profile with {sched.profile.stages} stages, "
            f"this one has {prof.length} ({prof.model})"
        )
    budget = parse_size(memory) if memory is not None else sched.budget.memory
    if sched.family in SIMULATORS:
        result = _family_simulator(sched.family)(prof, sched, budget)
    elif sched.family == "chain":
        result = simulate_chain(prof, sched.ops, static_memory=sched.static_memory, memory=budget)
    elif sched.family in ("offload", "combined"):
        if sched.budget.bandwidth is None or not sched.budget.bandwidth > 0:
            raise InputError(
                f"budget.bandwidth: {'an offloading' if sched.family == 'offload' else 'a combined'} "
                "schedule must state its bandwidth "
                "(bytes/s), e.g. 12000000000"
            )
        replay = simulate_offload if sched.family == "offload" else simulate_combined
        result = replay(
            prof,
            sched.ops,
            static_memory=sched.static_memory,
            memory=budget,
            bandwidth=sched.budget.bandwidth,
        )
    else:
        raise InputError(f"schedule family {sched.family!r} cannot be simulated yet")
    if check_claims and result.valid and sched.feasible:
        if sched.makespan is not None and not _close(sched.makespan, result.makespan):
            result.fail(f"makespan: schedule says {sched.makespan}, replay gives {result.makespan}")
        elif sched.peak_memory is not None and sched.peak_memory != result.peak_memory:
            result.fail(
                f"peak_memory: schedule says {sched.peak_memory}, replay gives {result.peak_memory}"
            )
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
    if steps < 1 or stop < start:
        raise InputError(f"--mem {text!r}: expected START <= STOP and STEPS >= 1")
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
    offloaded. This is the range of Figure 5 of papers/004 (``compare --mem auto:20``).
    """
    prof = load_profile(profile)
    families = {_algorithm(name).family for name in algos}
    desc = describe(prof, optimizer)
    least = [desc["min_memory"][f] for f in families if f in desc["min_memory"]]
    start = min(least) if least else desc["store_all_memory"]
    stop = max(start, desc["store_all_memory"])
    if steps < 1:
        raise InputError(f"--mem auto:{steps}: STEPS must be at least 1, e.g. auto:20")
    if steps == 1:
        return [start]
    return [round(start + (stop - start) * i / (steps - 1)) for i in range(steps)]


def compare(
    profile: Profile | Mapping[str, Any] | str,
    algos: Iterable[str],
    budgets: Iterable[int | str],
    *,
    slots: int | None = None,
    optimizer: str = "sgd",
    bandwidth: float | str | None = None,
    gpus: int | None = None,
    link_bandwidth: float | str | None = None,
    time_limit: float | None = None,
    on_progress: Callable[[int, int], None] | None = None,
) -> list[CompareRow]:
    """Sweep algorithms over budgets; ``ratio`` is makespan / lower bound.

    Within one family the lower bound is each schedule's own: for the offloading family, LB of
    Proposition 3 at each budget and at ``bandwidth`` (default: the profile's), so the ratios are
    those of Figure 5 of papers/004. When the algorithms span several families, every ratio uses
    the one bound valid for all of them, the compute lower bound (every forward and backward
    once, ``profile.lower_bound``), so that the columns compare. ``gpus``, ``link_bandwidth`` and
    ``time_limit`` go to the pipeline (and CP-SAT) algorithms, whose budgets are per GPU.
    """
    prof = load_profile(profile)
    names = list(algos)
    families = {_algorithm(name).family for name in names}
    common = prof.lower_bound if len(families) > 1 and prof.lower_bound > 0 else None
    sizes = [parse_size(b) for b in budgets]
    rows: list[CompareRow] = []
    total, done = len(names) * len(sizes), 0
    for memory in sizes:
        for name in names:
            sched = solve(
                prof,
                name,
                memory,
                slots=slots,
                optimizer=optimizer,
                bandwidth=bandwidth,
                gpus=gpus,
                link_bandwidth=link_bandwidth,
                time_limit=time_limit,
            )
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


def describe(profile: Profile | Mapping[str, Any] | str, optimizer: str = "sgd") -> dict[str, Any]:
    """What ``memplan info`` shows: the profile's metadata, totals and the memory each family needs.

    ``store_all_memory`` is the budget store-all needs (no recomputation); ``min_memory`` the least
    budget with which any plan of a family exists: ``chain``, everything recomputed from the
    input; ``offload``, every activation offloaded (papers/004). ``offload_peak`` is M_peak, the
    budget above which nothing needs offloading (the store-all need). All include the static
    memory of ``optimizer``.
    """
    from memplan.algorithms.chain import Chain, chain_min_memory
    from memplan.algorithms.offload import OffloadInstance

    prof = load_profile(profile)
    static = static_memory(prof, optimizer)
    device = prof.device.model_dump(exclude_none=True) if prof.device else None
    common = {
        "model": prof.model,
        "kind": prof.kind,
        "families": list(prof.families),
        "stages": prof.length,
        "batch_size": prof.batch_size,
        "input_shape": prof.input_shape,
        "dtype": prof.dtype,
        "device": device,
        "bandwidth": prof.bandwidth,
        "measured": prof.measured.model_dump(exclude_none=True) if prof.measured else None,
        "weight_size": prof.weight_size,
        "optimizer": optimizer,
        "static_memory": static,
        "lower_bound": prof.lower_bound,
        "sha256": prof.sha256(),
    }
    if prof.stages is None:
        return {**common, **_describe_family(prof, static)}
    chain = Chain.from_profile(prof)
    offload = OffloadInstance.from_profile(prof, prof.bandwidth or 1.0)
    return {
        **common,
        "input_size": prof.input_size,
        "store_all_memory": static + chain.store_all_peak(),
        "min_memory": {
            "chain": static + chain_min_memory(chain),
            "offload": static + offload.min_memory(),
        },
        "offload_peak": static + offload.peak(),
        "stage_table": [s.model_dump(exclude_none=True) for s in prof.stages],
    }


def _describe_family(prof: Profile, static: int) -> dict[str, Any]:
    """``describe`` for join and graph profiles: each family's own figures (min_memory, ...)."""
    found: dict[str, Any] = {"min_memory": {}}
    if prof.branches is not None:
        from memplan.algorithms.join import describe_join

        found = _merge(found, describe_join(prof, static))
    if prof.graph is not None:
        from memplan.algorithms.graph import describe_graph

        found = _merge(found, describe_graph(prof, static))
    return found


def _merge(into: dict[str, Any], more: dict[str, Any]) -> dict[str, Any]:
    merged = {**into, **more}
    merged["min_memory"] = {**into.get("min_memory", {}), **more.get("min_memory", {})}
    return merged
