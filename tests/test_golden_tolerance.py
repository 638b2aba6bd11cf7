"""The 16-bit tolerance rule (k = 3), backed by data over the whole default suite.

Legitimate 16-bit implementations pass every case they apply to with room to
spare; the convention mistakes of `relpos_ref.golden.diagnose`, planted on
the same cases, fail wherever they change the output by more than 16-bit
rounding does. The numbers in the golden guide's evidence table come from here.
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest

from relpos_ref import backends, catalog, golden
from relpos_ref.golden.diagnose import _run, case_call, variants
from relpos_ref.golden.tolerance import safety_factor


@pytest.fixture(scope="module")
def sixteen(tmp_path_factory):
    out = tmp_path_factory.mktemp("tolerance") / "golden"
    golden.generate(out, golden.default_cases().select(dtypes=["float16", "bfloat16"]))
    opened = golden.load_suite(out)
    return [opened.load(cid, rederive=False) for cid in opened.cases]


def _allowed(torch, case):
    p = case.params
    r = torch.arange(p["t_k"])[None, :] - (torch.arange(p["t_q"])[:, None] + p["q_offset"])
    allowed = torch.ones(p["t_q"], p["t_k"], dtype=torch.bool)
    if p["causal"]:
        allowed &= r <= 0
    if "mask" in case.inputs:
        allowed &= torch.tensor(case.inputs["mask"])
    return allowed


def _bias_only(case) -> bool:  # q . k plus a bias (not Swin v2's cosine attention)
    return ("bias" in case.expected and "position" not in case.expected
            and "q_rotated" not in case.expected)


def torch_eager(torch, case):
    """16-bit ``q k^T``, ``* scale + bias``, ``torch.softmax``, ``w v`` (bias from the table)."""
    adapter = backends.get("torch")
    q, k, v = (adapter.from_numpy(case.inputs[n]) for n in ("q", "k", "v"))
    bias = torch.tensor(case.expected["bias"]).to(q.dtype)  # a gather: exact in 16 bits
    scores = (q @ k.transpose(-1, -2)) * torch.tensor(case.scale, dtype=q.dtype) + bias
    scores = scores.masked_fill(~_allowed(torch, case), float("-inf"))
    return torch.nan_to_num(torch.softmax(scores, dim=-1), nan=0.0) @ v


def torch_sdpa(torch, case):
    """``scaled_dot_product_attention`` with the bias as an additive float mask."""
    adapter = backends.get("torch")
    q, k, v = (adapter.from_numpy(case.inputs[n]) for n in ("q", "k", "v"))
    bias = torch.tensor(case.expected["bias"]).to(q.dtype)
    mask = torch.where(_allowed(torch, case), bias, torch.tensor(float("-inf"), dtype=q.dtype))
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                                           scale=case.scale)
    return torch.nan_to_num(out, nan=0.0)


def every_op_in_16_bits(library, case):
    """The specification itself with every operation in 16 bits (no float32 widening)."""
    adapter = backends.get(library)
    entry = catalog.get(case.scheme)
    arrays = {n: adapter.from_numpy(a) for n, a in case.inputs.items()}
    tables = {t.name: arrays[t.name] for t in entry.tables if t.name in arrays}
    forward = inspect.unwrap(entry.attention)
    return forward(arrays["q"], arrays["k"], arrays["v"], *entry.table_args(tables),
                   mask=arrays.get("mask"), **case.kwargs)


def _ratios(case, output):
    (result,) = case.compare({"output": output})
    tol = case.tolerance("output")
    of_naive = result.max_error / tol["e_max"] if tol["e_max"] else 0.0
    return result.max_error / tol["atol"], of_naive


def test_legitimate_16_bit_implementations_pass_with_room(sixteen):
    torch = pytest.importorskip("torch", reason="torch is not installed")
    implementations = {
        "torch-eager": lambda c: torch_eager(torch, c) if _bias_only(c) else None,
        "torch-sdpa": lambda c: torch_sdpa(torch, c) if _bias_only(c) else None,
        "torch-every-op": lambda c: every_op_in_16_bits("torch", c),
    }
    if backends.get("jax").unavailable_reason() is None:  # op by op, JAX is slow: a sample
        sample = ("shaw/masked/", "t5/causal-decode/", "rope/interleaved/", "music/skew/")
        implementations["jax-every-op"] = lambda c: every_op_in_16_bits("jax", c) if (
            c.dtype == "bfloat16" and c.id.startswith(sample)) else None
    worst, fire, cope = {}, {}, {}
    for case in sixteen:
        for name, run in implementations.items():
            out = run(case)
            if out is None:
                continue
            of_atol, of_naive = _ratios(case, out)
            if case.scheme == "fire":  # an MLP of a log ratio in 16 bits: see below
                fire[case.id] = max(fire.get(case.id, 0.0), of_atol)
                continue
            if case.scheme == "cope":  # positions summed from 16-bit gates: see below
                cope[case.id] = max(cope.get(case.id, 0.0), of_atol)
                continue
            assert of_atol <= 0.75, (name, case.id, of_atol)
            worst[name] = max(worst.get(name, 0.0), of_naive)
    # the guide's evidence table
    assert worst["torch-eager"] == pytest.approx(2.23, abs=0.01)  # kerple/log-causal-end
    assert worst["torch-sdpa"] == pytest.approx(1.19, abs=0.01)  # bias/decode-step-scaled
    # swinv2/cosine-masked in bfloat16: q and k normalized in 16 bits, their cosines times 10
    assert worst["torch-every-op"] == pytest.approx(2.00, abs=0.01)
    if "jax-every-op" in worst:
        assert worst["jax-every-op"] == pytest.approx(1.16, abs=0.01)
    # FIRE with every operation in 16 bits: the log ratio rounded to 16 bits, then an MLP of
    # 16 hidden units in 16 bits; it passes but for beyond-l-end in float16 (1.06 of the
    # tolerance): a 16-bit FIRE evaluates its MLP in float32, as the specification does
    assert max(fire.values()) == pytest.approx(1.06, abs=0.01), fire
    assert [i for i, x in fire.items() if x > 1.0] == [
        "fire/beyond-l-end/b1-h3-q3-k9-d8-m16-L5/float16/s0"], fire
    # CoPE with every operation in 16 bits: its positions, cumulative sums of 16-bit gates,
    # are read through floor and ceil; it passes the tolerance but for the decode case
    # (1.11 of it in float16, 1.29 in bfloat16): a 16-bit CoPE sums its positions in
    # float32, as the specification does (docs/golden.md)
    assert max(cope.values()) == pytest.approx(1.29, abs=0.01), cope
    assert sorted(i.split("/")[1] for i, x in cope.items() if x > 1.0) == ["decode"] * 2, cope


def test_every_planted_mistake_that_changes_an_output_fails(sixteen):
    subtle = []
    for case in sixteen:
        call = case_call(case)  # a decode case's with its plan
        golden_out = case.expected["output"]
        for name, planted in variants(case.scheme, call, case.params):
            try:
                wrong = _run(case.scheme, planted)
            except ValueError:
                continue
            err = float(np.abs(wrong - golden_out).max())
            if err <= 1e-12 * max(float(np.abs(golden_out).max()), 1.0):
                continue  # the mistake changes nothing here (one token, say)
            of_e_max = err / case.tolerance("output")["e_max"]
            # causal-strict moves a decode step by one key's share: 5 e_max and more is wide
            if of_e_max < (5 if name == "causal-strict" else 15):
                subtle.append((case.id, name, round(of_e_max, 2)))
    # the bfloat16 decode step (one query, 16 keys, scale 1): clipping one distance late
    # moves it by 3.29 e_max, past the tolerance (k = 3) but narrowly; dropping the
    # diagonal key by less than bfloat16 rounding (the same step at scale 1/sqrt(d), and
    # float32, show it); the scaled step and the scaled T5 decode fail below 15 e_max, but
    # far past the tolerance
    decode = "bias/decode-step/b1-h2-q1-k16-d8-K4/bfloat16/s0"
    scaled = "bias/decode-step-scaled/b1-h2-q1-k16-d8-K4/bfloat16/s0"
    t5 = "t5/causal-decode-scaled/b1-h2-q4-k64-d8-B32-D32/bfloat16/s0"
    # a RoPE decode step of 24 keys: dropping the diagonal key moves it by 4.7 e_max
    rope = "rope/dynamic-decode/b1-h2-q1-k24-d8-R8-half-dynamic/bfloat16/s0"
    # RoPE's angles formed in float32 (or exactly, where the golden's are float32's) move a
    # 16-bit output by 0.09 to 6.3 e_max: 16-bit inputs are rounded more than the angles,
    # so the 16-bit goldens neither tell them apart nor need to (the float32 cases do)
    angles = [s for s in subtle if s[1].endswith("-angles")]
    assert len(angles) == 8 and max(s[2] for s in angles) == 6.29, angles
    subtle = [s for s in subtle if s not in angles]
    # DeepSeek's YaRN factor (0.92) in bfloat16: applied once or squared twice, or left out,
    # 5.7 to 11.5 e_max, and the decode case's (1.14) applied once 13.8, beyond the tolerance
    yarn_decode = "rope/decode-yarn/b1-h2-q8-k8-d16-n3-R8-half-yarn/bfloat16/s0"
    deepseek = "rope/yarn-deepseek/b1-h2-q6-k6-d16-R8-interleaved-yarn/bfloat16/s0"
    kerple_decode = "kerple/decode-log/b1-h3-q8-k8-d8-n3-log/bfloat16/s0"
    kerple_power = "kerple/power-masked/b1-h3-q7-k7-d8-power/bfloat16/s0"
    sandwich = "sandwich/nemo-d16/b1-h3-q5-k7-d8-D16-c1/bfloat16/s0"
    xpos = "xpos/half-partial-masked/b1-h2-q7-k7-d16-X8-half-g8-cmiddle/bfloat16/s0"
    assert sorted(subtle) == sorted([(decode, "causal-strict", 0.67),
                                     (decode, "clip-at-K+1", 3.29),
                                     (scaled, "clip-at-K+1", 13.6), (t5, "not-causal", 14.94),
                                     (rope, "causal-strict", 4.7),
                                     (deepseek, "attention-factor-once", 5.71),
                                     (deepseek, "attention-factor-squared-twice", 10.98),
                                     (deepseek, "yarn-mscale-missing", 11.53),
                                     (yarn_decode, "attention-factor-once", 13.83),
                                     # the smooth biases move little per position in bfloat16:
                                     # KERPLE's log kernel, Sandwich's sinusoids at 16 wide
                                     (kerple_decode, "cache-length+1", 6.9),
                                     (kerple_power, "q_offset+1", 13.43),
                                     (sandwich, "end-aligned", 8.53),
                                     (sandwich, "start-aligned", 8.59),
                                     # xPos's decay over 7 positions, half the rotated pairs
                                     (xpos, "xpos-decay-missing", 10.01)])
    assert safety_factor("bfloat16") < 3.29  # the case fails: beyond k e_max
