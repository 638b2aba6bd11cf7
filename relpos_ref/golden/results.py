"""Checking files of someone's results against a suite (`check`).

Results are one ``.safetensors`` or ``.npz`` file per case in a directory of
their own, named like the suite's case files. Each file is read only after
its size is checked against what the case's arrays can take
(`read_result`), links are never followed, and each case's goldens and
tolerances come from `relpos_ref.golden.Suite.load`, so from a suite that
re-derives.
"""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .compare import ArrayResult, ObtainedError
from .fileformat import CorruptFileError, file_limit, loads_file
from .paths import SuiteError, entries, read_plain
from .sharing import RETRIES, SuiteReplacedError
from .suite import Suite, load_suite

__all__ = ["REQUIRED", "CheckReport", "check", "read_result", "result_files"]

#: What a result file must hold for its case to count: the case's output (and, with
#: ``check(..., gradients=True)``, every gradient golden of the case).
REQUIRED = ("output",)


@dataclass
class CheckReport:
    """Results of `check`: per case, the array comparisons and what was missing.

    A case matches only when every array in `REQUIRED` was given and every
    array given is within its tolerance. The report is `ok` only when every
    selected case has a result and matches, or, with `allow_missing`, every
    case that has one matches.
    """

    results: dict[str, list[ArrayResult]] = field(default_factory=dict)
    incomplete: dict[str, list[str]] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)
    allow_missing: bool = False

    def _passed(self, cid: str) -> bool:
        return cid not in self.incomplete and all(r.passed for r in self.results[cid])

    @property
    def ok(self) -> bool:
        complete = self.allow_missing or not self.missing
        return complete and all(self._passed(cid) for cid in self.results)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "ok": self.ok,
            "checked": len(self.results),
            "not_provided": self.missing,
            "allow_missing": self.allow_missing,
            "cases": {
                cid: {
                    "passed": self._passed(cid),
                    "missing_outputs": self.incomplete.get(cid, []),
                    "arrays": {r.name: r.as_dict() for r in rs},
                }
                for cid, rs in self.results.items()
            },
        }

    def lines(self, *, verbose: bool = False) -> Iterable[str]:
        """Readable report: failing cases with every array, passing ones in a count, and
        the selected cases without a result (failures, unless `allow_missing`)."""
        failed = 0
        for cid, rs in self.results.items():
            bad = not self._passed(cid)
            failed += bad
            if bad or verbose:
                yield f"{'FAIL' if bad else 'ok  '} {cid}"
                for name in self.incomplete.get(cid, []):
                    yield f"     {name}: MISSING, the results must hold the case's `{name}`"
                for r in rs:
                    yield f"     {r.summary()}"
        if self.missing and not self.allow_missing:
            for cid in self.missing[:SHOWN_MISSING]:
                yield f"FAIL {cid}: no result file"
            if len(self.missing) > SHOWN_MISSING:
                yield f"     ... and {len(self.missing) - SHOWN_MISSING} more with no result file"
        counted = len(self.results) - failed
        if not self.missing:
            yield f"{counted} of {len(self.results)} case(s) match"
        elif self.allow_missing:
            yield (f"{counted} of {len(self.results)} case(s) match; {len(self.missing)} "
                   "selected case(s) have no result and were not checked (--allow-missing)")
        else:
            total = len(self.results) + len(self.missing)
            yield (f"{counted} of {total} selected case(s) match; {len(self.missing)} have no "
                   "result (pass --allow-missing to check only the cases given)")


#: How many selected cases without a result `CheckReport.lines` names one by one.
SHOWN_MISSING = 10


def result_files(obtained: Path, suite: Suite) -> dict[str, str]:
    """The result file of each case of the suite found in `obtained` (name by case id).

    Every entry of `obtained` must be a plain file named like a case of the
    suite (``.safetensors`` or ``.npz``), one per case; anything else is refused,
    named.
    """
    stems = {e["file"].rsplit(".", 1)[0]: cid for cid, e in suite.cases.items()}
    found: dict[str, list[str]] = {}
    strangers = []
    for name, kind in entries(obtained).items():
        stem, dot, ext = name.rpartition(".")
        if kind != "file":
            msg = f"{obtained / name} is a {kind}; results are plain files, one per case"
            raise SuiteError(msg)
        if not dot or f".{ext}" not in (".safetensors", ".npz") or stem not in stems:
            strangers.append(name)
            continue
        found.setdefault(stems[stem], []).append(name)
    if strangers:
        listed = ", ".join(strangers[:5]) + (f" and {len(strangers) - 5} more"
                                             if len(strangers) > 5 else "")
        msg = (f"{obtained} holds file(s) named like no case of {suite.path}: {listed}; "
               "results are one .safetensors or .npz file per case, named like the suite's")
        raise SuiteError(msg)
    for cid, names in found.items():
        if len(names) > 1:
            msg = (f"{obtained} holds {' and '.join(sorted(names))} for case {cid}: which one "
                   "is the result? Keep one")
            raise SuiteError(msg)
    return {cid: names[0] for cid, names in found.items()}


def read_result(path: Path, entry: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """The arrays of the result file `path` for case `entry`, read only after its size
    is checked against what the case's arrays can take (in 8-byte elements, with
    headers), and an npz member's against its array's before it is decompressed.

    Raises
    ------
    SuiteError
        A link or special file, a file larger than the case allows, a copy of
        the case's golden file, or one that cannot be read as safetensors or
        npz; the message names it.
    """
    arrays = {n: (a["dtype"], a["shape"]) for n, a in entry["arrays"].items()}
    limit = file_limit(arrays, widest=True)
    data = read_plain(path, limit=limit, what=f"a result of case {entry['id']}")
    if data is None:
        msg = f"{path} is missing"
        raise SuiteError(msg)
    if hashlib.sha256(data).hexdigest() == entry["file_sha256"]:
        msg = f"{path} is a copy of the golden file of case {entry['id']}, not results"
        raise SuiteError(msg)
    limits = {n: file_limit({n: a}, widest=True) for n, a in arrays.items()}
    try:
        return loads_file(data, path, dtypes={n: entry["dtype"] for n in entry["arrays"]},
                          limits=limits)
    except (CorruptFileError, ValueError) as exc:
        raise SuiteError(str(exc)) from None


def check(
    golden: str | os.PathLike[str],
    obtained: str | os.PathLike[str],
    *,
    select: Sequence[str] | None = None,
    gradients: bool = False,
    allow_missing: bool = False,
) -> CheckReport:
    """Compare files of someone's results with a suite.

    Parameters
    ----------
    golden : path
        The suite directory.
    obtained : path
        A directory of plain files, one ``.safetensors`` or ``.npz`` per case,
        named like the suite's, holding the case's ``output`` and any other
        arrays of the case under the same names.
    select : sequence of str, optional
        Globs over case ids.
    gradients : bool
        Require each result file to hold the case's gradients too (``dq``,
        ``dk``, ``dv`` and ``d_<table>``, computed with the case's
        ``d_output``), for testing a backward pass. Without it, gradients a
        file holds are compared and those it lacks are not required.
    allow_missing : bool
        Accept selected cases that have no result file (they are counted,
        and not checked). By default such a case fails the report, so
        results for part of a suite never pass as the whole.

    Returns
    -------
    CheckReport
        ``ok`` when every selected case has a result and it matches.

    Raises
    ------
    SuiteError
        No file matches a selected case; a file named like no case, two files
        for one case, a directory or link in place of a file, a copy of a
        golden file, results in the suite itself; arrays that cannot be
        compared (wrong name, shape or dtype) or read; a case whose manifest
        entry does not re-derive.

    Examples
    --------
    >>> import tempfile
    >>> from pathlib import Path
    >>> from relpos_ref import golden
    >>> from relpos_ref.golden.fileformat import dumps
    >>> root = Path(tempfile.mkdtemp())
    >>> cases = golden.default_cases().select(["bias/decode-step/*"],
    ...                                       dtypes=["float32", "float64"])
    >>> _ = golden.generate(root / "golden", cases)
    >>> case = golden.load_suite(root / "golden").load(cases[0].id)
    >>> (root / "mine").mkdir()  # a result for the first case only
    >>> _ = (root / "mine" / case.entry["file"]).write_bytes(  # float64: wide enough
    ...     dumps({"output": case.golden("output")}, "safetensors"))
    >>> golden.check(root / "golden", root / "mine").ok
    False
    >>> golden.check(root / "golden", root / "mine", allow_missing=True).ok
    True
    """
    for attempt in range(RETRIES + 1):
        try:
            return _check(golden, Path(obtained), select, gradients, allow_missing,
                          pin=attempt == RETRIES)
        except SuiteReplacedError:
            print(f"relpos-ref: note: {golden} was replaced by relpos-ref generate while the "
                  "results were being checked; checking them against the new suite",
                  file=sys.stderr, flush=True)
    msg = f"{golden} was replaced during the check"  # pragma: no cover - held on the last try
    raise SuiteError(msg)


def _check(golden: str | os.PathLike[str], obtained: Path, select: Sequence[str] | None,
           gradients: bool, allow_missing: bool, *, pin: bool) -> CheckReport:
    suite = load_suite(golden, hold=pin)
    with suite:
        if not obtained.is_dir():
            msg = f"{obtained} is not a directory of results (one file per case)"
            raise SuiteError(msg)
        if obtained.resolve() == suite.path.resolve():
            msg = f"{obtained} is the suite itself; results go in a directory of their own"
            raise SuiteError(msg)
        files = result_files(obtained, suite)
        report = CheckReport(allow_missing=allow_missing)
        errors = []
        selected = suite.select(select)
        for entry in selected:
            cid = entry["id"]
            if cid not in files:
                report.missing.append(cid)
                continue
            path = obtained / files[cid]
            got = read_result(path, entry)
            case = suite.load(cid)
            try:
                report.results[cid] = case.compare(got)
            except ObtainedError as exc:
                errors.append(str(exc))
                continue
            required = [*REQUIRED, *(case.gradient_names if gradients else ())]
            lacking = [name for name in required if name not in got]
            if lacking:
                report.incomplete[cid] = lacking
    if errors:
        raise SuiteError(" | ".join(errors))
    if not report.results:
        example = selected[0]["file"] if selected else next(iter(suite.cases.values()))["file"]
        msg = (
            f"{obtained} holds no file named like a selected case of {suite.path} "
            f"(e.g. {example}, or the same name ending in .npz)"
        )
        raise SuiteError(msg)
    return report

