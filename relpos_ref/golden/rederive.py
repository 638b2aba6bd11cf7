"""Re-deriving a case from scratch: what a manifest entry and its arrays claim, checked.

`case_problems` rebuilds a case from its scheme, variant, dtype, seed and
parameters and compares everything its entry and stored arrays claim with
the rebuilt case: `relpos_ref.golden.verify` reports what differs, and
`relpos_ref.golden.Suite.load` refuses a case that does not re-derive.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import numpy as np

from .build import golden_backend, goldens_on
from .cases import Case
from .dtypes import ulp
from .fileformat import array_sha256
from .pipeline import is_gradient, naive_arrays, naive_method
from .tolerance import derive_tolerance, ulp_multiple

__all__ = ["RECOMPUTE_ULPS", "case_problems"]

#: Recomputed float64 goldens must agree within this many float64 ulps of max|golden|.
RECOMPUTE_ULPS = 64



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
