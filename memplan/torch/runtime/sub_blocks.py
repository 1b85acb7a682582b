"""A block cut into sub-blocks, followed in its own forward under a plan (NOTE [ Sub-block
stages ] in :mod:`memplan.torch.split.sub_blocks`).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

from torch import Tensor
from torch.utils import _pytree as pytree

from memplan.torch.split.sub_blocks import Cut
from memplan.torch.split.tape import Ref, Tape, TapeRecorder

__all__ = ["PartRecorder"]


class PartRecorder(TapeRecorder):
    """Counts the operations of one block call and ends a part at each cut.

    At the count of cut ``p`` the operation's result ends part ``p``: ``on_cut(p, result)``
    returns the tensor the next part computes on (the runtime's: it ends one stage and begins
    the next), which the block's forward gets in place of the result. Each part's operations are
    recorded on a tape of its own (:meth:`tape_of`), what a recomputation of the part replays; a
    part that reads a tensor an earlier part made (other than its input) is an error: the block
    did not run as it did when it was cut.

    Parameters
    ----------
    cuts : tuple of (int, callable)
        The operation ending each part but the last: its count, its function.
    on_cut : callable
        ``on_cut(part, result) -> tensor``.
    name : str
        The block's name, for errors.
    """

    def __init__(
        self, cuts: tuple[Cut, ...], on_cut: Callable[[int, Tensor], Tensor], name: str
    ) -> None:
        super().__init__()
        self.cuts = cuts
        self.on_cut = on_cut
        self.name = name
        self.tapes: list[Tape] = []
        self.earlier: dict[int, tuple[Ref, weakref.ref[Tensor]]] = {}

    def tape_of(self, part: int) -> Tape:
        """The operations of ``part`` in this call (after it ended)."""
        if part >= len(self.tapes):
            raise RuntimeError(f"memplan: part {part + 1} of block {self.name} did not end")
        return self.tapes[part]

    def finish_block(self, out: Tensor) -> None:
        """The block returned ``out``: the last part ends; every cut was reached."""
        self.recording = False
        ended = self.finish(out)
        self.tapes.append(self.tape)
        if not ended or len(self.tapes) != len(self.cuts) + 1:
            raise RuntimeError(
                f"memplan: block {self.name} ran {self.counted} operations and did not reach "
                f"the {len(self.cuts)} cut(s) between its parts where it did when it was cut: "
                "the model did not run as it did when it was profiled"
            )

    def _reads_earlier(self, args: Any, kwargs: Any) -> bool:
        for leaf in pytree.tree_leaves((args, kwargs)):
            if isinstance(leaf, Tensor):
                found = self.earlier.get(id(leaf))
                if found is not None and found[1]() is leaf and self.ref(leaf) is None:
                    return True
        return False

    def __torch_function__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        if self.recording and self.earlier and self._reads_earlier(args, kwargs or {}):
            raise RuntimeError(
                f"memplan: part {len(self.tapes) + 1} of block {self.name} read a tensor an "
                "earlier part computed, besides its input: the model did not run as it did when "
                "it was cut into sub-blocks"
            )
        out = super().__torch_function__(func, types, args, kwargs)
        part = len(self.tapes)
        if not self.recording or part >= len(self.cuts) or self.counted != self.cuts[part][0]:
            return out
        expected = self.cuts[part][1]
        if not isinstance(out, Tensor) or self.tape.events[-1].func is not expected:
            raise RuntimeError(
                f"memplan: operation {self.counted} of block {self.name} is "
                f"{getattr(func, '__name__', func)}, not the "
                f"{getattr(expected, '__name__', expected)} returning one tensor that ended "
                f"part {part + 1} when the block was cut: the model did not run as it did when "
                "it was profiled (another attention mask, another path through its forward)"
            )
        self.finish(out)
        self.tapes.append(self.tape)
        self.earlier.update(self.made)
        self.made, self.tape = {}, Tape()
        nxt = self.on_cut(part, out)
        self.start(nxt)
        return nxt
