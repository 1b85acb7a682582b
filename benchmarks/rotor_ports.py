"""Run other people's rotor dynamic programs (C) on memplan's chains, for ``bench_rotor.py --against``.

Three ports of the rotor DP (Beaumont et al. 2019) are compiled by the user **outside this tree**
(their code is never committed here): ``python benchmarks/rotor_ports.py build SRC OUT`` compiles

* ``dynamic_programs.c``: the authors' code as kept in rockmate v1.0 (topal-team/rockmate, tag
  v1.0, ``rotor/algorithms/dynamic_programs.c``; ``persistent_compute_table``);
* ``ckpt_solver_rotor.c``: ColossalAI's (hpcaitech/ColossalAI,
  ``colossalai/auto_parallel/checkpoint/ckpt_solver_rotor.c``; ``compute_table``);
* ``rk_solver.c``: rockmate's rk_rotor (topal-team/rockmate,
  ``rockmate/src/rockmate/solvers/rk_rotor/solver.c``; ``RkTable.get_opt``, which computes only the
  states reachable from the budget),

found in ``SRC`` under those names, into Python extension modules in ``OUT`` (the system C compiler
and Python's headers are needed; nothing of this is needed by memplan itself).

The three take sizes in slots. Each adapter below hands a port memplan's chain rounded exactly as
memplan's own grid rounds it (:func:`memplan.algorithms.chain.rotor.slot_sizes`), mapped onto the
port's notation: its activation sizes ``cw``/``x`` are memplan's ``x`` (the ports tie the size of an
activation's gradient to the activation, as memplan's random and bundled chains do), its ``xbar``
memplan's ``s``, its temporaries memplan's overheads (with the gradient terms the port does not
count folded in where it has a slot for them). The models still differ in small ways (the ports
check the forward of ``F_all a`` with the gradient of stage ``a + 1``, memplan with the one really
held, docs/algorithms.md pitfall 1; the authors' code holds no gradient for the loss output; the
others treat the whole forward chain of a sub-chain as its least memory), so the benchmark prints
whether the makespans agree rather than assuming it.

What is timed for a port: building its input object from the rounded arrays, its table (and, for the
authors' code and ColossalAI's, the Python dictionaries of the whole table that their Python side
reads), and reading the optimum. Their sequence building is not timed (memplan's time includes its
backtracking and, in ``bench_rotor.py``, everything :func:`memplan.algorithms.chain.solve_rotor`
does).
"""

from __future__ import annotations

import importlib
import importlib.util
import subprocess
import sys
import sysconfig
import types
from collections.abc import Callable
from pathlib import Path

import numpy as np

SOURCES = {
    "authors": ("dynamic_programs.c", "dynamic_programs"),
    "colossalai": ("ckpt_solver_rotor.c", "rotorc"),
    "rk_rotor": ("rk_solver.c", "csolver"),
}
"""port -> (source file name in SRC, module name it defines)."""


def build(source_dir: Path, out_dir: Path) -> None:
    """Compile the ports found in ``source_dir`` into ``out_dir`` (``gcc -O3``)."""
    include = sysconfig.get_paths()["include"]
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    out_dir.mkdir(parents=True, exist_ok=True)
    for port, (source, module) in SOURCES.items():
        path = source_dir / source
        if not path.exists():
            print(f"{port}: {path} not found, skipped")
            continue
        target = out_dir / f"{module}{suffix}"
        command = ["gcc", "-O3", "-shared", "-fPIC", f"-I{include}", str(path), "-o", str(target)]
        subprocess.run(command, check=True, stderr=subprocess.DEVNULL)
        print(f"{port}: {target}")


def _stub_rk_sequence_module() -> None:
    """rk_rotor's module imports ``rockmate.solvers.rk_rotor.csequence`` when loaded: stand-ins."""
    names = ["rockmate", "rockmate.solvers", "rockmate.solvers.rk_rotor"]
    for name in names:
        sys.modules.setdefault(name, types.ModuleType(name))
    sequence = types.ModuleType("rockmate.solvers.rk_rotor.csequence")
    for op in ("SeqLoss", "SeqBlockFe", "SeqBlockFn", "SeqBlockFc", "SeqBlockBwd"):
        setattr(sequence, op, lambda *args, _op=op: (_op, *args))
    sys.modules[sequence.__name__] = sequence


def _load(out_dir: Path, module: str) -> types.ModuleType | None:
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    path = out_dir / f"{module}{suffix}"
    if not path.exists():
        return None
    if module == "csolver":
        _stub_rk_sequence_module()
    spec = importlib.util.spec_from_file_location(module, path)
    assert spec is not None and spec.loader is not None
    loaded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loaded)
    return loaded


class _Namespace:
    def __init__(self, size: int, **fields: object) -> None:
        self.__dict__.update(fields)
        self._size = size

    def __len__(self) -> int:  # ColossalAI reads the chain length with len()
        return self._size


Rounded = dict[str, np.ndarray]
"""memplan's rounded sizes (slots): ``x`` (L+1), ``s``, ``fo``, ``bo`` (L), ``g`` (L+1)."""


def _authors(module: types.ModuleType) -> Callable[..., float]:
    def run(ft: list[float], bt: list[float], r: Rounded, capacity: int) -> float:
        x, s, g, fo, bo = (r[k].tolist() for k in ("x", "s", "g", "fo", "bo"))
        L = len(s)
        # Stages 0..L-1, the last one the loss (``length`` = L - 1). cw[k] = x[k] (1 <= k < L) is
        # both an activation and its gradient; cw[0] the gradient of the input, which memplan does
        # not produce (g[0] = 0); cw[L] the gradient held at the top, g[L].
        chain = _Namespace(
            L - 1,
            fweigth=ft,
            bweigth=bt,
            cweigth=[0] + x[1:L] + [g[L]],
            cbweigth=[0] + s,
            fwd_tmp=fo,
            bwd_tmp=bo,
            length=L - 1,
        )
        opt, _ = module.persistent_compute_table(chain, capacity)
        return float(opt[capacity][0][L - 1])

    return run


def _colossalai(module: types.ModuleType) -> Callable[..., float]:
    def run(ft: list[float], bt: list[float], r: Rounded, capacity: int) -> float:
        x, s, g, fo, bo = (r[k].tolist() for k in ("x", "s", "g", "fo", "bo"))
        L = len(s)
        # Its x[i + 1] / xbar[i + 1] are stage i's output and saved data; ``btmp`` stands for
        # both temporaries (its source reads ftmp from "btmp"): the larger of the two, with the
        # gradient of the input of the backward folded in.
        tmp = [max(f, gi + b) for f, gi, b in zip(fo, g[:L], bo, strict=True)]
        chain = _Namespace(
            L - 1,
            ftime=ft,
            btime=bt,
            x=[0] + x[1 : L + 1] + [g[L]],
            xbar=[0] + s,
            btmp=tmp,
        )
        opt, _ = module.compute_table(chain, capacity)
        return float(opt[capacity][0][L - 1])

    return run


def _rk_rotor(module: types.ModuleType) -> Callable[..., float]:
    def run(ft: list[float], bt: list[float], r: Rounded, capacity: int) -> float:
        x, s, g, fo, bo = (r[k].tolist() for k in ("x", "s", "g", "fo", "bo"))
        L = len(s)
        # Blocks 0..L-1 (``ln`` = L - 1 is the loss), one solution per block. cw[k] = x[k] is the
        # activation (k < L), cw[L] the gradient held at the top; its forward and backward checks
        # read cw[a + 1] and cw[a]: the gradients are folded into the temporaries.
        cw = [x[0], *x[1:L], g[L], 0]
        chain = _Namespace(
            L - 1,
            ln=L - 1,
            nb_sol=[1] * L,
            fw=[[t] for t in ft],
            bw=[[t] for t in bt],
            cw=cw,
            cbw=[[0]] + [[v] for v in s],
            fwd_tmp=[[fo[k] + g[k + 1] - cw[k + 1]] for k in range(L)],
            bwd_tmp=[[g[k + 1] + g[k] + bo[k] - cw[k]] for k in range(L)],
            ff_fwd_tmp=fo,
            ff_fw=ft,
        )
        table = module.RkTable(chain, capacity)
        return float(table.get_opt(capacity))

    return run


ADAPTERS = {"authors": _authors, "colossalai": _colossalai, "rk_rotor": _rk_rotor}


def load_ports(out_dir: Path) -> dict[str, Callable[..., float]]:
    """The ports built in ``out_dir``: name -> ``run(ft, bt, rounded, capacity) -> makespan``."""
    found = {}
    for port, (_, module) in SOURCES.items():
        loaded = _load(out_dir, module)
        if loaded is not None:
            found[port] = ADAPTERS[port](loaded)
    return found


def main() -> None:
    if len(sys.argv) != 4 or sys.argv[1] != "build":
        print("usage: python benchmarks/rotor_ports.py build SRC_DIR OUT_DIR")
        raise SystemExit(2)
    build(Path(sys.argv[2]), Path(sys.argv[3]))


if __name__ == "__main__":
    main()
