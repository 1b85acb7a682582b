"""memplan's plans against the ways users already train in less memory, on real steps.

:func:`compare_training` trains one model, on one batch, each of these ways:

``plain``
    The model's own training step: ``model(**batch).loss`` for a Hugging Face model (labels
    given), the chain's loss on ``model(x)`` otherwise (:func:`memplan.torch.linearize`).
``hf checkpointing``
    ``model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant":
    False})`` (``gradient_checkpointing_enable`` before transformers 5.x), for the Hugging Face
    models that support it: every layer recomputed in the backward.
``hf checkpointing + loss in N chunks``
    The same, with the loss a user writes in about 30 lines for a Hugging Face causal or masked
    LM: the base model's last hidden state, then the head and the cross-entropy of each of
    ``N`` chunks of tokens under ``torch.utils.checkpoint(use_reentrant=False)``, summed and
    divided by the count of targets (:func:`memplan.torch.compare.ways.chunked_loss_way`;
    ``N`` is ``loss_chunks`` (a chunked profile's own), 8 by default).
``checkpoint_sequential(k)``
    ``torch.utils.checkpoint.checkpoint_sequential`` in ``k`` segments over memplan's chain of
    stages (the loss after it), for several ``k``.
``compile(budget=b)``
    ``torch.compile`` (Inductor) with ``torch._functorch.config.activation_memory_budget = b``
    (the min-cut partitioner then recomputes to keep the activations under that fraction);
    skipped, with the reason, where compiling fails.
``memplan <algo>``
    memplan's plans as a user installs them, ``memplan.torch.enable(model, memory,
    example_input=batch)`` (STYLE.md item 11), the model then trained by its own step:
    ``store-all`` (its own need as the budget), ``rotor`` at its least memory, and ``rotor``
    with each alternative's measured peak as its budget.
``memplan <algo>, loss_chunks=N``
    With ``loss_chunks``: the same plans installed by ``memplan.torch.enable(model, memory,
    example_input=batch, loss_chunks=N)``, the language model's head and own loss computed in
    ``N`` chunks of tokens inside its forward (:mod:`memplan.torch.split.chunked_loss`), from a
    profile measured so; the model then trained by the same step, ``model(**batch).loss``.

Each way is measured on the same footing (NOTE [ comparison protocol ]): one measured step for the
memory (:func:`memplan.torch.measure.allocator_peak.allocator_peak`, the allocator's own count, no code
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
largest gradient of each tensor, or of 1e-4 of the model's largest where that is larger: fused or
reordered kernels), ``differ`` otherwise;
``torch.compile`` draws dropout masks from another generator than eager PyTorch, so a model with
active dropout is not compared there (``n/a``). Then ``rounds`` rounds: every way once per round,
the order rotated from round to round, each step timed with ``time.perf_counter`` from the
forward to the end of the optimizer step. A way's set-up (Hugging Face checkpointing switched on,
memplan's plan installed) is made before its step starts and undone after it ends: it is neither
timed nor measured, as a loop makes it once; Python's cyclic garbage collector is paused during
each timed step, so that no way's step pays for collecting what another left.

Each memplan row is compared with one alternative at equal memory (``versus``): at an
alternative's peak, that alternative; otherwise the fastest alternative (plain training
included) whose measured peak is at most the row's plus 1% (:data:`EQUAL_MEMORY`), or, when none
fits there, the alternative with the least memory. ``versus_time`` is the median over the
rounds of the row's step time over that alternative's in the same round, ``versus_peak`` the
ratio of the measured peaks.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

import memplan
from memplan.errors import InputError
from memplan.torch.base.device import resolve_device
from memplan.torch.compare.ways import (
    SAC,
    Outcome,
    Setup,
    Way,
    chunked_loss_way,
    compile_way,
    default_segments,
    enable_way,
    has_dropout,
    hf_way,
    least_memory,
    make_setup,
    sequential_way,
    store_all_peak,
    without_options,
)
from memplan.torch.measure.allocator_peak import allocator_peak, profiled_copy
from memplan.torch.measure.step import make_optimizer
from memplan.torch.planner import PlanSettings, profile_for_training
from memplan.torch.split.chunked_loss import profile_loss_chunks

__all__ = [
    "DEFAULT_COMPILE_BUDGETS",
    "Comparison",
    "Outcome",
    "compare_training",
    "default_segments",
    "gradient_agreement",
]

DEFAULT_COMPILE_BUDGETS = (0.2,)
"""``activation_memory_budget`` values tried with ``torch.compile`` by default."""
GRAD_TOLERANCE = 1e-4
"""``close``: the largest difference of a gradient, relative to that gradient's largest value
(:func:`gradient_agreement`)."""
EQUAL_MEMORY = 0.01
"""An alternative within this fraction above a memplan row's measured peak is at equal memory."""
DEFAULT_ALTERNATIVE_CHUNKS = 8
"""Chunks of the hand-written chunked loss when ``loss_chunks`` is not given (the issue's)."""

Progress = Callable[[str], None]


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
    clock: str = "wall"
    optimizer: str = "sgd"
    profile: Any = None
    loss_chunks: int | None = None
    chunked_profile: Any = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": "memplan-bench/1",
            "model": self.model,
            "batch_size": self.batch_size,
            "input_shape": self.input_shape,
            "device": self.device,
            "threads": self.threads,
            "rounds": self.rounds,
            "clock": self.clock,
            "torch": self.torch,
            "optimizer": self.optimizer,
            "loss_chunks": self.loss_chunks,
            "rows": [outcome.to_dict() for outcome in self.outcomes],
        }


# --------------------------------------------------------------------------------------------
# Measuring
# --------------------------------------------------------------------------------------------


class _Bench:
    """The model, its optimizer and its initial state; runs one way's step as the protocol says."""

    def __init__(self, setup: Setup, seed: int, optimizer: str, clock: str = "wall") -> None:
        self.setup = setup
        self.seed = seed
        self.clock = time.process_time if clock == "cpu" else time.perf_counter
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

    def step(self, way: Way, x: Tensor) -> None:
        """One step of ``way`` (its set-up made already: :attr:`Way.active`)."""
        assert way.loss is not None
        loss = way.loss(x)
        loss.backward()
        self.optimizer.step()

    def measured(self, way: Way) -> int:
        self.reset()
        batch = profiled_copy(self.setup.x)
        held: list[Any] = [*self._state(), batch]
        for state in self.optimizer.state.values():  # made by the warm-up: the steady state
            held += list(state.values())
        if self.setup.labels is not None:
            held.append(self.setup.labels)
        if way.holds is not None:
            held += [*way.holds.parameters(), *way.holds.buffers()]
        with way.active():
            peak, _ = allocator_peak(lambda: self.step(way, batch), held, self.setup.x.device)
        return peak

    def timed(self, way: Way) -> float:
        self.reset()
        with way.active(), _collector_off():
            if self.setup.x.device.type == "cuda":
                torch.cuda.synchronize(self.setup.x.device)
            start = self.clock()
            self.step(way, self.setup.x)
            if self.setup.x.device.type == "cuda":
                torch.cuda.synchronize(self.setup.x.device)
            return self.clock() - start

    def gradients(self) -> list[Tensor | None]:
        return [None if p.grad is None else _host_copy(p.grad) for p in self.params]

    def compare_gradients(self) -> tuple[str, float | None]:
        assert self.reference is not None
        found = [None if p.grad is None else _host_copy(p.grad) for p in self.params]
        return gradient_agreement(found, self.reference)


def gradient_agreement(
    found: Sequence[Tensor | None], reference: Sequence[Tensor | None]
) -> tuple[str, float | None]:
    """``equal``, ``close`` or ``differ`` (NOTE [ comparison protocol ]) and the largest
    difference, relative to each tensor's largest reference gradient or, when larger, to
    :data:`GRAD_TOLERANCE` times the largest of all.

    That floor is for a gradient that is zero but for rounding, whose own largest value is
    rounding's: BERT's attention key bias (the softmax ignores what it adds to every score of a
    row) has gradients of 1e-12 beside 1e-6 for the query bias, and any reordering of the
    arithmetic before it changes them by their own size.
    """
    largest = (float(r.abs().max()) for r in reference if r is not None and r.numel())
    floor = GRAD_TOLERANCE * max(largest, default=0.0)
    worst = 0.0
    exact = True
    for grad, ref in zip(found, reference, strict=True):
        if (grad is None) != (ref is None):
            return "differ", None
        if ref is None or grad is None or torch.equal(grad, ref):
            continue
        exact = False
        scale = max(float(ref.abs().max()), floor) or 1.0
        worst = max(worst, float((grad - ref).abs().max()) / scale)
    if exact:
        return "equal", 0.0
    return ("close" if worst <= GRAD_TOLERANCE else "differ"), worst


@contextmanager
def _collector_off() -> Iterator[None]:
    """Python's cyclic garbage collector paused: no way's step pays for collecting what the
    others (or their set-ups) left.
    """
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


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
    clock: str = "wall",
    control: bool = False,
    round_seconds: float | None = None,
) -> Comparison:
    """Train ``model`` plainly, with Hugging Face checkpointing, ``checkpoint_sequential``,
    ``torch.compile``'s activation memory budget and memplan's plans; measure each.

    Parameters
    ----------
    model : str or nn.Module
        A model name (the zoo's, ``hf:NAME``, ``package.module:factory``) or a module.
    example_input, labels : Tensor, optional
        The batch (required with a module); ``labels`` for a Hugging Face model (default: its
        task's, :func:`memplan.torch.split.hf.default_labels`).
    batch_size, input_shape, config
        For a model given by name, as ``memplan profile`` takes them.
    device : str
        ``cpu`` or ``cuda``.
    threads : int or None
        torch's intra-op threads during the comparison (None: leave them).
    rounds : int
        Timed rounds (each way once per round): at most this many with ``round_seconds``.
    segments : sequence of int, optional
        ``checkpoint_sequential`` segment counts (default :func:`default_segments`; empty:
        none).
    compile_budgets : sequence of float
        ``activation_memory_budget`` values for ``torch.compile`` (empty: no compile).
    algos : sequence of str
        memplan's algorithms: ``store-all`` (no recomputation) and ``rotor`` (at its least
        memory, and at each alternative's measured peak when ``at_alternatives``).
    budgets : sequence of int
        Budgets (bytes) at which memplan's rotor is planned and measured too (``at N bytes``).
    profile : optional
        A profile of this model and batch (default: profiled here, ``repeats`` timed runs): the
        one ``enable`` installs plans from, with the model's own loss or, made with the loss in
        chunks, with ``loss_chunks`` (the other is profiled here).
    optimizer : str
        ``NAME[:STEP]`` as :func:`memplan.torch.measure.step.make_optimizer` takes it (``sgd``,
        ``momentum``, ``adam``, ``adamw``, ``adamw:fused``, ...), for every way; memplan plans
        for it.
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
        Add memplan's plans installed with ``enable(..., loss_chunks=N)``: a language model's
        head and loss computed in this many chunks of tokens inside its forward
        (:mod:`memplan.torch.split.chunked_loss`), at the same settings as the plans without;
        the hand-written chunked loss alternative takes as many chunks (8 without).
    clock : str
        ``wall`` (``time.perf_counter``, after a CUDA synchronization) or ``cpu``
        (``time.process_time``: the CPU time of this process, which the load of a shared machine
        adds little to; for CPU runs only).
    control : bool
        Also time plain training's step a second time as a way of its own, ``plain (again)``
        (family ``control``): its ratio to plain shows what the protocol measures between two
        identical steps (the order in the round, the machine's noise).
    round_seconds : float, optional
        Start no round that would end after this many seconds of timing (wall clock, at the
        pace of the rounds before; one round at least): as many rounds as fit, up to
        ``rounds``; :attr:`Comparison.rounds` says how many ran.

    Returns
    -------
    Comparison
        Plain first, then the alternatives, then memplan's plans (each with its ``versus``).

    Raises
    ------
    InputError
        A bad model, input or option.
    """
    _check_protocol(rounds, clock, compile_budgets, round_seconds)
    note = progress or (lambda _line: None)
    dev = resolve_device(device)
    with _threads(threads) as used_threads:
        setup = make_setup(model, example_input, labels, batch_size, input_shape, config, dev)
        n = len(setup.chain.stages) - 1
        for k in segments or ():
            if not 1 <= k <= n:
                raise InputError(f"segments {k}: expected 1..{n} (the stages before the loss)")
        prof, chunked_prof = _profiles(
            setup, profile, loss_chunks, repeats, used_threads, selective, note
        )
        chunks = profile_loss_chunks(chunked_prof) if chunked_prof is not None else None
        blocks = without_options(prof)  # what rotor plans on without the options
        ways = _alternatives(setup, control, chunks, _segments(segments, n), compile_budgets)
        with_sac = selective and blocks is not prof
        plans = _Plans(setup, optimizer, blocks, prof if with_sac else None, chunked_prof, chunks)
        ways += plans.at_settings(algos, fractions, budgets)
        bench = _Bench(setup, seed, optimizer, clock)
        dropout = has_dropout(setup.module)
        for way in ways:
            if way.loss is None:
                continue
            note(f"measuring {way.outcome.name}")
            _measure(bench, way, dropout)
        if at_alternatives and "rotor" in algos:
            ways += _at_alternatives_peaks(bench, plans, ways, dropout, note)
        measured = [way for way in ways if way.loss is not None and way.outcome.skipped is None]
        rounds = _time_rounds(bench, measured, rounds, note, round_seconds)
        _compare_at_equal_memory([way.outcome for way in ways])
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
        clock=clock,
        torch=torch.__version__,
        optimizer=optimizer,
        outcomes=[way.outcome for way in ways],
        profile=prof,
        loss_chunks=chunks,
        chunked_profile=chunked_prof,
    )


def _alternatives(
    setup: Setup,
    control: bool,
    chunks: int | None,
    segments: Sequence[int],
    compile_budgets: Sequence[float],
) -> list[Way]:
    """Plain training first (twice with ``control``), then the ways users already have."""
    ways = [Way(Outcome("plain", "plain"), setup.plain_loss())]
    if control:
        ways.append(Way(Outcome("plain (again)", "control"), setup.plain_loss()))
    ways.append(hf_way(setup))
    ways.append(chunked_loss_way(setup, chunks or DEFAULT_ALTERNATIVE_CHUNKS))
    ways += [sequential_way(setup, k) for k in segments]
    ways += [compile_way(setup, b) for b in compile_budgets]
    return ways


def _check_protocol(
    rounds: int, clock: str, compile_budgets: Sequence[float], round_seconds: float | None = None
) -> None:
    """``rounds``, ``clock``, ``compile_budgets`` and ``round_seconds`` checked before anything
    is built.
    """
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise InputError(f"rounds {rounds!r}: expected a positive integer")
    if clock not in ("wall", "cpu"):
        raise InputError(f"clock {clock!r}: expected wall or cpu")
    if round_seconds is not None and not round_seconds > 0:
        raise InputError(f"round_seconds {round_seconds!r}: expected a positive number")
    for b in compile_budgets:
        if not 0.0 <= b <= 1.0:
            raise InputError(f"compile budget {b!r}: expected a fraction from 0 to 1")


def _at_alternatives_peaks(
    bench: _Bench, plans: _Plans, ways: list[Way], dropout: bool, note: Progress
) -> list[Way]:
    """The rotor plans at each alternative's measured peak (as their budget), measured."""
    extra = []
    for way in ways:
        o = way.outcome
        if o.family in ("memplan", "control") or o.peak is None:
            continue
        for at in plans.at_peak(o):
            note(f"measuring {at.outcome.name}")
            if at.loss is not None:
                _measure(bench, at, dropout)
            extra.append(at)
    return extra


def _segments(segments: Sequence[int] | None, stages: int) -> Sequence[int]:
    """The ``checkpoint_sequential`` segment counts to measure: ``segments`` as given (empty:
    none), :func:`default_segments` when None.
    """
    return default_segments(stages) if segments is None else segments


def _profiles(
    setup: Setup,
    given: Any,
    loss_chunks: int | None,
    repeats: int,
    threads: int,
    selective: bool,
    note: Progress,
) -> tuple[Any, Any]:
    """The profile of the model as ``enable`` installs plans on it, and, with ``loss_chunks``,
    its profile with the head and loss in chunks (``enable(..., loss_chunks=N)``'s): ``given``
    is used for the one it is (a profile says its chunks), the other is measured here.
    """
    found: dict[bool, Any] = {}
    if given is not None:
        loaded = memplan.load_profile(given)
        found[profile_loss_chunks(loaded) is not None] = loaded
    for chunked in (False, True) if loss_chunks else (False,):
        if chunked in found:
            continue
        label = f"{setup.label}, the loss in {loss_chunks} chunks" if chunked else setup.label
        note(f"profiling {label} ({len(setup.chain.stages)} stages)")
        settings = PlanSettings(repeats=repeats, loss_chunks=loss_chunks if chunked else None)
        found[chunked] = profile_for_training(
            setup.module, setup.x, settings, name=setup.label, threads=threads,
            selective=selective,
        )  # fmt: skip
    if False not in found:
        raise InputError("profile: a profile with the loss in chunks; give the model's own")
    chunked_prof = found.get(True)
    if chunked_prof is not None:
        profile_loss_chunks(chunked_prof, loss_chunks)  # measured with the chunks asked for
    return found[False], chunked_prof


class _Plans:
    """memplan's ways, each installed by ``enable``: on the model's profile, and with the loss
    in chunks (``loss_chunks``) on the profile measured so (NOTE [ comparison protocol ]).
    """

    def __init__(
        self,
        setup: Setup,
        optimizer: str,
        blocks: Any,
        options: Any,
        chunked: Any,
        chunks: int | None,
    ) -> None:
        self.setup = setup
        self.optimizer = optimizer
        self.blocks = blocks  # rotor's profile without the stages' options
        self.options = options  # with them (rotor+sac), or None
        self.chunked = None if chunked is None else without_options(chunked)
        self.chunks = chunks

    def _ways(self, algo: str, memory: int | None, setting: str) -> list[Way]:
        s, opt = self.setup, self.optimizer
        ways = [enable_way(s, self.blocks, algo, memory, setting, opt)]
        if self.options is not None and algo != "store-all":
            ways.append(enable_way(s, self.options, algo, memory, setting, opt, SAC))
        if self.chunked is not None and self.chunks is not None:
            ways.append(enable_way(s, self.chunked, algo, memory, setting, opt, "", self.chunks))
        return ways

    def _least(self, algo: str) -> list[Way]:
        s, opt = self.setup, self.optimizer
        ways = []
        for prof, suffix in ((self.blocks, ""), (self.options, SAC)):
            least = None if prof is None else least_memory(prof, algo, opt)
            if least is not None:
                ways.append(enable_way(s, prof, algo, least, "least memory", opt, suffix))
        least = None if self.chunked is None else least_memory(self.chunked, algo, opt)
        if least is not None and self.chunks is not None:
            ways.append(
                enable_way(s, self.chunked, algo, least, "least memory", opt, "", self.chunks)
            )
        return ways

    def at_settings(
        self, algos: Sequence[str], fractions: Sequence[float], budgets: Sequence[int]
    ) -> list[Way]:
        """store-all, rotor at its least memory, at ``fractions`` of the way from there to
        store-all's need, and at ``budgets``.
        """
        ways: list[Way] = []
        for algo in algos:
            ways += self._ways(algo, None, "no recomputation") if algo == "store-all" else []
            ways += self._least(algo) if algo != "store-all" else []
        if fractions and "rotor" in algos:
            least = least_memory(self.blocks, "rotor", self.optimizer)
            top = store_all_peak(self.blocks, self.optimizer)
            for f in fractions:
                if least is None or top is None or not 0.0 <= f <= 1.0:
                    raise InputError(f"fractions {f!r}: expected 0..1 (and a rotor plan)")
                budget = int(least + f * (top - least))
                ways += self._ways("rotor", budget, f"{budget / 1e6:.1f} MB")
        for budget in budgets:
            ways += self._ways("rotor", budget, f"at {budget} bytes")
        return ways

    def at_peak(self, alternative: Outcome) -> list[Way]:
        """Plan rotor with an alternative's measured peak as its budget."""
        setting = f"at {alternative.name}'s peak"
        assert alternative.peak is not None
        s, opt = self.setup, self.optimizer
        prof, suffix = (self.options, SAC) if self.options is not None else (self.blocks, "")
        ways = [enable_way(s, prof, "rotor", alternative.peak, setting, opt, suffix)]
        if self.chunked is not None and self.chunks is not None:
            ways.append(
                enable_way(
                    s, self.chunked, "rotor", alternative.peak, setting, opt, "", self.chunks
                )
            )
        return ways


def _compare_at_equal_memory(outcomes: list[Outcome]) -> None:
    """Each memplan row's ``versus`` (NOTE [ comparison protocol ])."""
    alternatives = [
        o
        for o in outcomes
        if o.family not in ("memplan", "control") and o.peak is not None and o.time_ratios
    ]
    if not alternatives:
        return
    for row in outcomes:
        if row.family != "memplan" or row.peak is None or not row.time_ratios:
            continue
        named = [a for a in alternatives if row.setting == f"at {a.name}'s peak"]
        fits = [
            a
            for a in alternatives
            if a.peak is not None and a.peak <= row.peak * (1 + EQUAL_MEMORY)
        ]
        if named:
            best = named[0]
        elif fits:
            best = min(fits, key=lambda a: a.time_ratio or 0.0)
        else:
            best = min(alternatives, key=lambda a: a.peak or 0)
        assert best.peak is not None
        row.versus = best.name
        row.versus_peak = row.peak / best.peak
        row.versus_time = statistics.median(
            mine / theirs for mine, theirs in zip(row.time_ratios, best.time_ratios, strict=True)
        )


def _measure(bench: _Bench, way: Way, dropout: bool) -> None:
    """Warm-up, then the measured step and the gradient check (NOTE [ comparison protocol ])."""
    o = way.outcome
    try:
        for _ in range(way.warmups):
            bench.reset()
            bench.step(way, bench.setup.x)
        o.peak = bench.measured(way)
    except Exception as exc:  # noqa: BLE001 - a way that cannot run here is reported, not fatal
        if o.family not in ("compile", "hf-checkpointing", "hf-chunked"):
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


def _time_rounds(
    bench: _Bench, ways: list[Way], rounds: int, note: Progress, seconds: float | None = None
) -> int:
    """``rounds`` rounds, each way once, the order rotated; ratios to plain in the same round.
    With ``seconds``: no round starts that would end after that many seconds at the pace of
    the rounds before (one at least). Returns the rounds run.
    """
    samples: list[list[float]] = [[] for _ in ways]
    start = time.perf_counter()
    for r in range(rounds):
        spent = time.perf_counter() - start
        if r and seconds is not None and spent + spent / r > seconds:
            note(f"timing: {r} rounds in {spent:.0f} s, another would pass {seconds:g} s")
            rounds = r
            break
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
    return rounds
