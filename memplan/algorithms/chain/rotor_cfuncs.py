"""C entry points of the rotor grid kernel (numba ``cfunc``s), for :func:`memplan.native.load`.

Imported only to build the object code (the first use after an install or a source change); the
prototypes, and everything that runs them, are in :mod:`memplan.algorithms.chain.rotor_native`,
which does not import numba. Each entry takes the four buffers of NOTE [ rotor kernel layout ]
(rotor_kernel.py) as pointers with their lengths and returns the status of the call.
"""

from __future__ import annotations

import numpy as np
from numba import carray, cfunc, types

from memplan.algorithms.chain import rotor_kernel

_BUFFERS = types.int64(
    types.voidptr,  # int64 words
    types.int64,
    types.voidptr,  # float64 words
    types.int64,
    types.voidptr,  # uint64 bit sets
    types.int64,
    types.voidptr,  # table cells (float64 or float32)
    types.int64,
)


def _grid(table_dtype):
    def entry(ints, n_ints, floats, n_floats, bits, n_bits, table, n_table):
        return rotor_kernel.grid(
            carray(ints, (n_ints,), np.int64),
            carray(floats, (n_floats,), np.float64),
            carray(bits, (n_bits,), np.uint64),
            carray(table, (n_table,), table_dtype),
        )

    return cfunc(_BUFFERS, nopython=True, error_model="numpy")(entry)


def _trace(table_dtype):
    def entry(ints, n_ints, floats, n_floats, bits, n_bits, table, n_table):
        return rotor_kernel.trace(
            carray(ints, (n_ints,), np.int64), carray(table, (n_table,), table_dtype)
        )

    return cfunc(_BUFFERS, nopython=True, error_model="numpy")(entry)


grid_f64 = _grid(np.float64)
grid_f32 = _grid(np.float32)
trace_f64 = _trace(np.float64)
trace_f32 = _trace(np.float32)
