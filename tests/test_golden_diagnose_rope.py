"""``diagnose`` names the field's RoPE mistakes, each planted in an implementation of its own.

The planted implementations are NumPy written here: the frequencies and
attention factors are relpos_ref's facts (`rope_scaling`), the rotation, the
float32 angles (transformers' ``inv_freq`` formula), the factor placement,
the LongRoPE switch and the attention are this file's, with one mistake
switched on. Each must be named, and named alone; a right implementation
matches the golden.
"""

from __future__ import annotations

import numpy as np
import pytest

from relpos_ref import golden
from relpos_ref.golden.diagnose import diagnose_case
from relpos_ref.golden.dtypes import numpy_dtype
from relpos_ref.schemes.rope_scaling import (
    attention_factor,
    check_scaling,
    scaled_frequencies,
    softmax_factor,
)

#: Each planted mistake and the default suite's RoPE cases (float32) it is planted in.
BUGS = {
    "attention-factor-once": ["yarn", "yarn-deepseek", "longrope-long"],
    "attention-factor-squared-twice": ["yarn", "yarn-deepseek", "longrope-short"],
    "yarn-mscale-missing": ["yarn", "yarn-deepseek"],
    "softmax-mscale-missing": ["yarn-deepseek"],
    "partial-rotary-whole-head": ["half-partial-end", "yarn-deepseek"],
    "pairing-swapped": ["interleaved", "half-partial-end", "yarn-deepseek", "llama3"],
    "longrope-wrong-switch": ["longrope-long", "longrope-short", "longrope-fixed"],
    "float32-angles": ["past-65536", "near-1m"],
    "float64-angles": ["past-65536-f32", "near-1m-f32"],
}


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    out = tmp_path_factory.mktemp("diagnose-rope") / "golden"
    cases = golden.default_cases().select(["rope/*"], dtypes=["float32"])
    # one-axis RoPE at the front of the head: the mistakes below are of its frequencies
    golden.generate(out, [c for c in cases if c.kind == "forward" and _one_axis(c)])
    opened = golden.load_suite(out)
    return {_name(cid): opened.load(cid) for cid in opened.cases}


def _one_axis(case: golden.Case) -> bool:
    p = case.parameters
    return p["axes"] is None and p["positions"] is None and p["rotary_at"] == "front"


def _name(case_id: str) -> str:
    # "rope/past-65536/...-f32/..." -> "past-65536-f32"
    variant, shape = case_id.split("/")[1:3]
    return variant + ("-f32" if shape.endswith("-f32") else "")


def _float32_angles(positions: np.ndarray, rd: int, base: float) -> np.ndarray:
    """transformers' float32 angles: ``inv_freq = 1 / base ** (arange(0, R, 2) / R)``."""
    exponents = np.arange(0, rd, 2).astype(np.float32) / np.float32(rd)
    inv_freq = (np.float32(1.0) / np.float32(base) ** exponents).astype(np.float32)
    return (positions.astype(np.float32)[:, None] * inv_freq[None, :]).astype(np.float64)


def _rotate(x: np.ndarray, angles: np.ndarray, rd: int, layout: str, a: float) -> np.ndarray:
    out = x.copy()
    cos, sin = a * np.cos(angles), a * np.sin(angles)
    if layout == "half":
        first, second = np.arange(rd // 2), np.arange(rd // 2, rd)
    else:
        first, second = np.arange(0, rd, 2), np.arange(1, rd, 2)
    xa, xb = x[..., first], x[..., second]
    out[..., first] = xa * cos - xb * sin
    out[..., second] = xb * cos + xa * sin
    return out


def _switched(rule: dict, t_q: int, length: int) -> dict:
    """LongRoPE's factors by a wrong length: the queries' count (per call; the long case),
    ``>= L0`` for ``> L0`` (the short case at L0), or per call under a fixed deployment."""
    l0 = rule["original_max_position_embeddings"]
    if rule["policy"] == "fixed":
        wrong = length > l0
    elif length > l0:
        wrong = t_q > l0
    else:
        wrong = length >= l0
    factors = rule["long_factor"] if wrong else rule["short_factor"]
    return {**rule, "short_factor": factors, "long_factor": factors}


def planted_rope(case: golden.GoldenCase, bug: str | None) -> np.ndarray:
    """RoPE attention with one of the field's mistakes when `bug` names it."""
    x = {n: a.astype(np.float64) for n, a in case.inputs.items()}
    p = case.params
    d, t_q, t_k, q_offset = p["d"], p["t_q"], p["t_k"], p["q_offset"]
    rd = d if bug == "partial-rotary-whole-head" else (p["rotary_dim"] or d)
    layout = p["layout"]
    if bug == "pairing-swapped":
        layout = "half" if layout == "interleaved" else "interleaved"
    rule = check_scaling(p["scaling"])
    length = max(t_k, q_offset + t_q)
    a, softmax = attention_factor(rule), softmax_factor(rule)
    if bug == "longrope-wrong-switch":
        rule = _switched(rule, t_q, length)
    factor_q = factor_k = a
    if bug == "attention-factor-once":
        factor_k = 1.0  # on the queries only
    elif bug == "attention-factor-squared-twice":
        factor_q = factor_k = a * a
    elif bug == "yarn-mscale-missing":
        factor_q = factor_k = 1.0
    elif bug == "softmax-mscale-missing":
        softmax = 1.0
    exact = p["angles"] == "float64"
    if bug in ("float32-angles", "float64-angles"):
        exact = not exact
    pos_q, pos_k = np.arange(t_q) + q_offset, np.arange(t_k)
    if exact:
        theta = np.asarray(scaled_frequencies(rd, base=p["base"], scaling=rule, length=length))
        ang_q, ang_k = pos_q[:, None] * theta, pos_k[:, None] * theta
    else:
        assert rule["rope_type"] == "default"  # the float32 cases of the default suite
        ang_q, ang_k = (_float32_angles(pos, rd, p["base"]) for pos in (pos_q, pos_k))
    q = _rotate(x["q"], ang_q, rd, layout, factor_q)
    k = _rotate(x["k"], ang_k, rd, layout, factor_k)
    logits = p["scale"] * softmax * q @ np.swapaxes(k, -1, -2)
    if p["causal"]:
        logits = np.where(pos_k[None, :] <= pos_q[:, None], logits, -np.inf)
    w = np.exp(logits - logits.max(axis=-1, keepdims=True))
    w /= w.sum(axis=-1, keepdims=True)
    return (w @ x["v"]).astype(numpy_dtype(case.dtype))


@pytest.mark.parametrize(("bug", "name"),
                         [(bug, name) for bug, names in BUGS.items() for name in names])
def test_a_planted_rope_mistake_is_named_alone(suite, bug, name):
    case = suite[name]
    found = diagnose_case(case, planted_rope(case, bug))
    assert not found.matches_golden, found.verdict
    matched = [v.name for v in found.variants if v.matches]
    assert matched == [bug], list(found.lines())
    assert found.variants[1].ratio > 10, list(found.lines())


def test_a_right_rope_implementation_matches_every_golden(suite):
    assert len(suite) == 16
    for name, case in suite.items():
        found = diagnose_case(case, planted_rope(case, None))
        assert found.matches_golden, (name, found.verdict)
