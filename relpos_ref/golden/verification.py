"""Verifying a suite on disk: its files, hashes and a re-derivation of every case.

`verify` is what ``relpos-ref verify`` runs: it reads the suite through
`relpos_ref.golden.Suite` (one open directory, bounded reads, no link
followed), reports every file that is missing, extra, not a plain file, too
large, changed or another case's, and re-derives each case
(`relpos_ref.golden.rederive.case_problems`).
"""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .build import NAIVE_PIPELINE, golden_backend
from .fileformat import CorruptFileError, array_sha256, loads_file
from .manifest import MANIFEST, SCHEMA, schema_path
from .paths import SuiteError
from .progress import Progress
from .rederive import case_problems
from .sharing import RETRIES, SuiteReplacedError
from .suite import Suite, case_file_limit, load_suite
from .tolerance import RULE

__all__ = ["VerifyReport", "verify"]



@dataclass
class VerifyReport:
    """Problems found by `verify` (empty when the suite is intact)."""

    path: Path
    cases: int = 0
    arrays: int = 0
    problems: list[str] = field(default_factory=list)
    recovered: str | None = None

    @property
    def ok(self) -> bool:
        return not self.problems


def verify(
    path: str | os.PathLike[str], *, backend: str = "numpy", progress: Progress | None = None
) -> VerifyReport:
    """Check a suite: its files and hashes, then re-derive every case from scratch.

    1. The manifest parses, has the supported ``format_version``, its digest
       matches, it is in canonical form, and every case's file is the bare
       name its id implies.
    2. The directory holds exactly the manifest, the schema and one plain
       file per case: missing, extra, linked or nested entries are reported.
    3. Each file's size (no larger than its arrays take), SHA-256 (a file
       holding another case's arrays is said to), then each array's name,
       dtype, shape and SHA-256.
    4. Each case is re-derived (`case_problems`): parameters, scale, roles,
       inputs, intermediates, goldens and tolerances. A case the library
       does not know is reported as such.

    A `generate` that replaces the suite meanwhile is waited for, or, when it
    replaced the suite during the run, the new suite is verified from the
    start (said on stderr).
    """
    golden_backend(backend)  # an unknown backend is refused before any work
    for attempt in range(RETRIES + 1):
        try:
            return _verify(path, backend, progress, pin=attempt == RETRIES)
        except SuiteReplacedError:
            print(f"relpos-ref: note: {path} was replaced by relpos-ref generate while it "
                  "was being verified; verifying the new suite", file=sys.stderr, flush=True)
    msg = f"{path} was replaced while being verified"  # pragma: no cover - held on the last try
    raise SuiteError(msg)


def _verify(path: str | os.PathLike[str], backend: str, progress: Progress | None, *,
            pin: bool) -> VerifyReport:
    suite = load_suite(path, hold=pin)
    with suite:
        report = VerifyReport(suite.path, recovered=suite.recovered)
        manifest = suite.manifest
        for key, want in (("tolerance_rule", RULE), ("naive_pipeline", NAIVE_PIPELINE)):
            if manifest.get(key) != want:
                report.problems.append(
                    f"{MANIFEST}: `{key}` is not the one this relpos-ref uses")
        expected = {MANIFEST, SCHEMA} | {e["file"] for e in suite.cases.values()}
        found = suite.listing()
        report.problems += [f"missing file: {n}" for n in sorted(expected - set(found))]
        report.problems += [f"unexpected {kind}: {n}" for n, kind in found.items()
                            if n not in expected]
        report.problems += [f"{n} is a {kind}, not a plain file" for n, kind in found.items()
                            if n in expected and kind != "file"]
        if found.get(SCHEMA) == "file":
            published = schema_path().read_bytes()
            try:
                same = suite.read(SCHEMA, limit=len(published),
                                  what="the published schema") == published
            except SuiteReplacedError:
                raise
            except SuiteError:
                same = False
            if not same:
                report.problems.append(f"{SCHEMA} differs from the schema this relpos-ref "
                                       "publishes")
        owners = {e["file_sha256"]: cid for cid, e in suite.cases.items()}
        cases = list(suite.cases.values())
        bar = progress or Progress(len(cases), "verify", enabled=False)
        with bar:
            for entry in cases:
                report.cases += 1
                if found.get(entry["file"]) == "file":
                    report.problems += _verify_case(suite, entry, backend, report, owners)
                bar.advance(entry["id"])
    return report


def _verify_case(suite: Suite, entry: dict[str, Any], backend: str, report: VerifyReport,
                 owners: Mapping[str, str]) -> list[str]:
    cid = entry["id"]
    try:
        data = suite.read(entry["file"], limit=case_file_limit(entry),
                          what=f"the arrays of case {cid} with their headers")
    except SuiteReplacedError:
        raise
    except SuiteError as exc:
        return [str(exc)]
    if data is None:
        return [f"missing file: {entry['file']}"]
    problems = []
    digest = hashlib.sha256(data).hexdigest()
    if digest != entry["file_sha256"]:
        other = owners.get(digest)
        if other is not None:
            return [f"{entry['file']}: this file holds another case ({other}), not {cid}; "
                    "case files were swapped or copied: regenerate the suite"]
        problems.append(f"{entry['file']}: SHA-256 differs from the manifest (file changed)")
    try:
        stored = loads_file(data, suite.path / entry["file"],
                            dtypes={n: a["dtype"] for n, a in entry["arrays"].items()})
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
    return case_problems(entry, stored, backend=backend, environment=suite.environment)
