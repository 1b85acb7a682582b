"""Selective checkpointing options of a stage (docs/model.md, "Options of a stage"), end to end.

A tiny GPT-2 and a tiny Llama (transformers configs, one thread) profiled with ``selective=True``
get options on every block; rotor chooses them where they pay; a plan that runs them trains as
plain training does (the same parameters after several SGD steps on different batches); what the
selective stages keep is the option's ``saved_size``; its measured activation peak is below the
store-all plan's.
"""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import memplan  # noqa: E402
from memplan.algorithms.timeline import timed_ops  # noqa: E402
from memplan.schedule import Schedule  # noqa: E402
from memplan.torch import linearize, profile_model  # noqa: E402
from memplan.torch.measure.conditions import intra_op_threads  # noqa: E402
from memplan.torch.runtime.checkpointed import checkpointed  # noqa: E402
from memplan.torch.runtime.selective import POLICIES  # noqa: E402

pytestmark = pytest.mark.torch

VOCAB = 64


def _gpt2() -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=3, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=32, bos_token_id=0,
        eos_token_id=0, resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1,
    )  # fmt: skip
    return transformers.GPT2LMHeadModel(config)


def _llama() -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        num_hidden_layers=2, hidden_size=32, intermediate_size=64, num_attention_heads=2,
        num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=32,
    )  # fmt: skip
    return transformers.LlamaForCausalLM(config)


def _batches(n: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(7)
    return [torch.randint(0, VOCAB, (2, 16), generator=gen) for _ in range(n)]


def _case(name: str):
    with intra_op_threads(1):
        model = _gpt2() if name == "gpt2" else _llama()
        x = _batches(1)[0]
        prof = profile_model(copy.deepcopy(model), example_input=x, repeats=1, selective=True)
    return name, model, x, prof


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def case(request):
    return _case(request.param)


@pytest.fixture(scope="module")
def gpt2_case():
    return _case("gpt2")


def _with_options(prof, sched: Schedule, option: int) -> Schedule:
    """``sched`` with every F_all of a stage that has options run under ``option``."""
    chosen = {k: option for k, st in enumerate(prof.stages) if st.option_count > option}
    data = sched.model_dump()
    data["ops"] = [
        op.model_dump() for op in timed_ops(prof, [(o.op, o.stage) for o in sched.ops], chosen)
    ]
    return Schedule.model_validate(data)


def test_the_profile_has_an_option_per_policy_on_every_block(case):
    _, _, _, prof = case
    blocks = [st for st in prof.stages if st.name[-1].isdigit()]  # h.0, layers.1, ...
    assert len(blocks) >= 2
    for st in prof.stages[:-1]:
        assert [o.name for o in st.options] == list(POLICIES)
    assert prof.stages[-1].options is None
    for st in blocks:
        saves_matmuls = st.options[0]
        assert st.output_size <= saves_matmuls.saved_size < st.saved_size
        assert saves_matmuls.backward_time > 0
    # identical blocks are measured once: the same options
    assert all(st.options == blocks[0].options for st in blocks)
    # the profile round-trips through its file format
    again = memplan.load_profile(prof.model_dump(mode="json", exclude_none=True))
    assert again.stages[1].options == prof.stages[1].options


@pytest.mark.parametrize("option", [1, 2])
def test_a_selective_plan_trains_like_plain(case, option):
    """Store-all with every block under the option: several SGD steps on different batches give
    plain training's parameters; each stage keeps the option's saved bytes."""
    _, model, x, prof = case
    sched = _with_options(prof, memplan.solve(prof, "store-all", 10**12), option)
    assert any(op.option == option for op in sched.ops)
    with intra_op_threads(1):
        ref, got = copy.deepcopy(model).train(), copy.deepcopy(model).train()
        plain = linearize(ref, x)
        wrapped = checkpointed(linearize(got, x), sched, profile=prof, tally=True)
        opt_ref = torch.optim.SGD(ref.parameters(), lr=0.1)
        opt_got = torch.optim.SGD(got.parameters(), lr=0.1)
        loss = plain.stages[-1][1]

        def plain_step(batch: torch.Tensor) -> torch.Tensor:
            return loss(plain.logits(batch), batch)  # next-token prediction of the batch

        for step, batch in enumerate(_batches(3)):
            for opt, run in ((opt_ref, plain_step), (opt_got, wrapped)):
                opt.zero_grad(set_to_none=True)
                torch.manual_seed(100 + step)
                run(batch).backward()
                opt.step()
    for (n, p), (_, q) in zip(ref.named_parameters(), got.named_parameters(), strict=True):
        torch.testing.assert_close(q, p, msg=lambda m, n=n: f"{n}: {m}")
    chosen = {op.stage: op.option for op in sched.ops if op.option}
    expected = [st.option(chosen.get(k, 0)).saved_size for k, st in enumerate(prof.stages)]
    assert wrapped.counters.saved_bytes == expected
    assert wrapped.counters.backwards == [1] * prof.length


def _fixed_times(prof):
    """The profile with fixed times (forward 1 ms, backward 2 ms, an option's 2.5 ms): what rotor
    chooses then depends on the sizes only, not on this CPU's speed."""
    data = prof.model_dump(mode="json", exclude_none=True)
    for st in data["stages"]:
        st["forward_time"], st["backward_time"] = 1.0, 2.0
        for option in st.get("options", []):
            option["backward_time"] = 2.5
    return memplan.load_profile(data)


def test_rotor_chooses_options_and_their_peak_is_lower(gpt2_case):
    """Between the least memory and the store-all need, rotor runs some F_all under an option;
    the activations the plan holds peak below the store-all plan's. On the tiny GPT-2; on the
    tiny Llama, recomputing a block at its backward costs more bytes (the recomputed tensors
    and the forward's temporaries) than the option saves: rotor rightly never chooses one."""
    _, model, x, prof = gpt2_case
    prof = _fixed_times(prof)
    store_all = memplan.solve(prof, "store-all", 10**12)
    top = store_all.peak_memory
    least = memplan.solve(prof, "rotor", 0).min_memory
    chosen = None
    for i in range(1, 20):
        memory = top - (top - least) * i // 20
        sched = memplan.solve(prof, "rotor", memory)
        if sched.feasible and any(op.option for op in sched.ops):
            chosen = sched
            break
    assert chosen is not None, "rotor never chose an option"
    peaks = []
    with intra_op_threads(1):
        for sched in (store_all, chosen):
            got = copy.deepcopy(model).train()
            wrapped = checkpointed(linearize(got, x), sched, profile=prof, tally=True)
            torch.manual_seed(5)
            wrapped(x).backward()
            peaks.append(wrapped.counters.peak_live_bytes)
            assert wrapped.counters.live_bytes == 0
    assert peaks[1] < peaks[0]


def test_enable_runs_selective_stages_in_the_users_loop(gpt2_case):
    """``memplan.torch.enable`` with a selective profile, the model called as usual
    (``model(input_ids=..., labels=...).loss``): a store-all plan with every block under an option
    trains as the plain model does over several batches."""
    from memplan.torch.runtime.planned import apply_plan, planned

    _, model, x, prof = gpt2_case
    sched = _with_options(prof, memplan.solve(prof, "store-all", 10**12), 1)
    with intra_op_threads(1):
        ref, got = copy.deepcopy(model).train(), copy.deepcopy(model).train()
        ref.config.use_cache = False
        got = apply_plan(got, sched, prof, x)
        assert planned(got).plan.policies == {
            k: "save-matmuls" for k, st in enumerate(prof.stages) if st.options
        }
        opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (ref, got)]
        for step, batch in enumerate(_batches(3)):
            for m, opt in zip((ref, got), opts, strict=True):
                opt.zero_grad()
                torch.manual_seed(200 + step)
                m(input_ids=batch, labels=batch).loss.backward()
                opt.step()
    for (n, p), (_, q) in zip(ref.named_parameters(), got.named_parameters(), strict=True):
        torch.testing.assert_close(q, p, msg=lambda m, n=n: f"{n}: {m}")
    assert planned(got).counters.backwards == [1] * prof.length
