"""Each scheme's lowering to the distance form (`relpos_ref.lowering`), for the catalog.

One function per scheme, ``lower(q, k, v, tables, *, call, mask, options)``,
for a call already validated by the scheme's checks (``call`` and the
completed ``options`` from `relpos_ref.catalog.Scheme.check_call`). Each
reads the scheme's own index functions (`relpos_ref.schemes.shaw.shaw_index`,
`relpos_ref.schemes.t5.t5_bucket`, ...) on the call's distances
(`relpos_ref.lowering.distances`), or on a grid of one query that has the
same distances, rather than on the whole grid: a map has ``t_q + t_k - 1``
entries, and a policy's ``"error"`` refuses the same calls with the same
message.
"""

from __future__ import annotations

from typing import Any

from . import _xp
from .lowering import (
    BiasTerm,
    DistanceForm,
    IndexMap,
    SideTerm,
    ValueTerm,
    distance_map,
    distances,
)
from .positions import grid_positions
from .schemes import (
    alibi,
    cope,
    deberta,
    fire,
    forgetting,
    general,
    kerple,
    music,
    sandwich,
    shaw,
    swinv2,
    t5,
    transformer_xl,
)


def _wide(x: Any) -> Any:
    # what the lowering computes from a 16-bit call is float32, as the specification has it
    xp = _xp.array_namespace(x)
    if xp.isdtype(x.dtype, "real floating") and xp.finfo(x.dtype).bits == 16:
        return xp.astype(x, xp.float32)
    return x


def _rows(xp: Any, found: Any) -> Any:
    index, valid = found
    return xp.where(valid, index, xp.full_like(index, -1))


def _identity(xp: Any, n: int, device: Any) -> Any:
    return xp.arange(n, dtype=_xp.index_dtype(xp, device), device=device)


def plain(q, k, v, tables, *, call, mask, options):
    return DistanceForm(q, k, v, call, mask, dense=(options.get("position"),
                                                    options.get("bias")))


def absolute(q, k, v, tables, *, call, mask, options):
    # q . (k_j + R_j): the key embedding is scaled with the content term
    rows = _wide(tables["table"])[..., : call.t_k, :]
    return DistanceForm(q, _wide(k) + rows, v, call, mask)


def _one_query(call) -> dict[str, int]:
    # a grid of one query against every distance of the call: the same distances, so a
    # scheme's grid index function (and its "error" policy) reads them in order
    n = call.t_q + call.t_k - 1 if call.t_q and call.t_k else 0
    return {"t_k": n, "q_offset": call.t_q - 1 + call.q_offset}


def _two_sided(name, table, call, options, *, unit="rows"):
    rows = table.shape[-2] if unit == "rows" else table.shape[-1]
    past, top = shaw.two_sided_extent(name, rows, tuple(table.shape), options["max_past"],
                                      unit=unit)
    grid = _one_query(call)
    found = shaw.shaw_index(1, grid["t_k"], max_distance=top, q_offset=grid["q_offset"],
                            beyond=options["beyond"], xp=call.xp, device=_xp.device(table),
                            max_past=None if options["max_past"] is None else past)
    return distance_map(_rows(call.xp, found)[0, :], call)


def shaw_form(q, k, v, tables, *, call, mask, options):
    key_table, value_table = tables["key_table"], tables.get("value_table")
    index = _two_sided("key_table", key_table, call, options)
    values = () if value_table is None else (ValueTerm(value_table, index),)
    return DistanceForm(q, k, v, call, mask, query_terms=(SideTerm(q, key_table, index),),
                        values=values)


def bias_form(q, k, v, tables, *, call, mask, options):
    index = _two_sided("table", tables["table"], call, options, unit="entries")
    return DistanceForm(q, k, v, call, mask, biases=(BiasTerm(tables["table"], index),))


def music_form(q, k, v, tables, *, call, mask, options):
    table, value_table = tables["table"], tables.get("value_table")
    grid = _one_query(call)
    found = music.music_index(1, grid["t_k"], length=table.shape[-2],
                              q_offset=grid["q_offset"], beyond=options["beyond"],
                              xp=call.xp, device=_xp.device(q))
    index = distance_map(_rows(call.xp, found)[0, :], call)
    values = () if value_table is None else (ValueTerm(value_table, index),)
    return DistanceForm(q, k, v, call, mask, query_terms=(SideTerm(q, table, index),),
                        values=values)


def general_form(q, k, v, tables, *, call, mask, options):
    table = tables["table"]
    t_max = general._t_max(table)
    r = distances(call, device=_xp.device(q))  # the check kept every r in the table
    rows = r + (t_max - 1) if options["order"] == "past_to_future" else (t_max - 1) - r
    return DistanceForm(q, k, v, call, mask,
                        query_terms=(SideTerm(q, table, distance_map(rows, call)),))


def _grid_maps(xp: Any, height: int, width: int, device: Any) -> tuple[IndexMap, IndexMap]:
    # row and column of each token, key minus query: dy + height - 1, dx + width - 1
    y, x = grid_positions(height, width, xp=xp, device=device)
    return (IndexMap(_identity(xp, 2 * height - 1, device), -(height - 1), y, y),
            IndexMap(_identity(xp, 2 * width - 1, device), -(width - 1), x, x))


def grid2d_form(q, k, v, tables, *, call, mask, options):
    by_row, by_col = _grid_maps(call.xp, options["height"], options["width"], _xp.device(q))
    terms = (SideTerm(q, tables["row_table"], by_row), SideTerm(q, tables["col_table"], by_col))
    return DistanceForm(q, k, v, call, mask, query_terms=terms)


def swin_form(q, k, v, tables, *, call, mask, options):
    # entry (dy + Wh - 1)(2 Ww - 1) + dx + Ww - 1 is the difference of the coordinates
    # y (2 Ww - 1) + x, shifted by (Wh - 1)(2 Ww - 1) + Ww - 1
    xp, device = call.xp, _xp.device(q)
    wh, ww = options["window_height"], options["window_width"]
    y, x = grid_positions(wh, ww, xp=xp, device=device)
    coordinate = y * (2 * ww - 1) + x
    index = IndexMap(_identity(xp, (2 * wh - 1) * (2 * ww - 1), device),
                     -((wh - 1) * (2 * ww - 1) + ww - 1), coordinate, coordinate)
    return DistanceForm(q, k, v, call, mask, biases=(BiasTerm(tables["table"], index),))


def swinv2_form(q, k, v, tables, *, call, mask, options):
    # the MLP's table read as Swin v1's; cosine attention: q_hat tau and k_hat at scale 1;
    # an additive mask penalty: plain attention's dense bias, no boolean mask
    table = swinv2.swinv2_table(_wide(tables["w1"]), _wide(tables["b1"]), _wide(tables["w2"]),
                                options["window_height"], options["window_width"],
                                pretrained_window=options["pretrained_window"])
    scale = options["logit_scale"]
    if scale is not None and not swinv2._one_number(scale):
        scale = _wide(scale)
    q2, k2, *_ = swinv2._operands(_wide(q), _wide(k), scale)
    form = swin_form(q2, k2, v, {"table": table}, call=call, mask=mask, options=options)
    penalty = options["mask_penalty"]
    if mask is None or penalty is None:
        return form
    xp = call.xp
    zero = xp.zeros((), dtype=q2.dtype, device=_xp.device(q))
    dense = xp.where(mask, zero, xp.asarray(float(penalty), dtype=q2.dtype, device=_xp.device(q)))
    return form._replace(mask=None, dense=(None, dense))


def t5_form(q, k, v, tables, *, call, mask, options):
    table = tables["table"]
    rows = t5.t5_bucket(distances(call, device=_xp.device(q)), num_buckets=table.shape[-1],
                        max_distance=options["max_distance"],
                        bidirectional=options["bidirectional"])
    return DistanceForm(q, k, v, call, mask, biases=(BiasTerm(table, distance_map(rows, call)),))


def alibi_form(q, k, v, tables, *, call, mask, options):
    # the specification's bias of one query against every distance of the grid
    n = call.t_q + call.t_k - 1 if call.t_q and call.t_k else 0
    # shifted by a constant of the call, as alibi_attention does: exact at any offset
    symmetric = options["symmetric"]
    row = alibi.alibi_bias(_wide(options["slopes"]), 1, n,
                           q_offset=call.t_q - 1 + call.q_offset, symmetric=symmetric,
                           shift=alibi.alibi_shift(call.q_offset, symmetric))[:, 0, :]
    index = distance_map(_identity(call.xp, n, _xp.device(q)), call)
    return DistanceForm(q, k, v, call, mask, biases=(BiasTerm(row, index),))


def kerple_form(q, k, v, tables, *, call, mask, options):
    # the specification's kernel for one query against every distance of the grid
    grid = _one_query(call)
    row = kerple.kerple_bias(_wide(options["r1"]), _wide(options["r2"]), 1, grid["t_k"],
                             q_offset=grid["q_offset"], kernel=options["kernel"])[:, 0, :]
    index = distance_map(_identity(call.xp, grid["t_k"], _xp.device(q)), call)
    return DistanceForm(q, k, v, call, mask, biases=(BiasTerm(row, index),))


def sandwich_form(q, k, v, tables, *, call, mask, options):
    grid = _one_query(call)
    xp = call.xp
    ratios = xp.asarray(sandwich.sandwich_ratios(q.shape[-3]), dtype=_wide(q).dtype,
                        device=_xp.device(q))
    row = sandwich.sandwich_bias(ratios, 1, grid["t_k"], q_offset=grid["q_offset"],
                                 d_bar=options["d_bar"], start=options["start"])[:, 0, :]
    index = distance_map(_identity(xp, grid["t_k"], _xp.device(q)), call)
    return DistanceForm(q, k, v, call, mask, biases=(BiasTerm(row, index),))


def forgetting_form(q, k, v, tables, *, call, mask, options):
    # F_(i + q_offset) - F_j is a query scalar plus a key scalar read from data, not a row
    # of a table at a distance: the form has no such term, so the bias is dense, computed
    # by the specification (its float64 sums, rounded once); exact, and O(t_q t_k)
    f = _wide(tables["f"])
    bias = forgetting.forgetting_bias(f, call.t_q, call.t_k, q_offset=call.q_offset)
    return DistanceForm(q, k, v, call, mask, dense=(None, bias))


def fire_form(q, k, v, tables, *, call, mask, options):
    # the normaliser psi(max(|L|, i + q_offset)) reads the query's absolute position: the
    # bias is no function of the distance alone, so it is dense: the specification's inputs,
    # and the MLP as the piecewise-linear function it is (two coefficients per pair, not m)
    from ._fire_pieces import mlp_by_pieces

    mlp = [_wide(tables[n]) for n in fire.TABLES]
    given = {n: _wide(x) if hasattr(x, "shape") else x for n, x in options.items()}
    b2 = given.pop("b2", None)
    x = fire.fire_inputs(call.t_q, call.t_k, q_offset=call.q_offset, xp=call.xp,
                         dtype=mlp[0].dtype, device=_xp.device(mlp[0]), **given)
    bias = mlp_by_pieces(x, *mlp, b2)
    if fire._check_mlp(*mlp, b2) is None:
        bias = bias[0, ...]  # one output for every head, as fire_bias gives it
    return DistanceForm(q, k, v, call, mask, dense=(None, bias))


def cope_form(q, k, v, tables, *, call, mask, options):
    # CoPE's term is read from q and k themselves (the gates, their reverse cumulative sum):
    # no table row at a distance, so a dense bias, computed by the specification from the
    # arrays given; every operation is differentiable, so a kernel's autograd through this
    # lowering carries the gates' gradient to q and k (no kernel differentiates the bias as
    # a constant). O(t_q t_k): the cumulative sums are the cost (docs/schemes/cope.md)
    term = cope._term(_wide(q), _wide(k), _wide(tables["table"]), call, mask)[0]
    return DistanceForm(q, k, v, call, mask, dense=(None, term))


def rope_form(q, k, v, tables, *, call, mask, options):
    q, k = _wide(q), _wide(k)
    from ._rope_adapters import rope_rotate

    q, k = rope_rotate(q, k, q_offset=call.q_offset, options=options)  # the catalog's adapter
    return DistanceForm(q, k, v, call, mask)


def xpos_form(q, k, v, tables, *, call, mask, options):
    # RoPE's rotation with xPos's scales: the content operands, nothing else
    from ._xpos_adapters import xpos_rotate

    q, k = xpos_rotate(_wide(q), _wide(k), q_offset=call.q_offset, options=options)
    return DistanceForm(q, k, v, call, mask)


def transformer_xl_form(q, k, v, tables, *, call, mask, options):
    w_r = _wide(tables["w_r"])
    u, bias_v = tables.get("content_bias"), tables.get("position_bias")
    deltas = transformer_xl.grid_distances(call.t_q, call.t_k, q_offset=call.q_offset,
                                           clamp_len=options["clamp_len"], xp=call.xp,
                                           device=_xp.device(q))
    projected = transformer_xl.transformer_xl_rows(deltas, w_r, base=options["base"])
    index = distance_map(_identity(call.xp, deltas.shape[0], _xp.device(q)), call)
    per_head = transformer_xl._per_head_vector
    content = q if u is None else _wide(q) + per_head(_wide(u))
    query = q if bias_v is None else _wide(q) + per_head(_wide(bias_v))
    return DistanceForm(content, k, v, call, mask,
                        query_terms=(SideTerm(query, projected, index),))


def deberta_form(q, k, v, tables, *, call, mask, options):
    key_table, query_table = tables.get("key_table"), tables.get("query_table")
    span = deberta._check_tables(q, key_table, query_table)
    if span is None:
        return DistanceForm(q, k, v, call, mask)
    rows = deberta.deberta_rows(distances(call, device=_xp.device(q)), span=span,
                                max_position=options["max_position"])
    index = distance_map(rows, call)
    c2p = () if key_table is None else (SideTerm(q, key_table, index),)
    p2c = () if query_table is None else (SideTerm(k, query_table, index),)
    return DistanceForm(q, k, v, call, mask, query_terms=c2p, key_terms=p2c)


#: Scheme name -> its lowering.
LOWERINGS = {
    "plain": plain,
    "absolute": absolute,
    "shaw": shaw_form,
    "bias": bias_form,
    "music": music_form,
    "general": general_form,
    "grid2d": grid2d_form,
    "t5": t5_form,
    "alibi": alibi_form,
    "kerple": kerple_form,
    "sandwich": sandwich_form,
    "forgetting": forgetting_form,
    "fire": fire_form,
    "cope": cope_form,
    "swin": swin_form,
    "swinv2": swinv2_form,
    "rope": rope_form,
    "xpos": xpos_form,
    "transformer_xl": transformer_xl_form,
    "deberta": deberta_form,
}
