"""NOTE [ What the runtime skips ]: where the plan keeps what plain training keeps, the runtime
does nothing, and still trains as plain training does.

The plan says where it acts (``RuntimePlan.plain``, ``watched``, ``passive``); the runtime enters
``saved_tensors_hooks`` only for the stages it acts on (counted by a spy around PyTorch's own
class), registers no block hook for a store-all plan under ``enable``, counts the bytes only
when asked (``tally``), and the parameters after several steps equal plain training's. The
timings are in benchmarks/bench_enable_overhead.py, not here.
"""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

from memplan.api import schedule_from_sequence  # noqa: E402
from memplan.profile.synthetic import homogeneous_chain  # noqa: E402
from memplan.torch.runtime.checkpointed import checkpointed  # noqa: E402
from memplan.torch.runtime.plan import RuntimePlan  # noqa: E402
from memplan.torch.runtime.recompute import recomputing  # noqa: E402
from memplan.torch.split.linearize import MeanSquareLoss  # noqa: E402

pytestmark = pytest.mark.torch

STORE_ALL = [("F_all", 0), ("F_all", 1), ("F_all", 2), ("F_all", 3)]
STORE_ALL += [("B", 3), ("B", 2), ("B", 1), ("B", 0)]
FIRST_RECOMPUTED = [("F_ck", 0), ("F_all", 1), ("F_all", 2), ("F_all", 3)]
FIRST_RECOMPUTED += [("B", 3), ("B", 2), ("B", 1), ("F_all", 0), ("B", 0)]
THIRD_RECOMPUTED = [("F_all", 0), ("F_all", 1), ("F_ck", 2), ("F_all", 3)]
THIRD_RECOMPUTED += [("B", 3), ("F_all", 2), ("B", 2), ("B", 1), ("B", 0)]


def _plan(ops) -> RuntimePlan:
    return RuntimePlan(schedule_from_sequence(homogeneous_chain(4), ops), 4)


def _seq() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(4, 8), nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8)),
        nn.Linear(8, 3), MeanSquareLoss(),
    )  # fmt: skip


@pytest.fixture
def hooks_entered(monkeypatch) -> list[int]:
    """How many ``saved_tensors_hooks`` contexts were entered (PyTorch's class, spied on)."""
    entered: list[int] = []
    original = torch.autograd.graph.saved_tensors_hooks

    class Counting(original):  # type: ignore[misc, valid-type]
        def __enter__(self) -> None:
            entered.append(1)
            super().__enter__()

    monkeypatch.setattr(torch.autograd.graph, "saved_tensors_hooks", Counting)
    return entered


def test_the_plan_says_where_the_runtime_acts():
    store_all = _plan(STORE_ALL)
    assert store_all.plain == [True] * 4 and store_all.passive
    assert store_all.watched == [False] * 4
    first = _plan(FIRST_RECOMPUTED)
    assert first.plain == [False, True, True, True] and not first.passive
    assert first.watched == [True, False, False, False]  # B 1..3: nothing to do there
    # stage 1's output x[2] is what the recomputation of stage 2 reads: the runtime holds it
    # until B 1 starts, so it watches that backward
    third = _plan(THIRD_RECOMPUTED)
    assert third.plain == [True, True, False, True] and not third.passive
    assert third.watched == [False, True, True, False]


@pytest.mark.parametrize("ops", [STORE_ALL, FIRST_RECOMPUTED, THIRD_RECOMPUTED])
@pytest.mark.parametrize("tally", [False, True])
def test_hooks_only_where_the_plan_acts(ops, tally, hooks_entered):
    """saved_tensors_hooks for the stages the plan does not keep whole and for each
    recomputation with gradients, none for the others (every stage when tallying); the
    gradients are plain training's either way."""
    ref, seq = _seq(), _seq()
    x = torch.randn(5, 4)
    sched = schedule_from_sequence(homogeneous_chain(4), ops)
    wrapped = checkpointed(seq, sched, tally=tally)
    plan = wrapped.plan
    for _ in range(2):
        hooks_entered.clear()
        wrapped(x).backward()
    ref(x).backward()
    ref(x).backward()
    for p, q in zip(ref.parameters(), seq.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad)
    in_sweep = sum(s.op == "F_all" for s in plan.sweep)
    recomputed_with_grad = sum(op.op == "F_all" for op in sched.ops) - in_sweep
    hooked = 4 if tally else sum(not p for p in plan.plain)
    assert len(hooks_entered) == hooked + recomputed_with_grad
    counters = wrapped.counters
    assert counters.backwards == [1] * 4
    assert [counters.forward_count(k) for k in range(4)] == plan.forward_counts
    if tally:
        assert counters.peak_live_bytes > 0 and counters.live_curve
        assert all(b > 0 for b in counters.saved_bytes)
    else:
        assert counters.peak_live_bytes == 0 and counters.live_curve == []


def _tiny_gpt2():
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=16, bos_token_id=0,
        eos_token_id=0,
    )  # fmt: skip
    model = transformers.GPT2LMHeadModel(config).train()
    model.config.use_cache = False
    return model


def _block_hooks(model) -> int:
    return sum(len(b._forward_pre_hooks) + len(b._forward_hooks) for b in model.transformer.h)


def test_a_store_all_plan_under_enable_runs_the_model_untouched(hooks_entered):
    """A plan that recomputes nothing: no block hook, no saved-tensor hook; the counters say
    every stage ran forward and backward once; ``tally`` turns the byte counts on (and the
    stage hooks with it) from the next step, and off again."""
    from memplan.torch import enable, planned

    model = _tiny_gpt2()
    ref = copy.deepcopy(model)
    ids = torch.randint(0, 100, (2, 16), generator=torch.Generator().manual_seed(1))
    got = enable(copy.deepcopy(model), "10GB", example_input={"input_ids": ids}, repeats=1)
    plan = planned(got)
    assert plan is not None and plan.plan.passive and plan.how == "hooks"
    assert _block_hooks(got) == 0
    stages = len(plan.names)
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (ref, got)]

    def steps(n: int) -> None:
        for step in range(n):
            batch = torch.randint(0, 100, (2, 16), generator=torch.Generator().manual_seed(step))
            for m, opt in zip((ref, got), opts, strict=True):
                opt.zero_grad()
                torch.manual_seed(step)
                m(input_ids=batch, labels=batch).loss.backward()
                opt.step()

    hooks_entered.clear()
    steps(2)
    assert hooks_entered == []
    assert plan.counters.forwards == [{"F_all": 1}] * stages
    assert plan.counters.backwards == [1] * stages
    plan.tally = True
    steps(1)
    assert _block_hooks(got) > 0 and hooks_entered
    assert plan.counters.saved_bytes[1] > 0 and plan.counters.peak_live_bytes > 0
    assert plan.counters.backwards == [1] * stages
    plan.tally = False
    steps(1)
    assert _block_hooks(got) == 0
    for (name, p), (_, q) in zip(ref.named_parameters(), got.named_parameters(), strict=True):
        torch.testing.assert_close(q, p, msg=lambda m, n=name: f"{n}: {m}")


def test_a_recomputation_writes_back_only_the_buffers_it_changed():
    """Batch-norm statistics are put back as they were before the recomputation; a buffer the
    stage only read keeps its version counter (autograd checks it where another stage saved
    it: a mask or rotary table the blocks share)."""

    class Reads(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("table", torch.arange(4.0))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * self.table

    norm, reads = nn.BatchNorm1d(4).train(), Reads()
    stage = nn.Sequential(reads, norm)
    before = [b.clone() for b in norm.buffers()]
    version = reads.table._version
    with recomputing(stage, None, torch.device("cpu")):
        stage(torch.randn(3, 4))
    for b, value in zip(norm.buffers(), before, strict=True):
        torch.testing.assert_close(b, value, rtol=0, atol=0)
    assert reads.table._version == version
