"""memplan.torch.runtime.iteration: one iteration under a plan equals plain training, op for op.

For rotor, revolve and periodic plans, greedy and dynprog offloading plans on resnet18 (batch 2,
3x32x32), gpt-tiny and a toy network with dropout and batch norm, and pofo plans that both
recompute and offload on resnet18 and gpt-tiny: after one forward+backward under the plan, the
loss, every parameter gradient and every buffer (batch-norm running statistics) equal those of
plain training from an identical copy; the forward computations counted per stage equal the plan's
F operations per stage; the bytes offloaded and prefetched are the plan's; and, on CPU, the
activation bytes held (RuntimeCounters.live_curve, after each event of the plan) follow the
combined simulator's curve for the activations (planned_activation_curve: the replay without
overheads, gradients and static memory), every point and the peak within 5%. In practice they are
equal to the byte.

Nothing depends on the CPU that runs the tests: the offloading and pofo plans are made from the
real model's sizes with fixed numbers for what the machine decides (1 ms forwards, 2 ms backwards,
no temporary memory), and where a case must exist (a pofo plan that both recomputes and offloads)
the budgets and bandwidths are searched among those fixed numbers.
"""

from __future__ import annotations

import copy
import json

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

import memplan  # noqa: E402
from memplan.api import describe  # noqa: E402
from memplan.cli.app import app  # noqa: E402
from memplan.errors import InputError  # noqa: E402
from memplan.torch import build_model, linearize, profile_model  # noqa: E402
from memplan.torch.planner import fit  # noqa: E402
from memplan.torch.runtime.checkpointed import checkpointed  # noqa: E402
from memplan.torch.runtime.plan import (  # noqa: E402
    planned_activation_curve,
    planned_activation_peak,
    planned_forward_counts,
)

pytestmark = pytest.mark.torch

CHAIN_ALGOS = ("rotor", "revolve", "periodic")
OFFLOAD_ALGOS = ("greedy", "dynprog")


def _toy() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(3)
    model = nn.Sequential(
        nn.Linear(16, 64),
        nn.BatchNorm1d(64),
        nn.Dropout(0.5),
        nn.Linear(64, 64),
        nn.ReLU(),
        nn.Dropout(0.3),
        nn.Linear(64, 64),
        nn.Tanh(),
        nn.Linear(64, 10),
    )
    return model, torch.randn(8, 16)


def _build(name: str) -> tuple[nn.Module, torch.Tensor]:
    if name == "toy":
        return _toy()
    torch.manual_seed(0)
    if name == "resnet18":
        model, x, _ = build_model("resnet18", batch_size=2, input_shape=(3, 32, 32))
    else:
        model, x, _ = build_model("gpt-tiny", batch_size=2, input_shape=(16,))
    return model, x


@pytest.fixture(scope="module", params=["resnet18", "gpt-tiny", "toy"])
def case(request):
    model, x = _build(request.param)
    prof = profile_model(copy.deepcopy(model), example_input=x, repeats=1, name=request.param)
    return request.param, model, x, prof


def _plain(model: nn.Module, x: torch.Tensor):
    ref = copy.deepcopy(model).train()
    chain = linearize(ref, x)
    torch.manual_seed(11)
    loss = chain.forward(x)
    loss.backward()
    return ref, loss.detach()


def _planned(model: nn.Module, x: torch.Tensor, sched, prof, tally: bool = False):
    copy_ = copy.deepcopy(model).train()
    wrapped = checkpointed(linearize(copy_, x), sched, profile=prof, tally=tally)
    torch.manual_seed(11)
    loss = wrapped(x)
    loss.backward()
    return copy_, loss.detach(), wrapped


def _assert_same_training(ref: nn.Module, got: nn.Module) -> None:
    for (name, p), (_, q) in zip(ref.named_parameters(), got.named_parameters(), strict=True):
        assert q.grad is not None, name
        torch.testing.assert_close(q.grad, p.grad, msg=lambda m, n=name: f"{n}: {m}")
    for (name, p), (_, q) in zip(ref.named_buffers(), got.named_buffers(), strict=True):
        torch.testing.assert_close(q, p, msg=lambda m, n=name: f"{n}: {m}")


def _recomputing_budget(prof, gradients: str = "auto") -> int:
    desc = describe(prof, "sgd", gradients)
    least, store_all = desc["min_memory"]["chain"], desc["store_all_memory"]
    return least + (store_all - least) // 3


def _planned_transfer_bytes(prof, sched, kind: str) -> int:
    """Bytes the plan moves with ``kind`` (offload/prefetch), by the profile's sizes."""
    sizes = {"x[0]": prof.input_size}
    for k, stage in enumerate(prof.stages):
        sizes[f"x[{k + 1}]"] = stage.output_size
        sizes[f"s[{k}]"] = stage.saved_size
    return sum(sizes[op.tensor or f"s[{op.stage}]"] for op in sched.ops if op.op == kind)


def _check_plan(model, x, prof, sched) -> None:
    """One iteration under ``sched`` trains as plain training and does what the plan says."""
    ref, ref_loss = _plain(model, x)
    planned = planned_forward_counts(sched, prof.length)
    # The runtime as it trains (its hooks only where the plan acts), then counting the bytes.
    for tally in (False, True):
        got, loss, wrapped = _planned(model, x, sched, prof, tally)
        torch.testing.assert_close(loss, ref_loss)
        _assert_same_training(ref, got)
        counters = wrapped.counters
        assert [counters.forward_count(k) for k in range(prof.length)] == planned
        for kind in ("F_all", "F_ck", "F_n"):
            kinds = [
                sum(o.op == kind and o.stage == k for o in sched.ops) for k in range(prof.length)
            ]
            assert [counters.forwards[k].get(kind, 0) for k in range(prof.length)] == kinds
        assert counters.backwards == [1] * prof.length
        # The transfers moved the tensors the plan names, whole (plain copies on CPU).
        assert counters.offloaded_bytes == _planned_transfer_bytes(prof, sched, "offload")
        assert counters.prefetched_bytes == _planned_transfer_bytes(prof, sched, "prefetch")
    # What autograd saved per stage is what the profile measured.
    assert counters.saved_bytes == [s.saved_size for s in prof.stages]
    # CPU: the activation bytes held, against the simulator's activation-only replay.
    predicted = planned_activation_peak(prof, sched)
    assert abs(counters.peak_live_bytes - predicted) <= 0.05 * predicted
    # ... and the whole curve, event by event (the same byte counts in practice).
    curve = planned_activation_curve(prof, sched)
    assert len(counters.live_curve) == len(curve)
    for measured, planned in zip(counters.live_curve, curve, strict=True):
        assert abs(measured - planned) <= 0.05 * predicted
    assert counters.live_bytes == 0  # everything freed at the end of the iteration


@pytest.mark.parametrize("algo", CHAIN_ALGOS)
def test_chain_plan_trains_like_plain(case, algo):
    name, model, x, prof = case
    # planned with the gradients kept: in PyTorch's default loop the toy MLP's least memory is
    # its store-all need (its weight gradients, created by the backward, make the peak)
    budget = _recomputing_budget(prof, "kept")
    sched = memplan.solve(prof, algo, budget, gradients="kept")
    assert sched.feasible, (name, algo, sched.min_memory)
    planned = planned_forward_counts(sched, prof.length)
    assert sum(planned) > prof.length or algo == "periodic", "the budget forces recomputation"
    _check_plan(model, x, prof, sched)


def _with_bandwidth(prof, bandwidth: float, fixed_times: bool = False):
    data = prof.model_dump(exclude_none=True)
    data["bandwidth"] = bandwidth
    if fixed_times:  # deterministic plans: the measured CPU times are noisy
        for stage in data["stages"]:
            stage.update(forward_time=1.0, backward_time=2.0)
    return memplan.load_profile(data)


def _fixed_numbers(prof, bandwidth: float):
    """The real model's sizes with fixed numbers for what the CPU decides: 1 ms forwards, 2 ms
    backwards, no temporary memory. Its plans depend on the model alone, not on the machine
    that measured it (the sizes of x[k], s[k] and the gradients are the model's)."""
    data = _with_bandwidth(prof, bandwidth, fixed_times=True).model_dump(exclude_none=True)
    loop_terms = ("forward_overhead_all", "backward_overhead_fresh", "input_saved", "output_saved")
    for stage in data["stages"]:
        stage.update(forward_overhead=0, backward_overhead=0)
        for key in loop_terms:  # the model the offloading families plan in (docs/model.md)
            stage.pop(key, None)
    return memplan.load_profile(data)


@pytest.mark.parametrize("algo", OFFLOAD_ALGOS)
def test_offload_plan_trains_like_plain(case, algo):
    name, model, x, prof = case
    prof_bw = _fixed_numbers(prof, 1e9)
    desc = describe(prof_bw)
    least, peak = desc["min_memory"]["offload"], desc["offload_peak"]
    sched = memplan.solve(prof_bw, algo, least + (peak - least) // 3)
    assert sched.feasible and sched.family == "offload"
    assert any(op.op == "offload" for op in sched.ops)
    assert planned_forward_counts(sched, prof.length) == [1] * prof.length
    _check_plan(model, x, prof_bw, sched)


def _pofo_mixing(prof):
    """A pofo plan that both recomputes and offloads (its DP's own, not rotor's or dynprog's).

    Stage times fixed (1 ms forward, 2 ms backward), 500 slots, activations only, no temporary
    memory (:func:`_fixed_numbers`: the plans depend on the model's sizes alone, not on the
    CPU). Searched until such plans exist: bandwidths of 30,
    10 and 100 MB/s, and at each 16 then 64 budgets evenly spread from rotor's least memory to
    the store-all need; the plan offloading the most distinct kinds of tensors (x[k] and s[k])
    wins.
    """
    for rate in (3e7, 1e7, 1e8):
        timed = _fixed_numbers(prof, rate)
        desc = describe(timed, "none", "kept")  # pofo plans with the gradients kept
        lo, hi = desc["min_memory"]["chain"], desc["store_all_memory"]
        for points in (16, 64):
            found = []
            for i in range(points):
                memory = lo + (hi - lo) * i // points
                sched = memplan.solve(timed, "pofo", memory, optimizer="none", slots=500)
                moved = {op.tensor[0] for op in sched.ops if op.op == "offload" and op.tensor}
                if sched.feasible and sched.count("offload") and sched.count("F_ck"):
                    found.append(
                        (len(moved), sched.count("offload") + sched.count("F_ck"), i, sched)
                    )
            if found:
                return timed, max(found, key=lambda item: item[:3])[3]
    pytest.fail(f"no bandwidth and budget where pofo both recomputes and offloads ({prof.model})")


@pytest.mark.parametrize("case", ["resnet18", "gpt-tiny"], indirect=True)
def test_pofo_plan_trains_like_plain(case):
    name, model, x, prof = case
    timed, sched = _pofo_mixing(prof)
    assert sched.family == "combined" and sched.algorithm == "pofo"
    assert sched.count("offload") >= 1 and sched.count("prefetch") >= 1
    assert sum(planned_forward_counts(sched, prof.length)) > prof.length  # recomputes
    _check_plan(model, x, timed, sched)


def test_two_steps_of_sgd_match(case):
    name, model, x, prof = case
    sched = memplan.solve(prof, "rotor", _recomputing_budget(prof))
    ref, got = copy.deepcopy(model).train(), copy.deepcopy(model).train()
    plain = linearize(ref, x)
    wrapped = checkpointed(linearize(got, x), sched)
    opt_ref = torch.optim.SGD(ref.parameters(), lr=0.1)
    opt_got = torch.optim.SGD(got.parameters(), lr=0.1)
    for step in range(2):
        for _module, opt, run in ((ref, opt_ref, plain.forward), (got, opt_got, wrapped)):
            opt.zero_grad(set_to_none=True)
            torch.manual_seed(100 + step)
            run(x).backward()
            opt.step()
    for (n, p), (_, q) in zip(ref.named_parameters(), got.named_parameters(), strict=True):
        torch.testing.assert_close(q, p, msg=lambda m, n=n: f"{n}: {m}")


def test_mismatched_schedule_is_an_input_error(case):
    name, model, x, prof = case
    other = memplan.load_profile("resnet50")
    sched = memplan.solve(other, "rotor", "1GB")
    with pytest.raises(InputError, match="stages"):
        checkpointed(linearize(copy.deepcopy(model), x), sched)
    mine = memplan.solve(prof, "rotor", _recomputing_budget(prof))
    data = prof.model_dump(exclude_none=True)
    data["stages"][0]["forward_time"] += 1.0
    with pytest.raises(InputError, match="sha256"):
        checkpointed(linearize(copy.deepcopy(model), x), mine, profile=data)
    broken = mine.model_copy(update={"ops": [op for op in mine.ops if op.op != "F_all"]})
    with pytest.raises(InputError, match="does not replay"):
        checkpointed(linearize(copy.deepcopy(model), x), broken, profile=prof)
    infeasible = memplan.solve(prof, "rotor", 1000)
    with pytest.raises(InputError, match="infeasible"):
        checkpointed(linearize(copy.deepcopy(model), x), infeasible)


def test_stage_list_and_fit():
    model, x = _toy()
    stages = list(linearize(copy.deepcopy(model), x).modules)
    prof = profile_model(copy.deepcopy(model), example_input=x, repeats=1, name="toy")
    sched = memplan.solve(prof, "revolve", _recomputing_budget(prof, "kept"), gradients="kept")
    with pytest.raises(InputError, match="stage names"):
        checkpointed([(f"s{i}", m) for i, m in enumerate(stages)], sched, profile=prof)
    wrapped = checkpointed(stages, sched)  # unnamed stages: only the count is checked
    wrapped(x).backward()
    fitted, plan = fit(copy.deepcopy(model), x, memory=_recomputing_budget(prof), algo="rotor",
                       profile=prof, optimizer="sgd")  # fmt: skip
    assert plan.feasible and fitted.schedule is plan
    fitted(x).backward()
    assert [fitted.counters.forward_count(k) for k in range(prof.length)] == (
        fitted.planned_forward_counts()
    )
    with pytest.raises(InputError, match="no rotor plan fits"):
        fit(copy.deepcopy(model), x, memory=1000, profile=prof)


def test_cli_run_reports_plan_and_measure(tmp_path):
    model, x = _build("gpt-tiny")
    prof = profile_model(copy.deepcopy(model), example_input=x, repeats=1, name="gpt-tiny")
    path = tmp_path / "gpt.json"
    path.write_text(json.dumps(prof.model_dump(mode="json", exclude_none=True)))
    mem = str(_recomputing_budget(prof))
    args = ["run", "gpt-tiny", "--mem", mem, "--steps", "2", "-b", "2", "--input-shape", "16"]
    result = CliRunner().invoke(app, [*args, "--profile", str(path), "--format", "json"])
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["forwards_measured"] == doc["forwards_planned"]
    assert sum(doc["forwards_planned"]) > len(doc["stages"])
    assert doc["measured_activation_peak"] == pytest.approx(doc["planned_activation_peak"], 0.05)
    assert len(doc["losses"]) == 2 and doc["losses"][1] < doc["losses"][0]
    table = CliRunner().invoke(app, [*args, "--repeats", "1"])
    assert table.exit_code == 0, table.stderr
    assert "peak memory of the step" in table.stderr and "forward computations" in table.stderr
    low = CliRunner().invoke(app, [*args, "--profile", str(path), "--mem", "1000"])
    assert low.exit_code == 1 and "infeasible" in low.stderr
    wrong = CliRunner().invoke(app, ["run", "resnet18", "--mem", "1GB", "--profile", str(path)])
    assert wrong.exit_code == 2 and "stages" in wrong.stderr


def test_sequential_with_a_hand_written_plan():
    from memplan.api import schedule_from_sequence
    from memplan.profile.synthetic import homogeneous_chain
    from memplan.torch.split.linearize import MeanSquareLoss

    torch.manual_seed(5)
    seq = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3), MeanSquareLoss())
    ref = copy.deepcopy(seq)
    x = torch.randn(5, 4)
    ops = [("F_ck", 0), ("F_n", 1), ("F_all", 2), ("F_all", 3), ("B", 3), ("B", 2)]
    ops += [("F_all", 0), ("F_all", 1), ("B", 1), ("B", 0)]
    sched = schedule_from_sequence(homogeneous_chain(4), ops)
    assert memplan.simulate(homogeneous_chain(4), sched).valid
    wrapped = checkpointed(seq, sched)
    assert wrapped.names == ["stage0", "stage1", "stage2", "stage3"]
    wrapped(x).backward()
    ref(x).backward()
    _assert_same_training(ref, seq)
    assert [wrapped.counters.forward_count(k) for k in range(4)] == [2, 2, 1, 1]


@pytest.mark.parametrize("case", ["resnet18"], indirect=True)
def test_cli_run_pofo(case, tmp_path):
    """`memplan run --algo pofo`: bandwidth from the profile or --bandwidth; the plan recomputes
    and offloads, and the run does both as planned.

    The profile has the fixed numbers of :func:`_fixed_numbers` (no temporary memory): the plan
    depends on the model alone. Whether the step's measured peak, with the temporaries of this
    CPU's kernels, is within the budget is then the machine's: the exit status must say what the
    document says (test_measure.py holds the budget with profiles measured here).
    """
    name, model, x, prof = case
    timed, sched = _pofo_mixing(prof)
    rate = f"{timed.bandwidth / 1e6:g}MB/s"
    path = tmp_path / "resnet18.json"
    path.write_text(json.dumps(timed.model_dump(mode="json", exclude_none=True)))
    args = ["run", "resnet18", "--algo", "pofo", "--mem", str(sched.budget.memory), "-b", "2"]
    args += ["--input-shape", "3,32,32", "--slots", "500", "--optimizer", "none", "--steps", "2"]
    result = CliRunner().invoke(app, [*args, "--profile", str(path), "--format", "json"])
    assert result.exit_code in (0, 1), result.stderr
    doc = json.loads(result.stdout)
    assert doc["algorithm"] == "pofo"
    assert doc["within_budget"] == (doc["measured_peak_memory"] <= doc["budget_measured"])
    assert result.exit_code == (0 if doc["within_budget"] else 1)
    assert (
        doc["forwards_measured"]
        == doc["forwards_planned"]
        == planned_forward_counts(sched, prof.length)
    )
    assert sum(doc["forwards_planned"]) > len(doc["stages"])
    assert doc["offloaded_bytes"] == doc["offloaded_bytes_planned"] > 0
    assert doc["measured_activation_peak"] == pytest.approx(doc["planned_activation_peak"], 0.05)
    bare = timed.model_dump(mode="json", exclude_none=True)
    bare.pop("bandwidth")
    path.write_text(json.dumps(bare))
    table = CliRunner().invoke(app, [*args, "--profile", str(path), "--bandwidth", rate])
    assert table.exit_code == result.exit_code, table.stderr
    assert "offloaded to host memory" in table.stderr
    # No bandwidth anywhere: a usage error naming the option.
    missing = CliRunner().invoke(app, [*args, "--profile", str(path)])
    assert missing.exit_code == 2 and "--bandwidth" in missing.stderr


def _hand_plan(spec, family="combined"):
    """A schedule from ``(op, stage, start, end[, tensor])`` rows (times only order events)."""
    from memplan.schedule import Budget, Op, ProfileRef, Schedule

    ops = []
    for op, stage, start, end, *tensor in spec:
        stream = "transfer" if op in ("offload", "prefetch") else "compute"
        ops.append(
            Op(
                op=op,
                stage=stage,
                start=start,
                end=end,
                stream=stream,
                tensor=tensor[0] if tensor else None,
            )
        )
    return Schedule(
        family=family,
        algorithm="hand",
        profile=ProfileRef(model="seq", sha256="0" * 64, stages=4),
        budget=Budget(bandwidth=1e9),
        feasible=True,
        lower_bound=0.0,
        ops=ops,
    )


def _seq():
    from memplan.torch.split.linearize import MeanSquareLoss

    torch.manual_seed(5)
    seq = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3), MeanSquareLoss())
    return seq, torch.randn(5, 4)


def test_hand_written_combined_plan():
    """Offload x[0] and s[0] while recomputing: the moved data come back bit for bit."""
    seq, x = _seq()
    ref = copy.deepcopy(seq)
    sched = _hand_plan(
        [
            ("F_all", 0, 0, 1),
            ("offload", 0, 0, 0.5, "x[0]"),
            ("offload", 0, 1, 2, "s[0]"),
            ("F_ck", 1, 1, 2),
            ("F_all", 2, 2, 3),
            ("F_all", 3, 3, 4),
            ("B", 3, 4, 5),
            ("prefetch", 0, 4, 5, "s[0]"),
            ("B", 2, 5, 6),
            ("prefetch", 0, 5, 6, "x[0]"),
            ("F_all", 1, 6, 7),
            ("B", 1, 7, 8),
            ("B", 0, 8, 9),
        ]
    )
    wrapped = checkpointed(seq, sched, tally=True)
    x_before = x.clone()
    wrapped(x).backward()
    ref(x).backward()
    _assert_same_training(ref, seq)
    torch.testing.assert_close(x, x_before, rtol=0, atol=0)
    counters = wrapped.counters
    assert [counters.forward_count(k) for k in range(4)] == [1, 2, 1, 1]
    s0 = counters.saved_bytes[0]
    assert counters.offloaded_bytes == counters.prefetched_bytes == x.numel() * 4 + s0
    # While x[0] and s[0] were on the host, the live curve dropped by their bytes.
    assert min(counters.live_curve[2:8]) < counters.live_curve[1]


def test_bad_transfers_are_input_errors_and_runtime_errors_restore_the_input():
    seq, x = _seq()
    for tensor, match in (("x[9]", "tensor"), ("q[1]", "tensor"), ("s[4]", "tensor")):
        bad = _hand_plan([("F_all", 0, 0, 1), ("offload", 0, 1, 2, tensor)])
        with pytest.raises(InputError, match=match):
            checkpointed(seq, bad)
    chain_with_transfer = _hand_plan([("F_all", 0, 0, 1), ("offload", 0, 1, 2)], family="chain")
    with pytest.raises(InputError, match="chain schedule"):
        checkpointed(seq, chain_with_transfer)
    # x[0] offloaded and never prefetched: B 0 cannot run. The error names the tensor and the
    # caller's input is put back.
    never_back = _hand_plan(
        [("offload", 0, 0, 1, "x[0]")]
        + [("F_all", k, k, k + 1) for k in range(4)]
        + [("B", k, 8 - k, 9 - k) for k in range(3, -1, -1)]
    )
    x_before = x.clone()
    loss = checkpointed(copy.deepcopy(seq), never_back)(x)
    with pytest.raises(RuntimeError, match=r"x\[0\]"):
        loss.backward()
    torch.testing.assert_close(x, x_before, rtol=0, atol=0)


@pytest.mark.parametrize("family", ["chain", "offload", "combined"])
def test_every_runnable_algorithm_plans_one_forward_sweep(family):
    """The runtime follows the model's own forward: it needs a plan whose forward phase computes
    every stage once, in order, the loss last (RuntimePlan refuses others). Every algorithm of
    the families it runs makes such plans, at low, middle and store-all budgets."""
    from memplan.torch.runtime.plan import RuntimePlan

    prof = memplan.load_profile("resnet50").model_copy(update={"bandwidth": 1e8})
    desc = describe(prof)
    least, store_all = (
        desc["min_memory"].get(family) or desc["min_memory"]["chain"],
        desc["store_all_memory"],
    )
    names = [a["name"] for a in memplan.list_algorithms() if a.get("family") == family]
    assert names
    for name in names:
        ran = 0
        for fraction in (0.05, 0.3, 1.0):
            memory = least + int((store_all - least) * fraction) + 1
            sched = memplan.solve(prof, name, memory, slots=None if family == "chain" else 200)
            if sched.feasible:
                plan = RuntimePlan(sched, prof.length)
                assert [s.op for s in plan.sweep][-1] == "F_all"
                ran += 1
        assert ran, name


def test_recomputed_tensors_are_freed_as_the_backward_uses_them(monkeypatch):
    """The tensors a recomputation puts back for autograd are freed when the node that saved
    them has run (by the backward of stage 0, none of stage 1's is alive), as in plain training:
    they must not refer to the recomputation's own graph, whose saved-tensor hooks would keep
    them all alive together."""
    import weakref

    from memplan.api import schedule_from_sequence
    from memplan.profile.synthetic import homogeneous_chain
    from memplan.torch.runtime import iteration as runtime
    from memplan.torch.split.linearize import MeanSquareLoss

    torch.manual_seed(0)
    block = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8))
    seq = nn.Sequential(nn.Linear(4, 8), block, nn.Linear(8, 3), MeanSquareLoss())
    ops = [("F_ck", 0), ("F_n", 1), ("F_all", 2), ("F_all", 3), ("B", 3), ("B", 2)]
    ops += [("F_ck", 0), ("F_all", 1), ("B", 1), ("F_all", 0), ("B", 0)]
    wrapped = checkpointed(seq, schedule_from_sequence(homogeneous_chain(4), ops))
    recomputed: list[weakref.ref] = []
    original = runtime.PlannedIteration.recompute

    def recompute(self, name, k):
        slots = [s for s in (ref() for ref in self.runs[k].slots) if s is not None]
        original(self, name, k)
        recomputed.extend(weakref.ref(s.value) for s in slots if s.value is not None)

    monkeypatch.setattr(runtime.PlannedIteration, "recompute", recompute)
    alive_at_b0: list[int] = []
    seq[0].weight.register_hook(
        lambda grad: alive_at_b0.append(sum(r() is not None for r in recomputed))
    )
    wrapped(torch.randn(5, 4)).backward()
    assert len(recomputed) >= 3 and alive_at_b0 == [0]
