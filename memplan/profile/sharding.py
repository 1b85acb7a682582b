"""One rank's profile of a chain sharded over N ranks with FSDP2 (``fully_shard``): the terms.

:func:`shard_profile` turns a one-GPU chain profile into the profile of one rank when the model is
sharded with PyTorch's FSDP2 over ``N`` ranks, one ``fully_shard`` per block and one on the root
(the recipe of PyTorch's FSDP2 documentation). Every chain-model family (rotor, revolve, periodic,
dynprog, pofo...) plans with the result unchanged, and the simulator replays it: what FSDP2 holds
is put into the fields of the chain model (docs/model.md) at the operations during which it holds
it. docs/sharding.md gives the same terms for users.

NOTE [ FSDP2 memory terms ]
---------------------------
Notation, per stage ``k`` of the chain (:class:`ShardLayout`): ``P[k]`` the bytes of its
parameters (one GPU), ``S[k]`` the bytes one rank holds of them (FSDP2 shards every parameter on
dim 0 in ``N`` chunks of ``ceil(rows / N)`` rows, the last ranks' padded: the same bytes on every
rank), ``G[k] = N * S[k]`` the bytes of the all-gathered parameters, padding included. A stage is
a *block* (a ``fully_shard`` unit of its own, resharded after its forward and its backward) or
part of the *root* unit (the stages before the first block and after the last: embeddings, head,
loss), which FSDP2 keeps gathered from the root's pre-forward to the end of the backward.
``G_root``, ``P_root``, ``S_root``: the root's sums; ``R[k] = G[k]``: the reduce-scatter input of
block ``k``, which FSDP2 keeps until the next block's reduce-scatter (the first block's until the
root's, after the backward); ``c``: the extra copies the process group makes (gloo: one copy of an
all-gather's output and of a reduce-scatter's input, measured on CPU; NCCL: none). What one rank
holds (measured with the allocator's events on CPU: tests/torch/test_fsdp.py,
benchmarks/bench_fsdp.py):

* **static memory** (the whole step): the shards (``weight_size`` becomes ``weight_size - P +
  S``: buffers and step counts stay whole), the optimizer's state of the shards (the optimizer's
  factor times ``weight_size``, as on one GPU), and the root's gathered parameters ``G_root``
  (``workspace_size``);
* **the forward of block k** (``F_all``, ``F_ck``, ``F_n``; in the forward phase or recomputed):
  the all-gather's output and the unsharded parameters, ``2 G[k]``, and, before it computes, what
  is still held of the unit before: in the forward phase the all-gather output of the unit
  computed before it (FSDP2 frees it after the copy-out), in the backward the prefetch memplan
  drops first (its copy-out, ``2 G[next]``; with gloo the output until the next collective):
  ``forward_overhead`` becomes ``2 G[k] + max(forward_overhead, before - output_size)``
  (``forward_overhead_all``: the same with ``saved_size``). The root's stages before the first
  block hold the root's all-gather output, or a prefetched block while recomputed (``+
  max(G_root, G)``), those after the last block the last block's output (``+ G[last]``);
* **the window of g[k]** (from the start of ``B k`` to the end of ``B k-1``, when memplan
  recomputes for ``B k-1``, before FSDP2's pre-backward hook of stage ``k-1``: NOTE [ Plans under
  FSDP2 ]): ``C[k]``, added to ``grad_size`` of stage ``k-1`` (the chain model holds ``g[k]``
  exactly over that window, and during the forwards of a sub-chain ending at ``k-1``): the
  reduce-scatter input of the block after stage ``k-1``. Not the all-gather FSDP2's backward
  prefetch made for block ``k-1``: a recomputation of block ``k-1`` copies its parameters out of
  it (``2 G``, as a forward counts), and memplan drops it before recomputing another block;
* **the backward of stage k**: the unsharded gradients ``P[k]``, reduce-scattered at its end into
  ``S[k]`` (a block's ``weight_grad_size`` becomes ``S[k]``; the root's gradients stay whole to
  the end of the backward: the stage's ``weight_grad_size`` as the one-GPU profile measured it,
  each gradient at the first backward that makes it, so a head tied to the embedding makes the
  embedding's, else ``P[k]``); a block's unsharded parameters and the prefetch of the block
  before it (the last block's, from the root's pre-backward hook, through the loss's or the head's
  backward); the moments of FSDP2's hooks (the copy-out, the prefetch's copy, the reduce-scatter's
  input, its copy and output, after the stage's saved tensors and its output's gradient are freed;
  with gloo, the buffers of the rank's previous collective, which gloo's worker thread may release
  only at the next one); after ``B 0``, the root's reduce-scatter. ``backward_overhead_fresh`` is
  the largest of these beyond what the chain model counts at ``B k`` (``g[k]`` with ``C[k]``, the
  weight gradients), so it may be negative. A selective option of a stage gets the stage's terms.

FSDP2's root pre-backward hook prefetches the last block at the loss when the model computes its
loss (``loss_in_root``), at the head's output otherwise.

NOTE [ A unit spanning stages ]
-------------------------------
A block cut into sub-blocks (``enable(..., sub_blocks=True)``) is several stages ``a..b`` and
one ``fully_shard`` unit (``StageShard.first``): its ``G``, ``P``, ``S`` above are the unit's,
the sums over its stages. FSDP2 gathers the unit at its pre-forward hook and reshards it at its
post-forward, so every stage's forward holds ``2 G`` as a block's does; memplan's recomputation
of one part gathers the whole unit too (:meth:`memplan.torch.runtime.fsdp.ShardedSteps.
replaying`), and before a part after the first nothing else is held in the forward phase. In the
backward FSDP2's pre-backward hook runs at the unit's output, before ``B b``, and prefetches the
unit before it; its post-backward hook, after ``B a``, reduce-scatters the unit's gradients. So
the window of ``g[k]`` for ``a < k <= b`` (:meth:`_Terms.inside`) holds the gathered unit
``G``, the prefetch, the reduce-scatter input of the unit after (kept to this unit's
reduce-scatter; for the first unit, which prefetches nothing, gloo's copy of it too), the
unsharded gradients of stages ``k..b`` beyond their shards (``P - S``, each stage keeping its
shard at its backward); ``B b`` has a block's moments but the reduce-scatter, ``B a`` the
reduce-scatter's (:meth:`_Terms.unit_reduce`).

Over-counts known: a part recomputed inside the unit's own backward (for ``B a``,
in the window of ``g[a+1]``) finds the unit gathered, but its forward counts ``2 G`` more; a
part after the first counts, in the forward phase, what a recomputation of it holds before it
computes (gloo's late copy, a dropped prefetch).

NOTE [ Without the backward prefetch ]
--------------------------------------
FSDP2's implicit backward prefetch (``ShardLayout.prefetch``) holds one more unit's gathered
parameters through each unit's backward: its pre-backward hook all-gathers the unit before it
(``prefetched(k)``), and the root's, at the loss or the head's output, the last unit. A caller
turns it off per unit by giving the unit an explicit list of units to prefetch that holds only
itself (``FSDPModule.set_modules_to_backward_prefetch([unit])``: in torch 2.13 an empty list
means the implicit prefetch, and prefetching a unit just gathered is a no-op); the runtime does
so when it installs a plan made without it (:mod:`memplan.torch.runtime.fsdp`). Then every unit
all-gathers itself at its own pre-backward hook, after the reduce-scatter of the unit after it:
no term has ``prefetched(k)``; a unit's pre-backward holds its all-gather output, its copy-out
and gloo's late copy of that reduce-scatter (``2 G + c R``); its backward holds no late buffer
(the rank's previous collective is its own all-gather, copied out before it computes); inside
a unit spanning stages, no late reduce-scatter copy; a recomputation finds no prefetch to drop
(the previous collective's late buffers, ``c G`` of the largest unit, before it). The terms
save one unit's gathered parameters ``G`` at a unit's backward, the least memory's moment on
Hugging Face models cut into sub-blocks (docs/sharding.md). The time the model gives is the
same: on a GPU each unit's all-gather then runs before its backward, not hidden behind the
backward of the unit after, a latency the profile's times do not count, so the planner uses a
layout without it only where no plan with it fits (:func:`memplan.torch.runtime.fsdp.
install_sharded`).

Times are unchanged: FSDP2 overlaps its collectives with the computation on a GPU (with the
prefetch).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from memplan.errors import ArgumentError, InputError
from memplan.profile.model import Profile, Stage, StageOption

__all__ = [
    "MAX_SHARDS",
    "ShardLayout",
    "StageShard",
    "check_shards",
    "default_layout",
    "for_ranks",
    "shard_profile",
    "sharded_ranks",
]

MAX_SHARDS = 1_000_000
"""The most ranks ``--shards`` accepts."""

Unit = Literal["root", "block"]


@dataclass(frozen=True)
class StageShard:
    """What FSDP2 does with one stage's parameters (NOTE [ FSDP2 memory terms ]).

    Attributes
    ----------
    params : int
        ``P``: bytes of the stage's parameters among its ``weight_size``, one GPU.
    shard : int
        ``S``: bytes one rank holds of them, padding included.
    gathered : int
        ``G``: bytes of the all-gathered parameters (``N * S``).
    unit : {"root", "block"}
        A block (its own ``fully_shard``) or part of the root unit.
    first : int, optional
        Of a block stage whose ``fully_shard`` unit spans several stages (a block cut into
        sub-blocks): the unit's first stage (NOTE [ A unit spanning stages ]). None: a unit of
        its own, or the root.
    """

    params: int
    shard: int
    gathered: int
    unit: Unit
    first: int | None = None


@dataclass(frozen=True)
class ShardLayout:
    """How a chain's parameters are sharded: the shard count and every stage's figures.

    ``copies``: the extra copies the collectives make of an all-gather's output and of a
    reduce-scatter's input (gloo 1, NCCL 0). ``loss_in_root``: the model computes its loss in its
    forward (Hugging Face models given labels), so FSDP2's root pre-backward hook runs at the
    loss; otherwise at the head's output, after the loss's backward. ``prefetch``: FSDP2's
    implicit backward prefetch is on (its default: a unit's pre-backward hook all-gathers the
    unit before it, the root's the last unit); off, every unit all-gathers itself at its own
    pre-backward hook (NOTE [ Without the backward prefetch ]).
    """

    shards: int
    stages: tuple[StageShard, ...]
    copies: int = 0
    loss_in_root: bool = True
    prefetch: bool = True

    @property
    def blocks(self) -> list[int]:
        """Indices of the block stages, in order."""
        return [k for k, st in enumerate(self.stages) if st.unit == "block"]


def check_shards(
    shards: int | None, parameter: str = "shards", algorithm: Any = None
) -> int | None:
    """``shards`` as given (None: not sharded), else an error naming ``parameter``.

    An :class:`~memplan.errors.ArgumentError` (the command line names its flag, ``--shards``).

    ``algorithm`` (an :class:`~memplan.algorithms.AlgorithmInfo`, when known): the pipeline
    family places stages on GPUs, where FSDP2 shards every stage over them: not both.
    """
    if shards is None:
        return None
    if isinstance(shards, bool) or not isinstance(shards, int) or not 1 <= shards <= MAX_SHARDS:
        raise ArgumentError(parameter, f"expected a number of ranks from 1 to {MAX_SHARDS}", shards)
    if algorithm is not None and algorithm.family == "pipeline":
        raise ArgumentError(
            parameter,
            f"{algorithm.name} places stages on GPUs; FSDP2 shards every stage over them",
            shards,
        )
    return shards


def default_layout(profile: Profile, shards: int, copies: int = 0) -> ShardLayout:
    """The layout of a profile alone, as FSDP2's recipe shards a chain.

    The first stage and the last two (head, loss) are the root unit, every other stage a block of
    its own, and each stage's ``weight_size`` its parameters. A profile states bytes, not the
    parameters' shapes, so the padding of FSDP2's dim-0 chunks is not known: a shard is
    ``ceil(weight_size / N)`` bytes (the padding adds at most ``N - 1`` rows per parameter).
    """
    if profile.kind != "chain":
        raise InputError(
            f"--shards: {profile.model} is a {profile.kind} profile; FSDP2 sharding is planned "
            "for chain profiles (stages)"
        )
    stages = profile.chain_stages
    length = len(stages)
    root = {0, length - 2, length - 1} if length >= 4 else set(range(length))
    figures = []
    for k, st in enumerate(stages):
        shard = math.ceil(st.weight_size / shards)
        unit: Unit = "root" if k in root else "block"
        figures.append(StageShard(st.weight_size, shard, shard * shards, unit))
    return ShardLayout(shards, tuple(figures), copies)


def _check_layout(profile: Profile, layout: ShardLayout) -> list[Stage]:
    if profile.kind != "chain":
        default_layout(profile, layout.shards)  # the error
    stages = profile.chain_stages
    if len(layout.stages) != len(stages):
        raise InputError(
            f"--shards: the layout has {len(layout.stages)} stages, {profile.model} has "
            f"{len(stages)}"
        )
    blocks = layout.blocks
    if blocks and blocks != list(range(blocks[0], blocks[-1] + 1)):
        raise InputError(
            f"--shards: the blocks of {profile.model} (stages {blocks}) are not one run of "
            "stages: FSDP2's root unit holds the stages before and after them"
        )
    for k, (st, sh) in enumerate(zip(stages, layout.stages, strict=True)):
        if sh.first is not None and not _joined(layout, sh.first, k):
            raise InputError(
                f"--shards: stages[{k}] ({st.name}) is given as part of the unit beginning at "
                f"stage {sh.first}; a unit is one run of block stages"
            )
        if sh.params > st.weight_size:
            raise InputError(
                f"--shards: stages[{k}] ({st.name}) has {sh.params} bytes of parameters, more "
                f"than its weight_size {st.weight_size}"
            )
    return stages


def _joined(layout: ShardLayout, first: int, k: int) -> bool:
    """Whether stages ``first`` to ``k`` are blocks of one unit beginning at ``first``."""
    shards = layout.stages
    return 0 <= first <= k and all(
        s.unit == "block" and s.first == first for s in shards[first : k + 1]
    )


class _Terms:
    """The figures of NOTE [ FSDP2 memory terms ] of one layout, by stage index.

    A block's ``G``, ``P``, ``S`` are its unit's: the sums over the stages of a unit that spans
    several (NOTE [ A unit spanning stages ]).
    """

    def __init__(self, layout: ShardLayout, stages: Sequence[Stage], fresh: bool) -> None:
        self.layout = layout
        self.shards = layout.stages
        self.stages = stages
        self.fresh = fresh
        blocks = layout.blocks
        self.first = blocks[0] if blocks else None
        self.last = blocks[-1] if blocks else None
        self.start: dict[int, int] = {}  # a block stage -> its unit's first stage
        for k in blocks:
            first = self.shards[k].first
            self.start[k] = k if first is None else first
        self.end = {k: max(j for j in blocks if self.start[j] == self.start[k]) for k in blocks}
        self.unit_gathered = {s: 0 for s in self.start.values()}
        self.unit_params = dict(self.unit_gathered)
        self.unit_shard = dict(self.unit_gathered)
        for k in blocks:
            self.unit_gathered[self.start[k]] += self.shards[k].gathered
            self.unit_params[self.start[k]] += self.shards[k].params
            self.unit_shard[self.start[k]] += self.shards[k].shard
        self.root_gathered = sum(s.gathered for s in self.shards if s.unit == "root")
        self.root_params = sum(s.params for s in self.shards if s.unit == "root")
        self.root_shard = sum(s.shard for s in self.shards if s.unit == "root")
        self.root_output = len(stages) - (1 if layout.loss_in_root else 2)
        self.largest = max(self.unit_gathered.values(), default=0)
        self.root_grads = sum(self.made(k) for k, s in enumerate(self.shards) if s.unit == "root")

    def block(self, k: int) -> bool:
        return 0 <= k < len(self.shards) and self.shards[k].unit == "block"

    def made(self, k: int) -> int:
        """The gradient bytes ``B k`` makes whole.

        A block's unsharded gradients ``P[k]`` (reduce-scattered at its unit's end); a root
        stage's as the one-GPU profile measured them when it did (``weight_grad_size``: each
        parameter's gradient at the first backward that makes it, the embedding a language
        model's head is tied to at the head's backward), else ``P[k]``.
        """
        st, sh = self.stages[k], self.shards[k]
        if sh.unit == "block" or st.weight_grad_size is None:
            return sh.params
        return st.weight_grad_size

    def gathered(self, k: int | None) -> int:
        """``G`` of the unit of block ``k`` (0 for the root's stages and outside the chain)."""
        return self.unit_gathered[self.start[k]] if k is not None and self.block(k) else 0

    def inner(self, k: int) -> bool:
        """Whether block stage ``k`` follows a stage of its own unit (not its unit's first)."""
        return self.block(k) and self.start[k] != k

    def prefetched(self, k: int) -> int:
        """The all-gather output FSDP2's backward prefetch makes when ``B k`` starts.

        A unit's pre-backward hook, at its last stage, prefetches the unit before it (none
        before the first); the root's, at the loss or at the head's output, the last unit.
        None without the prefetch.
        """
        if not self.layout.prefetch:
            return 0
        if self.block(k):
            return self.gathered(self.start[k] - 1) if self.end[k] == k else 0
        return self.gathered(self.last) if k == self.root_output else 0

    def window(self, k: int) -> int:
        """``C[k]``: what FSDP2 holds while memplan recomputes for ``B k-1`` (added to ``g[k]``).

        The reduce-scatter input of the unit after stage ``k-1`` (the first unit's, kept to the
        root's, for the stages before it). The all-gather output prefetched for the next unit to
        run backward is not: memplan drops it before recomputing another unit. Inside a unit
        spanning stages, :meth:`inside`.
        """
        j = k - 1
        if self.first is not None and j < self.first:
            return self.gathered(self.first)
        if self.inner(k):
            return self.inside(k)
        return self.gathered(k)

    def inside(self, k: int) -> int:
        """``C[k]`` of a stage ``k`` inside a unit (NOTE [ A unit spanning stages ]).

        From ``B k`` to the end of ``B k-1`` the unit is gathered (FSDP2's pre-backward hook,
        at its last stage, gathered it and prefetched the unit before it; its post-backward hook
        runs after its first stage's backward): its parameters ``G``, the prefetch; the
        reduce-scatter input of the unit after it, and, where no prefetch was issued since
        (the first unit), gloo's copy of it; the unsharded gradients of its stages from ``k``
        on beyond their shards. (gloo's copy of an all-gather is not held past its copy-out:
        a unit's computation counts none, as a block's does.)
        """
        end = self.end[k]
        own, after, before = self.gathered(k), self.gathered(end + 1), self.prefetched(end)
        whole = sum(self.shards[j].params - self.shards[j].shard for j in range(k, end + 1))
        # without the prefetch the unit's own all-gather follows that reduce-scatter
        late = 0 if before or not self.layout.prefetch else self.layout.copies * after
        return own + after + whole + before + late

    def before_forward(self, k: int) -> int:
        """What FSDP2 holds when block ``k``'s forward starts, beyond its own.

        The all-gather output of the unit computed before it (freed after the copy-out; none
        inside a unit, gathered by its first stage); in the backward, the prefetched output
        memplan drops first (its copy-out, and with gloo the output itself until the next
        collective).
        """
        if self.inner(k):
            before = 0
        else:
            before = self.gathered(k - 1) if self.block(k - 1) else self.root_gathered
        largest, own = self.largest, self.gathered(k)
        if not self.layout.prefetch:  # nothing to drop: the previous collective's late buffers
            return max(before, self.layout.copies * largest)
        return max(before, self.layout.copies * largest, 2 * largest - 2 * own)

    def held_in_forward(self, k: int) -> int:
        """What a root stage's forward holds of FSDP2.

        Before the first block: the root's all-gather output, or the prefetched output of the
        next unit while the stage is recomputed; after the last block, the last unit's.
        """
        if self.first is not None and k < self.first:
            return max(self.root_gathered, self.largest)
        return self.gathered(self.last) if self.last is not None and k > self.last else 0

    def forward(self, k: int, own: int, out: int) -> int:
        """The overhead of a forward of stage ``k`` with ``own`` bytes of its own.

        ``out``: the bytes of what it produces (``x[k+1]``, or ``s[k]`` for an ``F_all``).
        """
        if not self.block(k):
            return own + self.held_in_forward(k)
        return 2 * self.gathered(k) + max(own, self.before_forward(k) - out)

    def forward_fields(self, k: int) -> dict[str, int]:
        """``forward_overhead`` and ``forward_overhead_all`` of stage ``k``."""
        st = self.stages[k]
        own_all = (
            st.forward_overhead if st.forward_overhead_all is None else st.forward_overhead_all
        )
        return {
            "forward_overhead": self.forward(k, st.forward_overhead, st.output_size),
            "forward_overhead_all": self.forward(k, own_all, st.saved_size),
        }

    def backward_peak(self, k: int) -> int:
        """The largest bytes ``B k`` holds beyond the chain's ``held`` (which has ``C[k+1]``).

        Its computation (``g[k]``, the unsharded gradients and parameters, the prefetched
        output, its temporaries) and the moments of FSDP2's hooks around it.
        """
        st, sh = self.stages[k], self.shards[k]
        grad_in = self.stages[k - 1].gradient_size if k > 0 else 0
        base = st.backward_overhead
        if st.backward_overhead_fresh is not None:
            base = st.backward_overhead_fresh
        unsharded = self.made(k) if self.fresh or sh.unit == "block" else 0
        compute = grad_in + unsharded + base
        copies = self.layout.copies
        prefetch = self.prefetched(k)
        if not self.block(k):
            last = self.prefetched(self.root_output)  # prefetched by the root, until B last
            if self.last is not None and self.last < k <= self.root_output:
                moments = [compute + last]
                if k == self.root_output:
                    moments.append((1 + copies) * last)
            else:
                moments = [compute]
        elif self.end[k] != k:  # inside a unit: it is gathered, the rest is in C[k+1]
            moments = [compute] + (self.unit_reduce(k) if self.start[k] == k else [])
        else:
            start = self.start[k]
            gathered, params = self.unit_gathered[start], self.unit_params[start]
            done = grad_in - st.saved_size - st.gradient_size  # after its nodes ran
            after = self.gathered(k + 1)  # the reduce-scatter input of the unit after, freed
            # gloo's worker thread may release a collective's buffers after FSDP2 drops them,
            # until the rank's next collective: the reduce-scatter copy of the unit after, and
            # the prefetched output this unit's parameters are copied out of
            late = copies * after
            if prefetch == 0 and self.layout.prefetch:  # no collective before its reduce-scatter
                compute += late + copies * gathered
            moments = [
                gathered + prefetch + compute,
                2 * gathered + late,  # pre-backward: copied out of the (prefetched) output
                (1 + copies) * gathered + late + (1 + copies) * prefetch,  # the next prefetch
            ]
            if start == k:  # post-backward: the reduce-scatter input, the reduce-scatter
                moments += [
                    done + prefetch + params - after,
                    done + prefetch - after + sh.shard + copies * gathered,
                ]
        if k == 0:
            moments += self.root_reduce(st)
        return max(moments)

    def unit_reduce(self, k: int) -> list[int]:
        """The moments of a unit's post-backward hook after ``B k``, its first stage.

        Beyond the chain's ``held``, which has ``C[k+1]`` (:meth:`inside`) and the shards of the
        unit's other stages' gradients: the unit resharded, its unsharded gradients copied into
        the reduce-scatter input, the reduce-scatter.
        """
        st = self.stages[k]
        grad_in = self.stages[k - 1].gradient_size if k > 0 else 0
        done = grad_in - st.saved_size - st.gradient_size
        end = self.end[k]
        gathered, params, shard = self.unit_gathered[k], self.unit_params[k], self.unit_shard[k]
        prefetch = self.prefetched(end)
        held = self.inside(k + 1) + sum(self.shards[j].shard for j in range(k + 1, end + 1))
        copies = self.layout.copies
        return [
            done + prefetch + params - held,
            done + prefetch + shard + copies * gathered - held,
        ]

    def root_reduce(self, st: Stage) -> list[int]:
        """The moments of the root's reduce-scatter after ``B 0``, beyond the chain's ``held``.

        The first block's reduce-scatter input is freed first.
        """
        sh = self.shards[0]
        done = -st.saved_size - st.gradient_size - self.window(1)
        own = self.made(0) if self.fresh and sh.unit == "root" else 0
        others = self.root_grads - own if self.fresh else 0
        scatter = (
            self.root_gathered
            - others
            + self.root_shard
            + self.layout.copies * (self.root_gathered)
        )
        return [done + self.root_gathered + own, done + scatter]


def _option(option: StageOption, k: int, terms: _Terms, added: int) -> StageOption:
    """A selective option of stage ``k`` under FSDP2 (its ``F_all`` and the ``B`` after it).

    Its forward holds what a forward of the stage holds; its backward adds what the stage's
    does, never below nothing (an option's overhead is a size).
    """
    forward = terms.forward(k, option.forward_overhead, option.saved_size)
    backward = max(0, option.backward_overhead + added)
    return option.model_copy(update={"forward_overhead": forward, "backward_overhead": backward})


def shard_profile(
    profile: Profile, layout: ShardLayout, gradients: str | None = "at-backward"
) -> Profile:
    """The profile of one rank of ``profile`` sharded as ``layout`` says.

    NOTE [ FSDP2 memory terms ], for the training loop ``gradients`` (docs/model.md):
    ``at-backward`` (PyTorch's default loop): the gradients a backward keeps are a block's shard
    (``weight_grad_size``) and the root's whole gradients. ``kept`` or None (the families that
    plan without the loop's terms): the shards' gradients are static memory (``weight_grad_size``
    becomes the shards' when measured), the root's whole gradients too (``workspace_size``), and
    a block's unsharded gradients are temporary bytes of its backward. The optimizer's state is
    counted on ``weight_grad_size`` (docs/model.md): the shards', but under ``at-backward`` the
    root's whole gradients (held whole to the end of the backward), an over-count of the state of
    the root's ``P - S`` bytes; its step's temporaries on the whole parameters
    (``parameter_sizes``), an over-count too. A layout of one shard returns the profile.

    Raises
    ------
    InputError
        A profile other than a chain, or a layout that does not fit it.
    """
    stages = _check_layout(profile, layout)
    if layout.shards == 1:
        return profile
    fresh = gradients == "at-backward"
    terms = _Terms(layout, stages, fresh)
    length = len(stages)
    new: list[Stage] = []
    for k, st in enumerate(stages):
        sh = layout.stages[k]
        held = terms.window(k + 1) if k + 1 < length else 0  # C[k+1], the window of g[k+1]
        counted = terms.window(k) if k > 0 else 0  # C[k], reserved with g[k] at B k's start
        peak = terms.backward_peak(k)
        grad_in = stages[k - 1].gradient_size if k > 0 else 0
        update: dict[str, object] = {
            "weight_size": st.weight_size - sh.params + sh.shard,
            "grad_size": st.gradient_size + held,
            **terms.forward_fields(k),
        }
        base = st.backward_overhead
        if fresh:  # a block keeps its shard of the gradients, the root its whole ones
            kept = sh.shard if sh.unit == "block" else terms.made(k)
            update["weight_grad_size"] = kept
            update["backward_overhead_fresh"] = peak - grad_in - counted - kept
            if st.backward_overhead_fresh is not None:
                base = st.backward_overhead_fresh
            added = peak - grad_in - counted - kept - base
        else:
            if st.weight_grad_size is not None:  # the loop keeps the shards' gradients
                update["weight_grad_size"] = st.weight_grad_size - sh.params + sh.shard
            update["backward_overhead"] = max(0, peak - grad_in - counted)
            added = update["backward_overhead"] - base  # type: ignore[operator]
        if st.options:  # selective F_all: FSDP2's terms on the option's own figures
            update["options"] = [_option(o, k, terms, added) for o in st.options]
        new.append(st.model_copy(update=update))
    static = terms.root_gathered + (0 if fresh else terms.root_params)
    shards = {"ranks": layout.shards, "copies": layout.copies}
    return profile.model_copy(
        update={
            "stages": new,
            "workspace_size": (profile.workspace_size or 0) + static,
            "extra": {**(profile.extra or {}), "shards": shards},
        }
    )


def sharded_ranks(profile: Profile) -> int | None:
    """The ranks a profile made by :func:`shard_profile` is one of (None: a whole model's)."""
    found = (profile.extra or {}).get("shards")
    return found.get("ranks") if isinstance(found, dict) else None


def for_ranks(profile: Profile, shards: int | None, gradients: str | None) -> Profile:
    """``profile`` as one of ``shards`` ranks plans it (``--shards``).

    :func:`default_layout`, NCCL's collectives; the profile as it is with no shards, one, or when
    it is one rank's already.
    """
    if shards is None or shards == 1 or sharded_ranks(profile) is not None:
        return profile
    return shard_profile(profile, default_layout(profile, shards), gradients)
