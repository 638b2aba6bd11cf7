"""Pieces of a tile that the Triton kernels share: the gathered terms and the allowed pairs.

Each is a ``triton.jit`` function called from inside a kernel
(`relpos_ref.kernels._triton_forward`, `relpos_ref.kernels._triton_backward`),
so that the forward pass and the backward pass, which recomputes the
forward's logits, read a term and a mask the same way.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def batch_of(pid_z, n_b, n_h):
    """The batch entry ``(a, b, h)`` of a program's flat index over ``(n_a, n_b, n_h)``."""
    return pid_z // (n_b * n_h), (pid_z // n_h) % n_b, pid_z % n_h


@triton.jit
def load_rows(X, a, b, h, sa, sb, sh, sr, rows, cols, rows_ok, cols_ok):
    """Rows `rows` of batch entry ``(a, b, h)`` of an operand, features `cols` (0 outside)."""
    return tl.load(X + a * sa + b * sb + h * sh + rows[:, None] * sr + cols[None, :],
                   mask=rows_ok[:, None] & cols_ok[None, :], other=0.0)


@triton.jit
def difference(offs_m, offs_n, n_ok, t_q, qc, KC, low, COORDS: tl.constexpr):
    """Each pair's index into a gathered term: its distance, or its difference of coordinates.

    By distance the index is ``j - i + t_q - 1`` (``r`` less the grid's
    smallest); with ``COORDS``, ``key[j] - query[i] - low`` from the
    coordinates ``qc`` (loaded for the tile's queries) and ``KC``.
    """
    if COORDS:
        kc = tl.load(KC + offs_n, mask=n_ok, other=0)
        diff = kc[None, :] - qc[:, None] - low
    else:
        diff = offs_n[None, :] - offs_m[:, None] + t_q - 1
    return diff


@triton.jit
def allowed_pairs(inside, offs_n, local_m, local_n, lead, mask_rows, smn,
                  CAUSAL: tl.constexpr, HAS_MASK: tl.constexpr):
    """The tile's pairs that may attend: inside the grid, not in the future, kept by the mask.

    A pair is in the future when ``j > i + q_offset``; with the tile's first
    query ``i0`` and first key ``j0``, ``i = i0 + local_m`` and ``j = j0 +
    local_n``, that is ``local_n - local_m > lead``, ``lead = i0 + q_offset -
    j0`` a scalar: the tile's indices enter the test, not the program's
    (built for sm_90, a causal test of the keys' indices against the
    queries' had the compiler carry their ``(BM, BN)`` broadcasts from one
    key tile to the next, in three layouts: the float16 causal bias variant
    spilled 84 bytes so, none now). ``mask_rows`` points at the mask's entry
    ``(i, 0)`` of each of the tile's queries (``(BM, 1)``); ``smn`` is its
    stride along the keys.
    """
    allowed = inside
    if CAUSAL:
        allowed = allowed & (local_n[None, :] - local_m[:, None] <= lead)
    if HAS_MASK:
        kept = tl.load(mask_rows + offs_n[None, :] * smn, mask=inside, other=0)
        allowed = allowed & (kept != 0)
    return allowed


@triton.jit
def add_gathered(s, g, s_c, offs_m, offs_n, m_ok, n_ok, inside, t_q, qc, KC, low, c0, glo, ghi,
                 SPAN: tl.constexpr, ENDS: tl.constexpr, COORDS: tl.constexpr):
    """`s` plus a gathered term, the tile's pairs read at ``g[i, diff(i, j)]`` (`difference`).

    Each pair is read (0 outside the grid), except with ``ENDS``: a term by
    distance whose map gives every difference up to ``glo`` one entry, and
    every one from ``ghi`` on another (a clipped table, T5's buckets past
    their largest distance: most tiles of a long call). A tile wholly on one
    side, its differences ``c0 .. c0 + SPAN``, reads that one entry per query.
    """
    if ENDS:
        if c0 + SPAN <= glo:
            s += tl.load(g + glo * s_c, mask=m_ok[:, None], other=0.0)
        elif c0 >= ghi:
            s += tl.load(g + ghi * s_c, mask=m_ok[:, None], other=0.0)
        else:
            diff = difference(offs_m, offs_n, n_ok, t_q, qc, KC, low, COORDS)
            s += tl.load(g + diff * s_c, mask=inside, other=0.0)
    else:
        diff = difference(offs_m, offs_n, n_ok, t_q, qc, KC, low, COORDS)
        s += tl.load(g + diff * s_c, mask=inside, other=0.0)
    return s
