"""Re-deriving a case from scratch: what a manifest entry and its arrays claim, checked.

`case_problems` rebuilds a case from its scheme, variant, dtype, seed and
parameters and compares everything its entry and stored arrays claim with
the rebuilt case: `relpos_ref.golden.verify` reports what differs, and
`relpos_ref.golden.Suite.load` refuses a case that does not re-derive.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .build import golden_backend, goldens_on
from .cases import Case
from .dtypes import ulp
from .fileformat import array_sha256
from .pipeline import is_gradient, naive_arrays, naive_method
from .tolerance import (
    E_MAX_FACTOR,
    E_MAX_ULPS,
    derive_tolerance,
    e_max_agrees,
    naive_environment,
    ulp_multiple,
)

__all__ = ["RECOMPUTE_ULPS", "Rederived", "case_problems", "rederive"]

#: Recomputed float64 goldens must agree within this many float64 ulps of max|golden|.
RECOMPUTE_ULPS = 64



@dataclass
class Rederived:
    """What re-deriving a case found, and what a comparison may trust.

    Attributes
    ----------
    problems : list of str
        Everything the entry or its arrays claim that does not follow.
    goldens : dict of ndarray
        The float64 goldens and integer intermediates recomputed here.
    limits : dict of float
        Per golden: the smaller of its stored ``atol`` and the ``atol`` the
        rule gives here, from the golden recomputed here and the naive
        pipeline run here. A result within it of ``goldens`` is within the
        tolerance this environment derives, whatever the manifest says.
    """

    problems: list[str] = field(default_factory=list)
    goldens: dict[str, np.ndarray] = field(default_factory=dict)
    limits: dict[str, float] = field(default_factory=dict)


def case_problems(
    entry: dict[str, Any], stored: Mapping[str, np.ndarray], *, backend: str = "numpy",
    environment: str | None = None,
) -> list[str]:
    """What does not follow from the case's own parameters, from scratch (`rederive`)."""
    return rederive(entry, stored, backend=backend, environment=environment).problems


def rederive(
    entry: dict[str, Any], stored: Mapping[str, np.ndarray], *, backend: str = "numpy",
    environment: str | None = None,
) -> Rederived:
    """Re-derive a case from scratch: what does not follow, and what a comparison may trust.

    The case is rebuilt from its scheme, variant, dtype, seed and parameters
    (a case the library does not know is a problem), and compared with its
    entry and arrays: the id, every parameter, the resolved ``scale``, the
    naive method; the arrays' names, roles and dtypes; the inputs (bit for
    bit from the seed); the integer intermediates (exactly); the float64
    goldens (within `RECOMPUTE_ULPS` ulps); and each tolerance: the rule's
    ``k``, ``rtol``, ``ulp_floor`` and ``rule``, ``max_abs_golden`` of the
    stored golden, ``atol`` from the stored ``e_max`` by the rule, bit for
    bit, and ``e_max`` and ``e_mean`` against the naive pipeline run again
    here: bit for bit when `environment` (the suite's
    ``generator.naive_environment``) is this one, else within
    `relpos_ref.golden.tolerance.e_max_agrees`'s window.

    Examples
    --------
    >>> import tempfile
    >>> from relpos_ref import golden
    >>> out = tempfile.mkdtemp() + "/golden"
    >>> cases = golden.default_cases().select(["bias/decode-step/*"], dtypes=["float32"])
    >>> _ = golden.generate(out, cases)
    >>> suite = golden.load_suite(out)
    >>> case = suite.load(cases[0].id, rederive=False)
    >>> found = rederive(case.entry, case.arrays, environment=suite.environment)
    >>> found.problems, found.limits["output"] == case.tolerance("output")["atol"]
    ([], True)
    """
    cid = entry["id"]
    out = Rederived()
    try:
        case = Case.make(entry["scheme"], entry["variant"], dtype=entry["dtype"],
                         seed=entry["seed"], **entry["params"])
    except (ValueError, TypeError) as exc:
        out.problems.append(f"{cid}: the library does not know this case ({exc})")
        return out
    problems = out.problems
    if case.id != cid:
        problems.append(f"{cid}: the parameters describe case {case.id}, not this id")
        return out
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
    if entry.get("kind", "forward") != case.kind:
        problems.append(f"{cid}: kind {entry.get('kind')!r} is not the case's {case.kind!r}")
        return out
    inputs = case.inputs()
    d_output = case.d_output() if case.kind == "forward" else None
    given = {**inputs} if d_output is None else {**inputs, "d_output": d_output}
    fresh = goldens_on(case, inputs, golden_backend(backend), d_output=d_output)
    roles = {**dict.fromkeys(inputs, "input"),
             **({} if d_output is None else {"d_output": "cotangent"}),
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
        return out
    for name, a in given.items():
        if array_sha256(a) != array_sha256(stored[name]):
            problems.append(f"{cid}: input `{name}` differs from its regeneration from the seed")
    if problems:
        return out
    naive = naive_arrays(case, inputs, d_output=d_output)
    same = environment == naive_environment()
    for name, a in fresh.items():
        want = stored[name]
        out.goldens[name] = a
        if roles[name] == "index":
            if a.shape != want.shape or not np.array_equal(a, want):
                problems.append(f"{cid}: `{name}` differs from its recomputation")
            continue
        problems += _golden_problems(cid, name, a, want, naive[name], entry["arrays"][name],
                                     case.dtype, same)
        if a.shape == want.shape:
            here = derive_tolerance(a, naive[name], case.dtype, gradient=is_gradient(name))
            out.limits[name] = min(float(entry["arrays"][name]["tolerance"]["atol"]),
                                   here["atol"])
    return out


def _json(value: Any) -> str:
    # Values compared as their JSON text, so types count (4.0 != 4, 1 != true).
    return json.dumps(value, sort_keys=True)


def _golden_problems(cid: str, name: str, fresh: np.ndarray, want: np.ndarray,
                     naive: np.ndarray, info: Mapping[str, Any], dtype: str,
                     same_environment: bool) -> list[str]:
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
    where = "run here in the environment that generated the suite" if same_environment \
        else (f"{again['e_max']:.3g} here, another environment: within {E_MAX_FACTOR:g} "
              f"times and {E_MAX_ULPS:g} ulps")
    for key in ("e_max", "e_mean"):
        if not e_max_agrees(float(tol[key]), again[key], top, dtype,
                            same_environment=same_environment):
            problems.append(f"{cid}: `{name}` {key} {tol[key]!r} is not the naive "
                            f"pipeline's ({again[key]!r}, {where})")
    for key in ("k", "rtol", "ulp_floor", "rule"):
        if tol.get(key) != again[key]:
            problems.append(f"{cid}: `{name}` tolerance field `{key}` is {tol.get(key)!r}, "
                            f"the rule's is {again[key]!r}")
    rule = max(tol["k"] * tol["e_max"], ulp_multiple(dtype, gradient=gradient) * ulp(top, dtype))
    if tol["atol"] != rule or tol["max_abs_golden"] != top:
        problems.append(f"{cid}: `{name}` tolerance does not follow the rule from its inputs")
    return problems
