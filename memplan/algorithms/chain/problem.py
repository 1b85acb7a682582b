"""A numeric view of a chain profile, shared by the chain algorithms (not by the simulator)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field, replace

import numpy as np

from memplan.algorithms.base import ChainPlan, Sequence
from memplan.loop import TrainingLoop
from memplan.profile.memory import stage_terms
from memplan.profile.model import Profile, Stage


@dataclass(frozen=True)
class StageOptionTable:
    """The options of every stage's ``F_all`` beyond option 0, flattened: stage ``k``'s option
    ``o >= 1`` is entry ``start[k] + o - 1`` of ``s, fo, bo`` (bytes) and ``bt`` (ms).
    """

    start: np.ndarray
    s: np.ndarray
    fo: np.ndarray
    bo: np.ndarray
    bt: np.ndarray

    @classmethod
    def of(cls, stages: Seq[Stage]) -> StageOptionTable | None:
        """The options of ``stages``; None when no stage has any."""
        if not any(st.options for st in stages):
            return None
        flat = [o for st in stages for o in st.options or ()]
        counts = [len(st.options or ()) for st in stages]
        return cls(
            start=np.concatenate(([0], np.cumsum(counts))).astype(np.int64),
            s=np.array([o.saved_size for o in flat], dtype=np.int64),
            fo=np.array([o.forward_overhead for o in flat], dtype=np.int64),
            bo=np.array([o.backward_overhead for o in flat], dtype=np.int64),
            bt=np.array([o.backward_time for o in flat], dtype=np.float64),
        )


@dataclass(frozen=True)
class ChainInstance:
    """Sizes (bytes) and times (ms) of a chain in the notation of docs/model.md.

    ``x[k]`` for k = 0..L (x[0] is the input), ``s[k]``, ``fo[k]``, ``bo[k]``, ``ft[k]``, ``bt[k]``
    for stages k = 0..L-1, ``g[k]`` for k = 0..L with ``g[0] = 0``. The terms of the training
    loop (NOTE [ training-loop memory terms ], memplan/profile/memory.py), None in the model
    before them: ``fa[k]``, what ``F_all k`` adds beyond ``s[k]`` (else ``fo[k]``); ``wh[k]`` for
    k = 0..L, the weight gradients held once ``B k`` has run (those of stages k..L-1; else 0);
    ``fr[k]``, the bytes of ``x[k]`` that ``F_all k`` frees (else 0).
    """

    x: np.ndarray
    s: np.ndarray
    g: np.ndarray
    fo: np.ndarray
    bo: np.ndarray
    ft: np.ndarray
    bt: np.ndarray
    names: list[str] = field(default_factory=list)
    options: StageOptionTable | None = None
    """More ways to run each stage's ``F_all`` (selective checkpointing); None: option 0 only."""
    fa: np.ndarray | None = None
    wh: np.ndarray | None = None
    fr: np.ndarray | None = None

    @property
    def length(self) -> int:
        return len(self.s)

    def option_count(self, k: int) -> int:
        """How many ways stage ``k``'s ``F_all`` can run (option 0: ``s, fo, bo, bt``)."""
        if self.options is None:
            return 1
        return 1 + int(self.options.start[k + 1] - self.options.start[k])

    def option_sizes(self, k: int, option: int) -> tuple[int, int, int, float]:
        """``(s, fo, bo, bt)`` of stage ``k`` under ``option``."""
        if option == 0:
            return int(self.s[k]), int(self.fo[k]), int(self.bo[k]), float(self.bt[k])
        assert self.options is not None
        i = int(self.options.start[k]) + option - 1
        o = self.options
        return int(o.s[i]), int(o.fo[i]), int(o.bo[i]), float(o.bt[i])

    def without_options(self) -> ChainInstance:
        """The same chain with option 0 only (the solvers that do not read options)."""
        return ChainInstance(
            self.x, self.s, self.g, self.fo, self.bo, self.ft, self.bt, self.names,
            fa=self.fa, wh=self.wh, fr=self.fr,
        )  # fmt: skip

    @property
    def has_terms(self) -> bool:
        """Whether the chain has any term of the training loop that differs from the model
        before them (a weight gradient, an F_all overhead of its own, a free).
        """
        return bool(
            (self.fa is not None and (self.fa != self.fo).any())
            or (self.wh is not None and self.wh.any())
            or (self.fr is not None and self.fr.any())
        )

    @property
    def fall(self) -> np.ndarray:
        """``fa``, or ``fo`` in the model before the loop's terms."""
        return self.fo if self.fa is None else self.fa

    @property
    def held_grads(self) -> np.ndarray:
        """``wh`` (L + 1 entries), or zeros."""
        return np.zeros(self.length + 1, dtype=np.int64) if self.wh is None else self.wh

    @property
    def freed(self) -> np.ndarray:
        """``fr``, or zeros."""
        return np.zeros(self.length, dtype=np.int64) if self.fr is None else self.fr

    @property
    def total_bytes(self) -> int:
        """Every size of the chain added up (a Python int, exact): no sum the algorithms form
        exceeds it, so int64 arithmetic is exact when it is below 2**62.
        """
        arrays = [self.x, self.s, self.g, self.fo, self.bo]
        if self.options is not None:
            arrays += [self.options.s, self.options.fo, self.options.bo]
        return sum(int(a.sum(dtype=object)) for a in arrays)

    @classmethod
    def from_profile(cls, profile: Profile, loop: TrainingLoop | None = None) -> ChainInstance:
        """The chain of a chain profile, under the training loop's terms of ``loop`` (None, or a
        loop without ``gradients``: the model before them).

        The step in the backward (``step-in-backward``) comes folded into the terms (NOTE
        [ training-loop memory terms ]): ``B k``'s overhead grows by the gradients it steps and
        frees at its end and by the step's temporaries (an option's overhead too), and the
        gradients held after it are those created less those freed, so that the rules of
        docs/model.md hold unchanged.
        """
        stages = profile.chain_stages
        assert profile.input_size is not None  # a chain profile has one (Profile's validation)
        chain = cls.from_stages(profile.input_size, stages)
        if loop is None or loop.gradients is None:
            return chain
        terms = stage_terms(stages, loop)
        created = np.array(terms.weight_grads, dtype=np.int64)
        held = np.concatenate((np.cumsum(created[::-1])[::-1], [0]))
        options = chain.options
        if options is not None and any(terms.in_backward):
            counts = np.diff(options.start)
            extra = np.repeat(np.array(terms.in_backward, dtype=np.int64), counts)
            options = replace(options, bo=options.bo + extra)
        return cls(
            x=chain.x,
            s=chain.s,
            g=chain.g,
            fo=chain.fo,
            bo=np.array(terms.backward, dtype=np.int64),
            ft=chain.ft,
            bt=chain.bt,
            names=chain.names,
            options=options,
            fa=np.array(terms.forward_all, dtype=np.int64),
            wh=held.astype(np.int64),
            fr=np.array(terms.freed_input, dtype=np.int64),
        )

    @classmethod
    def from_stages(cls, input_size: int, stages: Seq[Stage]) -> ChainInstance:
        """The chain of ``stages`` (forward order) reading an input of ``input_size`` bytes: a
        chain profile's, or one branch of a join network's.
        """
        st = stages
        return cls(
            **cls._arrays(input_size, st),
            names=[s.name for s in st],
            options=StageOptionTable.of(st),
        )

    @staticmethod
    def _arrays(input_size: int, st: Seq[Stage]) -> dict[str, np.ndarray]:
        return dict(
            x=np.array([input_size] + [s.output_size for s in st], dtype=np.int64),
            s=np.array([s.saved_size for s in st], dtype=np.int64),
            g=np.array([0] + [s.gradient_size for s in st], dtype=np.int64),
            fo=np.array([s.forward_overhead for s in st], dtype=np.int64),
            bo=np.array([s.backward_overhead for s in st], dtype=np.int64),
            ft=np.array([s.forward_time for s in st], dtype=np.float64),
            bt=np.array([s.backward_time for s in st], dtype=np.float64),
        )

    def duration(self, op: str, stage: int) -> float:
        return float(self.bt[stage] if op == "B" else self.ft[stage])

    def makespan(self, sequence: Sequence, options: Mapping[int, int] | None = None) -> float:
        """The sequence's time; ``options``: the option of each stage's ``F_all`` (default 0),
        which sets the time of its ``B``.
        """
        # The durations of duration() added in the same order (the same float), without a call
        # per operation.
        ft, bt = self.ft.tolist(), self.bt.tolist()
        for k, option in (options or {}).items():
            bt[k] = self.option_sizes(k, option)[3]
        return float(sum([bt[k] if op == "B" else ft[k] for op, k in sequence]))

    @property
    def lower_bound(self) -> float:
        return float(self.ft.sum() + self.bt.sum())

    def store_all_sequence(self) -> Sequence:
        """F_all on every stage, then every backward: no recomputation."""
        L = self.length
        return [("F_all", k) for k in range(L)] + [("B", k) for k in reversed(range(L))]

    def store_all_peak(self) -> int:
        """Peak activation bytes of :meth:`store_all_sequence` (x[0] and g[L] included).

        Forward of stage k holds x[0], s[0..k-1], g[L] plus s[k] and its overhead; the backward of
        stage k holds x[0], s[0..k], g[k+1] and the weight gradients of stages k+1.. plus g[k],
        stage k's weight gradients and its overhead; ``F_all k`` frees ``fr[k]`` of ``s[k-1]``.
        Summed in Python ints, so exact whatever the sizes (int64 would overflow on thousands of
        2**50-byte stages).
        """
        x, s, g, fa, bo, wh, fr = (
            a.tolist()
            for a in (self.x, self.s, self.g, self.fall, self.bo, self.held_grads, self.freed)
        )
        L = self.length
        held: int = x[0]  # x[0] and s[0..k-1]: what is held before F_all k (without gradients)
        peak: int = held + g[L]
        for k in range(L):
            peak = max(peak, held + g[L] + s[k] + fa[k])
            held += s[k] - fr[k]
        for k in reversed(range(L)):
            peak = max(peak, held + g[k + 1] + g[k] + bo[k] + wh[k])
            held -= s[k] - (fr[k + 1] if k + 1 < L else 0)
        return peak

    def peak(  # noqa: C901 - one replay loop, a branch per operation on shared state
        self, sequence: Sequence, options: Mapping[int, int] | None = None
    ) -> int | None:
        """Peak activation bytes of a sequence (x[0] and g[L] included), or None if it is invalid;
        ``options``: the option of each stage's ``F_all`` (default 0).

        The solvers' own accounting, used by the heuristics to pick a plan that fits; every plan
        is checked again by :mod:`memplan.simulator`, which is written independently of this.
        """
        x, s, g, fo, bo = (a.tolist() for a in (self.x, self.s, self.g, self.fo, self.bo))
        fa, wh, fr = (a.tolist() for a in (self.fall, self.held_grads, self.freed))
        for k, option in (options or {}).items():
            if option:  # an option's own F_all overhead replaces fa[k]
                s[k], fa[k], bo[k], _ = self.option_sizes(k, option)
        L = self.length
        cut = [False] * L  # s[k] held without x[k+1], freed by F_all k+1 (NOTE [ training-loop
        # memory terms ], memplan/profile/memory.py)
        has_x = [False] * (L + 1)
        has_s = [False] * L
        has_x[0] = True
        held = x[0] + g[L]
        peak = held
        next_b = L - 1
        last_output = -1  # index of the standalone x produced by the previous op (persistency)
        for op, k in sequence:
            available = has_x[k] or (k > 0 and has_s[k - 1] and not cut[k - 1])
            if not available and not (op == "B" and fr[k]):
                return None
            if op == "B":
                if k != next_b or not has_s[k]:
                    return None
                weights = wh[k] - wh[k + 1]
                peak = max(peak, held + g[k] + weights + bo[k])
                held += g[k] + weights - g[k + 1] - s[k]
                has_s[k] = False
                if cut[k]:
                    cut[k] = False
                    held += x[k + 1]  # s[k] was held without x[k+1]
                if has_x[k]:
                    has_x[k] = False
                    held -= x[k]
                next_b -= 1
            elif op == "F_all":
                if has_s[k]:
                    return None
                peak = max(peak, held + s[k] + fa[k])
                held += s[k]
                has_s[k] = True
                if fr[k]:
                    if has_x[k]:
                        has_x[k] = False
                        held -= x[k]
                    if has_s[k - 1] and not cut[k - 1]:
                        cut[k - 1] = True
                        held -= x[k]
            else:  # F_ck, F_n
                if has_x[k + 1]:
                    return None
                peak = max(peak, held + x[k + 1] + fo[k])
                if op == "F_n" and has_x[k] and last_output != k:
                    return None  # F_n may only consume the activation just produced
                held += x[k + 1]
                has_x[k + 1] = True
                if op == "F_n" and has_x[k]:
                    has_x[k] = False
                    held -= x[k]
                last_output = k + 1
                continue
            last_output = -1
        return peak if next_b == -1 else None


def fastest_fitting(
    chain: ChainInstance, memory: int, candidates: Iterable[tuple[int, Sequence]], what: str
) -> tuple[ChainPlan, int | None]:
    """Pick the fastest plan whose peak fits ``memory`` among ``(parameter, sequence)`` candidates.

    The heuristics (periodic's segment count, revolve's slot count) lay out a plan for every value
    of their parameter and keep the fastest that fits, so that more memory never makes them slower.
    Returns the plan (infeasible with the least peak as ``min_memory`` when none fits) and the
    parameter of the plan chosen.
    """
    best: tuple[float, int, Sequence] | None = None
    least_peak: int | None = None
    for parameter, sequence in candidates:
        peak = chain.peak(sequence)
        if peak is None:  # pragma: no cover - the heuristics only build valid plans
            raise AssertionError(f"{what}: invalid plan for parameter {parameter}")
        least_peak = peak if least_peak is None else min(least_peak, peak)
        if peak <= memory:
            time = chain.makespan(sequence)
            if best is None or time < best[0]:
                best = (time, parameter, sequence)
    if best is None:
        return ChainPlan(None, "infeasible", min_memory=least_peak), None
    time, parameter, sequence = best
    return ChainPlan(sequence, "feasible", time, least_peak), parameter
