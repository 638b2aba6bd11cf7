"""Generating, verifying and checking a golden suite on disk.

A suite is a directory with one file per case (named after the case id, ``/``
written as ``__``), ``manifest.json`` and ``manifest.schema.json``. It is
written atomically: everything goes to a temporary sibling directory that is
renamed into place only when complete, so an interrupted run leaves the
previous state untouched.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from .. import __version__
from ..attention import default_scale
from .cases import Case, select_ids
from .compare import ArrayResult, ObtainedError, compare_arrays
from .dtypes import dtype_name, ulp
from .fileformat import EXTENSIONS, FORMATS, CorruptFileError, array_sha256, dumps, load
from .manifest import (
    FORMAT_VERSION,
    MANIFEST,
    SCHEMA,
    ManifestError,
    parse,
    render,
    schema_path,
)
from .pipeline import golden_arrays, naive_arrays, naive_method
from .progress import Progress
from .tolerance import RULE, derive_tolerance

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

GOLDEN_BACKENDS = ("numpy", "torch", "jax", "cupy")
#: Recomputed float64 goldens must agree within this many float64 ulps of max|golden|.
RECOMPUTE_ULPS = 64
NAIVE_PIPELINE = (
    "NumPy; method='efficient' where the scheme has it; q k^T and w v as elementwise "
    "products summed with numpy.sum; every stage (position, bias, "
    "logits, weights, output) stored in the dtype under test; float32/float64 computed in "
    "that dtype, float16/bfloat16 computed in float32 and rounded to 16 bits after each stage"
)


class SuiteError(ValueError):
    """A problem with a suite directory or a request on it, said in one line."""


# -- computing one case -------------------------------------------------------


@dataclass(frozen=True)
class _Backend:
    name: str
    namespace: Any = None
    from_numpy: Callable[[np.ndarray], Any] | None = None
    to_numpy: Callable[[Any], np.ndarray] | None = None
    version: str | None = None


def _backend(name: str) -> _Backend:
    if name not in GOLDEN_BACKENDS:
        msg = f"`backend` must be one of {', '.join(GOLDEN_BACKENDS)}, got {name!r}"
        raise SuiteError(msg)
    if name == "numpy":
        return _Backend("numpy")
    from .. import backends

    adapter = backends.get(name)
    reason = adapter.unavailable_reason()
    if reason is not None:
        msg = f"backend {name!r} cannot run here: {reason}"
        raise SuiteError(msg)
    if name == "jax":  # goldens are float64
        import jax

        jax.config.update("jax_enable_x64", True)
    return _Backend(
        name,
        adapter.namespace(),
        adapter.from_numpy,
        adapter.to_numpy,
        metadata.version({"torch": "torch", "jax": "jax", "cupy": _cupy_dist()}[name]),
    )


def _cupy_dist() -> str:
    for dist in ("cupy", "cupy-cuda12x", "cupy-cuda13x", "cupy-cuda11x"):
        try:
            metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
        return dist
    return "cupy"


def _goldens(case: Case, inputs: Mapping[str, np.ndarray], backend: _Backend) -> dict:
    return golden_arrays(
        case,
        inputs,
        namespace=backend.namespace,
        from_numpy=backend.from_numpy,
        to_numpy=backend.to_numpy,
    )


def build_case(case: Case, *, fmt: str, backend: _Backend) -> tuple[bytes, dict[str, Any]]:
    """Compute `case`: the bytes of its file and its manifest entry."""
    inputs = case.inputs()
    goldens = _goldens(case, inputs, backend)
    naive = naive_arrays(case, inputs)
    arrays: dict[str, np.ndarray] = {}
    described: dict[str, Any] = {}
    for name, a in inputs.items():
        arrays[name] = a
        described[name] = {"role": "input"}
    for name, a in goldens.items():
        arrays[name] = a
        if a.dtype.kind == "f":
            tol = derive_tolerance(a, naive[name], case.dtype)
            described[name] = {"role": "golden", "tolerance": tol}
        else:
            described[name] = {"role": "index"}
    for name, a in arrays.items():
        described[name].update(
            dtype=dtype_name(a.dtype), shape=[int(s) for s in a.shape], sha256=array_sha256(a)
        )
    data = dumps(arrays, fmt)
    p = case.parameters
    entry = {
        "id": case.id,
        "scheme": case.scheme,
        "variant": case.variant,
        "params": p,
        "scale": default_scale(p["d"], p["scale"]),
        "dtype": case.dtype,
        "seed": case.seed,
        "naive_method": naive_method(case),
        "file": case.file_stem + EXTENSIONS[fmt],
        "file_sha256": hashlib.sha256(data).hexdigest(),
        "arrays": described,
    }
    return data, entry


def _generator(backend: _Backend) -> dict[str, Any]:
    libraries = {}
    for dist in ("numpy", "array-api-compat", "ml_dtypes"):
        try:
            libraries[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            libraries[dist] = "not installed"
    if backend.version is not None:
        libraries[backend.name] = backend.version
    return {
        "name": "relpos-ref",
        "version": __version__,
        "backend": backend.name,
        "python": platform.python_version(),
        "libraries": libraries,
    }


# -- generate -----------------------------------------------------------------


@dataclass(frozen=True)
class GenerateResult:
    """What `generate` did: ``status`` is ``"written"``, ``"replaced"`` or ``"unchanged"``."""

    path: Path
    cases: int
    bytes: int
    status: str


def _files(root: Path) -> dict[str, Path]:
    return {
        p.relative_to(root).as_posix(): p
        for p in sorted(root.rglob("*"))
        if p.is_file() or p.is_symlink()
    }


def _same_tree(a: Path, b: Path) -> bool:
    fa, fb = _files(a), _files(b)
    return fa.keys() == fb.keys() and all(
        fa[n].read_bytes() == fb[n].read_bytes() for n in fa
    )


def generate(
    out: str | os.PathLike[str],
    cases: Sequence[Case],
    *,
    fmt: str = "safetensors",
    backend: str = "numpy",
    force: bool = False,
    progress: Progress | None = None,
) -> GenerateResult:
    """Write `cases` as a suite in directory `out`, atomically.

    Parameters
    ----------
    out : path
        The suite directory. If it exists and holds something other than
        this exact suite, it is replaced only with ``force=True``.
    cases : sequence of Case
        What to generate; duplicate ids are refused.
    fmt : {"safetensors", "npz"}
    backend : {"numpy", "torch", "jax", "cupy"}
        Where the float64 goldens are computed (the naive pipeline is NumPy).
    force : bool
        Replace a different existing suite.
    progress : Progress, optional

    Returns
    -------
    GenerateResult
    """
    if fmt not in FORMATS:
        msg = f"`format` must be one of {', '.join(FORMATS)}, got {fmt!r}"
        raise SuiteError(msg)
    ids = [c.id for c in cases]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        msg = f"duplicate case id {dup!r}"
        raise SuiteError(msg)
    if not cases:
        msg = "no case to generate"
        raise SuiteError(msg)
    be = _backend(backend)
    out = Path(out)
    if out.exists() and not out.is_dir():
        msg = f"{out} exists and is not a directory; choose another --out"
        raise SuiteError(msg)
    parent = out.absolute().parent
    if not parent.is_dir():
        msg = f"cannot write {out}: its parent directory {parent} does not exist"
        raise SuiteError(msg)
    existing = out.is_dir() and any(out.iterdir())
    if existing and not force and not (out / MANIFEST).is_file():
        msg = (
            f"{out} is not empty and holds no golden suite; choose another --out "
            "or pass --force to replace its contents"
        )
        raise SuiteError(msg)
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=parent))
    except OSError as exc:
        msg = f"cannot write to {parent} ({exc.strerror}); choose another --out"
        raise SuiteError(msg) from None
    try:
        entries = []
        total = 0
        bar = progress or Progress(len(cases), "generate", enabled=False)
        with bar:
            for case in cases:
                try:
                    data, entry = build_case(case, fmt=fmt, backend=be)
                except (ValueError, TypeError) as exc:
                    msg = f"case {case.id}: {exc}"
                    raise SuiteError(msg) from exc
                (tmp / entry["file"]).write_bytes(data)
                total += len(data)
                entries.append(entry)
                bar.advance(case.id)
        manifest = {
            "format_version": FORMAT_VERSION,
            "format": fmt,
            "generator": _generator(be),
            "tolerance_rule": RULE,
            "naive_pipeline": NAIVE_PIPELINE,
            "cases": entries,
        }
        data = render(manifest)
        (tmp / MANIFEST).write_bytes(data)
        shutil.copyfile(schema_path(), tmp / SCHEMA)
        total += len(data) + (tmp / SCHEMA).stat().st_size
        status = _install(tmp, out, existing=existing, force=force)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return GenerateResult(out, len(entries), total, status)


def _install(tmp: Path, out: Path, *, existing: bool, force: bool) -> str:
    """Move the finished suite `tmp` to `out`; never leaves `out` half-written."""
    if existing and _same_tree(tmp, out):
        return "unchanged"
    if existing and not force:
        msg = (
            f"{out} already holds a different golden suite; pass --force to replace it, "
            "or choose another --out"
        )
        raise SuiteError(msg)
    if out.is_dir() and not existing:
        out.rmdir()
    if not existing:
        tmp.rename(out)
        return "written"
    old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.absolute().parent))
    old.rmdir()
    out.rename(old)
    try:
        tmp.rename(out)
    except BaseException:
        old.rename(out)
        raise
    shutil.rmtree(old, ignore_errors=True)
    return "replaced"


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
    be = _backend(backend)
    expected = {MANIFEST, SCHEMA} | {e["file"] for e in suite.cases.values()}
    present = set(_files(suite.path))
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
    suite: Suite, entry: dict[str, Any], be: _Backend, report: VerifyReport
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


def _recompute(entry: dict[str, Any], stored: dict[str, np.ndarray], be: _Backend) -> list[str]:
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
    fresh = _goldens(case, inputs, be)
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
