"""The ``relpos-ref`` command line (also ``python -m relpos_ref``).

``relpos-ref show ...`` prints the index conventions as aligned text tables,
like the worked tables readers draw by hand; ``list``, ``generate``,
``verify`` and ``check`` work with golden suites (`relpos_ref.golden`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from . import cli_golden

__all__ = ["VIEWS", "format_matrix", "main"]

VIEWS = (
    "positions",
    "index",
    "valid",
    "causal-index",
    "grid",
    "absolute",
    "shaw",
    "bias",
    "music",
    "general",
    "grid2d",
)
_ALIASES = {"shaw": "index", "bias": "index", "music": "causal-index"}

_SHOW_HELP = """\
views:
  positions     the distance matrix r = j - (i + q_offset), key minus query
  index         the row of a two-sided table (2K+1 rows, row r + K); entries
                whose term is zero under --beyond zero are shown as '-'
  valid         whether each entry has a row of its own (1) or not (0)
  causal-index  the row of a one-sided table (M rows for r = -(M-1) .. 0,
                row r + M - 1); future entries are shown as '-'
  grid          row and column distances between the tokens of an h x w grid
                in row-major order

scheme views (the table row each (query, key) pair reads):
  absolute      row j of the absolute table (the key's position)
  shaw, bias    row r + K of the 2K+1-row table (same as index)
  music         row r + M - 1 of the one-sided table (same as causal-index)
  general       row of the 2 t_max - 1 table, --order past_to_future or
                future_to_past
  grid2d        rows of the row table (2h - 1 rows) and of the column table
                (2w - 1 rows) for each token pair

examples:
  relpos-ref show positions --tq 5 --tk 5
  relpos-ref show positions --tq 2 --tk 6 --end-aligned
  relpos-ref show index --tq 5 --tk 5 --max-distance 2 --beyond zero
  relpos-ref show causal-index --tq 4 --tk 4 --length 3
  relpos-ref show grid --height 2 --width 3
  relpos-ref show general --tq 2 --tk 4 --t-max 4 --end-aligned
"""


def format_matrix(
    matrix: Sequence[Sequence[Any]], *, row_label: str = "i", col_label: str = "j"
) -> str:
    """Render a small integer matrix as an aligned text table with labelled axes.

    Examples
    --------
    >>> print(format_matrix([[0, 1], [-1, 0]]))
    i\\j   0   1
      0   0   1
      1  -1   0
    """
    rows = [[str(v) for v in row] for row in matrix]
    n_cols = len(rows[0]) if rows else 0
    head = f"{row_label}\\{col_label}"
    width = max([len(c) for row in rows for c in row] + [len(str(n_cols - 1)), 2])
    label_width = max(len(head), len(str(len(rows) - 1)) + 1)
    lines = [head.ljust(label_width) + "".join(f" {c:>{width}}" for c in range(n_cols))]
    for i, row in enumerate(rows):
        lines.append(f"{i:>{label_width}}" + "".join(f" {c:>{width}}" for c in row))
    return "\n".join(lines)


def _grid_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tq", type=int, default=5, help="number of queries t_q (default 5)")
    p.add_argument("--tk", type=int, default=None, help="number of keys t_k (default t_q)")
    align = p.add_mutually_exclusive_group()
    align.add_argument(
        "--q-offset",
        type=int,
        default=0,
        help="position of query 0 (default 0, start-aligned)",
    )
    align.add_argument(
        "--end-aligned",
        action="store_true",
        help="q_offset = t_k - t_q: the last query sits at the last key (decoding)",
    )
    p.add_argument(
        "--max-distance", "-K", type=int, default=2, help="K for index/valid (default 2)"
    )
    p.add_argument(
        "--length", "-M", type=int, default=None, help="M for causal-index (default t_k)"
    )
    p.add_argument(
        "--beyond",
        choices=("clip", "zero", "error"),
        default="clip",
        help="policy for distances beyond the table (default clip)",
    )
    p.add_argument(
        "--t-max", type=int, default=None, help="t_max for general (default max(t_q, t_k))"
    )
    p.add_argument(
        "--order",
        choices=("past_to_future", "future_to_past"),
        default="past_to_future",
        help="row order of the general table (default past_to_future)",
    )
    p.add_argument("--height", type=int, default=2, help="grid height h (default 2)")
    p.add_argument("--width", type=int, default=3, help="grid width w (default 3)")


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = argparse.ArgumentParser(
        prog="relpos-ref",
        description=(
            "Reference implementation of relative positional attention. "
            "Conventions: query i sits at i + q_offset, key j at j, and the "
            "distance is key minus query, r = j - (i + q_offset)."
        ),
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    show = sub.add_parser(
        "show",
        help="print distances, table indices and validity as text tables",
        description="Print index conventions for given lengths as aligned text tables.",
        epilog=_SHOW_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    show.add_argument(
        "view", choices=VIEWS, metavar="VIEW", help="what to print: " + ", ".join(VIEWS)
    )
    _grid_args(show)
    cli_golden.add_commands(sub)
    return parser


def _mark_invalid(index: Any, valid: Any) -> list[list[str]]:
    # Row numbers where the entry has a row of its own, "-" where it does not.
    return [
        [str(x) if ok else "-" for x, ok in zip(irow, vrow, strict=True)]
        for irow, vrow in zip(index.tolist(), valid.tolist(), strict=True)
    ]


def _show(args: argparse.Namespace) -> str:
    import array_api_compat.numpy as xp

    from .positions import causal_table_index, grid_positions, relative_positions, table_index
    from .schemes import absolute_index, general_index, grid2d_index

    view = _ALIASES.get(args.view, args.view)
    if view == "grid2d":
        rows, cols = grid2d_index(args.height, args.width, xp=xp)
        h, w = args.height, args.width
        return "\n".join(
            [
                f"grid2d h={h} w={w}: row table of {2 * h - 1} rows, column table of {2 * w - 1}",
                "row-table row (x_m - x_n + h - 1)",
                format_matrix(rows.tolist(), row_label="n", col_label="m"),
                "",
                "column-table row (y_m - y_n + w - 1)",
                format_matrix(cols.tolist(), row_label="n", col_label="m"),
            ]
        )
    if view == "grid":
        rows, cols = grid_positions(args.height, args.width, xp=xp)
        dr = rows[None, :] - rows[:, None]
        dc = cols[None, :] - cols[:, None]
        pairs = zip(rows.tolist(), cols.tolist(), strict=True)
        coords = "  ".join(f"{n}:({a},{b})" for n, (a, b) in enumerate(pairs))
        return "\n".join(
            [
                f"grid h={args.height} w={args.width}, token n at (n // w, n % w)",
                f"tokens  {coords}",
                "",
                "row distance (key row - query row)",
                format_matrix(dr.tolist(), row_label="n", col_label="m"),
                "",
                "column distance (key column - query column)",
                format_matrix(dc.tolist(), row_label="n", col_label="m"),
            ]
        )
    t_q = args.tq
    t_k = t_q if args.tk is None else args.tk
    q_offset = t_k - t_q if args.end_aligned else args.q_offset
    r = relative_positions(t_q, t_k, q_offset=q_offset, xp=xp)
    header = f"t_q={t_q} t_k={t_k} q_offset={q_offset}"
    if view == "absolute":
        index = absolute_index(t_q, t_k, xp=xp)
        return f"row j of the absolute table   {header}\n" + format_matrix(index.tolist())
    if view == "general":
        t_max = max(t_q, t_k) if args.t_max is None else args.t_max
        index = general_index(t_q, t_k, t_max=t_max, q_offset=q_offset, order=args.order, xp=xp)
        what = f"{header} t_max={t_max} order={args.order}"
        return f"row of the {2 * t_max - 1}-row general table   {what}\n" + format_matrix(
            index.tolist()
        )
    if view == "positions":
        return f"distance r = j - (i + q_offset)   {header}\n" + format_matrix(r.tolist())
    if view in ("index", "valid"):
        k = args.max_distance
        index, valid = table_index(r, k, beyond=args.beyond)
        what = f"{header} K={k} beyond={args.beyond}"
        if view == "valid":
            shown = valid.astype(int).tolist()
            return f"valid (1 = has a row)   {what}\n" + format_matrix(shown)
        shown = _mark_invalid(index, valid)
        return f"row r + K of a {2 * k + 1}-row table   {what}\n" + format_matrix(shown)
    m = t_k if args.length is None else args.length
    index, valid = causal_table_index(r, m, beyond=args.beyond)
    shown = _mark_invalid(index, valid)
    what = f"{header} M={m} beyond={args.beyond}"
    return f"row r + M - 1 of a {m}-row causal table   {what}\n" + format_matrix(shown)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    status = 0
    try:
        if args.command == "show":
            text = _show(args)
        else:
            status, text = cli_golden.run(args)
    except KeyboardInterrupt:
        return cli_golden.report_interrupt()
    except (ValueError, TypeError, OSError) as exc:
        print(f"relpos-ref: error: {exc}", file=sys.stderr)
        return 2
    if text:
        print(text)
    return status
