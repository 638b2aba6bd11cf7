"""Reading, verifying and checking a golden suite on disk.

`relpos_ref.golden.build` writes a suite; this module reads it back
(`load_suite`, `Suite`, `GoldenCase`), verifies it against its hashes and a
recomputation (`verify`) and compares a user's results with it (`check`).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .build import (
    GOLDEN_BACKENDS,
    NAIVE_PIPELINE,
    GenerateResult,
    generate,
    golden_backend,
    goldens_on,
)
from .cases import Case, select_ids
from .compare import ArrayResult, ObtainedError, compare_arrays
from .dtypes import ulp
from .fileformat import CorruptFileError, array_sha256, loads_file
from .manifest import MANIFEST, SCHEMA, ManifestError, parse, schema_path
from .paths import SuiteError, entries, plain_file
from .pipeline import call_keywords, is_gradient, naive_arrays, naive_method
from .progress import Progress
from .replace import recover_if_needed
from .tolerance import RULE, derive_tolerance, ulp_multiple

__all__ = [
    "GOLDEN_BACKENDS",
    "CheckReport",
    "GenerateResult",
    "GoldenCase",
    "Suite",
    "SuiteError",
    "VerifyReport",
    "case_problems",
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

    def __repr__(self) -> str:
        return f"GoldenCase({self.id!r}, arrays: {', '.join(self.arrays)})"

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

    @property
    def kwargs(self) -> dict[str, Any]:
        """The keyword arguments of the scheme's ``relpos_ref.<scheme>_attention`` for this case.

        ``scale`` always; ``causal`` and ``q_offset`` where the scheme takes
        them; and the scheme's options (``beyond``, ``max_distance``,
        ``order``, ...). With `inputs` (the tables by name) they are every
        argument the case was computed with::

            out = my_kernel(**golden_case.inputs, **golden_case.kwargs)
        """
        from .. import catalog

        return call_keywords(catalog.get(self.scheme), self.params)

    def inputs_as(self, library: str, *, device: Any = None,
                  cotangent: bool = False) -> dict[str, Any]:
        """The inputs as arrays of `library` (``"torch"``, ``"jax"``, ``"cupy"``, ``"numpy"``).

        bfloat16 inputs arrive as the library's bfloat16 (``torch.from_numpy``
        refuses them). `device` is the library's device (``"cuda:0"``, a JAX
        device, ...); `cotangent` adds ``d_output`` for a backward pass.

        Examples
        --------
        >>> import tempfile
        >>> from relpos_ref import golden
        >>> out = tempfile.mkdtemp() + "/golden"
        >>> cases = golden.default_cases().select(["bias/clip/*"], dtypes=["bfloat16"])
        >>> _ = golden.generate(out, cases)
        >>> case = golden.load_suite(out).load(cases[0].id)
        >>> x = case.inputs_as("torch", cotangent=True)  # doctest: +SKIP
        >>> x["q"].dtype, sorted(x)  # doctest: +SKIP
        (torch.bfloat16, ['d_output', 'k', 'q', 'table', 'v'])
        >>> sorted(case.inputs_as("numpy"))
        ['k', 'q', 'table', 'v']
        """
        from .. import backends

        adapter = backends.get(library)
        reason = adapter.unavailable_reason()
        if reason is not None:
            msg = f"`library` {library!r} cannot run here: {reason}"
            raise ValueError(msg)
        arrays = dict(self.inputs)
        if cotangent:
            arrays["d_output"] = self.d_output
        return {n: adapter.from_numpy(a, device=device) for n, a in arrays.items()}

    @property
    def d_output(self) -> np.ndarray:
        """The output's cotangent for the gradient goldens, in the dtype under test.

        Run your backward pass with it: ``dq``, ``dk``, ``dv`` and
        ``d_<table>`` are the gradients of the loss whose gradient with
        respect to the output is ``d_output`` (``sum(output * d_output)``).
        """
        return self.arrays["d_output"]

    @property
    def gradient_names(self) -> list[str]:
        """Names of the gradient goldens: ``dq``, ``dk``, ``dv``, then ``d_<table>`` per table."""
        return [n for n, info in self.entry["arrays"].items()
                if info["role"] == "golden" and is_gradient(n)]

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
    checking its file's SHA-256. `recovered` says what `load_suite` finished
    or undid of a `generate` killed while writing this path, or is ``None``.
    """

    def __init__(
        self, path: Path, manifest: dict[str, Any], recovered: str | None = None
    ) -> None:
        self.path = path
        self.manifest = manifest
        self.cases = {c["id"]: c for c in manifest["cases"]}
        self.recovered = recovered

    def select(
        self, patterns: Sequence[str] | None = None, *, option: str = "--select"
    ) -> list[dict[str, Any]]:
        """Entries whose id matches any of the globs (all when none is given).

        A glob that matches no case is a `SuiteError` naming `option`, the
        flag the glob came from.
        """
        entries = list(self.cases.values())
        if not patterns:
            return entries
        example = next(iter(self.cases), None)
        hint = f"{self.path} holds {len(self.cases)} cases, e.g. {example!r}"
        try:
            keep = select_ids(list(self.cases), patterns, hint=hint, option=option)
        except ValueError as exc:
            raise SuiteError(str(exc)) from None
        return [e for e in entries if e["id"] in keep]

    def load(self, case_id: str, *, rederive: bool = True) -> GoldenCase:
        """Read case `case_id`: its file's SHA-256 first, then (by default) a re-derivation.

        `rederive` recomputes what the case claims (`case_problems`): an edit
        of the manifest that keeps its hashes consistent is refused here too,
        so `check` and the pytest plugin never hand a forged scale or
        tolerance to the code under test.
        """
        if case_id not in self.cases:
            msg = f"{self.path} has no case {case_id!r}"
            raise SuiteError(msg)
        entry = self.cases[case_id]
        path = plain_file(self.path, entry["file"])
        if path is None:
            msg = f"{self.path / entry['file']} is missing; run `relpos-ref verify {self.path}`"
            raise SuiteError(msg)
        data = path.read_bytes()
        if hashlib.sha256(data).hexdigest() != entry["file_sha256"]:
            msg = f"{path} does not match its SHA-256 in the manifest; regenerate the suite"
            raise SuiteError(msg)
        try:
            dtypes = {name: array["dtype"] for name, array in entry["arrays"].items()}
            arrays = loads_file(data, path, dtypes=dtypes)
        except (CorruptFileError, ValueError) as exc:
            raise SuiteError(str(exc)) from None
        if rederive:
            problems = case_problems(entry, arrays)
            if problems:
                msg = f"{path}: {problems[0]}" + (
                    f" (and {len(problems) - 1} more; run `relpos-ref verify {self.path}`)"
                    if len(problems) > 1 else "")
                raise SuiteError(msg)
        return GoldenCase(entry, arrays)


def load_suite(path: str | os.PathLike[str]) -> Suite:
    """Open a suite directory, checking its manifest (structure, digest, version, names).

    A `generate` killed while replacing `path` is finished or undone first
    (`relpos_ref.golden.replace.recover`); `Suite.recovered` says so.
    """
    path = Path(path)
    recovered = recover_if_needed(path)
    if not path.is_dir():
        msg = f"{path} is not a directory; generate one with `relpos-ref generate --out {path}`"
        raise SuiteError(msg)
    mpath = plain_file(path, MANIFEST)
    if mpath is None:
        msg = f"{path} has no {MANIFEST}; is it a golden suite?"
        raise SuiteError(msg)
    try:
        manifest = parse(mpath.read_bytes(), where=str(mpath))
    except ManifestError as exc:
        raise SuiteError(str(exc)) from None
    return Suite(path, manifest, recovered)


# -- re-deriving a case --------------------------------------------------------------


def case_problems(
    entry: dict[str, Any], stored: Mapping[str, np.ndarray], *, backend: str = "numpy"
) -> list[str]:
    """What does not follow from the case's own parameters, from scratch.

    The case is rebuilt from its scheme, variant, dtype, seed and parameters
    (a case the library does not know is a problem), and compared with its
    entry and arrays: the id, every parameter, the resolved ``scale``, the
    naive method; the arrays' names, roles and dtypes; the inputs (bit for
    bit from the seed); the integer intermediates (exactly); the float64
    goldens (within `RECOMPUTE_ULPS` ulps); and each tolerance: the rule's
    ``k``, ``rtol``, ``ulp_floor``, ``max_abs_golden`` and ``atol``, and an
    ``e_max`` within a factor of 2 (and one ulp) of the naive pipeline run
    again here.
    """
    cid = entry["id"]
    try:
        case = Case.make(entry["scheme"], entry["variant"], dtype=entry["dtype"],
                         seed=entry["seed"], **entry["params"])
    except (ValueError, TypeError) as exc:
        return [f"{cid}: the library does not know this case ({exc})"]
    problems = []
    if case.id != cid:
        return [f"{cid}: the parameters describe case {case.id}, not this id"]
    params = json.loads(json.dumps(case.parameters))
    for name in sorted(set(params) | set(entry["params"])):
        have, want = entry["params"].get(name, "absent"), params.get(name, "absent")
        if _json(have) != _json(want):  # 4.0 is not 4, 1 is not true
            problems.append(f"{cid}: parameter `{name}` is {have!r}, the case's own is {want!r}")
    if _json(entry.get("scale")) != _json(case.parameters["scale"]):
        problems.append(f"{cid}: scale {entry.get('scale')!r} is not the case's "
                        f"{case.parameters['scale']!r}")
    if entry.get("naive_method") != naive_method(case):
        problems.append(f"{cid}: naive_method {entry.get('naive_method')!r} is not "
                        f"{naive_method(case)!r}")
    inputs = case.inputs()
    d_output = case.d_output()
    fresh = goldens_on(case, inputs, golden_backend(backend), d_output=d_output)
    roles = {**dict.fromkeys(inputs, "input"), "d_output": "cotangent",
             **{n: "golden" if a.dtype.kind == "f" else "index" for n, a in fresh.items()}}
    for name in sorted(set(roles) | set(entry["arrays"]) | set(stored)):
        info = entry["arrays"].get(name)
        if name not in roles or info is None or name not in stored:
            problems.append(f"{cid}: array `{name}` is not one the case has, or is not stored "
                            f"and declared alike")
        elif info["role"] != roles[name]:
            problems.append(f"{cid}: `{name}` is declared {info['role']!r}, it is "
                            f"{roles[name]!r}")
    if problems:
        return problems
    for name, a in {**inputs, "d_output": d_output}.items():
        if array_sha256(a) != array_sha256(stored[name]):
            problems.append(f"{cid}: input `{name}` differs from its regeneration from the seed")
    if problems:
        return problems
    naive = naive_arrays(case, inputs, d_output=d_output)
    for name, a in fresh.items():
        want = stored[name]
        if roles[name] == "index":
            if a.shape != want.shape or not np.array_equal(a, want):
                problems.append(f"{cid}: `{name}` differs from its recomputation")
            continue
        problems += _golden_problems(cid, name, a, want, naive[name], entry["arrays"][name],
                                     case.dtype)
    return problems


def _json(value: Any) -> str:
    # Values compared as their JSON text, so types count (4.0 != 4, 1 != true).
    return json.dumps(value, sort_keys=True)


def _golden_problems(cid: str, name: str, fresh: np.ndarray, want: np.ndarray,
                     naive: np.ndarray, info: Mapping[str, Any], dtype: str) -> list[str]:
    if fresh.shape != want.shape:
        return [f"{cid}: `{name}` has shape {want.shape}, its recomputation {fresh.shape}"]
    top = float(np.abs(want).max()) if want.size else 0.0
    limit = RECOMPUTE_ULPS * ulp(top, "float64")
    diff = float(np.abs(fresh - want).max()) if want.size else 0.0
    problems = []
    if not diff <= limit:
        problems.append(f"{cid}: `{name}` differs from its recomputation by {diff:.3g} "
                        f"(allowed {limit:.3g})")
    gradient = is_gradient(name)
    tol, again = info["tolerance"], derive_tolerance(want, naive, dtype, gradient=gradient)
    slack = ulp(top, dtype)
    plausible = tol["e_max"] <= 2 * again["e_max"] + slack and \
        again["e_max"] <= 2 * tol["e_max"] + slack
    rule = max(tol["k"] * tol["e_max"], ulp_multiple(dtype, gradient=gradient) * ulp(top, dtype))
    if not plausible:
        problems.append(f"{cid}: `{name}` e_max {tol['e_max']:.3g} is not the naive pipeline's "
                        f"({again['e_max']:.3g} here)")
    for key in ("k", "rtol", "ulp_floor", "rule"):
        if tol.get(key) != again[key]:
            problems.append(f"{cid}: `{name}` tolerance field `{key}` is {tol.get(key)!r}, "
                            f"the rule's is {again[key]!r}")
    if tol["atol"] != rule or tol["max_abs_golden"] != top:
        problems.append(f"{cid}: `{name}` tolerance does not follow the rule from its inputs")
    return problems


# -- verify -------------------------------------------------------------------


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
    3. Each file's SHA-256, then each array's name, dtype, shape and SHA-256.
    4. Each case is re-derived (`case_problems`): parameters, scale, roles,
       inputs, intermediates, goldens and tolerances. A case the library
       does not know is reported as such.
    """
    suite = load_suite(path)
    report = VerifyReport(suite.path, recovered=suite.recovered)
    golden_backend(backend)  # an unknown backend is refused before any work
    manifest = suite.manifest
    for key, want in (("tolerance_rule", RULE), ("naive_pipeline", NAIVE_PIPELINE)):
        if manifest.get(key) != want:
            report.problems.append(f"{MANIFEST}: `{key}` is not the one this relpos-ref uses")
    expected = {MANIFEST, SCHEMA} | {e["file"] for e in suite.cases.values()}
    found = entries(suite.path)
    report.problems += [f"missing file: {n}" for n in sorted(expected - set(found))]
    report.problems += [f"unexpected {kind}: {n}" for n, kind in found.items()
                        if n not in expected]
    report.problems += [f"{n} is a {kind}, not a plain file" for n, kind in found.items()
                        if n in expected and kind != "file"]
    if found.get(SCHEMA) == "file" and (suite.path / SCHEMA).read_bytes() != \
            schema_path().read_bytes():
        report.problems.append(f"{SCHEMA} differs from the schema this relpos-ref publishes")
    cases = list(suite.cases.values())
    bar = progress or Progress(len(cases), "verify", enabled=False)
    with bar:
        for entry in cases:
            report.cases += 1
            if found.get(entry["file"]) == "file":
                report.problems += _verify_case(suite, entry, backend, report)
            bar.advance(entry["id"])
    return report


def _verify_case(
    suite: Suite, entry: dict[str, Any], backend: str, report: VerifyReport
) -> list[str]:
    cid = entry["id"]
    data = (suite.path / entry["file"]).read_bytes()
    problems = []
    if hashlib.sha256(data).hexdigest() != entry["file_sha256"]:
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
    return case_problems(entry, stored, backend=backend)


# -- check --------------------------------------------------------------------

#: What a result file must hold for its case to count: the case's output (and, with
#: ``check(..., gradients=True)``, every gradient golden of the case).
REQUIRED = ("output",)


@dataclass
class CheckReport:
    """Results of `check`: per case, the array comparisons and what was missing.

    A case matches only when every array in `REQUIRED` was given and every
    array given is within its tolerance.
    """

    results: dict[str, list[ArrayResult]] = field(default_factory=dict)
    incomplete: dict[str, list[str]] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)

    def _passed(self, cid: str) -> bool:
        return cid not in self.incomplete and all(r.passed for r in self.results[cid])

    @property
    def ok(self) -> bool:
        return all(self._passed(cid) for cid in self.results)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "ok": self.ok,
            "checked": len(self.results),
            "not_provided": self.missing,
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
        """Readable report: failing cases with every array, passing ones in a count."""
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
        yield (
            f"{len(self.results) - failed} of {len(self.results)} case(s) match"
            + (f"; {len(self.missing)} case(s) not provided" if self.missing else "")
        )


def _result_files(obtained: Path, suite: Suite) -> dict[str, str]:
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


def check(
    golden: str | os.PathLike[str],
    obtained: str | os.PathLike[str],
    *,
    select: Sequence[str] | None = None,
    gradients: bool = False,
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

    Raises
    ------
    SuiteError
        No file matches a selected case; a file named like no case, two files
        for one case, a directory or link in place of a file, a copy of a
        golden file, results in the suite itself; arrays that cannot be
        compared (wrong name, shape or dtype) or read; a case whose manifest
        entry does not re-derive.
    """
    suite = load_suite(golden)
    obtained = Path(obtained)
    if not obtained.is_dir():
        msg = f"{obtained} is not a directory of results (one file per case)"
        raise SuiteError(msg)
    if obtained.resolve() == suite.path.resolve():
        msg = f"{obtained} is the suite itself; results go in a directory of their own"
        raise SuiteError(msg)
    files = _result_files(obtained, suite)
    report = CheckReport()
    errors = []
    selected = suite.select(select)
    for entry in selected:
        cid = entry["id"]
        if cid not in files:
            report.missing.append(cid)
            continue
        path = obtained / files[cid]
        data = path.read_bytes()
        if hashlib.sha256(data).hexdigest() == entry["file_sha256"]:
            msg = f"{path} is a copy of the golden file of case {cid}, not results"
            raise SuiteError(msg)
        case = suite.load(cid)
        try:
            got = loads_file(data, path, dtypes={n: entry["dtype"] for n in entry["arrays"]})
            report.results[cid] = case.compare(got)
        except (ObtainedError, CorruptFileError) as exc:
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
