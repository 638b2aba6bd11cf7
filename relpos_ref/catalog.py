"""Every scheme once: its tables, parameters, defaults and the functions to call.

`relpos_ref.blocked`, `relpos_ref.golden`, the command line, the docs
generator and the benchmarks read this catalog; none keeps a list of its own.
An entry records what a reader needs to call a scheme without knowing it:

- `Scheme.tables`, in the order its ``*_attention`` takes them, each with its
  shape as a function of the scheme's `Scheme.sizes`;
- `Scheme.options`, its keyword arguments besides the ones every attention
  function takes, with their meaning (the defaults are read from the
  function's signature, so they are written once);
- `Scheme.defaults`, what ``None`` means for ``scale``, ``causal`` and
  ``q_offset`` (the scheme module's ``DEFAULTS``);
- uniform adapters over the scheme's own functions (`relpos_ref._adapters`):
  ``check`` (through `Scheme.check_call`), ``terms``, ``values``, ``rotate``
  and ``indices``;
- `Scheme.show`, for a scheme whose view is more than its integers, the
  lines ``relpos-ref show <scheme>`` prints after them (RoPE's frequencies);
- `Scheme.vjp`, its backward pass (``<scheme>_attention_vjp``): the same
  arguments as ``*_attention`` plus ``d_output``, returning the gradient of
  every array argument by name.

Examples
--------
>>> from relpos_ref import catalog
>>> entry = catalog.get("shaw")
>>> [t.name for t in entry.tables], entry.option_defaults()
(['key_table', 'value_table'], {'beyond': 'clip', 'max_past': None})
>>> entry.table_shapes({"K": 4}, d=8, d_v=4)
{'key_table': (9, 8), 'value_table': (9, 4)}
>>> entry.table_shapes({"K": 4, "P": 6}, d=8, d_v=4)  # asymmetric: r = -6 .. 4
{'key_table': (11, 8), 'value_table': (11, 4)}
>>> catalog.get("t5").defaults.scale(64, ())
1.0
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from . import _adapters as ad
from . import _bias_adapters as bad
from . import _cope_adapters as cad
from . import _rope_adapters as rope_ad
from . import _xpos_adapters as xad
from ._adapters import Terms
from ._catalog_types import Option, Scheme, Size, Table
from ._lowerings import LOWERINGS
from .attention import attention as plain_attention
from .gradients import attention_vjp as plain_vjp
from .schemes import (
    absolute,
    alibi,
    bias,
    cope,
    deberta,
    fire,
    forgetting,
    general,
    grid2d,
    kerple,
    music,
    rope,
    rope_angles,
    sandwich,
    shaw,
    swin,
    swinv2,
    t5,
    transformer_xl,
    xpos,
)

__all__ = [
    "SCHEMES",
    "Option",
    "Scheme",
    "Size",
    "Table",
    "Terms",
    "get",
    "names",
    "tables_by_name",
]


_K = Size("K", "max_distance", 4,
          "the largest |r| with a row of its own (the largest future r with P)")
_P = Size("P", "max_past", None,
          "asymmetric clipping: the largest past -r with a row of its own; default K",
          minimum=0)
_BEYOND = Option("beyond", "distances beyond the table: 'clip', 'zero' or 'error'",
                 ("clip", "zero", "error"), grid=True)
_MAX_PAST = Option("max_past", "the largest past distance -r with a row (rows r = -P .. K); "
                   "None: K, a symmetric table", grid=True)


def _two_sided_rows(sizes: Mapping[str, Any]) -> int:
    """``P + K + 1``: rows for ``r = -P .. K`` (``P = K`` unless given)."""
    past = sizes.get("P")
    return sizes["K"] + (sizes["K"] if past is None else past) + 1


def _two_sided(name: str, what: str, width: str | None) -> Table:
    return Table(name, _two_sided_rows, "2K + 1, or P + K + 1", width,
                 f"{what}, row r + K, or r + P")


def _two_sided_label(p: Mapping[str, Any]) -> str:
    return f"K{p['K']}" + ("" if p.get("P") is None else f"-P{p['P']}")


def _rope_label(p: Mapping[str, Any]) -> str:
    """``R<rotary_dim>-<layout>``, then the scaling's rope_type, ``f32`` for float32 angles,
    ``tail`` for the rotated part at the tail, the axes_type and ``pos`` for positions."""
    scaling = p.get("scaling") or {}
    kind = scaling.get("rope_type", "default")
    axes = p.get("axes") or {}
    return (f"R{p['rotary_dim'] or p['d']}-{p['layout']}"
            + ("" if kind == "default" else f"-{kind}")
            + ("-f32" if p.get("angles") == "float32" else "")
            + ("-tail" if p.get("rotary_at") == "tail" else "")
            + (f"-{axes['axes_type']}" if axes else "")
            + ("-pos" if p.get("positions") is not None else ""))


_ENTRIES = (
    Scheme(
        "plain", "attention without positions",
        "softmax(s q k^T) v, the baseline every scheme adds a term to",
        None, plain_attention, ad.plain_check, ad.no_terms, ad.distance, lambda p: "plain",
        vjp=plain_vjp,
    ),
    Scheme(
        "absolute", 'absolute key embeddings ("AbsPosEmb1D")',
        "q . R[j], a learned row per key position",
        absolute, absolute.absolute_attention, ad.absolute_check, ad.absolute_terms,
        ad.absolute_indices, lambda p: f"R{p['rows'] or p['t_k']}",
        sizes=(Size("rows", "t_max", None, "key positions with a row",
                    fit=lambda t_q, t_k: t_k),),
        tables=(Table("table", lambda s: s["rows"], "t_max", "d",
                      "R, row j for key position j"),),
        benchmark=lambda t: {"rows": t},
        vjp=absolute.absolute_attention_vjp,
    ),
    Scheme(
        "shaw", "Shaw et al. (2018)",
        "q . a^K[clip(r)] added to the logits, sum_j w_ij a^V[clip(r)] to the outputs",
        shaw, shaw.shaw_attention, ad.shaw_check, ad.shaw_terms, ad.two_sided_indices,
        _two_sided_label, sizes=(_K, _P),
        tables=(_two_sided("key_table", "a^K", "d"),
                Table("value_table", _two_sided_rows, "2K + 1, or P + K + 1", "d_v",
                      "a^V, row r + K, or r + P", switch="values")),
        options=(_BEYOND, _MAX_PAST), values=ad.shaw_values, benchmark=lambda t: {"K": 16},
        vjp=shaw.shaw_attention_vjp,
    ),
    Scheme(
        "bias", "a learned scalar per distance", "b[clip(r)] per head, added after scaling",
        bias, bias.bias_attention, ad.bias_check, ad.bias_terms, ad.two_sided_indices,
        _two_sided_label, sizes=(_K, _P), tables=(_two_sided("table", "b", None),),
        options=(_BEYOND, _MAX_PAST), benchmark=lambda t: {"K": 16},
        vjp=bias.bias_attention_vjp,
    ),
    Scheme(
        "music", "Huang et al. (2018), the Music Transformer",
        "causal, q . E[r + M - 1] from a one-sided table, laid out by the skew",
        music, music.music_attention, ad.music_check, ad.music_terms, ad.music_indices,
        lambda p: f"M{p['M']}",
        sizes=(Size("M", "length", 8, "rows for r = -(M - 1) .. 0",
                    fit=lambda t_q, t_k: t_k),),
        tables=(Table("table", lambda s: s["M"], "M", "d", "E, row r + M - 1"),
                Table("value_table", lambda s: s["M"], "M", "d_v",
                      "relative values, row r + M - 1", switch="values",
                      switch_default=False)),
        options=(_BEYOND,), values=ad.music_values, benchmark=lambda t: {"M": t},
        vjp=music.music_attention_vjp,
    ),
    Scheme(
        "general", "relative attention for any attention",
        "q . E[r + t_max - 1] for self, cross, full or causal attention, t_q != t_k",
        general, general.general_attention, ad.general_check, ad.general_terms,
        ad.general_indices, lambda p: f"T{p['t_max']}",
        sizes=(Size("t_max", "t_max", 8, "the longest sequence; 2 t_max - 1 rows",
                    fit=lambda t_q, t_k: max(t_q, t_k, 1)),),
        tables=(Table("table", lambda s: 2 * s["t_max"] - 1, "2 t_max - 1", "d",
                      "E, row r + t_max - 1 (t_max - 1 - r, future to past)"),),
        options=(Option("order", "row order of the table",
                        ("past_to_future", "future_to_past"), grid=True),),
        benchmark=lambda t: {"t_max": t},
        vjp=general.general_attention_vjp,
    ),
    Scheme(
        "grid2d", "Ramachandran et al. (2019), Bottleneck Transformers",
        "row and column tables on an h x w grid of row-major tokens",
        grid2d, grid2d.grid2d_attention, ad.grid2d_check, ad.grid2d_terms,
        ad.grid2d_indices, lambda p: f"g{p['height']}x{p['width']}",
        sizes=(Size("height", "height", 2, "grid rows"),
               Size("width", "width", 2, "grid columns")),
        tables=(Table("row_table", lambda s: 2 * s["height"] - 1, "2 height - 1", "d",
                      "row distances, row dy + height - 1"),
                Table("col_table", lambda s: 2 * s["width"] - 1, "2 width - 1", "d",
                      "column distances, row dx + width - 1")),
        options=(Option("height", "grid rows"), Option("width", "grid columns")),
        grid=lambda s: s["height"] * s["width"],
        benchmark=lambda t: {"height": 32, "width": t // 32, "per_head": True},
        vjp=grid2d.grid2d_attention_vjp,
    ),
    Scheme(
        "t5", "Raffel et al. (2020), T5",
        "bucketed (exact, then log-spaced) scalar bias, bidirectional or causal, unscaled",
        t5, t5.t5_attention, ad.t5_check, ad.t5_terms, ad.t5_indices,
        lambda p: f"B{p['buckets']}-D{p['max_distance']}",
        sizes=(Size("buckets", "num_buckets", 32, "buckets in all"),),
        tables=(Table("table", lambda s: s["buckets"], "num_buckets", None,
                      "b, one entry per bucket"),),
        options=(Option("bidirectional", "False for causal (decoder) buckets", (True, False),
                        grid=True),
                 Option("max_distance", "where the log-spaced buckets end", grid=True,
                        positive=True)),
        benchmark=lambda t: {"buckets": 32},
        vjp=t5.t5_attention_vjp,
    ),
    Scheme(
        "alibi", "Press et al. (2022), ALiBi",
        "-m_h |r| (or m_h r), geometric slopes for any head count",
        alibi, alibi.alibi_attention, ad.alibi_check, ad.alibi_terms, ad.distance,
        lambda p: "sym" if p["symmetric"] else "causal-form",
        options=(Option("slopes", "one slope per head; default alibi_slopes(h)",
                        case_parameter=False),
                 Option("slope_rule", "the default slopes: the paper's, or 2^(-8 (h + 1) / h) "
                        "for any head count (attention-gym)", alibi.SLOPE_RULES),
                 Option("symmetric", "-m |r| (True) or the causal form m r", (True, False))),
        vjp=alibi.alibi_attention_vjp,
        shifted_terms=ad.alibi_shifted_terms,
    ),
    Scheme(
        "kerple", "Chi et al. (2022), KERPLE",
        "-r1_h log(1 + r2_h |r|) or -r1_h |r|^r2_h, kernels of the distance, per head",
        kerple, kerple.kerple_attention, bad.kerple_check, bad.kerple_terms, ad.distance,
        lambda p: p["kernel"],
        options=(Option("r1", "one value per head, > 0; default alibi_slopes(h)",
                        case_parameter=False),
                 Option("r2", "one value per head, > 0 (<= 2 for power); default 1",
                        case_parameter=False),
                 Option("kernel", "the kernel: log or power", kerple.KERNELS, cli=True)),
        vjp=kerple.kerple_attention_vjp, show=bad.kerple_show,
    ),
    Scheme(
        "sandwich", "Chi et al. (2023), Sandwich",
        "(sum_c cos(r w_c) - d_bar/2) / (8 (h + 1) / H), sinusoids' inner product, no parameter",
        sandwich, sandwich.sandwich_attention, bad.sandwich_check, bad.sandwich_terms,
        ad.distance, lambda p: f"D{p['d_bar']}-c{p['start']}",
        options=(Option("d_bar", "width of the sinusoids (even)", cli=True, positive=True),
                 Option("start", "index c_0 of the first frequency: 0 (attention-gym) or 1 "
                        "(NeMo)", cli=True)),
        vjp=sandwich.sandwich_attention_vjp, show=bad.sandwich_show,
    ),
    Scheme(
        "forgetting", "Lin et al. (2025), Forgetting Transformer (FoX)",
        "sum of log sigmoid(f_t) over the tokens t = j+1 .. i, gates f from the input; causal",
        forgetting, forgetting.forgetting_attention, bad.forgetting_check,
        bad.forgetting_terms, ad.distance, lambda p: "fox",
        sizes=(Size("T", "gates", None, "forget gates per head: one per key, t_k",
                    fit=lambda t_q, t_k: t_k),),
        tables=(Table("f", lambda s: s["T"], "t_k", None,
                      "f, the forget-gate logits, one per key position (from the input)"),),
        vjp=forgetting.forgetting_attention_vjp, show=bad.forgetting_show,
    ),
    Scheme(
        "fire", "Li et al. (2023), FIRE",
        "MLP_h(psi(|i - j|) / psi(max(L, i))), psi(x) = log(c x + 1): normalised by the query's "
        "position; causal", fire, fire.fire_attention, bad.fire_check, bad.fire_terms,
        ad.distance, lambda p: f"m{p['hidden']}-L{p['L']:g}",
        sizes=(Size("hidden", "hidden", 4, "the MLP's hidden width (32 in the paper's code)",
                    fit=lambda t_q, t_k: 4),),
        tables=(Table("w1", lambda s: s["hidden"], "m", 1, "W_1 of Linear(1, m)"),
                Table("b1", lambda s: s["hidden"], "m", None, "b_1 of Linear(1, m)"),
                Table("w2", lambda s: s["hidden"], "m", None, "W_2 of Linear(m, H), per head")),
        options=(Option("b2", "b_2 of Linear(m, H), per head: in the bias, in no weight",
                        case_parameter=False),
                 Option("c", "the log transform's scale (learned; 0.1)", cli=True,
                        parse=ad.parse_real),
                 Option("L", "the normaliser's threshold (learned; 512)", cli=True,
                        parse=ad.parse_real),
                 Option("eps", "added to the normaliser after its log", parse=ad.parse_real)),
        benchmark=lambda t: {"hidden": 32}, vjp=fire.fire_attention_vjp, show=bad.fire_show,
    ),
    Scheme(
        "cope", "Golovneva et al. (2024), Contextual Position Encoding (CoPE)",
        "q . e[p] interpolated at p_ij = sum_(t >= j) sigmoid(s q_i . k_t), positions counted "
        "by the gates; unscaled",
        cope, cope.cope_attention, cad.cope_check, cad.cope_terms, ad.distance,
        lambda p: f"P{p['npos']}",
        sizes=(Size("npos", "max_pos", 4, "max_pos, the integer positions with an embedding "
                    "(the paper's npos_max)", fit=lambda t_q, t_k: 4),),  # any fits: the default
        tables=(Table("table", lambda s: s["npos"], "max_pos", "d",
                      "e, row n for the integer position n = 0 .. max_pos - 1"),),
        benchmark=lambda t: {"npos": 64},
        vjp=cope.cope_attention_vjp, show=cad.cope_show,
    ),
    Scheme(
        "swin", "Liu et al. (2021), Swin Transformer",
        "a 2D relative bias table indexed by window coordinates",
        swin, swin.swin_attention, ad.swin_check, ad.swin_terms, ad.swin_indices,
        lambda p: f"w{p['height']}x{p['width']}",
        sizes=(Size("height", "window_height", 2, "window rows"),
               Size("width", "window_width", 2, "window columns")),
        tables=(Table("table", lambda s: (2 * s["height"] - 1) * (2 * s["width"] - 1),
                      "(2 Wh - 1)(2 Ww - 1)", None,
                      "b, entry (dy + Wh - 1)(2 Ww - 1) + dx + Ww - 1"),),
        options=(Option("window_height", "window rows"),
                 Option("window_width", "window columns")),
        grid=lambda s: s["height"] * s["width"],
        benchmark=lambda t: {"height": 32, "width": t // 32},
        vjp=swin.swin_attention_vjp,
    ),
    Scheme(
        "swinv2", "Liu et al. (2022), Swin Transformer v2",
        "16 sigmoid(MLP(log-spaced window offsets)) per head: Swin's table from an MLP",
        swinv2, swinv2.swinv2_attention, bad.swinv2_check, bad.swinv2_terms, ad.swin_indices,
        lambda p: f"w{p['height']}x{p['width']}-m{p['hidden']}",
        sizes=(Size("height", "window_height", 2, "window rows"),
               Size("width", "window_width", 2, "window columns"),
               Size("hidden", "hidden", 8, "the MLP's hidden width (512 in Swin v2)",
                    fit=lambda t_q, t_k: 8)),  # any width fits a grid: the default
        tables=(Table("w1", lambda s: s["hidden"], "m", 2, "W_1 of Linear(2, m)"),
                Table("b1", lambda s: s["hidden"], "m", None, "b_1 of Linear(2, m)"),
                Table("w2", lambda s: s["hidden"], "m", None,
                      "w_2 of Linear(m, h, bias=False), per head")),
        options=(Option("window_height", "window rows"),
                 Option("window_width", "window columns"),
                 Option("pretrained_window", "the window the MLP was trained at, (Ph, Pw)",
                        case_parameter=False),
                 Option("logit_scale", "cosine attention's tau (per head, or one number); "
                        "None: s q.k"),
                 Option("mask_penalty", "None: masked pairs left out; a number: added to "
                        "their logits (-100 Swin v2, -200 transformers)",
                        case_parameter=False)),
        grid=lambda s: s["height"] * s["width"],
        benchmark=lambda t: {"height": 32, "width": t // 32, "hidden": 512,
                             "shared": ("w1", "b1")},  # Swin v2's: Linear(512, h) alone per head
        vjp=swinv2.swinv2_attention_vjp, show=bad.swinv2_show, rotate=bad.swinv2_rotate,
    ),
    Scheme(
        "rope", "Su et al. (2021), RoPE",
        "rotation of q and k by their positions; interleaved and half-split pairs",
        rope, rope.rope_attention, rope_ad.rope_check, ad.no_terms, ad.distance, _rope_label,
        options=(Option("base", "frequency base", cli=True, parse=ad.parse_real),
                 Option("rotary_dim", "rotated features (even); default all", cli=True),
                 Option("layout", "which features pair", ("half", "interleaved")),
                 Option("scaling", "frequency scaling: a mapping with 'rope_type' and its "
                        "fields, as transformers' rope_parameters (JSON on the command line)",
                        cli=True, parse=rope_ad.parse_scaling),
                 Option("angles", "angles exact ('float64') or as float32 computes them",
                        rope_angles.ANGLES, cli=True),
                 Option("rotary_at", "where the rotated features sit: the front of the head "
                        "or its tail (DeepSeek MLA)", ("front", "tail")),
                 Option("axes", "multi-axis RoPE: a mapping with 'axes_type' ('mrope', "
                        "'axial', 'mixed') and its fields (JSON on the command line)",
                        cli=True, parse=rope_ad.parse_axes),
                 Option("positions", "each token's integer position per axis, "
                        "(n_axes, ..., L); None: the token index on every axis")),
        rotate=rope_ad.rope_rotate, show=rope_ad.rope_show,
        vjp=rope.rope_attention_vjp,
    ),
    Scheme(
        "xpos", "Sun et al. (2022), xPos",
        "RoPE with a decay zeta_c^((n - m)/gamma) per pair: q scaled up, k down, about a centre",
        xpos, xpos.xpos_attention, xad.xpos_check, ad.no_terms, ad.distance,
        lambda p: (f"X{p['rotary_dim'] or p['d']}-{p['layout']}-g{p['scale_base']:g}"
                   f"-c{p['center']}"),
        options=(Option("base", "frequency base", cli=True, parse=ad.parse_real),
                 Option("rotary_dim", "rotated features (even); default all", cli=True),
                 Option("layout", "which features pair (the peers: interleaved)",
                        ("interleaved", "half")),
                 Option("scale_base", "gamma, the decay's length scale", cli=True,
                        parse=ad.parse_real),
                 Option("scale_offset", "gamma_zeta of zeta_c = (2c/R + gamma_zeta) / "
                        "(1 + gamma_zeta)", cli=True, parse=ad.parse_real),
                 Option("center", "the centre o of the scales: 'middle' (L // 2, "
                        "x-transformers), 'middle_up' (ceil(L / 2), torchscale) or an integer",
                        cli=True, parse=xad.parse_center)),
        rotate=xad.xpos_rotate, show=xad.xpos_show,
        vjp=xpos.xpos_attention_vjp,
    ),
    Scheme(
        "transformer_xl", "Dai et al. (2019), Transformer-XL",
        "q.k + q.W_R R_r + u.k + v.W_R R_r with sinusoids R, queries after a memory",
        transformer_xl, transformer_xl.transformer_xl_attention, ad.txl_check,
        ad.txl_terms, ad.txl_indices,
        lambda p: f"R{p['d_model']}" + ("" if p["clamp_len"] is None else f"-C{p['clamp_len']}"),
        sizes=(Size("d_model", "d_model", 8, "width of the sinusoids (even)"),),
        tables=(Table("w_r", lambda s: s["d_model"], "d_model", "d",
                      "W_R, the sinusoids' projection"),
                Table("content_bias", lambda s: s["d"], "d", None, "u (r_w_bias)",
                      switch="biases"),
                Table("position_bias", lambda s: s["d"], "d", None, "v (r_r_bias)",
                      switch="biases")),
        options=(Option("clamp_len", "largest |r| with a sinusoid of its own", grid=True),
                 Option("base", "frequency base of the sinusoids")),
        benchmark=lambda t: {"d_model": 64, "per_head": True},
        vjp=transformer_xl.transformer_xl_attention_vjp,
    ),
    Scheme(
        "deberta", "He et al. (2021), DeBERTa",
        "content-to-position and position-to-content terms with log buckets",
        deberta, deberta.deberta_attention, ad.deberta_check, ad.deberta_terms,
        ad.deberta_indices,
        lambda p: f"S{p['span']}" + ("" if p["max_position"] is None
                                     else f"-P{p['max_position']}"),
        sizes=(Size("span", "span", 8, "S, the attention span; 2S rows"),),
        tables=(Table("key_table", lambda s: 2 * s["span"], "2S", "d", "K^r (c2p)",
                      switch="c2p"),
                Table("query_table", lambda s: 2 * s["span"], "2S", "d", "Q^r (p2c)",
                      switch="p2c")),
        options=(Option("max_position", "log buckets up to this distance; None: exact",
                        grid=True, positive=True),),
        benchmark=lambda t: {"span": t // 4, "max_position": t // 2, "per_head": True},
        vjp=deberta.deberta_attention_vjp,
    ),
)

#: Every scheme by name, in catalog order; ``"plain"`` is attention without positions.
#: Each lowers to the distance form by its function in `relpos_ref._lowerings`.
SCHEMES: Mapping[str, Scheme] = {
    s.name: dataclasses.replace(s, lower=LOWERINGS[s.name]) for s in _ENTRIES
}


def names(*, plain: bool = False) -> list[str]:
    """The names of the schemes in catalog order, plain attention first when asked.

    Examples
    --------
    >>> names()[:4]
    ['absolute', 'shaw', 'bias', 'music']
    """
    return [n for n in SCHEMES if plain or n != "plain"]


def get(name: str) -> Scheme:
    """The entry called `name`; a `ValueError` listing the names otherwise.

    Examples
    --------
    >>> get("music").defaults.causal
    True
    """
    try:
        return SCHEMES[name]
    except (KeyError, TypeError):
        listed = ", ".join(repr(n) for n in SCHEMES)
        msg = f"`scheme` must be one of {listed}, got {name!r}"
        raise ValueError(msg) from None


def tables_by_name(entry: Scheme, tables: Sequence[Any]) -> dict[str, Any]:
    """A call's positional tables by name; a `TypeError` for too many or a missing one.

    Examples
    --------
    >>> import numpy as np
    >>> sorted(tables_by_name(get("shaw"), [np.zeros((3, 2))]))
    ['key_table']
    """
    if len(tables) > len(entry.tables):
        listed = ", ".join(t.name for t in entry.tables) or "none"
        msg = (f"scheme {entry.name!r} takes at most {len(entry.tables)} table(s) ({listed}), "
               f"got {len(tables)}")
        raise TypeError(msg)
    named = {t.name: a for t, a in zip(entry.tables, tables, strict=False) if a is not None}
    for t in entry.tables:
        if t.required and t.name not in named:
            msg = f"scheme {entry.name!r} needs `{t.name}`"
            raise TypeError(msg)
    return named
