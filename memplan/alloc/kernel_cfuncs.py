"""The native entry points of the compiled allocation search: numba ``cfunc``s over
:mod:`memplan.alloc.kernel`, built once to machine code by :mod:`memplan.native` (this module is
imported only for that build; it needs numba) and called through ctypes by
:mod:`memplan.alloc.compiled`.

``run_part`` takes one int64 descriptor, the (address, length) of every array of
:class:`memplan.alloc.kernel_layout.Ctx` in field order and then of the part, and builds the
:class:`~memplan.alloc.kernel_layout.Ctx` from ``carray`` views of them (views own nothing: no
allocation, NOTE [ native kernels do not allocate ] in memplan/native.py). The C signatures are
those of :data:`memplan.alloc.kernel_layout.RUN_PART` and :data:`~memplan.alloc.kernel_layout.FIRST_FIT`.
"""

from __future__ import annotations

import numpy as np
from numba import carray, cfunc, njit, types
from numba.extending import intrinsic

from memplan.alloc import kernel
from memplan.alloc.kernel_layout import ARRAY_FIELDS, Ctx, dtype_of

_POINTERS = {
    np.int64: types.CPointer(types.int64),
    np.uint64: types.CPointer(types.uint64),
    np.float64: types.CPointer(types.float64),
}
# run_part below lists the arrays of Ctx by position: the same order, the same dtypes.
_LISTED = (
    ("first", np.int64),
    ("end", np.int64),
    ("size", np.int64),
    ("maxm", np.int64),
    ("sec_start", np.int64),
    ("sec_buf", np.int64),
    ("ov_start", np.int64),
    ("ov_buf", np.int64),
    ("tw_start", np.int64),
    ("tw_buf", np.int64),
    ("width", np.float64),
    ("area", np.float64),
    ("fsize", np.float64),
    ("letters", np.int64),
    ("mu", np.int64),
    ("offset", np.int64),
    ("solution", np.int64),
    ("total", np.int64),
    ("cuts", np.int64),
    ("rank", np.int64),
    ("trail_buf", np.int64),
    ("trail_old", np.int64),
    ("sec_stamp", np.int64),
    ("memo1", np.uint64),
    ("memo2", np.uint64),
    ("count", np.int64),
    ("stop", np.int64),
    ("ws", np.int64),
    ("fws", np.float64),
)
if tuple((name, dtype_of(name)) for name in ARRAY_FIELDS) != _LISTED:
    raise ImportError("memplan.alloc.kernel_cfuncs.run_part does not list the fields of Ctx")


def _pointer_from_address(pointer_type: types.Type) -> object:
    """An intrinsic turning an int64 address into a ``pointer_type`` (LLVM ``inttoptr``)."""

    @intrinsic
    def as_pointer(typingctx, address):
        def codegen(context, builder, signature, args):
            return builder.inttoptr(args[0], context.get_value_type(pointer_type))

        return pointer_type(types.int64), codegen

    return as_pointer


_i64_pointer = _pointer_from_address(_POINTERS[np.int64])
_u64_pointer = _pointer_from_address(_POINTERS[np.uint64])
_f64_pointer = _pointer_from_address(_POINTERS[np.float64])


@njit(nogil=True, error_model="numpy")
def _i64(d: np.ndarray, k: int) -> np.ndarray:
    """The int64 array of descriptor entry ``k`` (a view: it owns nothing)."""
    return carray(_i64_pointer(d[2 * k]), (d[2 * k + 1],))


@njit(nogil=True, error_model="numpy")
def _u64(d: np.ndarray, k: int) -> np.ndarray:
    return carray(_u64_pointer(d[2 * k]), (d[2 * k + 1],))


@njit(nogil=True, error_model="numpy")
def _f64(d: np.ndarray, k: int) -> np.ndarray:
    return carray(_f64_pointer(d[2 * k]), (d[2 * k + 1],))


_DESCRIPTOR = 2 * (len(ARRAY_FIELDS) + 1)


@cfunc(
    types.int64(
        types.CPointer(types.int64), types.int64, types.int64, types.int64, types.int64, types.int64
    ),
    nopython=True,
    error_model="numpy",
)
def run_part(desc, capacity, residual, run, lo, hi):
    """:func:`memplan.alloc.kernel.run_part` on the arrays of the descriptor ``desc``."""
    d = carray(desc, (_DESCRIPTOR,))
    c = Ctx(
        _i64(d, 0),  # first
        _i64(d, 1),  # end
        _i64(d, 2),  # size
        _i64(d, 3),  # maxm
        _i64(d, 4),  # sec_start
        _i64(d, 5),  # sec_buf
        _i64(d, 6),  # ov_start
        _i64(d, 7),  # ov_buf
        _i64(d, 8),  # tw_start
        _i64(d, 9),  # tw_buf
        _f64(d, 10),  # width
        _f64(d, 11),  # area
        _f64(d, 12),  # fsize
        _i64(d, 13),  # letters
        _i64(d, 14),  # mu
        _i64(d, 15),  # offset
        _i64(d, 16),  # solution
        _i64(d, 17),  # total
        _i64(d, 18),  # cuts
        _i64(d, 19),  # rank
        _i64(d, 20),  # trail_buf
        _i64(d, 21),  # trail_old
        _i64(d, 22),  # sec_stamp
        _u64(d, 23),  # memo1
        _u64(d, 24),  # memo2
        _i64(d, 25),  # count
        _i64(d, 26),  # stop
        _i64(d, 27),  # ws
        _f64(d, 28),  # fws
        capacity,
        residual != 0,
        run,
    )
    return kernel.run_part(c, _i64(d, 29), lo, hi)


@cfunc(
    types.int64(
        types.CPointer(types.int64),
        types.CPointer(types.int64),
        types.CPointer(types.int64),
        types.CPointer(types.int64),
        types.CPointer(types.int64),
        types.CPointer(types.int64),
        types.CPointer(types.int64),
        types.int64,
        types.int64,
        types.int64,
        types.int64,
        types.int64,
    ),
    nopython=True,
    error_model="numpy",
)
def first_fit(
    size, order, ov_start, ov_buf, offsets, stop, work, n, n_order, n_ov_buf, n_work, limit
):
    """:func:`memplan.alloc.kernel.first_fit` on arrays given by pointers and lengths."""
    return kernel.first_fit(
        carray(size, (n,)),
        carray(order, (n_order,)),
        carray(ov_start, (n + 1,)),
        carray(ov_buf, (n_ov_buf,)),
        carray(offsets, (n,)),
        limit,
        carray(stop, (1,)),
        carray(work, (n_work,)),
    )
