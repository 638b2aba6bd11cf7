"""The ``relpos-ref`` command line (also ``python -m relpos_ref``).

``relpos-ref show ...`` prints the index conventions as aligned text tables,
like the worked tables readers draw by hand; ``list``, ``generate``,
``verify`` and ``check`` work with golden suites (`relpos_ref.golden`).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any

from . import catalog, cli_golden

__all__ = ["EXIT_CODES", "VIEWS", "format_matrix", "main"]

#: What each exit status of ``relpos-ref`` means.
EXIT_CODES = {
    0: "success (for verify and check: the suite is intact, every case matches)",
    1: "verify found problems, or check found a case that does not match or has no "
       "result (see check --allow-missing)",
    2: "a usage error or unusable input: a bad flag, a suite or results that cannot be read",
    70: "an internal error (a bug: rerun with RELPOS_REF_DEBUG=1 for the traceback)",
    130: "interrupted (Ctrl-C); a suite being written is the previous one or the new one, whole",
    141: "standard output was closed before everything was written (e.g. `| head`)",
}
#: The largest table `show` prints, in queries, keys or grid tokens per side.
MAX_SHOWN = 1000
#: Integers beyond this magnitude do not fit relpos_ref's int64 distances.
_INT_LIMIT = 2**62

#: Views of the conventions themselves; every scheme of the catalog is a view too.
CONVENTION_VIEWS = ("positions", "index", "valid", "causal-index", "grid")
VIEWS = (*CONVENTION_VIEWS, *catalog.names())

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

scheme views, one per scheme of relpos_ref.catalog: the integers each (query,
key) pair reads (table rows, buckets, distances); '-' where a row does not
apply. Sizes left out fit the grid (M = t_k, t_max = max(t_q, t_k)) or take
the catalog's default.

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


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors: ``relpos-ref show: error: argument --tq: ...``."""

    def error(self, message: str) -> Any:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _integer(lo: int = -_INT_LIMIT + 1, hi: int = _INT_LIMIT - 1,
             why: str = "too large to print") -> Callable[[str], int]:
    """An argparse type: an integer from `lo` to `hi`; argparse names the flag."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            msg = f"expected an integer, got {text!r}"
            raise argparse.ArgumentTypeError(msg) from None
        if value < lo:
            msg = (f"must be >= {lo}, got {value}" if lo > -_INT_LIMIT + 1 else
                   f"{value} does not fit relpos_ref's int64 distances (|value| < 2**62)")
            raise argparse.ArgumentTypeError(msg)
        if value > hi:
            if hi < _INT_LIMIT - 1:
                msg = f"{value} is {why} (at most {hi})"
            else:
                msg = f"{value} does not fit relpos_ref's int64 distances (|value| < 2**62)"
            raise argparse.ArgumentTypeError(msg)
        return value
    return parse


_SIZE = _integer(0, MAX_SHOWN)
_LARGE = _integer()


def _grid_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tq", type=_SIZE, default=None, help="number of queries t_q (default 5)")
    p.add_argument("--tk", type=_SIZE, default=None, help="number of keys t_k (default t_q)")
    align = p.add_mutually_exclusive_group()
    align.add_argument(
        "--q-offset",
        type=_LARGE,
        default=None,
        help="position of query 0 (default 0, start-aligned; the scheme's for a scheme view)",
    )
    align.add_argument(
        "--end-aligned",
        action="store_true",
        help="q_offset = t_k - t_q: the last query sits at the last key (decoding)",
    )
    p.add_argument(
        "--max-distance", "-K", type=_LARGE, default=None,
        help="K for index/valid (default 2) and shaw/bias; T5's max_distance (default 128)",
    )
    p.add_argument(
        "--length", "-M", type=_LARGE, default=None,
        help="M for causal-index and music (default t_k)",
    )
    p.add_argument(
        "--beyond",
        choices=("clip", "zero", "error"),
        default=None,
        help="policy for distances beyond the table (default clip)",
    )
    p.add_argument("--height", type=_SIZE, default=None, help="grid height h (default 2)")
    p.add_argument("--width", type=_SIZE, default=None, help="grid width w (default 3)")
    _catalog_args(p)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _catalog_args(p: argparse.ArgumentParser) -> None:
    # One flag per size and per option that changes the intermediates, across the catalog.
    taken = {"max_distance", "length", "beyond", "height", "width"}
    for entry in catalog.SCHEMES.values():
        for size in entry.sizes:
            if size.name not in taken:
                taken.add(size.name)
                p.add_argument(_flag(size.name), type=_LARGE, default=None,
                               help=f"{size.name} for {entry.name}: {size.meaning}")
        defaults = entry.option_defaults()
        for option in entry.options:
            if not option.flag or option.name in taken:
                continue
            taken.add(option.name)
            default = defaults.get(option.name)
            text = f"{option.name} for {entry.name}: {option.meaning} (default {default})"
            if option.choices == (True, False):
                p.add_argument(_flag(option.name), action=argparse.BooleanOptionalAction,
                               default=None, help=text)
            elif option.choices:
                p.add_argument(_flag(option.name), choices=option.choices, default=None,
                               help=text)
            else:
                read = _LARGE if option.parse is None else _reader(option.parse)
                p.add_argument(_flag(option.name), type=read, default=None, help=text)


def _reader(parse: Any) -> Any:
    # an option's own parser, its ValueError shown as argparse shows a bad value
    def read(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    read.__name__ = getattr(parse, "__name__", "value")
    return read


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    codes = "\n".join(f"  {code:>3}  {text}" for code, text in EXIT_CODES.items())
    parser = _Parser(
        prog="relpos-ref",
        description=(
            "Reference implementation of relative positional attention. "
            "Conventions: query i sits at i + q_offset, key j at j, and the "
            "distance is key minus query, r = j - (i + q_offset)."
        ),
        epilog=f"exit status:\n{codes}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
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
        flags = ", ".join(_flag(d) for d in _flags_of(args.view)) or "none"
        msg = (f"{', '.join(_flag(d) for d in unused)} does not apply to `show {args.view}` "
               f"(its flags: {flags})")
        raise ValueError(msg)


def _check_shown(tokens: int, dests: Sequence[str], args: argparse.Namespace) -> None:
    for dest in dests:  # sizes first: two negative sides must not pass as a product
        value = getattr(args, dest)
        if value is not None and value < 1:
            msg = f"{_flag(dest)} must be >= 1, got {value}"
            raise ValueError(msg)
    if tokens > MAX_SHOWN:
        given = " x ".join(f"{_flag(d)} {getattr(args, d)}" for d in dests
                           if getattr(args, d) is not None) or "the defaults"
        msg = f"{given} gives {tokens} tokens, too large to print (at most {MAX_SHOWN})"
        raise ValueError(msg)


def _name_flags(message: str, view: str | None) -> str:
    """`message` with the library's parameter names written as the flags a user typed."""
    names = dict(_PARAMETER_FLAGS)
    if view in catalog.SCHEMES:
        entry = catalog.get(view)
        for size in entry.sizes:
            names[size.key] = names[size.name] = _flag(size.name)
        names.update({o.name: _flag(o.name) for o in entry.options if o.flag})
    else:
        names.update({d: _flag(d) for d in _flags_of(view)} if view else {})

    def flag(match: re.Match[str]) -> str:
        return names.get(match.group(1), match.group(0))

    return re.sub(r"`(\w+)`", flag, message)


def _show(args: argparse.Namespace) -> str:
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


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (`EXIT_CODES`)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, or a usage error already said
        return exc.code if isinstance(exc.code, int) else 2
    status = 0
    try:
        if args.command == "show":
            text = _show(args)
        else:
            status, text = cli_golden.run(args)
    except KeyboardInterrupt:
        return cli_golden.report_interrupt()
    except (ValueError, TypeError, OSError, OverflowError, RecursionError,
            MemoryError) as exc:
        view = args.view if args.command == "show" else None
        said = _say(exc)
        if not said.startswith("--cases "):  # a --cases file names its own keys (`K`, ...)
            said = _name_flags(said, view)
        print(f"relpos-ref: error: {said}", file=sys.stderr)
        return 2
    except Exception as exc:
        if os.environ.get("RELPOS_REF_DEBUG"):
            raise
        print(f"relpos-ref: internal error ({type(exc).__name__}: {exc}); rerun with "
              "RELPOS_REF_DEBUG=1 for the traceback, and please report it", file=sys.stderr)
        return 70
    return _emit(text, status)


def _say(exc: BaseException) -> str:
    # One line for any error a user can cause.
    if isinstance(exc, MemoryError):
        return f"out of memory ({str(exc) or 'no details'}); ask for less"
    if isinstance(exc, RecursionError):
        return "input nested too deeply to read"
    text = str(exc) or type(exc).__name__
    return " ".join(text.split())


def _emit(text: str, status: int) -> int:
    """Print `text`; a reader that stopped reading (``| head``) is exit status 141."""
    if not text or sys.stdout is None:  # nothing to say, or standard output closed (>&-)
        return status
    try:
        print(text)
        sys.stdout.flush()
    except BrokenPipeError:
        # Point stdout at /dev/null so that Python's flush at exit does not fail again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141
    except OSError as exc:  # a full disk (>/dev/full), a closed descriptor
        devnull = os.open(os.devnull, os.O_WRONLY)
        with contextlib.suppress(OSError, ValueError):
            os.dup2(devnull, sys.stdout.fileno())
        print(f"relpos-ref: error: cannot write the output: {exc.strerror or exc}",
              file=sys.stderr)
        return 2
    return status
