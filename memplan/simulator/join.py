"""Replay a join-network schedule (Optimal Memory-aware Backpropagation of Deep Join Networks, Phil. Trans. R. Soc. A 2020) operation by operation, per docs/join.md.

Independent of the solvers (imports nothing from :mod:`memplan.algorithms`). Two memory models,
named by the schedule's ``join_model``:

``pebble``
    The paper's model (Section 2) with sizes in bytes: values are replaced in place. ``F_ck``
    keeps its input, ``F_n`` writes its output over its input, the ``turn`` replaces every branch
    output ``x[j][l_j]`` by its gradient ``g[j][l_j]``, ``B`` replaces ``x[j][i]`` and ``g[j][i+1]``
    by ``g[j][i]`` (``B`` reads only the stage input). ``g[j][0]`` (the paper's ``xbar_0``) has the
    size of the branch input and stays to the end. With every size equal to ``s``, the bytes held
    are ``s`` times the slots of the pebble game.
``chain``
    docs/model.md on every branch (``F_all``/``F_ck``/``F_n``/``B``, saved tensors ``s[j][i]``,
    memory persistency per branch: ``F_n`` may free a stored ``x[j][i]`` only when the last
    operation on branch ``j`` produced it, and the turn ends every such run); the ``turn`` is the forward and backward of the loss stage joining the
    branches: it reads every branch output and writes every branch output's gradient.

Under the training loop of the schedule's ``budget.gradients`` (docs/model.md, "The training
loop"; the terms computed by :mod:`memplan.simulator.terms`), every ``B`` and the turn create
their weight gradients, which stay, and take their loop's backward overhead; in the chain model
``F_all`` takes its own overhead and frees its input where autograd does (the standalone
``x[j][i]`` and ``s[j][i-1]``'s part, as docs/model.md), and the turn's forward frees the branch
outputs autograd does not keep. Under ``step-in-backward`` every ``B`` and the turn hold the step's
temporaries and free the gradients they step at their end; with the optimizer's step after the
backward (``budget.optimizer_step``), the replay ends with it.
"""

from __future__ import annotations

from memplan.profile.model import Profile
from memplan.schedule import Budget, Schedule
from memplan.simulator.result import SimulationResult, over_budget
from memplan.simulator.terms import stage_loops, static_memory, step_temporaries, turn_loop
from memplan.simulator.timing import back_to_back_problem


class _Branches:
    """Sizes and times of every branch, as plain lists (``x``, ``s``, ``g`` per docs/join.md),
    and the training loop's terms (``fa``, ``bo``, ``wg``, ``fr``, and under ``step-in-backward``
    ``st`` and ``sp``, per stage; the turn's own).
    """

    def __init__(self, profile: Profile, model: str, budget: Budget) -> None:
        assert profile.branches is not None and profile.turn is not None
        branches = profile.branches
        self.lengths = [len(b.stages) for b in branches]
        self.x = [[b.input_size] + [st.output_size for st in b.stages] for b in branches]
        self.s = [[st.saved_size for st in b.stages] for b in branches]
        g0 = (lambda b: b.input_size) if model == "pebble" else (lambda b: 0)
        self.g = [[g0(b)] + [st.gradient_size for st in b.stages] for b in branches]
        self.fo = [[st.forward_overhead for st in b.stages] for b in branches]
        loops = [stage_loops(b.stages, budget, loss=False) for b in branches]
        self.fa = [[t.forward_all for t in loop] for loop in loops]
        self.bo = [[t.backward for t in loop] for loop in loops]
        self.wg = [[t.weight_grads for t in loop] for loop in loops]
        self.fr = [[t.frees_input for t in loop] for loop in loops]
        self.st = [[t.steps for t in loop] for loop in loops]  # stepped, freed at B's end
        self.sp = [[t.step_temporaries for t in loop] for loop in loops]  # held during B
        self.ft = [[st.forward_time for st in b.stages] for b in branches]
        self.bt = [[st.backward_time for st in b.stages] for b in branches]
        self.turn = profile.turn
        lasts = [b.stages[-1] if b.stages else None for b in branches]
        self.turn_loop, self.turn_frees = turn_loop(profile.turn, lasts, budget)

    def duration(self, name: str, branch: int | None, stage: int) -> float:
        if name == "turn":
            return self.turn.forward_time + self.turn.backward_time
        assert branch is not None  # every operation but the turn names its branch
        return (self.bt if name == "B" else self.ft)[branch][stage]


class _JoinMemory:
    """What is in memory during a replay; ``held`` is the running total of bytes."""

    def __init__(self, net: _Branches, model: str) -> None:
        self.net = net
        self.model = model
        self.k = len(net.lengths)
        self.x_held = [[i == 0 for i in range(length + 1)] for length in net.lengths]
        self.s_held = [[False] * length for length in net.lengths]
        # per branch: the i whose s[j][i] is held without x[j][i+1], which autograd freed
        self.cut: list[set[int]] = [set() for _ in net.lengths]
        self.turned = False
        # index i of the gradient g[j][i] each branch holds, once the turn has run
        self.grad = list(net.lengths)
        # per branch: the standalone x[j][i] the last operation on that branch produced, or -1
        self.fresh = [-1] * self.k
        self.held = sum(x[0] for x in net.x)
        if model == "chain":
            self.held += net.turn.gradient_size  # the loss gradient, held from the start

    def available(self, j: int, i: int) -> bool:
        if self.x_held[j][i]:
            return True
        return (
            self.model == "chain" and i > 0 and self.s_held[j][i - 1] and i - 1 not in self.cut[j]
        )

    def saved_bytes(self, j: int, i: int) -> int:
        """What ``s[j][i]`` holds now: less ``x[j][i+1]`` where autograd freed it."""
        return self.net.s[j][i] - (self.net.x[j][i + 1] if i in self.cut[j] else 0)

    def freed_at(self, j: int, i: int) -> int:
        """The bytes of ``x[j][i]`` autograd frees now (after a forward that frees it): the
        standalone tensor and ``s[j][i-1]``'s part, where held.
        """
        freed = self.net.x[j][i] if self.x_held[j][i] else 0
        if i > 0 and self.s_held[j][i - 1] and i - 1 not in self.cut[j]:
            freed += self.net.x[j][i]
        return freed

    def free(self, j: int, i: int) -> None:
        """Autograd frees ``x[j][i]`` (NOTE [ simulator memory terms ])."""
        self.held -= self.freed_at(j, i)
        self.x_held[j][i] = False
        if i > 0 and self.s_held[j][i - 1]:
            self.cut[j].add(i - 1)

    def problem(self, name: str, j: int | None, i: int) -> str | None:
        """Why operation ``name`` of stage ``i`` of branch ``j`` cannot run now, or None."""
        if name == "turn":
            return self.turn_problem()
        assert j is not None
        if name == "B":
            return self.backward_problem(j, i)
        return self.forward_problem(name, j, i)

    def turn_problem(self) -> str | None:
        """Why the turn cannot run now, or None."""
        net = self.net
        if self.turned:
            return "the turn has already run"
        for b in range(self.k):
            if not self.available(b, net.lengths[b]):
                return f"x[{b}][{net.lengths[b]}] (output of branch {b}) is not in memory"
        return None

    def backward_problem(self, j: int, i: int) -> str | None:
        """Why ``B`` of stage ``i`` of branch ``j`` cannot run now, or None."""
        if not self.turned:
            return "backward before the turn"
        if self.grad[j] != i + 1:
            nxt = self.grad[j] - 1
            if nxt < 0:
                return f"every backward of branch {j} has already run"
            return f"backward out of order: the next backward of branch {j} is stage {nxt}"
        if self.model == "chain" and not self.s_held[j][i]:
            return f"s[{j}][{i}] is not in memory"
        if self.net.fr[j][i]:
            return None  # the backward does not read x[j][i] (autograd freed it after F_all)
        if not self.available(j, i):
            return f"x[{j}][{i}] is not in memory"
        return None

    def forward_problem(self, name: str, j: int, i: int) -> str | None:
        """Why forward ``name`` of stage ``i`` of branch ``j`` cannot run now, or None."""
        if not self.available(j, i):
            if i == 0:
                return f"x[{j}][0] is not in memory (a branch input cannot be recomputed)"
            return f"x[{j}][{i}] is not in memory"
        if name == "F_all":
            if self.model == "pebble":
                return "F_all is not an operation of the pebble model (F_ck, F_n, B, turn)"
            if self.s_held[j][i]:
                return f"s[{j}][{i}] is already in memory"
            return None
        if self.x_held[j][i + 1]:
            return f"x[{j}][{i + 1}] is already in memory"
        if self.model == "pebble" and name == "F_n" and not self.x_held[j][i]:
            return f"x[{j}][{i}] is not in memory"
        if self.model == "chain" and name == "F_n" and self.x_held[j][i] and self.fresh[j] != i:
            return (
                f"would free the stored checkpoint x[{j}][{i}] (memory persistency: F_n may only "
                "consume the activation the previous operation produced; use F_ck)"
            )
        return None

    def peak(self, name: str, j: int | None, i: int) -> int:
        net, held = self.net, self.held
        if name == "turn":
            outs = [net.x[b][net.lengths[b]] for b in range(self.k)]
            grads = [net.g[b][net.lengths[b]] for b in range(self.k)]
            t, loop = net.turn, net.turn_loop
            created = loop.weight_grads + loop.step_temporaries
            if self.model == "pebble":
                extra = max(0, sum(grads) - sum(outs))
                return held + extra + max(t.forward_overhead, created + loop.backward)
            freed = sum(
                self.freed_at(b, net.lengths[b]) for b in range(self.k) if net.turn_frees[b]
            )
            backward = sum(grads) + created + loop.backward - freed
            return held + t.saved_size + max(loop.forward_all, backward)
        assert j is not None
        if name == "B":
            created = net.wg[j][i] + net.sp[j][i]
            if self.model == "pebble":
                freed = net.x[j][i] + net.g[j][i + 1]
                return held + max(0, net.g[j][i] - freed) + created + net.bo[j][i]
            return held + net.g[j][i] + created + net.bo[j][i]
        if name == "F_all":
            return held + net.s[j][i] + net.fa[j][i]
        if name == "F_n" and self.model == "pebble":
            return held + max(0, net.x[j][i + 1] - net.x[j][i]) + net.fo[j][i]
        return held + net.x[j][i + 1] + net.fo[j][i]

    def apply(self, name: str, j: int | None, i: int) -> None:
        net = self.net
        if name == "turn":
            self.fresh = [-1] * self.k
            self.held += net.turn_loop.weight_grads - net.turn_loop.steps
            for b in range(self.k):
                top = net.lengths[b]
                self.held += net.g[b][top]
                if net.turn_frees[b] and self.model == "chain":
                    self.free(b, top)
                if self.x_held[b][top]:
                    self.x_held[b][top] = False
                    self.held -= net.x[b][top]
            if self.model == "chain":
                self.held -= net.turn.gradient_size
            self.turned = True
            return
        assert j is not None
        self.fresh[j] = i + 1 if name in ("F_ck", "F_n") else -1
        if name == "F_all":
            self.s_held[j][i] = True
            self.held += net.s[j][i]
            if net.fr[j][i]:
                self.free(j, i)
            return
        if name == "B":
            self.held += net.g[j][i] + net.wg[j][i] - net.st[j][i] - net.g[j][i + 1]
            self.grad[j] = i
            if self.model == "chain":
                self.held -= self.saved_bytes(j, i)
                self.s_held[j][i] = False
                self.cut[j].discard(i)
        else:  # F_ck, F_n
            self.x_held[j][i + 1] = True
            self.held += net.x[j][i + 1]
            if name == "F_ck":
                return
        if self.x_held[j][i]:  # F_n and B free the standalone input
            self.x_held[j][i] = False
            self.held -= net.x[j][i]

    def unfinished(self) -> str | None:
        if not self.turned:
            return "incomplete: the turn never ran"
        for b in range(self.k):
            if self.grad[b] != 0:
                return f"incomplete: B on stage {self.grad[b] - 1} of branch {b} never ran"
        return None


def simulate_join(profile: Profile, schedule: Schedule, memory: int | None) -> SimulationResult:
    """Replay a join schedule: makespan, peak memory (static included) and the first violation.

    Parameters
    ----------
    profile : Profile
        A join profile (``branches`` and ``turn``).
    schedule : Schedule
        ``family: join`` with ``join_model`` ``pebble`` or ``chain``; every operation names its
        ``branch`` (except the ``turn``) and its ``stage`` within the branch.
    memory : int, optional
        Budget in bytes, static memory included.

    Returns
    -------
    SimulationResult
        As the chain-model simulator (:mod:`memplan.simulator.combined`): a model violation
        stops the replay; timing and memory violations are reported and the replay goes on.
    """
    static = static_memory(profile, schedule.budget) or 0  # never the claim
    result = SimulationResult(static_memory=static, budget=memory)
    model = schedule.join_model
    if profile.branches is None or profile.turn is None:
        result.fail("the profile is not a join network (no branches and turn)")
        return result
    if model not in ("pebble", "chain"):
        result.fail("join_model: expected 'pebble' or 'chain' (docs/join.md)")
        return result
    net = _Branches(profile, model, schedule.budget)
    state = _JoinMemory(net, model)
    result.peak_memory = static + state.held
    makespan = previous_end = 0.0
    k = len(net.lengths)
    for index, op in enumerate(schedule.ops):
        name, j, i = op.op, op.branch, op.stage
        where = f"ops[{index}] {name}" + ("" if j is None else f" branch {j}") + f" stage {i}"
        if op.stream != "compute" or name in ("offload", "prefetch"):
            result.fail(f"{where}: transfers are not part of the join model", index)
            break
        if name == "turn":
            if j is not None or i != 0:
                result.fail(f"{where}: the turn has no branch and stage 0", index)
                break
        else:
            if j is None or not 0 <= j < k:
                result.fail(f"{where}: expected a branch from 0 to {k - 1}", index)
                break
            if not 0 <= i < net.lengths[j]:
                result.fail(
                    f"{where}: no such stage (branch {j} has {net.lengths[j]} stages)", index
                )
                break
        problem = state.problem(name, j, i)
        if problem is not None:
            result.fail(f"{where}: {problem}", index)
            break
        duration = net.duration(name, j, i)
        problem = back_to_back_problem(index, op.start, op.end, previous_end, duration, "join")
        if problem is not None:
            result.fail(problem, index)
        previous_end = op.end
        makespan += duration
        peak = static + state.peak(name, j, i)
        if memory is not None and peak > memory:
            result.fail(f"{where}: {over_budget(peak, memory)}", index)
        result.op_peaks.append(peak)
        result.peak_memory = max(result.peak_memory, peak)
        result.memory_curve.append((op.start, peak))
        state.apply(name, j, i)
        result.memory_curve.append((op.end, static + state.held))
    else:
        missing = state.unfinished()
        if missing is not None:
            result.fail(missing)
        elif schedule.ops:
            _step_after_backward(profile, schedule, state, result, previous_end)
    result.makespan = makespan
    return result


def _step_after_backward(
    profile: Profile, schedule: Schedule, state: _JoinMemory, result: SimulationResult, end: float
) -> None:
    """The optimizer's step after the last backward, when the budget counts it (NOTE
    [ simulator memory terms ]): what the replay holds then (the weight gradients; the pebble
    model's input gradients are no tensor of the loop), every branch's batch and the step's
    temporaries.
    """
    temporaries = step_temporaries(profile, schedule.budget)
    if temporaries is None:
        return
    net = state.net
    held = state.held - sum(g[0] for g in net.g)
    batch = sum(x[0] for j, x in enumerate(net.x) if not state.x_held[j][0])
    stepping = result.static_memory + held + batch + temporaries
    if result.budget is not None and stepping > result.budget:
        result.fail(f"the optimizer's step {over_budget(stepping, result.budget)}")
    result.memory_curve += [(end, stepping), (end, result.static_memory + state.held)]
    result.peak_memory = max(result.peak_memory, stepping)
