"""Worked examples for the docs, computed step by step from relpos_ref itself.

Each ``worked_*`` function replays one computation on a small example with
plain NumPy steps and returns the list of intermediate arrays, captioned. The
last step is checked against the library function (and the definition,
`gather`) before it is returned, so a page can never show a table the code
does not compute. `tests/test_docs.py` runs every one of them; the Sphinx
extension `relpos_docs` renders them to Markdown tables at build time.
"""

from __future__ import annotations

from dataclasses import dataclass

import array_api_compat.numpy as xp
import numpy as np

import relpos_ref as rp
from relpos_ref import catalog
from relpos_ref.presets import PRESETS


@dataclass(frozen=True)
class Step:
    """One captioned intermediate: a 1-D or 2-D integer or float array.

    `masked` marks a step that applies the causal mask to the step before it
    (the figures show both, and say which is which).
    """

    caption: str
    array: np.ndarray
    rows: tuple[str, ...] | None = None
    cols: tuple[str, ...] | None = None
    masked: bool = False


def _check(got: np.ndarray, want: np.ndarray, what: str) -> None:
    if got.shape != want.shape or not np.array_equal(got, want):
        msg = f"worked example {what}: the steps give\n{got}\nbut the library gives\n{want}"
        raise AssertionError(msg)


def _labels(prefix: str, values) -> tuple[str, ...]:
    return tuple(f"{prefix}{v}" for v in values)


def _cells(value) -> str:
    if isinstance(value, (bool, np.bool_)):
        return "✓" if value else "·"
    if isinstance(value, (float, np.floating)):
        return f"{value:.3g}"
    return str(value)


def markdown(steps: list[Step]) -> str:
    """Render steps as MyST Markdown: a caption, then a table or a code line."""
    parts = []
    for number, step in enumerate(steps, 1):
        parts.append(f"**Step {number}.** {step.caption}\n")
        a = np.asarray(step.array)
        if a.ndim == 1:
            parts.append("```text\n" + " ".join(_cells(v) for v in a.tolist()) + "\n```\n")
            continue
        rows = step.rows or _labels("i=", range(a.shape[0]))
        cols = step.cols or _labels("j=", range(a.shape[1]))
        parts.append("| | " + " | ".join(cols) + " |")
        parts.append("|---|" + "---|" * len(cols))
        for label, row in zip(rows, a.tolist(), strict=True):
            parts.append(f"| **{label}** | " + " | ".join(_cells(v) for v in row) + " |")
        parts.append("")
    return "\n".join(parts)


def relative_values(t_q: int, n_rel: int) -> np.ndarray:
    """``x[i, c] = 10 (i + 1) + c``: each entry names its row and column."""
    return 10 * (np.arange(t_q)[:, None] + 1) + np.arange(n_rel)[None, :]


# -- conventions -------------------------------------------------------------


def worked_distances(t_q: int = 4, t_k: int = 6, q_offset: int = 2) -> list[Step]:
    """Positions, then the key-minus-query distance matrix."""
    pos_q = np.arange(t_q) + q_offset
    pos_k = np.arange(t_k)
    r = pos_k[None, :] - pos_q[:, None]
    _check(r, np.asarray(rp.relative_positions(t_q, t_k, q_offset=q_offset, xp=xp)), "distances")
    rows = tuple(f"i={i} (pos {p})" for i, p in enumerate(pos_q.tolist()))
    return [
        Step(f"query positions `pos_q(i) = i + q_offset` with `q_offset = {q_offset}`", pos_q),
        Step("key positions `pos_k(j) = j`", pos_k),
        Step("distances `r = pos_k(j) - pos_q(i)` (negative: the key is in the past)", r, rows),
    ]


def worked_table_index(
    t_q: int = 4, t_k: int = 6, q_offset: int = 2, max_distance: int = 2
) -> list[Step]:
    """A two-sided table of ``2K + 1`` rows under the three ``beyond`` policies."""
    K = max_distance
    r = rp.relative_positions(t_q, t_k, q_offset=q_offset, xp=xp)
    rows_r = np.arange(-K, K + 1)
    clipped = np.clip(np.asarray(r), -K, K) + K
    inside = np.abs(np.asarray(r)) <= K
    got = rp.table_index(r, K, beyond="clip")
    _check(clipped, np.asarray(got.index), "table_index clip")
    _check(inside, np.asarray(rp.table_index(r, K, beyond="zero").valid), "table_index zero")
    return [
        Step(f"the table's rows: row `r + K` holds distance `r`, `K = {K}`", rows_r),
        Step("`beyond='clip'` (Shaw): row `clip(r, -K, K) + K`", clipped),
        Step(
            "`beyond='zero'`: the same rows, used only where `valid` (✓); "
            "elsewhere the term is 0. `beyond='error'` refuses these lengths.",
            inside,
        ),
    ]


# -- layouts -----------------------------------------------------------------


def worked_gather(t_q: int = 3, t_k: int = 4, offset: int = 2, q_offset: int = 0) -> list[Step]:
    """The definition: read column ``r + offset`` of row ``i``."""
    n_rel = 2 * offset + 1
    x = relative_values(t_q, n_rel)
    r = np.arange(t_k)[None, :] - (np.arange(t_q)[:, None] + q_offset)
    column = r + offset
    valid = (column >= 0) & (column < n_rel)
    out = np.where(valid, np.take_along_axis(x, np.clip(column, 0, n_rel - 1), axis=1), 0)
    _check(
        out, np.asarray(rp.gather(xp.asarray(x), t_k, offset=offset, q_offset=q_offset)), "gather"
    )
    return [
        Step(
            f"relative logits `x`, column `c` for distance `r = c - {offset}`",
            x,
            cols=_labels("r=", range(-offset, offset + 1)),
        ),
        Step("distances `r = j - (i + q_offset)`", r),
        Step("the column each entry reads, `r + offset` (outside `[0, n_rel)`: none)", column),
        Step("`out[i, j] = x[i, r + offset]`, zero where there is no column", out),
    ]


def worked_pad_flatten_reshape(t_q: int = 3, t_k: int = 3, offset: int = 2) -> list[Step]:
    """The zero column, the flatten, the pad, the reshape and the slice."""
    n_rel = 2 * offset + 1
    x = relative_values(t_q, n_rel)
    with_zero = np.concatenate([x, np.zeros((t_q, 1), dtype=x.dtype)], axis=1)
    flat = with_zero.reshape(-1)
    padded = np.concatenate([flat, np.zeros(n_rel - t_q, dtype=x.dtype)])
    shifted = padded.reshape(t_q + 1, n_rel)
    start = offset  # offset - q_offset with q_offset = 0
    out = shifted[:t_q, start : start + t_k]
    lib = np.asarray(rp.pad_flatten_reshape(xp.asarray(x), t_k, offset=offset))
    _check(out, lib, "pad_flatten_reshape")
    _check(out, np.asarray(rp.gather(xp.asarray(x), t_k, offset=offset)), "pad_flatten_reshape")
    rel_cols = _labels("r=", range(-offset, offset + 1))
    return [
        Step(
            f"relative logits `x` `({t_q}, {n_rel})`, column `c` for `r = c - {offset}`",
            x,
            cols=rel_cols,
        ),
        Step(f"append a zero column: `({t_q}, {n_rel + 1})`", with_zero, cols=(*rel_cols, "pad")),
        Step(f"flatten: `({t_q * (n_rel + 1)},)`", flat),
        Step(
            f"pad `n_rel - t_q = {n_rel - t_q}` zeros at the end: "
            f"`({(t_q + 1) * n_rel},) = (t_q + 1) n_rel`",
            padded,
        ),
        Step(
            f"reshape to `({t_q + 1}, {n_rel})`: row `i` is row `i` of `x` shifted right by "
            f"`i` columns",
            shifted,
            rows=_labels("row ", range(t_q + 1)),
            cols=_labels("col ", range(n_rel)),
        ),
        Step(
            f"keep rows `:{t_q}` and columns `s : s + t_k` with `s = offset - q_offset = "
            f"{start}`: equal to `gather`",
            out,
        ),
    ]


def worked_skew(length: int = 4) -> list[Step]:
    """Huang et al.'s skew: pad left, reshape, drop the first row."""
    L = length
    x = relative_values(L, L)
    padded = np.concatenate([np.zeros((L, 1), dtype=x.dtype), x], axis=1)
    reshaped = padded.reshape(L + 1, L)
    out = reshaped[1:]
    _check(out, np.asarray(rp.skew(xp.asarray(x))), "skew")
    causal = np.tril(np.ones((L, L), dtype=bool))
    want = np.asarray(rp.gather(xp.asarray(x), L, offset=L - 1))
    _check(np.where(causal, out, 0), np.where(causal, want, 0), "skew vs gather")
    return [
        Step(
            f"`x = Q E^T` `({L}, {L})` for a one-sided table, column `c` for `r = c - {L - 1}`",
            x,
            cols=_labels("r=", range(-(L - 1), 1)),
        ),
        Step(
            f"pad a zero column on the left: `({L}, {L + 1})`",
            padded,
            cols=("pad", *_labels("r=", range(-(L - 1), 1))),
        ),
        Step(f"reshape to `({L + 1}, {L})`", reshaped, rows=_labels("row ", range(L + 1))),
        Step(
            "drop the first row: equal to `gather` on `j <= i`; above the diagonal, "
            "the pad and values of the next row, which the causal mask removes",
            out,
        ),
        Step("after the causal mask", np.where(causal, out, 0), masked=True),
    ]


def worked_stacked_diagonals(
    t_q: int = 3, t_k: int = 4, q_offset: int = 1, t_max: int = 4, order: str = "past_to_future"
) -> list[Step]:
    """Slice the columns that occur, flip them for future-to-past, then lay them out."""
    n_rel = 2 * t_max - 1
    x = relative_values(t_q, n_rel)
    r_min, r_max = -(t_q - 1 + q_offset), t_k - 1 - q_offset
    if order == "past_to_future":
        window = x[:, r_min + t_max - 1 : r_max + t_max]
        table_r = range(-(t_max - 1), t_max)
    else:
        window = np.flip(x[:, t_max - 1 - r_max : t_max - r_min], axis=1)
        table_r = range(t_max - 1, -t_max, -1)
    lib = np.asarray(rp.stacked_diagonals(xp.asarray(x), t_k, q_offset=q_offset, order=order))
    out = np.asarray(
        rp.pad_flatten_reshape(xp.asarray(window), t_k, offset=-r_min, q_offset=q_offset)
    )
    _check(out, lib, "stacked_diagonals")
    # The definition reads a past-to-future table: flip a future-to-past one.
    canonical = x if order == "past_to_future" else np.flip(x, axis=1)
    want = np.asarray(rp.gather(xp.asarray(canonical), t_k, offset=t_max - 1, q_offset=q_offset))
    _check(out, want, "stacked_diagonals vs gather")
    verb = "slice" if order == "past_to_future" else "slice and flip"
    return [
        Step(
            f"`x = Q E^T` `({t_q}, {n_rel})` for `t_max = {t_max}`, rows of the table "
            f"{order.replace('_', ' ')}",
            x,
            cols=_labels("r=", table_r),
        ),
        Step(
            f"{verb} the `t_q + t_k - 1 = {t_q + t_k - 1}` columns that occur, "
            f"`r = {r_min} .. {r_max}`, past to future",
            window,
            cols=_labels("r=", range(r_min, r_max + 1)),
        ),
        Step(
            f"lay them out with `pad_flatten_reshape(window, t_k, offset={-r_min}, "
            f"q_offset={q_offset})`: every diagonal `j - i` is one column",
            out,
        ),
    ]


def worked_rel_shift(t_q: int = 3, t_k: int = 5) -> list[Step]:
    """Transformer-XL's rel_shift: pad left, view as (t_k + 1, t_q), drop a row, view back."""
    x = relative_values(t_q, t_k)
    padded = np.concatenate([np.zeros((t_q, 1), dtype=x.dtype), x], axis=1)
    viewed = padded.reshape(t_k + 1, t_q)
    dropped = viewed[1:]
    out = dropped.reshape(t_q, t_k)
    _check(out, np.asarray(rp.rel_shift(xp.asarray(x))), "rel_shift")
    q_offset = t_k - t_q
    allowed = np.arange(t_k)[None, :] <= np.arange(t_q)[:, None] + q_offset
    want = np.asarray(rp.gather(xp.asarray(x), t_k, offset=t_k - 1, q_offset=q_offset))
    _check(np.where(allowed, out, 0), np.where(allowed, want, 0), "rel_shift vs gather")
    return [
        Step(
            f"`x` `({t_q}, {t_k})`, column `c` for `r = c - {t_k - 1}`; the queries are the "
            f"last {t_q} of {t_k} positions (a memory of {q_offset})",
            x,
            cols=_labels("r=", range(-(t_k - 1), 1)),
        ),
        Step(
            f"pad a zero column on the left: `({t_q}, {t_k + 1})`",
            padded,
            cols=("pad", *_labels("r=", range(-(t_k - 1), 1))),
        ),
        Step(
            f"view as `({t_k + 1}, {t_q})`",
            viewed,
            rows=_labels("row ", range(t_k + 1)),
            cols=_labels("col ", range(t_q)),
        ),
        Step(
            f"drop the first row: `({t_k}, {t_q})`",
            dropped,
            rows=_labels("row ", range(t_k)),
            cols=_labels("col ", range(t_q)),
        ),
        Step(f"view as `({t_q}, {t_k})`: equal to `gather` on `j <= i + {q_offset}`", out),
        Step("after Transformer-XL's causal mask", np.where(allowed, out, 0), masked=True),
    ]


# -- schemes -----------------------------------------------------------------

#: The example each scheme's page shows (docs content, not scheme knowledge): the grid,
#: and the sizes and options that differ from the catalog's defaults.
EXAMPLES = {
    "absolute": {"t_q": 3, "t_k": 5},
    "shaw": {"t_q": 4, "t_k": 6, "q_offset": 2, "K": 2, "beyond": "zero"},
    "bias": {"t_q": 4, "t_k": 6, "q_offset": 2, "K": 2, "beyond": "zero"},
    "music": {"t_q": 5, "t_k": 5, "M": 3, "beyond": "zero"},
    "general": {"t_q": 3, "t_k": 4, "q_offset": 1, "t_max": 4},
    "grid2d": {"height": 2, "width": 3},
    "t5": {"t_q": 4, "t_k": 8, "q_offset": 2, "buckets": 8, "max_distance": 16},
    "alibi": {"t_q": 4, "t_k": 4},
    "kerple": {"t_q": 4, "t_k": 4},
    "sandwich": {"t_q": 4, "t_k": 4, "d_bar": 16},
    "forgetting": {"t_q": 4, "t_k": 4},
    "fire": {"t_q": 4, "t_k": 6, "q_offset": 2, "c": 1.0, "L": 3.0},
    "cope": {"t_q": 4, "t_k": 4, "npos": 3},
    "rope": {"t_q": 4, "t_k": 4},
    "xpos": {"t_q": 4, "t_k": 4, "scale_base": 8.0},
    "swin": {"height": 2, "width": 2},
    "swinv2": {"height": 2, "width": 2},
    "transformer_xl": {"t_q": 3, "t_k": 5, "clamp_len": 2},
    "deberta": {"t_q": 4, "t_k": 4, "span": 2},
}

#: What each integer intermediate of `relpos_ref.catalog.Scheme.indices` is.
MEANINGS = {
    "distance": "distance `r = j - (i + q_offset)`",
    "index": "table row of each pair",
    "valid": "`valid` (✓: the distance has a row of its own)",
    "index_rows": "row of the row table, `Δy + height - 1` with `Δy = y_k - y_q`",
    "index_cols": "row of the column table, `Δx + width - 1` with `Δx = x_k - x_q`",
    "delta": "query-minus-key distance `δ = -r` whose sinusoid is used, clamped",
    "bucket": "log bucket of `r`",
}


def example_call(name: str, example: dict | None = None) -> dict:
    """An example's grid, sizes and options (default `EXAMPLES`), completed from the catalog."""
    entry = catalog.get(name)
    p = {"t_q": 1, "t_k": 1, **(EXAMPLES[name] if example is None else example)}
    sizes = {s.key: p.get(s.key, s.default) for s in entry.sizes}
    if entry.grid is not None:
        p["t_q"] = p["t_k"] = entry.grid(sizes)
    sizes = entry.sizes_from({**p, **sizes})
    options = {**entry.option_defaults(), **entry.options_from({**p, **sizes})}
    options.pop("slopes", None)
    q_offset = entry.defaults.resolve_q_offset(p.get("q_offset"), p["t_q"], p["t_k"])
    return {"t_q": p["t_q"], "t_k": p["t_k"], "q_offset": q_offset, "sizes": sizes,
            "options": options}


def _described(call: dict) -> str:
    named = {s.name: call["sizes"][s.key] for s in catalog.get(call["name"]).sizes}
    given = {**named, **{k: v for k, v in call["options"].items() if v is not None}}
    words = [f"t_q={call['t_q']}", f"t_k={call['t_k']}", f"q_offset={call['q_offset']}"]
    words += [f"{k}={v!r}" for k, v in given.items()]
    return ", ".join(words)


def worked_scheme(name: str) -> list[Step]:
    """The integers a scheme reads for each pair on its example, then any extra steps.

    The tables come from the catalog's `indices` adapter (the scheme's own
    index functions); the extras show what an index table cannot (T5's and
    DeBERTa's buckets by distance, ALiBi's slopes, RoPE's angles).
    """
    entry = catalog.get(name)
    call = {"name": name, **example_call(name)}
    found = entry.indices(xp, None, t_q=call["t_q"], t_k=call["t_k"],
                          q_offset=call["q_offset"], sizes=call["sizes"],
                          options={k: v for k, v in call["options"].items()})
    shown = {k: v for k, v in found.items() if k != "distance" or len(found) == 1}
    steps = [Step(f"{MEANINGS[key]} ({_described(call)})", np.asarray(value))
             for key, value in shown.items()]
    return steps + EXTRAS.get(name, lambda: [])()


def _bias_extra() -> list[Step]:
    table = xp.asarray([[-2.0, -1.0, 0.0, 1.0, 2.0]])
    return [Step("`bias_logits([[-2, -1, 0, 1, 2]], 4, 6, q_offset=2)`: `b[clip(r)]`",
                 np.asarray(rp.bias_logits(table, 4, 6, q_offset=2))[0])]


def _t5_extra() -> list[Step]:
    r = np.arange(-20, 21, 4)
    bi = rp.t5_bucket(xp.asarray(r), num_buckets=8, max_distance=16)
    uni = rp.t5_bucket(xp.asarray(r), num_buckets=8, max_distance=16, bidirectional=False)
    return [Step("`t5_bucket(r, num_buckets=8, max_distance=16)`, bidirectional and causal",
                 np.stack([r, np.asarray(bi), np.asarray(uni)]),
                 rows=("r", "bidirectional", "causal"), cols=_labels("", range(11)))]


def _alibi_extra() -> list[Step]:
    slopes = np.asarray(rp.alibi_slopes(8))
    bias = np.asarray(rp.alibi_bias(xp.asarray(slopes[:1]), 4, 4))[0]
    return [Step("`alibi_slopes(8)`: `m_h = 2^(-8 h / n)`, `h = 1 .. n`", slopes),
            Step("`alibi_bias(slopes[:1], 4, 4)`: `-m |r|` for head 0", bias)]


def _kerple_extra() -> list[Step]:
    a = np.arange(6.0)
    r1, r2 = np.asarray(rp.alibi_slopes(2)), np.ones(2)
    log = np.asarray(rp.kerple_kernel(xp.asarray(a), xp.asarray(r1), xp.asarray(r2)))
    power = np.asarray(rp.kerple_kernel(xp.asarray(a), xp.asarray(r1), xp.asarray(r2),
                                        kernel="power"))
    return [Step("`kerple_kernel(|r|, r1, r2)` at NeMo's initialization for 2 heads "
                 "(`r1 = alibi_slopes(2)`, `r2 = 1`): log, then power (ALiBi)",
                 np.concatenate([log, power]), rows=("log h=0", "log h=1", "power h=0",
                                                     "power h=1"),
                 cols=_labels("|r|=", range(6)))]


def _sandwich_extra() -> list[Step]:
    r = np.arange(6.0)
    sums = np.asarray(rp.sandwich_kernel(xp.asarray(r), d_bar=16))
    ratios = np.asarray(rp.sandwich_ratios(4))
    return [Step("`sandwich_kernel(r, d_bar=16)`: `sum_c cos(r w_c) - 8`", sums[None],
                 rows=("sum",), cols=_labels("r=", range(6))),
            Step("`sandwich_ratios(4)`: `8 (h + 1) / 4`, the divisor of each head", ratios)]


def _forgetting_extra() -> list[Step]:
    f = np.asarray([0.0, 0.0, np.log(3.0), 2.0])  # gates 1/2, 1/2, 3/4, sigma(2)
    bias = np.asarray(rp.forgetting_bias(xp.asarray(f), 4))
    return [Step("`forgetting_bias(f, 4)` for `f = [0, 0, log 3, 2]` (gates 1/2, 1/2, 3/4, "
                 "0.881): `log` of the product of the gates after the key", bias),
            Step("its `exp`: the product of the gates `j+1 .. i` (1 above the diagonal: "
                 "never read)", np.exp(bias))]


def _fire_extra() -> list[Step]:
    x = np.asarray(rp.fire_inputs(6, 6, c=1.0, L=3.0, eps=0.0, xp=xp))
    return [Step("`fire_inputs(6, 6, c=1, L=3, eps=0)`: `log(1 + |i - j|) / log(1 + max(3, i))`; "
                 "rows 0 .. 3 share the normaliser `log 4`, later rows their own", x),
            Step("the input of the first key: 1 from the query at `L` on",
                 x[:, :1].T, rows=("j=0",), cols=_labels("i=", range(6)))]


def _cope_extra() -> list[Step]:
    q = k = xp.zeros((4, 2))  # every logit 0: every gate sigma(0) = 1/2
    gates, _ = rp.cope_gates(q, k, scale=1.0)
    table = xp.asarray([[0.0, 0.0], [1.0, 0.0], [3.0, 0.0]])  # q . e = 0, 1, 3 for q = (1, 0)
    term = rp.cope_term(q + xp.asarray([1.0, 0.0]), k, table, scale=0.0)
    return [Step("`cope_gates(q, k, scale=1.0)` for `q = k = 0`: `sigma(0) = 1/2` on the causal "
                 "pairs", np.asarray(gates)),
            Step("`cope_positions(gates)`: `p_ij = sum_(t >= j) g_it`, a reverse cumulative "
                 "sum", np.asarray(rp.cope_positions(gates))),
            Step("`cope_term` for `q = (1, 0)` (gates 1/2 at scale 0) and `q . e = 0, 1, 3`: "
                 "interpolated between the integer positions (up to `max_pos - 1 = 2`)",
                 np.asarray(term))]


def _rope_extra() -> list[Step]:
    theta = np.asarray(rp.rope_frequencies(8))
    angles = np.arange(4)[:, None] * theta[None, :]
    return [Step("`rope_frequencies(8)`: `θ_c = base^(-2c/8)`", theta),
            Step("rotation angles `m θ_c` for positions `m = 0 .. 3`", angles,
                 rows=_labels("m=", range(4)), cols=_labels("c=", range(4)))]


def _xpos_extra() -> list[Step]:
    zeta = np.asarray(rp.xpos_zeta(8))
    steps = np.arange(4) - 2  # positions 0 .. 3 about the centre L // 2 = 2
    scales = zeta[None, :] ** (steps[:, None] / 8.0)
    return [Step("`xpos_zeta(8)`: `ζ_c = (2c/8 + 0.4) / 1.4`", zeta),
            Step("query scales `ζ_c^((n - 2)/8)` at `n = 0 .. 3` (centre `4 // 2 = 2`, "
                 "`scale_base=8`); a key's are their inverses", scales,
                 rows=_labels("n=", range(4)), cols=_labels("c=", range(4)))]


def _deberta_extra() -> list[Step]:
    r = np.arange(-12, 13, 3)
    b = rp.deberta_bucket(xp.asarray(r), bucket_size=4, max_position=16)
    return [Step("`deberta_bucket(r, bucket_size=4, max_position=16)`: exact for "
                 "`|r| <= S // 2 = 2`, log-spaced beyond",
                 np.stack([r, np.asarray(b)]), rows=("r", "bucket"),
                 cols=_labels("", range(len(r))))]


def _swinv2_extra() -> list[Step]:
    coords = np.asarray(rp.swinv2_coordinates(2, 3, xp=xp))
    pre = np.asarray(rp.swinv2_coordinates(2, 3, pretrained_window=(3, 5), xp=xp))
    rows = ("window (2, 3)", "pretrained_window=(3, 5)")
    return [Step("`swinv2_coordinates(2, 3)`, rows: `c(Δy) = sign(u) log2(1 + |u|) / 3` with "
                 "`u = 8 Δy / (W_h - 1)`, or `(P_h - 1)` when pretrained",
                 np.stack([coords[::5, 0], pre[::5, 0]]), rows=rows,
                 cols=_labels("Δy=", range(-1, 2))),
            Step("columns: `c(Δx)`, `u = 8 Δx / (W_w - 1)` or `(P_w - 1)`",
                 np.stack([coords[:5, 1], pre[:5, 1]]), rows=rows,
                 cols=_labels("Δx=", range(-2, 3)))]


#: Steps a page shows besides its index tables.
EXTRAS = {"bias": _bias_extra, "t5": _t5_extra, "alibi": _alibi_extra, "rope": _rope_extra,
          "xpos": _xpos_extra,
          "deberta": _deberta_extra, "kerple": _kerple_extra, "sandwich": _sandwich_extra,
          "forgetting": _forgetting_extra, "fire": _fire_extra, "swinv2": _swinv2_extra,
          "cope": _cope_extra}


def preset_rows(scheme: str) -> str:
    """The presets of one scheme, as a Markdown list generated from `PRESETS`."""
    lines = []
    for name, preset in sorted(PRESETS.items()):
        if preset.scheme == scheme:
            lines.append(f"- **`{name}`** ({preset.implementation}): {preset.notes}")
    return "\n".join(lines) if lines else "No preset maps onto this scheme yet."


LAYOUTS = {
    "gather": worked_gather,
    "pad_flatten_reshape": worked_pad_flatten_reshape,
    "skew": worked_skew,
    "stacked_diagonals": worked_stacked_diagonals,
    "stacked_diagonals_future_to_past": lambda: worked_stacked_diagonals(order="future_to_past"),
    "rel_shift": worked_rel_shift,
}

#: The schemes with a page: every scheme of the catalog.
SCHEMES = tuple(catalog.names())
