"""The golden-suite commands of ``relpos-ref``: list, generate, verify, check, diagnose."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["add_commands", "run"]

_GENERATE_EPILOG = """\
examples:
  relpos-ref generate --out golden
  relpos-ref generate --out golden-shaw --select 'shaw/*' --dtypes float32 bfloat16
  relpos-ref generate --out golden-npz --format npz
  relpos-ref generate --out golden-mine --cases my-cases.toml
"""


def add_commands(sub: Any) -> None:
    """Add the golden-suite subcommands to an argparse subparsers object."""
    from .golden import FLOAT_DTYPES, FORMATS, GOLDEN_BACKENDS

    def selection(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--select",
            action="append",
            metavar="GLOB",
            help="only cases whose id matches GLOB (repeatable), e.g. 'shaw/*/float32/*'",
        )
        p.add_argument(
            "--dtypes", nargs="+", choices=FLOAT_DTYPES, metavar="DTYPE",
            help=f"only these dtypes under test ({', '.join(FLOAT_DTYPES)})",
        )

    def cases_file(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--cases", metavar="FILE",
            help="cases of your own from a TOML file ([[case]] tables with scheme, variant, "
                 "params, dtypes, seeds) instead of the default suite",
        )

    p = sub.add_parser(
        "list", help="list the golden cases",
        description="Print the ids of the default golden cases (or those of --cases FILE), "
                    "one per line, or with --json every case's kind, scheme, variant, dtype, "
                    "seed and parameters.")
    selection(p)
    cases_file(p)
    p.add_argument("--json", action="store_true",
                   help="print a JSON list of the cases with their parameters")

    p = sub.add_parser(
        "generate",
        help="write the golden suite (inputs, intermediates, outputs, tolerances)",
        description=(
            "Write the golden suite to a directory, crash-safe: one file per case and a "
            "manifest.json with hashes and derived tolerances."
        ),
        epilog=_GENERATE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out", required=True, metavar="DIR", help="suite directory to write")
    selection(p)
    cases_file(p)
    p.add_argument("--backend", choices=GOLDEN_BACKENDS, default="numpy",
                   help="where the float64 goldens are computed (default numpy)")
    p.add_argument("--format", choices=FORMATS, default="safetensors", dest="fmt",
                   help="file format of the cases (default safetensors)")
    p.add_argument("--force", action="store_true",
                   help="replace a different suite (or other files) already in DIR")

    p = sub.add_parser(
        "verify",
        help="check a suite's hashes, then recompute and compare every case",
        description="Exit status 0 when the suite is intact, 1 when anything differs.",
    )
    p.add_argument("dir", metavar="DIR")
    p.add_argument("--backend", choices=GOLDEN_BACKENDS, default="numpy",
                   help="where to recompute the goldens (default numpy)")

    p = sub.add_parser(
        "check",
        help="compare your results with a suite",
        description=(
            "Compare results stored under the suite's array names, one file per case named "
            "like the suite's (.safetensors or .npz), with the goldens and their tolerances. "
            "Exit status 0: every selected case has a result and matches; 1: a mismatch, or "
            "a selected case without a result (unless --allow-missing); 2: unusable input."
        ),
    )
    p.add_argument("dir", metavar="DIR", help="the golden suite")
    p.add_argument("obtained", metavar="OBTAINED", help="directory with your results")
    p.add_argument("--select", action="append", metavar="GLOB",
                   help="only cases whose id matches GLOB (repeatable)")
    p.add_argument("--gradients", action="store_true",
                   help="require every case's gradients too (dq, dk, dv, d_<table>), "
                        "for testing a backward pass")
    p.add_argument("--allow-missing", action="store_true",
                   help="accept selected cases that have no result file (by default each "
                        "one fails the check, so part of a suite never passes as the whole)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--verbose", action="store_true", help="also list matching cases")
    p.add_argument("--plot", metavar="DIR",
                   help="for each mismatching case, write DIR/<case>.png: |obtained - golden| "
                        "per head (needs matplotlib: pip install 'relpos-ref[plot]')")
    _add_diagnose(sub)


def _add_diagnose(sub: Any) -> None:
    p = sub.add_parser(
        "diagnose",
        help="for mismatching results, try the field's known convention mistakes",
        description=(
            "For each case whose results file holds an `output` that misses the golden, "
            "recompute the case with each known convention mistake (table reversed, "
            "clipping at K-1, start/end-aligned queries, q_offset off by one, scale on the "
            "bias, shared tables, causal r < 0, T5's causal sign, ...) and report which one "
            "the output matches, in units of the case's tolerance. Only mismatching cases "
            "are listed (--all lists every case). Exit status 0: every output matches its "
            "golden; 1: some do not; 2: unusable input."
        ),
    )
    p.add_argument("dir", metavar="DIR", help="the golden suite")
    p.add_argument("obtained", metavar="OBTAINED", help="directory with your results")
    p.add_argument("--select", action="append", metavar="GLOB",
                   help="only cases whose id matches GLOB (repeatable)")
    p.add_argument("--all", action="store_true",
                   help="also list the cases whose output matches its golden")
    p.add_argument("--json", action="store_true", help="print the diagnosis as JSON")


def _size(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB"


def _note(recovered: str | None) -> None:
    # What was finished or undone of a generate killed earlier, said once on stderr.
    if recovered:
        print(f"relpos-ref: note: {recovered}", file=sys.stderr)


def _cases_outside(cases: str | None, out: str) -> None:
    """Refuse a ``--cases`` file inside ``--out``: generate replaces that directory whole."""
    from .golden import SuiteError

    if cases is None:
        return
    file, folder = Path(cases).resolve(), Path(out).resolve()
    if file.is_relative_to(folder):
        msg = (f"--cases {cases} lies inside --out {out}, a directory generate replaces "
               "whole (with --force, the cases file would be deleted); keep it outside")
        raise SuiteError(msg)


def _cases(args: argparse.Namespace) -> list[Any]:
    """The default suite or the ``--cases`` file's, filtered by ``--select`` and ``--dtypes``."""
    from . import golden

    registry = golden.default_cases() if args.cases is None else \
        golden.cases_from_toml(args.cases)
    return registry.select(args.select, dtypes=args.dtypes)


def run(args: argparse.Namespace) -> tuple[int, str]:
    """Run a golden subcommand; returns (exit status, text for stdout)."""
    from . import golden
    from .golden.progress import Progress

    if args.command == "list":
        cases = _cases(args)
        if args.json:
            listed = [{"id": c.id, "kind": c.kind, "scheme": c.scheme, "variant": c.variant,
                       "dtype": c.dtype, "seed": c.seed, "params": c.parameters}
                      for c in cases]
            return 0, json.dumps(listed, indent=1, sort_keys=True)
        return 0, "\n".join(c.id for c in cases)
    if args.command == "generate":
        _cases_outside(args.cases, args.out)
        cases = _cases(args)
        start = time.perf_counter()
        result = golden.generate(
            args.out, cases, fmt=args.fmt, backend=args.backend, force=args.force,
            progress=Progress(len(cases), "generate"),
        )
        took = time.perf_counter() - start
        _note(result.recovered)
        if result.status == "unchanged":
            return 0, f"{result.path} already holds this suite ({result.cases} cases); unchanged"
        verb = "replaced" if result.status == "replaced" else "wrote"
        return 0, (
            f"{verb} {result.cases} cases ({_size(result.bytes)}) in {result.path} "
            f"in {took:.1f} s; check it with `relpos-ref verify {result.path}`"
        )
    if args.command == "verify":
        suite = golden.load_suite(args.dir)
        _note(suite.recovered)
        report = golden.verify(
            args.dir, backend=args.backend, progress=Progress(len(suite.cases), "verify")
        )
        if report.ok:
            return 0, (
                f"{report.path}: {report.cases} cases and {report.arrays} arrays verified "
                "(hashes, inputs, recomputed goldens and tolerances)"
            )
        lines = [*report.problems, f"{report.path}: {len(report.problems)} problem(s) found"]
        return 1, "\n".join(lines)
    if args.command == "diagnose":
        from .golden.diagnose import diagnose

        _note(golden.load_suite(args.dir).recovered)
        found = diagnose(args.dir, args.obtained, select=args.select)
        ok = all(d.matches_golden for d in found)
        shown = [d for d in found if args.all or not d.matches_golden]
        if args.json:
            return (0 if ok else 1), json.dumps([d.as_dict() for d in shown], indent=1)
        lines = [line for d in shown for line in d.lines()]
        bad = sum(not d.matches_golden for d in found)
        lines.append(f"{len(found) - bad} of {len(found)} case(s) match their golden")
        return (0 if ok else 1), "\n".join(lines)
    if args.command == "check":
        _note(golden.load_suite(args.dir).recovered)
        if args.plot is not None:
            from .golden.plot import _pyplot

            _pyplot()  # matplotlib missing: say so before comparing anything
        report = golden.check(args.dir, args.obtained, select=args.select,
                              gradients=args.gradients, allow_missing=args.allow_missing)
        if args.plot is not None:
            from .golden.plot import plot_report

            for path in plot_report(args.dir, args.obtained, report, args.plot):
                print(f"relpos-ref: wrote {path}", file=sys.stderr)
        if args.json:
            text = json.dumps(report.as_dict(), indent=1, sort_keys=True)
        else:
            text = "\n".join(report.lines(verbose=args.verbose))
        return (0 if report.ok else 1), text
    msg = f"unknown command {args.command!r}"
    raise ValueError(msg)


def report_interrupt() -> int:
    """Message and exit status for Ctrl-C."""
    print("relpos-ref: interrupted; a suite being written is left as the previous one or "
          "the new one, whole", file=sys.stderr)
    return 130
