"""The module hooks that mark a plan's stages in the model's own forward (NOTE [ Following the
model's own forward ] in :mod:`memplan.torch.runtime.planned`).
"""

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from memplan.errors import InputError
from memplan.torch.base.storage import tensors_of
from memplan.torch.models.hf import loss_output
from memplan.torch.runtime.iteration import PassiveIteration, PlannedIteration
from memplan.torch.runtime.planned_model import PlannedModel
from memplan.torch.runtime.sub_blocks import PartRecorder
from memplan.torch.split.chunked_loss import ChunkedLoss
from memplan.torch.split.repeated import RepeatedBlocks
from memplan.torch.split.tape import TapeRecorder
from memplan.torch.split.trace import (
    copy_mappings,
    holds_mappings,
    model_output,
    primary_key,
    primary_output,
    replace_primary,
)
from memplan.torch.split.wrappers import PrefixStage, TapeStage


@dataclass
class _Step:
    """The state of one step's forward, between the model's call and its return."""

    iteration: PlannedIteration | PassiveIteration
    stage: int = 0  # the stage being computed (or next)
    open: bool = False  # between begin and end of ``stage``
    recorder: TapeRecorder | None = None  # the head's operations (NOTE [ The head on a tape ])
    parts: PartRecorder | None = None  # the block computing, cut into sub-blocks
    group: TapeRecorder | None = None  # the call group computing, recorded for a recomputation
    labels: Tensor | None = None  # the batch's labels and count, for the chunked loss
    count: Any = None
    passive: bool = False  # a plan that keeps what plain training keeps: no stage marked


# ------------------------------------------------------------------------------------------------
# Hooks: the model's own forward, stage boundaries at module calls
# ------------------------------------------------------------------------------------------------


class ModelHooks:
    """The module hooks of NOTE [ Following the model's own forward ]."""

    def __init__(
        self,
        planned: PlannedModel,
        found: RepeatedBlocks,
        input_key: int | str,
        chunked: ChunkedLoss | None = None,
    ) -> None:
        self.planned = planned
        self.found = found
        self.input_key = input_key
        self.step: _Step | None = None
        self.first_block = 1 if found.prefix else 0
        self.blocks = len(found.block_modules)
        # the first stage of each block (a block cut into sub-blocks is several)
        self.block_start = [self.first_block]
        for i in range(self.blocks):
            self.block_start.append(self.block_start[-1] + found.block_stages(i))
        after = self.block_start[-1]
        self.head = after if found.head_by != "none" else None
        self.prefix_stage = found.stages[0][1] if found.prefix else None
        self.head_stage = found.stages[-1][1] if self.head is not None else None
        self.chunked = chunked  # the head and the model's loss in chunks: one stage
        if chunked is not None:
            self.head_stage = chunked
            _ChunkedForward(self).install()
        model = planned.model
        planned._handles.append(model.register_forward_pre_hook(self.model_pre, with_kwargs=True))
        planned._handles.append(
            model.register_forward_hook(self.model_post, with_kwargs=True, always_call=True)
        )
        self.marking = False
        # per block, whether its call gets a mapping to copy (looked at once: the model's
        # forward passes the same kinds of arguments at every step)
        self.shares: list[bool | None] = [None] * self.blocks
        self.stage_handles: list[Any] = []
        self.cut_handle: Any = None  # the hook that stops the forward at the chunked loss
        self._mark_stages(not planned.passive())

    def _mark_stages(self, on: bool) -> None:
        """Register the hooks that mark the stages, or remove them: a step under a plan that
        keeps what plain training keeps needs none (NOTE [ What the runtime skips ]).
        """
        if on == self.marking:
            return
        self.marking = on
        handles = self.planned._handles
        if not on:
            for handle in self.stage_handles:
                handle.remove()
                handles.remove(handle)
            self.stage_handles = []
            self.cut_handle = None
            return
        found = self.found

        def add(handle: Any) -> None:
            self.stage_handles.append(handle)
            handles.append(handle)

        calls: dict[int, list[int]] = {}  # a block called for several stages (shared weights)
        for i, block in enumerate(found.block_modules):
            calls.setdefault(id(block), []).append(i)
        for i, block in enumerate(found.block_modules):
            if found.groups:  # NOTE [ Parallel lists as blocks ]: the last group's end below
                add(block.register_forward_pre_hook(self.group_pre(i), with_kwargs=True))
                continue
            if calls[id(block)][0] != i:
                continue
            if len(calls[id(block)]) > 1:
                add(
                    block.register_forward_pre_hook(
                        self.shared_pre(calls[id(block)]), with_kwargs=True
                    )
                )
                add(
                    block.register_forward_hook(
                        self.shared_post(calls[id(block)]), with_kwargs=True
                    )
                )
                continue
            add(block.register_forward_pre_hook(self.block_pre(i), with_kwargs=True))
            add(block.register_forward_hook(self.block_post(i), with_kwargs=True))
        if found.group_end is not None:
            end = found.group_end[0]
            add(end.register_forward_pre_hook(self.group_end, with_kwargs=True))
        elif found.groups:
            last = found.groups[-1][-1]
            add(last.register_forward_hook(self.block_post(self.blocks - 1), with_kwargs=True))
        if found.output_module is not None and self.chunked is None:  # the head ends at its return
            add(found.output_module.register_forward_hook(self.head_post, with_kwargs=True))
        self._register_cut()

    def _register_cut(self) -> None:
        """(Re-)register the hook that stops the model's forward where the chunked loss takes
        over, on the last block, after every forward hook it has: at each step's start, so that
        the hooks registered since ``enable`` run first (FSDP2's post-forward hook, which
        reshards the block and hooks its output for the backward, and the runtime's own under
        FSDP2: NOTE [ Plans under FSDP2 ]); a hook after the one raising would not run.
        """
        if self.chunked is None or not self.marking or not self.found.block_modules:
            return
        handles = self.planned._handles
        if self.cut_handle is not None:
            self.cut_handle.remove()
            self.stage_handles.remove(self.cut_handle)
            handles.remove(self.cut_handle)
        if self.found.group_end is not None:  # the head begins as this module is called
            end = self.found.group_end[0]
            self.cut_handle = end.register_forward_pre_hook(self.cut_before, with_kwargs=True)
        else:
            last = self.found.groups[-1][-1] if self.found.groups else self.found.block_modules[-1]
            self.cut_handle = last.register_forward_hook(self.cut)
        self.stage_handles.append(self.cut_handle)
        handles.append(self.cut_handle)

    def active(self) -> _Step | None:
        return None if self.planned._recomputing else self.step

    # -- the model -------------------------------------------------------------------------
    def model_pre(self, module: nn.Module, args: tuple, kwargs: dict) -> Any:
        if not torch.is_grad_enabled() or self.planned._recomputing or self.step is not None:
            return None
        self._mark_stages(not self.planned.passive())
        key = self.input_key
        x0 = kwargs.get(key) if isinstance(key, str) else None
        if x0 is None:
            found = primary_key(args, kwargs)
            x0 = (
                None
                if found is None
                else (args[found] if isinstance(found, int) else kwargs[found])
            )
            key = found if found is not None else key
        if not isinstance(x0, Tensor):
            raise InputError(
                f"{type(module).__name__} under a memplan plan: no {self.input_key} tensor in "
                "the call (the input it was profiled with)"
            )
        given = kwargs
        if kwargs.get("use_cache"):  # a KV cache grows at every call of a block: no cache in
            kwargs = {**kwargs, "use_cache": False}  # training (as HF's checkpointing does)
        it = self.planned._iteration(x0)
        self._register_cut()  # after the hooks registered at the step's start (FSDP2's)
        self.step = step = _Step(it, passive=isinstance(it, PassiveIteration))
        if step.passive:
            return None if kwargs is given else (args, kwargs)
        x = x0
        if self.prefix_stage is not None:
            rest, others = replace_primary(args, kwargs, key, None)
            prefix = self._prefix_function(rest, others, key)
            try:
                x = it.begin(0, x0, prefix, self.prefix_stage)
            except BaseException:
                self._abort()
                raise
            step.open = True
        if x is not x0 or kwargs is not given:
            return replace_primary(args, kwargs, key, x)
        return None

    def _prefix_function(self, args: tuple, kwargs: dict, key: int | str) -> Callable:
        stage = self.prefix_stage
        assert isinstance(stage, PrefixStage)
        forward = type(self.planned.model).forward

        def call(model: nn.Module, x: Tensor) -> Any:
            a, kw = replace_primary(args, kwargs, key, x)
            return forward(model, *a, **kw)

        def prefix(x: Tensor) -> Tensor:
            with stage.calling(call):
                return stage(x)

        return self.planned._recompute(prefix)

    def model_post(self, module: nn.Module, args: tuple, kwargs: dict, output: Any) -> Any:
        step = self.active()
        if step is None:
            return None
        self.step = None
        self._stop_recording(step)
        it = step.iteration
        if step.passive:
            if output is not None:  # else the forward raised
                it.finished(model_output(output))
            return None
        try:
            if output is None:  # the forward raised
                it.abort()
                return None
            if step.open and step.stage == self.head and isinstance(self.head_stage, TapeStage):
                assert step.recorder is not None
                raise RuntimeError(
                    f"memplan: the head of {type(module).__name__} ran "
                    f"{step.recorder.counted} operations, not the "
                    f"{self.found.head_operations} that made its output when it was profiled: "
                    "the model did not run as it did when it was profiled"
                )
            last = self.head if self.head is not None else self.block_start[-1] - 1
            if step.stage != last + 1 or step.open:
                raise RuntimeError(
                    f"memplan: the forward of {type(module).__name__} ended at stage "
                    f"{step.stage} ({self.planned.names[step.stage]}), not after its last "
                    "stage: the model did not run as it did when it was profiled"
                )
        except BaseException:
            it.abort()
            raise
        return None

    def _abort(self) -> None:
        if self.step is not None:
            self._stop_recording(self.step)
            self.step.iteration.abort()
            self.step = None

    def _end(self, step: _Step, out: Tensor) -> None:
        step.iteration.end(step.stage, out)
        step.open = False
        step.stage += 1

    # -- the blocks ------------------------------------------------------------------------
    def block_pre(self, i: int) -> Callable:
        k = self.block_start[i]
        key = self.found.block_keys[i]

        def hook(module: nn.Module, args: tuple, kwargs: dict) -> Any:
            step = self.active()
            if step is None:
                return None
            it = step.iteration
            try:
                x = args[key] if isinstance(key, int) else kwargs[key]
                if step.open and step.stage == 0 and i == 0 and self.prefix_stage is not None:
                    self._end(step, x)  # the part before the first block ends here
                for side in tensors_of((args, kwargs)) if k > 0 else ():
                    if side is not x and side.requires_grad:  # NOTE [ A side input with a
                        it.reached_through(k - 1, side)  # gradient ]: the stage before made it
                if step.open or step.stage != k:
                    raise RuntimeError(
                        f"memplan: block {self.found.blocks[i]} was called out of the order it "
                        "was profiled in (or twice in one forward)"
                    )

                # The call's other arguments, for a recomputation; not its hidden state (the
                # plan decides which copy of x[k] a recomputation reads, and how long it lives).
                # A mapping the blocks share is held as it is now, and a recomputation writes
                # into a copy of that (NOTE [ A mapping the blocks share ] in split/repeated.py).
                rest = replace_primary(args, kwargs, key, None)
                shared = self.shares[i]
                if shared is None:
                    shared = self.shares[i] = holds_mappings(rest)
                if shared:
                    rest = copy_mappings(*rest)

                def block(x: Tensor, a: tuple = rest[0], kw: dict = rest[1]) -> Tensor:
                    if shared:
                        a, kw = copy_mappings(a, kw)
                    a, kw = replace_primary(a, kw, key, x)
                    out = primary_output(module(*a, **kw))
                    if out is None:
                        raise RuntimeError(f"block {self.found.blocks[i]} returned no tensor")
                    return out

                parts = self._parts(step, i, k, module)
                function = block if parts is None else self._part_function(parts, 0, module)
                held = module if parts is None else self._part_module(i, 0)
                y = it.begin(k, x, self.planned._recompute(function), held)
                step.open = True
                if parts is not None:  # counted from the tensor the block computes on
                    step.parts = parts
                    parts.start(y)
                    parts.__enter__()
            except BaseException:
                self._abort()
                raise
            if y is not x:
                return replace_primary(args, kwargs, key, y)
            return None

        return hook

    def block_post(self, i: int) -> Callable:
        k = self.block_start[i + 1] - 1  # its last stage

        def hook(module: nn.Module, args: tuple, kwargs: dict, output: Any) -> Any:
            step = self.active()
            if step is None or step.stage != k or not step.open:
                return None
            it = step.iteration
            try:
                out = primary_output(output)
                if out is None:
                    raise RuntimeError(f"block {self.found.blocks[i]} returned no tensor")
                self._finish_group(step, out)
                if step.parts is not None:
                    parts, step.parts = step.parts, None
                    parts.active = False
                    parts.__exit__(None, None, None)
                    parts.finish_block(out)
                self._end(step, out)
                if self.head is None or i != self.blocks - 1:
                    return None
                y = it.begin(self.head, out, self._head_function(step), self.head_stage)
                step.open = True
                if self.chunked is None:  # else the rest is the chunked loss (:meth:`cut`)
                    self._record_head(step, y)
            except BaseException:
                self._abort()
                raise
            if y is not out:
                return with_primary(output, y)
            return None

        return hook

    # -- one block called for several stages (ALBERT's shared layers) -------------------------
    def shared_pre(self, indices: list[int]) -> Callable:
        """The call of a block that is several stages of the chain (its weights shared): the
        hook of the stage the step is at (the next one when none is open, else the first
        block after the part before the blocks); a call out of order is the first one's error.
        """
        hooks = {self.block_start[i]: self.block_pre(i) for i in indices}
        first = hooks[self.block_start[indices[0]]]

        def hook(module: nn.Module, args: tuple, kwargs: dict) -> Any:
            step = self.active()
            if step is None:
                return None
            k = step.stage + (1 if step.open else 0)
            return hooks.get(k, first)(module, args, kwargs)

        return hook

    def shared_post(self, indices: list[int]) -> Callable:
        """The return of a block that is several stages: the hook of the stage open."""
        hooks = {self.block_start[i + 1] - 1: self.block_post(i) for i in indices}

        def hook(module: nn.Module, args: tuple, kwargs: dict, output: Any) -> Any:
            step = self.active()
            if step is None or step.stage not in hooks:
                return None
            return hooks[step.stage](module, args, kwargs, output)

        return hook

    # -- call groups (NOTE [ Parallel lists as blocks ]) ---------------------------------------
    def group_pre(self, i: int) -> Callable:
        """The call of group ``i``'s first module: the previous stage (the part before the
        first group, or group ``i - 1`` with the loop's code after it) ends on the tensor it
        reads, and group ``i``'s stage begins there; its operations are recorded for a
        recomputation when the plan runs it again.
        """
        k = self.block_start[i]
        key = self.found.block_keys[i]
        holder = nn.ModuleList(self.found.groups[i])  # its buffers, for a recomputation

        def hook(module: nn.Module, args: tuple, kwargs: dict) -> None:
            step = self.active()
            if step is None:
                return
            it = step.iteration
            try:
                x = args[key] if isinstance(key, int) else kwargs[key]
                if step.open and step.stage == k - 1 and (i > 0 or self.prefix_stage is not None):
                    self._finish_group(step, x)
                    self._end(step, x)
                if step.open or step.stage != k:
                    raise RuntimeError(
                        f"memplan: the call group of {self.found.blocks[i]} was called out of "
                        "the order it was profiled in (or twice in one forward)"
                    )
                plan = self.planned.plan  # (the plan of this step: a new loop plans again)
                again = plan.forward_counts[k] > 1 or k in plan.policies
                recorder = TapeRecorder() if again else None

                def replay(x: Tensor) -> Tensor:
                    if recorder is None or recorder.tape.end is None:
                        raise RuntimeError(
                            f"memplan: the call group of {self.found.blocks[i]} was not "
                            "recorded in this step"
                        )
                    return recorder.tape.replay(x)

                y = it.begin(k, x, self.planned._recompute(replay), holder)
                if y is not x:
                    raise RuntimeError(
                        f"memplan: the call group of {self.found.blocks[i]} modifies its input in "
                        "place"
                    )
                step.open = True
                if recorder is not None:
                    recorder.start(x)
                    recorder.__enter__()
                    step.group = recorder
            except BaseException:
                self._abort()
                raise

        return hook

    def group_end(self, module: nn.Module, args: tuple, kwargs: dict) -> Any:
        """The call that ends the last call group (``found.group_end``): the head begins on
        the tensor it reads, as at a last block's return (:meth:`block_post`).
        """
        assert self.found.group_end is not None
        key = self.found.group_end[1]
        assert key is not None
        step = self.active()
        if step is None or step.stage != self.block_start[-1] - 1 or not step.open:
            return None
        x = args[key] if isinstance(key, int) else kwargs[key]
        y = self.block_post(self.blocks - 1)(module, args, kwargs, x)
        return None if y is None else replace_primary(args, kwargs, key, y)

    @staticmethod
    def _finish_group(step: _Step, end: Tensor) -> None:
        """Stop recording the call group computing, whose output is ``end``."""
        recorder, step.group = step.group, None
        if recorder is not None and recorder.active:
            recorder.active = False
            recorder.__exit__(None, None, None)
            if not recorder.finish(end):
                raise RuntimeError(
                    "memplan: a call group did not compute the next one's input in this step, "
                    "as it did when the model was profiled"
                )

    # -- the sub-blocks of a block (NOTE [ Sub-block stages ]) ---------------------------------
    def _part_function(
        self, recorder: PartRecorder, part: int, module: nn.Module
    ) -> Callable[[Tensor], Tensor]:
        """Part ``part`` of a call of the block ``module``, replayed from its operations in that
        call; under FSDP2 on the block's gathered parameters (NOTE [ Plans under FSDP2 ]).
        """
        sharding = self.planned.sharding

        def replay(x: Tensor) -> Tensor:
            if sharding is None:
                return recorder.tape_of(part).replay(x)
            with sharding.replaying(module):
                return recorder.tape_of(part).replay(x)

        return replay

    def _part_module(self, i: int, part: int) -> nn.Module:
        """The stage of part ``part`` of block ``i`` as profiled: the buffers a recomputation
        of the part restores, and copies while it runs, are those its operations read, as the
        profile counted them (:func:`~memplan.torch.runtime.recompute.recomputing`); not the
        whole block's (MiniMax's lightning attention's decay table, copied by every
        recomputation of the block's mixture of experts, measured above the plan).
        """
        return self.found.parts[i].stages[part]  # type: ignore[union-attr]  # a cut block

    def _parts(self, step: _Step, i: int, k: int, module: nn.Module) -> PartRecorder | None:
        """What follows block ``i`` (its first stage ``k``) when it is cut into sub-blocks: a
        :class:`PartRecorder` whose cuts end a stage and begin the next; None for a whole block.
        """
        parts = self.found.parts[i] if self.found.parts else None
        if parts is None:
            return None

        def on_cut(part: int, out: Tensor) -> Tensor:
            try:
                self._end(step, out)
                function = self.planned._recompute(self._part_function(recorder, part + 1, module))
                held = self._part_module(i, part + 1)
                y = step.iteration.begin(k + part + 1, out, function, held)
                step.open = True
            except BaseException:
                self._abort()
                raise
            return y

        recorder = PartRecorder(parts.cuts(module.training), on_cut, self.found.blocks[i])
        return recorder

    def cut(self, module: nn.Module, args: tuple, output: Any) -> None:
        """The last block's last forward hook under a chunked loss: the head+loss stage has
        begun (:meth:`block_post`); stop the model's forward there (:class:`_ChunkedForward`
        computes the rest from the block's output as the hooks before this one left it).
        """
        step = self.active()
        if step is None or step.stage != self.head or not step.open:
            return
        out = primary_output(output)
        if out is None:
            self._abort()
            raise RuntimeError(f"block {self.found.blocks[-1]} returned no tensor")
        raise _AtHead(out)

    def cut_before(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        """:meth:`cut` where the head begins as a module is called (``found.group_end``),
        after :meth:`group_end` began it.
        """
        step = self.active()
        if step is None or step.stage != self.head or not step.open:
            return
        assert self.found.group_end is not None
        key = self.found.group_end[1]
        raise _AtHead(args[key] if isinstance(key, int) else kwargs[key])

    # -- the head --------------------------------------------------------------------------
    def _record_head(self, step: _Step, x: Tensor) -> None:
        """Record the head's operations from its input ``x`` on (NOTE [ The head on a tape ]):
        what a recomputation of the head replays, every operation of the stage in order (those
        off the way to the output too: what autograd saved for them fills the stage's slots).
        A head cut at module calls ends at the return of the last one (:meth:`head_post`), and
        is recorded only when the plan runs it again (a recomputation, a selective option); one
        cut on a tape at the operation that made the output when it was cut.
        """
        stage = self.head_stage
        limit, leaf, end = None, 0, None
        plan = self.planned.plan
        again = plan.forward_counts[self.head] > 1 or self.head in plan.policies
        if not isinstance(stage, TapeStage) and not again:
            return  # nothing to replay: no recorder in the way of the model's head
        if isinstance(stage, TapeStage):
            assert stage.training_tape.end is not None
            limit, leaf = self.found.head_operations, stage.training_tape.end.leaf

            def end(out: Tensor) -> None:
                try:
                    self._end(step, out)
                except BaseException:
                    self._abort()
                    raise

        recorder = TapeRecorder(limit, end, leaf)
        recorder.start(x)
        recorder.__enter__()
        step.recorder = recorder

    @staticmethod
    def _stop_recording(step: _Step) -> None:
        for recorder in (step.parts, step.recorder, step.group):
            if recorder is not None and recorder.active:
                recorder.active = False
                recorder.__exit__(None, None, None)
        step.parts = None
        step.group = None

    def _head_function(self, step: _Step) -> Callable[[Tensor], Tensor]:
        if self.chunked is not None:
            chunked = self.chunked

            def loss(x: Tensor) -> Tensor:
                return chunked(x, step.labels, step.count)

            return self.planned._recompute(loss)

        def replay(x: Tensor) -> Tensor:
            recorder = step.recorder
            if recorder is None or recorder.tape.end is None:
                raise RuntimeError("memplan: the head of the model was not recorded in this step")
            return recorder.tape.replay(x)

        return self.planned._recompute(replay)

    def head_post(self, module: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        """The return of the module that gives the model's output: the head ends."""
        step = self.active()
        if step is None or step.stage != self.head or not step.open:
            return
        try:
            out = primary_output(output)
            if out is None or (step.recorder is not None and not step.recorder.finish(out)):
                raise RuntimeError(
                    f"memplan: {type(module).__name__} did not compute the model's output from "
                    "its last block's output in this step, as it did when the model was profiled"
                )
            self._end(step, out)
        except BaseException:
            self._abort()
            raise


def with_primary(output: Any, value: Tensor) -> Any:
    """A module's output with its primary tensor replaced."""
    if isinstance(output, Tensor):
        return value
    if isinstance(output, tuple):
        return (value, *output[1:])
    if isinstance(output, list):
        return [value, *output[1:]]
    raise RuntimeError(f"cannot replace the output of type {type(output).__name__}")


# ------------------------------------------------------------------------------------------------
# The head and the model's loss in chunks of tokens
# ------------------------------------------------------------------------------------------------


class _AtHead(BaseException):
    """Raised by the last block's hook to stop the model's forward where the chunked loss takes
    over (a BaseException, so that the model's own ``except Exception`` clauses let it through).
    """

    def __init__(self, value: Tensor) -> None:
        super().__init__()
        self.value = value


class _ChunkedForward:
    """The model's ``forward`` under a plan with a chunked loss (``enable(..., loss_chunks=N)``).

    With gradients, the model's own forward runs up to the return of its last block (its
    ``labels`` and ``num_items_in_batch`` held back), which begins the ``head+loss`` stage; the
    block's last forward hook stops it (:meth:`ModelHooks.cut`, after FSDP2's). The stage
    computes the model's loss from the last hidden state in chunks of tokens
    (:class:`~memplan.torch.split.chunked_loss.ChunkedLoss`: the head, the cross-entropy and
    their gradients chunk by chunk), and the model returns its output class with that ``loss``
    and ``logits=None``: the logits are never whole. Without gradients (evaluation) the model's
    own forward runs, logits included.
    """

    def __init__(self, hooks: ModelHooks) -> None:
        self.hooks = hooks

    def install(self) -> None:
        model = self.hooks.planned.model
        original = model.forward
        hooks = self.hooks
        chunked = hooks.chunked
        assert chunked is not None

        @functools.wraps(original)
        def forward(*args: Any, **kwargs: Any) -> Any:
            step = hooks.active()
            if step is None:
                return original(*args, **kwargs)
            labels = kwargs.pop("labels", None)
            count = kwargs.pop("num_items_in_batch", None)
            if labels is None:
                raise InputError(
                    f"{type(model).__name__} under a plan with loss_chunks computes its own loss "
                    "in chunks of tokens and returns no logits: call it with labels"
                )
            step.labels, step.count = labels, count
            try:
                original(*args, **kwargs)
            except _AtHead as reached:
                hidden = reached.value
            else:
                raise RuntimeError(
                    f"memplan: the forward of {type(model).__name__} returned without reaching "
                    "its last block"
                )
            loss = chunked(hidden, labels, count)
            hooks._end(step, loss)
            return loss_output(model, loss)

        object.__setattr__(model, "forward", forward)
