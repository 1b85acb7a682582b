"""Where every stored tensor of a chain is, and the bytes on the GPU: the memory accounting of
the chain-model simulator (:mod:`memplan.simulator.combined`).

:class:`ChainMemory` holds the state of a replay and applies one event at a time (the start or the
end of a computation or a transfer), saying why an event cannot happen when the model forbids it
(docs/model.md, rules T1-T5 of docs/combined.md). Independent of the solvers.

NOTE [ chain-model memory ]
The bytes are counted here and nowhere else: ``x[0]`` and the loss gradient ``g[L]`` are held
from the start; a computation reserves its output (``s[k]`` for ``F_all``, ``x[k+1]`` for
``F_ck``/``F_n``, ``g[k]`` for ``B``) and its overhead when it starts (:meth:`ChainMemory.reserved`)
and frees its overhead and what it consumes when it ends (:meth:`ChainMemory.finish`: ``B k``
frees ``g[k+1]``, ``s[k]`` and the standalone ``x[k]``; ``F_n k`` frees the standalone ``x[k]``);
under the training loop's terms (NOTE [ simulator memory terms ] in :mod:`.terms`, computed
there from the profile's fields and the schedule's budget) ``B k`` also reserves the weight
gradients it creates, which stay (under ``step-in-backward`` it reserves the step's temporaries
too, and frees at its end the gradients it steps), ``F_all k`` reserves its own overhead and,
where autograd frees ``x[k]``, frees it at its end (the standalone checkpoint, or its part of
``s[k-1]``, which then counts without it until ``B k-1``);
an offloaded tensor leaves the GPU when its offload ends, or at the end of the computation that
reads it then (T2); a prefetched one is reserved from the start of its prefetch (T3). The replay
adds the static memory (weights, gradients, optimizer state) to every figure.
"""

from __future__ import annotations

from memplan.profile.model import Profile
from memplan.schedule import Budget
from memplan.simulator.operations import Step, stored_sizes
from memplan.simulator.terms import stage_loops

# Places of a stored tensor (docs/combined.md, table "place"); None: not held.
_GPU, _OUT, _LEAVING, _HOST, _IN = "gpu", "offloading", "leaving", "host", "prefetching"
_ON_GPU = (_GPU, _OUT)  # available to a computation
_PLACE = {
    _GPU: "in memory",
    _OUT: "in memory, being offloaded",
    _LEAVING: "offloaded, leaving the GPU",
    _HOST: "on the host",
    _IN: "being prefetched",
}


class ChainMemory:
    """Where every stored tensor is and the bytes on the GPU (NOTE [ chain-model memory ])."""

    def __init__(self, profile: Profile, channel: list[Step], budget: Budget | None = None) -> None:
        stages = profile.chain_stages
        loops = stage_loops(stages, budget)
        # the step in the backward: B k holds the step's temporaries during it and frees what it
        # steps at its end (whatever the option of F_all k)
        self.stepped = [t.steps for t in loops]
        self.step_temporaries = [t.step_temporaries for t in loops]
        self.length = len(stages)
        self.size = stored_sizes(profile)
        self.x = [f"x[{k}]" for k in range(self.length + 1)]  # the names, made once
        self.s = [f"s[{k}]" for k in range(self.length)]
        self.g = [0] + [st.gradient_size for st in stages]
        self.fo = [st.forward_overhead for st in stages]
        self.fa = [t.forward_all for t in loops]  # F_all k's overhead (under an option: its)
        self.bo = [t.backward for t in loops]  # B k's overhead (under F_all k's option: its)
        self.wg = [t.weight_grads for t in loops]
        self.fr = [t.frees_input for t in loops]
        self.cut: set[int] = set()  # k: s[k] is held without x[k+1], which F_all k+1 freed
        self.stages = stages
        self.loops = loops  # the stages' own overheads (option 0)
        self.options = [0] * self.length  # the option of each stage's latest F_all
        self.place: dict[str, str | None] = dict.fromkeys(self.size)
        self.place["x[0]"] = _GPU
        self.made = {"x[0]"}  # the tensors held at some time, to tell "not yet" from "freed"
        self.held = self.size["x[0]"] + self.g[self.length]  # bytes on the GPU
        self.next_backward = self.length - 1
        self.fresh = -1  # k of the standalone x[k] the previous computation produced
        self.running: Step | None = None
        self.leaving: list[str] = []  # offloaded, freed at the end of the running computation
        self.transfers = channel  # in time, to say when a missing tensor arrives
        self.offloaded_by: dict[str, Step] = {}

    # ---- computations

    def reads(self, step: Step) -> tuple[str, ...]:
        """Tensors a computation reads (they stay on the GPU while it runs)."""
        k = step.stage
        inputs = (self.x[k], self.s[k - 1]) if k > 0 else (self.x[k],)
        return inputs + (self.s[k],) if step.name == "B" else inputs

    def reserved(self, name: str, k: int) -> int:
        """Bytes a computation reserves when it starts: its output (or ``g[k]``) and overhead."""
        if name == "B":
            return self.g[k] + self.wg[k] + self.bo[k] + self.step_temporaries[k]
        if name == "F_all":
            return self.size[self.s[k]] + self.fa[k]
        return self.size[self.x[k + 1]] + self.fo[k]

    def choose(self, k: int, option: int) -> None:
        """``F_all k`` runs under ``option`` (docs/model.md, "Options of a stage"): what it saves,
        its overhead and that of ``B k`` are the option's. ``s[k]`` is not held when it starts.
        """
        if option == self.options[k]:
            return  # the figures in force already (option 0 from the start)
        self.options[k] = option
        chosen = self.stages[k].option(option)
        self.size[self.s[k]] = chosen.saved_size
        if option == 0:
            self.fa[k], self.bo[k] = self.loops[k].forward_all, self.loops[k].backward
        else:
            self.fa[k], self.bo[k] = chosen.forward_overhead, chosen.backward_overhead

    def bytes_of(self, tensor: str) -> int:
        """The bytes ``tensor`` holds now (``s[k]`` less the ``x[k+1]`` freed from it)."""
        size = self.size[tensor]
        if tensor[0] == "s" and int(tensor[2:-1]) in self.cut:
            size -= self.size[f"x[{int(tensor[2:-1]) + 1}]"]
        return size

    def start(self, step: Step, when: float) -> str | None:
        """Start a computation; why it cannot start now (docs/model.md, T4), or None."""
        if self.running is not None:
            other = self.running
            return (
                f"starts at {step.start}, before the end {other.end} of ops[{other.index}] "
                "(one computation at a time)"
            )
        problem = self.cannot_run(step, when)
        if problem is None:
            if step.name == "F_all":
                self.choose(step.stage, step.option)
            self.running = step
            self.held += self.reserved(step.name, step.stage)
        return problem

    def cannot_run(self, step: Step, when: float) -> str | None:
        name, k = step.name, step.stage
        if name == "B":
            if self.next_backward < 0:
                return "every backward has already run"
            if k != self.next_backward:
                return f"backward out of order: the next backward is B stage {self.next_backward}"
            if self.place[self.s[k]] not in _ON_GPU:
                return self.missing(self.s[k], step, when)
        elif name == "F_all":
            saved = self.place[self.s[k]]
            if saved is not None:
                return f"s[{k}] is already {_PLACE[saved]}"
        else:
            out, inp = self.x[k + 1], self.x[k]
            produced, consumed = self.place[out], self.place[inp]
            if produced is not None:
                return f"{out} is already {_PLACE[produced]}"
            if name == "F_n" and consumed is not None:
                if self.fresh != k:
                    return (
                        f"would free the stored checkpoint {inp} (memory persistency: F_n may "
                        "only consume the activation the previous operation produced; use F_ck)"
                    )
                if consumed not in (_GPU, _HOST):
                    return f"would free {inp} while it is {_PLACE[consumed]}"
        if name == "B" and self.fr[k]:
            return None  # the backward does not read x[k] (autograd freed it after F_all k)
        if self.place[self.x[k]] in _ON_GPU or (
            k > 0 and self.place[self.s[k - 1]] in _ON_GPU and k - 1 not in self.cut
        ):
            return None
        if k == 0:
            return self.missing("x[0]", step, when, "the chain input cannot be recomputed")
        if self.place[self.x[k]] is None and (
            self.place[self.s[k - 1]] is None or k - 1 in self.cut
        ):
            return f"x[{k}] is not in memory (neither x[{k}] nor s[{k - 1}] is held)"
        away = self.x[k] if self.place[self.x[k]] is not None else self.s[k - 1]
        return self.missing(away, step, when)

    def missing(self, tensor: str, step: Step, when: float, why: str = "") -> str:
        """Why ``tensor``, which ``step`` reads, is not on the GPU at ``when``."""
        place = self.place[tensor]
        if place is None:
            return f"{tensor} is not in memory" + (f" ({why})" if why else "")
        if place not in (_HOST, _IN):
            return f"{tensor} is not on the GPU (it is {_PLACE[place]})"
        sent = self.offloaded_by[tensor]
        arrival = next(
            (
                t
                for t in self.transfers
                if t.name == "prefetch" and t.tensor == tensor and t.end > when
            ),
            None,
        )
        offloaded = "" if place == _IN else f"ops[{sent.index}] offloaded it by {sent.end} and "
        if arrival is None:
            return f"{tensor} is not on the GPU: {offloaded}it is never prefetched"
        return (
            f"{tensor} is not on the GPU: {offloaded}its prefetch ops[{arrival.index}] arrives at "
            f"{arrival.end}, after {step.name} stage {step.stage} starts ({step.start})"
        )

    def finish(self, step: Step) -> str | None:
        """End of a computation: keep its output, free its overhead and what it consumes."""
        name, k = step.name, step.stage
        if name == "B":
            self.held -= self.bo[k] + self.step_temporaries[k] + self.stepped[k]
        else:
            self.held -= self.fa[k] if name == "F_all" else self.fo[k]
        for tensor in self.leaving:
            self.held -= self.size[tensor]
            self.place[tensor] = _HOST
        self.leaving = []
        self.running = None
        self.fresh = k + 1 if name in ("F_ck", "F_n") else -1
        if name == "B":
            self.held -= self.g[k + 1]
            self.next_backward -= 1
            return self.drop(self.s[k]) or self.drop(self.x[k])
        made = self.s[k] if name == "F_all" else self.x[k + 1]
        self.place[made] = _GPU
        self.made.add(made)
        if name == "F_n" and self.place[self.x[k]] is not None:
            return self.drop(self.x[k])
        if name == "F_all" and self.fr[k]:
            return self.free_input(k)
        return None

    def free_input(self, k: int) -> str | None:
        """After ``F_all k``, autograd's free of ``x[k]`` (NOTE [ simulator memory terms ]):
        the standalone checkpoint, and ``s[k-1]``'s part, when on the GPU.
        """
        if self.place[self.x[k]] == _GPU:
            self.drop(self.x[k])
        if self.place[self.s[k - 1]] == _GPU and k - 1 not in self.cut:
            self.cut.add(k - 1)
            self.held -= self.size[self.x[k]]
        return None

    def drop(self, tensor: str) -> str | None:
        """Free a tensor wherever it is (T4: a host copy is dropped); not while in flight."""
        where = self.place[tensor]
        if where in (_OUT, _IN):
            return f"frees {tensor} while it is {where}"
        if where in (_GPU, _LEAVING):
            self.held -= self.bytes_of(tensor)
        self.place[tensor] = None
        if tensor[0] == "s":
            self.cut.discard(int(tensor[2:-1]))
        if tensor in self.leaving:
            self.leaving.remove(tensor)
        return None

    # ---- transfers (T1-T3)

    def transfer_start(self, step: Step) -> str | None:
        name = step.tensor or ""
        freed_by = self.freed_by(name)
        if freed_by is not None:
            return (
                f"{name} cannot be transferred: autograd frees x[{freed_by}] after F_all stage "
                f"{freed_by} (docs/combined.md, T6)"
            )
        place = self.place[name]
        if step.name == "offload":
            if place == _GPU:
                self.place[name] = _OUT
                self.offloaded_by[name] = step
                return None
            if place is None:
                return (
                    f"{name} does not exist yet"
                    if name not in self.made
                    else (f"{name} is not in memory")
                )
            return f"{name} cannot be offloaded: it is {_PLACE[place]}"
        if place == _HOST:
            self.place[name] = _IN
            self.held += self.size[name]
            return None
        if place in (_OUT, _LEAVING):
            return f"starts at {step.start}, before {name} has left the GPU"
        return f"{name} is not on the host ({_PLACE[place] if place else 'not held'})"

    def freed_by(self, tensor: str) -> int | None:
        """The stage ``k`` whose ``F_all`` frees all or part of ``tensor`` (``x[k]``, or
        ``s[k-1]`` which holds it), or None (T6 of docs/combined.md: such a tensor stays on the GPU).
        """
        k = int(tensor[2:-1]) + (1 if tensor[0] == "s" else 0)
        return k if k < self.length and self.fr[k] else None

    def transfer_end(self, step: Step) -> None:
        name = step.tensor or ""
        if step.name == "prefetch":
            self.place[name] = _GPU
        elif self.running is not None and name in self.reads(self.running):
            self.place[name] = _LEAVING
            self.leaving.append(name)
        else:
            self.place[name] = _HOST
            self.held -= self.size[name]
