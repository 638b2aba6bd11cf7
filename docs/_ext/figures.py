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
from relpos_ref import catalog

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


#: Each scheme's figure: a grid of T positions (a 3 x 4 grid for the 2D schemes), and the
#: sizes and options shown in the panel titles (docs content).
FIGURES = {
    "absolute": {"t_q": T, "t_k": T},
    "shaw": {"t_q": T, "t_k": T, "K": 4},
    "bias": {"t_q": T, "t_k": T, "K": 4},
    "music": {"t_q": T, "t_k": T, "M": T},
    "general": {"t_q": T, "t_k": T, "t_max": T},
    "grid2d": {"height": 3, "width": 4},
    "t5": {"t_q": T, "t_k": T, "buckets": 8, "max_distance": 8},
    "alibi": {"t_q": T, "t_k": T},
    "rope": {"t_q": T, "t_k": T},
    "swin": {"height": 3, "width": 4},
    "transformer_xl": {"t_q": T - 4, "t_k": T, "d_model": 16},
    "deberta": {"t_q": T, "t_k": T, "span": 4, "max_position": 8},
}


def scheme_panels(name: str) -> list[tuple[np.ndarray, str]]:
    """The integers each pair reads, the scheme's term and the weights of head 0.

    Everything through `relpos_ref.catalog`: the tables' shapes, the index
    tables (`indices`), the term (`terms`, or RoPE's rotated product) and the
    scheme's attention function on the example of `FIGURES`.
    """
    entry = catalog.get(name)
    call = worked.example_call(name, FIGURES[name])
    t_q, t_k, off = call["t_q"], call["t_k"], call["q_offset"]
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((2, n, D)) for n in (t_q, t_k, t_k))
    sizes = call["sizes"]
    tables = {n: rng.standard_normal(shape) / 2
              for n, shape in entry.table_shapes(sizes, d=D, d_v=D).items()}
    options = call["options"]
    shown = [f"{s.name} {sizes[s.key]}" for s in entry.sizes]
    shown += [f"{o.name} {options[o.name]}" for o in entry.options
              if o.grid and options.get(o.name) is not None and o.name not in
              {s.name for s in entry.sizes}]
    what = ", ".join(shown)
    panels = []
    found = entry.indices(xp, None, t_q=t_q, t_k=t_k, q_offset=off, sizes=sizes,
                          options=options)
    for key, value in found.items():
        if key not in ("distance", "valid") or len(found) == 1:
            panels.append((np.asarray(value), f"{key} ({what})" if what else key))
    if entry.rotate is not None:
        rq, rk = entry.rotate(q, k, q_offset=off, options=options)
        panels.append((np.asarray(rq[0] @ rk[0].T), "rotated q_i . rotated k_j"))
    _, full = entry.check_call(q, k, v, tables, options=options)
    position, bias = entry.terms(q, k, tables, q_offset=off, i0=0, j0=0, options=full,
                                 method="efficient")
    for term, title in ((position, "position term"), (bias, "bias")):
        if term is not None:
            panels.append((np.broadcast_to(np.asarray(term), (2, t_q, t_k))[0], f"{title}, head 0"))
    kwargs = {"q_offset": off} if entry.grid is None else {}
    _, w = getattr(rp, f"{name}_attention")(
        q, k, v, *entry.table_args(tables), return_weights=True,
        **{o: val for o, val in options.items() if val is not None or o == "rotary_dim"},
        **kwargs,
    )
    causal = " (causal)" if entry.defaults.causal else ""
    panels.append((np.asarray(w)[0], f"weights, head 0{causal}"))
    return panels


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
