"""How each scheme becomes a golden case: its inputs and its intermediates.

Adding a scheme to the golden suite takes one `SchemeSpec` (a few lines
calling the scheme's public functions) and a few `Case` lines in
`relpos_ref.golden.cases`. Everything else (inputs, the float64 goldens, the
naive pipeline behind the tolerances, files, manifest, verify, check) is
shared.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .. import schemes as sc
from .._xp import device
from ..positions import relative_positions

__all__ = ["COMMON_DEFAULTS", "SCHEMES", "SchemeSpec"]

#: Parameters every case has, with their defaults.
COMMON_DEFAULTS: Mapping[str, Any] = {
    "b": 1,  # batch
    "h": 1,  # heads
    "t_q": 1,
    "t_k": 1,
    "d": 8,  # width of q, k and v
    "causal": False,
    "q_offset": 0,
    "masked": False,  # a random mask with fully masked rows
    "scale": None,  # None: 1 / sqrt(d)
    "per_head": False,  # tables (h, n, ...) instead of shared (n, ...)
}


@dataclass(frozen=True)
class SchemeSpec:
    """A scheme as the golden suite sees it.

    Attributes
    ----------
    name : str
        The scheme's name, the first part of case ids.
    defaults : mapping
        The scheme's own parameters and their defaults.
    label : callable
        ``params -> str``: the scheme's part of the shape label (``"K4"``).
    tables : callable
        ``params -> {name: shape}``: float inputs besides ``q, k, v``.
    terms : callable
        ``(xp, arrays, params, method) -> dict``: integer intermediates
        (distances, table rows, validity) and the float ``position`` (scaled
        with ``q . k``) and ``bias`` (added after scaling) terms.
    values : callable, optional
        ``(weights, arrays, params, method) -> array``: a term added to the
        output (relative values), or ``None``.
    attention : callable
        ``(arrays, params, method) -> (out, weights)``: the scheme's public
        ``*_attention``; the suite's goldens are tested equal to it.
    has_efficient : callable
        ``params -> bool``: whether ``method="efficient"`` applies.
    derive : callable
        ``params -> dict``: parameters fixed by others (a grid's lengths).
    """

    name: str
    defaults: Mapping[str, Any]
    label: Callable[[Mapping[str, Any]], str]
    tables: Callable[[Mapping[str, Any]], dict[str, tuple[int, ...]]]
    terms: Callable[..., dict[str, Any]]
    attention: Callable[..., tuple[Any, Any]]
    values: Callable[..., Any] | None = None
    has_efficient: Callable[[Mapping[str, Any]], bool] = field(default=lambda p: True)
    derive: Callable[[Mapping[str, Any]], dict[str, Any]] = field(default=lambda p: {})


def _rows(p: Mapping[str, Any], n: int, width: int | None) -> tuple[int, ...]:
    head = (p["h"],) if p["per_head"] else ()
    return (*head, n) if width is None else (*head, n, width)


def _common(arrays: Mapping[str, Any], p: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "scale": p["scale"],
        "mask": arrays.get("mask"),
        "causal": p["causal"],
        "return_weights": True,
    }


def _distance(xp: Any, arrays: Mapping[str, Any], p: Mapping[str, Any]) -> Any:
    return relative_positions(p["t_q"], p["t_k"], q_offset=p["q_offset"], xp=xp)


def _device(arrays: Mapping[str, Any]) -> Any:
    return device(arrays["q"])


# -- absolute ---------------------------------------------------------------


def _absolute_terms(xp, arrays, p, method):
    return {
        "distance": _distance(xp, arrays, p),
        "index": sc.absolute_index(p["t_q"], p["t_k"], xp=xp, device=_device(arrays)),
        "position": sc.absolute_logits(arrays["q"], arrays["table"], p["t_k"]),
    }


ABSOLUTE = SchemeSpec(
    name="absolute",
    defaults={"rows": None},  # None: t_k rows
    label=lambda p: f"R{p['rows'] or p['t_k']}",
    tables=lambda p: {"table": _rows(p, p["rows"] or p["t_k"], p["d"])},
    terms=_absolute_terms,
    attention=lambda a, p, m: sc.absolute_attention(
        a["q"], a["k"], a["v"], a["table"], q_offset=p["q_offset"], **_common(a, p)
    ),
    has_efficient=lambda p: False,
)

# -- shaw -------------------------------------------------------------------


def _two_sided_index(xp, arrays, p):
    return sc.shaw_index(
        p["t_q"],
        p["t_k"],
        max_distance=p["K"],
        q_offset=p["q_offset"],
        beyond=p["beyond"],
        xp=xp,
        device=_device(arrays),
    )


def _shaw_terms(xp, arrays, p, method):
    index, valid = _two_sided_index(xp, arrays, p)
    position = sc.shaw_logits(
        arrays["q"],
        arrays["key_table"],
        p["t_k"],
        q_offset=p["q_offset"],
        beyond=p["beyond"],
        method=method,
    )
    return {"distance": _distance(xp, arrays, p), "index": index, "valid": valid,
            "position": position}


def _shaw_values(weights, arrays, p, method):
    if "value_table" not in arrays:
        return None
    return sc.shaw_values(
        weights, arrays["value_table"], q_offset=p["q_offset"], beyond=p["beyond"], method=method
    )


def _shaw_tables(p):
    out = {"key_table": _rows(p, 2 * p["K"] + 1, p["d"])}
    if p["values"]:
        out["value_table"] = _rows(p, 2 * p["K"] + 1, p["d"])
    return out


SHAW = SchemeSpec(
    name="shaw",
    defaults={"K": 4, "beyond": "clip", "values": True},
    label=lambda p: f"K{p['K']}",
    tables=_shaw_tables,
    terms=_shaw_terms,
    values=_shaw_values,
    attention=lambda a, p, m: sc.shaw_attention(
        a["q"], a["k"], a["v"], a["key_table"], a.get("value_table"),
        q_offset=p["q_offset"], beyond=p["beyond"], method=m, **_common(a, p),
    ),
)

# -- bias -------------------------------------------------------------------


def _bias_terms(xp, arrays, p, method):
    index, valid = _two_sided_index(xp, arrays, p)
    bias = sc.bias_logits(
        arrays["table"], p["t_q"], p["t_k"], q_offset=p["q_offset"], beyond=p["beyond"]
    )
    return {"distance": _distance(xp, arrays, p), "index": index, "valid": valid, "bias": bias}


BIAS = SchemeSpec(
    name="bias",
    defaults={"K": 4, "beyond": "clip"},
    label=lambda p: f"K{p['K']}",
    tables=lambda p: {"table": _rows(p, 2 * p["K"] + 1, None)},
    terms=_bias_terms,
    attention=lambda a, p, m: sc.bias_attention(
        a["q"], a["k"], a["v"], a["table"], q_offset=p["q_offset"], beyond=p["beyond"],
        **_common(a, p),
    ),
    has_efficient=lambda p: False,
)

# -- music ------------------------------------------------------------------


def _music_terms(xp, arrays, p, method):
    index, valid = sc.music_index(
        p["t_q"],
        p["t_k"],
        length=p["M"],
        q_offset=p["q_offset"],
        beyond=p["beyond"],
        xp=xp,
        device=_device(arrays),
    )
    position = sc.music_logits(
        arrays["q"], arrays["table"], p["t_k"], q_offset=p["q_offset"], beyond=p["beyond"],
        method=method,
    )
    return {"distance": _distance(xp, arrays, p), "index": index, "valid": valid,
            "position": position}


def _music_values(weights, arrays, p, method):
    if "value_table" not in arrays:
        return None
    return sc.music_values(
        weights, arrays["value_table"], q_offset=p["q_offset"], beyond=p["beyond"], method=method
    )


def _music_tables(p):
    out = {"table": _rows(p, p["M"], p["d"])}
    if p["values"]:
        out["value_table"] = _rows(p, p["M"], p["d"])
    return out


MUSIC = SchemeSpec(
    name="music",
    defaults={"M": 8, "beyond": "clip", "values": False, "causal": True},
    label=lambda p: f"M{p['M']}",
    tables=_music_tables,
    terms=_music_terms,
    values=_music_values,
    attention=lambda a, p, m: sc.music_attention(
        a["q"], a["k"], a["v"], a["table"], a.get("value_table"),
        q_offset=p["q_offset"], beyond=p["beyond"], method=m, **_common(a, p),
    ),
    # the skew needs end-aligned queries
    has_efficient=lambda p: p["q_offset"] == p["t_k"] - p["t_q"],
)

# -- general ----------------------------------------------------------------


def _general_terms(xp, arrays, p, method):
    index = sc.general_index(
        p["t_q"], p["t_k"], t_max=p["t_max"], q_offset=p["q_offset"], order=p["order"], xp=xp,
        device=_device(arrays),
    )
    position = sc.general_logits(
        arrays["q"], arrays["table"], p["t_k"], q_offset=p["q_offset"], order=p["order"],
        method=method,
    )
    return {"distance": _distance(xp, arrays, p), "index": index, "position": position}


GENERAL = SchemeSpec(
    name="general",
    defaults={"t_max": 8, "order": "past_to_future"},
    label=lambda p: f"T{p['t_max']}",
    tables=lambda p: {"table": _rows(p, 2 * p["t_max"] - 1, p["d"])},
    terms=_general_terms,
    attention=lambda a, p, m: sc.general_attention(
        a["q"], a["k"], a["v"], a["table"], q_offset=p["q_offset"], order=p["order"],
        method=m, **_common(a, p),
    ),
)

# -- grid2d -----------------------------------------------------------------


def _grid2d_terms(xp, arrays, p, method):
    rows, cols = sc.grid2d_index(p["height"], p["width"], xp=xp, device=_device(arrays))
    position = sc.grid2d_logits(
        arrays["q"], arrays["row_table"], arrays["col_table"], height=p["height"],
        width=p["width"], method=method,
    )
    return {"index_rows": rows, "index_cols": cols, "position": position}


GRID2D = SchemeSpec(
    name="grid2d",
    defaults={"height": 2, "width": 2},
    label=lambda p: f"g{p['height']}x{p['width']}",
    tables=lambda p: {
        "row_table": _rows(p, 2 * p["height"] - 1, p["d"]),
        "col_table": _rows(p, 2 * p["width"] - 1, p["d"]),
    },
    terms=_grid2d_terms,
    attention=lambda a, p, m: sc.grid2d_attention(
        a["q"], a["k"], a["v"], a["row_table"], a["col_table"], height=p["height"],
        width=p["width"], method=m, **_common(a, p),
    ),
    derive=lambda p: {"t_q": p["height"] * p["width"], "t_k": p["height"] * p["width"]},
)

# -- t5 ---------------------------------------------------------------------


def _t5_terms(xp, arrays, p, method):
    r = _distance(xp, arrays, p)
    bucket = sc.t5_bucket(
        r, num_buckets=p["buckets"], max_distance=p["max_distance"],
        bidirectional=p["bidirectional"],
    )
    bias = sc.t5_bias(
        arrays["table"], p["t_q"], p["t_k"], q_offset=p["q_offset"],
        bidirectional=p["bidirectional"], max_distance=p["max_distance"],
    )
    return {"distance": r, "index": bucket, "bias": bias}


T5 = SchemeSpec(
    name="t5",
    defaults={"buckets": 32, "max_distance": 128, "bidirectional": True, "scale": 1.0},
    label=lambda p: f"B{p['buckets']}-D{p['max_distance']}",
    tables=lambda p: {"table": _rows(p, p["buckets"], None)},
    terms=_t5_terms,
    attention=lambda a, p, m: sc.t5_attention(
        a["q"], a["k"], a["v"], a["table"], q_offset=p["q_offset"],
        bidirectional=p["bidirectional"], max_distance=p["max_distance"], **_common(a, p),
    ),
    has_efficient=lambda p: False,
)

# -- alibi ------------------------------------------------------------------


def _alibi_slopes(xp, arrays, p):
    q = arrays["q"]
    return xp.asarray(sc.alibi_slopes(p["h"]), dtype=q.dtype, device=_device(arrays))


def _alibi_terms(xp, arrays, p, method):
    bias = sc.alibi_bias(
        _alibi_slopes(xp, arrays, p), p["t_q"], p["t_k"], q_offset=p["q_offset"],
        symmetric=p["symmetric"],
    )
    return {"distance": _distance(xp, arrays, p), "bias": bias}


ALIBI = SchemeSpec(
    name="alibi",
    defaults={"symmetric": True},
    label=lambda p: "sym" if p["symmetric"] else "causal-form",
    tables=lambda p: {},
    terms=_alibi_terms,
    attention=lambda a, p, m: sc.alibi_attention(
        a["q"], a["k"], a["v"], q_offset=p["q_offset"], symmetric=p["symmetric"],
        **_common(a, p),
    ),
    has_efficient=lambda p: False,
)

# -- swin -------------------------------------------------------------------


def _swin_terms(xp, arrays, p, method):
    index = sc.swin_index(p["height"], p["width"], xp=xp, device=_device(arrays))
    return {"index": index, "bias": sc.swin_bias(arrays["table"], p["height"], p["width"])}


SWIN = SchemeSpec(
    name="swin",
    defaults={"height": 2, "width": 2},
    label=lambda p: f"w{p['height']}x{p['width']}",
    tables=lambda p: {
        "table": _rows(p, (2 * p["height"] - 1) * (2 * p["width"] - 1), None)
    },
    terms=_swin_terms,
    attention=lambda a, p, m: sc.swin_attention(
        a["q"], a["k"], a["v"], a["table"], window_height=p["height"], window_width=p["width"],
        scale=p["scale"], mask=a.get("mask"), return_weights=True,
    ),
    has_efficient=lambda p: False,
    derive=lambda p: {"t_q": p["height"] * p["width"], "t_k": p["height"] * p["width"]},
)

# -- rope -------------------------------------------------------------------


def _rope_terms(xp, arrays, p, method):
    opts = {"base": p["base"], "rotary_dim": p["rotary_dim"], "layout": p["layout"]}
    return {
        "distance": _distance(xp, arrays, p),
        "q_rotated": sc.rope_rotate(arrays["q"], offset=p["q_offset"], **opts),
        "k_rotated": sc.rope_rotate(arrays["k"], offset=0, **opts),
    }


ROPE = SchemeSpec(
    name="rope",
    defaults={"base": 10000.0, "rotary_dim": None, "layout": "half"},
    label=lambda p: f"R{p['rotary_dim'] or p['d']}-{p['layout']}",
    tables=lambda p: {},
    terms=_rope_terms,
    attention=lambda a, p, m: sc.rope_attention(
        a["q"], a["k"], a["v"], base=p["base"], rotary_dim=p["rotary_dim"], layout=p["layout"],
        q_offset=p["q_offset"], **_common(a, p),
    ),
    has_efficient=lambda p: False,
)

# -- transformer_xl ---------------------------------------------------------


def _txl_biases(arrays):
    return arrays.get("content_bias"), arrays.get("position_bias")


def _txl_terms(xp, arrays, p, method):
    delta = sc.transformer_xl_distance(
        p["t_q"], p["t_k"], q_offset=p["q_offset"], clamp_len=p["clamp_len"], xp=xp,
        device=_device(arrays),
    )
    position = sc.transformer_xl_logits(
        arrays["q"], arrays["k"], arrays["w_r"], *_txl_biases(arrays), q_offset=p["q_offset"],
        clamp_len=p["clamp_len"], method=method,
    )
    return {"distance": _distance(xp, arrays, p), "delta": delta, "position": position}


def _txl_tables(p):
    out = {"w_r": _rows(p, p["d_model"], p["d"])}
    if p["biases"]:
        out["content_bias"] = _rows(p, p["d"], None)
        out["position_bias"] = _rows(p, p["d"], None)
    return out


TRANSFORMER_XL = SchemeSpec(
    name="transformer_xl",
    defaults={"d_model": 8, "clamp_len": None, "biases": True, "causal": True},
    label=lambda p: f"R{p['d_model']}" + ("" if p["clamp_len"] is None else f"-C{p['clamp_len']}"),
    tables=_txl_tables,
    terms=_txl_terms,
    attention=lambda a, p, m: sc.transformer_xl_attention(
        a["q"], a["k"], a["v"], a["w_r"], *_txl_biases(a), clamp_len=p["clamp_len"],
        q_offset=p["q_offset"], method=m, **_common(a, p),
    ),
)

# -- deberta ----------------------------------------------------------------


def _deberta_tables(p):
    out = {}
    if p["c2p"]:
        out["key_table"] = _rows(p, 2 * p["span"], p["d"])
    if p["p2c"]:
        out["query_table"] = _rows(p, 2 * p["span"], p["d"])
    return out


def _deberta_terms(xp, arrays, p, method):
    r = _distance(xp, arrays, p)
    index = sc.deberta_index(
        p["t_q"], p["t_k"], span=p["span"], max_position=p["max_position"],
        q_offset=p["q_offset"], xp=xp, device=_device(arrays),
    )
    position = sc.deberta_logits(
        arrays["q"], arrays["k"], arrays.get("key_table"), arrays.get("query_table"),
        max_position=p["max_position"], q_offset=p["q_offset"], method=method,
    )
    out = {"distance": r, "index": index, "position": position}
    if p["max_position"] is not None:
        out["bucket"] = sc.deberta_bucket(r, bucket_size=p["span"], max_position=p["max_position"])
    return out


def _deberta_scale(p):
    # DeBERTa's 1 / sqrt(d (1 + #terms)), resolved into the case's parameters
    if p["scale"] is not None:
        return {}
    return {"scale": 1.0 / math.sqrt(p["d"] * (1 + int(p["c2p"]) + int(p["p2c"])))}


DEBERTA = SchemeSpec(
    name="deberta",
    defaults={"span": 8, "max_position": None, "c2p": True, "p2c": True},
    label=lambda p: f"S{p['span']}"
    + ("" if p["max_position"] is None else f"-P{p['max_position']}"),
    tables=_deberta_tables,
    terms=_deberta_terms,
    attention=lambda a, p, m: sc.deberta_attention(
        a["q"], a["k"], a["v"], a.get("key_table"), a.get("query_table"),
        max_position=p["max_position"], q_offset=p["q_offset"], method=m, **_common(a, p),
    ),
    derive=_deberta_scale,
)

#: Every scheme the golden suite knows, by name.
SCHEMES: Mapping[str, SchemeSpec] = {
    s.name: s
    for s in (
        ABSOLUTE, SHAW, BIAS, MUSIC, GENERAL, GRID2D, T5, ALIBI, SWIN, ROPE, TRANSFORMER_XL,
        DEBERTA,
    )
}
