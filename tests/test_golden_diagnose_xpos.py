"""``diagnose`` names xPos's mistakes, each planted in an implementation of its own.

The planted implementation is NumPy written here from the paper (Sun et al.
2022): the rotation of RoPE with ``theta_c = base^(-2c/R)``, the scales
``zeta_c^((n - o)/gamma)`` on queries and ``zeta_c^(-(m - o)/gamma)`` on keys,
``zeta_c = (2c/R + gamma_zeta) / (1 + gamma_zeta)``, about the centre ``o`` of
the call's ``L = max(t_k, q_offset + t_q)`` positions; one mistake switched on.
Each must be named, and named alone; a right implementation matches the golden.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from relpos_ref import golden
from relpos_ref.golden.diagnose import diagnose_case
from relpos_ref.golden.dtypes import numpy_dtype

#: Each planted mistake and the default suite's xPos cases (float32) it is planted in.
BUGS = {
    "xpos-decay-missing": ["torchscale-causal-end", "half-partial-masked", "decode"],
    "xpos-decay-inverted": ["torchscale-causal-end", "half-partial-masked", "decode"],
    "pairing-swapped": ["torchscale-causal-end", "half-partial-masked", "decode"],
    "partial-rotary-whole-head": ["half-partial-masked"],
}


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    out = tmp_path_factory.mktemp("diagnose-xpos") / "golden"
    golden.generate(out, golden.default_cases().select(["xpos/*"], dtypes=["float32"]))
    opened = golden.load_suite(out)
    return {cid.split("/")[1]: opened.load(cid) for cid in opened.cases}


def _rotate(x: np.ndarray, positions: np.ndarray, scales: np.ndarray, *, rd: int,
            layout: str, base: float) -> np.ndarray:
    theta = base ** (-np.arange(0, rd, 2) / rd)
    angles = positions[:, None] * theta[None, :]
    cos, sin = np.cos(angles) * scales, np.sin(angles) * scales
    if layout == "half":
        first, second = np.arange(rd // 2), np.arange(rd // 2, rd)
    else:
        first, second = np.arange(0, rd, 2), np.arange(1, rd, 2)
    out = x.copy()
    xa, xb = x[..., first], x[..., second]
    out[..., first] = xa * cos - xb * sin
    out[..., second] = xb * cos + xa * sin
    return out


def planted_xpos(case: golden.GoldenCase, bug: str | None) -> np.ndarray:
    """xPos attention (the full causal call of a decode case) with `bug` switched on."""
    x = {n: (a if a.dtype == bool else a.astype(np.float64)) for n, a in case.inputs.items()}
    p = case.params
    d, t_q, t_k, q_offset = p["d"], p["t_q"], p["t_k"], p["q_offset"]
    rd = d if bug == "partial-rotary-whole-head" else (p["rotary_dim"] or d)
    layout = p["layout"]
    if bug == "pairing-swapped":
        layout = "half" if layout == "interleaved" else "interleaved"
    length = max(t_k, q_offset + t_q)
    centre = length // 2 if p["center"] == "middle" else math.ceil(length / 2)
    gz = p["scale_offset"]
    zeta = (np.arange(0, rd, 2) / rd + gz) / (1 + gz)
    n, m = np.arange(t_q) + q_offset, np.arange(t_k)
    sign = {"xpos-decay-inverted": -1.0, "xpos-decay-missing": 0.0}.get(bug, 1.0)
    scale_q = zeta[None, :] ** (sign * (n[:, None] - centre) / p["scale_base"])
    scale_k = zeta[None, :] ** (-sign * (m[:, None] - centre) / p["scale_base"])
    q = _rotate(x["q"], n, scale_q, rd=rd, layout=layout, base=p["base"])
    k = _rotate(x["k"], m, scale_k, rd=rd, layout=layout, base=p["base"])
    logits = p["scale"] * q @ np.swapaxes(k, -1, -2)
    allowed = np.ones((t_q, t_k), dtype=bool)
    if p["causal"]:
        allowed = m[None, :] <= n[:, None]
    if "mask" in x:
        allowed = allowed & x["mask"]
    logits = np.where(allowed, logits, -np.inf)
    top = np.max(logits, axis=-1, keepdims=True)
    w = np.exp(logits - np.where(np.isfinite(top), top, 0.0))
    total = w.sum(axis=-1, keepdims=True)
    out = (w / np.where(total > 0, total, 1.0)) @ x["v"]
    return out.astype(numpy_dtype(case.dtype))


@pytest.mark.parametrize(("bug", "name"),
                         [(bug, name) for bug, names in BUGS.items() for name in names])
def test_a_planted_xpos_mistake_is_named_alone(suite, bug, name):
    case = suite[name]
    found = diagnose_case(case, planted_xpos(case, bug))
    assert not found.matches_golden, found.verdict
    matched = [v.name for v in found.variants if v.matches]
    assert matched == [bug], list(found.lines())
    assert found.variants[1].ratio > 10, list(found.lines())


def test_a_right_xpos_implementation_matches_every_golden(suite):
    assert sorted(suite) == ["decode", "half-partial-masked", "torchscale-causal-end"]
    for name, case in suite.items():
        found = diagnose_case(case, planted_xpos(case, None))
        assert found.matches_golden, (name, found.verdict)
