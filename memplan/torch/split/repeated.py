"""Cut any model built as "something, a run of repeated blocks, something" into a chain.

Most models people train are a stack of identical blocks between an input part and an output
part: transformers (embeddings, N decoder or encoder blocks, final norm and head), ViTs, ResNets
and ConvNeXts (stem, blocks, pooling and classifier). :func:`repeated_block_stages` finds the
blocks by running the model once and cuts it into

* ``embedding`` (token ids in) or ``stem`` (anything else): everything the model computes before
  the first block;
* one stage per block (named by its module path, e.g. ``h.0`` or ``layer3.4``);
* ``head``: everything after the last block, up to the model's output;

with no help from the model's author (no ``memplan_stages()``). The caller
(:func:`memplan.torch.split.linearize.linearize`) adds the loss and checks that the chain reproduces the
model's output.

NOTE [ Finding the run of blocks ]
----------------------------------
One forward pass in eval mode without gradients, with hooks on every module, records each module
call: its *primary input* (its first tensor argument), the other arguments, and its *primary
output* (the tensor it returns, or the first element of a tuple whose other elements are not
tensors). A call *feeds* another when the other's primary input is its output (the same tensor, or
a view of it with the same storage, offset, shape and strides). A *block* is a child of an
``nn.ModuleList`` or ``nn.Sequential``; the run is the longest sequence of block calls, each fed by
the previous one. Runs may cross containers (``layer1.2`` feeds ``layer2.0`` in a ResNet) and the
finest run wins (the blocks of a ConvNeXt stage rather than its four stages). A run inside one
block counts where it is all that block does (a wrapper around the blocks) or holds most of the
model's parameters (CvT, whose stages embed their input before their layers: the layers of its
last stage, 90% of its weights, rather than its three stages; what comes before them is the first
stage, what follows the head).

NOTE [ Stage wrappers ]
-----------------------
A chain stage reads one tensor. What else a block reads (HF attention masks, rotary position
embeddings, position ids; ``use_cache`` is off) is recorded during the tracing pass and held by the
stage wrapper as non-persistent buffers (static memory, like the model's own buffers). (The
stage wrappers serve the profiler and the chain API; :mod:`memplan.torch.enable` follows the
model's own forward instead, where every block call gets that batch's arguments.) This is
only right when those values are the same for every batch of the same shape, so every tensor
operation of the tracing pass is followed (a ``TorchFunctionMode``): an extra argument computed
from a parameter, from a block's output or from the *values* of the model's input (not merely its
shape) is an ``InputError``: the model is not a chain of these blocks. A wrapper also refuses a
hidden state of another shape than the traced one when it holds such extras.

The stage before the first block runs the model's own ``forward`` and stops it, by an exception
raised from a pre-hook of the first block, when the block is reached: whatever the model computes
first (token and position embeddings, patch embedding with a class token...) is computed exactly
as the model does it. Its parameters are those of the modules called before the first block plus
those the model's own ``forward`` uses directly (a ViT's class token and position embedding).

The head is found by walking back from the model's output through module calls (a call's input
may be a view of the previous call's output, e.g. ``x[:, 0]``: the wrapper redoes the view with
``as_strided``); when something else stands between (a functional ``x.mean(1)``, Gemma-2's
soft-capped logits, a dict built from the pooled state), it is every tensor operation the model
runs from its last block's return to its output, recorded on a tape and replayed (NOTE [ The head
on a tape ] in :mod:`memplan.torch.split.tape`), whether or not it is a module call.

Examples
--------
>>> import torch
>>> from torch import nn
>>> class Net(nn.Module):
...     def __init__(self):
...         super().__init__()
...         self.embed = nn.Embedding(50, 16)
...         self.blocks = nn.ModuleList(nn.Sequential(nn.LayerNorm(16), nn.Linear(16, 16))
...                                     for _ in range(3))
...         self.head = nn.Linear(16, 50)
...     def forward(self, ids):
...         x = self.embed(ids)
...         for block in self.blocks:
...             x = x + block(x)
...         return self.head(x)
>>> # The residual add happens outside the blocks: they do not feed each other, no run of 3.
>>> class Block(nn.Module):
...     def __init__(self):
...         super().__init__()
...         self.ff = nn.Sequential(nn.LayerNorm(16), nn.Linear(16, 16))
...     def forward(self, x):
...         return x + self.ff(x)
>>> class Net2(Net):
...     def __init__(self):
...         super().__init__()
...         self.blocks = nn.ModuleList(Block() for _ in range(3))
...     def forward(self, ids):
...         x = self.embed(ids)
...         for block in self.blocks:
...             x = block(x)
...         return self.head(x)
>>> stages = repeated_block_stages(Net2(), torch.randint(0, 50, (2, 8)))
>>> [name for name, _ in stages]
['embedding', 'blocks.0', 'blocks.1', 'blocks.2', 'head']
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils import _pytree as pytree

from memplan.errors import InputError
from memplan.torch.base.autograd import graph_nodes
from memplan.torch.split.groups import group_runs, group_tapes, list_index, record_groups
from memplan.torch.split.stages import (
    eval_mode,
    first_line,
    output_mismatch,
    outputs_match,
    run_stages,
    train_mode,
)
from memplan.torch.split.sub_blocks import BlockParts, block_parts, sub_blocks_on
from memplan.torch.split.tape import TapeRecorder
from memplan.torch.split.trace import (
    FLOATING,
    FROM_BLOCK,
    FROM_INPUT,
    FROM_PARAM,
    MAX_RUNS_TRIED,
    ModelCall,
    TracedCall,
    Tracer,
    ViewSpec,
    call_leaves,
    call_model,
    direct_leaves,
    model_output,
    primary_output,
    uncopyable_mapping,
)
from memplan.torch.split.wrappers import (
    BlockCall,
    PrefixStage,
    TapeStage,
    ViewStage,
    side_gradient_bytes,
)

__all__ = ["RepeatedBlocks", "find_repeated_blocks", "repeated_block_stages"]

# ------------------------------------------------------------------------------------------------
# The run, the prefix and the head
# ------------------------------------------------------------------------------------------------


@dataclass
class RepeatedBlocks:
    """What :func:`find_repeated_blocks` found: the chain's stages and how they were cut.

    Attributes
    ----------
    stages : list of (str, nn.Module)
        ``embedding``/``stem`` (when the model computes something before its first block), one
        stage per block, ``head`` (when something follows the last block).
    blocks : list of str
        The module paths of the blocks.
    head_by : str
        ``calls`` (module calls after the last block), ``tape`` (the tensor operations after
        it, NOTE [ The head on a tape ]) or ``none``.
    output : Tensor
        The chain's output on the example input (eval mode, no gradients): the model's output.
    inplace : list of bool
        Per stage, whether it modified its input in place on the example input.
    block_modules, block_keys : list
        The blocks' modules and where each takes the hidden state (argument index or name): what
        :mod:`memplan.torch.enable` hooks to follow the model's own forward.
    head_modules : list of nn.Module
        The modules the head calls, in order (``head_by == "calls"``).
    output_module : nn.Module, optional
        The module whose call returns the model's output (the end of the head), when one does.
    prefix : bool
        Whether the first stage is the part of the model's forward before the first block.
    head_operations : int, optional
        With ``head_by == "tape"``: the operations returning a tensor from the last block's
        return to the model's output, the last one included (where the head stage ends).
    groups : list of list of nn.Module
        Per block, the modules of its call group when the blocks are the i-th elements of
        parallel lists (NOTE [ Parallel lists as blocks ] in :mod:`memplan.torch.split.groups`):
        ``block_modules`` are then each group's first module; empty for blocks that are modules.
    group_end : (nn.Module, key), optional
        With ``groups``: the module whose call ends the last group (and begins the head) and
        where it takes its input; None: the last group ends at its last module's return.
    parts : list of BlockParts or None
        Per block, the sub-blocks it is cut into (``enable(..., sub_blocks=True)``: NOTE
        [ Sub-block stages ] in :mod:`memplan.torch.split.sub_blocks`), None for a whole block;
        empty when no block is cut.
    """

    stages: list[tuple[str, nn.Module]]
    blocks: list[str]
    head_by: str
    output: Tensor | None = None
    inplace: list[bool] = field(default_factory=list)
    block_modules: list[nn.Module] = field(default_factory=list)
    block_keys: list[int | str] = field(default_factory=list)
    head_modules: list[nn.Module] = field(default_factory=list)
    output_module: nn.Module | None = None
    prefix: bool = False
    head_operations: int | None = None
    groups: list[list[nn.Module]] = field(default_factory=list)
    group_end: tuple[nn.Module, int | str | None] | None = None
    parts: list[BlockParts | None] = field(default_factory=list)

    def block_stages(self, i: int) -> int:
        """How many stages block ``i`` is: 1, or its parts."""
        parts = self.parts[i] if self.parts else None
        return 1 if parts is None else len(parts.stages)


def _usable(run: list[TracedCall], weights: int) -> bool:
    """A run inside one block call (an MLP ``nn.Sequential`` inside a transformer block) is a
    chain when it is all that block does: the block's input is the run's input and its output
    the run's output (a wrapper around the blocks); or when it holds most of the model's
    parameters (more than half of ``weights``, the model's count), as the last stage of a
    hierarchical model may (CvT's third stage: 10 of its 13 layers, 90% of its weights): whatever
    that block does before and after the run is then the first stage and the head, and a chain of
    such blocks would have one stage holding most of the step. Runs across blocks are kept.
    """
    shared = set.intersection(*({id(p) for p in c.parents if p.is_block} for c in run))
    if not shared:
        return True
    first, last = run[0], run[-1]
    inner = next(p for p in reversed(first.parents) if id(p) in shared)
    feeds_out = any(p is last and v is None for p, v in inner.output_producers)
    if feeds_out and first.input_id is not None and first.input_id == inner.input_id:
        return True
    held = {id(t): t.numel() for c in run for t in c.module.parameters()}
    return 2 * sum(held.values()) > weights


def _runs(calls: list[TracedCall], weights: int) -> list[list[TracedCall]]:
    """The usable runs of blocks (see :func:`_usable`; ``weights``: the model's parameter
    count): for each block call the longest run ending there; longest first, then outermost,
    then earliest.
    """
    best: dict[int, tuple[int, TracedCall | None]] = {}
    for call in calls:
        if not call.is_block or not call.has_output or call.key is None:
            continue
        length, prev = 1, None
        for producer, view in call.producers:
            if producer is None or view is not None or id(producer) not in best:
                continue
            longer = best[id(producer)][0] + 1
            again = prev is not None and longer == length and producer.module is call.module
            if longer > length or again:  # of equal runs, the one of the block called again
                length, prev = longer, producer  # (ALBERT's layer group, not the layer in it)
        best[id(call)] = (length, prev)
    by_id = {id(c): c for c in calls}
    runs = []
    for end in best:
        run = [by_id[end]]
        while best[id(run[-1])][1] is not None:
            run.append(best[id(run[-1])][1])
        if len(run) >= 2 and _usable(run[::-1], weights):
            runs.append(run[::-1])
    # a run ending at a block and the same run ending earlier: only the longest is kept
    runs.sort(key=lambda r: (-len(r), r[0].depth, r[0].start))
    kept: list[list[TracedCall]] = []
    seen: set[int] = set()
    for run in runs:
        if id(run[-1]) not in seen:
            kept.append(run)
            seen.update(id(c) for c in run)
    return kept[:MAX_RUNS_TRIED]


def _relative_names(names: list[str]) -> list[str]:
    """Block paths without the dotted prefix they share above their container (``transformer.h.0``
    -> ``h.0``; ``layer1.0`` .. ``layer4.2`` stay).
    """
    parts = [n.split(".") for n in names]
    common = 0
    while all(len(p) > common + 2 for p in parts) and len({p[common] for p in parts}) == 1:
        common += 1
    return [".".join(p[common:]) for p in parts]


def _reads_values(kind: str, call: TracedCall, prefix: bool, block: bool = True) -> int:
    """What ``call`` also reads that depends on the batch (NOTE [ Stage wrappers ]): 0 nothing;
    :data:`FROM_INPUT` a tensor computed from the input's token ids only (a padding mask,
    DeepSeek-V4's hash router); :data:`FROM_PARAM` one computed from the parameters too: without
    a gradient (integer indices: DeepSeek-V3.2's top-k, which an earlier block computes and the
    next reuses), or, read by a block of the run, a floating one computed before the blocks (a
    learned position bias, per-layer inputs) or by an earlier block and passed as an argument
    (NOTE [ A side input with a gradient ]); both change as the parameters train. ``enable``
    passes each step's own; a chain's stage wrappers hold the traced ones.

    Raises
    ------
    InputError
        A floating tensor computed from the parameters that the head reads (``block`` False),
        or that an earlier block stored in a mutable mapping memplan cannot copy (NOTE [ A
        mapping the blocks share ]); values where nothing before the first block can check the
        batch.
    """
    values = 0
    direct = direct_leaves(call)
    uncopyable = uncopyable_mapping(call)
    for i, taint in call.taints.items():
        if not taint & (FROM_INPUT | FROM_PARAM):
            continue  # from the input's shape only: the same for every batch of that shape
        # NOTE [ A side input with a gradient ]: an argument of a block, or what an earlier
        # block stored in a mapping it reads (NOTE [ A mapping the blocks share ])
        side = block and prefix and (i < direct or not taint & FROM_BLOCK or uncopyable is None)
        if taint & FROM_PARAM and taint & FLOATING and not side:
            what = (
                "computed by an earlier block (its activation, a state it hands on"
                + (
                    f" in a mapping, a {uncopyable}, that memplan cannot copy)"
                    if i >= direct
                    else ")"
                )
                if taint & FROM_BLOCK
                else "computed from the parameters before the blocks (a learned bias, per-layer "
                "inputs), whose gradient flows through every block"
            )
            raise InputError(
                f"cannot linearize {kind}: {call.name} ({type(call.module).__name__}) also reads "
                f"a tensor {what}, not only the previous stage's output: the model is not a "
                "chain of these blocks; give it a memplan_stages() method returning "
                "[(name, module), ...]"
            )
        if not prefix:
            raise InputError(
                f"cannot linearize {kind}: {call.name} ({type(call.module).__name__}) also reads "
                "a tensor computed from the values of the input, and the model computes nothing "
                "before its first block; give it a memplan_stages() method returning "
                "[(name, module), ...]"
            )
        values |= taint & (FROM_INPUT | FROM_PARAM)
    return values


def _hands_on_unused(
    kind: str,
    model: nn.Module,
    call: ModelCall,
    x: Tensor,
    run: list[TracedCall],
    head_reads: bool,
) -> None:
    """Refuse a block that returns, for a block after the next, a tensor its own output does
    not depend on (NOTE [ A side input with a gradient ]); where the head reads an earlier
    activation (``head_reads``), any such tensor, which the head may be reading.

    Autograd runs the nodes that made such a tensor as soon as its readers' backward has run.
    Read by the next block alone (ZAYA's router states), that is where the plan's backward
    reaches the block that made it anyway: the runtime runs the plan up to its ``B`` there
    (:meth:`memplan.torch.runtime.iteration.PlannedIteration.reached_through`). Read further
    on, it would run before the plan has recomputed that block. The model runs once more with
    gradients (eval mode): each block's returned tensors that a later block reads must be read
    by the next block only, or be reachable from the block's output's node.

    Raises
    ------
    InputError
        Naming the block.
    """
    blocks = {id(c.module): i for i, c in enumerate(run)}
    returned: list[tuple[int, Tensor, list[Tensor]]] = []
    read: dict[int, set[int]] = {}  # id of a tensor -> the blocks that read it

    def pre(module: nn.Module, args: Any, kwargs: Any) -> None:
        for t in pytree.tree_leaves((args, kwargs)):
            if isinstance(t, Tensor):
                read.setdefault(id(t), set()).add(blocks[id(module)])

    def post(module: nn.Module, args: Any, output: Any) -> None:
        out = primary_output(output)
        others = [t for t in pytree.tree_leaves(output) if isinstance(t, Tensor) and t is not out]
        if out is not None and others:
            returned.append((blocks[id(module)], out, others))

    handles = [c.module.register_forward_pre_hook(pre, with_kwargs=True) for c in run]
    handles += [c.module.register_forward_hook(post) for c in run]
    try:
        with eval_mode(model), torch.enable_grad():
            call(model, x)
    finally:
        for handle in handles:
            handle.remove()
    for i, out, others in returned:
        c = run[i]
        for other in others:
            readers = read.get(id(other), set())
            read_later = head_reads or bool(readers - {i + 1})
            if (
                read_later
                and other.grad_fn is not None
                and not _reaches(out.grad_fn, other.grad_fn)
            ):
                raise InputError(
                    f"cannot linearize {kind}: {c.name} ({type(c.module).__name__}) returns "
                    "a tensor a block after the next (or the head) reads that its own output "
                    "does not depend on: "
                    "its backward would run in the later block's, before a plan recomputes "
                    f"{c.name}; give it a memplan_stages() method returning "
                    "[(name, module), ...]"
                )


def _reaches(start: Any, target: Any) -> bool:
    """Whether autograd node ``target`` is ``start`` or one of the nodes it leads to."""
    return any(node is target for node in graph_nodes(start))


def _side_gradient_bytes(
    run: list[TracedCall], stages: list[tuple[str, nn.Module]], read_by_head: list[Tensor]
) -> int:
    """Bytes of the floating tensors computed from the parameters that the run's blocks read
    besides their hidden state (NOTE [ A side input with a gradient ]), each storage once.

    NOTE [ A side input with a gradient ]
    A learned relative position bias (CPM-Ant, MPNet) or per-layer inputs: the model computes it
    from parameters before its first block and every block reads it, so its gradient flows back
    through every block; or a state a block computes and hands to the next as an argument
    (ZAYA's router states), whose gradient flows back from the later block's backward to the
    earlier one's. ``enable`` follows the model's own forward: every
    block reads the step's own tensor, autograd sums its gradient from every block's backward
    (and runs the backward of what computed it once, at the end), and a recomputed block reads
    the tensor its first forward read (the runtime holds the block's arguments). A chain's
    stage wrappers hold the traced tensor, which would not train: the chain API refuses
    (:attr:`PrefixStage.chain_refusal`). Each block's wrapper holds it as a buffer, which its
    ``weight_size`` leaves out (:attr:`BlockCall.side_bytes`); the profile counts it three
    times for the whole step (``side_gradient_size``): the tensor, held from the first stage's
    forward to its backward, the gradient autograd sums from the last block's backward to the
    first stage's, and one block's share while that block's backward adds it in (for a state
    handed on: from the block that makes it to the one that reads it). An upper
    bound: before the backward neither gradient exists. The gradients of the parameters that
    computed it come through the blocks' backward, which the first stage's measured backward
    does not run: its ``weight_grad_size`` counts every parameter it creates a gradient of.

    NOTE [ A mapping the blocks share ]
    Gemma-4's blocks get one mapping the model makes in its forward (a ``KVSharingDict``, which
    pytree does not open): a block stores its keys and values in it, a later one reads them
    instead of computing its own. What a block reads there is a side input of the block (the
    tracing pass copies the mapping as the block got it: :attr:`TracedCall.args`), counted
    above with the rest. The step's first forward uses the model's own mapping; for a
    recomputation, the runtime holds a copy of it as the block got it (not the model's, which
    a later block may write into again before the recomputation, and which would live to the
    step's end), and each recomputation, like each call of a stage wrapper, gets a copy of that
    copy: what it stores is dropped with it. A recomputed tensor that outlived its
    recomputation (stored in a mapping the runtime holds) would keep, through its autograd
    graph, every tensor that recomputation saved alive to the end of the backward (Gemma-4's
    tiny model measured 16% over its budget so): the runtime also lets go of its list of them
    once they are in the slots (:meth:`PlannedIteration._fill_slots
    <memplan.torch.runtime.iteration.PlannedIteration>`). A mutable mapping of another kind
    than a ``dict`` or a ``UserDict`` cannot be copied safely: a block reading an earlier
    block's activation from one is refused.
    """
    found: dict[int, int] = {}
    wrappers = {id(m.block): m for _, m in stages if isinstance(m, BlockCall)}
    for c in run:
        leaves = call_leaves(c)
        here: dict[int, int] = {}
        for i, taint in c.taints.items():
            if taint & FROM_PARAM and taint & FLOATING:
                storage = leaves[i].untyped_storage()
                here[storage.data_ptr()] = storage.nbytes()
        wrapper = wrappers.get(id(c.module))
        if wrapper is not None:  # what it holds as buffers (not a mapping's tensors)
            held = {b.untyped_storage().data_ptr(): b for b in wrapper.buffers(recurse=False)}
            wrapper.side_pointers = frozenset(ptr for ptr in held if ptr in here)
            wrapper.side_bytes = sum(here[ptr] for ptr in wrapper.side_pointers)
        found.update(here)
    for tensor in read_by_head:  # an earlier block's activation the head reads (XLM, CvT)
        found[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
    return sum(found.values())


def _prefix(
    kind: str, model: nn.Module, call: ModelCall, tracer: Tracer, run: list[TracedCall]
) -> PrefixStage:
    """Everything the model computes before the run's first block: the module calls it makes
    and the parameters and buffers it reads directly. Those of the run's blocks stay theirs
    (RWKV rescales its blocks' output weights in place, before them, when its training flag
    flips): one stage owns each parameter, as the profile and FSDP2's layout count it.
    """
    first = run[0]
    if any(c.module is first.module and c.start < first.start for c in tracer.calls):
        raise InputError(
            f"cannot linearize {kind}: its first block {first.name} is also called before the run"
        )
    open_ids = {id(c) for c in first.parents}
    parts: dict[str, nn.Module] = {}
    for c in tracer.calls:
        if c.start >= first.start:
            break
        enclosing = c.parents[-1] if c.parents else None
        if c.end < first.start and (enclosing is None or id(enclosing) in open_ids):
            parts.setdefault(c.name, c.module)
    modules = [*parts.values(), *(c.module for c in run)]
    owned = {id(t) for m in modules for t in [*m.parameters(), *m.buffers()]}
    params: dict[int, nn.Parameter] = {}
    buffers: dict[int, Tensor] = {}
    for time, stack, tensor in tracer.direct:
        if time >= first.start or (stack and id(stack[-1]) not in open_ids):
            continue
        if id(tensor) in owned:
            continue
        if isinstance(tensor, nn.Parameter):
            params.setdefault(id(tensor), tensor)
        else:
            buffers.setdefault(id(tensor), tensor)
    ancestors = [c.module for c in first.parents]
    assert first.key is not None
    return PrefixStage(
        model, call, first.module, first.key, parts, list(params.values()),
        list(buffers.values()), ancestors,
    )  # fmt: skip


def _head_by_calls(
    last: TracedCall, final: list[tuple[TracedCall | None, ViewSpec | None]]
) -> tuple[list[nn.Module], list[TracedCall]] | None:
    """Module calls from the last block's output to the model's output, in forward order (each
    preceded by the view of the previous output it reads, if any), and the traced calls; None when
    something other than module calls and views stands between.
    """
    calls: list[TracedCall] = []
    backward: list[nn.Module] = []  # the steps from the output back to the last block
    producers = final
    while True:
        for producer, view in producers:
            if producer is last:
                if view is not None:
                    backward.append(ViewStage(view))
                return backward[::-1], calls
        options = [
            (c, v)
            for c, v in producers
            if c is not None and c.start > last.end and c.key is not None and c.has_output
        ]
        if not options:
            return None
        call, view = min(options, key=lambda cv: (cv[0].depth, cv[0].start - cv[0].end))
        if view is not None:
            backward.append(ViewStage(view))
        calls.append(call)
        backward.append(BlockCall(call.module, call.args, call.kwargs, call.input_shape))
        producers = call.producers


def _calls_off_the_way(tracer: Tracer, last: TracedCall, path: list[TracedCall]) -> bool:
    """Whether the model calls a module after its last block, before its output, that is neither
    on the way from the one to the other nor inside a call that is (BigBird's pooler): the head
    stage computes it too, which a sequence of module calls would leave out.
    """
    if not path:
        return False
    on_path = {id(c) for c in path}
    end = max(c.end for c in path)
    return any(
        last.end < c.start < end
        and id(c) not in on_path
        and not any(id(p) in on_path for p in c.parents)
        for c in tracer.calls
    )


def _record_head(
    model: nn.Module,
    call: ModelCall,
    pick: Callable[[Any], Any],
    x: Tensor,
    last: TracedCall,
    ordinal: int,
    at_start: bool = False,
) -> tuple[TapeRecorder, Tracer, Any]:
    """Run the model on ``x`` (no gradients, in the mode it is in), recording its operations
    from the return of call ``ordinal`` of the last block on (with ``at_start``, from that call
    of ``last``'s module on, its primary input the head's input); the recorder, the tracer that
    followed what each tensor is computed from, and the model's output.
    """
    seen = [0]
    recorder = TapeRecorder()
    taint = Tracer(model)

    def started(module: nn.Module, args: Any, output: Any) -> None:
        out = primary_output(output)
        if seen[0] == ordinal and out is not None:
            recorder.start(out)
        seen[0] += 1

    def starting(module: nn.Module, args: Any, kwargs: Any) -> None:
        if seen[0] == ordinal and last.key is not None:
            recorder.start(args[last.key] if isinstance(last.key, int) else kwargs[last.key])
        seen[0] += 1

    if at_start:  # the head begins as ``last`` is called (NOTE [ Parallel lists as blocks ])
        hook = last.module.register_forward_pre_hook(starting, with_kwargs=True)
    else:
        hook = last.module.register_forward_hook(started)
    try:
        with taint.tracing(x, calls=False), recorder, torch.random.fork_rng(devices=[]):
            result = pick(call(model, x))
    finally:
        hook.remove()
    return recorder, taint, result


def _head_by_tape(
    kind: str,
    model: nn.Module,
    call: ModelCall,
    pick: Callable[[Any], Any],
    x: Tensor,
    tracer: Tracer,
    last: TracedCall,
    prefix: bool,
    at_start: bool = False,
) -> TapeStage:
    """The part after the last block as a :class:`TapeStage` (NOTE [ The head on a tape ]): the
    model runs again in eval mode and in training mode (without gradients; batch-norm statistics
    restored), recorded from the return of that call of the last block on. InputError when the
    model's output is not computed from the last block's output, or when the head also reads a
    tensor computed before it from the parameters that is not floating; a floating one (an
    activation of an earlier block, CvT's class token the last block returns besides its
    hidden state) is a side input with a gradient (NOTE [ A side input with a gradient ]): the
    stage's ``side_bytes``.
    """
    ordinal = [c for c in tracer.calls if c.module is last.module].index(last)
    tapes = []
    side: dict[int, Tensor] = {}  # read by the head, computed from parameters before it
    trained: list[Tensor] = []  # those of the training-mode tape
    for mode in (eval_mode, train_mode):
        with mode(model):
            recorder, taint, result = _record_head(model, call, pick, x, last, ordinal, at_start)
        if recorder.switches_modes:  # a replay would leave autograd off (MODE_SWITCHES)
            raise InputError(
                f"cannot linearize {kind}: what follows its last block {last.name} switches "
                "autograd's or autocast's mode (torch.no_grad() in tensor code), which memplan "
                "cannot replay; give it a memplan_stages() method returning [(name, module), ...]"
            )
        end = recorder.ref(result) if isinstance(result, Tensor) else None
        if end is None:
            raise InputError(
                f"cannot linearize {kind}: its output is not computed from the output of its "
                f"last block {last.name}; give it a memplan_stages() method returning "
                "[(name, module), ...]"
            )
        tapes.append(recorder.tape.until(end))
        owned = set(taint.params) | set(taint.buffers)
        for constant in tapes[-1].constants():
            if id(constant) not in owned and taint.taint.kind(constant) & FROM_PARAM:
                if constant.is_floating_point():  # without a first stage: the head holds it
                    side[id(constant)] = constant
                    trained += [constant] if mode is train_mode else []
                    continue
                raise InputError(
                    f"cannot linearize {kind}: what follows its last block {last.name} also "
                    f"reads a tensor of shape {tuple(constant.shape)} computed before it from "
                    "the parameters (an earlier block's activation), not only the last block's "
                    "output: the model is not a chain of these blocks; give it a "
                    "memplan_stages() method returning [(name, module), ...]"
                )
    assert last.input_shape is not None and recorder.input_shape is not None
    stage = TapeStage(tapes[0], tapes[1], recorder.input_shape, owned)
    stage.side_pointers = frozenset(b.untyped_storage().data_ptr() for b in side.values())
    stage.side_bytes = sum(b.untyped_storage().nbytes() for b in side.values())
    stage.side_tensors = trained
    return stage


def _cut(
    kind: str,
    model: nn.Module,
    call: ModelCall,
    pick: Callable[[Any], Any],
    x: Tensor,
    tracer: Tracer,
    run: list[TracedCall],
    final: list[tuple[TracedCall | None, ViewSpec | None]],
) -> RepeatedBlocks:
    """The stages for one run (InputError when it does not make a chain)."""
    first, last = run[0], run[-1]
    names = [c.name for c in run]
    stages: list[tuple[str, nn.Module]] = []
    prefix = not any(p is None and v is None for p, v in first.producers)
    labels = _relative_names(names)
    for j, (c, label) in enumerate(zip(run, labels, strict=True)):
        again = labels[:j].count(label)  # a block called again (ALBERT's shared layers)
        label = f"{label}#{again + 1}" if again or labels.count(label) > 1 else label
        stages.append((label, BlockCall(c.module, c.args, c.kwargs, c.input_shape)))
    by_calls = _head_by_calls(last, final)
    if by_calls is not None and _calls_off_the_way(tracer, last, by_calls[1]):
        by_calls = None  # the tape has them all: what the stage computes is measured
    head, head_calls = by_calls if by_calls is not None else (None, [])
    values = 0
    for c in run:
        values |= _reads_values(kind, c, prefix)
    hands_on = any(
        i < direct_leaves(c) and taint & FROM_BLOCK and taint & FLOATING
        for c in run
        for i, taint in c.taints.items()
    )
    for c in head_calls:
        values |= _reads_values(kind, c, prefix, block=False)
    head_by = "calls" if head else "none"
    head_modules = [m.block for m in head or [] if isinstance(m, BlockCall)]
    output_module = head_modules[-1] if head_modules else None
    head_operations = None
    read_by_head: list[Tensor] = []
    if head is None:
        tape = _head_by_tape(kind, model, call, pick, x, tracer, last, prefix)
        head, head_by, head_operations = [tape], "tape", tape.training_tape.operations()
        read_by_head = tape.side_tensors
        values |= FROM_PARAM if read_by_head else 0
    if hands_on or read_by_head:
        _hands_on_unused(kind, model, call, x, run, bool(read_by_head))
    if prefix:
        stem = _prefix(kind, model, call, tracer, run)
        if values:  # NOTE [ Stage wrappers ]: the chain is for this batch's values
            stem.traced_for(x, trains=not values & FROM_PARAM)
        stem.side_gradient_bytes = _side_gradient_bytes(run, stages, read_by_head)
        stages.insert(0, ("stem" if x.is_floating_point() else "embedding", stem))
    elif read_by_head:  # no first stage: the head counts what it reads (CvT's class token)
        tape.side_gradient_bytes = _side_gradient_bytes(run, stages, read_by_head)
        tape.chain_refusal = (
            f"the chain of {kind} holds what its head reads besides the last block's output as "
            "traced (an activation computed from the parameters): it would not change as they "
            "train, nor pass its gradient on; train the model with memplan.torch.enable(model, "
            "memory, example_input=batch), which passes each step's own"
        )
    if head:
        stages.append(("head", head[0] if len(head) == 1 else nn.Sequential(*head)))
    _check_body(kind, tracer, run, prefix, bool(head))
    return RepeatedBlocks(
        stages=stages, blocks=names, head_by=head_by,
        block_modules=[c.module for c in run],
        block_keys=[c.key for c in run if c.key is not None],
        head_modules=head_modules, output_module=output_module, prefix=prefix,
        head_operations=head_operations,
    )  # fmt: skip


def _group_stages(
    kind: str,
    model: nn.Module,
    call: ModelCall,
    x: Tensor,
    tracer: Tracer,
    run: list[list[TracedCall]],
    prefix: bool,
    end: TracedCall | None,
) -> tuple[list[TapeStage], int]:
    """One :class:`TapeStage` per call group (NOTE [ Parallel lists as blocks ] in
    :mod:`memplan.torch.split.groups`), and what the groups read that depends on the batch
    (as :func:`_reads_values`).

    Raises
    ------
    InputError
        A group whose end its operations do not make; one that reads a floating tensor computed
        from the parameters before it (an earlier group's activation: a side input, which a
        group's stage does not take); values of the input where nothing comes before the groups.
    """
    ordinals = []
    for group in run:
        ordinals.append([c for c in tracer.calls if c.module is group[0].module].index(group[0]))
    modes = []
    for mode in (eval_mode, train_mode):
        with mode(model):
            recorders, taint = record_groups(model, call, x, run, ordinals, end)
        tapes = group_tapes(recorders, len(run))
        if tapes is None:
            raise InputError(
                f"cannot linearize {kind}: the groups of {run[0][0].name} .. {run[-1][-1].name} "
                "do not compute each the next one's input from their own; give it a "
                "memplan_stages() method returning [(name, module), ...]"
            )
        modes.append((tapes, recorders, taint))
    owned = set(modes[1][2].params) | set(modes[1][2].buffers)
    values = 0
    for tapes, _, taint in modes:
        for tape, group in zip(tapes, run, strict=True):
            for constant in tape.constants():
                kinds = taint.taint.kind(constant) & (FROM_INPUT | FROM_PARAM)
                if id(constant) in owned or not kinds:
                    continue
                if kinds & FROM_PARAM and constant.is_floating_point():
                    raise InputError(
                        f"cannot linearize {kind}: the call group of {group[0].name} also reads "
                        f"a tensor of shape {tuple(constant.shape)} computed from the parameters "
                        "before it, not only the previous group's output: the model is not a "
                        "chain of these groups; give it a memplan_stages() method returning "
                        "[(name, module), ...]"
                    )
                if not prefix:
                    raise InputError(
                        f"cannot linearize {kind}: the call group of {group[0].name} also reads a "
                        "tensor computed from the values of the input, and the model computes "
                        "nothing before it; give it a memplan_stages() method returning "
                        "[(name, module), ...]"
                    )
                values |= kinds
    stages = []
    for g, recorder in enumerate(modes[1][1]):
        assert recorder.input_shape is not None
        stages.append(TapeStage(modes[0][0][g], modes[1][0][g], recorder.input_shape, owned))
    return stages, values


def _group_names(run: list[list[TracedCall]]) -> list[str]:
    """A stage name per call group: the list element all its modules are in (``layers.0`` for
    SqueezeBERT's ``layers.0.attention`` .. ``layers.0.output``), else its first and last
    module (``attentions.0..layer_norm2.0``).
    """
    elements = []
    for group in run:
        paths = set()
        for c in group:
            parts = c.name.split(".")
            last = max((j for j, part in enumerate(parts) if part.isdigit()), default=-1)
            paths.add(".".join(parts[: last + 1]))
        elements.append(paths.pop() if len(paths) == 1 else None)
    if all(elements):
        return _relative_names([e for e in elements if e])
    firsts = _relative_names([group[0].name for group in run])
    lasts = _relative_names([group[-1].name for group in run])
    return [f"{a}..{b}" for a, b in zip(firsts, lasts, strict=True)]


def _cut_groups(
    kind: str,
    model: nn.Module,
    call: ModelCall,
    pick: Callable[[Any], Any],
    x: Tensor,
    tracer: Tracer,
    run: list[list[TracedCall]],
) -> RepeatedBlocks:
    """The stages for a run of call groups (NOTE [ Parallel lists as blocks ] in
    :mod:`memplan.torch.split.groups`): the part before the first group, one tape stage per
    group, the head on a tape from where the last group ends (the next module's call, a final
    norm or the output layer, or else its last module's return).
    """
    calls = [c for group in run for c in group]
    entries = [group[0] for group in run]
    _check_distinct(kind, calls)
    prefix = not any(p is None and v is None for p, v in entries[0].producers)
    last = run[-1][-1]
    after = next((c for c in tracer.calls if c.start > last.end and c.key is not None), None)
    if after is not None and sum(c.module is after.module for c in tracer.calls) > 1:
        after = None  # called elsewhere too: its calls do not mark one place
    if after is not None and list_index(after) is not None:
        after = None  # an element of a list: not the head's
    try:
        tapes, values = _group_stages(kind, model, call, x, tracer, run, prefix, after)
    except InputError:
        if after is None:
            raise
        after = None  # the next call does not read what the last group made: its return
        tapes, values = _group_stages(kind, model, call, x, tracer, run, prefix, after)
    names = _group_names(run)
    stages: list[tuple[str, nn.Module]] = list(zip(names, tapes, strict=True))
    if after is not None:
        head = _head_by_tape(kind, model, call, pick, x, tracer, after, prefix, at_start=True)
    else:
        head = _head_by_tape(kind, model, call, pick, x, tracer, last, prefix)
    if head.side_tensors:
        raise InputError(
            f"cannot linearize {kind}: what follows its last call group also reads an earlier "
            "group's activation; give it a memplan_stages() method returning [(name, module), ...]"
        )
    values |= FROM_PARAM if head.side_pointers else 0
    if prefix:
        stem = _prefix(kind, model, call, tracer, calls)
        if values:  # NOTE [ Stage wrappers ]: the chain is for this batch's values
            stem.traced_for(x, trains=not values & FROM_PARAM)
        stages.insert(0, ("stem" if x.is_floating_point() else "embedding", stem))
    stages.append(("head", head))
    _check_body(kind, tracer, [entries[0], last], prefix, True)
    return RepeatedBlocks(
        stages=stages, blocks=[c.name for c in entries], head_by="tape",
        block_modules=[c.module for c in entries],
        block_keys=[c.key for c in entries if c.key is not None],
        prefix=prefix, head_operations=head.training_tape.operations(),
        groups=[[c.module for c in group] for group in run],
        group_end=None if after is None else (after.module, after.key),
    )  # fmt: skip


def _chain_output(
    kind: str, stages: list[tuple[str, nn.Module]], x: Tensor, inplace: list[bool]
) -> Tensor:
    """Run the stages in eval mode without gradients; each must return a floating tensor."""
    with eval_mode(*(m for _, m in stages)), torch.no_grad():
        return run_stages(kind, stages, x.clone(), inplace)


def _leaf_calls(calls: list[TracedCall], start: int, end: int) -> int:
    """Calls of modules without children (the layers) that start within ``(start, end)``."""
    return sum(
        1 for c in calls if start < c.start < end and next(c.module.children(), None) is None
    )


def _check_distinct(kind: str, run: list[TracedCall]) -> None:
    """Refuse call groups that share parameters (NOTE [ Parallel lists as blocks ]): the runtime
    marks a group by a pre-hook on its first module, which must be called once a step.

    A run of blocks may call one block several times (ALBERT's shared layers): the runtime tells
    the calls apart by the stage the step is at (``ModelHooks.shared_pre`` in
    :mod:`memplan.torch.runtime.hooks`).
    """
    seen: set[int] = set()
    for c in run:
        params = {id(p) for p in c.module.parameters()}
        if params & seen:
            raise InputError(
                f"cannot linearize {kind}: its call groups share their weights ({c.name} calls "
                "parameters an earlier group called), where memplan marks a group by its "
                "first module's call; give it a memplan_stages() method returning "
                "[(name, module), ...]"
            )
        seen |= params


def _check_body(kind: str, tracer: Tracer, run: list[TracedCall], prefix: bool, head: bool) -> None:
    """Refuse a cut whose blocks are not the body of the model: when the part before the first
    block or after the last one calls more layers than the blocks do (a U-Net, whose
    contracting path is one run of blocks and whose expanding path reads its outputs; an
    encoder-decoder), the chain would be a few small stages and one holding most of the model,
    which no plan can use.
    """
    first, last = run[0], run[-1]
    inside = _leaf_calls(tracer.calls, first.start - 1, last.end)
    before = _leaf_calls(tracer.calls, 0, first.start) if prefix else 0
    after = _leaf_calls(tracer.calls, last.end, tracer.counter + 1) if head else 0
    part, count = ("after its last block", after)
    if before > after:
        part, count = ("before its first block", before)
    if count > inside:
        raise InputError(
            f"cannot linearize {kind}: its longest run of repeated blocks ({first.name} .. "
            f"{last.name}) calls {inside} layers, and the part {part} calls {count}: the "
            "model is not a chain of these blocks (a U-Net or an encoder-decoder: branches "
            "that join later); give it a memplan_stages() method returning [(name, module), ...]"
        )


def _hookless_blocks(kind: str, model: nn.Module, calls: list[TracedCall]) -> InputError | None:
    """The refusal of a model whose blocks run without module hooks, or None.

    A container's blocks called through their ``forward`` method (SqueezeBERT's
    ``layer.forward(...)``) run no module hooks: the tracing pass sees only their submodules (and
    may find a run inside one of them), and a plan's runtime, which marks its stages by these
    hooks, could not mark them. Children that are containers themselves (an ``nn.ModuleList``
    of them) have no call of their own and are not counted.
    """
    called = {c.name for c in calls}
    for name, container in model.named_modules():
        if not isinstance(container, (nn.ModuleList, nn.Sequential)) or len(container) < 2:
            continue
        unseen = []
        for child, module in container.named_children():
            path = f"{name}.{child}" if name else child
            if isinstance(module, (nn.ModuleList, nn.ModuleDict)) or path in called:
                continue
            if any(c.startswith(path + ".") for c in called):
                unseen.append(path)
        if len(unseen) >= 2:
            return InputError(
                f"cannot linearize {kind}: its blocks {unseen[0]}, {unseen[1]}... are not called "
                "as modules (their forward runs without module hooks, as layer.forward(...) "
                "does; only their submodules are called): memplan's stages are marked by these "
                "hooks; call the blocks as modules (layer(...)), or give the model a "
                "memplan_stages() method returning [(name, module), ...] called as modules"
            )
    return None


def _wrong_chain(
    kind: str, found: RepeatedBlocks, out: Tensor, result: Tensor, inplace: list[bool]
) -> InputError | None:
    """Why the chain ``found`` (its output ``out``, whether each stage modified its input in
    place) is not the model (its output ``result``), or None.
    """
    mismatch = output_mismatch(kind, out, result)
    if mismatch is not None:
        return mismatch
    first = 1 if found.prefix else 0
    changed = [i for i, c in enumerate(inplace[first : first + len(found.groups)]) if c]
    if changed:
        return InputError(
            f"cannot linearize {kind}: the call group of {found.blocks[changed[0]]} "
            "modifies its input in place, which the loop's code may go on reading; "
            "give it a memplan_stages() method returning [(name, module), ...]"
        )
    return None


def find_repeated_blocks(
    model: nn.Module,
    example_input: Tensor,
    *,
    call: ModelCall | None = None,
    output: Callable[[Any], Any] | None = None,
) -> RepeatedBlocks:
    """Find the run of repeated blocks of a model, cut it into stages and check them.

    See NOTE [ Finding the run of blocks ] and NOTE [ Stage wrappers ]. The model runs once, in
    eval mode without gradients (its training flags are restored), then the stages of the best
    run (longest; runs inside a single block last) run once and must give the model's output
    (:func:`memplan.torch.split.linearize.outputs_match`); if they do not, or the run does not make a chain, the next
    run is tried.

    Parameters
    ----------
    model : nn.Module
        Any model whose forward reads one tensor (``call`` says how to pass it).
    example_input : Tensor
        The chain input, on the model's device.
    call : callable, optional
        ``call(model, x)``; default ``model(x)``. HF models are called with ``use_cache=False``.
    output : callable, optional
        Picks the output tensor from what ``call`` returns (default: :func:`model_output`).

    Returns
    -------
    RepeatedBlocks
        With ``output``, the chain's output on ``example_input`` (equal to the model's).

    Raises
    ------
    InputError
        The model fails on the input or returns no tensor; no run of at least two blocks; a
        block that also reads tensors computed from parameters, activations or the input's values;
        no way to cut what follows the last block; a chain that does not give the model's output.
    """
    kind = type(model).__name__
    call = call or call_model
    pick = output or model_output
    tracer = Tracer(model)
    with eval_mode(model), torch.no_grad():
        try:
            with tracer.tracing(example_input):
                result = pick(call(model, example_input))
        except (RuntimeError, ValueError, TypeError, IndexError) as exc:
            raise InputError(f"{kind} fails on the example input: {first_line(exc)}") from None
        if not isinstance(result, Tensor):
            raise InputError(
                f"cannot linearize {kind}: its output is {type(result).__name__}, not a tensor"
            )
        final = tracer.producers_of(result)
        weights = sum(p.numel() for p in model.parameters())
        runs: list[Any] = [*_runs(tracer.calls, weights), *group_runs(tracer.calls)]
        tracer.produced.clear()
        if not runs:
            raise _hookless_blocks(kind, model, tracer.calls) or InputError(
                f"cannot linearize {kind}: no run of repeated blocks (children of an "
                "nn.ModuleList or nn.Sequential, each fed by the previous one's output) was "
                "found; give it a memplan_stages() method returning [(name, module), ...]"
            )
        failure: InputError | None = None
        grouped: InputError | None = None  # the first failure of a run of call groups
        reading: RepeatedBlocks | None = None  # the first run whose blocks read a side input
        for run in runs:
            if reading is not None and isinstance(run[0], list):
                break  # runs of call groups only where no run of blocks makes a chain
            try:
                if isinstance(run[0], list):  # NOTE [ Parallel lists as blocks ]
                    found = _cut_groups(kind, model, call, pick, example_input, tracer, run)
                else:
                    found = _cut(kind, model, call, pick, example_input, tracer, run, final)
                inplace: list[bool] = []
                out = _chain_output(kind, found.stages, example_input, inplace)
            except InputError as exc:
                if isinstance(run[0], list):  # a run of call groups says more than a short run
                    grouped = grouped or exc
                failure = failure or exc
                continue
            wrong = _wrong_chain(kind, found, out, result, inplace)
            if wrong is not None:
                failure = failure or wrong
                continue
            found.output = out
            found.inplace = inplace
            if not side_gradient_bytes([m for _, m in found.stages]):
                distinct = len({id(m) for m in found.block_modules}) == len(found.block_modules)
                if sub_blocks_on() and distinct:  # a block called again: whole (ALBERT's)
                    _cut_sub_blocks(kind, found, example_input)
                return found
            # NOTE [ A side input with a gradient ]: a later run that needs none first (a
            # ResNet's convolutions inside a bottleneck read its shortcut; its blocks do not);
            # a run whose blocks read one stays in whole blocks (NOTE [ Sub-block stages ])
            reading = reading or found
        if reading is not None:
            return reading
    assert failure is not None
    raise _hookless_blocks(kind, model, tracer.calls) or grouped or failure


def _cut_sub_blocks(kind: str, found: RepeatedBlocks, x: Tensor) -> None:
    """Cut each block of ``found`` into its parts where it has some (NOTE [ Sub-block stages ]
    in :mod:`memplan.torch.split.sub_blocks`): its stage becomes one per part, named
    ``block[1/2]``, ``block[2/2]``. The chain is checked again against the model's output.
    """
    first = 1 if found.prefix else 0
    stages = list(found.stages)
    parts: list[BlockParts | None] = []
    with eval_mode(*(m for _, m in stages)), torch.no_grad():
        h = stages[0][1](x.clone()) if found.prefix else x
        for _, stage in stages[first : first + len(found.block_modules)]:
            assert isinstance(stage, BlockCall)
            parts.append(block_parts(stage, h))
            h = stage(h)
    if not any(parts):
        return
    cut: list[tuple[str, nn.Module]] = stages[:first]
    for k, (name, stage) in enumerate(stages[first:]):
        found_parts = parts[k] if k < len(parts) else None
        if found_parts is None:
            cut.append((name, stage))
            continue
        count = len(found_parts.stages)
        cut += [(f"{name}[{j + 1}/{count}]", s) for j, s in enumerate(found_parts.stages)]
    inplace: list[bool] = []
    out = _chain_output(kind, cut, x, inplace)
    if found.output is None or not outputs_match(out, found.output):
        return  # the parts do not give the model's output: whole blocks
    found.stages, found.inplace, found.parts = cut, inplace, parts


def repeated_block_stages(
    model: nn.Module,
    example_input: Tensor,
    *,
    call: ModelCall | None = None,
    output: Callable[[Any], Any] | None = None,
) -> list[tuple[str, nn.Module]]:
    """The stages of :func:`find_repeated_blocks` (loss excluded)."""
    return find_repeated_blocks(model, example_input, call=call, output=output).stages
