"""memplan's plans against the ways users already train in less memory, on real steps.

:func:`compare_training` trains one model, on one batch, each of these ways:

``plain``
    The model's own training step: ``model(**batch).loss`` for a Hugging Face model (labels
    given), the chain's loss on ``model(x)`` otherwise (:func:`memplan.torch.linearize`).
``hf checkpointing``
    ``model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant":
    False})`` (``gradient_checkpointing_enable`` before transformers 5.x), for the Hugging Face
    models that support it: every layer recomputed in the backward.
``checkpoint_sequential(k)``
    ``torch.utils.checkpoint.checkpoint_sequential`` in ``k`` segments over memplan's chain of
    stages (the loss after it), for several ``k``.
``compile(budget=b)``
    ``torch.compile`` (Inductor) with ``torch._functorch.config.activation_memory_budget = b``
    (the min-cut partitioner then recomputes to keep the activations under that fraction);
    skipped, with the reason, where compiling fails.
``memplan <algo>``
    memplan's plans, run by :func:`memplan.torch.checkpointed` on the chain: ``store-all``,
    ``rotor`` at its least memory, and ``rotor`` with each alternative's measured peak as its
    budget. With ``loss_chunks``, memplan's chain ends with the language model's head and loss
    computed in chunks of tokens (:mod:`memplan.torch.chunked_loss`) while every other way keeps
    the model's own loss: what users have.

Each way is measured on the same footing (NOTE [ comparison protocol ]): one measured step for the
memory (:func:`memplan.torch.allocator_peak.allocator_peak`, the allocator's own count, no code
shared with memplan's runtime or its other meters) and the gradients (compared with plain
training's on the same batch, weights and random state), then ``rounds`` timed steps, each way
once per round; times are ratios to plain training's step in the same round (median over the
rounds), so that the load of a shared machine cancels out.

NOTE [ comparison protocol ]
Per way: a warm-up step (compiles, allocator caches), then the measured step: the weights and
buffers restored to the initial ones, ``zero_grad(set_to_none=True)`` (PyTorch's default loop),
the random state seeded, the batch copied under the profiler (its free is seen), ``loss =
way(batch); loss.backward(); optimizer.step()`` (``SGD`` by default; the optimizer's state,
created by the warm-up, is held from the start as in a loop's steady state). The gradients left
by that step are compared with
plain training's: ``equal`` (bit for bit), ``close`` (max relative difference <= 1e-4 of the
largest gradient of each tensor: fused or reordered kernels), ``differ`` otherwise;
``torch.compile`` draws dropout masks from another generator than eager PyTorch, so a model with
active dropout is not compared there (``n/a``). Then ``rounds`` rounds: every way once per round,
the order rotated from round to round, each step timed with ``time.perf_counter`` from the
forward to the end of the optimizer step.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from memplan.errors import InputError
from memplan.torch.allocator_peak import allocator_peak, profiled_copy
from memplan.torch.chunked_loss import chunk_loss, profile_loss_chunks
from memplan.torch.linearize import Chain, linearize

__all__ = [
    "DEFAULT_COMPILE_BUDGETS",
    "Comparison",
    "Outcome",
    "compare_training",
    "default_segments",
]

DEFAULT_COMPILE_BUDGETS = (0.2,)
"""``activation_memory_budget`` values tried with ``torch.compile`` by default."""
GRAD_TOLERANCE = 1e-4
"""``close``: the largest difference of a gradient, relative to that gradient's largest value."""

Progress = Callable[[str], None]


@dataclass
class Outcome:
    """One way of training, measured (sizes in bytes).

    Attributes
    ----------
    name : str
        As the table shows it: ``plain``, ``checkpoint_sequential(4)``, ``memplan rotor``...
    family : str
        ``plain``, ``hf-checkpointing``, ``checkpoint_sequential``, ``compile``, ``memplan``.
    setting : str or None
        The way's parameter: ``k=4``, ``budget=0.2``, ``least memory``, ``at plain's peak``...
    peak : int or None
        Measured peak of the step, everything included (None when skipped).
    peak_ratio : float or None
        ``peak`` over plain training's.
    time_ratio : float or None
        Median over the rounds of the step time over plain training's in the same round.
    time_ratios : list of float
        Every round's ratio.
    step_ms : float or None
        Median step time (ms), for scale.
    grads : str
        ``equal``, ``close``, ``differ`` or ``n/a`` (see NOTE [ comparison protocol ]).
    grad_error : float or None
        The largest relative difference found.
    planned_peak : int or None
        memplan's planned peak (its schedule's ``peak_memory``).
    budget : int or None
        The budget memplan planned for.
    skipped : str or None
        Why the way was not measured.
    """

    name: str
    family: str
    setting: str | None = None
    peak: int | None = None
    peak_ratio: float | None = None
    time_ratio: float | None = None
    time_ratios: list[float] = field(default_factory=list)
    step_ms: float | None = None
    grads: str = "n/a"
    grad_error: float | None = None
    planned_peak: int | None = None
    budget: int | None = None
    skipped: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Comparison:
    """What :func:`compare_training` measured: one :class:`Outcome` per way, plain first."""

    model: str
    batch_size: int | None
    input_shape: list[int]
    device: str
    threads: int
    rounds: int
    torch: str
    outcomes: list[Outcome]
    optimizer: str = "sgd"
    profile: Any = None
    loss_chunks: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": "memplan-bench/1",
            "model": self.model,
            "batch_size": self.batch_size,
            "input_shape": self.input_shape,
            "device": self.device,
            "threads": self.threads,
            "rounds": self.rounds,
            "torch": self.torch,
            "optimizer": self.optimizer,
            "loss_chunks": self.loss_chunks,
            "rows": [outcome.to_dict() for outcome in self.outcomes],
        }


# --------------------------------------------------------------------------------------------
# The model, its batch and its plain step
# --------------------------------------------------------------------------------------------


@dataclass
class _Setup:
    module: nn.Module
    x: Tensor
    labels: Tensor | None
    chain: Chain
    label: str
    hf: bool
    planned: Chain | None = None  # memplan's chain (the loss in chunks), else ``chain``

    def plain_loss(self) -> Callable[[Tensor], Tensor]:
        if self.hf:
            return _hf_loss_call(self.module, self.labels)
        loss_stage = self.chain.stages[-1][1]
        module = self.module
        return lambda x: loss_stage(module(x))


def _hf_loss_call(model: nn.Module, labels: Tensor | None) -> Callable[[Tensor], Tensor]:
    import inspect

    input_name = getattr(model, "main_input_name", "input_ids")
    extra = (
        {"use_cache": False} if "use_cache" in inspect.signature(model.forward).parameters else {}
    )

    def call(x: Tensor) -> Tensor:
        return model(**{input_name: x}, labels=labels, **extra).loss

    return call


def _setup(
    model: str | nn.Module,
    example_input: Tensor | None,
    labels: Tensor | None,
    batch_size: int | None,
    input_shape: tuple[int, ...] | None,
    config: str | None,
    device: torch.device,
) -> _Setup:
    from memplan.torch.hf import default_labels, is_hf_model
    from memplan.torch.models import build_model

    if isinstance(model, str):
        module, x, label = build_model(
            model, batch_size=batch_size, input_shape=input_shape, config=config
        )
        x = x if example_input is None else example_input
    elif isinstance(model, nn.Module):
        if example_input is None:
            raise InputError("compare_training: give example_input with a module")
        module, x, label = model, example_input, type(model).__name__.lower()
    else:
        raise InputError(f"model: expected a name or an nn.Module, got {type(model).__name__}")
    module.to(device)
    x = x.to(device)
    hf = is_hf_model(module)
    if hf and labels is None:
        labels = default_labels(module, x)
    if labels is not None:
        labels = labels.to(device)
    module.train()
    chain = linearize(module, x, labels=labels)
    for _, stage in chain.stages:
        stage.to(device)
    return _Setup(module, x, labels, chain, label, hf)


# --------------------------------------------------------------------------------------------
# The ways
# --------------------------------------------------------------------------------------------


@dataclass
class _Way:
    outcome: Outcome
    loss: Callable[[Tensor], Tensor] | None = None
    holds: nn.Module | None = None  # what the step keeps besides the model (stage wrappers)
    active: Callable[[], Any] = nullcontext
    warmups: int = 1


def default_segments(stages: int) -> list[int]:
    """``checkpoint_sequential`` segment counts tried over a chain of ``stages`` stages before
    the loss: 2, 4, about the square root (the classic choice) and one segment per stage."""
    if stages < 2:
        return []
    found = {2, 4, max(2, round(math.sqrt(stages))), stages}
    return sorted(k for k in found if 2 <= k <= stages)


@contextmanager
def _hf_checkpointing(model: nn.Module) -> Iterator[None]:
    """Hugging Face's checkpointing of every layer: ``activation_checkpointing_enable`` (the
    name since transformers 5.x), else ``gradient_checkpointing_enable``; non-reentrant."""
    kwargs = {"use_reentrant": False}
    hooked = bool(getattr(model, "_require_grads_hooks", None))
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    try:
        yield
    finally:
        if hasattr(model, "activation_checkpointing_disable"):
            model.activation_checkpointing_disable()
        else:
            model.gradient_checkpointing_disable()
        # enabling also hooks the input embeddings (their output requires grad), and disabling
        # leaves the hook: another hook at every step would make a compiled model recompile
        if not hooked and hasattr(model, "disable_input_require_grads"):
            model.disable_input_require_grads()


def _hf_way(setup: _Setup) -> _Way:
    outcome = Outcome("hf checkpointing", "hf-checkpointing", "every layer")
    if not setup.hf:
        outcome.skipped = "not a Hugging Face model"
        return _Way(outcome)
    if not getattr(setup.module, "supports_gradient_checkpointing", False):
        outcome.skipped = f"{type(setup.module).__name__} does not support gradient checkpointing"
        return _Way(outcome)
    model = setup.module
    return _Way(outcome, setup.plain_loss(), active=lambda: _hf_checkpointing(model))


def _sequential_way(setup: _Setup, k: int) -> _Way:
    from torch.utils.checkpoint import checkpoint_sequential

    body = nn.Sequential(*(module for _, module in setup.chain.stages[:-1]))
    loss_stage = setup.chain.stages[-1][1]

    def loss(x: Tensor) -> Tensor:
        return loss_stage(checkpoint_sequential(body, k, x, use_reentrant=False))

    holds = nn.ModuleList(module for _, module in setup.chain.stages)
    return _Way(
        Outcome(f"checkpoint_sequential({k})", "checkpoint_sequential", f"k={k}"), loss, holds
    )


def _compile_backend(budget: float) -> Callable[..., Any]:
    from torch._inductor.compile_fx import compile_fx

    def backend(graph: Any, example_inputs: Any) -> Any:
        with torch._functorch.config.patch(activation_memory_budget=budget):
            return compile_fx(graph, example_inputs)

    return backend


def _compile_way(setup: _Setup, budget: float) -> _Way:
    outcome = Outcome(
        f"torch.compile, activation_memory_budget={budget:g}", "compile", f"budget={budget:g}"
    )
    plain = setup.plain_loss()
    compiled = torch.compile(plain, backend=_compile_backend(budget))
    return _Way(outcome, compiled, warmups=2)


def _has_dropout(module: nn.Module) -> bool:
    return any(isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0 for m in module.modules())


SAC = "+sac"
"""The suffix of memplan's plans that choose the stages' selective checkpointing options."""


def _without_options(prof: Any) -> Any:
    """The profile without the stages' options (itself when it has none)."""
    if not any(st.options for st in prof.stages):
        return prof
    stages = [st.model_copy(update={"options": None}) for st in prof.stages]
    return prof.model_copy(update={"stages": stages})


def _memplan_way(
    setup: _Setup,
    prof: Any,
    algo: str,
    memory: int,
    setting: str,
    optimizer: str,
    suffix: str = "",
) -> _Way:
    import memplan
    from memplan.torch.runtime import checkpointed

    name = f"memplan {algo}{suffix}" + ("" if setting == "no recomputation" else f" ({setting})")
    outcome = Outcome(name, "memplan", setting, budget=memory)
    # every way trains in PyTorch's default loop (zero_grad() sets the gradients to None)
    sched = memplan.solve(
        prof, algo=algo, memory=memory, optimizer=optimizer, gradients="at-backward"
    )
    if not sched.feasible:
        least = "" if sched.min_memory is None else f"; least memory {sched.min_memory} bytes"
        outcome.skipped = f"no {algo} plan fits in {memory} bytes{least}"
        return _Way(outcome)
    outcome.planned_peak = sched.peak_memory
    chain = setup.chain if setup.planned is None else setup.planned
    wrapped = checkpointed(chain, sched, profile=prof)
    return _Way(outcome, wrapped, holds=wrapped)


def _least_memory(prof: Any, algo: str, optimizer: str) -> int | None:
    import memplan

    probe = memplan.solve(prof, algo=algo, memory=1, optimizer=optimizer, gradients="at-backward")
    return probe.min_memory


# --------------------------------------------------------------------------------------------
# Measuring
# --------------------------------------------------------------------------------------------


class _Bench:
    """The model, its optimizer and its initial state; runs one way's step as the protocol says."""

    def __init__(self, setup: _Setup, seed: int, optimizer: str) -> None:
        from memplan.torch.measure import make_optimizer

        self.setup = setup
        self.seed = seed
        self.params = [p for p in setup.module.parameters() if p.requires_grad]
        self.optimizer = make_optimizer(optimizer, self.params, lr=0.01)
        # Kept in host memory: on a GPU, the allocator counts every tensor on the device, and
        # copies of the weights and of plain training's gradients are not training's memory.
        self.initial = [_host_copy(t) for t in self._state()]
        self.reference: list[Tensor | None] | None = None

    def _state(self) -> list[Tensor]:
        return [*self.setup.module.parameters(), *self.setup.module.buffers()]

    def reset(self) -> None:
        with torch.no_grad():
            for tensor, value in zip(self._state(), self.initial, strict=True):
                tensor.copy_(value)
        self.optimizer.zero_grad(set_to_none=True)
        torch.manual_seed(self.seed)

    def step(self, way: _Way, x: Tensor) -> None:
        assert way.loss is not None
        with way.active():
            loss = way.loss(x)
            loss.backward()
            self.optimizer.step()

    def measured(self, way: _Way) -> int:
        self.reset()
        batch = profiled_copy(self.setup.x)
        held: list[Any] = [*self._state(), batch]
        for state in self.optimizer.state.values():  # made by the warm-up: the steady state
            held += list(state.values())
        if self.setup.labels is not None:
            held.append(self.setup.labels)
        if way.holds is not None:
            held += [*way.holds.parameters(), *way.holds.buffers()]
        peak, _ = allocator_peak(lambda: self.step(way, batch), held, self.setup.x.device)
        return peak

    def timed(self, way: _Way) -> float:
        self.reset()
        start = time.perf_counter()
        self.step(way, self.setup.x)
        return time.perf_counter() - start

    def gradients(self) -> list[Tensor | None]:
        return [None if p.grad is None else _host_copy(p.grad) for p in self.params]

    def compare_gradients(self) -> tuple[str, float | None]:
        assert self.reference is not None
        worst = 0.0
        exact = True
        for p, ref in zip(self.params, self.reference, strict=True):
            if (p.grad is None) != (ref is None):
                return "differ", None
            if ref is None or p.grad is None:
                continue
            grad = _host_copy(p.grad)
            if torch.equal(grad, ref):
                continue
            exact = False
            scale = float(ref.abs().max()) or 1.0
            worst = max(worst, float((grad - ref).abs().max()) / scale)
        if exact:
            return "equal", 0.0
        return ("close" if worst <= GRAD_TOLERANCE else "differ"), worst


def _host_copy(tensor: Tensor) -> Tensor:
    """A copy of ``tensor`` in host memory (a copy on the CPU too: the original changes)."""
    return tensor.detach().to("cpu", copy=True)


def _first_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return f"{type(exc).__name__}: {text}"[:200]


@contextmanager
def _threads(threads: int | None) -> Iterator[int]:
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        yield torch.get_num_threads()
    finally:
        torch.set_num_threads(before)


def compare_training(
    model: str | nn.Module,
    *,
    example_input: Tensor | None = None,
    labels: Tensor | None = None,
    batch_size: int | None = None,
    input_shape: tuple[int, ...] | None = None,
    config: str | None = None,
    device: str = "cpu",
    threads: int | None = 1,
    rounds: int = 5,
    segments: Sequence[int] | None = None,
    compile_budgets: Sequence[float] = DEFAULT_COMPILE_BUDGETS,
    algos: Sequence[str] = ("store-all", "rotor"),
    at_alternatives: bool = True,
    budgets: Sequence[int] = (),
    profile: Any = None,
    repeats: int = 3,
    seed: int = 0,
    optimizer: str = "sgd",
    progress: Progress | None = None,
    selective: bool = False,
    fractions: Sequence[float] = (),
    loss_chunks: int | None = None,
) -> Comparison:
    """Train ``model`` plainly, with Hugging Face checkpointing, ``checkpoint_sequential``,
    ``torch.compile``'s activation memory budget and memplan's plans; measure each.

    Parameters
    ----------
    model : str or nn.Module
        A model name (the zoo's, ``hf:NAME``, ``package.module:factory``) or a module.
    example_input, labels : Tensor, optional
        The batch (required with a module); ``labels`` for a Hugging Face model (default: its
        task's, :func:`memplan.torch.hf.default_labels`).
    batch_size, input_shape, config
        For a model given by name, as ``memplan profile`` takes them.
    device : str
        ``cpu`` or ``cuda``.
    threads : int or None
        torch's intra-op threads during the comparison (None: leave them).
    rounds : int
        Timed rounds (each way once per round).
    segments : sequence of int, optional
        ``checkpoint_sequential`` segment counts (default :func:`default_segments`).
    compile_budgets : sequence of float
        ``activation_memory_budget`` values for ``torch.compile`` (empty: no compile).
    algos : sequence of str
        memplan's algorithms: ``store-all`` (no recomputation) and ``rotor`` (at its least
        memory, and at each alternative's measured peak when ``at_alternatives``).
    budgets : sequence of int
        Budgets (bytes) at which memplan's rotor is planned and measured too (``at N bytes``).
    profile : optional
        A profile of this model and batch (default: profiled here, ``repeats`` timed runs).
    optimizer : str
        ``sgd``, ``momentum`` or ``adam`` (:func:`memplan.torch.measure.make_optimizer`), for
        every way; memplan plans for it.
    progress : callable, optional
        Called with a line saying what is being done.
    selective : bool
        Profile with the stages' selective checkpointing options (``profile_model(...,
        selective=True)``; a given ``profile`` is used as it is) and add ``memplan rotor+sac``:
        rotor choosing the options too, at its least memory and at each alternative's peak
        (``memplan rotor`` then plans on the blocks alone, the options left out).
    fractions : sequence of float
        Also ``rotor`` (and ``rotor+sac`` with ``selective``) at these fractions of the way
        from rotor's least planned memory to store-all's (0: the least, 1: store-all), the same
        budgets for both: what the options buy where both plan.
    loss_chunks : int, optional
        memplan's chain computes a language model's head and loss as one stage in this many
        chunks of tokens (:mod:`memplan.torch.chunked_loss`); a given ``profile`` says its own.
        The other ways keep the model's own loss.

    Returns
    -------
    Comparison
        Plain first, then the alternatives, then memplan's plans.

    Raises
    ------
    InputError
        A bad model, input or option.
    """
    import memplan
    from memplan.torch.device import resolve_device
    from memplan.torch.profiler import profile_model

    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise InputError(f"rounds {rounds!r}: expected a positive integer")
    for b in compile_budgets:
        if not 0.0 <= b <= 1.0:
            raise InputError(f"compile budget {b!r}: expected a fraction from 0 to 1")
    note = progress or (lambda _line: None)
    dev = resolve_device(device)
    with _threads(threads) as used_threads:
        setup = _setup(model, example_input, labels, batch_size, input_shape, config, dev)
        n = len(setup.chain.stages) - 1
        for k in segments or ():
            if not 1 <= k <= n:
                raise InputError(f"segments {k}: expected 1..{n} (the stages before the loss)")
        if profile is None:
            note(f"profiling {setup.label} ({len(setup.chain.stages)} stages)")
            prof = profile_model(
                setup.module, example_input=setup.x, device=str(dev), repeats=repeats,
                name=setup.label, threads=used_threads, selective=selective,
                loss_chunks=loss_chunks,
            )  # fmt: skip
        else:
            prof = memplan.load_profile(profile)
        chunks = profile_loss_chunks(prof, loss_chunks)
        setup.planned = chunk_loss(setup.chain, setup.x, chunks, setup.label)
        blocks = _without_options(prof)  # what rotor plans on without the options
        ways = [_Way(Outcome("plain", "plain"), setup.plain_loss())]
        ways.append(_hf_way(setup))
        ways += [_sequential_way(setup, k) for k in (segments or default_segments(n))]
        ways += [_compile_way(setup, b) for b in compile_budgets]
        with_sac = selective and blocks is not prof
        for algo in algos:
            if algo == "store-all":
                ways.append(
                    _memplan_way(setup, blocks, "store-all", 2**50, "no recomputation", optimizer)
                )
                continue
            least = _least_memory(blocks, algo, optimizer)
            if least is not None:
                ways.append(_memplan_way(setup, blocks, algo, least, "least memory", optimizer))
            least = _least_memory(prof, algo, optimizer) if with_sac else None
            if least is not None:
                ways.append(_memplan_way(setup, prof, algo, least, "least memory", optimizer, SAC))
        if fractions and "rotor" in algos:
            least = _least_memory(blocks, "rotor", optimizer)
            top = memplan.solve(
                blocks, "store-all", 2**50, optimizer=optimizer, gradients="at-backward"
            ).peak_memory
            for f in fractions:
                if least is None or top is None or not 0.0 <= f <= 1.0:
                    raise InputError(f"fractions {f!r}: expected 0..1 (and a rotor plan)")
                budget = int(least + f * (top - least))
                setting = f"{budget / 1e6:.1f} MB"
                ways.append(_memplan_way(setup, blocks, "rotor", budget, setting, optimizer))
                if with_sac:
                    ways.append(_memplan_way(setup, prof, "rotor", budget, setting, optimizer, SAC))
        for budget in budgets:
            setting = f"at {budget} bytes"
            ways.append(_memplan_way(setup, blocks, "rotor", budget, setting, optimizer))
        bench = _Bench(setup, seed, optimizer)
        dropout = _has_dropout(setup.module)
        for way in ways:
            if way.loss is None:
                continue
            note(f"measuring {way.outcome.name}")
            _measure(bench, way, dropout)
        if at_alternatives and "rotor" in algos:
            extra = []
            for way in ways:
                o = way.outcome
                if o.family in ("memplan",) or o.peak is None:
                    continue
                at = _memplan_way(
                    setup, prof if with_sac else blocks, "rotor", o.peak,
                    f"at {o.name}'s peak", optimizer, SAC if with_sac else "",
                )  # fmt: skip
                note(f"measuring {at.outcome.name}")
                if at.loss is not None:
                    _measure(bench, at, dropout)
                extra.append(at)
            ways += extra
        measured = [way for way in ways if way.loss is not None and way.outcome.skipped is None]
        _time_rounds(bench, measured, rounds, note)
    plain = ways[0].outcome
    for way in ways:
        o = way.outcome
        if o.peak is not None and plain.peak:
            o.peak_ratio = o.peak / plain.peak
    return Comparison(
        model=setup.label,
        batch_size=int(setup.x.shape[0]) if setup.x.dim() else None,
        input_shape=[int(d) for d in setup.x.shape[1:]],
        device=dev.type,
        threads=used_threads,
        rounds=rounds,
        torch=torch.__version__,
        optimizer=optimizer,
        outcomes=[way.outcome for way in ways],
        profile=prof,
        loss_chunks=chunks,
    )


def _measure(bench: _Bench, way: _Way, dropout: bool) -> None:
    """Warm-up, then the measured step and the gradient check (NOTE [ comparison protocol ])."""
    o = way.outcome
    try:
        for _ in range(way.warmups):
            bench.reset()
            bench.step(way, bench.setup.x)
        o.peak = bench.measured(way)
    except Exception as exc:  # noqa: BLE001 - a way that cannot run here is reported, not fatal
        if o.family not in ("compile", "hf-checkpointing"):
            raise
        o.skipped = _first_line(exc)
        way.loss = None
        return
    if o.family == "plain":
        bench.reference = bench.gradients()
        o.grads, o.grad_error = "equal", 0.0
    elif o.family == "compile" and dropout:
        o.grads = "n/a"
    else:
        o.grads, o.grad_error = bench.compare_gradients()


def _time_rounds(bench: _Bench, ways: list[_Way], rounds: int, note: Progress) -> None:
    """``rounds`` rounds, each way once, the order rotated; ratios to plain in the same round."""
    samples: list[list[float]] = [[] for _ in ways]
    for r in range(rounds):
        note(f"timing round {r + 1}/{rounds}")
        order = list(range(len(ways)))
        shift = r % len(ways)
        order = order[shift:] + order[:shift]
        for i in order:
            samples[i].append(bench.timed(ways[i]))
    plain = samples[0]
    for way, times in zip(ways, samples, strict=True):
        way.outcome.time_ratios = [t / p for t, p in zip(times, plain, strict=True)]
        way.outcome.time_ratio = statistics.median(way.outcome.time_ratios)
        way.outcome.step_ms = statistics.median(times) * 1000.0
