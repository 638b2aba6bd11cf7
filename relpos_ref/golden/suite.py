"""Reading, verifying and checking a golden suite on disk.

`relpos_ref.golden.build` writes a suite; this module reads it back
(`load_suite`, `Suite`, `GoldenCase`), verifies it against its hashes and a
recomputation (`verify`) and compares a user's results with it (`check`).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .build import (
    GOLDEN_BACKENDS,
    GenerateResult,
    GoldenBackend,
    SuiteError,
    generate,
    golden_backend,
    goldens_on,
    suite_files,
)
from .cases import Case, select_ids
from .compare import ArrayResult, ObtainedError, compare_arrays
from .dtypes import ulp
from .fileformat import CorruptFileError, array_sha256, load
from .manifest import (
    MANIFEST,
    SCHEMA,
    ManifestError,
    parse,
    schema_path,
)
from .progress import Progress

__all__ = [
    "GOLDEN_BACKENDS",
    "CheckReport",
    "GenerateResult",
    "GoldenCase",
    "Suite",
    "SuiteError",
    "VerifyReport",
    "check",
    "generate",
    "load_suite",
    "verify",
]

#: Recomputed float64 goldens must agree within this many float64 ulps of max|golden|.
RECOMPUTE_ULPS = 64


# -- reading a suite ----------------------------------------------------------


@dataclass(frozen=True)
class GoldenCase:
    """One case of a suite on disk: its manifest entry and its arrays.

    Attributes
    ----------
    entry : dict
        The manifest entry (``id``, ``scheme``, ``params``, ``scale``,
        ``dtype``, ``arrays`` with roles and tolerances, ...).
    arrays : dict of ndarray
        Every stored array by name.
    """

    entry: dict[str, Any]
    arrays: dict[str, np.ndarray]

    @property
    def id(self) -> str:
        return self.entry["id"]

    @property
    def scheme(self) -> str:
        return self.entry["scheme"]

    @property
    def params(self) -> dict[str, Any]:
        return dict(self.entry["params"])

    @property
    def dtype(self) -> str:
        return self.entry["dtype"]

    @property
    def scale(self) -> float:
        return float(self.entry["scale"])

    def _role(self, *roles: str) -> dict[str, np.ndarray]:
        return {
            n: a for n, a in self.arrays.items() if self.entry["arrays"][n]["role"] in roles
        }

    @property
    def inputs(self) -> dict[str, np.ndarray]:
        """The inputs in the dtype under test (``mask`` is bool)."""
        return self._role("input")

    @property
    def expected(self) -> dict[str, np.ndarray]:
        """The goldens (float64) and the exact integer/bool intermediates."""
        return self._role("golden", "index")

    def tolerance(self, name: str) -> dict[str, Any]:
        """The stored tolerance of golden array `name` (``atol`` 0 for exact arrays)."""
        info = self.entry["arrays"][name]
        if info["role"] == "golden":
            return dict(info["tolerance"])
        return {"atol": 0.0, "rtol": 0.0, "e_max": 0.0}

    def compare(self, outputs: Mapping[str, Any]) -> list[ArrayResult]:
        """Compare `outputs` (any subset of the arrays, by name) with this case."""
        return compare_arrays(self.entry, self.arrays, outputs)


class Suite:
    """A suite directory with a checked manifest.

    Use `load_suite`; `cases` maps each case id to its manifest entry,
    `select` lists entries by id globs, and `load` reads one case after
    checking its file's SHA-256.
    """

    def __init__(self, path: Path, manifest: dict[str, Any]) -> None:
        self.path = path
        self.manifest = manifest
        self.cases = {c["id"]: c for c in manifest["cases"]}

    def select(self, patterns: Sequence[str] | None = None) -> list[dict[str, Any]]:
        """Entries whose id matches any of the globs (all when none is given)."""
        entries = list(self.cases.values())
        if not patterns:
            return entries
        try:
            keep = select_ids(list(self.cases), patterns, hint=f"the suite is {self.path}")
        except ValueError as exc:
            raise SuiteError(str(exc)) from None
        return [e for e in entries if e["id"] in keep]

    def load(self, case_id: str) -> GoldenCase:
        """Read case `case_id`, checking its file hash first."""
        if case_id not in self.cases:
            msg = f"{self.path} has no case {case_id!r}"
            raise SuiteError(msg)
        entry = self.cases[case_id]
        path = self.path / entry["file"]
        if not path.is_file():
            msg = f"{path} is missing; run `relpos-ref verify {self.path}`"
            raise SuiteError(msg)
        data = path.read_bytes()
        if hashlib.sha256(data).hexdigest() != entry["file_sha256"]:
            msg = f"{path} does not match its SHA-256 in the manifest; regenerate the suite"
            raise SuiteError(msg)
        dtypes = {n: a["dtype"] for n, a in entry["arrays"].items()}
        return GoldenCase(entry, load(path, dtypes=dtypes))


def load_suite(path: str | os.PathLike[str]) -> Suite:
    """Open a suite directory, checking its manifest (structure, digest, version)."""
    path = Path(path)
    if not path.is_dir():
        msg = f"{path} is not a directory; generate one with `relpos-ref generate --out {path}`"
        raise SuiteError(msg)
    mpath = path / MANIFEST
    if not mpath.is_file():
        msg = f"{path} has no {MANIFEST}; is it a golden suite?"
        raise SuiteError(msg)
    try:
        manifest = parse(mpath.read_bytes(), where=str(mpath))
    except ManifestError as exc:
        raise SuiteError(str(exc)) from None
    return Suite(path, manifest)


# -- verify -------------------------------------------------------------------


@dataclass
class VerifyReport:
    """Problems found by `verify` (empty when the suite is intact)."""

    path: Path
    cases: int = 0
    arrays: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def verify(
    path: str | os.PathLike[str], *, backend: str = "numpy", progress: Progress | None = None
) -> VerifyReport:
    """Check a suite: hashes first, then recompute every case and compare.

    1. The manifest parses, has the supported ``format_version``, its digest
       matches and it is in canonical form (no edits by hand).
    2. The directory holds exactly the manifest, the schema and one file per
       case: missing and extra files are reported.
    3. Each file's SHA-256, then each array's name, dtype, shape and SHA-256.
    4. Each case is rebuilt from its entry: the id, the inputs (bit for bit),
       the integer intermediates (exactly), the float64 goldens (within
       ``RECOMPUTE_ULPS`` float64 ulps of ``max|golden|``) and each tolerance
       against the rule applied to its stored inputs.
    """
    suite = load_suite(path)
    report = VerifyReport(suite.path)
    be = golden_backend(backend)
    expected = {MANIFEST, SCHEMA} | {e["file"] for e in suite.cases.values()}
    present = set(suite_files(suite.path))
    report.problems += [f"missing file: {n}" for n in sorted(expected - present)]
    report.problems += [f"unexpected file: {n}" for n in sorted(present - expected)]
    if SCHEMA in present and (suite.path / SCHEMA).read_bytes() != schema_path().read_bytes():
        report.problems.append(f"{SCHEMA} differs from the schema this relpos-ref publishes")
    entries = list(suite.cases.values())
    bar = progress or Progress(len(entries), "verify", enabled=False)
    with bar:
        for entry in entries:
            report.cases += 1
            report.problems += _verify_case(suite, entry, be, report)
            bar.advance(entry["id"])
    return report


def _verify_case(
    suite: Suite, entry: dict[str, Any], be: GoldenBackend, report: VerifyReport
) -> list[str]:
    cid = entry["id"]
    fpath = suite.path / entry["file"]
    if not fpath.is_file():
        return []  # reported as a missing file
    data = fpath.read_bytes()
    problems = []
    if hashlib.sha256(data).hexdigest() != entry["file_sha256"]:
        problems.append(f"{entry['file']}: SHA-256 differs from the manifest (file changed)")
    try:
        stored = load(fpath, dtypes={n: a["dtype"] for n, a in entry["arrays"].items()})
    except (CorruptFileError, ValueError) as exc:
        return [*problems, str(exc)]
    if stored.keys() != entry["arrays"].keys():
        problems.append(
            f"{cid}: arrays {sorted(stored)} differ from the manifest's {sorted(entry['arrays'])}"
        )
        return problems
    for name, a in stored.items():
        info = entry["arrays"][name]
        report.arrays += 1
        if a.dtype.name != info["dtype"] or list(a.shape) != info["shape"]:
            problems.append(f"{cid}: `{name}` is {a.dtype.name} {list(a.shape)}, manifest says "
                            f"{info['dtype']} {info['shape']}")
        elif array_sha256(a) != info["sha256"]:
            problems.append(f"{cid}: `{name}` SHA-256 differs from the manifest (data changed)")
    if problems:
        return problems
    return _recompute(entry, stored, be)


def _recompute(
    entry: dict[str, Any], stored: dict[str, np.ndarray], be: GoldenBackend
) -> list[str]:
    cid = entry["id"]
    try:
        case = Case.make(
            entry["scheme"], entry["variant"], dtype=entry["dtype"], seed=entry["seed"],
            **entry["params"],
        )
    except (ValueError, TypeError) as exc:
        return [f"{cid}: cannot rebuild the case from the manifest ({exc})"]
    if case.id != cid:
        return [f"{cid}: the parameters describe case {case.id}, not this id"]
    problems = []
    inputs = case.inputs()
    for name, a in inputs.items():
        if name not in stored or array_sha256(a) != array_sha256(stored[name]):
            problems.append(f"{cid}: input `{name}` differs from its regeneration from the seed")
    if problems:
        return problems
    fresh = goldens_on(case, inputs, be)
    for name, a in fresh.items():
        info = entry["arrays"].get(name)
        if info is None:
            problems.append(f"{cid}: recomputation gives `{name}`, which the file lacks")
            continue
        want = stored[name]
        if info["role"] == "index":
            if not np.array_equal(a, want):
                problems.append(f"{cid}: `{name}` differs from its recomputation")
            continue
        top = float(np.abs(want).max()) if want.size else 0.0
        limit = RECOMPUTE_ULPS * ulp(top, "float64")
        diff = float(np.abs(a - want).max()) if want.size else 0.0
        if not diff <= limit:
            problems.append(
                f"{cid}: `{name}` differs from its recomputation by {diff:.3g} "
                f"(allowed {limit:.3g})"
            )
        tol = info["tolerance"]
        rule = max(tol["k"] * tol["e_max"], 2.0 * ulp(top, case.dtype))
        if tol["atol"] != rule or tol["max_abs_golden"] != top:
            problems.append(f"{cid}: `{name}` tolerance does not follow the rule from its inputs")
    return problems


# -- check --------------------------------------------------------------------


@dataclass
class CheckReport:
    """Results of `check`: per case, the array comparisons; cases without a file are skipped."""

    results: dict[str, list[ArrayResult]] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(r.passed for rs in self.results.values() for r in rs)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "ok": self.ok,
            "checked": len(self.results),
            "not_provided": self.missing,
            "cases": {
                cid: {
                    "passed": all(r.passed for r in rs),
                    "arrays": {r.name: r.as_dict() for r in rs},
                }
                for cid, rs in self.results.items()
            },
        }

    def lines(self, *, verbose: bool = False) -> Iterable[str]:
        """Readable report: failing cases with every array, passing ones in a count."""
        failed = 0
        for cid, rs in self.results.items():
            bad = not all(r.passed for r in rs)
            failed += bad
            if bad or verbose:
                yield f"{'FAIL' if bad else 'ok  '} {cid}"
                for r in rs:
                    yield f"     {r.summary()}"
        yield (
            f"{len(self.results) - failed} of {len(self.results)} case(s) match"
            + (f"; {len(self.missing)} case(s) not provided" if self.missing else "")
        )


def _obtained_file(obtained: Path, entry: dict[str, Any]) -> Path | None:
    stem = entry["file"].rsplit(".", 1)[0]
    for ext in (".safetensors", ".npz"):
        candidate = obtained / (stem + ext)
        if candidate.is_file():
            return candidate
    return None


def check(
    golden: str | os.PathLike[str],
    obtained: str | os.PathLike[str],
    *,
    select: Sequence[str] | None = None,
) -> CheckReport:
    """Compare files of someone's results with a suite.

    Parameters
    ----------
    golden : path
        The suite directory.
    obtained : path
        A directory with one ``.safetensors`` or ``.npz`` file per case,
        named like the suite's, holding any subset of the case's arrays under
        the same names.
    select : sequence of str, optional
        Globs over case ids.

    Raises
    ------
    SuiteError
        No obtained file matches a case, or arrays cannot be compared
        (wrong name, shape or dtype) or read.
    """
    suite = load_suite(golden)
    obtained = Path(obtained)
    if not obtained.is_dir():
        msg = f"{obtained} is not a directory of results (one file per case)"
        raise SuiteError(msg)
    report = CheckReport()
    errors = []
    for entry in suite.select(select):
        path = _obtained_file(obtained, entry)
        if path is None:
            report.missing.append(entry["id"])
            continue
        case = suite.load(entry["id"])
        try:
            got = load(path, dtypes={n: entry["dtype"] for n in entry["arrays"]})
            report.results[entry["id"]] = case.compare(got)
        except (ObtainedError, CorruptFileError) as exc:
            errors.append(str(exc))
    if errors:
        raise SuiteError(" | ".join(errors))
    if not report.results:
        example = next(iter(suite.select(select)))["file"]
        msg = (
            f"{obtained} holds no file named like a case of {suite.path} "
            f"(e.g. {example}, or the same name ending in .npz)"
        )
        raise SuiteError(msg)
    return report
