"""The rotor grid DP of rotor_grid.py compiled (numba ``@njit``), for :mod:`memplan.native`.

The same recurrences (NOTE [ rotor recurrences ], rotor.py) on the same rounded sizes
(:func:`memplan.algorithms.chain.rotor.slot_sizes`), with **the same floating-point operations in
the same order** as :func:`memplan.algorithms.chain.rotor_grid.grid_table` and
:func:`~memplan.algorithms.chain.rotor_grid.grid_backtrack`, so that every value the plan depends
on is bit-identical to the numpy path's and the plans are the same. This module imports numba:
only :mod:`memplan.algorithms.chain.rotor_cfuncs` (compiled once by :func:`memplan.native.load`)
and the tests import it; :mod:`memplan.algorithms.chain.rotor_native` runs it.

NOTE [ rotor kernel layout ]
The kernel allocates nothing (NOTE [ native kernels do not allocate ], memplan/native.py): every
array is a view of one of four buffers the caller passes, laid out by
:class:`memplan.algorithms.chain.rotor_layout.Layout`: int64 words (a header, the sizes, per-pair
bounds, the backtrack's stack and the operations it writes), float64 words (the times), uint64
words (the budgets asked of each sub-chain, as bit sets) and the table (float64 or float32, as the
numpy path picks). Pairs ``(a, b)`` index L x L arrays at ``a * L + b``.

Where the numpy path keeps every sub-chain's row over all ``W`` budgets, the kernel stores a row
only over ``[start, top)``: ``start`` the least budget asked of it (NOTE [ rotor kernel reach ]),
``top = min(hi, W)``. Reading ``(a, b)`` at ``m`` gives infinity below ``start``, the sub-chain's
lower bound ``tp`` (its store-all plan) from ``top`` on (``top < W`` means ``top = hi``), the
stored cell between; stored budgets beyond the last one asked are infinite (the numpy path's
initial value). A budget asked of a sub-chain only asks its parts for budgets that are asked of
them, or below their ``lo`` (infinite in both), or from their ``hi`` on (``tp`` in both), so every
value that the top problem and the backtrack read is the numpy path's, operation for operation.
Values at budgets nobody asks for may differ (upper bounds in both).

NOTE [ rotor kernel reach ]
The kernel always restricts rows to the budgets the top problem asks for, whatever the chain's
length (the numpy path does from :data:`~memplan.algorithms.chain.rotor_grid._REACH_CELLS` on
only, where propagating them costs it less than it saves): the same propagation as
:func:`memplan.algorithms.chain.rotor_grid.reachable_ranges`, on bit sets (64 budgets a word). On
10 stages at 500 slots this leaves 5-15% of the cells of the full windows, and the kernel's call
takes about 12 us there. Each row is then filled over its whole asked range at once, budgets
innermost, in loops over slices that LLVM vectorizes (filling only the asked budgets one by one
was slower at every length tried: their reads jump between rows and mispredict).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from memplan.algorithms.chain.rotor_layout import (
    F_ALL,
    F_CK,
    F_N,
    H_BUDGET,
    H_CAPACITY,
    H_CELLS,
    H_EXTRA,
    H_LENGTH,
    H_LOWER,
    H_MEMORY,
    H_OFFSETS,
    H_OPS,
    H_REACH,
    H_ROUNDED,
    H_SLOTS,
    H_STATUS,
    H_STOP,
    H_STORE_ALL,
    H_TRACE,
    HEADER,
    INFEASIBLE,
    INT64_SAFE,
    NO_OPTION,
    OK,
    OVERFLOW,
    PAIR_ARRAYS,
    SKIPPED,
    SMALL_BUFFER,
    STOPPED,
    UNBOUNDED,
    B,
)


@njit(nogil=True, error_model="numpy", cache=False)
def round_up(raw, out, num, den):
    """``out = ceil(raw * den / num)`` (slot_sizes' rounding); False when ``raw * den`` could
    overflow int64 (then the caller rounds in Python ints)."""
    limit = np.int64(9223372036854775807) // den
    for i in range(raw.shape[0]):
        v = raw[i]
        if v > limit:
            return False
        p = v * den
        q = p // num
        if q * num < p:
            q += 1
        out[i] = q
    return True


@njit(nogil=True, error_model="numpy", cache=False)
def chain_bounds(L, sizes, later, out):
    """``out[0:3]`` = the least-memory lower and upper bounds of
    :func:`memplan.algorithms.chain.least_memory.least_memory_bounds` and the peak of
    :meth:`memplan.algorithms.chain.problem.Chain.store_all_peak`, in bytes, the same sums in
    the same order; False (nothing computed) when the sizes add up to :data:`INT64_SAFE` or more
    (then some sum might not be exact in int64). ``sizes`` holds ``x, s, g, fo, bo`` (bytes),
    ``later`` is L words of scratch."""
    total = 0
    for i in range(sizes.shape[0]):
        if sizes[i] >= INT64_SAFE - total:
            return False
        total += sizes[i]
    x, s, g, fo, bo = _split(sizes, L)
    x0 = x[0]
    smallest = g[L]  # later[k]: min over c > k of g[c + 1] (k < L - 1)
    for k in range(L - 2, -1, -1):
        smallest = min(smallest, g[k + 2])
        later[k] = smallest
    lower = x0 + g[L]
    upper = x0 + g[L]
    transient = 0
    for k in range(L):
        own = g[k + 1] + s[k] + g[k] + bo[k]
        av = min(x[k], s[k - 1]) if k > 0 else 0
        forward_now = x0 + av + g[k + 1] + s[k] + fo[k]
        if k < L - 1:
            own_next = g[k + 2] + s[k + 1] + g[k + 1] + bo[k + 1]
            earlier = x0 + max(av + s[k] + fo[k] + later[k], s[k] + own_next)
            forward_now = min(forward_now, earlier)
        lower = max(lower, x0 + av + own, forward_now)
        held_input = x[k] if k > 0 else 0
        upper = max(
            upper,
            x0 + held_input + g[k + 1] + s[k] + fo[k],
            x0 + held_input + own,
            x0 + g[k + 1] + transient if k > 0 else 0,
        )
        transient = max(transient, x[k + 1] + fo[k] + (x[k] if k > 0 else 0))
    held = x0
    peak = held + g[L]
    for k in range(L):
        peak = max(peak, held + g[L] + s[k] + fo[k], held + s[k] + g[k + 1] + g[k] + bo[k])
        held += s[k]
    out[0] = lower
    out[1] = upper
    out[2] = peak
    return True


@njit(nogil=True, error_model="numpy", cache=False)
def sub_chain_bounds(L, s, g, fo, bo, lo, hi):
    """``lo`` and ``hi`` (L x L, at ``a * L + b``) of
    :func:`memplan.algorithms.chain.rotor_grid.sub_chain_bounds`."""
    for b in range(L):
        floor = 0
        last = g[b + 1] + s[b] + fo[b]
        above = 0
        for a in range(b, -1, -1):
            own = g[a + 1] + s[a] + g[a] + bo[a]
            floor = max(floor, own)
            need_fa = max(g[b + 1] + s[a] + fo[a], own)
            above = need_fa if a == b else max(need_fa, s[a] + above)
            lo[a * L + b] = max(floor, last)
            hi[a * L + b] = above


_ZERO = np.uint64(0)
_ONE = np.uint64(1)
_ALL = ~np.uint64(0)


@njit(nogil=True, error_model="numpy", cache=False, inline="always")
def _popcount(v):
    v = v - ((v >> np.uint64(1)) & np.uint64(0x5555555555555555))
    v = (v & np.uint64(0x3333333333333333)) + ((v >> np.uint64(2)) & np.uint64(0x3333333333333333))
    v = (v + (v >> np.uint64(4))) & np.uint64(0x0F0F0F0F0F0F0F0F)
    return np.int64((v * np.uint64(0x0101010101010101)) >> np.uint64(56))


@njit(nogil=True, error_model="numpy", cache=False, inline="always")
def _low_bit(v):
    """Index of the lowest set bit of ``v != 0``."""
    return _popcount((v & (_ZERO - v)) - _ONE)


@njit(nogil=True, error_model="numpy", cache=False, inline="always")
def _high_bit(v):
    """Index of the highest set bit of ``v != 0``."""
    v |= v >> np.uint64(1)
    v |= v >> np.uint64(2)
    v |= v >> np.uint64(4)
    v |= v >> np.uint64(8)
    v |= v >> np.uint64(16)
    v |= v >> np.uint64(32)
    return _popcount(v) - 1


@njit(nogil=True, error_model="numpy", cache=False, inline="always")
def _below(k):
    """The bits ``[0, k)`` of a word, ``0 <= k <= 64``."""
    return _ALL if k >= 64 else (_ONE << np.uint64(k)) - _ONE


@njit(nogil=True, error_model="numpy", cache=False, inline="always")
def _span(w, first, end):
    """The bits of word ``w`` (budgets ``64 w .. 64 w + 63``) in ``[first, end)``."""
    low = min(max(first - 64 * w, 0), 64)
    high = min(max(end - 64 * w, 0), 64)
    return _below(high) & ~_below(low)


@njit(nogil=True, error_model="numpy", cache=False, inline="always")
def _shifted_word(bits, src, k, words, w):
    """Word ``w`` of the bit set at ``bits[src:]`` shifted down by ``k`` budgets (bit ``m`` of
    the result is bit ``m + k`` of the set)."""
    i = w + (k >> 6)
    if i >= words:
        return _ZERO
    r = np.uint64(k & 63)
    v = bits[src + i] >> r
    if r != _ZERO and i + 1 < words:
        v |= bits[src + i + 1] << (np.uint64(64) - r)
    return v


@njit(nogil=True, error_model="numpy", cache=False)
def asked_budgets(L, W, x, s, lo, hi, ask_from, ask_to, reach, bits, first, last, stop):
    """The budgets the top problem at ``ask_from..ask_to`` asks of every sub-chain, as bit sets
    over the ``W`` budgets (pair ``ab``: words ``ab * NW ..``, ``NW = ceil(W / 64)``), with the
    least and largest of them (``first > last``: none).

    The propagation of :func:`memplan.algorithms.chain.rotor_grid.reachable_ranges`, row ``a``
    by row: ``(a, b)`` is asked the budgets in its window ``[lo, hi)`` that ``(a, b' >= b)`` is
    asked by the rows above (``(a' < a, b')`` with ``x[a]`` more, ``(a - 1, b')`` with
    ``s[a - 1]`` more). With ``reach`` 0 every budget of the window is asked (the numpy path's
    small mode). ``bits`` holds the pairs' sets, then (per ``b``) the union over the rows above,
    then a scratch row. Only the words of each window are computed (the others are zero).
    Returns False when ``stop[0]`` was set (checked before each row).
    """
    words = (W + 63) // 64
    above = L * L * words
    inh = above + L * words  # the budgets asked of (a, b' > b), this row a
    for i in range(above + L * words):
        bits[i] = _ZERO
    for a in range(L):
        if stop[0] != 0:
            return False
        for w in range(words):
            bits[inh + w] = _ZERO
        for b in range(L - 1, a - 1, -1):
            ab = a * L + b
            mine = ab * words
            before = above + b * words
            up = (ab - L) * words  # (a - 1, b)
            w_lo = min(max(lo[ab], 0), W)
            w_hi = min(max(hi[ab], w_lo), W)
            f = W
            t = -1
            if w_lo < w_hi:
                w0 = w_lo // 64
                w1 = (w_hi - 1) // 64
                low_edge = ~_below(w_lo - 64 * w0)
                high_edge = _below(w_hi - 64 * w1)
                for w in range(w0, w1 + 1):
                    window = _ALL
                    if w == w0:
                        window &= low_edge
                    if w == w1:
                        window &= high_edge
                    if not reach:
                        v = window
                    else:
                        if a == 0:
                            asked = _ZERO
                            if b == L - 1:
                                asked = _span(w, ask_from, ask_to + 1)
                        else:
                            asked = _shifted_word(bits, before, x[a], words, w)
                            asked |= _shifted_word(bits, up, s[a - 1], words, w)
                        direct = asked & window
                        v = direct | (bits[inh + w] & window)
                        bits[inh + w] |= direct
                    bits[mine + w] = v
                    bits[before + w] |= v
                    if v != _ZERO:
                        if f == W:
                            f = 64 * w + _low_bit(v)
                        t = 64 * w
                if t >= 0:
                    t += _high_bit(bits[mine + t // 64])
            first[ab] = f
            last[ab] = t
    return True


@njit(nogil=True, error_model="numpy", cache=False, inline="always")
def _read(table, rows, start, top, base, tp, inf, ab, m):
    """The value of pair ``ab`` at budget ``m < W`` (NOTE [ rotor kernel layout ]), without
    branches (they mispredict: budgets jump between the rows a cell reads)."""
    st = start[ab]
    tt = top[ab]
    i = min(max(m - st, 0), max(tt - st - 1, 0))
    v = table[rows + base[ab] + i]
    v = inf if m < st else v
    return tp[ab] if m >= tt else v


@njit(nogil=True, error_model="numpy", cache=False, inline="always")
def _scan(found, m0, m1, right, roff, rconst, rstored, left, loff, lconst, lstored, fp_j):
    """``found[m] = min(found[m], (R(m) + fp_j) + L(m))`` for ``m0 <= m < m1``: the candidate of
    grid_table's option 2 in its order (``shifted + values``), ``R(m)`` being ``right[m - roff]``
    (stored) or ``rconst``, ``L(m)`` ``left[m - loff]`` or ``lconst``.

    Loops run over slices with ``range`` indices: numba then drops the negative-index check
    that keeps LLVM from vectorizing them (5x slower).
    """
    n = m1 - m0
    out = found[m0:m1]
    if rstored and lstored:
        rv = right[m0 - roff : m1 - roff]
        lv = left[m0 - loff : m1 - loff]
        for i in range(n):
            c = (rv[i] + fp_j) + lv[i]
            f = out[i]
            out[i] = c if c < f else f
    elif rstored:
        rv = right[m0 - roff : m1 - roff]
        for i in range(n):
            c = (rv[i] + fp_j) + lconst
            f = out[i]
            out[i] = c if c < f else f
    elif lstored:
        rc = rconst + fp_j
        lv = left[m0 - loff : m1 - loff]
        for i in range(n):
            c = rc + lv[i]
            f = out[i]
            out[i] = c if c < f else f
    else:
        c = (rconst + fp_j) + lconst
        for i in range(n):
            f = out[i]
            out[i] = c if c < f else f


@njit(nogil=True, error_model="numpy", cache=False, inline="always")
def _fill(values, value):
    for i in range(values.shape[0]):
        values[i] = value


@njit(nogil=True, error_model="numpy", cache=False)
def _row_vector(
    L,
    W,
    x,
    s,
    g,
    fo,
    bo,
    a,
    b,
    start,
    top,
    base,
    last,
    table,
    rows,
    tp,
    inf,
    found,
    fprefix,
    fa_times,
):
    """Row ``(a, b)`` at every budget from its first asked to its last, budgets innermost (the
    numpy path's order of work, vectorized by LLVM)."""
    ab = a * L + b
    grad = g[b + 1]
    st = start[ab]
    en = last[ab] + 1
    row = table[rows + base[ab] : rows + base[ab] + top[ab] - st]
    # Option 1: F_all a, then a+1..b with m - s[a] slots.
    sa = s[a]
    own = g[a + 1] + sa + g[a] + bo[a]
    fa_from = min(max(st, sa, grad + sa + fo[a], own), en)
    _fill(row[: fa_from - st], inf)
    if fa_from < en:
        c = ab + L  # (a + 1, b)
        cs, ct, ctp = start[c], top[c], tp[c]
        child = table[rows + base[c] : rows + base[c] + ct - cs]
        fat = fa_times[a]
        m1 = min(max(cs + sa, fa_from), en)
        _fill(row[fa_from - st : m1 - st], inf)
        m2 = min(max(ct + sa, m1), en)
        into = row[m1 - st : m2 - st]
        read = child[m1 - sa - cs : m2 - sa - cs]
        for i in range(m2 - m1):
            into[i] = read[i] + fat
        _fill(row[m2 - st : en - st], ctp + fat)
    # Option 2: checkpoint x[j], j = a+1..b.
    _fill(found[st:en], inf)
    run = x[a + 1] + fo[a]
    for r in range(b - a):
        j = a + 1 + r
        if r > 0:
            run = max(run, x[a + r] + x[a + r + 1] + fo[a + r])
        fw = run + grad
        if fw >= en:
            break  # the forward grows with j: no later split fits either
        xj = x[j]
        rr = j * L + b
        ll = ab - b + j - 1  # (a, j - 1)
        rs, rt = start[rr], top[rr]
        ls, lt = start[ll], top[ll]
        p = max(st, fw, xj + rs, ls)
        right = table[rows + base[rr] : rows + base[rr] + rt - rs]
        left = table[rows + base[ll] : rows + base[ll] + lt - ls]
        q_right = rt + xj  # from here on the right part reads its tp (then rt < W)
        fp_j = fprefix[j]
        while p < en:
            rstored = p < q_right
            lstored = p < lt
            nxt = en
            if rstored:
                nxt = min(nxt, q_right)
            if lstored:
                nxt = min(nxt, lt)
            _scan(found, p, nxt, right, xj + rs, tp[rr], rstored, left, ls, tp[ll], lstored, fp_j)
            p = nxt
    fpa = fprefix[a]
    into = row[: en - st]
    read = found[st:en]
    for i in range(en - st):
        v = read[i] - fpa
        o = into[i]
        into[i] = v if v < o else o


@njit(nogil=True, error_model="numpy", cache=False)
def fill_table(
    L, W, x, s, g, fo, bo, ft, bt, tprefix, hi, first, last, start, top, base, table, t, stop
):
    """Lay out and fill the rows of every asked sub-chain (NOTE [ rotor kernel layout ]); returns
    the cells the rows take, -1 when ``table`` is too small, -2 when ``stop[0]`` was set (checked
    before each row). ``t`` holds the table's offsets (``t_tp, t_found, t_fprefix, t_fa,
    t_rows``).

    The operations are grid_table's: ``fprefix = cumsum(ft)`` in float64 then cast,
    ``tprefix = cumsum(ft + bt)`` in float64, ``fa_times = ft + bt`` cast, ``tp = tprefix[b + 1] -
    tprefix[a]`` cast; per row, ``F_all a`` (``value(a+1, b)(m - s[a]) + fa_times[a]``) against
    the minimum over the splits ``j`` of ``(value(j, b)(m - x[j]) + fprefix[j]) + value(a,
    j-1)(m)``, minus ``fprefix[a]``.
    """
    t_tp, t_found, t_fprefix, t_fa, rows = t[0], t[1], t[2], t[3], t[4]
    cells = 0
    for b in range(L):
        for a in range(b, -1, -1):
            ab = a * L + b
            t_top = min(hi[ab], W)
            base[ab] = cells
            if first[ab] <= last[ab]:
                start[ab] = first[ab]
                top[ab] = t_top
                cells += t_top - first[ab]
            else:
                start[ab] = t_top
                top[ab] = t_top
    if rows + cells > table.shape[0]:
        return -1
    table[0] = np.inf
    inf = table[0]  # infinity in the table's own type
    tp = table[t_tp : t_tp + L * L]
    found = table[t_found : t_found + W]
    fprefix = table[t_fprefix : t_fprefix + L + 1]
    fa_times = table[t_fa : t_fa + L]
    acc = 0.0
    tacc = 0.0
    fprefix[0] = 0.0
    tprefix[0] = 0.0
    for k in range(L):
        acc += ft[k]
        fprefix[k + 1] = acc
        both = ft[k] + bt[k]
        tacc += both
        tprefix[k + 1] = tacc
        fa_times[k] = both
    for b in range(L):
        for a in range(b, -1, -1):
            ab = a * L + b
            tp[ab] = tprefix[b + 1] - tprefix[a]
            if a == b or first[ab] > last[ab]:
                continue
            if stop[0] != 0:
                return -2
            st = start[ab]
            row = table[rows + base[ab] : rows + base[ab] + top[ab] - st]
            _fill(row[last[ab] + 1 - st :], inf)
            _row_vector(
                L,
                W,
                x,
                s,
                g,
                fo,
                bo,
                a,
                b,
                start,
                top,
                base,
                last,
                table,
                rows,
                tp,
                inf,
                found,
                fprefix,
                fa_times,
            )
    return cells


@njit(nogil=True, error_model="numpy", cache=False)
def backtrack(L, x, s, g, fo, bo, hi, start, top, base, table, t, budget, ops, stack):
    """The operations of ``opt(0, L-1)(budget)`` into ``ops`` (pairs ``code, stage``), as
    :func:`memplan.algorithms.chain.rotor_grid.grid_backtrack` builds them: at each visited
    ``(a, b, m)`` the options are evaluated with the table's operations, ``F_all a`` first, then
    the least ``j`` reaching the stored value. Returns the number of operations, or a negative
    status (:data:`NO_OPTION`, :data:`SMALL_BUFFER`); :data:`INFEASIBLE` is the caller's check.
    """
    t_tp, t_fprefix, t_fa, t_rows = t[0], t[2], t[3], t[4]
    inf = table[0]
    tp = table[t_tp : t_tp + L * L]
    fprefix = table[t_fprefix : t_fprefix + L + 1]
    fa_times = table[t_fa : t_fa + L]
    n_ops = ops.shape[0]
    n_stack = stack.shape[0] // 4
    n = 0
    sp = 1
    stack[0], stack[1], stack[2], stack[3] = 1, 0, L - 1, budget
    while sp > 0:
        sp -= 1
        kind, a, b, m = stack[4 * sp], stack[4 * sp + 1], stack[4 * sp + 2], stack[4 * sp + 3]
        if kind == 0:
            if n + 1 > n_ops:
                return SMALL_BUFFER
            ops[n] = 4 * a + B
            n += 1
            continue
        ab = a * L + b
        if a == b or m >= hi[ab]:  # one stage, or the sub-chain's store-all fits
            if n + 2 * (b - a + 1) > n_ops:
                return SMALL_BUFFER
            for k in range(a, b + 1):
                ops[n] = 4 * k + F_ALL
                n += 1
            for k in range(b, a - 1, -1):
                ops[n] = 4 * k + B
                n += 1
            continue
        if sp + 2 > n_stack or n + (b - a) > n_ops:
            return SMALL_BUFFER
        target = _read(table, t_rows, start, top, base, tp, inf, ab, m)
        sa = s[a]
        need_fa = max(g[b + 1] + sa + fo[a], g[a + 1] + sa + g[a] + bo[a])
        if m >= need_fa and m >= sa:
            fa = _read(table, t_rows, start, top, base, tp, inf, ab + L, m - sa) + fa_times[a]
            if fa == target:
                ops[n] = 4 * a + F_ALL
                n += 1
                stack[4 * sp], stack[4 * sp + 1], stack[4 * sp + 2] = 0, a, a
                stack[4 * sp + 3] = 0
                sp += 1
                stack[4 * sp], stack[4 * sp + 1], stack[4 * sp + 2] = 1, a + 1, b
                stack[4 * sp + 3] = m - sa
                sp += 1
                continue
        split = -1
        run = x[a + 1] + fo[a]
        for r in range(b - a):
            j = a + 1 + r
            if r > 0:
                run = max(run, x[a + r] + x[a + r + 1] + fo[a + r])
            if run + g[b + 1] <= m and m - x[j] >= 0:
                right = _read(table, t_rows, start, top, base, tp, inf, j * L + b, m - x[j])
                left = _read(table, t_rows, start, top, base, tp, inf, ab - b + j - 1, m)
                option = ((right + fprefix[j]) + left) - fprefix[a]
                if option == target:
                    split = j
                    break
        if split < 0:
            return NO_OPTION
        ops[n] = 4 * a + F_CK
        n += 1
        for k in range(a + 1, split):
            ops[n] = 4 * k + F_N
            n += 1
        stack[4 * sp], stack[4 * sp + 1], stack[4 * sp + 2] = 1, a, split - 1
        stack[4 * sp + 3] = m
        sp += 1
        stack[4 * sp], stack[4 * sp + 1], stack[4 * sp + 2] = 1, split, b
        stack[4 * sp + 3] = m - x[split]
        sp += 1
    return n


@njit(nogil=True, error_model="numpy", cache=False)
def _sections(L):
    """The int sections of NOTE [ rotor kernel layout ] (mirrors :class:`Layout`)."""
    sizes = 5 * L + 2
    raw = HEADER
    rounded = raw + sizes
    pairs = rounded + sizes
    stack = pairs + PAIR_ARRAYS * L * L
    ops = stack + 4 * (4 * L + 8)
    ops_end = ops + L * L + L
    return raw, rounded, pairs, stack, ops, ops_end


@njit(nogil=True, error_model="numpy", cache=False)
def _split(sizes, L):
    """``x, s, g, fo, bo`` of a sizes section (that order)."""
    return (
        sizes[0 : L + 1],
        sizes[L + 1 : 2 * L + 1],
        sizes[2 * L + 1 : 3 * L + 2],
        sizes[3 * L + 2 : 4 * L + 2],
        sizes[4 * L + 2 : 5 * L + 2],
    )


@njit(nogil=True, error_model="numpy", cache=False)
def _table_offsets(t, L, W):
    t[0] = 2  # tp
    t[1] = t[0] + L * L  # found
    t[2] = t[1] + W  # fprefix
    t[3] = t[2] + L + 1  # fa_times
    t[5] = t[3] + L  # top values
    t[4] = t[5] + W  # rows


@njit(nogil=True, error_model="numpy", cache=False)
def grid(ints, floats, bits, table):
    """The whole grid solve of NOTE [ rotor kernel layout ]: round the sizes, bound the
    sub-chains, find the asked budgets, fill the table, read the top values
    (``capacity..capacity + extra`` into the table's top-values section) and backtrack at
    ``capacity + H_TRACE``. Returns (and stores in the header) the status.

    With ``H_MEMORY``, first the chain's bounds (:func:`chain_bounds`): the grid is skipped
    (:data:`SKIPPED`) when the memory is below the lower bound or store-all fits."""
    L, budget, slots, extra = ints[H_LENGTH], ints[H_BUDGET], ints[H_SLOTS], ints[H_EXTRA]
    ints[H_OPS] = 0
    raw, rounded, pairs, stack, ops, ops_end = _sections(L)
    if ops_end > ints.shape[0] or floats.shape[0] < 3 * L + 1:
        ints[H_STATUS] = SMALL_BUFFER
        return SMALL_BUFFER
    memory = ints[H_MEMORY]
    if memory >= 0:
        bounds = ints[H_LOWER : H_LOWER + 3]
        if not chain_bounds(L, ints[raw : raw + 5 * L + 2], ints[pairs : pairs + L], bounds):
            ints[H_STATUS] = UNBOUNDED
            return UNBOUNDED
        if memory < ints[H_LOWER] or ints[H_STORE_ALL] <= memory:
            ints[H_STATUS] = SKIPPED
            return SKIPPED
    if budget <= slots:
        num, den, capacity = np.int64(1), np.int64(1), budget
    else:
        num, den, capacity = budget, slots, slots
    ints[H_CAPACITY] = capacity
    W = capacity + extra + 1
    if bits.shape[0] < (L * L + L + 2) * ((W + 63) // 64):
        ints[H_STATUS] = SMALL_BUFFER
        return SMALL_BUFFER
    sizes = ints[rounded : rounded + 5 * L + 2]
    if ints[H_ROUNDED] == 0 and not round_up(ints[raw : raw + 5 * L + 2], sizes, num, den):
        ints[H_STATUS] = OVERFLOW
        return OVERFLOW
    x, s, g, fo, bo = _split(sizes, L)
    LL = L * L
    lo = ints[pairs : pairs + LL]
    hi = ints[pairs + LL : pairs + 2 * LL]
    first = ints[pairs + 2 * LL : pairs + 3 * LL]
    last = ints[pairs + 3 * LL : pairs + 4 * LL]
    start = ints[pairs + 4 * LL : pairs + 5 * LL]
    top = ints[pairs + 5 * LL : pairs + 6 * LL]
    base = ints[pairs + 6 * LL : pairs + 7 * LL]
    stop = ints[H_STOP : H_STOP + 1]
    sub_chain_bounds(L, s, g, fo, bo, lo, hi)
    if not asked_budgets(
        L, W, x, s, lo, hi, capacity, capacity + extra, ints[H_REACH], bits, first, last, stop
    ):
        ints[H_STATUS] = STOPPED
        return STOPPED
    t = ints[H_OFFSETS : H_OFFSETS + 6]
    _table_offsets(t, L, W)
    ft, bt, tprefix = floats[0:L], floats[L : 2 * L], floats[2 * L : 3 * L + 1]
    cells = fill_table(
        L, W, x, s, g, fo, bo, ft, bt, tprefix, hi, first, last, start, top, base, table, t, stop
    )
    if cells < 0:
        ints[H_STATUS] = STOPPED if cells == -2 else SMALL_BUFFER
        return ints[H_STATUS]
    ints[H_CELLS] = cells
    tp = table[t[0] : t[0] + LL]
    for k in range(extra + 1):
        table[t[5] + k] = _read(table, t[4], start, top, base, tp, table[0], L - 1, capacity + k)
    return trace(ints, table)


@njit(nogil=True, error_model="numpy", cache=False)
def trace(ints, table):
    """The backtrack at ``capacity + H_TRACE`` of a table :func:`grid` filled (the same
    buffers); ``H_OPS`` operations. Returns (and stores) the status."""
    L, extra, at = ints[H_LENGTH], ints[H_EXTRA], ints[H_TRACE]
    capacity = ints[H_CAPACITY]
    ints[H_OPS] = 0
    if at < 0:
        ints[H_STATUS] = OK
        return OK
    W = capacity + extra + 1
    raw, rounded, pairs, stack, ops, ops_end = _sections(L)
    x, s, g, fo, bo = _split(ints[rounded : rounded + 5 * L + 2], L)
    LL = L * L
    hi = ints[pairs + LL : pairs + 2 * LL]
    start = ints[pairs + 4 * LL : pairs + 5 * LL]
    top = ints[pairs + 5 * LL : pairs + 6 * LL]
    base = ints[pairs + 6 * LL : pairs + 7 * LL]
    t = ints[H_OFFSETS : H_OFFSETS + 6]
    _table_offsets(t, L, W)
    tp = table[t[0] : t[0] + LL]
    if _read(table, t[4], start, top, base, tp, table[0], L - 1, capacity + at) == table[0]:
        ints[H_STATUS] = INFEASIBLE
        return INFEASIBLE
    n = backtrack(
        L,
        x,
        s,
        g,
        fo,
        bo,
        hi,
        start,
        top,
        base,
        table,
        t,
        capacity + at,
        ints[ops:ops_end],
        ints[stack:ops],
    )
    if n < 0:
        ints[H_STATUS] = n
        return n
    ints[H_OPS] = n
    ints[H_STATUS] = OK
    return OK
