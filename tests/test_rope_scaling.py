"""RoPE's frequency scaling, attention factors, float32 angles and decoding with a cache.

Every rule against the loop reference (`tests/_reference.py`, written from the
formulas of docs/schemes/rope.md), on every backend; the attention factor on the
rotated features only; DeepSeek's softmax mscale; the float32 angles at positions
past 65536 and near 2**20; and, for every rule under each policy, one query at a
time at ``q_offset = t - 1`` against the full forward's row.
"""

from __future__ import annotations

import math

import _reference as ref
import numpy as np
import pytest

import relpos_ref as rp
from relpos_ref import kernels
from relpos_ref.schemes import rope_scaling

BASE, RD, D = 100.0, 8, 10  # four rotated pairs, two features passing through

#: One scaling of each rule with every field written out (the reference takes no defaults);
#: trained lengths of 8 and 64 so that short calls cross them.
VARIANTS = {
    "default": None,
    "linear": {"rope_type": "linear", "factor": 4.0},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 8,
                "policy": "per_call", "max_position_embeddings": None},
    "dynamic-fixed": {"rope_type": "dynamic", "factor": 2.0,
                      "original_max_position_embeddings": 8, "policy": "fixed",
                      "max_position_embeddings": None},
    "yarn": {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 64,
             "beta_fast": 32.0, "beta_slow": 1.0, "truncate": True, "mscale": None,
             "mscale_all_dim": None, "attention_factor": None, "softmax_mscale": False},
    "yarn-deepseek": {"rope_type": "yarn", "factor": 40.0,
                      "original_max_position_embeddings": 64, "beta_fast": 32.0,
                      "beta_slow": 1.0, "truncate": False, "mscale": 0.707,
                      "mscale_all_dim": 1.0, "attention_factor": None,
                      "softmax_mscale": True},
    "longrope": {"rope_type": "longrope", "short_factor": [1.0, 1.1, 1.3, 1.9],
                 "long_factor": [1.0, 2.5, 6.0, 12.0], "original_max_position_embeddings": 8,
                 "factor": None, "max_position_embeddings": 32, "attention_factor": None,
                 "policy": "per_call"},
    "longrope-fixed": {"rope_type": "longrope", "short_factor": [1.0, 1.1, 1.3, 1.9],
                       "long_factor": [1.0, 2.5, 6.0, 12.0],
                       "original_max_position_embeddings": 8, "factor": 4.0,
                       "max_position_embeddings": 32, "attention_factor": None,
                       "policy": "fixed"},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
    "proportional": {"rope_type": "proportional", "partial_rotary_factor": 0.5, "factor": 1.0},
}
#: Whether a rule's frequencies follow the call's length (the per-call policies).
PER_CALL = {"dynamic", "longrope"}
TOL = {"float64": {"rtol": 1e-12, "atol": 1e-12}, "float32": {"rtol": 2e-5, "atol": 2e-5}}


def _thetas(name, length):
    return ref.rope_scaled_thetas(RD, BASE, VARIANTS[name], length)


@pytest.mark.parametrize("length", [1, 8, 9, 40])
@pytest.mark.parametrize("name", list(VARIANTS))
def test_frequencies_equal_the_reference(name, length):
    got = rp.rope_frequencies(RD, base=BASE, scaling=VARIANTS[name], length=length)
    np.testing.assert_allclose(got, _thetas(name, length), rtol=1e-14, atol=0)


def test_each_rule_changes_what_its_formula_says():
    theta = rp.rope_frequencies(RD, base=BASE)
    f = {n: rp.rope_frequencies(RD, base=BASE, scaling=VARIANTS[n], length=40) for n in VARIANTS}
    assert f["linear"] == tuple(t / 4 for t in theta)
    assert f["llama3"][0] == theta[0] and f["llama3"][3] == theta[3] / 8  # kept / divided
    assert f["yarn"][0] == theta[0] and f["yarn"][3] == theta[3] / 8  # extrapolated / interp.
    assert f["proportional"][2:] == (0.0, 0.0)  # pass-through pairs
    assert f["proportional"][:2] == theta[:2]
    assert f["longrope"] == tuple(t / e for t, e in zip(theta, [1.0, 2.5, 6.0, 12.0],
                                                       strict=True))
    short = rp.rope_frequencies(RD, base=BASE, scaling=VARIANTS["longrope"], length=8)
    assert short == tuple(t / e for t, e in zip(theta, [1.0, 1.1, 1.3, 1.9], strict=True))
    # dynamic: the base grows with the length past the trained 8, never shrinks below it
    assert rp.rope_frequencies(RD, base=BASE, scaling=VARIANTS["dynamic"], length=3) == theta
    assert f["dynamic"][1] < theta[1] and f["dynamic"][0] == 1.0


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("name", list(VARIANTS))
def test_rotation_equals_the_reference(backend, name, layout, dtype):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 5, D)).astype(dtype)
    offset, length = 7, 20
    got = rp.rope_rotate(backend.asarray(x), offset=offset, base=BASE, rotary_dim=RD,
                         layout=layout, scaling=VARIANTS[name], length=length)
    factor = ref.rope_attention_factor(VARIANTS[name])
    want = ref.rope_rotate_thetas(x, offset, _thetas(name, length), layout, factor)
    np.testing.assert_allclose(backend.to_numpy(got), want, **TOL[dtype])
    np.testing.assert_array_equal(backend.to_numpy(got)[..., RD:], x[..., RD:])  # not times a
    assert got.dtype == getattr(backend.xp, dtype)


@pytest.mark.parametrize("name", ["yarn", "yarn-deepseek", "longrope"])
def test_the_attention_factor_scales_rotated_logits_by_its_square(name):
    rng = np.random.default_rng(1)
    q, k = rng.standard_normal((2, 6, RD))
    scaling = VARIANTS[name]
    a = ref.rope_attention_factor(scaling)
    unscaled = {**scaling, "attention_factor": 1.0}
    with_a = rp.rope_rotate(q, scaling=scaling, base=BASE) @ rp.rope_rotate(
        k, scaling=scaling, base=BASE).T
    without = rp.rope_rotate(q, scaling=unscaled, base=BASE) @ rp.rope_rotate(
        k, scaling=unscaled, base=BASE).T
    np.testing.assert_allclose(with_a, a * a * without, rtol=1e-12)
    assert a != 1.0
    expected = {"yarn": 0.1 * math.log(8) + 1,
                "yarn-deepseek": (0.1 * 0.707 * math.log(40) + 1) / (0.1 * math.log(40) + 1),
                "longrope": math.sqrt(1 + math.log(32 / 8) / math.log(8))}[name]
    assert a == pytest.approx(expected, rel=1e-15)
    assert rope_scaling.attention_factor(rope_scaling.check_scaling(scaling)) == pytest.approx(
        expected, rel=1e-15)


def test_the_inverse_is_the_transpose_with_an_attention_factor():
    rng = np.random.default_rng(2)
    x, y = rng.standard_normal((2, 5, D))
    s = VARIANTS["yarn"]
    lhs = np.sum(rp.rope_rotate(x, offset=3, scaling=s, base=BASE, rotary_dim=RD) * y)
    rhs = np.sum(x * rp.rope_rotate(y, offset=3, scaling=s, base=BASE, rotary_dim=RD,
                                    inverse=True))
    assert lhs == pytest.approx(rhs, rel=1e-12)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("name", list(VARIANTS))
def test_attention_equals_the_reference(backend, name, dtype):
    rng = np.random.default_rng(3)
    t_q, t_k, q_offset = 4, 11, 7  # positions 0 .. 10: the call's length is 11
    q, k, v = (rng.standard_normal((2, t, D)).astype(dtype) for t in (t_q, t_k, t_k))
    scaling = VARIANTS[name]
    out = rp.rope_attention(*map(backend.asarray, (q, k, v)), base=BASE, rotary_dim=RD,
                            scaling=scaling, q_offset=q_offset, causal=True)
    thetas, a = _thetas(name, 11), ref.rope_attention_factor(scaling)
    qr = ref.rope_rotate_thetas(q, q_offset, thetas, "half", a)
    kr = ref.rope_rotate_thetas(k, 0, thetas, "half", a)
    mscale = 0.1 * 1.0 * math.log(40) + 1
    s = (mscale**2 if name == "yarn-deepseek" else 1.0) / math.sqrt(D)
    want, _, _ = ref.relative_attention(qr, kr, v, scale=s, causal=True, q_offset=q_offset)
    np.testing.assert_allclose(backend.to_numpy(out), want, **TOL[dtype])


def test_deepseek_softmax_mscale_multiplies_the_given_scale_too():
    rng = np.random.default_rng(4)
    q, k, v = rng.standard_normal((3, 5, D))
    s = VARIANTS["yarn-deepseek"]
    m2 = (0.1 * math.log(40) + 1) ** 2
    plain = {**s, "softmax_mscale": False}
    np.testing.assert_allclose(rp.rope_attention(q, k, v, scaling=s, scale=0.5),
                               rp.rope_attention(q, k, v, scaling=plain, scale=0.5 * m2),
                               rtol=1e-13)
    assert rope_scaling.softmax_factor(rope_scaling.check_scaling(s)) == pytest.approx(m2)


# -- decoding with a cache: one query at a time -----------------------------------------


def _decode_rows(q, k, v, **options):
    """Query t - 1 against keys 0 .. t - 1 for each t: what a decoder with a cache computes."""
    rows = [rp.rope_attention(q[..., t - 1:t, :], k[..., :t, :], v[..., :t, :],
                              q_offset=t - 1, causal=True, **options)
            for t in range(1, q.shape[-2] + 1)]
    return np.concatenate([np.asarray(r) for r in rows], axis=-2)


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("name", list(VARIANTS))
def test_decoding_equals_the_full_forward_row(name, layout):
    rng = np.random.default_rng(5)
    T = 12  # crosses the trained length 8 of dynamic and longrope
    q, k, v = rng.standard_normal((3, 2, T, D))
    options = {"base": BASE, "rotary_dim": RD, "layout": layout, "scaling": VARIANTS[name]}
    steps = _decode_rows(q, k, v, **options)
    # row t - 1 of the full causal forward over the same t tokens, every rule and policy
    for t in range(1, T + 1):
        full = rp.rope_attention(q[..., :t, :], k[..., :t, :], v[..., :t, :], causal=True,
                                 **options)
        np.testing.assert_allclose(steps[..., t - 1, :], np.asarray(full)[..., t - 1, :],
                                   rtol=1e-12, atol=1e-12)
    whole = np.asarray(rp.rope_attention(q, k, v, causal=True, **options))
    if name in PER_CALL:
        # per call: a prefix shorter than the trained length reads other frequencies than
        # the whole sequence (transformers' rule; its cached keys keep their old base)
        assert not np.allclose(steps[..., :8, :], whole[..., :8, :], rtol=1e-9)
        np.testing.assert_allclose(steps[..., -1, :], whole[..., -1, :], rtol=1e-12)
    else:  # a fixed rule: every prefix of the whole forward, row by row
        np.testing.assert_allclose(steps, whole, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_decoding_through_the_kernels_equals_the_specification(backend, name):
    if backend.adapter.name not in ("numpy", "torch"):
        pytest.skip("the NumPy and torch kernels")
    rng = np.random.default_rng(6)
    q, k, v = (rng.standard_normal((2, 10, D)) for _ in range(3))
    options = {"base": BASE, "rotary_dim": RD, "scaling": VARIANTS[name]}
    got = _decode_rows(*map(backend.asarray, (q, k, v)), **options)
    with kernels.disabled():
        want = _decode_rows(q, k, v, **options)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_the_backward_pass_through_the_kernels_equals_the_specification(name):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(7)
    q, k, v, d_out = (rng.standard_normal((2, 9, D)) for _ in range(4))
    options = {"base": BASE, "rotary_dim": RD, "scaling": VARIANTS[name], "q_offset": 3,
               "causal": True}
    with kernels.disabled():
        want = rp.rope_attention_vjp(q, k, v, d_output=d_out, **options)
    got_np = rp.rope_attention_vjp(q, k, v, d_output=d_out, **options)
    t = [torch.tensor(a, requires_grad=True) for a in (q, k, v)]
    out = rp.rope_attention(*t, **options)
    out.backward(torch.tensor(d_out))
    for i, name_ in enumerate("qkv"):
        np.testing.assert_allclose(got_np[name_], want[name_], rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(t[i].grad.numpy(), want[name_], rtol=1e-10, atol=1e-12)


# -- exact and float32 angles --------------------------------------------------------


@pytest.mark.parametrize("offset", [131068, 2**20 - 5, 1_000_000])
def test_float32_angles_reproduce_the_float32_computation(backend, offset):
    rng = np.random.default_rng(8)
    x = rng.standard_normal((4, 16))
    thetas = ref.rope_scaled_thetas(16, 10000.0, None, 0)
    exact = rp.rope_rotate(backend.asarray(x), offset=offset)
    f32 = rp.rope_rotate(backend.asarray(x), offset=offset, angles="float32")
    np.testing.assert_allclose(backend.to_numpy(exact),
                               ref.rope_rotate_thetas(x, offset, thetas, "half"), atol=1e-9)
    np.testing.assert_allclose(backend.to_numpy(f32), ref.rope_rotate_thetas(
        x, offset, ref.rope_float32_thetas(16, 10000.0), "half", angles="float32"), atol=1e-12)
    gap = np.abs(backend.to_numpy(f32) - backend.to_numpy(exact)).max()
    assert gap > (1e-3 if offset > 2**17 else 2e-4)  # the two differ visibly there


def test_float32_angles_drift_as_the_issue_measured():
    # transformers #25681: about 5e-3 rad at position 131071, 0.03 to 0.07 near 2**20
    for p, low, high in [(131071, 1e-3, 1e-2), (2**20 - 1, 2e-2, 8e-2)]:
        worst = 0.0
        for theta in rp.rope_frequencies(128, base=10000.0):
            phi32 = float(np.float32(np.float32(p) * np.float32(theta)))
            worst = max(worst, abs(phi32 - p * theta))
        assert low < worst < high, (p, worst)


def test_float32_angles_at_small_positions_agree_with_the_exact_ones(xp):
    x = xp.reshape(xp.arange(48.0), (3, 16)) / 48
    exact = rp.rope_rotate(x, offset=5, scaling=VARIANTS["linear"], rotary_dim=16)
    f32 = rp.rope_rotate(x, offset=5, scaling=VARIANTS["linear"], rotary_dim=16,
                         angles="float32")
    np.testing.assert_allclose(np.asarray(f32), np.asarray(exact), atol=1e-6)


def test_cos_sin_are_those_of_the_positions_in_use(xp):
    cos, sin = rp.rope_cos_sin(3, rotary_dim=RD, offset=5, base=BASE,
                               scaling=VARIANTS["yarn"], xp=xp)
    assert cos.shape == (3, RD // 2) and cos.dtype == xp.float64
    thetas, a = _thetas("yarn", 8), ref.rope_attention_factor(VARIANTS["yarn"])
    want = [[a * math.cos((5 + i) * th) for th in thetas] for i in range(3)]
    np.testing.assert_allclose(np.asarray(cos), want, rtol=1e-14)
    x = xp.ones((3, RD), dtype=xp.float64)
    rotated = rp.rope_rotate(x, offset=5, base=BASE, scaling=VARIANTS["yarn"])
    np.testing.assert_allclose(np.asarray(rotated[:, :RD // 2]), np.asarray(cos - sin),
                               rtol=1e-14)


# -- bad input ----------------------------------------------------------------------


@pytest.mark.parametrize(("scaling", "match"), [
    ({"rope_type": "ntk"}, r"`scaling\[\"rope_type\"\]` must be one of 'default', .*got 'ntk'"),
    ({"rope_type": "linear"}, r"needs `scaling\[\"factor\"\]`"),
    ({"rope_type": "linear", "factor": -2.0}, r"`scaling\[\"factor\"\]` must be > 0, got -2.0"),
    ({"rope_type": "linear", "factor": "2"}, r"`scaling\[\"factor\"\]` must be a real number"),
    ({"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4},
     r"takes the fields factor; got 'rope_theta'; pass rope_theta as `base`"),
    ({"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 0},
     r"`scaling\[\"original_max_position_embeddings\"\]` must be >= 1, got 0"),
    ({"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 8,
      "softmax_mscale": True}, r"`scaling\[\"softmax_mscale\"\]` needs"),
    ({"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 8,
      "truncate": "yes"}, r"`scaling\[\"truncate\"\]` must be True or False"),
    ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0, "high_freq_factor": 1.0,
      "original_max_position_embeddings": 64}, r"`scaling\[\"high_freq_factor\"\]` must be >"),
    ({"rope_type": "longrope", "short_factor": [1.0] * 4, "long_factor": [1.0] * 4,
      "original_max_position_embeddings": 8}, r"needs `scaling\[\"factor\"\]` or"),
    ({"rope_type": "longrope", "short_factor": [1.0] * 3, "long_factor": [1.0] * 4,
      "original_max_position_embeddings": 8, "factor": 2.0},
     r"`scaling\[\"short_factor\"\]` must have rotary_dim / 2 = 4 entries, got 3"),
    ({"rope_type": "longrope", "short_factor": [1.0] * 4, "long_factor": [1.0] * 5,
      "original_max_position_embeddings": 8, "factor": 2.0},  # a short call reads no long one
     r"`scaling\[\"long_factor\"\]` must have rotary_dim / 2 = 4 entries, got 5"),
    ({"rope_type": "longrope", "short_factor": [1.0, -1.0, 1.0, 1.0], "long_factor": [1.0] * 4,
      "original_max_position_embeddings": 8, "factor": 2.0},
     r"`scaling\[\"short_factor\"\]\[1\]` must be > 0"),
    ({"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 8,
      "policy": "sometimes"}, r"`scaling\[\"policy\"\]` must be one of 'per_call', 'fixed'"),
    ({"rope_type": "proportional", "partial_rotary_factor": 1.5},
     r"`scaling\[\"partial_rotary_factor\"\]` must be in \[0, 1\], got 1.5"),
    ("yarn", r"`scaling` must be a mapping with a 'rope_type'"),
])
def test_bad_scaling_is_named(xp, scaling, match):
    q = xp.zeros((3, RD))
    with pytest.raises(ValueError, match=match):
        rp.rope_attention(q, q, q, scaling=scaling)


def test_other_bad_input_is_named(xp):
    q = xp.zeros((3, RD))
    with pytest.raises(ValueError, match="`angles` must be one of 'float64', 'float32'"):
        rp.rope_attention(q, q, q, angles="float16")
    with pytest.raises(ValueError, match=r"`length` .* is needed by rope_type 'dynamic'"):
        rp.rope_frequencies(RD, scaling=VARIANTS["dynamic"])
    with pytest.raises(ValueError, match="`length` must be >= 0, got -1"):
        rp.rope_rotate(q, length=-1)
    with pytest.raises(ValueError, match="yarn scaling needs `base` > 1"):
        rp.rope_rotate(q, base=1.0, scaling=VARIANTS["yarn"])
    with pytest.raises(ValueError, match=r"`scaling\[\"policy\"\]` 'fixed' needs"):
        rp.rope_rotate(q, scaling={**VARIANTS["longrope"], "policy": "fixed", "factor": 2.0,
                                   "max_position_embeddings": None})


@pytest.mark.parametrize("name", list(VARIANTS))
def test_float32_frequencies_are_float32_values_within_ulps_of_the_exact_ones(name):
    from relpos_ref.schemes.rope_float32 import float32_frequencies

    scaling = rope_scaling.check_scaling(VARIANTS[name])
    for length in (3, 40):
        got = float32_frequencies(RD, base=BASE, scaling=scaling, length=length)
        exact = _thetas(name, length)
        assert all(float(np.float32(g)) == g for g in got)
        # YaRN's blend weighs by 1 - (1 - ramp) in float32: a small ramp keeps few bits
        rtol = 2.0**-16 if name.startswith("yarn") else 4 * 2.0**-24
        np.testing.assert_allclose(got, exact, rtol=rtol, atol=0)


# -- every fast path reads the rotation: the distance form, blocked, FlexAttention, Triton ----


def _variant_call(name, t_q=7, t_k=19, q_offset=12):
    rng = np.random.default_rng(9)
    q, k, v = (rng.standard_normal((2, t, D)) for t in (t_q, t_k, t_k))
    kwargs = {"base": BASE, "rotary_dim": RD, "scaling": VARIANTS[name], "q_offset": q_offset,
              "causal": True}
    with kernels.disabled():
        want = np.asarray(rp.rope_attention(q, k, v, **kwargs))
    return (q, k, v), kwargs, want


@pytest.mark.parametrize("name", list(VARIANTS))
def test_the_distance_form_and_blocked_evaluation_follow_the_rotation(name):
    from relpos_ref.lowering import form_attention, lower

    (q, k, v), kwargs, want = _variant_call(name)
    np.testing.assert_allclose(np.asarray(form_attention(lower("rope", q, k, v, **kwargs))),
                               want, rtol=1e-12, atol=1e-12)
    for block in (4, 64):  # query chunks and key blocks rotate with the whole call's length
        got = rp.blocked_attention(q, k, v, scheme="rope", block_size=block, **kwargs)
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-12, atol=1e-12)
        with kernels.disabled():
            got = rp.blocked_attention(q, k, v, scheme="rope", block_size=block, **kwargs)
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-12, atol=1e-12)
    torch = pytest.importorskip("torch")
    got = rp.blocked_attention(*(torch.tensor(a) for a in (q, k, v)), scheme="rope",
                               block_size=4, **kwargs)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", ["dynamic", "yarn-deepseek", "longrope"])
def test_blocked_over_dask_chunks_follows_the_rotation(name):
    dask = pytest.importorskip("dask")
    da = pytest.importorskip("dask.array")
    (q, k, v), kwargs, want = _variant_call(name)
    chunked = [da.from_array(a, chunks=(1, 3, D)) for a in (q, k, v)]  # chunks of 3 queries
    got = rp.blocked_attention(*chunked, scheme="rope", block_size=4, **kwargs)
    with dask.config.set(scheduler="sync"):
        np.testing.assert_allclose(np.asarray(got.compute()), want, rtol=1e-12, atol=1e-12)


def _unfused_flex():
    # FlexAttention's unfused path without its warning (as tests/test_flex.py runs it)
    import contextlib
    from unittest import mock

    from torch.nn.attention import flex_attention as module

    name = "_FLEX_ATTENTION_DISABLE_COMPILE_DEBUG"
    if not hasattr(module, name):
        return contextlib.nullcontext()
    return mock.patch.object(module, name, True)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_the_flex_export_follows_the_rotation(name):
    torch = pytest.importorskip("torch")
    flex = pytest.importorskip("relpos_ref.flex")
    (q, k, v), kwargs, want = _variant_call(name)
    q, k, v = (torch.tensor(a[None]) for a in (q, k, v))  # (batch, heads, t, d)
    with _unfused_flex():
        got = flex.attend("rope", q, k, v, **kwargs)
    np.testing.assert_allclose(got[0].numpy(), want, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_the_triton_kernel_follows_the_rotation(name):
    torch = pytest.importorskip("torch")
    pytest.importorskip("triton")
    kt = pytest.importorskip("relpos_ref.kernels.triton")
    if not kt.INTERPRETER:
        pytest.skip("Triton compiles here: the GPU check runs it")
    (q, k, v), kwargs, want = _variant_call(name)
    with kt.interpreted():
        got = kt.KERNELS["rope"](*(torch.tensor(a) for a in (q, k, v)), **kwargs)
    assert got is not NotImplemented
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("angles", ["float64", "float32"])
@pytest.mark.parametrize("name", ["yarn", "longrope", "proportional"])
def test_a_device_without_float64_runs_every_mode(name, angles):
    xp = pytest.importorskip("array_api_strict")
    device = xp.Device("no_float64")
    rng = np.random.default_rng(10)
    q, k, v = (xp.asarray(rng.standard_normal((2, t, D)).astype(np.float32), device=device)
               for t in (5, 9, 9))
    kwargs = {"base": BASE, "rotary_dim": RD, "scaling": VARIANTS[name], "angles": angles,
              "q_offset": 4}
    got = rp.rope_attention(q, k, v, **kwargs)
    assert got.dtype == xp.float32 and got.device == device
    host = [np.from_dlpack(a.to_device(xp.Device("CPU_DEVICE"))).astype(np.float64)
            for a in (q, k, v)]
    want = rp.rope_attention(*host, **kwargs)
    np.testing.assert_allclose(np.from_dlpack(got.to_device(xp.Device("CPU_DEVICE"))), want,
                               rtol=1e-5, atol=1e-5)
