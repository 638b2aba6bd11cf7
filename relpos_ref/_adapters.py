"""Uniform adapters over each scheme's own functions, for `relpos_ref.catalog`.

The schemes' functions take their tables and options each their own way; the
catalog's readers (blocked evaluation, golden cases, the command line, the
docs, the benchmarks) call these instead, all with one signature per task:

- ``check(q, k, v, tables, *, scale, mask, causal, q_offset, options)``
  validates a call as ``<scheme>_attention`` does and returns
  ``(Call, options)``, the options completed (ALiBi's slopes, say);
- ``terms(q, k, tables, *, q_offset, i0, j0, options, method)`` gives the
  `Terms` of queries ``i0 ..`` and keys ``j0 ..`` of a grid whose query 0
  sits at `q_offset` (``i0 = j0 = 0``: the whole grid). Relative schemes see
  such a tile as the grid at ``q_offset + i0 - j0``;
- ``values(weights, tables, *, q_offset, options, method, allowed)``: a
  relative-value term over the allowed pairs, or ``None``;
- ``indices(xp, device, *, t_q, t_k, q_offset, sizes, options)``: the integer
  intermediates by name (``distance``, ``index``, ``valid``, ...);
- ``rotate(q, k, *, q_offset, options)``: RoPE's rotated queries and keys.

`tables` maps table names to arrays (omitted optional tables are absent);
`sizes` maps the catalog's size keys (``"K"``, ``"M"``, ...) to integers.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

from . import _xp
from .calls import resolve_call
from .layouts import _take_per_row
from .positions import relative_positions
from .schemes import (
    absolute,
    alibi,
    bias,
    deberta,
    general,
    grid2d,
    music,
    shaw,
    swin,
    t5,
    transformer_xl,
)
from .schemes._tables import table_logits

__all__ = ["Terms"]


class Terms(NamedTuple):
    """The score terms of a grid: ``position`` (scaled with ``q . k``) and ``bias`` (after)."""

    position: Any = None
    bias: Any = None


def _off(q_offset: int, i0: int, j0: int) -> int:
    return q_offset + i0 - j0


def distance(xp, device, *, t_q, t_k, q_offset, **_):
    return {"distance": relative_positions(t_q, t_k, q_offset=q_offset, xp=xp, device=device)}


def no_terms(q, k, tables, **_):
    return Terms()


def plain_check(q, k, v, tables, *, scale, mask, causal, q_offset, options):
    call = resolve_call(q, k, v, scale=scale, mask=mask, causal=causal, q_offset=q_offset)
    return call, dict(options)


# -- absolute -------------------------------------------------------------------


def absolute_check(q, k, v, tables, *, scale, mask, causal, q_offset, options):
    call = absolute.absolute_call(
        q, k, v, tables["table"], scale=scale, mask=mask, causal=causal, q_offset=q_offset
    )
    return call, dict(options)


def absolute_terms(q, k, tables, *, q_offset, i0, j0, options, method):
    rows = tables["table"][..., j0:, :]  # key j0 + j reads row j0 + j
    return Terms(position=absolute.absolute_logits(q, rows, k.shape[-2]))


def absolute_indices(xp, device, *, t_q, t_k, q_offset, sizes, options):
    index = absolute.absolute_index(t_q, t_k, xp=xp, device=device)
    return {**distance(xp, device, t_q=t_q, t_k=t_k, q_offset=q_offset), "index": index}


# -- two-sided tables: shaw and bias ----------------------------------------------


def shaw_check(q, k, v, tables, *, scale, mask, causal, q_offset, options):
    call = shaw.shaw_call(
        q, k, v, tables["key_table"], tables.get("value_table"), scale=scale, mask=mask,
        causal=causal, q_offset=q_offset, method="efficient", **options,
    )
    return call, dict(options)


def shaw_terms(q, k, tables, *, q_offset, i0, j0, options, method):
    return Terms(position=shaw.shaw_logits(
        q, tables["key_table"], k.shape[-2], q_offset=_off(q_offset, i0, j0), method=method,
        **options,
    ))


def shaw_values(weights, tables, *, q_offset, options, method, allowed=None):
    table = tables.get("value_table")
    if table is None:
        return None
    return shaw.shaw_values(weights, table, q_offset=q_offset, method=method, allowed=allowed,
                            **options)


def two_sided_indices(xp, device, *, t_q, t_k, q_offset, sizes, options):
    index, valid = shaw.shaw_index(
        t_q, t_k, max_distance=sizes["K"], q_offset=q_offset, xp=xp, device=device, **options
    )
    found = distance(xp, device, t_q=t_q, t_k=t_k, q_offset=q_offset)
    return {**found, "index": index, "valid": valid}


def bias_check(q, k, v, tables, *, scale, mask, causal, q_offset, options):
    call = bias.bias_call(
        q, k, v, tables["table"], scale=scale, mask=mask, causal=causal, q_offset=q_offset,
        **options,
    )
    return call, dict(options)


def bias_terms(q, k, tables, *, q_offset, i0, j0, options, method):
    return Terms(bias=bias.bias_logits(
        tables["table"], q.shape[-2], k.shape[-2], q_offset=_off(q_offset, i0, j0), **options
    ))


# -- one-sided and full tables: music and general -----------------------------------


def music_check(q, k, v, tables, *, scale, mask, causal, q_offset, options):
    call = music.music_call(
        q, k, v, tables["table"], tables.get("value_table"), scale=scale, mask=mask,
        causal=causal, q_offset=q_offset, method="efficient", **options,
    )
    return call, dict(options)


def music_terms(q, k, tables, *, q_offset, i0, j0, options, method):
    return Terms(position=music.music_logits(
        q, tables["table"], k.shape[-2], q_offset=_off(q_offset, i0, j0), method=method,
        **options,
    ))


def music_values(weights, tables, *, q_offset, options, method, allowed=None):
    table = tables.get("value_table")
    if table is None:
        return None
    return music.music_values(weights, table, q_offset=q_offset, method=method,
                              allowed=allowed, **options)


def music_indices(xp, device, *, t_q, t_k, q_offset, sizes, options):
    index, valid = music.music_index(
        t_q, t_k, length=sizes["M"], q_offset=q_offset, xp=xp, device=device, **options
    )
    found = distance(xp, device, t_q=t_q, t_k=t_k, q_offset=q_offset)
    return {**found, "index": index, "valid": valid}


def general_check(q, k, v, tables, *, scale, mask, causal, q_offset, options):
    call = general.general_call(
        q, k, v, tables["table"], scale=scale, mask=mask, causal=causal, q_offset=q_offset,
        method="efficient", **options,
    )
    return call, dict(options)


def general_terms(q, k, tables, *, q_offset, i0, j0, options, method):
    return Terms(position=general.general_logits(
        q, tables["table"], k.shape[-2], q_offset=_off(q_offset, i0, j0), method=method,
        **options,
    ))


def general_indices(xp, device, *, t_q, t_k, q_offset, sizes, options):
    index = general.general_index(
        t_q, t_k, t_max=sizes["t_max"], q_offset=q_offset, xp=xp, device=device, **options
    )
    return {**distance(xp, device, t_q=t_q, t_k=t_k, q_offset=q_offset), "index": index}


# -- grids: grid2d and swin ---------------------------------------------------------


def grid2d_check(q, k, v, tables, *, scale, mask, causal, q_offset, options):
    if q_offset not in (None, 0):
        msg = f"grid2d attends within the grid: `q_offset` must be 0, got {q_offset!r}"
        raise ValueError(msg)
    call = grid2d.grid2d_call(
        q, k, v, tables["row_table"], tables["col_table"], scale=scale, mask=mask,
        causal=causal, method="efficient", **options,
    )
    return call, dict(options)


def grid2d_terms(q, k, tables, *, q_offset, i0, j0, options, method):
    height, width = options["height"], options["width"]
    if i0 == j0 == 0 and q.shape[-2] == k.shape[-2] == height * width:
        return Terms(position=grid2d.grid2d_logits(
            q, tables["row_table"], tables["col_table"], height=height, width=width,
            method=method,
        ))
    # A tile: the table rows of its query and key tokens, gathered from q R^T.
    xp = _xp.array_namespace(q)
    rows, cols = grid2d.grid2d_index(height, width, xp=xp, device=_xp.device(q))
    tile = (slice(i0, i0 + q.shape[-2]), slice(j0, j0 + k.shape[-2]))
    return Terms(position=_take_per_row(table_logits(q, tables["row_table"]), rows[tile])
                 + _take_per_row(table_logits(q, tables["col_table"]), cols[tile]))


def grid2d_indices(xp, device, *, t_q, t_k, q_offset, sizes, options):
    rows, cols = grid2d.grid2d_index(sizes["height"], sizes["width"], xp=xp, device=device)
    return {"index_rows": rows, "index_cols": cols}


def swin_check(q, k, v, tables, *, scale, mask, causal, q_offset, options):
    if causal or q_offset not in (None, 0):
        msg = (f"swin attends within one window: `causal` must be False and `q_offset` 0, "
               f"got causal={causal!r}, q_offset={q_offset!r}")
        raise ValueError(msg)
    call = swin.swin_call(q, k, v, tables["table"], scale=scale, mask=mask, **options)
    return call, dict(options)


def swin_terms(q, k, tables, *, q_offset, i0, j0, options, method):
    term = swin.swin_bias(tables["table"], options["window_height"], options["window_width"])
    return Terms(bias=term[..., i0 : i0 + q.shape[-2], j0 : j0 + k.shape[-2]])


def swin_indices(xp, device, *, t_q, t_k, q_offset, sizes, options):
    return {"index": swin.swin_index(sizes["height"], sizes["width"], xp=xp, device=device)}


# -- scalar biases of the distance: t5 and alibi ------------------------------------


def t5_check(q, k, v, tables, *, scale, mask, causal, q_offset, options):
    call = t5.t5_call(
        q, k, v, tables["table"], scale=scale, mask=mask, causal=causal, q_offset=q_offset,
        **options,
    )
    return call, dict(options)


def t5_terms(q, k, tables, *, q_offset, i0, j0, options, method):
    return Terms(bias=t5.t5_bias(
        tables["table"], q.shape[-2], k.shape[-2], q_offset=_off(q_offset, i0, j0), **options
    ))


def t5_indices(xp, device, *, t_q, t_k, q_offset, sizes, options):
    r = relative_positions(t_q, t_k, q_offset=q_offset, xp=xp, device=device)
    return {"distance": r, "index": t5.t5_bucket(r, num_buckets=sizes["buckets"], **options)}


def alibi_check(q, k, v, tables, *, scale, mask, causal, q_offset, options):
    call, slopes = alibi.alibi_call(
        q, k, v, scale=scale, mask=mask, causal=causal, q_offset=q_offset, **options
    )
    return call, {**options, "slopes": slopes}


def alibi_terms(q, k, tables, *, q_offset, i0, j0, options, method):
    return Terms(bias=alibi.alibi_bias(
        options["slopes"], q.shape[-2], k.shape[-2], q_offset=_off(q_offset, i0, j0),
        symmetric=options["symmetric"],
    ))


def alibi_shifted_terms(q, k, tables, *, q_offset, i0, j0, options, method):
    # plus m alibi_shift(q_offset) for the whole call's q_offset: the same constant in
    # every tile, so an online softmax over tiles sees one set of logits
    return Terms(bias=alibi.alibi_bias(
        options["slopes"], q.shape[-2], k.shape[-2], q_offset=_off(q_offset, i0, j0),
        symmetric=options["symmetric"], shift=alibi.alibi_shift(q_offset, options["symmetric"]),
    ))


# -- numbers from the command line ---------------------------------------------------


def parse_real(text: str) -> float:
    """A finite number from the command line (``--base``).

    Examples
    --------
    >>> parse_real("1e4")
    10000.0
    """
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        msg = f"expected a finite number, got {text!r}"
        raise ValueError(msg)
    return value


# -- transformer_xl and deberta -----------------------------------------------------


def _txl_tables(tables):
    return tables["w_r"], tables.get("content_bias"), tables.get("position_bias")


def txl_check(q, k, v, tables, *, scale, mask, causal, q_offset, options):
    call = transformer_xl.transformer_xl_call(
        q, k, v, *_txl_tables(tables), scale=scale, mask=mask, causal=causal,
        q_offset=q_offset, clamp_len=options["clamp_len"], method="efficient",
    )
    return call, dict(options)


def txl_terms(q, k, tables, *, q_offset, i0, j0, options, method):
    return Terms(position=transformer_xl.transformer_xl_logits(
        q, k, *_txl_tables(tables), q_offset=_off(q_offset, i0, j0), method=method, **options
    ))


def txl_indices(xp, device, *, t_q, t_k, q_offset, sizes, options):
    delta = transformer_xl.transformer_xl_distance(
        t_q, t_k, q_offset=q_offset, clamp_len=options.get("clamp_len"), xp=xp, device=device
    )
    return {**distance(xp, device, t_q=t_q, t_k=t_k, q_offset=q_offset), "delta": delta}


def deberta_check(q, k, v, tables, *, scale, mask, causal, q_offset, options):
    call = deberta.deberta_call(
        q, k, v, tables.get("key_table"), tables.get("query_table"), scale=scale, mask=mask,
        causal=causal, q_offset=q_offset, method="efficient", **options,
    )
    return call, dict(options)


def deberta_terms(q, k, tables, *, q_offset, i0, j0, options, method):
    return Terms(position=deberta.deberta_logits(
        q, k, tables.get("key_table"), tables.get("query_table"),
        q_offset=_off(q_offset, i0, j0), method=method, **options,
    ))


def deberta_indices(xp, device, *, t_q, t_k, q_offset, sizes, options):
    found = distance(xp, device, t_q=t_q, t_k=t_k, q_offset=q_offset)
    max_position = options.get("max_position")
    found["index"] = deberta.deberta_index(
        t_q, t_k, span=sizes["span"], max_position=max_position, q_offset=q_offset, xp=xp,
        device=device,
    )
    if max_position is not None:
        found["bucket"] = deberta.deberta_bucket(
            found["distance"], bucket_size=sizes["span"], max_position=max_position
        )
    return found
