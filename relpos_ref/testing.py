"""Assertions for testing your implementation against golden cases.

>>> # in a test that receives `golden_case` from the relpos-ref pytest plugin:
>>> # out = my_attention(**golden_case.inputs)
>>> # assert_matches(golden_case, {"output": out})
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["assert_matches"]


def assert_matches(
    case: Any, outputs: Mapping[str, Any], *, require: Iterable[str] = ("output",)
) -> None:
    """Assert that `outputs` match golden `case` within its stored tolerances.

    An implementation that returns the intermediates right and the attention
    output wrong must not pass, so ``output`` is required by default: leaving
    it out fails, it is not skipped.

    Parameters
    ----------
    case : relpos_ref.golden.GoldenCase
        A loaded case (the ``golden_case`` fixture, or ``Suite.load``).
    outputs : mapping
        Arrays under the case's names (``output``, ``weights``, ``logits``,
        ``position``, ``bias``, ``index``, ...), any subset; NumPy, torch,
        CuPy or JAX arrays.
    require : iterable of str, default ``("output",)``
        Names that `outputs` must hold. Pass ``require=()`` to compare only
        what you pass, e.g. a bias kernel that produces no ``output``.

    Raises
    ------
    AssertionError
        With one line per array: the worst error in units of the tolerance,
        the tolerance and where; or naming a required array that `outputs`
        lacks.
    relpos_ref.golden.ObtainedError
        Unknown names, wrong shapes or dtypes.

    Examples
    --------
    >>> import numpy as np
    >>> from relpos_ref.golden import GoldenCase
    >>> entry = {"id": "demo", "dtype": "float32", "arrays": {"output": {
    ...     "role": "golden", "shape": [2], "dtype": "float64",
    ...     "tolerance": {"atol": 1e-6, "e_max": 1e-7}}}}
    >>> case = GoldenCase(entry, {"output": np.array([1.0, 2.0])})
    >>> assert_matches(case, {"output": np.array([1.0, 2.0], dtype=np.float32)})
    >>> assert_matches(case, {"output": np.array([1.0, 2.1], dtype=np.float32)})
    Traceback (most recent call last):
    ...
    AssertionError: golden case demo does not match:
      output: MISMATCH 1/2, max |err| 0.1 = 1e+05x the tolerance (atol 1e-06) at [1]: obtained 2.0999999, golden 2
    >>> assert_matches(case, {"weights": np.ones(2)})
    Traceback (most recent call last):
    ...
    AssertionError: golden case demo: `outputs` lacks 'output' (got ['weights']); pass it, or require=() to compare only the arrays you pass
    """  # noqa: E501
    __tracebackhide__ = True  # pytest shows the caller's line and this message, not this code
    if isinstance(require, str):
        msg = (
            "`require` must be a collection of names, e.g. ('output',); "
            f"got the string {require!r}"
        )
        raise TypeError(msg)
    if not outputs:
        msg = "`outputs` is empty; pass at least one array, e.g. {'output': out}"
        raise ValueError(msg)
    missing = [name for name in require if name not in outputs]
    if missing:
        names = ", ".join(repr(name) for name in missing)
        msg = (
            f"golden case {case.id}: `outputs` lacks {names} (got {sorted(outputs)}); "
            "pass it, or require=() to compare only the arrays you pass"
        )
        raise AssertionError(msg)
    results = case.compare(outputs)
    bad = [r for r in results if not r.passed]
    if bad:
        lines = [f"  {r.summary()}" for r in bad]
        if any(r.name == "output" for r in bad):
            lines += _diagnosis(case, outputs["output"])
        text = "\n".join(lines)
        msg = f"golden case {case.id} does not match:\n{text}"
        raise AssertionError(msg)


def _diagnosis(case: Any, output: Any) -> list[str]:
    """One line naming the known convention mistake a wrong `output` matches, if any."""
    if "scheme" not in case.entry:  # a hand-made case without its parameters
        return []
    from .golden.diagnose import MUCH_CLOSER, diagnose_case

    found = diagnose_case(case, output)
    matched = [v for v in found.variants if v.matches]
    if matched:
        names = ", ".join(v.name for v in matched)
        return [f"  diagnosis: the output matches the mistake {names} "
                f"({matched[0].ratio:.2g}x the tolerance); `relpos-ref diagnose` lists them"]
    if not found.variants:
        return []
    near = found.nearest
    if near is None:
        return [f"  diagnosis: no known convention mistake matches or comes {MUCH_CLOSER:g} "
                "times closer than the golden"]
    return [f"  diagnosis: no known convention mistake matches; the nearest, {near.name}, is "
            f"at {near.ratio:.3g}x the tolerance ({found.golden_ratio / near.ratio:.3g} times "
            "closer than the golden)"]
