"""Cut a block into the sub-blocks its forward runs one after the other (``enable(...,
sub_blocks=True)``): a Llama decoder layer into its attention and its MLP, each with its
residual add.

NOTE [ Sub-block stages ]
-------------------------
A whole-block plan cannot go below one block's backward: every tensor the block saved is
recomputed at once, and its gradients made. A transformer block is two residual sub-blocks run in
sequence (``h = x + attn(norm1(x))``, ``y = h + mlp(norm2(h))``), between which one tensor
lives: ``h``. As two stages their backwards hold half as much each.

The cut is found on a tape (NOTE [ The head on a tape ] in :mod:`memplan.torch.split.tape`): the
block runs once on its traced arguments in eval mode and once in training mode (no gradients),
its tensor operations recorded from its input on. A *cut* after operation ``i`` is valid when
what the operations after ``i`` read of the tape is the result of ``i`` only (not the block's
input, not an earlier intermediate: side inputs such as the attention mask and the rotary tables,
parameters and buffers are not the tape's), that result is a fresh floating tensor (not one of
its arguments returned, as ``x.to(x.dtype)`` does), and it is the operation's one result. Of
the valid cuts, those kept leave a parameter on each side (a cut after the residual add, not
after the no-op ``.to`` that follows it). A block whose forward reads tensor values into its
control flow or its shapes (``.item()``, ``nonzero``: a mixture of experts looping over the
experts it routed to) is not cut: its parts, replayed from a tape in the profile and in
recomputations, would follow the example's routing (LongCat-Flash's tiny model measured 54 MB
above the plan before this rule). Each part is a
:class:`~memplan.torch.split.wrappers.TapeStage` whose parameters are those its operations read
(the attention's in the first, the MLP's in the second), as the profiler counts them.

Under a plan (:mod:`memplan.torch.runtime.hooks`) the block's own forward runs, with the step's
own side inputs, under a :class:`memplan.torch.runtime.sub_blocks.PartRecorder` that counts
its operations: at each cut's count the part ends and the next begins, and each part's
operations are recorded for its recomputation. A recomputation of a part restores, and copies
while it runs, the buffers of the part's stage (those its operations read), as the profile
measured it: not the whole block's (MiniMax's mixture of experts, recomputed holding a copy of
its lightning attention's 1 MB decay table, measured 5-11% above its plan).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from memplan.torch.split.stages import eval_mode, outputs_match, train_mode
from memplan.torch.split.tape import INPUT, Event, Ref, Tape, TapeRecorder
from memplan.torch.split.wrappers import BlockCall, TapeStage

__all__ = [
    "BlockParts",
    "Cut",
    "block_parts",
    "cut_events",
    "cutting_sub_blocks",
    "part_tapes",
    "sub_blocks_on",
]

Cut = tuple[int, Callable[..., Any]]
"""Where a part ends: the count of operations returning a tensor, and the last one's function."""

_SUB_BLOCKS: ContextVar[bool] = ContextVar("memplan_sub_blocks", default=False)


@contextmanager
def cutting_sub_blocks(on: bool) -> Iterator[None]:
    """Inside, the repeated-block cut cuts each block into its sub-blocks where it can."""
    token = _SUB_BLOCKS.set(bool(on))
    try:
        yield
    finally:
        _SUB_BLOCKS.reset(token)


def sub_blocks_on() -> bool:
    """Whether :func:`cutting_sub_blocks` is on."""
    return _SUB_BLOCKS.get()


@dataclass(frozen=True)
class BlockParts:
    """A block cut into parts: the stages and, per mode, the operation ending each part but the
    last: its count and its function (what :class:`~memplan.torch.runtime.sub_blocks.
    PartRecorder` counts and checks).
    """

    stages: list[TapeStage]
    eval_cuts: tuple[Cut, ...]
    training_cuts: tuple[Cut, ...]

    def cuts(self, training: bool) -> tuple[Cut, ...]:
        """The cuts of a forward in training mode or in eval mode."""
        return self.training_cuts if training else self.eval_cuts


def _reads(event: Event) -> list[Ref]:
    return [leaf for leaf in event.leaves if isinstance(leaf, Ref)]


def cut_events(tape: Tape) -> list[int]:
    """The events after which the tape can be cut (NOTE [ Sub-block stages ]), kept so that
    each part reads a parameter.
    """
    assert tape.end is not None
    last = tape.end.event
    events = tape.events[: last + 1]
    last_read: dict[int, int] = {}
    only_first = set(range(len(events)))  # events whose results are read as leaf 0 only
    for j, event in enumerate(events):
        for ref in _reads(event):
            last_read[ref.event] = j
            if ref.leaf != 0:
                only_first.discard(ref.event)
    params = [any(isinstance(v, nn.Parameter) for v in e.leaves) for e in events]
    valid = []
    for i in range(last):
        event = events[i]
        if not (event.results == 1 and event.fresh and event.floating and i in only_first):
            continue
        if last_read.get(i, -1) <= i:
            continue
        if all(last_read.get(e, -1) <= i for e in range(-1, i)):
            valid.append(i)
    kept: list[int] = []
    for i in valid:
        start = kept[-1] + 1 if kept else 0
        if any(params[start : i + 1]) and any(params[i + 1 :]):
            kept.append(i)
    return kept


def _rebased(tape: Tape, start: int, end: Ref) -> Tape:
    """The events ``start .. end.event`` of ``tape`` as a tape of their own, the result of event
    ``start - 1`` its input.
    """

    def ref(leaf: object) -> object:
        if not isinstance(leaf, Ref):
            return leaf
        if leaf.event == start - 1:
            return INPUT
        return Ref(leaf.event - start, leaf.leaf)

    events = [
        Event(e.func, e.spec, [ref(v) for v in e.leaves], e.counts, e.results, e.fresh, e.floating)
        for e in tape.events[start : end.event + 1]
    ]
    return Tape(events, Ref(end.event - start, end.leaf))


def part_tapes(tape: Tape, cuts: list[int]) -> list[Tape]:
    """``tape`` cut after each event of ``cuts``."""
    assert tape.end is not None
    starts = [0, *(c + 1 for c in cuts)]
    ends = [*(Ref(c) for c in cuts), tape.end]
    return [_rebased(tape, s, e) for s, e in zip(starts, ends, strict=True)]


def _record(block: BlockCall, x: Tensor) -> Tape | None:
    """The block's operations on ``x``; None when it reads values (NOTE [ Sub-block stages ]):
    its parts, replayed from a tape, would follow the example's decisions; or when it switches
    autograd's mode (``torch.no_grad()`` inside: :data:`~memplan.torch.split.tape.MODE_SWITCHES`),
    which a replay would not switch back.
    """
    recorder = TapeRecorder()
    with torch.no_grad(), torch.random.fork_rng(devices=[]), recorder:
        recorder.start(x)
        out = block(x)
    if recorder.reads_values or recorder.switches_modes:
        return None
    return recorder.tape if recorder.finish(out) else None


def block_parts(block: BlockCall, x: Tensor) -> BlockParts | None:
    """The parts of a block call on its input ``x`` (NOTE [ Sub-block stages ]); None when its
    forward has no cut, or not the same number in eval and training mode, or reads a view.
    """
    if block.view is not None:
        return None
    tapes = []
    for mode in (eval_mode, train_mode):
        with mode(block):
            tape = _record(block, x)
        if tape is None:
            return None
        tapes.append(tape)
    cuts = [cut_events(tape) for tape in tapes]
    if not cuts[0] or len(cuts[0]) != len(cuts[1]):
        return None
    owned = {id(t) for t in [*block.block.parameters(), *block.block.buffers()]}
    stages = [
        TapeStage(eval_part, training_part, (), owned)
        for eval_part, training_part in zip(
            part_tapes(tapes[0], cuts[0]), part_tapes(tapes[1], cuts[1]), strict=True
        )
    ]
    with eval_mode(block, *stages), torch.no_grad(), torch.random.fork_rng(devices=[]):
        expected, h = block(x), x
        for stage in stages:
            stage.input_shape = tuple(h.shape)
            h = stage(h)
    if not outputs_match(h, expected):
        return None

    def counts(tape: Tape, events: list[int]) -> tuple[Cut, ...]:
        return tuple(
            (sum(e.counts for e in tape.events[: i + 1]), tape.events[i].func) for i in events
        )

    return BlockParts(stages, counts(tapes[0], cuts[0]), counts(tapes[1], cuts[1]))
