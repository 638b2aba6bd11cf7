r"""The fused backward kernels of the distance form's bias family, as Triton source.

For a form with no window terms (plain attention and its dense terms,
bias, T5, ALiBi, Swin, RoPE, absolute, grid2d: the content product and
gathered terms only), the gradients of

.. math:: o = \operatorname{softmax}(l)\, v, \qquad l = s\, q' k'^\top + G_1 + G_2

for the cotangent ``do`` are, with ``p`` recomputed from the forward's
log-sum-exp of each row and :math:`\delta_i = \sum_c do_{ic}\, o_{ic}`,

.. math::
    dv = p^\top do, \quad dl = p \circ (do\, v^\top - \delta), \quad
    dq' = s\, dl\, k', \quad dk' = s\, dl^\top q',

    dG[i, \text{diff}(i, j)] \mathrel{+}= dl_{ij}.

Two kernels, each a walk over tiles as the forward's: `attention_dq` takes
``BM`` queries and walks the keys (``dq'`` and the gathered terms'
gradients), `attention_dkdv` takes ``BN`` keys and walks the queries (``dk'``
and ``dv``), so that neither writes another program's rows. A bias row by
distance (``G*_ROW``: one row shared by the queries) gets the sum of each
tile's diagonals, one atomic addition per distance of the tile's window
(``BM + BN - 1``) instead of one per pair; with ``G_ENDS``, a tile wholly
where the row's map reads one table entry, one addition. 16-bit products run as in the
forward (`relpos_ref.kernels._triton_forward.product`), ``p`` and ``dl``
split in two 16-bit parts.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ._triton_forward import product
from ._triton_tiles import add_gathered, allowed_pairs, batch_of, difference, load_rows


@triton.jit
def _logits(q, k, scale, g1, g2, qc1, qc2, KC1, KC2, low1, low2, s1c, s2c, glo, ghi, offs_m,
            offs_n, m_ok, n_ok, inside, c0, t_q, SPAN: tl.constexpr, NG: tl.constexpr,
            G1_COORDS: tl.constexpr, G2_COORDS: tl.constexpr, G_ENDS: tl.constexpr,
            Q_WIDE: tl.constexpr, K_WIDE: tl.constexpr, DOT: tl.constexpr,
            OPERAND: tl.constexpr, PRECISION: tl.constexpr):
    # the forward's logits of a tile, before the mask (c0: the tile's smallest difference)
    s = product(q, tl.trans(k), Q_WIDE, K_WIDE, DOT, OPERAND, PRECISION) * scale
    if NG >= 1:
        s = add_gathered(s, g1, s1c, offs_m, offs_n, m_ok, n_ok, inside, t_q, qc1, KC1,
                         low1, c0, glo, ghi, SPAN, G_ENDS, G1_COORDS)
    if NG >= 2:
        s = add_gathered(s, g2, s2c, offs_m, offs_n, m_ok, n_ok, inside, t_q, qc2, KC2,
                         low2, c0, glo, ghi, SPAN, G_ENDS, G2_COORDS)
    return s


@triton.jit
def _row_gradient(e, e_c, dl, c0, glo, ghi, n_diff, w, spread, spread_ok, SPAN: tl.constexpr,
                  ENDS: tl.constexpr):
    """A tile's ``dl`` summed into the gradient of a bias row by distance, ``e[c]``.

    Each of the tile's differences ``c0 + w`` gets the sum of its diagonal,
    one atomic addition per difference. With ``ENDS``, a tile wholly where
    the terms' maps read one entry (``c <= glo`` or ``c >= ghi``, as
    `add_gathered` reads it) adds its whole sum at ``glo`` or ``ghi``: those
    differences read one table entry, whose gradient through the map is the same.
    """
    if ENDS and c0 + SPAN <= glo:
        tl.atomic_add(e + glo * e_c, tl.sum(tl.sum(dl, axis=1), axis=0))
    elif ENDS and c0 >= ghi:
        tl.atomic_add(e + ghi * e_c, tl.sum(tl.sum(dl, axis=1), axis=0))
    else:
        along = tl.gather(dl, tl.where(spread_ok, spread, 0), axis=1)
        sums = tl.sum(tl.where(spread_ok, along, 0.0), axis=0)
        c = c0 + w
        tl.atomic_add(e + c * e_c, sums, mask=(c >= 0) & (c < n_diff))


@triton.jit
def _weights(s, allowed, lse):
    # the forward's weights from its log-sum-exp; 0 for pairs not allowed and empty rows
    keep = allowed & (lse != float("-inf"))[:, None]
    return tl.where(keep, tl.exp(s - tl.where(keep, lse[:, None], 0.0)), 0.0)


@triton.jit
def attention_dq(
    Q, K, V, DO, LSE, DELTA, DQ,
    sqa, sqb, sqh, sqm, ska, skb, skh, skn, sva, svb, svh, svn, sda, sdb, sdh, sdm,
    n_b, n_h, t_q, t_k, q_offset, scale, n_diff,
    Mask, sma, smb, smh, smm, smn,
    G1, s1a, s1b, s1h, s1m, s1c, QC1, KC1, low1, DG1, e1a, e1b, e1h, e1m, e1c,
    G2, s2a, s2b, s2h, s2m, s2c, QC2, KC2, low2, DG2, e2a, e2b, e2h, e2m, e2c, glo, ghi,
    D: tl.constexpr, DV: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BW: tl.constexpr,
    CAUSAL: tl.constexpr, HAS_MASK: tl.constexpr,
    NG: tl.constexpr, G1_COORDS: tl.constexpr, G2_COORDS: tl.constexpr, G_ENDS: tl.constexpr,
    G1_ROW: tl.constexpr, G2_ROW: tl.constexpr,
    DOT: tl.constexpr, PRECISION: tl.constexpr, SPLIT: tl.constexpr,
    Q_WIDE: tl.constexpr, K_WIDE: tl.constexpr, INTERPRET: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_z = tl.program_id(1)
    a, b, h = batch_of(pid_z, n_b, n_h)
    i0 = pid_m * BM
    ii = tl.arange(0, BM)
    jj = tl.arange(0, BN)
    w = tl.arange(0, BW)
    offs_m = i0 + ii
    offs_d = tl.arange(0, BD)
    offs_dv = tl.arange(0, BDV)
    m_ok = offs_m < t_q
    d_ok = offs_d < D
    dv_ok = offs_dv < DV
    WIDE: tl.constexpr = INTERPRET and DOT == tl.bfloat16  # noqa: SIM300
    OPERAND: tl.constexpr = tl.float32 if WIDE else DOT
    ACC: tl.constexpr = tl.float64 if DOT == tl.float64 else tl.float32  # noqa: SIM300

    q = load_rows(Q, a, b, h, sqa, sqb, sqh, sqm, offs_m, offs_d, m_ok, d_ok)
    do = load_rows(DO, a, b, h, sda, sdb, sdh, sdm, offs_m, offs_dv, m_ok, dv_ok)
    lse = tl.load(LSE + pid_z * t_q + offs_m, mask=m_ok, other=float("-inf")).to(ACC)
    delta = tl.load(DELTA + pid_z * t_q + offs_m, mask=m_ok, other=0.0).to(ACC)
    g1 = G1 + a * s1a + b * s1b + h * s1h + offs_m[:, None] * s1m
    qc1 = tl.load(QC1 + offs_m, mask=m_ok, other=0) if G1_COORDS else offs_m
    g2 = G2 + a * s2a + b * s2b + h * s2h + offs_m[:, None] * s2m
    qc2 = tl.load(QC2 + offs_m, mask=m_ok, other=0) if G2_COORDS else offs_m
    e1 = DG1 + a * e1a + b * e1b + h * e1h
    e2 = DG2 + a * e2a + b * e2b + h * e2h
    mask_rows = Mask + a * sma + b * smb + h * smh + offs_m[:, None] * smm
    dq = tl.zeros([BM, BD], ACC)

    hi = t_k
    if CAUSAL:
        hi = tl.minimum(t_k, i0 + BM + q_offset)
    for j0 in range(0, hi, BN):
        # the tile's queries through an opaque zero (j0 >= 0), as in the forward kernel: the
        # indices made from them are made in each step, not held in registers across the loop
        # (built for sm_90 by triton 3.6: bias float16 spilled 484 bytes so, 92 without; ALiBi
        # 364, 0; float32 640, 80)
        here = ii + tl.minimum(j0, 0)
        rows = i0 + here
        spread = w[None, :] + here[:, None] - (BM - 1)  # the key column of each window column
        spread_ok = (spread >= 0) & (spread < BN)
        offs_n = j0 + jj
        n_ok = offs_n < t_k
        inside = m_ok[:, None] & n_ok[None, :]
        k = load_rows(K, a, b, h, ska, skb, skh, skn, offs_n, offs_d, n_ok, d_ok)
        vals = load_rows(V, a, b, h, sva, svb, svh, svn, offs_n, offs_dv, n_ok, dv_ok)
        s = _logits(q, k, scale, g1, g2, qc1, qc2, KC1, KC2, low1, low2, s1c, s2c, glo, ghi,
                    rows, offs_n, m_ok, n_ok, inside, j0 - i0 + t_q - BM, t_q, BM + BN - 2,
                    NG, G1_COORDS, G2_COORDS, G_ENDS, Q_WIDE, K_WIDE, DOT, OPERAND, PRECISION)
        allowed = allowed_pairs(inside, offs_n, here, jj, i0 + q_offset - j0, mask_rows, smn,
                                CAUSAL, HAS_MASK)
        p = _weights(s, allowed, lse)
        dp = product(do, tl.trans(vals), False, False, DOT, OPERAND, PRECISION)
        dl = p * (dp - delta[:, None])
        dq += product(dl, k, SPLIT, K_WIDE, DOT, OPERAND, PRECISION) * scale
        if NG >= 1:
            if G1_ROW:  # one row by distance: the sum of each of the tile's diagonals
                _row_gradient(e1, e1c, dl, j0 - i0 + t_q - BM, glo, ghi, n_diff, w, spread,
                              spread_ok, BM + BN - 2, G_ENDS)
            else:
                diff1 = difference(rows, offs_n, n_ok, t_q, qc1, KC1, low1, G1_COORDS)
                tl.atomic_add(e1 + rows[:, None] * e1m + diff1 * e1c, dl, mask=inside)
        if NG >= 2:
            if G2_ROW:
                _row_gradient(e2, e2c, dl, j0 - i0 + t_q - BM, glo, ghi, n_diff, w, spread,
                              spread_ok, BM + BN - 2, G_ENDS)
            else:
                diff2 = difference(rows, offs_n, n_ok, t_q, qc2, KC2, low2, G2_COORDS)
                tl.atomic_add(e2 + rows[:, None] * e2m + diff2 * e2c, dl, mask=inside)
    tl.store(DQ + pid_z * t_q * D + offs_m[:, None] * D + offs_d[None, :], dq,
             mask=m_ok[:, None] & d_ok[None, :])


@triton.jit
def attention_dkdv(
    Q, K, V, DO, LSE, DELTA, DK, DV_OUT,
    sqa, sqb, sqh, sqm, ska, skb, skh, skn, sva, svb, svh, svn, sda, sdb, sdh, sdm,
    n_b, n_h, t_q, t_k, q_offset, scale,
    Mask, sma, smb, smh, smm, smn,
    G1, s1a, s1b, s1h, s1m, s1c, QC1, KC1, low1,
    G2, s2a, s2b, s2h, s2m, s2c, QC2, KC2, low2, glo, ghi,
    D: tl.constexpr, DV: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr,
    CAUSAL: tl.constexpr, HAS_MASK: tl.constexpr,
    NG: tl.constexpr, G1_COORDS: tl.constexpr, G2_COORDS: tl.constexpr, G_ENDS: tl.constexpr,
    DOT: tl.constexpr, PRECISION: tl.constexpr, SPLIT: tl.constexpr,
    Q_WIDE: tl.constexpr, K_WIDE: tl.constexpr, INTERPRET: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_z = tl.program_id(1)
    a, b, h = batch_of(pid_z, n_b, n_h)
    j0 = pid_n * BN
    ii = tl.arange(0, BM)
    jj = tl.arange(0, BN)
    offs_n = j0 + jj
    offs_d = tl.arange(0, BD)
    offs_dv = tl.arange(0, BDV)
    n_ok = offs_n < t_k
    d_ok = offs_d < D
    dv_ok = offs_dv < DV
    WIDE: tl.constexpr = INTERPRET and DOT == tl.bfloat16  # noqa: SIM300
    OPERAND: tl.constexpr = tl.float32 if WIDE else DOT
    ACC: tl.constexpr = tl.float64 if DOT == tl.float64 else tl.float32  # noqa: SIM300

    k = load_rows(K, a, b, h, ska, skb, skh, skn, offs_n, offs_d, n_ok, d_ok)
    vals = load_rows(V, a, b, h, sva, svb, svh, svn, offs_n, offs_dv, n_ok, dv_ok)
    dk = tl.zeros([BN, BD], ACC)
    dv = tl.zeros([BN, BDV], ACC)

    lo = 0
    if CAUSAL:  # the first query that may see key j0: i + q_offset >= j0
        lo = (tl.maximum(j0 - q_offset, 0) // BM) * BM
    for i0 in range(lo, t_q, BM):
        offs_m = i0 + ii
        m_ok = offs_m < t_q
        inside = m_ok[:, None] & n_ok[None, :]
        if DOT == tl.float32:  # noqa: SIM300
            # the keys and values times an opaque one (i0 >= 0): their float32 products'
            # splits into tf32 parts are made in each step, not held in registers across the loop
            # (triton 3.6, sm_90: bias float32 spilled 2372 bytes so, 1804 without)
            one = (1 + tl.minimum(i0, 0)).to(tl.float32)
            k_step = k * one
            vals_step = vals * one
        else:
            k_step = k
            vals_step = vals
        q = load_rows(Q, a, b, h, sqa, sqb, sqh, sqm, offs_m, offs_d, m_ok, d_ok)
        do = load_rows(DO, a, b, h, sda, sdb, sdh, sdm, offs_m, offs_dv, m_ok, dv_ok)
        lse = tl.load(LSE + pid_z * t_q + offs_m, mask=m_ok, other=float("-inf")).to(ACC)
        delta = tl.load(DELTA + pid_z * t_q + offs_m, mask=m_ok, other=0.0).to(ACC)
        g1 = G1 + a * s1a + b * s1b + h * s1h + offs_m[:, None] * s1m
        qc1 = tl.load(QC1 + offs_m, mask=m_ok, other=0) if G1_COORDS else offs_m
        g2 = G2 + a * s2a + b * s2b + h * s2h + offs_m[:, None] * s2m
        qc2 = tl.load(QC2 + offs_m, mask=m_ok, other=0) if G2_COORDS else offs_m
        mask_rows = Mask + a * sma + b * smb + h * smh + offs_m[:, None] * smm
        s = _logits(q, k_step, scale, g1, g2, qc1, qc2, KC1, KC2, low1, low2, s1c, s2c, glo, ghi,
                    offs_m, offs_n, m_ok, n_ok, inside, j0 - i0 + t_q - BM, t_q, BM + BN - 2,
                    NG, G1_COORDS, G2_COORDS, G_ENDS, Q_WIDE, K_WIDE, DOT, OPERAND, PRECISION)
        here = ii + tl.minimum(i0, 0)  # made in each step, as in the dQ kernel
        allowed = allowed_pairs(inside, offs_n, here, jj, i0 + q_offset - j0, mask_rows, smn,
                                CAUSAL, HAS_MASK)
        p = _weights(s, allowed, lse)
        dv += product(tl.trans(p), do, SPLIT, False, DOT, OPERAND, PRECISION)
        dp = product(do, tl.trans(vals_step), False, False, DOT, OPERAND, PRECISION)
        dl = p * (dp - delta[:, None])
        dk += product(tl.trans(dl), q, SPLIT, Q_WIDE, DOT, OPERAND, PRECISION) * scale
    tl.store(DK + pid_z * t_k * D + offs_n[:, None] * D + offs_d[None, :], dk,
             mask=n_ok[:, None] & d_ok[None, :])
    tl.store(DV_OUT + pid_z * t_k * DV + offs_n[:, None] * DV + offs_dv[None, :], dv,
             mask=n_ok[:, None] & dv_ok[None, :])
