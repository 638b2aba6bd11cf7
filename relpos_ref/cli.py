"""The ``relpos-ref`` command line (also ``python -m relpos_ref``).

``relpos-ref show ...`` prints the index conventions as aligned text tables,
like the worked tables readers draw by hand; ``list``, ``generate``,
``verify`` and ``check`` work with golden suites (`relpos_ref.golden`).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from . import catalog, cli_golden
from .cli_show import MAX_SHOWN, format_matrix
from .cli_show import flag_of as _flag
from .cli_show import name_flags as _name_flags
from .cli_show import show as _show

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
