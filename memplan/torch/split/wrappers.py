"""The stage wrappers of the repeated-block cut: a block, the part before the first block, a view
between two stages, each as a stage reading one tensor (NOTE [ Stage wrappers ] in
:mod:`memplan.torch.split.repeated`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils import _pytree as pytree

from memplan.errors import InputError
from memplan.torch.split.tape import Tape
from memplan.torch.split.trace import (
    PRIMARY,
    ModelCall,
    ViewSpec,
    copy_mappings,
    holds_mappings,
    primary_key,
    primary_output,
    view_geometry,
)

__all__ = ["BlockCall", "PrefixStage", "TapeStage", "ViewStage", "redo_view", "side_gradient_bytes"]


def redo_view(x: Tensor, spec: ViewSpec | None) -> Tensor:
    if spec is None:
        return x
    if view_geometry(x)[:2] != spec.source[:2]:
        raise RuntimeError(
            f"the chain was traced for a tensor of shape {spec.source[0]} and strides "
            f"{spec.source[1]}, got {tuple(x.shape)} and {tuple(x.stride())}: linearize again"
        )
    return x.as_strided(spec.size, spec.stride, x.storage_offset() + spec.offset)


class ViewStage(nn.Module):
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
        self._mappings = holds_mappings((args, kwargs))  # each call gets copies of them
        self.side_bytes = 0
        """Of the held tensors, the bytes the model computed from parameters before the blocks
        (NOTE [ A side input with a gradient ] in :mod:`memplan.torch.split.repeated`): the
        profile counts them once for the chain, not in this stage's ``weight_size``."""
        self.side_pointers: frozenset[int] = frozenset()
        """The storages of those tensors (data pointers)."""

    @property
    def holds_batch_tensors(self) -> bool:
        """Whether the call holds traced tensors besides the hidden state and so runs on hidden
        states of the traced shape only (an attention mask).
        """
        return bool(self._extras) and self.input_shape is not None

    def forward(self, x: Tensor) -> Tensor:
        x = redo_view(x, self.view)
        if self.holds_batch_tensors and tuple(x.shape) != self.input_shape:
            raise RuntimeError(
                f"{type(self.block).__name__}: the chain was traced for hidden states of shape "
                f"{self.input_shape} (its other inputs, e.g. attention masks, have that size); "
                f"got {tuple(x.shape)}: linearize the model again for this input"
            )
        leaves = list(self._leaves)
        for i, name in self._extras:
            leaves[i] = getattr(self, name)
        leaves = [x if leaf is PRIMARY else leaf for leaf in leaves]
        args, kwargs = pytree.tree_unflatten(leaves, self._spec)
        if self._mappings:  # NOTE [ A mapping the blocks share ] in split/repeated.py
            args, kwargs = copy_mappings(args, kwargs)
        out = primary_output(self.block(*args, **kwargs))
        if out is None:
            raise RuntimeError(f"{type(self.block).__name__} no longer returns one tensor")
        return out


def _same_values(x: Tensor, traced: Tensor) -> bool:
    return x.shape == traced.shape and bool(torch.equal(x, traced.to(x.device)))


class _Reached(BaseException):
    """Raised by the first block's pre-hook to stop the model's forward (a BaseException, so that
    the model's own ``except Exception`` clauses do not swallow it).
    """

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
        self._stepping = False
        self.chain_refusal: str | None = None  # why the chain API cannot train on this stage
        self.side_gradient_bytes = 0
        """Bytes of what the blocks read that the model computed here from parameters (NOTE
        [ A side input with a gradient ] in :mod:`memplan.torch.split.repeated`)."""
        self.parts = nn.ModuleDict({name.replace(".", "/"): m for name, m in parts.items()})
        self.direct_params = nn.ParameterList(params)
        for i, buffer in enumerate(buffers):
            self.register_buffer(f"direct_buffer{i}", buffer, persistent=False)

    def traced_for(self, x: Tensor, trains: bool = True) -> None:
        """The chain's blocks also read tensors computed from the values of ``x`` (NOTE [ Stage
        wrappers ]): the chain computes the model on ``x`` only, which is checked; with
        ``trains`` False, from the parameters too (a top-k of an earlier block), so that it
        computes the model as it is now only: it measures it, it does not train it
        (:attr:`chain_refusal`).
        """
        self.register_buffer("traced_input", x.detach().clone(), persistent=False)
        if not trains:
            self.chain_refusal = (
                f"the chain of {type(self._model).__name__} holds what its blocks read besides "
                "their hidden state as traced, and some of it is computed from the parameters "
                "(an earlier block's top-k or keys, a learned position bias): it would not "
                "change as they train, nor pass its gradient on; train the model "
                "with memplan.torch.enable(model, memory, example_input=batch), which passes "
                "each step's own"
            )

    @contextmanager
    def calling(self, call: ModelCall) -> Iterator[None]:
        """Call the model another way while inside (the arguments of one training step)."""
        before = self._call
        self._call = call
        self._stepping = True
        try:
            yield
        finally:
            self._call = before
            self._stepping = False

    def _stop(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        key = self._key
        value = args[key] if isinstance(key, int) else kwargs.get(key)
        if not isinstance(value, Tensor):  # called another way than traced
            value = args[primary_key(args, kwargs) or 0]
        raise _Reached(value)

    def forward(self, x: Tensor) -> Tensor:
        traced = getattr(self, "traced_input", None)
        if traced is not None and not self._stepping and not _same_values(x, traced):
            raise InputError(
                f"the chain of {type(self._model).__name__} computes it on the batch it was cut "
                "for only: its blocks also read tensors computed from the values of that batch "
                "(token ids); train it with memplan.torch.enable(model, memory, "
                "example_input=batch), which passes each batch's own to the model"
            )
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


def side_gradient_bytes(stages: list[nn.Module]) -> int:
    """Bytes of the tensors a chain's first stage computes from parameters for every block to
    read (:attr:`PrefixStage.side_gradient_bytes`), or, without such a stage, those the head
    reads besides the last block's output (:attr:`TapeStage.side_gradient_bytes`): the
    profile's ``side_gradient_size``.
    """
    return sum(m.side_gradient_bytes for m in stages if isinstance(m, (PrefixStage, TapeStage)))


class TapeStage(nn.Module):
    """What a model computes after its last block, replayed from tapes of the example's forward
    (NOTE [ The head on a tape ] in :mod:`memplan.torch.split.tape`): one recorded in eval mode,
    one in training mode (their functional dropouts differ), replayed in the stage's mode.

    The tensors the tapes read besides their input are the stage's: parameters in
    ``direct_params``, buffers and other tensors (an attention mask) as non-persistent buffers
    ``constant0``, ``constant1``..., which follow ``.to()``.

    Parameters
    ----------
    eval_tape, training_tape : Tape
        The recorded operations, ending with the model's output.
    input_shape : tuple of int
        The traced shape of the head's input, checked when the tapes read tensors that are not
        the model's (``owned``): they were computed for a batch of that shape.
    owned : set of int
        ``id()`` of the model's parameters and buffers.
    """

    def __init__(
        self, eval_tape: Tape, training_tape: Tape, input_shape: tuple[int, ...], owned: set[int]
    ) -> None:
        super().__init__()
        self.eval_tape = eval_tape
        self.training_tape = training_tape
        self.input_shape = input_shape
        constants = list(
            {id(t): t for t in [*eval_tape.constants(), *training_tape.constants()]}.values()
        )
        params = [t for t in constants if isinstance(t, nn.Parameter)]
        self.direct_params = nn.ParameterList(params)
        self._params = [(id(p), i) for i, p in enumerate(params)]
        self._names: list[tuple[int, str]] = []
        for t in constants:
            if not isinstance(t, nn.Parameter):
                name = f"constant{len(self._names)}"
                self.register_buffer(name, t, persistent=False)
                self._names.append((id(t), name))
        self.batch_data = any(id(t) not in owned for t in constants)
        self.side_bytes = 0
        """Of the constants, the bytes computed from parameters before the head (an earlier
        block's activation: NOTE [ A side input with a gradient ] in
        :mod:`memplan.torch.split.repeated`), counted once for the chain, not here."""
        self.side_pointers: frozenset[int] = frozenset()
        """The storages of those constants (data pointers)."""
        self.side_tensors: list[Tensor] = []
        """Those of the training-mode tape."""
        self.side_gradient_bytes = 0
        """Where no stage comes before the blocks: :attr:`side_bytes` and what the blocks read
        besides their hidden state, counted here for the chain (as
        :attr:`PrefixStage.side_gradient_bytes`)."""
        self.chain_refusal: str | None = None  # why the chain API cannot train on this stage

    def forward(self, x: Tensor) -> Tensor:
        if self.batch_data and tuple(x.shape) != self.input_shape:
            raise RuntimeError(
                f"the head was traced for hidden states of shape {self.input_shape} (it also "
                f"reads tensors of that batch); got {tuple(x.shape)}: linearize the model again"
            )
        constants = {key: getattr(self, name) for key, name in self._names}
        constants.update({key: self.direct_params[i] for key, i in self._params})
        tape = self.training_tape if self.training else self.eval_tape
        return tape.replay(x, constants)

    def extra_repr(self) -> str:
        return f"operations={len(self.training_tape.events)}"
