"""The catalog's adapters (`relpos_ref._adapters`) of the extrapolation biases.

KERPLE, Sandwich, the forgetting bias (FoX), FIRE and Swin v2's continuous position bias.

Each has the signatures `relpos_ref._adapters` describes: ``check``,
``terms`` and, for ``relpos-ref show``, the lines printed after the
distances (the bias by distance of a few heads).
"""

from __future__ import annotations

import numpy as np

from . import _xp
from ._adapters import Terms
from .schemes import fire, forgetting, kerple, sandwich, swinv2
from .schemes.alibi import alibi_slopes

#: Heads whose bias ``relpos-ref show`` prints (the defaults of an 8-head model).
SHOWN_HEADS = 8


def _off(q_offset: int, i0: int, j0: int) -> int:
    return q_offset + i0 - j0


def _distances(t_q: int, t_k: int, q_offset: int) -> np.ndarray:
    if not (t_q and t_k):
        return np.zeros(0, dtype=np.int64)
    return np.arange(-(t_q - 1) - q_offset, t_k - q_offset)


def _table(caption: str, r: np.ndarray, rows: dict[str, np.ndarray]) -> list[str]:
    lines = [caption, f"{'r':>10} " + " ".join(f"{x:>8d}" for x in r)]
    for name, row in rows.items():  # + 0.0: no "-0.0000"
        lines.append(f"{name:>10} " + " ".join(f"{x + 0.0:8.4f}" for x in row))
    return lines


def kerple_check(q, k, v, tables, *, scale, mask, causal, q_offset, options):
    call, r1, r2 = kerple.kerple_call(
        q, k, v, scale=scale, mask=mask, causal=causal, q_offset=q_offset, **options
    )
    return call, {**options, "r1": r1, "r2": r2}


def kerple_terms(q, k, tables, *, q_offset, i0, j0, options, method):
    return Terms(bias=kerple.kerple_bias(
        options["r1"], options["r2"], q.shape[-2], k.shape[-2],
        q_offset=_off(q_offset, i0, j0), kernel=options["kernel"],
    ))


def kerple_show(*, t_q, t_k, q_offset, options):
    """Lines of ``relpos-ref show kerple``: the bias by distance at NeMo's initialization."""
    kernel = options.get("kernel", "log")
    r = _distances(t_q, t_k, q_offset)
    r1 = np.asarray(alibi_slopes(SHOWN_HEADS))
    bias = np.asarray(kerple.kerple_kernel(np.abs(r).astype(np.float64), r1,
                                           np.ones(SHOWN_HEADS), kernel=kernel))
    caption = (f"bias B_h(r) of the {kernel} kernel with r1 = alibi_slopes({SHOWN_HEADS}), "
               "r2 = 1 (NeMo's initialization), per head h")
    return _table(caption, r, {f"h={h}": row for h, row in enumerate(bias)})


def sandwich_check(q, k, v, tables, *, scale, mask, causal, q_offset, options):
    call, _ = sandwich.sandwich_call(
        q, k, v, scale=scale, mask=mask, causal=causal, q_offset=q_offset, **options
    )
    return call, dict(options)


def sandwich_terms(q, k, tables, *, q_offset, i0, j0, options, method):
    xp = _xp.array_namespace(q)
    ratios = xp.asarray(sandwich.sandwich_ratios(q.shape[-3]), dtype=q.dtype,
                        device=_xp.device(q))
    return Terms(bias=sandwich.sandwich_bias(
        ratios, q.shape[-2], k.shape[-2], q_offset=_off(q_offset, i0, j0),
        d_bar=options["d_bar"], start=options["start"],
    ))


def sandwich_show(*, t_q, t_k, q_offset, options):
    """Lines of ``relpos-ref show sandwich``: the sum by distance, and per head of 8."""
    d_bar, start = options.get("d_bar", 128), options.get("start", 0)
    r = _distances(t_q, t_k, q_offset)
    sums = np.asarray(sandwich.sandwich_kernel(r.astype(np.float64), d_bar=d_bar, start=start))
    ratios = sandwich.sandwich_ratios(SHOWN_HEADS)
    rows = {"sum": sums, **{f"h={h}": sums / rho for h, rho in enumerate(ratios)}}
    caption = (f"sum_c cos(r w_c) - d_bar/2, c = {start} .. {start + d_bar // 2 - 1}, "
               f"w_c = 10000^(-2c/{d_bar}); bias B_h = sum / (8 (h + 1) / H), H = {SHOWN_HEADS}")
    return _table(caption, r, rows)


def forgetting_check(q, k, v, tables, *, scale, mask, causal, q_offset, options):
    call = forgetting.forgetting_call(q, k, v, tables["f"], scale=scale, mask=mask,
                                      causal=causal, q_offset=q_offset)
    return call, dict(options)


def forgetting_terms(q, k, tables, *, q_offset, i0, j0, options, method):
    # a tile reads the cumulative sum of every gate of the call (the gates before it too)
    return Terms(bias=forgetting.forgetting_tile(tables["f"], q.shape[-2], k.shape[-2],
                                                 q_offset=q_offset + i0, j0=j0))


def forgetting_show(*, t_q, t_k, q_offset, options):
    """Lines of ``relpos-ref show forgetting``: the bias for constant gates, and the rule."""
    positions = np.arange(t_q) + q_offset
    lines = ["b_ij = F_(i + q_offset) - F_j, F_t = sum_(u <= t) log sigmoid(f_u): the log "
             "forget gates of the tokens j+1 .. i + q_offset (0 where j > i + q_offset)"]
    for gate in (0.0, 2.0):
        f = np.full(max(t_k, 1), gate)
        bias = np.asarray(forgetting.forgetting_tile(f, t_q, t_k, q_offset=q_offset)) \
            if t_q and t_k and positions[-1] < t_k else np.zeros((t_q, t_k))
        lines.append(f"bias for every f_t = {gate:g} (rows: queries at {q_offset} ..)")
        lines += ["  " + " ".join(f"{x + 0.0:8.4f}" for x in row) for row in bias]
    return lines


# -- Swin v2's continuous position bias -------------------------------------------------


def swinv2_check(q, k, v, tables, *, scale, mask, causal, q_offset, options):
    if causal or q_offset not in (None, 0):
        msg = (f"swinv2 attends within one window: `causal` must be False and `q_offset` 0, "
               f"got causal={causal!r}, q_offset={q_offset!r}")
        raise ValueError(msg)
    call = swinv2.swinv2_call(q, k, v, tables["w1"], tables["b1"], tables["w2"], scale=scale,
                              mask=mask, **options)
    return call, dict(options)


def swinv2_rotate(q, k, *, q_offset, options):
    # cosine attention's operands, q_hat tau and k_hat at the call's scale 1 (the same
    # arrays without `logit_scale`): what the golden pipeline multiplies
    return swinv2._operands(q, k, options.get("logit_scale"))[:2]


def swinv2_terms(q, k, tables, *, q_offset, i0, j0, options, method):
    term = swinv2.swinv2_bias(tables["w1"], tables["b1"], tables["w2"],
                              options["window_height"], options["window_width"],
                              pretrained_window=options["pretrained_window"])
    return Terms(bias=term[..., i0 : i0 + q.shape[-2], j0 : j0 + k.shape[-2]])


def swinv2_show(*, t_q, t_k, q_offset, options):
    """Lines of ``relpos-ref show swinv2``: the log-spaced coordinate of each offset."""
    wh, ww = options.get("window_height") or 2, options.get("window_width") or 2
    pre = options.get("pretrained_window")
    c = np.asarray(swinv2.swinv2_coordinates(wh, ww, pretrained_window=pre, xp=np))
    rows = [f"log-spaced coordinates, window {wh} x {ww}"
            + ("" if pre is None else f", pretrained at {pre[0]} x {pre[1]}") + ":"]
    rows.append("  dy: " + " ".join(f"{x:+.4f}" for x in c[:: 2 * ww - 1, 0]))
    rows.append("  dx: " + " ".join(f"{x:+.4f}" for x in c[: 2 * ww - 1, 1]))
    rows.append("bias = 16 sigmoid(Linear(m, h)(relu(Linear(2, m)([c(dy), c(dx)])))), in (0, 16)")
    return rows


# -- FIRE -------------------------------------------------------------------------------


def fire_check(q, k, v, tables, *, scale, mask, causal, q_offset, options):
    call = fire.fire_call(q, k, v, *(tables[n] for n in fire.TABLES), scale=scale, mask=mask,
                          causal=causal, q_offset=q_offset, **options)
    # c and L as arrays of the call's dtype: the specification returns their gradients,
    # given or not, and so do the kernels (they differentiate the array options)
    xp, dev = call.xp, _xp.device(q)
    scalars = {n: options[n] if hasattr(options[n], "shape") else
               xp.asarray(float(options[n]), dtype=q.dtype, device=dev) for n in ("c", "L")}
    return call, {**options, **scalars}


def fire_terms(q, k, tables, *, q_offset, i0, j0, options, method):
    # the normaliser reads the query's absolute position: the tile's queries at q_offset + i0
    return Terms(bias=fire.fire_tile(*(tables[n] for n in fire.TABLES), q.shape[-2],
                                     k.shape[-2], q_offset=q_offset + i0, j0=j0, **options))


def fire_show(*, t_q, t_k, q_offset, options):
    """Lines of ``relpos-ref show fire``: the MLP's input of each pair, and the rule."""
    c, big_l = options.get("c", 0.1), options.get("L", 512.0)
    eps = options.get("eps", fire.EPS)
    x = np.asarray(fire.fire_inputs(t_q, t_k, c=c, L=big_l, eps=eps, q_offset=q_offset,
                                    xp=np, dtype=np.float64))
    lines = ["b_hij = MLP_h(x_ij), x_ij = log(|c (p_i - j)| + 1) / (log(|c| max(|L|, p_i) + 1) "
             "+ eps), p_i = i + q_offset: the query's absolute position normalises",
             f"x for c = {c:g}, L = {big_l:g}, eps = {eps:g} (rows: queries at {q_offset} ..)"]
    lines += ["  " + " ".join(f"{v + 0.0:8.4f}" for v in row) for row in x]
    return lines
