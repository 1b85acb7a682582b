"""Blocks that are no module: the i-th elements of parallel module lists, called in turn.

NOTE [ Parallel lists as blocks ]
---------------------------------
XLM and FlauBERT keep their layers as parallel module lists (``attentions[i]``,
``layer_norm1[i]``, ``ffns[i]``, ``layer_norm2[i]``) and call the i-th of each in a loop, with
the residual additions and a padding mask's product between them in the loop's own code.
SqueezeBERT calls its layers through ``layer.forward(...)``, which runs no module hooks: only
the modules inside a layer are seen called. No module call marks where a layer begins and ends.
A *call group* is the calls of modules with index ``i`` in their path (``attentions.i``,
``layers.i.attention``) made one after the other by the same caller (sibling calls, outside
any block); a run of groups is at least two of them whose lists repeat in the same order
(``attentions, layer_norm1, ffns, layer_norm2``), each index one more than the previous one's,
and each group's first call fed by the previous group's last one (the same tensor, modified in
place or not) or by the loop's code after it (a residual addition), which each group's tape
must show: the next group's input is made by the group's operations from its own input. The
run's groups are the chain's blocks.

A group's stage begins where its first module is called (the tensor that call reads is the
stage's input) and ends where the next group's first module is called (the tensor that call
reads is the stage's output): the loop's code between two groups (a padding mask applied in
place) is the earlier group's. The last group ends likewise where the next module is called (a
final norm, the output layer: a module called once, not a list's), the loop's code after its
last module (a residual addition) the last group's; where none is, at the return of its last
module. The head is the tensor operations from there to the model's output (NOTE [ The head on
a tape ] in :mod:`memplan.torch.split.tape`).

A group's stage is its operations on a tape (:func:`record_groups`: the model runs once in each
mode, recorded from each group's beginning to its end) replayed as a
:class:`~memplan.torch.split.wrappers.TapeStage`, whose constants (its parameters, the traced
attention mask) it holds. :mod:`memplan.torch.enable` follows the model's own forward: module
pre-hooks on each group's first module mark the boundaries, and a recomputation replays the tape
of the step's own operations (:mod:`memplan.torch.runtime.hooks`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from memplan.torch.split.tape import Tape, TapeRecorder
from memplan.torch.split.trace import ModelCall, TracedCall, Tracer, primary_output

__all__ = ["GROUP_RUNS_TRIED", "group_runs", "group_tapes", "list_index", "record_groups"]

GROUP_RUNS_TRIED = 2


def list_index(call: TracedCall) -> tuple[str, int] | None:
    """Where a call's module is in the lists: its path with the last index in it as ``*``
    (``attentions.*``, ``encoder.layers.*.attention``) and that index; None outside lists.
    """
    parts = call.name.split(".")
    for j in range(len(parts) - 1, -1, -1):
        if parts[j].isdigit():
            return ".".join([*parts[:j], "*", *parts[j + 1 :]]), int(parts[j])
    return None


def _groups_of(siblings: list[TracedCall]) -> list[list[TracedCall]]:
    """Consecutive block calls of one caller with the same index, in order."""
    groups: list[list[TracedCall]] = []
    previous: int | None = None
    for call in siblings:
        found = list_index(call)
        if found is None:
            previous = None
            continue
        if found[1] == previous and groups:
            groups[-1].append(call)
        else:
            groups.append([call])
        previous = found[1]
    return groups


def _lists(group: list[TracedCall]) -> tuple[str, ...]:
    return tuple(list_index(c)[0] for c in group)  # type: ignore[index]


def _feeds(earlier: list[TracedCall], later: list[TracedCall]) -> bool:
    """Whether ``later``'s first call reads ``earlier``'s last call's output, or a tensor no
    module call returned (the loop's code made it: a residual addition). That ``earlier`` made
    it is checked on its tape (:func:`group_tapes`).
    """
    producers = later[0].producers
    return not producers or any(p is earlier[-1] and v is None for p, v in producers)


def group_runs(calls: list[TracedCall]) -> list[list[list[TracedCall]]]:
    """The runs of call groups (NOTE [ Parallel lists as blocks ]) of a tracing pass, most
    groups first.
    """
    by_caller: dict[int, list[TracedCall]] = {}
    for call in calls:
        usable = call.key is not None and call.has_output
        listed = list_index(call) is not None  # a block, or a module inside one called hookless
        if listed and usable and not any(p.is_block for p in call.parents):
            caller = id(call.parents[-1]) if call.parents else 0
            by_caller.setdefault(caller, []).append(call)
    runs: list[list[list[TracedCall]]] = []
    for siblings in by_caller.values():
        run: list[list[TracedCall]] = []
        for group in _groups_of(siblings):
            lists = _lists(group)
            fits = (
                run
                and lists == _lists(run[-1])
                and list_index(group[0])[1] == list_index(run[-1][0])[1] + 1  # type: ignore[index]
                and _feeds(run[-1], group)
            )
            if not fits:
                if len(run) >= 2:
                    runs.append(run)
                run = []
            if len(lists) >= 2 and len(set(lists)) == len(lists):
                run.append(group)
        if len(run) >= 2:
            runs.append(run)
    runs.sort(key=lambda r: -len(r))
    return runs[:GROUP_RUNS_TRIED]


def record_groups(
    model: nn.Module,
    call: ModelCall,
    x: Tensor,
    run: list[list[TracedCall]],
    ordinals: list[int],
    end: TracedCall | None = None,
) -> tuple[list[TapeRecorder], Tracer]:
    """Run the model on ``x`` (no gradients, in the mode it is in), recording each group's
    operations from its beginning to its end (NOTE [ Parallel lists as blocks ]); the recorders
    (a group whose end the tape did not make has none: ``tape.end`` None), and the tracer that
    followed what each tensor is computed from. ``ordinals``: which call of each group's first
    module is the group's (a module called once per forward: 0). The last group ends as
    ``end``'s module is called (its only call), or else at its last module's return.
    """
    taint = Tracer(model)
    recorders: list[TapeRecorder] = []
    open_: list[TapeRecorder] = []
    seen: dict[int, int] = {}
    entries = {id(group[0].module): g for g, group in enumerate(run)}

    def close(end: Tensor) -> None:
        if open_:
            recorder = open_.pop()
            recorder.finish(end)
            recorder.__exit__(None, None, None)

    def entry(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        g = entries[id(module)]
        count = seen.get(id(module), 0)
        seen[id(module)] = count + 1
        key = run[g][0].key
        if count != ordinals[g] or len(recorders) != g or key is None:
            return
        primary = args[key] if isinstance(key, int) else kwargs[key]
        close(primary)
        recorder = TapeRecorder()
        recorder.__enter__()
        recorder.start(primary)
        open_.append(recorder)
        recorders.append(recorder)

    def exit_(module: nn.Module, args: Any, output: Any) -> None:
        out = primary_output(output)
        if len(recorders) == len(run) and open_ and out is not None:
            close(out)

    def ending(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        assert end is not None and end.key is not None
        if len(recorders) == len(run):
            close(args[end.key] if isinstance(end.key, int) else kwargs[end.key])

    handles: list[Any] = [
        group[0].module.register_forward_pre_hook(entry, with_kwargs=True) for group in run
    ]
    if end is not None:
        handles.append(end.module.register_forward_pre_hook(ending, with_kwargs=True))
    else:
        handles.append(run[-1][-1].module.register_forward_hook(exit_))
    try:
        with taint.tracing(x, calls=False), torch.random.fork_rng(devices=[]):
            call(model, x)
    finally:
        for handle in handles:
            handle.remove()
        while open_:
            open_.pop().__exit__(None, None, None)
    return recorders, taint


def group_tapes(recorders: list[TapeRecorder], count: int) -> list[Tape] | None:
    """Each group's tape up to its end, or None when one is missing or did not make its end."""
    if len(recorders) != count or any(r.tape.end is None for r in recorders):
        return None
    tapes = []
    for recorder in recorders:
        assert recorder.tape.end is not None
        tapes.append(recorder.tape.until(recorder.tape.end))
    return tapes
