"""The tracing pass of the repeated-block cut: every module call, and what each tensor is computed
from (NOTE [ Finding the run of blocks ] and NOTE [ Stage wrappers ] in
:mod:`memplan.torch.split.repeated`).
"""

from __future__ import annotations

import copy
import weakref
from collections import UserDict
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree
from torch.utils.weak import WeakIdKeyDictionary

__all__ = [
    "FLOATING",
    "FROM_BLOCK",
    "FROM_INPUT",
    "FROM_PARAM",
    "MAX_RUNS_TRIED",
    "PRIMARY",
    "ModelCall",
    "TracedCall",
    "Tracer",
    "ViewSpec",
    "call_leaves",
    "call_model",
    "copy_mappings",
    "direct_leaves",
    "holds_mappings",
    "model_output",
    "primary_key",
    "primary_output",
    "replace_primary",
    "uncopyable_mapping",
    "view_geometry",
    "view_relation",
]

ModelCall = Callable[[nn.Module, Tensor], Any]
"""How to call a model on the chain input: ``call(model, x)`` (default ``model(x)``)."""

FROM_PARAM = 1  # computed from a parameter (or from anything computed from one: activations)
FROM_INPUT = 2  # computed from the values of the model's input
FROM_BLOCK = 4  # computed from a parameter inside a block call (an activation of a block)
FLOATING = 8  # (in TracedCall.taints only) a floating-point tensor: one that gradients reach
MAX_RUNS_TRIED = 8


def call_model(model: nn.Module, x: Tensor) -> Any:
    return model(x)


def primary_output(value: Any) -> Tensor | None:
    """The tensor a call returns: itself, the first element of a tuple/list (a block's hidden
    state, before what else it returns: BLOOM's and GPT-Neo's attention weights), or the first
    tensor value of a mapping (HF model outputs). None otherwise.
    """
    if isinstance(value, Tensor):
        return value
    if isinstance(value, (tuple, list)) and value and isinstance(value[0], Tensor):
        return value[0]
    if isinstance(value, dict):
        for item in value.values():
            if isinstance(item, Tensor):
                return item
    return None


def model_output(value: Any) -> Tensor | None:
    """The output of a model that a loss reads: a tensor itself; of a mapping (a dict, an HF
    output), its ``logits`` or else its last tensor value (``{"features": h, "logits": y}``);
    of a tuple or list, its first element when it is a tensor (``(logits, aux)``).
    """
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
    first tensor keyword argument, else None.
    """
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


def view_geometry(t: Tensor) -> tuple[Any, ...]:
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
    if consumed is produced or view_geometry(consumed) == view_geometry(produced):
        return True, None
    if produced.numel() == 0 or consumed.numel() == 0 or consumed.dtype != produced.dtype:
        return False, None
    low, high = _span(produced)
    first, last = _span(consumed)
    dense = produced.numel() == high - low + 1
    if not dense or first < low or last > high:
        return False, None
    spec = ViewSpec(
        source=view_geometry(produced),
        size=tuple(consumed.shape),
        stride=tuple(consumed.stride()),
        offset=consumed.storage_offset() - produced.storage_offset(),
    )
    return True, spec


@dataclass(eq=False)
class TracedCall:
    """One module call of the tracing pass (see NOTE [ Finding the run of blocks ])."""

    start: int
    name: str
    module: nn.Module
    parents: tuple[TracedCall, ...]
    is_block: bool
    key: int | str | None
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    input_shape: tuple[int, ...] | None = None
    input_id: int | None = None  # id() of the primary input (alive while the call runs)
    producers: list[tuple[TracedCall | None, ViewSpec | None]] = field(default_factory=list)
    end: int = -1
    has_output: bool = False  # returns one tensor (registered, weakly, in Tracer.produced)
    # the calls whose output is this call's output too (the last child of an nn.Sequential...)
    output_producers: list[tuple[TracedCall | None, ViewSpec | None]] = field(default_factory=list)
    taints: dict[int, int] = field(default_factory=dict)  # leaf index -> kinds (and FLOATING)

    @property
    def depth(self) -> int:
        return len(self.parents)


class _Taint(TorchFunctionMode):
    """Follows what every tensor of the tracing pass is computed from (see NOTE [ Stage
    wrappers ]): a parameter (and so any activation) or the values of the model's input.
    """

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

    def __init__(self, tracer: Tracer) -> None:
        super().__init__()
        self.kinds: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self.tracer = tracer

    def kind(self, t: Tensor) -> int:
        kind = self.kinds.get(t, 0)
        if isinstance(t, nn.Parameter) and t.requires_grad:
            kind |= FROM_PARAM
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
        if kind & FROM_PARAM and any(c.is_block for c in self.tracer.stack):
            kind |= FROM_BLOCK
        if kind:
            for leaf in pytree.tree_leaves(out):
                if isinstance(leaf, Tensor):
                    self.kinds[leaf] = self.kinds.get(leaf, 0) | kind
            in_place = getattr(func, "__name__", "").endswith("_")  # add_, __setitem__...
            if in_place and args and isinstance(args[0], Tensor):
                self.kinds[args[0]] = self.kinds.get(args[0], 0) | kind
        return out


class Tracer:
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
        self.calls: list[TracedCall] = []
        self.stack: list[TracedCall] = []
        self.counter = 0
        # id(base tensor) -> [(call, weakref to its output)]; None as call: the model's input
        self.produced: dict[int, list[tuple[TracedCall | None, weakref.ref]]] = {}
        self.direct: list[tuple[int, tuple[TracedCall, ...], Tensor]] = []  # (time, open calls, p)
        self.taint = _Taint(self)

    # -- bookkeeping -----------------------------------------------------------------------
    def _tick(self) -> int:
        self.counter += 1
        return self.counter

    def _keeps(self, parents: tuple[TracedCall, ...], is_block: bool) -> bool:
        """Whether a call is recorded in full: the blocks, and the calls inside no block (the
        inside of a block is not needed, except the blocks nested in it).
        """
        return is_block or not any(p.is_block for p in parents)

    def register(self, call: TracedCall | None, tensor: Tensor) -> None:
        self.produced.setdefault(id(_base(tensor)), []).append((call, weakref.ref(tensor)))

    def producers_of(self, tensor: Tensor) -> list[tuple[TracedCall | None, ViewSpec | None]]:
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
        call = TracedCall(
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
            call.args = tuple(PRIMARY if i == key else a for i, a in enumerate(args))
            call.kwargs = {k: (PRIMARY if k == key else v) for k, v in kwargs.items()}
            if holds_mappings((call.args, call.kwargs)):  # what it reads now, not what later
                call.args, call.kwargs = copy_mappings(call.args, call.kwargs)  # blocks write
            leaves = call_leaves(call)
            call.taints = {
                i: self.taint.kind(leaf) | (FLOATING if leaf.is_floating_point() else 0)
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
    def tracing(self, x: Tensor, calls: bool = True) -> Iterator[None]:
        """Trace a run of the model on ``x`` inside: its module calls (unless ``calls`` is
        False) and what every tensor is computed from.
        """
        hooks = []
        for module in self.model.modules() if calls else ():
            hooks.append(module.register_forward_pre_hook(self.pre, with_kwargs=True))
            hooks.append(module.register_forward_hook(self.post, with_kwargs=True))
        self.register(None, x)
        self.taint.kinds[x] = FROM_INPUT
        try:
            with self.taint:
                yield
        finally:
            for hook in hooks:
                hook.remove()


def call_leaves(call: TracedCall) -> list[Any]:
    """The arguments of ``call`` as the indices of :attr:`TracedCall.taints` number them: the
    leaves of its arguments, then the tensors the mappings among them hold.
    """
    leaves = [*pytree.tree_leaves((call.args, call.kwargs))]
    return leaves + [t for leaf in leaves for t in _held(leaf)]


def direct_leaves(call: TracedCall) -> int:
    """How many of :func:`call_leaves` are the leaves of the arguments themselves (the rest are
    tensors the mappings among them hold).
    """
    return len(pytree.tree_leaves((call.args, call.kwargs)))


def _held(value: Any) -> list[Tensor]:
    """The tensors a mapping that pytree does not open holds (its values, or tuples of them):
    Gemma-4's ``KVSharingDict`` of the keys and values an earlier layer stored for a later one.
    """
    if isinstance(value, Tensor) or not isinstance(value, Mapping):
        return []
    found = []
    for item in value.values():
        items = item if isinstance(item, (tuple, list)) else (item,)
        found += [t for t in items if isinstance(t, Tensor)]
    return found


def _copyable(value: Any) -> bool:
    """A mapping that pytree does not open and a shallow copy makes independent of: a
    ``UserDict`` (Gemma-4's ``KVSharingDict``) or a ``dict`` subclass.
    """
    return isinstance(value, (UserDict, dict))


def holds_mappings(tree: Any) -> bool:
    """Whether the leaves of ``tree`` include a mapping :func:`copy_mappings` copies."""
    return any(_copyable(leaf) for leaf in pytree.tree_leaves(tree))


def uncopyable_mapping(call: TracedCall) -> str | None:
    """The type name of a mutable mapping among the arguments of ``call`` that pytree does not
    open and :func:`copy_mappings` cannot copy (a block could write into it), or None.
    """
    for leaf in pytree.tree_leaves((call.args, call.kwargs)):
        if isinstance(leaf, MutableMapping) and not _copyable(leaf):
            return type(leaf).__name__
    return None


def copy_mappings(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple, dict]:
    """``(args, kwargs)`` with each mapping among their leaves that pytree does not open
    replaced by a shallow copy (NOTE [ A mapping the blocks share ] in
    :mod:`memplan.torch.split.repeated`): a call on the copy reads what the mapping held, and
    what it writes goes into the copy, which the caller drops.
    """
    leaves, spec = pytree.tree_flatten((args, kwargs))
    copied = [copy.copy(leaf) if _copyable(leaf) else leaf for leaf in leaves]
    new_args, new_kwargs = pytree.tree_unflatten(copied, spec)
    return new_args, new_kwargs


class _Primary:
    def __repr__(self) -> str:
        return "<hidden state>"


PRIMARY = _Primary()
