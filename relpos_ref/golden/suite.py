"""Reading and verifying a golden suite on disk.

`relpos_ref.golden.build` writes a suite; this module reads it back
(`load_suite`, `Suite`, `GoldenCase`) and verifies it against its hashes and
a re-derivation (`verify`); `relpos_ref.golden.results` compares a user's
results with it (`check`). Every file is read relative to the suite
directory opened once (`relpos_ref.golden.sharing.Reading`), without
following links, and only after its size is checked against what the
manifest allows.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .build import (
    GOLDEN_BACKENDS,
    GenerateResult,
    generate,
)
from .cases import select_ids
from .compare import ArrayResult, compare_arrays
from .decode import DecodeCall, decode_plan
from .fileformat import CorruptFileError, file_limit, loads_file
from .manifest import MANIFEST, MAX_MANIFEST_BYTES, ManifestError, parse
from .paths import SuiteError, entries, read_plain
from .pipeline import call_keywords, is_gradient
from .rederive import Rederived, case_problems
from .rederive import rederive as rederive_case
from .replace import recover_if_needed
from .sharing import Reading

__all__ = [
    "GOLDEN_BACKENDS",
    "GenerateResult",
    "GoldenCase",
    "Suite",
    "SuiteError",
    "case_file_limit",
    "case_problems",
    "generate",
    "load_suite",
]


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
    rederived : Rederived, optional
        What `Suite.load` re-derived (``None`` with ``rederive=False`` or a
        case made by hand): `compare` then checks against the goldens
        recomputed here within the smaller of the stored and re-derived
        tolerances (`limit`).
    """

    entry: dict[str, Any]
    arrays: dict[str, np.ndarray]
    rederived: Rederived | None = field(default=None, repr=False, compare=False)

    def __repr__(self) -> str:
        return f"GoldenCase({self.id!r}, arrays: {', '.join(self.arrays)})"

    @property
    def id(self) -> str:
        return self.entry["id"]

    @property
    def scheme(self) -> str:
        return self.entry["scheme"]

    @property
    def kind(self) -> str:
        """``"forward"`` (one call) or ``"decode"`` (`decode_calls`)."""
        return self.entry.get("kind", "forward")

    def decode_calls(self) -> list[DecodeCall]:
        """A decode case's calls: the prefill, then each step (`relpos_ref.golden.decode`).

        Each call's `~relpos_ref.golden.decode.DecodeCall.inputs` cuts the
        case's inputs (of any library) to its queries and cache, and its
        `~relpos_ref.golden.decode.DecodeCall.kwargs` sets its ``q_offset``;
        their outputs, concatenated on axis -2, are the case's ``output``::

            outs = [my_kernel(**c.inputs(inputs), **c.kwargs(golden_case.kwargs))
                    for c in golden_case.decode_calls()]
        """
        if self.kind != "decode":
            msg = f"case {self.id} is a {self.kind} case, not a decode case"
            raise ValueError(msg)
        p = self.params
        return decode_plan(t_q=p["t_q"], t_k=p["t_k"], steps=p["steps"])

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
        A decode case has none (a `ValueError`).
        """
        if "d_output" not in self.arrays:
            msg = f"case {self.id} is a {self.kind} case: it has no cotangent `d_output`"
            raise ValueError(msg)
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

    def golden(self, name: str) -> np.ndarray:
        """The golden `compare` checks array `name` against: recomputed here for a
        re-derived case (equal to the stored one within 64 float64 ulps), else stored."""
        if self.rederived is not None and name in self.rederived.goldens:
            return self.rederived.goldens[name]
        return self.arrays[name]

    def limit(self, name: str) -> float:
        """The ``atol`` `compare` holds golden `name` to: the stored one, or the smaller of
        it and the one re-derived here (a re-derived case; see ``docs/golden.md``)."""
        if self.rederived is not None and name in self.rederived.limits:
            return self.rederived.limits[name]
        return float(self.tolerance(name)["atol"])

    def compare(self, outputs: Mapping[str, Any]) -> list[ArrayResult]:
        """Compare `outputs` (any subset of the arrays, by name) with this case.

        A re-derived case compares each golden array with the golden
        recomputed here, within `limit`: a result passes only when the
        tolerance this environment derives admits it, whatever the manifest
        says; for the suite's own environment that is exactly its stored test.
        """
        if self.rederived is None:
            return compare_arrays(self.entry, self.arrays, outputs)
        goldens = {**self.arrays, **self.rederived.goldens}
        return compare_arrays(self.entry, goldens, outputs, limits=self.rederived.limits)


class Suite:
    """A suite directory with a checked manifest.

    Use `load_suite`; `cases` maps each case id to its manifest entry,
    `select` lists entries by id globs, and `load` reads one case after
    checking its file's SHA-256. `recovered` says what `load_suite` finished
    or undid of a `generate` killed while writing this path, or is ``None``.
    """

    def __init__(
        self, path: Path, manifest: dict[str, Any], recovered: str | None = None,
        reading: Reading | None = None,
    ) -> None:
        self.path = path
        self.manifest = manifest
        self.cases = {c["id"]: c for c in manifest["cases"]}
        self.recovered = recovered
        self._reading = reading

    def read(self, name: str, *, limit: int, what: str) -> bytes | None:
        """The bytes of the suite's file `name` (``None`` when absent), read from the
        directory `load_suite` opened, after its size is checked against `limit`.

        Raises
        ------
        SuiteError
            A link, directory or special file; more than `limit` bytes; or
            (`relpos_ref.golden.sharing.SuiteReplacedError`) the suite was
            replaced since it was opened.
        """
        if self._reading is None:
            return read_plain(self.path / name, limit=limit, what=what)
        with self._reading.hold() as fd:
            return read_plain(self.path / name, limit=limit, what=what, dir_fd=fd)

    def listing(self) -> dict[str, str]:
        """The suite directory's entries and their kinds (`relpos_ref.golden.paths.entries`)."""
        if self._reading is None:
            return entries(self.path)
        with self._reading.hold() as fd:
            return entries(fd)

    def close(self) -> None:
        """Close the suite directory (reading from it afterwards is refused)."""
        if self._reading is not None:
            self._reading.close()

    def __enter__(self) -> Suite:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

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
        path = self.path / entry["file"]
        data = self.read(entry["file"], limit=case_file_limit(entry),
                         what=f"the arrays of case {case_id} with their headers")
        if data is None:
            msg = f"{path} is missing; run `relpos-ref verify {self.path}`"
            raise SuiteError(msg)
        digest = hashlib.sha256(data).hexdigest()
        if digest != entry["file_sha256"]:
            other = next((c for c, e in self.cases.items() if e["file_sha256"] == digest), None)
            if other is not None:
                msg = (f"{path}: this file holds another case ({other}), not {case_id}; case "
                       "files were swapped or copied: regenerate the suite")
            else:
                msg = f"{path} does not match its SHA-256 in the manifest; regenerate the suite"
            raise SuiteError(msg)
        try:
            dtypes = {name: array["dtype"] for name, array in entry["arrays"].items()}
            arrays = loads_file(data, path, dtypes=dtypes)
        except (CorruptFileError, ValueError) as exc:
            raise SuiteError(str(exc)) from None
        if not rederive:
            return GoldenCase(entry, arrays)
        found = rederive_case(entry, arrays, environment=self.environment)
        if found.problems:
            problems = found.problems
            msg = f"{path}: {problems[0]}" + (
                f" (and {len(problems) - 1} more; run `relpos-ref verify {self.path}`)"
                if len(problems) > 1 else "")
            raise SuiteError(msg)
        return GoldenCase(entry, arrays, found)

    @property
    def environment(self) -> str | None:
        """Where the suite's naive pipeline ran (``generator.naive_environment``), if said."""
        return self.manifest.get("generator", {}).get("naive_environment")


def case_file_limit(entry: Mapping[str, Any]) -> int:
    """The most bytes case `entry`'s file may hold: its arrays, as the manifest
    records them, with their headers (`relpos_ref.golden.fileformat.file_limit`)."""
    return file_limit({n: (a["dtype"], a["shape"]) for n, a in entry["arrays"].items()})


def load_suite(path: str | os.PathLike[str], *, hold: bool = False) -> Suite:
    """Open a suite directory, checking its manifest (structure, digest, version, names).

    A `generate` killed while replacing `path` is finished or undone first
    (`relpos_ref.golden.replace.recover`); `Suite.recovered` says so. While a
    `generate` is swapping a new suite in, this waits for it (saying so on
    stderr) and opens the new one. The directory stays open: every later
    read is of this suite, or a `relpos_ref.golden.sharing.SuiteReplacedError`
    when it was replaced since. With `hold`, the suite cannot be replaced
    until `Suite.close` (a `generate --force` waits for it, saying so).
    """
    path = Path(path)
    recovered = recover_if_needed(path)
    reading = Reading(path, hold=hold)
    suite = Suite(path, {"cases": []}, recovered, reading)
    data = suite.read(MANIFEST, limit=MAX_MANIFEST_BYTES, what="a manifest")
    if data is None:
        msg = f"{path} has no {MANIFEST}; is it a golden suite?"
        raise SuiteError(msg)
    try:
        manifest = parse(data, where=str(path / MANIFEST))
    except ManifestError as exc:
        raise SuiteError(str(exc)) from None
    return Suite(path, manifest, recovered, reading)
