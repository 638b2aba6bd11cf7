"""Comparing someone's arrays with a case's goldens, under the stored tolerances."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["ArrayResult", "ObtainedError", "compare_arrays", "to_numpy"]

_FLOAT_BITS = {"float16": 16, "bfloat16": 16, "float32": 32, "float64": 64}


class ObtainedError(ValueError):
    """Obtained arrays that cannot be compared: unknown name, wrong shape or dtype."""


@dataclass(frozen=True)
class ArrayResult:
    """The comparison of one obtained array with its golden.

    Attributes
    ----------
    name : str
    passed : bool
    mismatches : int
        Elements outside the tolerance (or not equal, for exact arrays).
    size : int
    max_error : float
        Largest ``|obtained - golden|`` (``inf`` when an element is not finite).
    worst_index : tuple of int
        Where `max_error` occurs.
    obtained, expected : float
        The values there.
    atol : float
        The stored tolerance (0 for exact arrays).
    naive_error : float
        ``e_max`` of the naive pipeline (0 for exact arrays).
    """

    name: str
    passed: bool
    mismatches: int
    size: int
    max_error: float
    worst_index: tuple[int, ...]
    obtained: float
    expected: float
    atol: float
    naive_error: float

    @property
    def ratio_to_naive(self) -> float | None:
        """``max_error / e_max``: how the obtained error compares with the naive pipeline's."""
        if self.naive_error == 0.0:
            return None
        return self.max_error / self.naive_error

    @property
    def ratio(self) -> float | None:
        """``max_error / atol``: the worst error in units of the tolerance (``None`` for
        an exact array, whose tolerance is 0)."""
        if self.atol == 0.0:
            return None
        return self.max_error / self.atol

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form (non-finite numbers as strings)."""
        out = {k: getattr(self, k) for k in self.__dataclass_fields__}
        out["worst_index"] = list(self.worst_index)
        out["ratio_to_naive"] = self.ratio_to_naive
        out["ratio_to_tolerance"] = self.ratio
        return {k: (repr(v) if isinstance(v, float) and not np.isfinite(v) else v)
                for k, v in out.items()}

    def summary(self) -> str:
        """One line: name, verdict, the worst error in units of the tolerance, where.

        Examples
        --------
        >>> r = ArrayResult("output", False, 1, 8, 0.5, (0, 3), 1.5, 1.0, 0.01, 0.001)
        >>> r.summary()
        'output: MISMATCH 1/8, max |err| 0.5 = 50x the tolerance (atol 0.01) at [0, 3]: obtained 1.5, golden 1'
        """  # noqa: E501
        verdict = "ok" if self.passed else f"MISMATCH {self.mismatches}/{self.size}"
        line = f"{self.name}: {verdict}"
        if not self.size:
            return line
        if not np.isfinite(self.max_error):
            size = "a value that is not finite"
        elif self.ratio is None:
            size = f"max |err| {self.max_error:.3g} (an exact array: atol 0)"
        else:
            size = (f"max |err| {self.max_error:.3g} = {self.ratio:.3g}x the tolerance "
                    f"(atol {self.atol:.3g})")
        return (f"{line}, {size} at {list(self.worst_index)}: obtained {self.obtained:.9g}, "
                f"golden {self.expected:.9g}")


def to_numpy(x: Any) -> np.ndarray:
    """A host NumPy copy of a NumPy, torch, CuPy or JAX array (torch bfloat16 -> float32)."""
    module = type(x).__module__ or ""
    if module.startswith("torch"):
        x = x.detach().cpu()
        if str(x.dtype) == "torch.bfloat16":
            x = x.float()
        return x.numpy()
    if module.startswith("cupy"):
        return x.get()
    return np.asarray(x)


def _obtained_dtype_problem(name: str, role: str, got: np.dtype, case_dtype: str) -> str | None:
    gname = got.name
    if role in ("golden", "input", "cotangent"):
        if gname not in _FLOAT_BITS:
            return f"`{name}` must be a floating array, got dtype {gname}"
        if role in ("input", "cotangent") and gname != case_dtype:
            return f"`{name}` is an input stored in {case_dtype}, got dtype {gname}"
        ok = (
            gname == case_dtype
            or _FLOAT_BITS[gname] > _FLOAT_BITS[case_dtype]
        )
        if not ok:
            return (
                f"`{name}` has dtype {gname}, narrower than the case's {case_dtype}; "
                f"store results in {case_dtype} or wider"
            )
        return None
    if got.kind == "b" or got.kind in "iu":
        return None
    return f"`{name}` must be an integer or bool array, got dtype {gname}"


def compare_arrays(
    entry: Mapping[str, Any],
    goldens: Mapping[str, np.ndarray],
    obtained: Mapping[str, Any],
    *,
    limits: Mapping[str, float] | None = None,
) -> list[ArrayResult]:
    """Compare `obtained` arrays with a case's stored arrays.

    Parameters
    ----------
    entry : mapping
        The case's manifest entry (roles, tolerances, dtype).
    goldens : mapping
        The case's arrays by name (stored, or recomputed).
    obtained : mapping
        Arrays to check, under the stored names (any subset).
    limits : mapping, optional
        The ``atol`` of each golden array, instead of the stored one.

    Returns
    -------
    list of ArrayResult
        One per obtained array, in name order.

    Raises
    ------
    ObtainedError
        Unknown names, wrong shapes or dtypes, all listed in one message.
    """
    problems = []
    host = {}
    for name in sorted(obtained):
        if name not in entry["arrays"]:
            problems.append(
                f"`{name}` is not an array of case {entry['id']} "
                f"(its arrays: {', '.join(sorted(entry['arrays']))})"
            )
            continue
        a = to_numpy(obtained[name])
        info = entry["arrays"][name]
        if tuple(a.shape) != tuple(info["shape"]):
            problems.append(
                f"`{name}` must have shape {tuple(info['shape'])}, got {tuple(a.shape)}"
            )
            continue
        why = _obtained_dtype_problem(name, info["role"], a.dtype, entry["dtype"])
        if why:
            problems.append(why)
            continue
        host[name] = a
    if problems:
        raise ObtainedError(f"case {entry['id']}: " + "; ".join(problems))
    return [_compare_one(name, a, goldens[name], entry["arrays"][name], (limits or {}).get(name))
            for name, a in host.items()]


def _compare_one(
    name: str, got: np.ndarray, want: np.ndarray, info: Mapping[str, Any],
    limit: float | None = None,
) -> ArrayResult:
    if info["role"] == "golden":
        tol = info["tolerance"]
        atol = float(tol["atol"]) if limit is None else limit
        naive = float(tol["e_max"])
    else:
        atol, naive = 0.0, 0.0
    g = got.astype(np.float64)
    w = want.astype(np.float64)
    err = np.abs(g - w)
    err = np.where(np.isfinite(g), err, np.inf)
    bad = ~(err <= atol)
    if err.size == 0:
        return ArrayResult(name, True, 0, 0, 0.0, (), 0.0, 0.0, atol, naive)
    flat = int(np.argmax(err))
    idx = tuple(int(i) for i in np.unravel_index(flat, err.shape))
    return ArrayResult(
        name=name,
        passed=not bool(bad.any()),
        mismatches=int(bad.sum()),
        size=int(err.size),
        max_error=float(err.reshape(-1)[flat]),
        worst_index=idx,
        obtained=float(g.reshape(-1)[flat]),
        expected=float(w.reshape(-1)[flat]),
        atol=atol,
        naive_error=naive,
    )
