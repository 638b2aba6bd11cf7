"""``relpos-ref show``: the index conventions and each scheme's integers as text tables.

`show` runs the ``show`` command for `relpos_ref.cli` (its parser is there);
`format_matrix` aligns a table the way readers draw them by hand.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Sequence
from typing import Any

from . import catalog

__all__ = ["MAX_SHOWN", "flag_of", "format_matrix", "name_flags", "show"]

#: The largest table `show` prints, in queries, keys or grid tokens per side.
MAX_SHOWN = 1000


def flag_of(name: str) -> str:
    """The command line's flag of an argument: ``--`` and its name with dashes."""
    return "--" + name.replace("_", "-")


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



def _mark_invalid(index: Any, valid: Any) -> list[list[str]]:
    # Row numbers where the entry has a row of its own, "-" where it does not.
    return [
        [str(x) if ok else "-" for x, ok in zip(irow, vrow, strict=True)]
        for irow, vrow in zip(index.tolist(), valid.tolist(), strict=True)
    ]


#: The flags each convention view reads (argparse dests); scheme views: `_flags_of`.
_ALIGNMENT = ("tq", "tk", "q_offset", "end_aligned")
_CONVENTION_FLAGS = {
    "positions": _ALIGNMENT,
    "index": (*_ALIGNMENT, "max_distance", "beyond"),
    "valid": (*_ALIGNMENT, "max_distance", "beyond"),
    "causal-index": (*_ALIGNMENT, "length", "beyond"),
    "grid": ("height", "width"),
}
#: Parameter names in the library's messages, and the flag a user typed for each.
_PARAMETER_FLAGS = {"t_q": "--tq", "t_k": "--tk", "q_offset": "--q-offset", "h": "--height",
                    "w": "--width", "K": "--max-distance", "M": "--length"}


def _flags_of(view: str) -> tuple[str, ...]:
    """The argparse dests that `show VIEW` reads."""
    if view in _CONVENTION_FLAGS:
        return _CONVENTION_FLAGS[view]
    entry = catalog.get(view)
    own = (*(s.name for s in entry.sizes), *(o.name for o in entry.options if o.flag))
    return own if entry.grid is not None else (*_ALIGNMENT, *own)


def _check_flags(args: argparse.Namespace) -> None:
    """Refuse a flag the view does not read, rather than ignore it."""
    ignored = {"command", "view"}
    given = [dest for dest, value in vars(args).items()
             if dest not in ignored and value is not None and value is not False]
    unused = [dest for dest in given if dest not in _flags_of(args.view)]
    if unused:
        flags = ", ".join(flag_of(d) for d in _flags_of(args.view)) or "none"
        msg = (f"{', '.join(flag_of(d) for d in unused)} does not apply to `show {args.view}` "
               f"(its flags: {flags})")
        raise ValueError(msg)


def _check_shown(tokens: int, dests: Sequence[str], args: argparse.Namespace) -> None:
    for dest in dests:  # sizes first: two negative sides must not pass as a product
        value = getattr(args, dest)
        if value is not None and value < 1:
            msg = f"{flag_of(dest)} must be >= 1, got {value}"
            raise ValueError(msg)
    if tokens > MAX_SHOWN:
        given = " x ".join(f"{flag_of(d)} {getattr(args, d)}" for d in dests
                           if getattr(args, d) is not None) or "the defaults"
        msg = f"{given} gives {tokens} tokens, too large to print (at most {MAX_SHOWN})"
        raise ValueError(msg)


def name_flags(message: str, view: str | None) -> str:
    """`message` with the library's parameter names written as the flags a user typed."""
    names = dict(_PARAMETER_FLAGS)
    if view in catalog.SCHEMES:
        entry = catalog.get(view)
        for size in entry.sizes:
            names[size.key] = names[size.name] = flag_of(size.name)
        names.update({o.name: flag_of(o.name) for o in entry.options if o.flag})
    else:
        names.update({d: flag_of(d) for d in _flags_of(view)} if view else {})

    def flag(match: re.Match[str]) -> str:
        return names.get(match.group(1), match.group(0))

    return re.sub(r"`(\w+)`", flag, message)


def show(args: argparse.Namespace) -> str:
    """The text of ``relpos-ref show`` for parsed `args` (a `ValueError` names a flag)."""
    import array_api_compat.numpy as xp

    from .positions import causal_table_index, grid_positions, relative_positions, table_index

    _check_flags(args)
    t_q = 5 if args.tq is None else args.tq
    t_k = t_q if args.tk is None else args.tk
    q_offset = t_k - t_q if args.end_aligned else args.q_offset
    if args.view in catalog.SCHEMES:
        entry = catalog.get(args.view)
        q_offset = entry.defaults.resolve_q_offset(q_offset, t_q, t_k)  # None: the scheme's
        return _show_scheme(entry, args, t_q, t_k, q_offset)
    q_offset = 0 if q_offset is None else q_offset
    if args.view == "grid":
        height = 2 if args.height is None else args.height
        width = 3 if args.width is None else args.width
        _check_shown(height * width, ("height", "width"), args)
        rows, cols = grid_positions(height, width, xp=xp)
        dr = rows[None, :] - rows[:, None]
        dc = cols[None, :] - cols[:, None]
        pairs = zip(rows.tolist(), cols.tolist(), strict=True)
        coords = "  ".join(f"{n}:({a},{b})" for n, (a, b) in enumerate(pairs))
        return "\n".join(
            [
                f"grid h={height} w={width}, token n at (n // w, n % w)",
                f"tokens  {coords}",
                "",
                "row distance (key row - query row)",
                format_matrix(dr.tolist(), row_label="n", col_label="m"),
                "",
                "column distance (key column - query column)",
                format_matrix(dc.tolist(), row_label="n", col_label="m"),
            ]
        )
    r = relative_positions(t_q, t_k, q_offset=q_offset, xp=xp)
    header = f"t_q={t_q} t_k={t_k} q_offset={q_offset}"
    if args.view == "positions":
        return f"distance r = j - (i + q_offset)   {header}\n" + format_matrix(r.tolist())
    beyond = args.beyond or "clip"
    if args.view in ("index", "valid"):
        k = 2 if args.max_distance is None else args.max_distance
        index, valid = table_index(r, k, beyond=beyond)
        what = f"{header} K={k} beyond={beyond}"
        if args.view == "valid":
            shown = valid.astype(int).tolist()
            return f"valid (1 = has a row)   {what}\n" + format_matrix(shown)
        shown = _mark_invalid(index, valid)
        return f"row r + K of a {2 * k + 1}-row table   {what}\n" + format_matrix(shown)
    if args.length is None and t_k < 1:
        msg = f"--length defaults to t_k, which is {t_k} here; give --length (>= 1)"
        raise ValueError(msg)
    m = t_k if args.length is None else args.length
    index, valid = causal_table_index(r, m, beyond=beyond)
    shown = _mark_invalid(index, valid)
    what = f"{header} M={m} beyond={beyond}"
    return f"row r + M - 1 of a {m}-row causal table   {what}\n" + format_matrix(shown)


#: Captions of the integer intermediates of `relpos_ref.catalog.Scheme.indices`.
_CAPTIONS = {
    "distance": "distance r = j - (i + q_offset)",
    "index": "table row",
    "index_rows": "row of the row table: key row - query row + height - 1",
    "index_cols": "row of the column table: key column - query column + width - 1",
    "delta": "query-minus-key distance delta = -r, clamped to +-clamp_len",
    "bucket": "log bucket of r",
}


def _show_scheme(
    entry: catalog.Scheme, args: argparse.Namespace, t_q: int, t_k: int, q_offset: int
) -> str:
    import array_api_compat.numpy as xp

    sizes = {}
    for size in entry.sizes:
        value = getattr(args, size.name)
        if value is None:
            value = size.fit(t_q, t_k) if size.fit is not None else size.default
        sizes[size.key] = value
    options = {}
    for option in entry.options:
        value = getattr(args, option.name, None) if option.flag else None
        if value is not None:
            options[option.name] = value
    options = {**{o: v for o, v in entry.option_defaults().items()
                  if any(x.name == o and x.flag for x in entry.options)}, **options}
    if entry.grid is not None:
        t_q = t_k = entry.grid(sizes)
        _check_shown(t_q, [s.name for s in entry.sizes], args)
        q_offset = 0
    found = entry.indices(xp, None, t_q=t_q, t_k=t_k, q_offset=q_offset, sizes=sizes,
                          options=options)
    valid = found.pop("valid", None)
    if len(found) > 1:
        found.pop("distance", None)
    shapes = ", ".join(f"{t.name} of {t.rows(sizes | {'d': 1})} rows ({t.rows_text})"
                       for t in entry.tables if t.width is not None or t.required)
    named = {s.name: sizes[s.key] for s in entry.sizes}
    given = " ".join(f"{k}={v}" for k, v in {**named, **options}.items())
    lines = [f"{entry.name}: {shapes or entry.summary}   t_q={t_q} t_k={t_k} "
             f"q_offset={q_offset} {given}".rstrip()]
    for name, a in found.items():
        shown = _mark_invalid(a, valid) if name == "index" and valid is not None else a.tolist()
        if len(found) > 1:
            lines += ["", _CAPTIONS.get(name, name)]
        lines.append(format_matrix(shown))
    if entry.show is not None:
        lines += ["", *entry.show(t_q=t_q, t_k=t_k, q_offset=q_offset, options=options)]
    return "\n".join(lines)
