"""Capture a whole training step as an operator-level graph (the graph family, OLLA (Steiner et al. 2022)).

:func:`capture_graph` traces one step of training, forward + ``loss.backward()`` +
``optimizer.step()`` (SGD), with ``make_fx`` under ``FakeTensorMode``: no memory is allocated and
nothing is computed, yet every operator (ATen level) and the size of every tensor are recorded.
The FX graph is then turned into the ``graph:`` section of a profile (docs/formats.md), following
these rules so that sizes and lifetimes are those of the real step:

1. **Storages, not tensor objects.** A tensor of the graph is a storage (``untyped_storage``); its
   size is the storage's bytes. A *view* (``view``, ``t``, ``expand``, ``detach``, ``getitem`` on
   a multi-output op, ...) shares its base's storage: it creates no tensor, its node is dropped, and
   the nodes that read the view read the base storage (which thus lives until the last of them).
2. **In-place ops** (``relu_``, ``add_``, the optimizer's ``param.add_(grad)``, batch norm's
   running statistics): the node reads and writes an existing storage; it is one more consumer of
   that storage and creates nothing.
3. **Ordering of in-place writes.** To keep every reordering semantically equal to the traced
   step, a write is ordered after the earlier readers and writer of the storage, and later readers
   after the write, through *control edges*: tensors of size 0 (named ``ctl:NODE``) from a node to
   the nodes that must follow it.
4. **Kinds.** Placeholders are ``weight`` (parameters and buffers: resident the whole step) or
   ``input`` (the batch and its targets); operators are ``forward``, ``backward`` or ``optimizer``
   after the phase of the step that ran them (markers set while tracing).
5. **Times** are 0: a fake tensor computes nothing (sizes do not depend on the device).

The order of ``nodes`` is the order PyTorch ran the operators (forward, then the autograd engine's
backward order, then the optimizer's loop over the parameters): the ``framework`` baseline.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

import memplan
from memplan.errors import InputError
from memplan.profile.graph import Graph, GraphNode, GraphTensor
from memplan.profile.model import Device, Measured, Profile
from memplan.torch.models.registry import MODELS, build_model, example_input

SKIP_TARGETS = ("profiler._record_function",)
"""Operators that touch no tensor memory (dropped)."""


def _train_step(model: nn.Module, lr: float = 0.01) -> Callable[..., None]:
    """Forward + loss.backward() + optimizer.step() on explicit parameters and buffers."""

    def step(params: dict[str, Tensor], buffers: dict[str, Tensor], x: Tensor, y: Tensor) -> None:
        from torch.fx.experimental.proxy_tensor import get_proxy_mode

        mode = get_proxy_mode()
        marks = getattr(step, "marks", None)
        for p in params.values():
            p.grad = None
        out = torch.func.functional_call(model, {**params, **buffers}, (x,))
        if isinstance(out, tuple):  # Inception-like (logits, aux)
            out = out[0]
        if out.dim() == 3:  # language model: (batch, seq, vocab) against (batch, seq)
            loss = F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
        else:
            loss = F.cross_entropy(out, y)
        if marks is not None and mode is not None:
            marks.append(len(mode.tracer.graph.nodes))
        loss.backward()
        if marks is not None and mode is not None:
            marks.append(len(mode.tracer.graph.nodes))
        optimizer = torch.optim.SGD(list(params.values()), lr=lr, foreach=False)
        optimizer.step()
        for p in params.values():
            p.grad = None

    return step


def capture_graph(
    model: str | nn.Module,
    *,
    batch_size: int | None = None,
    input_shape: tuple[int, ...] | None = None,
    dtype: str = "float32",
) -> tuple[Graph, dict[str, Any]]:
    """Trace one training step of ``model`` and return its graph and some metadata.

    Parameters
    ----------
    model : str or nn.Module
        A name of :data:`memplan.torch.models.registry.MODELS` (or a ``package.module:factory`` spec), or a
        module (its parameters become fake copies; the module is left untouched).
    batch_size, input_shape :
        As for :func:`memplan.torch.models.registry.build_model`.
    dtype : str
        ``float32``, ``bfloat16`` or ``float16``.

    Returns
    -------
    (Graph, dict)
        The validated graph and ``{"model", "batch_size", "input_shape", "dtype",
        "fx_nodes"}``.
    """
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if dtype not in torch_dtype:
        raise InputError(f"--dtype {dtype!r}: expected one of {', '.join(torch_dtype)}")
    if isinstance(model, str):
        name = model
        if model in MODELS:
            with torch.device("meta"):
                module = MODELS[model]()
            x = example_input(module, batch_size, input_shape)
        else:
            module, x, name = build_model(model, batch_size=batch_size, input_shape=input_shape)
    else:
        module, name = model, type(model).__name__
        x = example_input(module, batch_size, input_shape)
    module.train()
    if x.is_floating_point():
        x = x.to(torch_dtype[dtype])
    mode = FakeTensorMode(allow_non_fake_inputs=False)
    with mode:  # fake CPU copies of the state (the module may live on the meta device)
        params = {
            k: torch.empty(v.shape, dtype=torch_dtype[dtype]).requires_grad_(True)
            for k, v in module.named_parameters()
        }
        buffers = {k: torch.empty(v.shape, dtype=v.dtype) for k, v in module.named_buffers()}
    fake_x = mode.from_tensor(x)
    with mode:
        logits_shape = _output_shape(module, params, buffers, fake_x)
    if len(logits_shape) == 3:
        y = torch.zeros(logits_shape[:2], dtype=torch.long)
    else:
        y = torch.zeros(logits_shape[:1], dtype=torch.long)
    fake_y = mode.from_tensor(y)
    step = _train_step(module)
    marks: list[int] = []
    step.marks = marks  # type: ignore[attr-defined]
    try:
        with mode:  # tensors the model creates while running (positions, masks) are fake too
            traced = make_fx(step, tracing_mode="real")(params, buffers, fake_x, fake_y)
    except (RuntimeError, TypeError, ValueError, AssertionError) as exc:
        raise InputError(f"model {name!r}: cannot trace a training step: {exc}") from None
    names = list(params) + list(buffers)
    graph = fx_to_graph(traced.graph, names, len(params), marks)
    info = {
        "model": name,
        "batch_size": int(x.shape[0]),
        "input_shape": [int(d) for d in x.shape[1:]],
        "dtype": dtype,
        "fx_nodes": len(traced.graph.nodes),
    }
    return graph, info


def _output_shape(module, params, buffers, x) -> tuple[int, ...]:
    with torch.no_grad():
        out = torch.func.functional_call(module, {**params, **buffers}, (x,))
    if isinstance(out, tuple):
        out = out[0]
    return tuple(out.shape)


def _storage_key(t: Any) -> int | None:
    if not isinstance(t, Tensor):
        return None
    return t.untyped_storage()._cdata  # noqa: SLF001 - identity of the storage


def _flat_tensors(value: Any) -> list[Tensor]:
    if isinstance(value, Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _flat_tensors(v)]
    return []


def _arg_nodes(node: torch.fx.Node) -> list[torch.fx.Node]:
    found: list[torch.fx.Node] = []

    def visit(a: Any) -> None:
        if isinstance(a, torch.fx.Node):
            found.append(a)
        elif isinstance(a, (list, tuple)):
            for b in a:
                visit(b)
        elif isinstance(a, dict):
            for b in a.values():
                visit(b)

    visit(node.args)
    visit(node.kwargs)
    return found


def _written_args(node: torch.fx.Node) -> list[torch.fx.Node]:
    """The argument nodes an ATen op writes in place (schema alias annotations ``a!``)."""
    schema = getattr(node.target, "_schema", None)
    if schema is None:
        return []
    written: list[torch.fx.Node] = []
    for k, arg in enumerate(schema.arguments):
        info = arg.alias_info
        if info is None or not info.is_write:
            continue
        value = node.args[k] if k < len(node.args) else node.kwargs.get(arg.name)
        items = value if isinstance(value, (list, tuple)) else [value]
        written += [v for v in items if isinstance(v, torch.fx.Node)]
    return written


def _op_name(target: Any) -> str:
    packet = getattr(target, "overloadpacket", None)
    if packet is not None:
        return str(packet)
    return getattr(target, "__name__", str(target))


def fx_to_graph(  # noqa: C901 - one case per kind of FX node, in docs/formats.md's order
    fx_graph: torch.fx.Graph, state_names: list[str], n_params: int, marks: list[int]
) -> Graph:
    """Turn a traced training step into a :class:`Graph` (rules in the module docstring).

    ``state_names`` names the first placeholders (parameters, then buffers); the next two are the
    batch and its targets. ``marks`` are the FX node counts when the backward and the optimizer
    step began.

    Long because: one pass over the FX nodes, one case per kind of node in the rules' order (a
    placeholder, a call that reads, writes or makes storages), each case updating the records of
    every storage (its tensor, last writer, readers, the control edges) that the next nodes read.
    """
    fwd_end = marks[0] if marks else 10**12
    bwd_end = marks[1] if len(marks) > 1 else 10**12
    nodes: list[GraphNode] = []
    storages: dict[int, dict[str, Any]] = {}  # storage key -> tensor record
    tensors: list[dict[str, Any]] = []
    last_writer: dict[int, str] = {}
    readers: dict[int, list[str]] = {}
    control: dict[str, list[str]] = {}

    def new_tensor(key: int, name: str, size: int, producer: str) -> None:
        record = {"name": name, "size": size, "producer": producer, "consumers": []}
        storages[key] = record
        tensors.append(record)
        last_writer[key] = producer
        readers[key] = []

    def add_control(src: str, dst: str) -> None:
        if src != dst and dst not in control.setdefault(src, []):
            control[src].append(dst)

    placeholder = 0
    for index, node in enumerate(fx_graph.nodes):
        val = node.meta.get("val")
        if node.op == "placeholder":
            tensors_here = _flat_tensors(val)
            if not tensors_here:
                continue
            if placeholder < len(state_names):
                label = state_names[placeholder]
                kind, op = "weight", "parameter" if placeholder < n_params else "buffer"
            else:
                label = ("input", "target")[min(placeholder - len(state_names), 1)]
                if placeholder - len(state_names) > 1:
                    label = f"input{placeholder - len(state_names)}"
                kind, op = "input", "input"
            placeholder += 1
            nodes.append(GraphNode(name=label, op=op, kind=kind))
            t = tensors_here[0]
            new_tensor(_storage_key(t), label, t.untyped_storage().nbytes(), label)
            continue
        if node.op != "call_function":
            continue
        if node.target is operator.getitem or any(
            str(node.target).startswith(s) for s in SKIP_TARGETS
        ):
            continue
        inputs: list[int] = []
        for arg in _arg_nodes(node):
            for t in _flat_tensors(arg.meta.get("val")):
                key = _storage_key(t)
                if key in storages and key not in inputs:
                    inputs.append(key)
        written = []
        for arg in _written_args(node):
            for t in _flat_tensors(arg.meta.get("val")):
                key = _storage_key(t)
                if key in storages and key not in written:
                    written.append(key)
        outputs = []
        for t in _flat_tensors(val):
            key = _storage_key(t)
            if key is not None and key not in storages and key not in [k for k, _ in outputs]:
                outputs.append((key, t))
        if not outputs and not written:
            continue  # a view (or an op on views only): no memory of its own, rule 1
        kind = "forward" if index < fwd_end else "backward" if index < bwd_end else "optimizer"
        name = node.name
        nodes.append(GraphNode(name=name, op=_op_name(node.target), kind=kind))
        for key in inputs:
            if name not in storages[key]["consumers"]:
                storages[key]["consumers"].append(name)
            writer = last_writer[key]
            if writer != storages[key]["producer"]:
                add_control(writer, name)  # read after the last in-place write (rule 3)
        for key in written:
            for reader in readers[key]:
                add_control(reader, name)  # write after the earlier reads (rule 3)
            writer = last_writer[key]
            if writer != storages[key]["producer"]:
                add_control(writer, name)
            last_writer[key] = name
            readers[key] = []
        for key in inputs:
            if key not in written:
                readers[key].append(name)
        for k, (key, t) in enumerate(outputs):
            label = name if len(outputs) == 1 else f"{name}.{k}"
            new_tensor(key, label, t.untyped_storage().nbytes(), name)

    # control edges already implied by a data dependency add nothing
    data = {(t["producer"], c) for t in tensors for c in t["consumers"]}
    graph_tensors = [GraphTensor(**t) for t in tensors]
    for src, dsts in control.items():
        needed = [d for d in dsts if (src, d) not in data]
        if needed:
            graph_tensors.append(
                GraphTensor(name=f"ctl:{src}", size=0, producer=src, consumers=needed)
            )
    return Graph(nodes=nodes, tensors=graph_tensors)


def profile_graph(
    model: str | nn.Module,
    *,
    batch_size: int | None = None,
    input_shape: tuple[int, ...] | None = None,
    dtype: str = "float32",
    name: str | None = None,
) -> Any:
    """A graph-only ``memplan-profile/1`` :class:`~memplan.Profile` of one training step.

    What ``memplan profile MODEL --graph`` writes: :func:`capture_graph`'s graph with the
    profile's metadata (``device.kind`` is ``cpu``: fake tensors on the CPU; nothing is timed).
    """
    from datetime import datetime, timezone

    graph, info = capture_graph(model, batch_size=batch_size, input_shape=input_shape, dtype=dtype)
    return Profile(
        model=name or info["model"],
        batch_size=info["batch_size"],
        input_shape=info["input_shape"],
        dtype=dtype,
        device=Device(kind="cpu", name="fake tensors (sizes only)"),
        measured=Measured(
            tool=f"memplan {memplan.__version__}",
            torch=torch.__version__.split("+")[0],
            date=datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            repeats=0,
            extra={"capture": "make_fx + FakeTensorMode, forward + backward + SGD step"},
        ),
        graph=graph,
    )
