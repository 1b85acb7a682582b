"""The head as the model computes it: every tensor operation from the last block's output to the
model's output, recorded and replayed (NOTE [ The head on a tape ]).

NOTE [ The head on a tape ]
---------------------------
What a model computes after its last block is often not a sequence of module calls: Gemma-2
soft-caps its logits (``tanh(logits / cap) * cap``), Cohere scales them, a classifier of one's
own pools with ``h.mean(1)`` and returns ``{"logits": ...}``. A :class:`TapeRecorder` (a
``TorchFunctionMode``) records every tensor operation the model runs from the moment its last
block returns: the function, its arguments (each tensor as a reference to the head's input, to
the output of an earlier operation, or as the tensor itself: a parameter, a buffer, an attention
mask) and its results. :meth:`Tape.replay` runs the same operations again on another input: the
head's forward. Operations run inside module calls are recorded as they run (``F.linear`` of an
``lm_head``), so module calls and code between them are the same thing on a tape.

The head ends with the operation that makes the model's output (the logits). The cut records it
on the example input (:func:`record_head`) and counts the operations that return a tensor up to
it: during a training step under a plan (:mod:`memplan.torch.runtime.hooks`), a recorder started
at the last block's return ends the head stage when that many have run, before the model's own
loss, which follows in its ``forward``; that recorder's tape, made of the step's own arguments
(its attention mask, its training flags), is what a recomputation of the head replays. Python
values the model derives from tensors on the way (a size, ``.item()``) are fixed on the tape:
a replay is of the same step, on the same input.

Operations that return no tensor and change nothing (``x.size()``, ``x.shape``, ``x.dtype``) are
not recorded (their values are already in the arguments that use them), nor are the reads of a
tensor's attributes other than its views (``x._base``, ``x.grad_fn``: bookkeeping, which hooks
may do in one run and not in another; ``x.T``, ``x.mT`` are views, recorded); an operation that
returns ``None`` (``x[idx] = y``) is, since it writes.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree

__all__ = ["INPUT", "Ref", "Tape", "TapeRecorder"]


@dataclass(frozen=True)
class Ref:
    """A tensor the tape makes: result ``leaf`` of operation ``event`` (-1: the head's input)."""

    event: int
    leaf: int = 0


INPUT = Ref(-1)

VALUE_READS = frozenset(
    {"item", "tolist", "__bool__", "__int__", "__float__", "__index__", "nonzero", "argwhere",
     "masked_select", "unique", "unique_consecutive", "bincount", "nonzero_static"}
)  # fmt: skip
"""Operations whose result (a Python value, or a tensor's shape) depends on the values of their
input: what the code decides from them (a mixture of experts' loop over the experts it routed
to) a replay repeats as decided when it was recorded (:attr:`TapeRecorder.reads_values`)."""

MODE_SWITCHES = frozenset(
    {"_set_grad_enabled", "set_grad_enabled", "_set_fwd_grad_enabled", "set_autocast_enabled",
     "_enter_autocast", "_exit_autocast"}
)  # fmt: skip
"""Calls that switch a mode of autograd or autocast for what follows (``torch.no_grad()`` in a
model's code): a tape records the switch the forward made when it was recorded, under the
recording's own modes (the switch back may not pass through the recorder), and a replay would
leave autograd off for the rest of the step (:attr:`TapeRecorder.switches_modes`): DOTS3's
attention's tiny model, cut into sub-blocks, was profiled without a gradient after its first."""

VIEW_ATTRIBUTES = frozenset({"T", "mT", "H", "mH", "real", "imag"})
"""Tensor attributes that are operations (views); reading any other is not recorded."""


def _reads_attribute(func: Any) -> bool:
    """Whether ``func`` reads an attribute of a tensor that is not a view (``x._base``)."""
    owner = getattr(func, "__self__", None)
    return (
        getattr(func, "__name__", "") == "__get__"
        and getattr(owner, "__name__", None) not in VIEW_ATTRIBUTES
    )


@dataclass
class Event:
    """One recorded operation: ``func(*args, **kwargs)``, each tensor argument a :class:`Ref`
    or the tensor itself (a constant).
    """

    func: Callable[..., Any]
    spec: Any  # the pytree spec of (args, kwargs)
    leaves: list[Any]
    counts: bool  # returns a tensor: counted to find the head's end
    results: int = 0  # the tensors it returns
    fresh: bool = True  # none of them is one of its arguments (``x.to(x.dtype)`` returns x)
    floating: bool = False  # its first result is a floating-point tensor


@dataclass
class Tape:
    """The operations of a head, in order, and which result is the head's output."""

    events: list[Event] = field(default_factory=list)
    end: Ref | None = None

    def until(self, end: Ref) -> Tape:
        """The tape up to the operation that makes ``end``, which becomes its output."""
        return Tape(self.events[: end.event + 1], end)

    def operations(self) -> int:
        """Operations returning a tensor up to the output: where a recorder ends the head."""
        last = -1 if self.end is None else self.end.event
        return sum(event.counts for event in self.events[: last + 1])

    def constants(self) -> list[Tensor]:
        """The tensors the operations read that the tape does not make, each once."""
        found: dict[int, Tensor] = {}
        for event in self.events:
            for leaf in event.leaves:
                if isinstance(leaf, Tensor):
                    found.setdefault(id(leaf), leaf)
        return list(found.values())

    def replay(self, x: Tensor, constants: dict[int, Tensor] | None = None) -> Tensor:
        """Run the operations on ``x`` in place of the recorded input; the output.

        ``constants`` maps ``id()`` of a recorded constant to the tensor to use instead (the
        buffers a stage holds them as).
        """
        if self.end is None:
            raise RuntimeError("the head's tape has no output")
        results: list[list[Tensor]] = []
        freed = self._last_reads()

        def value(leaf: Any) -> Any:
            if isinstance(leaf, Ref):
                return x if leaf.event < 0 else results[leaf.event][leaf.leaf]
            if constants is not None and isinstance(leaf, Tensor):
                return constants.get(id(leaf), leaf)
            return leaf

        for j, event in enumerate(self.events[: self.end.event + 1]):
            args, kwargs = pytree.tree_unflatten([value(v) for v in event.leaves], event.spec)
            out = event.func(*args, **kwargs)
            results.append([t for t in pytree.tree_leaves(out) if isinstance(t, Tensor)])
            del args, kwargs, out
            for done in freed.get(j, ()):
                results[done] = []
        return x if self.end.event < 0 else results[self.end.event][self.end.leaf]

    def _last_reads(self) -> dict[int, list[int]]:
        """Per event ``j``, the earlier events whose results no event after ``j`` reads (nor the
        output): a replay lets them go there, as the model's own forward does.
        """
        assert self.end is not None
        last: dict[int, int] = {}
        for j, event in enumerate(self.events[: self.end.event + 1]):
            last[j] = j
            for leaf in event.leaves:
                if isinstance(leaf, Ref) and leaf.event >= 0:
                    last[leaf.event] = j
        freed: dict[int, list[int]] = {}
        for index, j in last.items():
            if index != self.end.event:
                freed.setdefault(j, []).append(index)
        return freed


class TapeRecorder(TorchFunctionMode):  # type: ignore[misc]  # torch's types are not read
    """Records the tensor operations run while it is active, from :meth:`start` on (NOTE [ The
    head on a tape ]).

    Parameters
    ----------
    limit : int, optional
        Stop recording after this many operations returning a tensor, and call ``on_end`` with
        result ``leaf`` of the last one.
    on_end : callable, optional
        Called as ``on_end(tensor)`` when ``limit`` is reached.
    leaf : int
        Which result of the last operation is the output.
    """

    def __init__(
        self,
        limit: int | None = None,
        on_end: Callable[[Tensor], None] | None = None,
        leaf: int = 0,
    ) -> None:
        super().__init__()
        self.tape = Tape()
        self.input_shape: tuple[int, ...] | None = None
        self.active = True  # pushed on the mode stack (the caller pops it once)
        self.recording = False
        self.counted = 0
        self.limit = limit
        self.on_end = on_end
        self.leaf = leaf
        self.reads_values = False  # an operation of VALUE_READS was recorded
        self.switches_modes = False  # a call of MODE_SWITCHES was recorded
        # id(tensor) -> (its reference, a weak reference to check it is the same tensor): the
        # recorder keeps no tensor of the head alive
        self.made: dict[int, tuple[Ref, weakref.ref[Tensor]]] = {}

    def start(self, x: Tensor) -> None:
        """Record from now on, with ``x`` as the head's input."""
        self.recording = True
        self.input_shape = tuple(x.shape)
        self._note(x, INPUT)

    def ref(self, tensor: Tensor) -> Ref | None:
        """The reference of a tensor the tape made (or its input); None for any other."""
        found = self.made.get(id(tensor))
        if found is None or found[1]() is not tensor:
            return None
        return found[0]

    def finish(self, out: Tensor) -> bool:
        """Stop recording, with ``out`` as the output; False when the tape did not make it."""
        self.recording = False
        self.tape.end = self.ref(out)
        return self.tape.end is not None

    def _note(self, tensor: Tensor, ref: Ref) -> None:
        self.made[id(tensor)] = (ref, weakref.ref(tensor))

    def __torch_function__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if not self.recording or _reads_attribute(func):
            return out
        name = getattr(func, "__name__", "")
        if name in VALUE_READS or (name == "where" and len(args) + len(kwargs) == 1):
            self.reads_values = True
        if name in MODE_SWITCHES:
            self.switches_modes = True
        results = [t for t in pytree.tree_leaves(out) if isinstance(t, Tensor)]
        if not results and out is not None:  # a size, a dtype: read, not written
            return out
        leaves, spec = pytree.tree_flatten((args, kwargs))
        mapped = [(self.ref(leaf) or leaf) if isinstance(leaf, Tensor) else leaf for leaf in leaves]
        index = len(self.tape.events)
        given = {id(leaf) for leaf in leaves if isinstance(leaf, Tensor)}
        fresh = not any(id(t) in given for t in results)
        floating = bool(results) and results[0].is_floating_point()
        self.tape.events.append(
            Event(func, spec, mapped, bool(results), len(results), fresh, floating)
        )
        for j, tensor in enumerate(results):
            self._note(tensor, Ref(index, j))
        if results:
            self.counted += 1
            if self.limit is not None and self.counted == self.limit:
                self.recording = False
                self.tape.end = Ref(index, self.leaf)
                if self.on_end is not None:
                    self.on_end(results[self.leaf])
        return out
