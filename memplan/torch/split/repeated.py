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
finest run wins (the blocks of a ConvNeXt stage rather than its four stages).

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
``as_strided``); when something else stands between (a functional ``x.mean(1)``), by a
``torch.fx`` trace of the model's forward with the blocks and every other module as leaves, from
which the nodes after the last block are cut out.

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

import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree
from torch.utils.weak import WeakIdKeyDictionary

from memplan.errors import InputError
from memplan.torch.split.stages import eval_mode, first_line, outputs_match, run_stages

__all__ = [
    "BlockCall",
    "ModelCall",
    "PrefixStage",
    "RepeatedBlocks",
    "find_repeated_blocks",
    "ViewSpec",
    "model_output",
    "primary_key",
    "primary_output",
    "redo_view",
    "replace_primary",
    "view_relation",
    "repeated_block_stages",
]

ModelCall = Callable[[nn.Module, Tensor], Any]
"""How to call a model on the chain input: ``call(model, x)`` (default ``model(x)``)."""

_PARAM = 1  # computed from a parameter (or from anything computed from one: activations)
_INPUT = 2  # computed from the values of the model's input
_MAX_RUNS_TRIED = 8


def _call_model(model: nn.Module, x: Tensor) -> Any:
    return model(x)


def primary_output(value: Any) -> Tensor | None:
    """The tensor a call returns: itself, the first element of a tuple/list whose other elements
    are not tensors, or the first tensor value of a mapping (HF model outputs). None otherwise."""
    if isinstance(value, Tensor):
        return value
    if isinstance(value, (tuple, list)) and value and isinstance(value[0], Tensor):
        rest = pytree.tree_leaves(list(value[1:]))
        return None if any(isinstance(v, Tensor) for v in rest) else value[0]
    if isinstance(value, dict):
        for item in value.values():
            if isinstance(item, Tensor):
                return item
    return None


def model_output(value: Any) -> Tensor | None:
    """The output of a model that a loss reads: a tensor itself; of a mapping (a dict, an HF
    output), its ``logits`` or else its last tensor value (``{"features": h, "logits": y}``);
    of a tuple or list, its first element when it is a tensor (``(logits, aux)``)."""
    if isinstance(value, Tensor):
        return value
    if isinstance(value, dict):
        logits = value.get("logits")
        if isinstance(logits, Tensor):
            return logits
        tensors = [item for item in value.values() if isinstance(item, Tensor)]
        return tensors[-1] if tensors else None
    if isinstance(value, (tuple, list)) and value and isinstance(value[0], Tensor):
        return value[0]
    return None


def primary_key(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int | str | None:
    """Where the primary input is: the index of the first tensor argument, else the name of the
    first tensor keyword argument, else None."""
    for i, arg in enumerate(args):
        if isinstance(arg, Tensor):
            return i
    for key, value in kwargs.items():
        if isinstance(value, Tensor):
            return key
    return None


def replace_primary(
    args: tuple[Any, ...], kwargs: dict[str, Any], key: int | str, value: Any
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``(args, kwargs)`` with the argument at ``key`` (an index or a name) set to ``value``."""
    if isinstance(key, int):
        return (*args[:key], value, *args[key + 1 :]), kwargs
    return args, {**kwargs, key: value}


def _base(t: Tensor) -> Tensor:
    return t if t._base is None else t._base


def _geometry(t: Tensor) -> tuple[Any, ...]:
    return (tuple(t.shape), tuple(t.stride()), t.storage_offset(), t.dtype)


@dataclass(frozen=True)
class ViewSpec:
    """``x.as_strided(size, stride, x.storage_offset() + offset)``, checked against x's layout."""

    source: tuple[Any, ...]  # the geometry of x when traced
    size: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int


def _span(t: Tensor) -> tuple[int, int]:
    """First and last element offsets of a tensor in its storage."""
    last = t.storage_offset() + sum(
        (n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True) if n > 0
    )
    return t.storage_offset(), last


def view_relation(produced: Tensor, consumed: Tensor) -> tuple[bool, ViewSpec | None]:
    """Whether ``consumed`` is ``produced`` or a view of the memory it spans; the view to redo."""
    if consumed is produced or _geometry(consumed) == _geometry(produced):
        return True, None
    if produced.numel() == 0 or consumed.numel() == 0 or consumed.dtype != produced.dtype:
        return False, None
    low, high = _span(produced)
    first, last = _span(consumed)
    dense = produced.numel() == high - low + 1
    if not dense or first < low or last > high:
        return False, None
    spec = ViewSpec(
        source=_geometry(produced),
        size=tuple(consumed.shape),
        stride=tuple(consumed.stride()),
        offset=consumed.storage_offset() - produced.storage_offset(),
    )
    return True, spec


@dataclass(eq=False)
class _Call:
    """One module call of the tracing pass (see NOTE [ Finding the run of blocks ])."""

    start: int
    name: str
    module: nn.Module
    parents: tuple[_Call, ...]
    is_block: bool
    key: int | str | None
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    input_shape: tuple[int, ...] | None = None
    input_id: int | None = None  # id() of the primary input (alive while the call runs)
    producers: list[tuple[_Call | None, ViewSpec | None]] = field(default_factory=list)
    end: int = -1
    has_output: bool = False  # returns one tensor (registered, weakly, in _Tracer.produced)
    # the calls whose output is this call's output too (the last child of an nn.Sequential...)
    output_producers: list[tuple[_Call | None, ViewSpec | None]] = field(default_factory=list)
    taints: dict[int, int] = field(default_factory=dict)  # leaf index -> kinds

    @property
    def depth(self) -> int:
        return len(self.parents)


class _Taint(TorchFunctionMode):
    """Follows what every tensor of the tracing pass is computed from (see NOTE [ Stage
    wrappers ]): a parameter (and so any activation) or the values of the model's input."""

    # Results that depend on their tensor arguments' shape, dtype or device only.
    VALUE_FREE = frozenset(
        {
            torch.zeros_like, torch.ones_like, torch.empty_like, torch.full_like,
            torch.rand_like, torch.randn_like, torch.randint_like,
            Tensor.new_zeros, Tensor.new_ones, Tensor.new_empty, Tensor.new_full,
            Tensor.size, Tensor.dim, Tensor.numel, Tensor.element_size, Tensor.stride,
            Tensor.storage_offset,
        }
    )  # fmt: skip

    def __init__(self, tracer: _Tracer) -> None:
        super().__init__()
        self.kinds: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self.tracer = tracer

    def kind(self, t: Tensor) -> int:
        kind = self.kinds.get(t, 0)
        if isinstance(t, nn.Parameter) and t.requires_grad:
            kind |= _PARAM
        base = t._base
        if base is not None:
            kind |= self.kinds.get(base, 0)
        return kind

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func in self.VALUE_FREE:
            return out
        kind = 0
        for leaf in pytree.tree_leaves((args, kwargs)):
            if isinstance(leaf, Tensor):
                kind |= self.kind(leaf)
                self.tracer.note_use(leaf)
        if kind:
            for leaf in pytree.tree_leaves(out):
                if isinstance(leaf, Tensor):
                    self.kinds[leaf] = self.kinds.get(leaf, 0) | kind
            in_place = getattr(func, "__name__", "").endswith("_")  # add_, __setitem__...
            if in_place and args and isinstance(args[0], Tensor):
                self.kinds[args[0]] = self.kinds.get(args[0], 0) | kind
        return out


class _Tracer:
    """The tracing pass: hooks on every module and a :class:`_Taint` mode."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.names: dict[int, str] = {}
        self.blocks: set[int] = set()
        for name, module in model.named_modules(remove_duplicate=False):
            self.names.setdefault(id(module), name)
            if isinstance(module, (nn.ModuleList, nn.Sequential)):
                self.blocks.update(id(child) for child in module.children())
        self.params = {id(p): p for p in model.parameters()}
        self.buffers = {id(b): b for b in model.buffers()}
        self.calls: list[_Call] = []
        self.stack: list[_Call] = []
        self.counter = 0
        # id(base tensor) -> [(call, weakref to its output)]; None as call: the model's input
        self.produced: dict[int, list[tuple[_Call | None, weakref.ref]]] = {}
        self.direct: list[tuple[int, tuple[_Call, ...], Tensor]] = []  # (time, open calls, p)
        self.taint = _Taint(self)

    # -- bookkeeping -----------------------------------------------------------------------
    def _tick(self) -> int:
        self.counter += 1
        return self.counter

    def _keeps(self, parents: tuple[_Call, ...], is_block: bool) -> bool:
        """Whether a call is recorded in full: the blocks, and the calls inside no block (the
        inside of a block is not needed, except the blocks nested in it)."""
        return is_block or not any(p.is_block for p in parents)

    def register(self, call: _Call | None, tensor: Tensor) -> None:
        self.produced.setdefault(id(_base(tensor)), []).append((call, weakref.ref(tensor)))

    def producers_of(self, tensor: Tensor) -> list[tuple[_Call | None, ViewSpec | None]]:
        found = []
        for call, ref in self.produced.get(id(_base(tensor)), []):
            produced = ref()
            if produced is None or _base(produced) is not _base(tensor):
                continue
            related, spec = view_relation(produced, tensor)
            if related:
                found.append((call, spec))
        return found

    def note_use(self, tensor: Tensor) -> None:
        """A parameter or buffer used directly by the forward of an open call (not a leaf)."""
        if id(tensor) in self.params or id(tensor) in self.buffers:
            self.direct.append((self.counter, tuple(self.stack), tensor))

    # -- hooks ---------------------------------------------------------------------------------
    def pre(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        parents = tuple(self.stack)
        is_block = id(module) in self.blocks
        keep = self._keeps(parents, is_block)
        key = primary_key(args, kwargs) if keep else None
        call = _Call(
            start=self._tick(),
            name=self.names.get(id(module), type(module).__name__),
            module=module,
            parents=parents,
            is_block=is_block,
            key=key,
        )
        if keep and key is not None:
            primary = args[key] if isinstance(key, int) else kwargs[key]
            call.input_shape = tuple(primary.shape)
            call.input_id = id(primary)
            call.producers = self.producers_of(primary)
            call.args = tuple(_PRIMARY if i == key else a for i, a in enumerate(args))
            call.kwargs = {k: (_PRIMARY if k == key else v) for k, v in kwargs.items()}
            leaves = pytree.tree_leaves((call.args, call.kwargs))
            call.taints = {
                i: self.taint.kind(leaf)
                for i, leaf in enumerate(leaves)
                if isinstance(leaf, Tensor)
            }
        self.calls.append(call)
        self.stack.append(call)

    def post(self, module: nn.Module, args: Any, kwargs: Any, output: Any) -> None:
        call = self.stack.pop()
        call.end = self._tick()
        out = primary_output(output)
        if out is not None and self._keeps(call.parents, call.is_block):
            call.has_output = True
            call.output_producers = self.producers_of(out)
            self.register(call, out)

    @contextmanager
    def tracing(self, x: Tensor) -> Iterator[None]:
        hooks = []
        for module in self.model.modules():
            hooks.append(module.register_forward_pre_hook(self.pre, with_kwargs=True))
            hooks.append(module.register_forward_hook(self.post, with_kwargs=True))
        self.register(None, x)
        self.taint.kinds[x] = _INPUT
        try:
            with self.taint:
                yield
        finally:
            for hook in hooks:
                hook.remove()


class _Primary:
    def __repr__(self) -> str:
        return "<hidden state>"


_PRIMARY = _Primary()


# ------------------------------------------------------------------------------------------------
# Stage wrappers
# ------------------------------------------------------------------------------------------------


def redo_view(x: Tensor, spec: ViewSpec | None) -> Tensor:
    if spec is None:
        return x
    if _geometry(x)[:2] != spec.source[:2]:
        raise RuntimeError(
            f"the chain was traced for a tensor of shape {spec.source[0]} and strides "
            f"{spec.source[1]}, got {tuple(x.shape)} and {tuple(x.stride())}: linearize again"
        )
    return x.as_strided(spec.size, spec.stride, x.storage_offset() + spec.offset)


class _ViewStage(nn.Module):
    """The view of its input that the next module call reads (e.g. ``x[:, 0]``), redone."""

    def __init__(self, spec: ViewSpec) -> None:
        super().__init__()
        self.spec = spec

    def forward(self, x: Tensor) -> Tensor:
        return redo_view(x, self.spec)

    def extra_repr(self) -> str:
        return f"size={self.spec.size}, stride={self.spec.stride}, offset={self.spec.offset}"


class BlockCall(nn.Module):
    """One module call of the model as a stage: ``module(*args, **kwargs)`` with the hidden state
    in place of the traced primary input and the other arguments as traced (see NOTE [ Stage
    wrappers ]); returns the call's primary output.

    Parameters
    ----------
    module : nn.Module
        The block (or head module); registered as ``block``.
    args, kwargs
        The traced arguments, the primary input replaced by a marker; their tensors become
        non-persistent buffers ``extra0``, ``extra1``...
    input_shape : tuple of int
        The traced shape of the hidden state (checked when tensors are held).
    view : ViewSpec, optional
        A view to apply to the input first (the call read a view of the previous output).
    """

    def __init__(
        self,
        module: nn.Module,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        input_shape: tuple[int, ...] | None,
        view: ViewSpec | None = None,
    ) -> None:
        super().__init__()
        self.block = module
        leaves, self._spec = pytree.tree_flatten((args, kwargs))
        self._leaves: list[Any] = []
        self._extras: list[tuple[int, str]] = []
        for i, leaf in enumerate(leaves):
            if isinstance(leaf, Tensor):
                name = f"extra{len(self._extras)}"
                self.register_buffer(name, leaf, persistent=False)
                self._extras.append((i, name))
                self._leaves.append(None)
            else:
                self._leaves.append(leaf)
        self.input_shape = input_shape
        self.view = view

    def forward(self, x: Tensor) -> Tensor:
        x = redo_view(x, self.view)
        if self._extras and self.input_shape is not None and tuple(x.shape) != self.input_shape:
            raise RuntimeError(
                f"{type(self.block).__name__}: the chain was traced for hidden states of shape "
                f"{self.input_shape} (its other inputs, e.g. attention masks, have that size); "
                f"got {tuple(x.shape)}: linearize the model again for this input"
            )
        leaves = list(self._leaves)
        for i, name in self._extras:
            leaves[i] = getattr(self, name)
        leaves = [x if leaf is _PRIMARY else leaf for leaf in leaves]
        args, kwargs = pytree.tree_unflatten(leaves, self._spec)
        out = primary_output(self.block(*args, **kwargs))
        if out is None:
            raise RuntimeError(f"{type(self.block).__name__} no longer returns one tensor")
        return out


class _Reached(BaseException):
    """Raised by the first block's pre-hook to stop the model's forward (a BaseException, so that
    the model's own ``except Exception`` clauses do not swallow it)."""

    def __init__(self, value: Tensor) -> None:
        super().__init__()
        self.value = value


class PrefixStage(nn.Module):
    """Everything the model computes before its first block, by its own ``forward``.

    The model is held without being registered (its parameters are not this stage's); the modules
    called before the first block (``parts``) and the parameters and buffers the forward uses
    directly (``direct_params``, ``direct_buffers``) are. While it runs, the training flag of the
    modules whose ``forward`` is on the way to the first block (the model, ``transformer``...) is
    this stage's.
    """

    def __init__(
        self,
        model: nn.Module,
        call: ModelCall,
        first: nn.Module,
        key: int | str,
        parts: dict[str, nn.Module],
        params: list[nn.Parameter],
        buffers: list[Tensor],
        ancestors: list[nn.Module],
    ) -> None:
        super().__init__()
        object.__setattr__(self, "_model", model)
        object.__setattr__(self, "_first", first)
        object.__setattr__(self, "_ancestors", ancestors)
        self._call = call
        self._key = key
        self.parts = nn.ModuleDict({name.replace(".", "/"): m for name, m in parts.items()})
        self.direct_params = nn.ParameterList(params)
        for i, buffer in enumerate(buffers):
            self.register_buffer(f"direct_buffer{i}", buffer, persistent=False)

    @contextmanager
    def calling(self, call: ModelCall) -> Iterator[None]:
        """Call the model another way while inside (the arguments of one training step)."""
        before = self._call
        self._call = call
        try:
            yield
        finally:
            self._call = before

    def _stop(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        key = self._key
        value = args[key] if isinstance(key, int) else kwargs.get(key)
        if not isinstance(value, Tensor):  # called another way than traced
            value = args[primary_key(args, kwargs) or 0]
        raise _Reached(value)

    def forward(self, x: Tensor) -> Tensor:
        flags = [(m, m.training) for m in self._ancestors]
        hook = self._first.register_forward_pre_hook(self._stop, with_kwargs=True, prepend=True)
        try:
            for module, _ in flags:
                module.training = self.training
            self._call(self._model, x)
        except _Reached as reached:
            return reached.value
        finally:
            hook.remove()
            for module, training in flags:
                module.training = training
        raise RuntimeError("the model returned without calling its first block")


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
        ``calls`` (module calls after the last block), ``fx`` (a ``torch.fx`` trace) or ``none``.
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


def _usable(run: list[_Call]) -> bool:
    """A run inside one block call (an MLP ``nn.Sequential`` inside a transformer block) is a
    chain only when it is all that block does: the block's input is the run's input and its
    output the run's output (a wrapper around the blocks). Runs across blocks are kept."""
    shared = set.intersection(*({id(p) for p in c.parents if p.is_block} for c in run))
    if not shared:
        return True
    first, last = run[0], run[-1]
    inner = next(p for p in reversed(first.parents) if id(p) in shared)
    feeds_out = any(p is last and v is None for p, v in inner.output_producers)
    return feeds_out and first.input_id is not None and first.input_id == inner.input_id


def _runs(calls: list[_Call]) -> list[list[_Call]]:
    """The usable runs of blocks (see :func:`_usable`): for each block call the longest run
    ending there; longest first, then outermost, then earliest."""
    best: dict[int, tuple[int, _Call | None]] = {}
    for call in calls:
        if not call.is_block or not call.has_output or call.key is None:
            continue
        length, prev = 1, None
        for producer, view in call.producers:
            if producer is None or view is not None or id(producer) not in best:
                continue
            if best[id(producer)][0] + 1 > length:
                length, prev = best[id(producer)][0] + 1, producer
        best[id(call)] = (length, prev)
    by_id = {id(c): c for c in calls}
    runs = []
    for end in best:
        run = [by_id[end]]
        while best[id(run[-1])][1] is not None:
            run.append(best[id(run[-1])][1])
        if len(run) >= 2 and _usable(run[::-1]):
            runs.append(run[::-1])
    # a run ending at a block and the same run ending earlier: only the longest is kept
    runs.sort(key=lambda r: (-len(r), r[0].depth, r[0].start))
    kept: list[list[_Call]] = []
    seen: set[int] = set()
    for run in runs:
        if id(run[-1]) not in seen:
            kept.append(run)
            seen.update(id(c) for c in run)
    return kept[:_MAX_RUNS_TRIED]


def _relative_names(names: list[str]) -> list[str]:
    """Block paths without the dotted prefix they share above their container (``transformer.h.0``
    -> ``h.0``; ``layer1.0`` .. ``layer4.2`` stay)."""
    parts = [n.split(".") for n in names]
    common = 0
    while all(len(p) > common + 2 for p in parts) and len({p[common] for p in parts}) == 1:
        common += 1
    return [".".join(p[common:]) for p in parts]


def _leaf_kinds(call: _Call) -> list[str]:
    what = []
    for kind in call.taints.values():
        if kind & _PARAM:
            what.append("the parameters or activations")
        elif kind & _INPUT:
            what.append("the values of the input")
    return what


def _check_extras(kind: str, call: _Call) -> None:
    what = _leaf_kinds(call)
    if what:
        raise InputError(
            f"cannot linearize {kind}: {call.name} ({type(call.module).__name__}) also reads a "
            f"tensor computed from {what[0]}, not only the previous stage's output: the model "
            "is not a chain of these blocks; give it a memplan_stages() method"
        )


def _prefix(
    kind: str, model: nn.Module, call: ModelCall, tracer: _Tracer, first: _Call
) -> PrefixStage:
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
    owned = {id(t) for m in parts.values() for t in [*m.parameters(), *m.buffers()]}
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
    kind: str, last: _Call, final: list[tuple[_Call | None, ViewSpec | None]]
) -> list[nn.Module] | None:
    """Module calls from the last block's output to the model's output, in forward order (each
    preceded by the view of the previous output it reads, if any); None when something other than
    module calls and views stands between."""
    backward: list[nn.Module] = []  # the steps from the output back to the last block
    producers = final
    while True:
        for producer, view in producers:
            if producer is last:
                if view is not None:
                    backward.append(_ViewStage(view))
                return backward[::-1]
        options = [
            (c, v)
            for c, v in producers
            if c is not None and c.start > last.end and c.key is not None and c.has_output
        ]
        if not options:
            return None
        call, view = min(options, key=lambda cv: (cv[0].depth, cv[0].start - cv[0].end))
        if view is not None:
            backward.append(_ViewStage(view))
        _check_extras(kind, call)
        backward.append(BlockCall(call.module, call.args, call.kwargs, call.input_shape))
        producers = call.producers


def _head_by_fx(model: nn.Module, blocks: list[str], last: str) -> nn.Module | None:
    """The nodes of a ``torch.fx`` trace after the last block, as a GraphModule; None when the
    model cannot be traced or the part after the last block reads anything else."""
    import torch.fx as fx

    on_path = {""}
    for name in blocks:
        parts = name.split(".")
        on_path.update(".".join(parts[:i]) for i in range(1, len(parts)))
    leaves = set(blocks)

    class _Tracer(fx.Tracer):
        def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
            return qualname in leaves or qualname not in on_path

    try:
        graph = _Tracer().trace(model)
    except Exception:  # any failure to trace: fall back to the error of the caller
        return None
    nodes = list(graph.nodes)
    found = [n for n in nodes if n.op == "call_module" and n.target == last]
    outputs = [n for n in nodes if n.op == "output"]
    if len(found) != 1 or len(outputs) != 1 or not isinstance(outputs[0].args[0], fx.Node):
        return None
    start, result = found[0], outputs[0].args[0]
    after = {start}
    for node in nodes[nodes.index(start) + 1 :]:
        if node.op != "output" and any(a in after for a in node.all_input_nodes):
            after.add(node)
    if result not in after:
        return None
    needed, todo = set(), [result]
    while todo:
        node = todo.pop()
        if node in needed or node is start:
            continue
        needed.add(node)
        for arg in node.all_input_nodes:
            if arg not in after and arg.op != "get_attr":
                return None  # the head reads something computed before the last block
            todo.append(arg)
    head = fx.Graph()
    env: dict[fx.Node, fx.Node] = {start: head.placeholder("x")}
    for node in nodes:
        if node in needed:
            for arg in node.all_input_nodes:
                if arg not in env:  # get_attr: a parameter or buffer of the model
                    env[arg] = head.node_copy(arg)
            env[node] = head.node_copy(node, lambda a: env[a])
    head.output(env[result])
    return fx.GraphModule(model, head, class_name="Head")


def _cut(
    kind: str,
    model: nn.Module,
    call: ModelCall,
    tracer: _Tracer,
    run: list[_Call],
    final: list[tuple[_Call | None, ViewSpec | None]],
    floating_input: bool,
) -> RepeatedBlocks:
    """The stages for one run (InputError when it does not make a chain)."""
    first, last = run[0], run[-1]
    names = [c.name for c in run]
    stages: list[tuple[str, nn.Module]] = []
    prefix = not any(p is None and v is None for p, v in first.producers)
    if prefix:
        stages.append(
            ("stem" if floating_input else "embedding", _prefix(kind, model, call, tracer, first))
        )
    for c, label in zip(run, _relative_names(names), strict=True):
        _check_extras(kind, c)
        stages.append((label, BlockCall(c.module, c.args, c.kwargs, c.input_shape)))
    head = _head_by_calls(kind, last, final)
    head_by = "calls" if head else "none"
    head_modules = [m.block for m in head or [] if isinstance(m, BlockCall)]
    output_module = head_modules[-1] if head_modules else None
    if head is None:
        fx_head = _head_by_fx(model, names, last.name)
        if fx_head is None:
            raise InputError(
                f"cannot linearize {kind}: what follows its last block {last.name} is not a "
                "sequence of module calls and cannot be traced by torch.fx; give it a "
                "memplan_stages() method returning [(name, module), ...]"
            )
        head, head_by = [fx_head], "fx"
    if head:
        stages.append(("head", head[0] if len(head) == 1 else nn.Sequential(*head)))
    _check_body(kind, tracer, run, prefix, bool(head))
    return RepeatedBlocks(
        stages=stages, blocks=names, head_by=head_by,
        block_modules=[c.module for c in run],
        block_keys=[c.key for c in run if c.key is not None],
        head_modules=head_modules, output_module=output_module, prefix=prefix,
    )  # fmt: skip


def _chain_output(
    kind: str, stages: list[tuple[str, nn.Module]], x: Tensor, inplace: list[bool]
) -> Tensor:
    """Run the stages in eval mode without gradients; each must return a floating tensor."""
    with eval_mode(*(m for _, m in stages)), torch.no_grad():
        return run_stages(kind, stages, x.clone(), inplace)


def _leaf_calls(calls: list[_Call], start: int, end: int) -> int:
    """Calls of modules without children (the layers) that start within ``(start, end)``."""
    return sum(
        1 for c in calls if start < c.start < end and next(c.module.children(), None) is None
    )


def _check_body(kind: str, tracer: _Tracer, run: list[_Call], prefix: bool, head: bool) -> None:
    """Refuse a cut whose blocks are not the body of the model: when the part before the first
    block or after the last one calls more layers than the blocks do (a U-Net, whose
    contracting path is one run of blocks and whose expanding path reads its outputs; an
    encoder-decoder), the chain would be a few small stages and one holding most of the model,
    which no plan can use."""
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
    call = call or _call_model
    pick = output or model_output
    tracer = _Tracer(model)
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
        runs = _runs(tracer.calls)
        tracer.produced.clear()
        if not runs:
            raise InputError(
                f"cannot linearize {kind}: no run of repeated blocks (children of an "
                "nn.ModuleList or nn.Sequential, each fed by the previous one's output) was "
                "found; give it a memplan_stages() method returning [(name, module), ...]"
            )
        failure: InputError | None = None
        for run in runs:
            try:
                found = _cut(
                    kind, model, call, tracer, run, final, example_input.is_floating_point()
                )
                inplace: list[bool] = []
                out = _chain_output(kind, found.stages, example_input, inplace)
            except InputError as exc:
                failure = failure or exc
                continue
            if out.shape != result.shape:
                failure = failure or InputError(
                    f"cannot linearize {kind}: the chain's output {tuple(out.shape)} differs "
                    f"from the model's {tuple(result.shape)}"
                )
                continue
            if not outputs_match(out, result):
                diff = (out.double() - result.double()).abs().max().item()
                failure = failure or InputError(
                    f"cannot linearize {kind}: the chain does not reproduce the model's output "
                    f"(max abs difference {diff:.3g})"
                )
                continue
            found.output = out
            found.inplace = inplace
            return found
    assert failure is not None
    raise failure


def repeated_block_stages(
    model: nn.Module,
    example_input: Tensor,
    *,
    call: ModelCall | None = None,
    output: Callable[[Any], Any] | None = None,
) -> list[tuple[str, nn.Module]]:
    """The stages of :func:`find_repeated_blocks` (loss excluded)."""
    return find_repeated_blocks(model, example_input, call=call, output=output).stages
