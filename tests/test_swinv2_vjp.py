"""Swin v2's VJP: every argument, cosine attention, masks and the additive mask penalty.

`relpos_ref.swinv2_attention_vjp` against central finite differences of the
forward pass (no autodiff) and against ``torch.autograd`` through the
specification, for ``q, k, v, w1, b1, w2`` and ``logit_scale``; shared and
per-head MLPs, ``tau`` shared or per head, masks left out or penalized. The
clamp at ``log 100`` stops ``tau``'s gradient.
"""

from __future__ import annotations

import contextlib

import numpy as np
import pytest

import relpos_ref as rp
from relpos_ref import kernels

WH, WW, H, M, D = 2, 3, 2, 4, 3
N = WH * WW
NAMES = ("q", "k", "v", "w1", "b1", "w2", "logit_scale")

#: (per-head MLP, logit_scale shape or None, masked, mask_penalty)
CASES = [
    (True, (H,), True, None),
    (True, (H,), True, -7.0),
    (False, (), True, -200.0),
    (True, None, True, -3.0),
    (False, None, False, None),
    (True, (1,), False, None),
]


def _arrays(per_head, tau_shape, masked, seed=0):
    rng = np.random.default_rng(seed)
    head = (H,) if per_head else ()
    arrays = {
        "q": rng.standard_normal((2, H, N, D)), "k": rng.standard_normal((2, H, N, D)),
        "v": rng.standard_normal((2, H, N, D)), "w1": rng.standard_normal((*head, M, 2)),
        "b1": rng.standard_normal((*head, M)) * 0.5, "w2": rng.standard_normal((*head, M)),
    }
    if tau_shape is not None:  # below the clamp: 1 .. 4
        arrays["logit_scale"] = np.asarray(1.0 + 3.0 * rng.random(tau_shape))
    mask = None
    if masked:
        mask = rng.random((2, 1, N, N)) < 0.6
        mask[1, 0, 2] = False  # a row without keys
    return arrays, mask, rng.standard_normal((2, H, N, D))


def _forward(arrays, mask, penalty):
    kw = {"logit_scale": arrays.get("logit_scale"), "mask": mask, "mask_penalty": penalty}
    return rp.swinv2_attention(*(arrays[n] for n in NAMES[:6]), window_height=WH,
                               window_width=WW, **kw)


def _vjp(arrays, mask, penalty, d_output):
    return rp.swinv2_attention_vjp(
        *(arrays[n] for n in NAMES[:6]), d_output=d_output, window_height=WH, window_width=WW,
        logit_scale=arrays.get("logit_scale"), mask=mask, mask_penalty=penalty,
    )


@pytest.mark.parametrize(("per_head", "tau_shape", "masked", "penalty"), CASES)
def test_vjp_matches_finite_differences(per_head, tau_shape, masked, penalty):
    arrays, mask, d_output = _arrays(per_head, tau_shape, masked)
    with kernels.disabled():
        grads = _vjp(arrays, mask, penalty, d_output)
        assert sorted(grads) == sorted(arrays)
        rng = np.random.default_rng(1)
        eps = 1e-6
        for name in arrays:  # each argument on its own, along a random direction
            u = rng.standard_normal(arrays[name].shape)
            plus = _forward({**arrays, name: arrays[name] + eps * u}, mask, penalty)
            minus = _forward({**arrays, name: arrays[name] - eps * u}, mask, penalty)
            numeric = np.sum(d_output * (plus - minus)) / (2 * eps)
            analytic = np.sum(grads[name] * u)
            assert analytic == pytest.approx(numeric, rel=1e-6, abs=1e-8), name


@pytest.mark.parametrize(("per_head", "tau_shape", "masked", "penalty"), CASES)
def test_vjp_equals_torch_autograd(per_head, tau_shape, masked, penalty):
    torch = pytest.importorskip("torch", reason="torch is not installed")
    arrays, mask, d_output = _arrays(per_head, tau_shape, masked, seed=2)
    with kernels.disabled():
        got = _vjp(arrays, mask, penalty, d_output)
        tensors = {n: torch.from_numpy(a.copy()).requires_grad_(True) for n, a in arrays.items()}
        tmask = None if mask is None else torch.from_numpy(mask)
        _forward(tensors, tmask, penalty).backward(torch.from_numpy(d_output))
    for name, t in tensors.items():
        np.testing.assert_allclose(got[name], t.grad.numpy(), rtol=0, atol=1e-12,
                                   err_msg=name)


def test_autograd_passes_no_gradient_at_a_unit_s_kink():
    # b1 = 0: at the offset (0, 0) every unit's pre-activation is exactly 0, where the VJP
    # (pre > 0) and the reference's torch.relu pass nothing; maximum's rule passed half
    torch = pytest.importorskip("torch", reason="torch is not installed")
    arrays, mask, d_output = _arrays(True, (H,), False, seed=3)
    arrays["b1"] = np.zeros_like(arrays["b1"])
    with kernels.disabled():
        got = _vjp(arrays, mask, None, d_output)
        tensors = {n: torch.from_numpy(a.copy()).requires_grad_(True) for n, a in arrays.items()}
        _forward(tensors, None, None).backward(torch.from_numpy(d_output))
    for name, t in tensors.items():
        np.testing.assert_allclose(got[name], t.grad.numpy(), rtol=0, atol=1e-12,
                                   err_msg=name)


def test_dispatched_vjp_equals_the_specification():
    # the NumPy and torch kernels (declining penalized calls) give the specification's
    torch = pytest.importorskip("torch", reason="torch is not installed")
    for case in CASES:
        arrays, mask, d_output = _arrays(*case[:3])
        with kernels.disabled():
            want = _vjp(arrays, mask, case[3], d_output)
        for convert in (np.asarray, torch.from_numpy):
            got = _vjp({n: convert(a) for n, a in arrays.items()},
                       None if mask is None else convert(mask), case[3], convert(d_output))
            for name, g in got.items():
                np.testing.assert_allclose(np.asarray(g), want[name], rtol=0, atol=1e-12,
                                           err_msg=f"{case} {name}")


def test_the_clamp_stops_the_gradient_of_tau():
    arrays, mask, d_output = _arrays(True, (H,), True)
    arrays["logit_scale"] = np.asarray([np.log(100.0) + 0.5, 2.0])
    grads = _vjp(arrays, mask, None, d_output)
    assert grads["logit_scale"][0] == 0.0 and grads["logit_scale"][1] != 0.0


def test_a_query_of_norm_zero_gets_a_finite_gradient():
    arrays, mask, d_output = _arrays(True, (H,), False)
    arrays["q"][0, 0, 1] = 0.0
    grads = _vjp(arrays, mask, None, d_output)
    assert all(np.isfinite(g).all() for g in grads.values())


@pytest.mark.parametrize("name", ["float32", "float16"])
def test_gradients_keep_a_low_precision_dtype(name):
    arrays, mask, d_output = _arrays(True, (H,), True)
    low = {n: a.astype(name) for n, a in arrays.items()}
    grads = _vjp(low, mask, -7.0, d_output.astype(name))
    want = _vjp(arrays, mask, -7.0, d_output)
    tol = 1e-4 if name == "float32" else 5e-2
    for n, g in grads.items():
        assert g.dtype == np.dtype(name), n
        np.testing.assert_allclose(g.astype(np.float64), want[n], rtol=tol, atol=tol, err_msg=n)


@pytest.mark.parametrize("tau", [2.302585092994046, np.log(100.0) + 0.5])
@pytest.mark.parametrize("use_kernels", [False, True])
def test_one_number_logit_scale_is_every_heads_constant(tau, use_kernels):
    # a number is the array of it per head, forward and backward, with no gradient of its own
    arrays, mask, d_output = _arrays(True, None, True)
    per_head = {**arrays, "logit_scale": np.full(H, tau)}
    with kernels.disabled() if not use_kernels else contextlib.nullcontext():
        got = rp.swinv2_attention(*(arrays[n] for n in NAMES[:6]), window_height=WH,
                                  window_width=WW, logit_scale=tau, mask=mask,
                                  mask_penalty=-100.0, scale=1.0)
        want = _forward(per_head, mask, -100.0)
        np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-13)
        grads = rp.swinv2_attention_vjp(
            *(arrays[n] for n in NAMES[:6]), d_output=d_output, window_height=WH,
            window_width=WW, logit_scale=tau, mask=mask, mask_penalty=-100.0)
        expected = _vjp(per_head, mask, -100.0, d_output)
    assert sorted(grads) == sorted(NAMES[:6])
    for name in NAMES[:6]:
        np.testing.assert_allclose(grads[name], expected[name], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({"logit_scale": float("nan")}, ValueError, "`logit_scale` must be finite, got nan"),
    ({"logit_scale": 2.0, "scale": 0.5}, ValueError,
     r"`scale` must be None \(or 1, the call's\), got 0.5"),
    ({"logit_scale": True}, TypeError, "`logit_scale` must be a number or an array, got True"),
])
def test_bad_logit_scale_is_named(kwargs, error, match):
    arrays, _, _ = _arrays(False, None, False)
    with pytest.raises(error, match=match):
        rp.swinv2_attention(*(arrays[n] for n in NAMES[:6]), window_height=WH,
                            window_width=WW, **kwargs)


def test_tables_of_another_dtype_are_refused_by_name():
    """No silent upcast, as every other scheme: the MLP and an array logit_scale take q's."""
    arrays, _, _ = _arrays(False, None, False)
    tables = [arrays[n] for n in NAMES[3:6]]
    half = [t.astype(np.float16) for t in tables]
    with pytest.raises(TypeError, match=r"no silent upcast.*`w1` is float16"):
        rp.swinv2_attention(*(arrays[n] for n in NAMES[:3]), *half, window_height=WH,
                            window_width=WW)
    with pytest.raises(TypeError, match=r"no silent upcast.*`logit_scale` is float32"):
        rp.swinv2_attention(*(arrays[n] for n in NAMES[:6]), window_height=WH,
                            window_width=WW, logit_scale=np.asarray(2.0, dtype=np.float32))
    # a number is no array, NumPy's scalars included, whatever their width
    out = rp.swinv2_attention(*(arrays[n] for n in NAMES[:6]), window_height=WH,
                              window_width=WW, logit_scale=np.float32(2.0))
    np.testing.assert_array_equal(out, rp.swinv2_attention(
        *(arrays[n] for n in NAMES[:6]), window_height=WH, window_width=WW, logit_scale=2.0))
