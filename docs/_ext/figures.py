"""Figures for the docs, drawn at build time from what relpos_ref computes.

Every figure is a grid of heatmaps: distances, table indices, biases,
positional logits and attention weights, each computed by the library on a
small example. `relpos_docs` calls `write_all` when Sphinx starts.

Legibility is designed, not left to the browser: the theme shrinks an image
to the width of the content column, so every figure is drawn exactly as wide,
in points, as the narrowest column is in CSS pixels (`COLUMN_PX`). One point
of font is then one CSS pixel there, and more on any wider layout; no text is
smaller than `TEXT_PT`. The PNG records its smallest font (`MIN_FONT_KEY`), so
a test can compute the size of the text as displayed from the built site.
"""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

import array_api_compat.numpy as xp
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import worked
from matplotlib.text import Text
from matplotlib.ticker import MaxNLocator

import relpos_ref as rp
from relpos_ref import catalog

T = 8  # sequence length of the scheme figures
D = 8  # head width of the scheme figures

#: The widest a figure is shown in pydata-sphinx-theme's narrowest layout with both
#: sidebars, in CSS px: a 1200 px window with a 15 px scroll bar, less the 25% primary
#: sidebar, the 17rem page outline, the article's 1rem + 1rem + 2rem padding and the
#: figure's 0.5em + 0.5em (tests/test_docs_site.py derives it from the built CSS).
COLUMN_PX = 536
WIDTH_IN = COLUMN_PX / 72  # so that 1 pt of text is 1 CSS px in that column
DPI = 144  # two image pixels per CSS pixel there: sharp on high-density screens
TEXT_PT = 11  # ticks, axis labels, cell values and colour bars: the page's smallest text
TITLE_PT = 12
MIN_FONT_KEY = "relpos_docs:min_font_pt"  # PNG text chunk: the smallest font in points
MIN_CELL_KEY = "relpos_docs:min_cell_pt"  # and the narrowest cell that holds a number


def _heatmap(
    fig,
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
    width_pt = ax.get_position().width * WIDTH_IN * 72
    ax.set_title(textwrap.fill(title, max(12, int(width_pt / (0.55 * TITLE_PT)))),
                 fontsize=TITLE_PT)
    ax.set_xlabel(xlabel, fontsize=TEXT_PT)
    ax.set_ylabel(ylabel, fontsize=TEXT_PT)
    ax.tick_params(labelsize=TEXT_PT)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    if annotate:
        ax.set_gid("annotated")
        for (i, j), value in np.ndenumerate(a):
            red, green, blue, _ = im.cmap(im.norm(value))
            light = 0.299 * red + 0.587 * green + 0.114 * blue > 0.5
            text = f"{value:g}" if float(value).is_integer() else f"{value:.2f}"
            ax.text(
                j,
                i,
                text,
                ha="center",
                va="center",
                fontsize=TEXT_PT,
                color="black" if light else "white",
            )
    else:
        bar = fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
        bar.ax.tick_params(labelsize=TEXT_PT)
        bar.locator = MaxNLocator(5)
        bar.update_ticks()


def font_sizes(fig) -> list[float]:
    """The size in points of every piece of text the figure shows."""
    fig.canvas.draw()
    return [
        t.get_fontsize()
        for t in fig.findobj(Text)
        if t.get_visible() and t.get_text().strip() and t.get_window_extent().width > 0
    ]


def cell_widths(fig) -> list[float]:
    """The width in points of the cells of each panel that writes its values in them."""
    fig.canvas.draw()
    return [
        ax.get_window_extent().width * 72 / fig.dpi / len(ax.get_images()[0].get_array()[0])
        for ax in fig.axes
        if ax.get_gid() == "annotated"
    ]


def _save(fig, path: Path) -> None:
    metadata = {MIN_FONT_KEY: f"{min(font_sizes(fig)):g}"}
    cells = cell_widths(fig)
    if cells:
        metadata[MIN_CELL_KEY] = f"{min(cells):.1f}"
    fig.savefig(path, dpi=DPI, metadata=metadata)
    plt.close(fig)


def _panels(
    path: Path, panels: list[tuple[np.ndarray, str, dict]], *, per_row: int
) -> list[list[str]]:
    """Draw `panels` in rows of `per_row`, a shorter first row centred; return the titles.

    The titles come back row by row, as the page's caption must name them
    ("Left ... Right" for one row, "Top ... Bottom" for two).
    """
    n = len(panels)
    rows = math.ceil(n / per_row)
    counts = [n - per_row * (rows - 1)] + [per_row] * (rows - 1)
    aspect = max(np.atleast_2d(a).shape[0] / np.atleast_2d(a).shape[1] for a, _, _ in panels)
    # the matrix, its title and its labels
    row_in = WIDTH_IN / per_row * aspect * (0.8 if rows == 1 else 0.7) + 1.1
    fig = plt.figure(figsize=(WIDTH_IN, rows * row_in), layout="constrained")
    if rows == 1:  # the panels that write their values in the cells get more room
        ratios = [1.25 if options["annotate"] else 1.0 for _, _, options in panels]
        slots = [(0, k, k + 1) for k in range(n)]
        grid = fig.add_gridspec(1, n, width_ratios=ratios)
    else:
        grid = fig.add_gridspec(rows, 2 * per_row)
        slots = [
            (row, per_row - count + 2 * col, per_row - count + 2 * col + 2)
            for row, count in enumerate(counts)
            for col in range(count)
        ]
    titles: list[list[str]] = [[] for _ in counts]
    for (row, first, last), (a, title, options) in zip(slots, panels, strict=True):
        ax = fig.add_subplot(grid[row, first:last])
        if titles[row]:  # one label "query i" per row, on its first panel
            options = {"ylabel": "", **options}
        _heatmap(fig, ax, a, title, **options)
        titles[row].append(title)
    _save(fig, path)
    return titles


def conventions_figure(path: Path) -> list[list[str]]:
    """Distances, clipped table rows and validity for t_q = 4, t_k = 6, q_offset = 2."""
    r = np.asarray(rp.relative_positions(4, 6, q_offset=2, xp=xp))
    idx = rp.table_index(xp.asarray(r), 2, beyond="zero")
    return _panels(
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
        per_row=3,
    )


def layout_figure(name: str, path: Path) -> list[list[str]]:
    """The relative input and the absolute output of a worked layout example.

    A layout that leaves entries for a causal mask to remove shows its output
    twice: before the mask and after it.
    """
    steps = worked.LAYOUTS[name]()
    function = name.split("_future")[0]
    rel = {"annotate": True, "xlabel": "column (distance)"}
    panels = [(steps[0].array, "relative x[i, c]", rel)]
    if steps[-1].masked:
        panels.append((steps[-2].array, f"{function}(x), before the mask", {"annotate": True}))
        panels.append((steps[-1].array, "after the causal mask", {"annotate": True}))
    else:
        panels.append((steps[-1].array, f"{function}(x): out[i, j]", {"annotate": True}))
    return _panels(path, panels, per_row=3)


#: Each scheme's figure: T positions (a 2 x 3 grid for the 2D schemes), and the
#: sizes and options shown in the panel titles (docs content).
FIGURES = {
    "absolute": {"t_q": T, "t_k": T},
    "shaw": {"t_q": T, "t_k": T, "K": 4},
    "bias": {"t_q": T, "t_k": T, "K": 4},
    "music": {"t_q": T, "t_k": T, "M": T},
    "general": {"t_q": T, "t_k": T, "t_max": T},
    "grid2d": {"height": 2, "width": 3},
    "t5": {"t_q": T, "t_k": T, "buckets": 8, "max_distance": 8},
    "alibi": {"t_q": T, "t_k": T},
    "kerple": {"t_q": T, "t_k": T},
    "sandwich": {"t_q": T, "t_k": T, "d_bar": 16},
    "forgetting": {"t_q": T, "t_k": T},
    "fire": {"t_q": T, "t_k": T, "c": 1.0, "L": 4.0},
    "cope": {"t_q": T, "t_k": T, "npos": 4},
    "rope": {"t_q": T, "t_k": T},
    "xpos": {"t_q": T, "t_k": T, "scale_base": 8.0},
    "swin": {"height": 2, "width": 3},
    "swinv2": {"height": 2, "width": 3},
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
    shown = [f"{s.name} {sizes[s.key]}" for s in entry.sizes if sizes[s.key] is not None]
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
        if rq is not q or rk is not k:  # Swin v2 without cosine attention keeps q and k
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


def scheme_figure(name: str, path: Path) -> list[list[str]]:
    """One row of three panels, or two rows of two."""
    panels = []
    for a, title in scheme_panels(name):
        a = np.asarray(a)
        small_ints = a.dtype.kind in "iub" and a.size <= 144
        panels.append((a, title, {"annotate": small_ints}))
    return _panels(path, panels, per_row=3 if len(panels) <= 3 else 2)


def write_all(out: Path) -> dict[Path, list[list[str]]]:
    """Draw every figure into `out`; return each path written and its panel titles by row."""
    out.mkdir(parents=True, exist_ok=True)
    written = {}
    path = out / "conventions.png"
    written[path] = conventions_figure(path)
    for name in worked.LAYOUTS:
        path = out / f"layout_{name}.png"
        written[path] = layout_figure(name, path)
    for name in worked.SCHEMES:
        path = out / f"scheme_{name}.png"
        written[path] = scheme_figure(name, path)
    return written
