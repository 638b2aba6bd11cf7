r"""Any scheme over query and key blocks, with an online softmax, in bounded memory.

`blocked_attention` never holds more than one ``(block, block)`` tile of
logits per head. For each block of queries it walks the key blocks, keeping
per query the running maximum ``m``, the running normalizer ``l`` and the
running weighted sum ``a`` (Milakov and Gimelshein 2018; the FlashAttention
recurrence):

.. math::
    m' = \max(m, \max_j s_{ij}),\quad
    l' = e^{m - m'} l + \sum_j e^{s_{ij} - m'},\quad
    a' = e^{m - m'} a + \sum_j e^{s_{ij} - m'} (v_j + \text{value term}_{ij}),

and returns ``a / l`` (zero for a query with no allowed key). Each tile's
positional terms come from the scheme's own functions: relative positions
depend only on ``r = j - (i + q_offset)``, so the tile at query ``i0`` and key
``j0`` is the scheme evaluated with ``q_offset + i0 - j0``. Per-distance
products ``q . a_c`` are computed once per query block and gathered per tile.

Peak memory is ``O(block (t_k + d + n_rows))`` beyond the inputs and the
output, against ``O(t_q t_k)`` for the unblocked functions.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from . import _xp
from . import schemes as sc
from ._progress import Progress
from ._validate import as_int, broadcast_shapes, check_choice, positive_int
from .attention import allowed_keys, check_qkv, compose_logits, default_scale
from .layouts import take_per_row
from .positions import check_distances_in_table, grid_positions
from .schemes._tables import check_table, table_logits
from .schemes.music import _check_beyond as check_music_beyond

__all__ = ["BLOCKED_SCHEMES", "blocked_attention"]


@dataclass
class _Plan:
    """How one scheme fills a tile: its inputs, defaults and per-tile terms."""

    q: Any
    k: Any
    scale: float
    query_block: Callable[[Any, int], Any] = field(default=lambda q_blk, i0: None)
    # (context, q_blk, k_blk, i0, j0, offset) -> (position or None, bias or None)
    terms: Callable[..., tuple[Any, Any]] = field(default=lambda *a: (None, None))
    # (unnormalized weights, offset) -> value term or None
    values: Callable[[Any, int], Any] | None = None


def _table(tables: Sequence[Any], n: int, scheme: str, names: str) -> list[Any]:
    if len(tables) > n:
        msg = f"scheme {scheme!r} takes at most {n} table(s) ({names}), got {len(tables)}"
        raise TypeError(msg)
    return [*tables, *([None] * (n - len(tables)))]


def _required(name: str, table: Any, scheme: str) -> Any:
    if table is None:
        msg = f"scheme {scheme!r} needs `{name}`"
        raise TypeError(msg)
    return table


def _masked(xp: Any, valid: Any, x: Any) -> Any:
    return xp.where(valid, x, xp.zeros((), dtype=x.dtype, device=_xp.device(x)))


def _gathered(index_of: Callable[[int, int, int], tuple[Any, Any | None]]) -> Callable[..., Any]:
    # Terms of a one-row-per-distance table: gather the block's q . a_c products.
    def terms(ctx, q_blk, k_blk, i0, j0, off):
        index, valid = index_of(q_blk.shape[-2], k_blk.shape[-2], off)
        xp = _xp.array_namespace(ctx)
        out = take_per_row(ctx, index)
        return (out if valid is None else _masked(xp, valid, out)), None

    return terms


def _per_query_block(table: Any) -> Callable[[Any, int], Any]:
    return lambda q_blk, i0: table_logits(q_blk, table)


def _plan_plain(xp, q, k, tables, p, ctx):
    _table(tables, 0, "plain", "none")
    return _Plan(q, k, default_scale(q.shape[-1], ctx["scale"]))


def _plan_absolute(xp, q, k, tables, p, ctx):
    (table,) = _table(tables, 1, "absolute", "table")
    table = _required("table", table, "absolute")
    sc.absolute_logits(q[..., :1, :], table, ctx["t_k"])  # validates against all keys

    def terms(_, q_blk, k_blk, i0, j0, off):
        rows = table[..., j0 : j0 + k_blk.shape[-2], :]
        return sc.absolute_logits(q_blk, rows, k_blk.shape[-2]), None

    return _Plan(q, k, default_scale(q.shape[-1], ctx["scale"]), terms=terms)


def _plan_shaw(xp, q, k, tables, p, ctx):
    key_table, value_table = _table(tables, 2, "shaw", "key_table, value_table")
    key_table = _required("key_table", key_table, "shaw")
    beyond = p.get("beyond", "clip")
    sc.shaw_logits(q[..., :1, :], key_table, 1, beyond=beyond)  # validates the table
    kmax = (key_table.shape[-2] - 1) // 2
    if beyond == "error":
        check_distances_in_table(ctx["t_q"], ctx["t_k"], q_offset=ctx["q_offset"], low=-kmax,
                                 high=kmax, what=f"max_distance={kmax}")
    policy = "zero" if beyond == "zero" else "clip"
    dev = _xp.device(q)

    def index_of(t_qb, t_kb, off):
        index, valid = sc.shaw_index(t_qb, t_kb, max_distance=kmax, q_offset=off, beyond=policy,
                                     xp=xp, device=dev)
        return index, None if policy == "clip" else valid

    values = None
    if value_table is not None:
        def values(w, off):
            return sc.shaw_values(w, value_table, q_offset=off, beyond=policy)

    return _Plan(q, k, default_scale(q.shape[-1], ctx["scale"]), _per_query_block(key_table),
                 _gathered(index_of), values)


def _plan_bias(xp, q, k, tables, p, ctx):
    (table,) = _table(tables, 1, "bias", "table")
    table = _required("table", table, "bias")
    beyond = p.get("beyond", "clip")
    sc.bias_logits(table, 1, 1, beyond=beyond if beyond != "error" else "clip")
    kmax = (table.shape[-1] - 1) // 2
    if beyond == "error":
        check_distances_in_table(ctx["t_q"], ctx["t_k"], q_offset=ctx["q_offset"], low=-kmax,
                                 high=kmax, what=f"max_distance={kmax}")
        beyond = "clip"

    def terms(_, q_blk, k_blk, i0, j0, off):
        return None, sc.bias_logits(table, q_blk.shape[-2], k_blk.shape[-2], q_offset=off,
                                    beyond=beyond)

    return _Plan(q, k, default_scale(q.shape[-1], ctx["scale"]), terms=terms)


def _plan_music(xp, q, k, tables, p, ctx):
    table, value_table = _table(tables, 2, "music", "table, value_table")
    table = _required("table", table, "music")
    beyond = p.get("beyond", "clip")
    sc.music_logits(q[..., :1, :], table, 1, beyond=beyond, method="definition")
    m = table.shape[-2]
    # the unblocked scheme's own host check: past distances beyond the table under "error"
    check_music_beyond(ctx["t_q"], ctx["t_k"], m, ctx["q_offset"], beyond)
    policy = "zero" if beyond == "zero" else "clip"
    dev = _xp.device(q)

    def index_of(t_qb, t_kb, off):
        return sc.music_index(t_qb, t_kb, length=m, q_offset=off, beyond=policy, xp=xp,
                              device=dev)

    values = None
    if value_table is not None:
        def values(w, off):
            return sc.music_values(w, value_table, q_offset=off, beyond=policy)

    return _Plan(q, k, default_scale(q.shape[-1], ctx["scale"]), _per_query_block(table),
                 _gathered(index_of), values)


def _plan_general(xp, q, k, tables, p, ctx):
    (table,) = _table(tables, 1, "general", "table")
    table = _required("table", table, "general")
    order = p.get("order", "past_to_future")
    sc.general_logits(q[..., :1, :], table, 1, order=order)  # validates the table
    t_max = (table.shape[-2] + 1) // 2
    check_distances_in_table(ctx["t_q"], ctx["t_k"], q_offset=ctx["q_offset"],
                             low=-(t_max - 1), high=t_max - 1, what=f"t_max={t_max}",
                             hint="use a table with a larger t_max")
    dev = _xp.device(q)

    def index_of(t_qb, t_kb, off):
        return sc.general_index(t_qb, t_kb, t_max=t_max, q_offset=off, order=order, xp=xp,
                                device=dev), None

    return _Plan(q, k, default_scale(q.shape[-1], ctx["scale"]), _per_query_block(table),
                 _gathered(index_of))


def _plan_grid2d(xp, q, k, tables, p, ctx):
    row_table, col_table = _table(tables, 2, "grid2d", "row_table, col_table")
    row_table = _required("row_table", row_table, "grid2d")
    col_table = _required("col_table", col_table, "grid2d")
    height = positive_int("height", p["height"])
    width = positive_int("width", p["width"])
    n = height * width
    for name, table, side, size in (("row_table", row_table, "height", height),
                                    ("col_table", col_table, "width", width)):
        check_table(name, table, q, rows=2 * size - 1,
                    rows_rule=f" (2 {side} - 1 for {side} = {size})", width=q.shape[-1])
    if ctx["t_q"] != n or ctx["t_k"] != n or ctx["q_offset"] != 0:
        msg = (f"grid2d needs self-attention over the height * width = {n} tokens, got "
               f"t_q={ctx['t_q']}, t_k={ctx['t_k']}, q_offset={ctx['q_offset']}")
        raise ValueError(msg)
    dev = _xp.device(q)
    rows, cols = grid_positions(height, width, xp=xp, device=dev)

    def query_block(q_blk, i0):
        return table_logits(q_blk, row_table), table_logits(q_blk, col_table)

    def terms(c, q_blk, k_blk, i0, j0, off):
        qi = slice(i0, i0 + q_blk.shape[-2])
        kj = slice(j0, j0 + k_blk.shape[-2])
        dr = rows[kj][None, :] - rows[qi][:, None] + (height - 1)
        dc = cols[kj][None, :] - cols[qi][:, None] + (width - 1)
        return take_per_row(c[0], dr) + take_per_row(c[1], dc), None

    return _Plan(q, k, default_scale(q.shape[-1], ctx["scale"]), query_block, terms)


def _plan_t5(xp, q, k, tables, p, ctx):
    (table,) = _table(tables, 1, "t5", "table")
    table = _required("table", table, "t5")
    opts = {"bidirectional": p.get("bidirectional", True),
            "max_distance": p.get("max_distance", 128)}
    sc.t5_bias(table, 1, 1, **opts)  # validates

    def terms(_, q_blk, k_blk, i0, j0, off):
        return None, sc.t5_bias(table, q_blk.shape[-2], k_blk.shape[-2], q_offset=off, **opts)

    scale = 1.0 if ctx["scale"] is None else ctx["scale"]
    return _Plan(q, k, default_scale(q.shape[-1], scale), terms=terms)


def _plan_alibi(xp, q, k, tables, p, ctx):
    _table(tables, 0, "alibi", "none: pass slopes=...")
    slopes = p.get("slopes")
    if slopes is None:
        heads = q.shape[-3] if q.ndim >= 3 else 1
        slopes = xp.asarray(sc.alibi_slopes(heads), dtype=q.dtype, device=_xp.device(q))
    symmetric = p.get("symmetric", True)
    sc.alibi_bias(slopes, 1, 1, symmetric=symmetric)

    def terms(_, q_blk, k_blk, i0, j0, off):
        return None, sc.alibi_bias(slopes, q_blk.shape[-2], k_blk.shape[-2], q_offset=off,
                                   symmetric=symmetric)

    return _Plan(q, k, default_scale(q.shape[-1], ctx["scale"]), terms=terms)


def _plan_swin(xp, q, k, tables, p, ctx):
    (table,) = _table(tables, 1, "swin", "table")
    table = _required("table", table, "swin")
    wh, ww = p["window_height"], p["window_width"]
    bias = sc.swin_bias(table, wh, ww)  # (h, n, n) for one window: small by design
    n = bias.shape[-1]
    if ctx["t_q"] != n or ctx["t_k"] != n or ctx["q_offset"] != 0:
        msg = (f"swin needs self-attention over one {wh} x {ww} window ({n} tokens), got "
               f"t_q={ctx['t_q']}, t_k={ctx['t_k']}, q_offset={ctx['q_offset']}")
        raise ValueError(msg)

    def terms(_, q_blk, k_blk, i0, j0, off):
        return None, bias[..., i0 : i0 + q_blk.shape[-2], j0 : j0 + k_blk.shape[-2]]

    return _Plan(q, k, default_scale(q.shape[-1], ctx["scale"]), terms=terms)


def _plan_rope(xp, q, k, tables, p, ctx):
    _table(tables, 0, "rope", "none")
    opts = {"base": p.get("base", 10000.0), "rotary_dim": p.get("rotary_dim"),
            "layout": p.get("layout", "half")}
    q = sc.rope_rotate(q, offset=ctx["q_offset"], **opts)
    k = sc.rope_rotate(k, offset=0, **opts)
    return _Plan(q, k, default_scale(q.shape[-1], ctx["scale"]))


def _plan_transformer_xl(xp, q, k, tables, p, ctx):
    w_r, u, bv = _table(tables, 3, "transformer_xl", "w_r, content_bias, position_bias")
    w_r = _required("w_r", w_r, "transformer_xl")
    opts = {"clamp_len": p.get("clamp_len"), "base": p.get("base", 10000.0)}
    sc.transformer_xl_logits(q[..., :1, :], k[..., :1, :], w_r, u, bv, **opts)

    def terms(_, q_blk, k_blk, i0, j0, off):
        return sc.transformer_xl_logits(q_blk, k_blk, w_r, u, bv, q_offset=off, **opts), None

    return _Plan(q, k, default_scale(q.shape[-1], ctx["scale"]), terms=terms)


def _plan_deberta(xp, q, k, tables, p, ctx):
    key_table, query_table = _table(tables, 2, "deberta", "key_table, query_table")
    max_position = p.get("max_position")
    sc.deberta_logits(q[..., :1, :], k[..., :1, :], key_table, query_table,
                      max_position=max_position)

    def terms(_, q_blk, k_blk, i0, j0, off):
        return sc.deberta_logits(q_blk, k_blk, key_table, query_table,
                                 max_position=max_position, q_offset=off), None

    scale = ctx["scale"]
    if scale is None:
        factor = 1 + sum(t is not None for t in (key_table, query_table))
        scale = default_scale(q.shape[-1] * factor)
    return _Plan(q, k, default_scale(q.shape[-1], scale), terms=terms)


_PLANS: Mapping[str, tuple[Callable[..., _Plan], tuple[str, ...]]] = {
    "plain": (_plan_plain, ()),
    "absolute": (_plan_absolute, ()),
    "shaw": (_plan_shaw, ("beyond",)),
    "bias": (_plan_bias, ("beyond",)),
    "music": (_plan_music, ("beyond",)),
    "general": (_plan_general, ("order",)),
    "grid2d": (_plan_grid2d, ("height", "width")),
    "t5": (_plan_t5, ("bidirectional", "max_distance")),
    "alibi": (_plan_alibi, ("slopes", "symmetric")),
    "swin": (_plan_swin, ("window_height", "window_width")),
    "rope": (_plan_rope, ("base", "rotary_dim", "layout")),
    "transformer_xl": (_plan_transformer_xl, ("clamp_len", "base")),
    "deberta": (_plan_deberta, ("max_position",)),
}

#: Schemes `blocked_attention` evaluates (``"plain"`` is attention without positions).
BLOCKED_SCHEMES = tuple(_PLANS)

#: Schemes whose own functions default to causal attention.
_CAUSAL_BY_DEFAULT = ("music", "transformer_xl")


def _mask_tile(mask: Any, i0: int, i1: int, j0: int, j1: int) -> Any:
    if mask is None:
        return None
    rows = slice(i0, i1) if mask.shape[-2] != 1 else slice(None)
    cols = slice(j0, j1) if mask.shape[-1] != 1 else slice(None)
    return mask[..., rows, cols]


def blocked_attention(
    q: Any,
    k: Any,
    v: Any,
    /,
    *tables: Any,
    scheme: str = "plain",
    block_size: int = 1024,
    scale: float | None = None,
    mask: Any = None,
    causal: bool | None = None,
    q_offset: int | None = None,
    progress: bool = False,
    **params: Any,
) -> Any:
    r"""Attention with any scheme, evaluated tile by tile with an online softmax.

    .. math:: \text{out}_i = \frac{\sum_j e^{s_{ij} - m_i} (v_j + \text{value term}_{ij})}
                                  {\sum_j e^{s_{ij} - m_i}}

    equal, within float rounding, to the scheme's ``*_attention``.

    Parameters
    ----------
    q, k, v : floating arrays ``(..., t_q, d)``, ``(..., t_k, d)``, ``(..., t_k, d_v)``
    *tables : floating arrays
        The scheme's tables, in the order of its ``*_attention`` function
        (``key_table, value_table`` for shaw; ``w_r, content_bias,
        position_bias`` for transformer_xl; none for plain, alibi, rope).
    scheme : str, optional
        One of `BLOCKED_SCHEMES`.
    block_size : int, optional
        Queries and keys per tile. Peak memory grows with it (about
        ``block_size * (t_k + d)`` elements per head); so does speed.
    scale, mask
        As in `relpos_ref.attention`; the default scale is the scheme's
        (``1`` for t5, ``1 / sqrt(d f)`` for deberta).
    causal : bool, optional
        Default: the scheme's (``True`` for music and transformer_xl).
        Key tiles wholly in the future of a query tile are skipped.
    q_offset : int, optional
        Default ``t_k - t_q`` for transformer_xl, ``0`` otherwise.
    progress : bool, optional
        Draw a progress bar over the query blocks (only on a terminal).
    **params
        The scheme's other keyword arguments (``beyond``, ``order``,
        ``max_distance``, ``clamp_len``, ``max_position``, ...).

    Returns
    -------
    out : array, shape ``(..., t_q, d_v)``
        Same dtype and device as `q`.

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> q, k, v = rng.standard_normal((3, 2, 50, 8))
    >>> key_table, value_table = rng.standard_normal((2, 9, 8))  # K = 4
    >>> out = blocked_attention(q, k, v, key_table, value_table, scheme="shaw", block_size=16)
    >>> from relpos_ref import shaw_attention
    >>> bool(np.allclose(out, shaw_attention(q, k, v, key_table, value_table)))
    True
    """
    check_choice("scheme", scheme, BLOCKED_SCHEMES)
    plan_of, known = _PLANS[scheme]
    unknown = sorted(set(params) - set(known))
    if unknown:
        msg = (f"unknown parameter(s) {', '.join(unknown)} for scheme {scheme!r}; "
               f"known: {', '.join(known) or 'none'}")
        raise TypeError(msg)
    xp, batch = check_qkv(q, k, v)
    _xp.array_namespace(q, k, v, mask, *tables)
    block = positive_int("block_size", block_size)
    t_q, t_k = q.shape[-2], k.shape[-2]
    if q_offset is None:
        q_offset = t_k - t_q if scheme == "transformer_xl" else 0
    q_offset = as_int("q_offset", q_offset)
    causal = scheme in _CAUSAL_BY_DEFAULT if causal is None else bool(causal)
    ctx = {"t_q": t_q, "t_k": t_k, "q_offset": q_offset, "scale": scale}
    plan = plan_of(xp, q, k, tables, params, ctx)
    dev = _xp.device(q)
    d_v = v.shape[-1]
    lead = tuple(batch)
    if mask is not None:
        lead = broadcast_shapes(batch=lead, mask=tuple(mask.shape[:-2]))
    neg_inf = xp.asarray(-xp.inf, dtype=q.dtype, device=dev)
    zero = xp.asarray(0.0, dtype=q.dtype, device=dev)
    one = xp.asarray(1.0, dtype=q.dtype, device=dev)
    pieces = []
    starts = range(0, t_q, block)
    with Progress(len(starts), f"blocked {scheme}", enabled=None if progress else False) as bar:
        for i0 in starts:
            i1 = min(i0 + block, t_q)
            q_blk = plan.q[..., i0:i1, :]
            context = plan.query_block(q_blk, i0)
            rows = i1 - i0
            m = xp.full((*lead, rows, 1), -xp.inf, dtype=q.dtype, device=dev)
            total = xp.zeros((*lead, rows, 1), dtype=q.dtype, device=dev)
            acc = xp.zeros((*lead, rows, d_v), dtype=q.dtype, device=dev)
            for j0 in range(0, t_k, block):
                if causal and j0 > i1 - 1 + q_offset:
                    break  # every key from here on is in the future of every query
                j1 = min(j0 + block, t_k)
                k_blk, v_blk = plan.k[..., j0:j1, :], v[..., j0:j1, :]
                off = q_offset + i0 - j0
                position, bias = plan.terms(context, q_blk, k_blk, i0, j0, off)
                content = xp.matmul(q_blk, xp.matrix_transpose(k_blk))
                logits = compose_logits(content, scale=plan.scale, position=position, bias=bias)
                allowed = allowed_keys(rows, j1 - j0, mask=_mask_tile(mask, i0, i1, j0, j1),
                                       causal=causal, q_offset=off, xp=xp, device=dev)
                if allowed is not None:
                    logits = xp.where(allowed, logits, neg_inf)
                new_m = xp.maximum(m, xp.max(logits, axis=-1, keepdims=True))
                base = xp.where(new_m == neg_inf, zero, new_m)
                weights = xp.exp(logits - base)
                correction = xp.exp(m - base)
                total = total * correction + xp.sum(weights, axis=-1, keepdims=True)
                update = xp.matmul(weights, v_blk)
                if plan.values is not None:
                    update = update + plan.values(weights, off)
                acc = acc * correction + update
                m = new_m
            pieces.append(acc / xp.where(total == zero, one, total))
            bar.advance(f"queries {i0}..{i1 - 1}")
    if not pieces:
        return xp.zeros((*lead, 0, d_v), dtype=q.dtype, device=dev)
    return pieces[0] if len(pieces) == 1 else xp.concat(pieces, axis=-2)
