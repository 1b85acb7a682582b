"""Typed stub of memplan._core, the compiled kernels (src/module.cpp and src/bind_*.cpp)."""

from typing import Any

import numpy as np
from numpy.typing import NDArray

ROTOR_OK: int
ROTOR_INFEASIBLE: int
ROTOR_SKIPPED: int
ROTOR_NO_OPTION: int
ROTOR_UNBOUNDED: int
CHOICE_F_ALL: int
CHOICE_NONE: int
ALLOC_FOUND: int
ALLOC_NOT_FOUND: int
ALLOC_ABORTED: int
ALLOC_TIMEOUT: int

def build_info() -> dict[str, Any]:
    """The core's build: ``version``, ``compiler``, ``build_type``, ``nanobind``."""

class RotorGrid:
    """A rotor table on a slot grid: status, budget in slots, plan, top values, backtracks."""

    @property
    def status(self) -> int: ...
    @property
    def capacity(self) -> int: ...
    @property
    def extra(self) -> int: ...
    @property
    def cells(self) -> int: ...
    @property
    def bounds(self) -> tuple[int, int, int]: ...
    @property
    def ops(self) -> NDArray[np.int64] | None: ...
    def top_values(self) -> list[float]: ...
    def trace(self, budget: int) -> NDArray[np.int64] | None: ...
    def value(self, a: int, b: int, m: int) -> float: ...
    def asked(self, a: int, b: int) -> list[int]: ...

def rotor_grid(
    x: NDArray[np.int64],
    s: NDArray[np.int64],
    g: NDArray[np.int64],
    fo: NDArray[np.int64],
    bo: NDArray[np.int64],
    ft: NDArray[np.float64],
    bt: NDArray[np.float64],
    budget: int,
    slots: int,
    extra: int = 0,
    single: bool = False,
    trace: bool = True,
    reach: bool = True,
    memory: int = -1,
    fa: NDArray[np.int64] | None = None,
    wh: NDArray[np.int64] | None = None,
    fr: NDArray[np.int64] | None = None,
) -> RotorGrid: ...
def rotor_dense(
    x: NDArray[np.int64],
    s: NDArray[np.int64],
    g: NDArray[np.int64],
    fo: NDArray[np.int64],
    bo: NDArray[np.int64],
    ft: NDArray[np.float64],
    bt: NDArray[np.float64],
    capacity: int,
) -> tuple[NDArray[np.float64], NDArray[np.int32]]: ...
def rotor_exact(
    x: NDArray[np.int64],
    s: NDArray[np.int64],
    g: NDArray[np.int64],
    fo: NDArray[np.int64],
    bo: NDArray[np.int64],
    ft: NDArray[np.float64],
    bt: NDArray[np.float64],
    budget: int,
    work_limit: float,
    fa: NDArray[np.int64] | None = None,
    wh: NDArray[np.int64] | None = None,
    fr: NDArray[np.int64] | None = None,
) -> tuple[int, NDArray[np.int64], float]: ...
def rotor_exact_options(
    x: NDArray[np.int64],
    s: NDArray[np.int64],
    g: NDArray[np.int64],
    fo: NDArray[np.int64],
    bo: NDArray[np.int64],
    ft: NDArray[np.float64],
    bt: NDArray[np.float64],
    option_start: NDArray[np.int64],
    option_s: NDArray[np.int64],
    option_fo: NDArray[np.int64],
    option_bo: NDArray[np.int64],
    option_bt: NDArray[np.float64],
    budget: int,
    work_limit: float,
    fa: NDArray[np.int64] | None = None,
    wh: NDArray[np.int64] | None = None,
    fr: NDArray[np.int64] | None = None,
) -> tuple[int, NDArray[np.int64], NDArray[np.int32], float, int]: ...
def pofo_backward(
    x: NDArray[np.int64],
    s: NDArray[np.int64],
    g: NDArray[np.int64],
    fo: NDArray[np.int64],
    own_b: NDArray[np.int64],
    ft: NDArray[np.float64],
    bt: NDArray[np.float64],
    fp: NDArray[np.float64],
    capacity: int,
    depth: int,
    window: int,
    beta: float,
    time_limit: float = -1.0,
    fa: NDArray[np.int64] | None = None,
) -> tuple[
    bool, NDArray[np.float64], NDArray[np.int16], NDArray[np.float64], NDArray[np.int16]
]: ...
def pofo_forward(
    x: NDArray[np.int64],
    s: NDArray[np.int64],
    g: NDArray[np.int64],
    fo: NDArray[np.int64],
    own_b: NDArray[np.int64],
    ft: NDArray[np.float64],
    bt: NDArray[np.float64],
    fp: NDArray[np.float64],
    near: NDArray[np.float64],
    last: NDArray[np.float64],
    relaxed: NDArray[np.float64] | None,
    capacity: int,
    depth: int,
    window: int,
    beta: float,
    bound: float,
    beam: int,
    tolerance: float,
    time_limit: float = -1.0,
    pinned: NDArray[np.int64] | None = None,
    fa: NDArray[np.int64] | None = None,
) -> tuple[bool, float, int, list[NDArray[np.int64] | None], list[NDArray[np.int16] | None]]: ...
def join_fill(
    x: list[NDArray[np.int64]],
    s: list[NDArray[np.int64]],
    g: list[NDArray[np.int64]],
    fo: list[NDArray[np.int64]],
    bo: list[NDArray[np.int64]],
    ft: list[NDArray[np.float64]],
    bt: list[NDArray[np.float64]],
    opt: list[NDArray[np.float64]],
    fneed: list[NDArray[np.int64]],
    g_turn: int,
    turn_need: int,
    t_turn: float,
    width: int,
    time_limit: float = -1.0,
) -> tuple[bool, NDArray[np.int64], NDArray[np.float64], NDArray[np.int16], NDArray[np.int16]]: ...
def join_least(
    x: list[NDArray[np.int64]],
    s: list[NDArray[np.int64]],
    g: list[NDArray[np.int64]],
    fo: list[NDArray[np.int64]],
    bo: list[NDArray[np.int64]],
    fneed: list[NDArray[np.int64]],
    lmt: list[NDArray[np.int64]],
    g_turn: int,
    turn_need: int,
    time_limit: float = -1.0,
) -> tuple[bool, NDArray[np.int64], NDArray[np.int8], NDArray[np.int16], NDArray[np.int16]]: ...

class AllocSearch:
    """One exact allocation search of an instance; its failed-state memo lives across calls."""

    def __init__(
        self,
        sections: int,
        first: NDArray[np.int64],
        end: NDArray[np.int64],
        size: NDArray[np.int64],
        sec_start: NDArray[np.int64],
        sec_buf: NDArray[np.int64],
        ov_start: NDArray[np.int64],
        ov_buf: NDArray[np.int64],
        tw_start: NDArray[np.int64],
        tw_buf: NDArray[np.int64],
        section_total: NDArray[np.int64],
        cuts: NDArray[np.int64],
        width: NDArray[np.float64],
        rank_twa: NDArray[np.int64],
        rank_taw: NDArray[np.int64],
        rank_wat: NDArray[np.int64],
        memo_slots: int = 0,
    ) -> None: ...
    def solve_part(
        self,
        part: NDArray[np.int64],
        lo: int,
        hi: int,
        capacity: int,
        node_budget: int,
        nodes: int,
        tight: bool,
        time_limit: float,
    ) -> tuple[int, int, NDArray[np.int64]]: ...
    def run_once(
        self,
        part: NDArray[np.int64],
        lo: int,
        hi: int,
        capacity: int,
        run: int,
        salt: int,
        node_limit: int,
        stack_entries: int = 0,
    ) -> tuple[int, int, NDArray[np.int64]]: ...

class AllocSkyline:
    """The skyline search of an instance: the exact search for large parts, O(log n) per node."""

    def __init__(
        self,
        sections: int,
        first: NDArray[np.int64],
        end: NDArray[np.int64],
        size: NDArray[np.int64],
        section_total: NDArray[np.int64],
        cuts: NDArray[np.int64],
        tw_start: NDArray[np.int64],
        tw_buf: NDArray[np.int64],
        rank_twa: NDArray[np.int64],
        rank_taw: NDArray[np.int64],
        rank_wat: NDArray[np.int64],
        memo_slots: int = 0,
    ) -> None: ...
    def parts(self) -> list[tuple[int, int]]: ...
    def part_buffers(self, lo: int, hi: int) -> NDArray[np.int64]: ...
    def solve_part(
        self,
        lo: int,
        hi: int,
        capacity: int,
        node_budget: int,
        nodes: int,
        tight: bool,
        time_limit: float,
    ) -> tuple[int, int, NDArray[np.int64]]: ...
    def run_once(
        self,
        lo: int,
        hi: int,
        capacity: int,
        preorder: int,
        twins: bool,
        salt: int,
        node_limit: int,
        time_limit: float = -1.0,
    ) -> tuple[int, int, NDArray[np.int64]]: ...

class AllocRepair:
    """Ruin and recreate (alloc_repair.cpp): local improvement of a placement."""

    def __init__(
        self,
        lower: NDArray[np.int64],
        upper: NDArray[np.int64],
        size: NDArray[np.int64],
        offsets: NDArray[np.int64],
        step: int,
        seed: int,
    ) -> None: ...
    def run(self, goal: int, max_moves: int, time_limit: float) -> int: ...
    def offer(self, offsets: NDArray[np.int64]) -> None: ...
    def best(self) -> NDArray[np.int64]: ...
    @property
    def best_arena(self) -> int: ...
    @property
    def moves(self) -> int: ...

def alloc_first_fit(
    lower: NDArray[np.int64],
    upper: NDArray[np.int64],
    size: NDArray[np.int64],
    order: NDArray[np.int64],
    ov_start: NDArray[np.int64] | None,
    ov_buf: NDArray[np.int64] | None,
    limit: int,
    time_limit: float,
    fixed: NDArray[np.int64] | None = None,
    best_fit: bool = False,
) -> tuple[int, NDArray[np.int64]]: ...
