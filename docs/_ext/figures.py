"""Figures for the docs, drawn at build time from what relpos_ref computes.

Every figure is a row of heatmaps: distances, table indices, biases,
positional logits and attention weights, each computed by the library on a
small example. `relpos_docs` calls `write_all` when Sphinx starts.
"""

from __future__ import annotations

from pathlib import Path

import array_api_compat.numpy as xp
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import worked
from matplotlib.ticker import MaxNLocator

import relpos_ref as rp

T = 12  # sequence length of the scheme figures
D = 8  # head width of the scheme figures


def _heatmap(
    ax,
    a: np.ndarray,
    title: str,
    *,
    annotate: bool,
    cmap: str = "viridis",
    xlabel: str = "key j",
    ylabel: str = "query i",
) -> None:
    a = np.asarray(a, dtype=float) if a.dtype != bool else a.astype(float)
    im = ax.imshow(a, cmap=cmap, aspect="equal", interpolation="nearest")
    ax.set_title(title, fontsize=9)
    ax.set_xlabel(xlabel, fontsize=8)
    ax.set_ylabel(ylabel, fontsize=8)
    ax.tick_params(labelsize=7)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    if annotate:
        lo, hi = float(np.min(a)), float(np.max(a))
        mid = (lo + hi) / 2
        for (i, j), value in np.ndenumerate(a):
            text = f"{value:g}" if float(value).is_integer() else f"{value:.2f}"
            ax.text(
                j,
                i,
                text,
                ha="center",
                va="center",
                fontsize=7,
                color="white" if value < mid else "black",
            )
    else:
        plt.colorbar(im, ax=ax, fraction=0.046, pad=0.04)


def _save(fig, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _panels(path: Path, panels: list[tuple[np.ndarray, str, dict]]) -> None:
    fig, axes = plt.subplots(1, len(panels), figsize=(3.6 * len(panels), 3.4))
    for ax, (a, title, options) in zip(np.atleast_1d(axes), panels, strict=True):
        _heatmap(ax, a, title, **options)
    _save(fig, path)


def conventions_figure(path: Path) -> None:
    """Distances, clipped table rows and validity for t_q = 4, t_k = 6, q_offset = 2."""
    r = np.asarray(rp.relative_positions(4, 6, q_offset=2, xp=xp))
    idx = rp.table_index(xp.asarray(r), 2, beyond="zero")
    _panels(
        path,
        [
            (r, "distance r = j - (i + q_offset)", {"annotate": True, "cmap": "coolwarm"}),
            (np.asarray(idx.index), "table row clip(r, -2, 2) + 2", {"annotate": True}),
            (
                np.asarray(idx.valid),
                "valid (|r| <= 2): 1, else 0",
                {"annotate": True, "cmap": "Greens"},
            ),
        ],
    )


def layout_figure(name: str, path: Path) -> None:
    """The relative input and the absolute output of a worked layout example."""
    steps = worked.LAYOUTS[name]()
    first, last = steps[0], steps[-1]
    rel = {"annotate": True, "xlabel": "column (distance)"}
    _panels(
        path,
        [
            (first.array, "relative x[i, c]", rel),
            (last.array, f"{name.split('_future')[0]}: out[i, j]", {"annotate": True}),
        ],
    )


def _qkv(seed: int = 0):
    rng = np.random.default_rng(seed)
    return (
        rng.standard_normal((2, T, D)),
        rng.standard_normal((2, T, D)),
        rng.standard_normal((2, T, D)),
        rng,
    )


def scheme_panels(name: str) -> list[tuple[np.ndarray, str]]:
    """What the scheme adds, and the attention weights of head 0, on one example."""
    q, k, v, rng = _qkv()
    if name == "absolute":
        table = rng.standard_normal((T, D))
        term = rp.absolute_logits(q, table, T)
        _, w = rp.absolute_attention(q, k, v, table, return_weights=True)
        return [(term[0], "q_i . R[j]"), (w[0], "weights")]
    if name == "shaw":
        table = rng.standard_normal((9, D))
        term = rp.shaw_logits(q, table, T)
        _, w = rp.shaw_attention(q, k, v, table, rng.standard_normal((9, D)), return_weights=True)
        idx = rp.shaw_index(T, T, max_distance=4, xp=xp).index
        return [(idx, "row clip(r, -4, 4) + 4"), (term[0], "q_i . a^K[row]"), (w[0], "weights")]
    if name == "bias":
        table = np.linspace(-2.0, 2.0, 9)[None, :].repeat(2, axis=0)
        bias = rp.bias_logits(table, T, T)
        _, w = rp.bias_attention(q, k, v, table, return_weights=True)
        return [(bias[0], "b[clip(r, -4, 4)]"), (w[0], "weights")]
    if name == "music":
        table = rng.standard_normal((T, D))
        term = rp.music_logits(q, table, T)
        _, w = rp.music_attention(q, k, v, table, return_weights=True)
        return [
            (np.where(np.tril(np.ones((T, T))) > 0, term[0], np.nan), "q_i . E[r + L - 1]"),
            (w[0], "weights (causal)"),
        ]
    if name == "general":
        table = rng.standard_normal((2 * T - 1, D))
        idx = rp.general_index(T, T, t_max=T, xp=xp)
        _, w = rp.general_attention(q, k, v, table, return_weights=True)
        return [(idx, "row r + t_max - 1"), (w[0], "weights")]
    if name == "grid2d":
        rows, cols = rp.grid2d_index(3, 4, xp=xp)
        qg, kg, vg = (a[:, :12] for a in (q, k, v))
        _, w = rp.grid2d_attention(
            qg,
            kg,
            vg,
            rng.standard_normal((5, D)),
            rng.standard_normal((7, D)),
            height=3,
            width=4,
            return_weights=True,
        )
        return [(rows, "row-table row (3 x 4 grid)"), (cols, "column-table row"), (w[0], "weights")]
    if name == "t5":
        r = rp.relative_positions(T, T, xp=xp)
        bucket = rp.t5_bucket(r, num_buckets=8, max_distance=8)
        table = rng.standard_normal((2, 8))
        _, w = rp.t5_attention(q, k, v, table, max_distance=8, return_weights=True)
        return [(bucket, "bucket (8 buckets, max distance 8)"), (w[0], "weights")]
    if name == "alibi":
        slopes = np.asarray(rp.alibi_slopes(2))
        bias = rp.alibi_bias(slopes, T, T)
        _, w = rp.alibi_attention(q, k, v, return_weights=True)
        return [(bias[0], f"-m |r|, m = {slopes[0]:g}"), (w[0], "weights")]
    if name == "rope":
        rq = rp.rope_rotate(q)
        rk = rp.rope_rotate(k)
        _, w = rp.rope_attention(q, k, v, return_weights=True)
        return [(rq[0] @ rk[0].T, "rotated q_i . rotated k_j"), (w[0], "weights")]
    if name == "swin":
        idx = rp.swin_index(3, 4, xp=xp)
        table = rng.standard_normal((2, 5 * 7))
        qs, ks, vs = (a[:, :12] for a in (q, k, v))
        _, w = rp.swin_attention(
            qs, ks, vs, table, window_height=3, window_width=4, return_weights=True
        )
        return [(idx, "table row (3 x 4 window)"), (w[0], "weights")]
    if name == "transformer_xl":
        qx = q[:, 4:]
        w_r = rng.standard_normal((16, D)) / 4
        delta = rp.transformer_xl_distance(T - 4, T, xp=xp)
        _, w = rp.transformer_xl_attention(qx, k, v, w_r, return_weights=True)
        return [(delta, "δ = (i + 4) - j (memory of 4)"), (w[0], "weights (causal)")]
    if name == "deberta":
        idx = rp.deberta_index(T, T, span=4, max_position=8, xp=xp)
        kt, qt = rng.standard_normal((8, D)), rng.standard_normal((8, D))
        _, w = rp.deberta_attention(q, k, v, kt, qt, max_position=8, return_weights=True)
        return [(idx, "row (S = 4, max_position 8)"), (w[0], "weights")]
    msg = f"no figure for scheme {name!r}"
    raise ValueError(msg)


def scheme_figure(name: str, path: Path) -> None:
    panels = []
    for a, title in scheme_panels(name):
        a = np.asarray(a)
        small_ints = a.dtype.kind in "iub" and a.size <= 144
        panels.append((a, title, {"annotate": small_ints}))
    _panels(path, panels)


def write_all(out: Path) -> list[Path]:
    """Draw every figure into `out`; return the paths written."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    path = out / "conventions.png"
    conventions_figure(path)
    written.append(path)
    for name in worked.LAYOUTS:
        path = out / f"layout_{name}.png"
        layout_figure(name, path)
        written.append(path)
    for name in worked.SCHEMES:
        path = out / f"scheme_{name}.png"
        scheme_figure(name, path)
        written.append(path)
    return written
