"""Building a golden suite: computing each case, and writing the suite crash-safe.

A suite is a directory with one file per case (named after the case id, ``/``
written as ``__``), ``manifest.json`` and ``manifest.schema.json``. Everything
goes to a sibling directory that is swapped into place only when complete,
under a journal and a lock (`relpos_ref.golden.replace`), so a run killed at
any instant leaves the previous suite or the new one. `relpos_ref.golden.suite`
reads, verifies and checks what this writes.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from .. import __version__
from . import paths, replace
from .cases import Case
from .dtypes import dtype_name
from .fileformat import EXTENSIONS, FORMATS, array_sha256, dumps
from .manifest import FORMAT_VERSION, MANIFEST, SCHEMA, render, schema_path
from .paths import SuiteError, entries
from .pipeline import golden_arrays, is_gradient, naive_arrays, naive_method
from .progress import Progress
from .tolerance import RULE, derive_tolerance, naive_environment

__all__ = [
    "GOLDEN_BACKENDS",
    "GenerateResult",
    "GoldenBackend",
    "SuiteError",
    "build_case",
    "generate",
    "golden_backend",
    "goldens_on",
]

GOLDEN_BACKENDS = ("numpy", "torch", "jax", "cupy")
NAIVE_PIPELINE = (
    "NumPy; method='efficient' where the scheme has it; q k^T and w v as elementwise "
    "products summed with numpy.sum; every stage (position, bias, "
    "logits, weights, output) stored in the dtype under test; float32/float64 computed in "
    "that dtype, float16/bfloat16 computed in float32 and rounded to 16 bits after each stage; "
    "the gradients from the scheme's specified backward pass in the same arithmetic on the "
    "stored inputs and d_output, each stored in the dtype under test"
)


# -- computing one case -------------------------------------------------------


@dataclass(frozen=True)
class GoldenBackend:
    name: str
    namespace: Any = None
    from_numpy: Callable[[np.ndarray], Any] | None = None
    to_numpy: Callable[[Any], np.ndarray] | None = None
    version: str | None = None


def golden_backend(name: str) -> GoldenBackend:
    if name not in GOLDEN_BACKENDS:
        msg = f"`backend` must be one of {', '.join(GOLDEN_BACKENDS)}, got {name!r}"
        raise SuiteError(msg)
    if name == "numpy":
        return GoldenBackend("numpy")
    from .. import backends

    adapter = backends.get(name)
    reason = adapter.unavailable_reason()
    if reason is not None:
        msg = f"backend {name!r} cannot run here: {reason}"
        raise SuiteError(msg)
    if name == "jax":  # goldens are float64
        import jax

        jax.config.update("jax_enable_x64", True)
    return GoldenBackend(
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


def goldens_on(case: Case, inputs: Mapping[str, np.ndarray], backend: GoldenBackend, *,
               d_output: np.ndarray | None = None) -> dict:
    return golden_arrays(
        case,
        inputs,
        d_output=d_output,
        namespace=backend.namespace,
        from_numpy=backend.from_numpy,
        to_numpy=backend.to_numpy,
    )


def build_case(case: Case, *, fmt: str, backend: GoldenBackend) -> tuple[bytes, dict[str, Any]]:
    """Compute `case`: the bytes of its file and its manifest entry.

    The file holds the inputs (role ``input``), the output's cotangent
    ``d_output`` (role ``cotangent``), the float64 goldens of the forward
    stages and of the gradients (role ``golden``) and the integer
    intermediates (role ``index``); a decode case, its inputs and the
    ``weights`` and ``output`` of its calls (`relpos_ref.golden.decode`).
    """
    inputs = case.inputs()
    d_output = case.d_output() if case.kind == "forward" else None
    goldens = goldens_on(case, inputs, backend, d_output=d_output)
    naive = naive_arrays(case, inputs, d_output=d_output)
    arrays: dict[str, np.ndarray] = {}
    described: dict[str, Any] = {}
    for name, a in inputs.items():
        arrays[name] = a
        described[name] = {"role": "input"}
    if d_output is not None:
        arrays["d_output"] = d_output
        described["d_output"] = {"role": "cotangent"}
    for name, a in goldens.items():
        arrays[name] = a
        if a.dtype.kind == "f":
            tol = derive_tolerance(a, naive[name], case.dtype, gradient=is_gradient(name))
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
        "kind": case.kind,
        "scheme": case.scheme,
        "variant": case.variant,
        "params": p,
        "scale": p["scale"],
        "dtype": case.dtype,
        "seed": case.seed,
        "naive_method": naive_method(case),
        "file": case.file_stem + EXTENSIONS[fmt],
        "file_sha256": hashlib.sha256(data).hexdigest(),
        "arrays": described,
    }
    return data, entry


def _generator(backend: GoldenBackend) -> dict[str, Any]:
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
        "naive_environment": naive_environment(),
    }


# -- generate -----------------------------------------------------------------


@dataclass(frozen=True)
class GenerateResult:
    """What `generate` did: ``status`` is ``"written"``, ``"replaced"`` or ``"unchanged"``.

    ``recovered`` says what was finished or undone of an earlier run that
    was killed (`replace.recover`), or is ``None``.
    """

    path: Path
    cases: int
    bytes: int
    status: str
    recovered: str | None = None


def _same_tree(new: Path, out: Path) -> bool:
    # Whether the existing suite `out` holds the same plain files as `new`, byte for byte;
    # a file of `out` is read only up to the size of its counterpart (links not followed).
    fa, fb = entries(new), entries(out)
    if fa != fb or any(kind != "file" for kind in fa.values()):
        return False
    return _same_files(new, out, fa)


def _same_files(new: Path, out: Path, names: Iterable[str]) -> bool:
    # Whether each of `names` in `out` is a plain file with the bytes of its file in `new`
    for name in names:
        want = (new / name).read_bytes()
        try:
            have = paths.read_plain(out / name, limit=len(want), what="the new suite's file")
        except SuiteError:
            return False
        if have != want:
            return False
    return True


def generate(
    out: str | os.PathLike[str],
    cases: Sequence[Case],
    *,
    fmt: str = "safetensors",
    backend: str = "numpy",
    force: bool = False,
    progress: Progress | None = None,
) -> GenerateResult:
    """Write `cases` as a suite in directory `out`, crash-safe.

    The suite is built beside `out` and swapped in by `replace.install`:
    whenever the run dies, `out` holds the previous suite or the new one,
    or the next `generate`, `verify`, `check` or plugin run finishes or
    undoes the swap (`replace.recover`). A second run on the same `out` at
    the same time is refused, with the reason.

    Parameters
    ----------
    out : path
        The suite directory. If it exists and holds something other than
        this exact suite, it is replaced only with ``force=True``. Not a
        symbolic link, not the current directory or one of its parents.
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
    be = golden_backend(backend)
    given = Path(out)
    out = replace.check_out(out)
    with replace.locked(out):
        recovered = replace.recover(out)
        existing = out.is_dir() and any(out.iterdir())
        if existing and not force and entries(out).get(MANIFEST) != "file":
            msg = (
                f"{given} is not empty and holds no golden suite; choose another --out "
                "or pass --force to replace its contents"
            )
            raise SuiteError(msg)
        tmp = replace.new_directory(out, "tmp")
        try:
            total, count = _write_suite(tmp, cases, fmt, be, progress)
            status = _install(tmp, out, existing=existing, force=force)
        finally:
            if tmp.exists() and not replace.journaled(out):  # a journaled one is complete
                shutil.rmtree(tmp, ignore_errors=True)
    return GenerateResult(given, count, total, status, recovered)


def _write_suite(
    tmp: Path, cases: Sequence[Case], fmt: str, backend: Any, progress: Progress | None
) -> tuple[int, int]:
    """Write every case, the manifest and the schema into `tmp`; (bytes, cases)."""
    written = []
    total = 0
    bar = progress or Progress(len(cases), "generate", enabled=False)
    with bar:
        for case in cases:
            try:
                data, entry = build_case(case, fmt=fmt, backend=backend)
            except (ValueError, TypeError) as exc:
                msg = f"case {case.id}: {exc}"
                raise SuiteError(msg) from exc
            paths.write_new(tmp / entry["file"], data)
            total += len(data)
            written.append(entry)
            bar.advance(case.id)
    manifest = {
        "format_version": FORMAT_VERSION,
        "format": fmt,
        "generator": _generator(backend),
        "tolerance_rule": RULE,
        "naive_pipeline": NAIVE_PIPELINE,
        "cases": written,
    }
    data = render(manifest)
    schema = schema_path().read_bytes()
    paths.write_new(tmp / SCHEMA, schema)
    paths.write_new(tmp / MANIFEST, data)  # last: a directory with a manifest is complete
    return total + len(data) + len(schema), len(written)


def _not_replaced(tmp: Path, out: Path) -> str:
    # why `out` is not replaced without --force: another suite, or this one and more entries
    mine, theirs = entries(tmp), entries(out)
    extra = [name for name in theirs if name not in mine]
    if extra and all(theirs.get(name) == "file" for name in mine) and _same_files(tmp, out, mine):
        shown = ", ".join(extra[:3]) + (f" and {len(extra) - 3} more" if len(extra) > 3 else "")
        return (f"{out} holds this suite and entries of its own ({shown}); --force would "
                "replace the whole directory, deleting them: move them out first, or choose "
                "another --out")
    return (f"{out} already holds a different golden suite; pass --force to replace it, "
            "or choose another --out")


def _install(tmp: Path, out: Path, *, existing: bool, force: bool) -> str:
    """Swap the finished suite `tmp` into `out`; the status for `GenerateResult`."""
    if existing and _same_tree(tmp, out):
        return "unchanged"
    if existing and not force:
        raise SuiteError(_not_replaced(tmp, out))
    replace.install(tmp, out)
    return "replaced" if existing else "written"
