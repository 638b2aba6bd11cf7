r"""The fused forward kernel of the distance form, as Triton source.

One kernel computes every scheme: a program takes ``BM`` queries of one
batch entry and walks the keys ``BN`` at a time with an online softmax,
never holding more than a tile of scores. The terms of the distance form
(`relpos_ref.lowering`) enter through slots, each switched on by a
``constexpr`` flag, so a call compiles only what it uses:

- ``QW``: a content-position term by distance, ``a_i . A[rows[c]]``. The
  tile's ``BM + BN - 1`` distances are one window of ``c``; the window's
  table rows ``A_w (BW, D)`` are multiplied by the query tile once on tensor
  cores, ``S = a A_w^T (BM, BW)``, and each pair reads its diagonal,
  ``S[i, j - i + BM - 1]`` (``tl.gather``): memory ``O((t_q + t_k) d)``
  for any table size;
- ``KW``: the same from the keys' side, ``S = A_w b^T (BW, BN)``;
- ``VW``: relative values: the weights are laid out by distance,
  ``P_w[i, w] = p[i, w + i - (BM - 1)]``, and ``P_w V_w`` joins ``P v``.

  A tile whose window lies wholly at one end of the maps (``c <= c_lo``,
  where every row is the first, or ``c >= c_hi``, every row the last: the
  clipped distances of Shaw's or Music's tables, most tiles of a long call)
  needs none of this: its terms are one row each end, ``a_i . A[first]``
  (per query, computed once), ``b_j . B[first]`` and ``(sum_j p_ij) V[first]``;
- ``G1``, ``G2``: a float32 array read at ``[i, diff(i, j)]``, added after
  the scale (a bias row per difference, grid2d's ``q R^T`` pre-multiplied by
  the scale, plain attention's dense terms), where ``diff`` is the distance
  or a difference of coordinates loaded per query and key. With ``G_ENDS``
  (16-bit calls), a tile wholly where the terms' distance maps are constant
  (``c <= glo`` or ``c >= ghi``: a clipped table, T5's far buckets) reads
  one entry per query instead of one per pair.

Masks (a ``uint8`` array of any broadcast), causal structure with
``q_offset`` (key tiles wholly in the future are skipped), rows with no
allowed key (zeros) and rows with an allowed logit that overflowed (NaN, not
an empty row: an allowed ``-inf`` becomes NaN, a ``+inf`` makes NaN of the
softmax) are applied per tile.

Precision: products run on tensor cores in the call's dtype with float32
accumulation (``DOT`` is the operand dtype; float32 operands use
``PRECISION``, float64 ``"ieee"``). The softmax is float32 (float64 for
float64 calls, ``ACC``). In 16-bit calls
the weights ``p`` are split into a high and a low 16-bit part before ``P v``
(two products, `product`), which keeps the weights to about 2^-22 relative,
float32's accuracy, where one product would round them to 2^-11 (float16)
or 2^-8 (bfloat16); so are the float32 operands the lowering computed
(``*_WIDE``: a rotated ``q`` or ``k``, ``q + u``, projected sinusoids), so
that a 16-bit call's logits are float32's, as the specification has them.

The same source is compiled for the GPU and, when ``TRITON_INTERPRET=1``
was set before triton was imported, run by Triton's interpreter on CPU
tensors (``INTERPRET``: bfloat16 operands are widened to float32 before
``tl.dot``, which the interpreter would otherwise multiply as raw bits;
their products are exact in float32 either way).
"""

from __future__ import annotations

import triton
import triton.language as tl

from ._triton_tiles import add_gathered, allowed_pairs, batch_of, load_rows


@triton.jit
def product(a, b, A_SPLIT: tl.constexpr, B_SPLIT: tl.constexpr, DOT: tl.constexpr,
            OPERAND: tl.constexpr, PRECISION: tl.constexpr):
    """``a b`` on tensor cores in ``DOT``, an operand split in a high and a low part where asked.

    A float32 operand of a 16-bit call (the weights, a rotated ``q``) is
    ``hi + lo``, both ``DOT``; the products ``hi b + lo b`` (and ``a lo``)
    keep it to about 2^-22 relative. ``OPERAND`` is the dtype the products
    take (float32 for bfloat16 in the interpreter); float64 products
    accumulate in float64 (``tl.dot``'s default is float32, which a GPU
    applies and the interpreter does not).
    """
    OUT: tl.constexpr = tl.float64 if DOT == tl.float64 else tl.float32  # noqa: SIM300
    a_hi = a.to(DOT)
    b_hi = b.to(DOT)
    out = tl.dot(a_hi.to(OPERAND), b_hi.to(OPERAND), input_precision=PRECISION, out_dtype=OUT)
    if A_SPLIT:
        a_lo = (a.to(tl.float32) - a_hi.to(tl.float32)).to(DOT)
        out += tl.dot(a_lo.to(OPERAND), b_hi.to(OPERAND), input_precision=PRECISION,
                      out_dtype=OUT)
    if B_SPLIT:
        b_lo = (b.to(tl.float32) - b_hi.to(tl.float32)).to(DOT)
        out += tl.dot(a_hi.to(OPERAND), b_lo.to(OPERAND), input_precision=PRECISION,
                      out_dtype=OUT)
    return out


@triton.jit
def attention_forward(
    Q, K, V, Out, Lse,
    sqa, sqb, sqh, sqm, ska, skb, skh, skn, sva, svb, svh, svn, soa, sob, soh, som,
    n_b, n_h, t_q, t_k, q_offset, scale, n_diff, c_lo, c_hi,
    Mask, sma, smb, smh, smm, smn,
    QW, swa, swb, swh, swm, TQ, stqh, stqm, RQ,
    KW, sxa, sxb, sxh, sxn, TK, stkh, stkm, RK,
    TV, stvh, stvm, RV,
    G1, s1a, s1b, s1h, s1m, s1c, QC1, KC1, low1,
    G2, s2a, s2b, s2h, s2m, s2c, QC2, KC2, low2, glo, ghi,
    D: tl.constexpr, DV: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BW: tl.constexpr,
    CAUSAL: tl.constexpr, HAS_MASK: tl.constexpr,
    HAS_QW: tl.constexpr, HAS_KW: tl.constexpr, HAS_VW: tl.constexpr,
    NG: tl.constexpr, G1_COORDS: tl.constexpr, G2_COORDS: tl.constexpr, G_ENDS: tl.constexpr,
    DOT: tl.constexpr, PRECISION: tl.constexpr, SPLIT: tl.constexpr,
    Q_WIDE: tl.constexpr, K_WIDE: tl.constexpr, QW_WIDE: tl.constexpr, TQ_WIDE: tl.constexpr,
    TK_WIDE: tl.constexpr, INTERPRET: tl.constexpr, STORE_LSE: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_z = tl.program_id(1)
    a, b, h = batch_of(pid_z, n_b, n_h)
    i0 = pid_m * BM
    ii = tl.arange(0, BM)
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
    if HAS_QW:
        qw = load_rows(QW, a, b, h, swa, swb, swh, swm, offs_m, offs_d, m_ok, d_ok)
    g1 = G1 + a * s1a + b * s1b + h * s1h + offs_m[:, None] * s1m
    qc1 = tl.load(QC1 + offs_m, mask=m_ok, other=0) if G1_COORDS else offs_m
    g2 = G2 + a * s2a + b * s2b + h * s2h + offs_m[:, None] * s2m
    qc2 = tl.load(QC2 + offs_m, mask=m_ok, other=0) if G2_COORDS else offs_m
    mask_rows = Mask + a * sma + b * smb + h * smh + offs_m[:, None] * smm

    if HAS_QW:  # the terms of tiles wholly beyond the band of the maps: one row each end
        rq0 = tl.load(RQ)
        rq1 = tl.load(RQ + n_diff - 1)
        tq0 = tl.load(TQ + h * stqh + rq0 * stqm + offs_d,
                        mask=d_ok & (offs_d * 0 + rq0 >= 0), other=0.0)
        tq1 = tl.load(TQ + h * stqh + rq1 * stqm + offs_d,
                        mask=d_ok & (offs_d * 0 + rq1 >= 0), other=0.0)
        q_first = tl.sum(qw.to(ACC) * tq0.to(ACC)[None, :], axis=1)
        q_last = tl.sum(qw.to(ACC) * tq1.to(ACC)[None, :], axis=1)
    if HAS_KW:
        rk0 = tl.load(RK)
        rk1 = tl.load(RK + n_diff - 1)
        tk0 = tl.load(TK + h * stkh + rk0 * stkm + offs_d,
                        mask=d_ok & (offs_d * 0 + rk0 >= 0), other=0.0)
        tk1 = tl.load(TK + h * stkh + rk1 * stkm + offs_d,
                        mask=d_ok & (offs_d * 0 + rk1 >= 0), other=0.0)
        tk0 = tk0.to(ACC)
        tk1 = tk1.to(ACC)
    if HAS_VW:
        rv0 = tl.load(RV)
        rv1 = tl.load(RV + n_diff - 1)
        tv0 = tl.load(TV + h * stvh + rv0 * stvm + offs_dv,
                        mask=dv_ok & (offs_dv * 0 + rv0 >= 0), other=0.0)
        tv1 = tl.load(TV + h * stvh + rv1 * stvm + offs_dv,
                        mask=dv_ok & (offs_dv * 0 + rv1 >= 0), other=0.0)
        tv0 = tv0.to(ACC)
        tv1 = tv1.to(ACC)

    m_i = tl.full([BM], float("-inf"), ACC)
    l_i = tl.zeros([BM], ACC)
    acc = tl.zeros([BM, BDV], ACC)
    w = tl.arange(0, BW)
    jj = tl.arange(0, BN)

    hi = t_k
    if CAUSAL:
        hi = tl.minimum(t_k, i0 + BM + q_offset)
    # The key tiles in three runs, a loop each with no branch on the tile (triton 3.6's
    # software pipeliner fails on a product inside one): with c0 = j0 - i0 + t_q - BM, the
    # tiles whose window of differences c0 .. c0 + BM + BN - 2 lies wholly at the maps' first
    # rows (c <= c_lo: one row for the whole tile), those in their band, and those wholly at
    # their last rows (c >= c_hi). A call without window terms has one run, the band's.
    WINDOWED: tl.constexpr = HAS_QW or HAS_KW or HAS_VW
    j_band = 0  # the first tile past the keys j0 <= last_past
    j_future = hi  # the first tile from the keys j0 >= first_future on
    if WINDOWED:
        last_past = c_lo - BN + 2 - t_q + i0
        j_band = tl.where(last_past < 0, 0, (last_past // BN + 1) * BN)
        first_future = c_hi - t_q + BM + i0
        j_future = tl.maximum(tl.where(first_future <= 0, 0, (first_future + BN - 1) // BN * BN),
                              j_band)
    for PART in tl.static_range(3):  # 0: the first rows, 1: the band, 2: the last rows
        if PART == 0:
            j_start = 0
            j_end = tl.minimum(j_band, hi)
        elif PART == 1:
            j_start = j_band
            j_end = tl.minimum(j_future, hi)
        else:
            j_start = j_future
            j_end = hi
        if PART != 1:  # each term's one row for the whole run: the first or the last
            if HAS_QW:
                q_end = q_first if PART == 0 else q_last
            if HAS_KW:
                k_end = tk0 if PART == 0 else tk1
            if HAS_VW:
                v_end = tv0 if PART == 0 else tv1
        if WINDOWED or PART == 1:
            for j0 in range(j_start, j_end, BN):
                # the tile's queries through an opaque zero (j0 >= 0): each (BM, BN) or
                # (BM, BW) index made from them (the causal test, a window's columns) depends
                # on the loop, so it is made again in every step, not hoisted out of the loop
                # and held in registers across it (built for sm_90 by triton 3.6, 16-bit:
                # Shaw's window variant spilled 1052 bytes so, 48 without; Transformer-XL's
                # 308, 0; DeBERTa's 504, 140)
                here = ii + tl.minimum(j0, 0)
                rows = i0 + here
                offs_n = j0 + jj
                n_ok = offs_n < t_k
                k = load_rows(K, a, b, h, ska, skb, skh, skn, offs_n, offs_d, n_ok, d_ok)
                # the window terms first, the content product after them (and below, the
                # relative values before P v): a window's (BM, BW) product is done with before
                # the tile's own products are made (built for sm_90, triton 3.9, 16-bit at
                # 64 x 64: Shaw spilled 40 to 120 bytes the other way, 40 to 56 so; DeBERTa
                # 56 to 120, 0 to 8)
                s = tl.zeros([BM, BN], ACC)
                if PART == 1:
                    c = j0 - i0 + t_q - BM + w  # the window's differences
                    diagonal = jj[None, :] - here[:, None] + (BM - 1)  # window column of a pair
                if HAS_QW:
                    if PART != 1:
                        s += q_end[:, None]
                    else:
                        rq = tl.load(RQ + c, mask=(c >= 0) & (c < n_diff), other=-1)
                        tq = tl.load(TQ + h * stqh + rq[:, None] * stqm + offs_d[None, :],
                                     mask=(rq[:, None] >= 0) & d_ok[None, :], other=0.0)
                        sw = product(qw, tl.trans(tq), QW_WIDE, TQ_WIDE, DOT, OPERAND, PRECISION)
                        s += tl.gather(sw, diagonal, axis=1)
                if HAS_KW:
                    kw = load_rows(KW, a, b, h, sxa, sxb, sxh, sxn, offs_n, offs_d, n_ok, d_ok)
                    if PART != 1:
                        s += tl.sum(kw.to(ACC) * k_end[None, :], axis=1)[None, :]
                    else:
                        rk = tl.load(RK + c, mask=(c >= 0) & (c < n_diff), other=-1)
                        tk = tl.load(TK + h * stkh + rk[:, None] * stkm + offs_d[None, :],
                                     mask=(rk[:, None] >= 0) & d_ok[None, :], other=0.0)
                        sk = product(tk, tl.trans(kw), TK_WIDE, False, DOT, OPERAND, PRECISION)
                        s += tl.gather(sk, diagonal, axis=0)
                s += product(q, tl.trans(k), Q_WIDE, K_WIDE, DOT, OPERAND, PRECISION)
                s = s * scale
                inside = m_ok[:, None] & n_ok[None, :]
                if NG >= 1:
                    s = add_gathered(s, g1, s1c, rows, offs_n, m_ok, n_ok, inside, t_q, qc1, KC1,
                                     low1, j0 - i0 + t_q - BM, glo, ghi, BM + BN - 2, G_ENDS,
                                     G1_COORDS)
                if NG >= 2:
                    s = add_gathered(s, g2, s2c, rows, offs_n, m_ok, n_ok, inside, t_q, qc2, KC2,
                                     low2, j0 - i0 + t_q - BM, glo, ghi, BM + BN - 2, G_ENDS,
                                     G2_COORDS)
                allowed = allowed_pairs(inside, offs_n, here, jj, i0 + q_offset - j0, mask_rows,
                                        smn, CAUSAL, HAS_MASK)
                # an allowed logit that overflowed to -inf is NaN: its row is NaN, not empty
                s = tl.where(allowed, tl.where(s == float("-inf"), float("nan"), s), float("-inf"))
                m_new = tl.maximum(m_i, tl.max(s, axis=1))
                m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
                p = tl.exp(s - m_safe[:, None])
                alpha = tl.exp(m_i - m_safe)
                l_i = l_i * alpha + tl.sum(p, axis=1)
                acc = acc * alpha[:, None]
                if HAS_VW:
                    if PART != 1:
                        acc += tl.sum(p, axis=1)[:, None] * v_end[None, :]
                    else:
                        # the key column of each window column
                        spread = w[None, :] + here[:, None] - (BM - 1)
                        spread_ok = (spread >= 0) & (spread < BN)
                        pw = tl.gather(p, tl.where(spread_ok, spread, 0), axis=1)
                        pw = tl.where(spread_ok, pw, 0.0)
                        rv = tl.load(RV + c, mask=(c >= 0) & (c < n_diff), other=-1)
                        tv = tl.load(TV + h * stvh + rv[:, None] * stvm + offs_dv[None, :],
                                     mask=(rv[:, None] >= 0) & dv_ok[None, :], other=0.0)
                        acc += product(pw, tv, SPLIT, False, DOT, OPERAND, PRECISION)
                vals = load_rows(V, a, b, h, sva, svb, svh, svn, offs_n, offs_dv, n_ok, dv_ok)
                acc += product(p, vals, SPLIT, False, DOT, OPERAND, PRECISION)
                m_i = m_new

    # no allowed key: l = 0, zeros; an overflowed logit made l NaN
    empty = l_i == 0
    out = acc / tl.where(empty, 1.0, l_i)[:, None]
    out = tl.where(empty[:, None], 0.0, out)
    tl.store(Out + a * soa + b * sob + h * soh + offs_m[:, None] * som + offs_dv[None, :],
             out.to(Out.dtype.element_ty), mask=m_ok[:, None] & dv_ok[None, :])
    if STORE_LSE:  # for the backward pass: log sum exp of each row, -inf for an empty one
        lse = tl.where(empty, float("-inf"), m_i + tl.log(tl.where(empty, 1.0, l_i)))
        tl.store(Lse + pid_z * t_q + offs_m, lse.to(Lse.dtype.element_ty), mask=m_ok)
