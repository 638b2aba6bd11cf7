"""xPos against its peers, its centre, its range rule, and its kernels against the specification.

- torchscale 0.3.0's ``XPOS`` (``torchscale/component/xpos_relative_position.py``):
  interleaved pairs, ``scale_base = 512``, the scales centred at
  ``ceil(L / 2)`` of ``L = length + offset`` (``min_pos = -(length + offset) // 2``),
  the angles at the positions themselves; ``MultiheadAttention`` scales the
  keys down at offset 0 and the queries up at ``offset = src_len - 1`` when
  decoding, so both share the centre. Its angles and scales are float32.
- x-transformers' ``RotaryEmbedding(use_xpos=True)`` with
  ``apply_rotary_pos_emb``: interleaved pairs, ``ζ`` over the rotary width,
  the scales centred at ``max_pos // 2`` (``L // 2``) of the positions it is
  given, the keys with ``scale ** -1``; queries take the last ``t_q`` rows.
- the dispatched kernels (NumPy, torch) against the specification by
  hypothesis: masks, offsets, centres, pairings, partial rotation, dtypes,
  forward and VJP.

The largest differences measured are printed (``-s``) and bounded here.
"""

from __future__ import annotations

import numpy as np
import pytest
from _calls import draw_mask
from hypothesis import given, settings
from hypothesis import strategies as st

import relpos_ref as rp
from relpos_ref import kernels
from relpos_ref.schemes import xpos

RNG = np.random.default_rng(29)


def _largest(name, got, want):
    """The largest difference relative to the largest magnitude of `want` (printed)."""
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    diff = float(np.abs(got - want).max(initial=0.0))
    relative = diff / max(float(np.abs(want).max(initial=0.0)), 1e-300)
    print(f"{name}: largest difference {diff:.3g} ({relative:.3g} of the largest entry)")
    return relative


# -- torchscale --------------------------------------------------------------------


@pytest.mark.peers
@pytest.mark.parametrize(("t", "scale_base"), [(9, 512), (64, 16), (700, 512)])
def test_torchscale_xpos_equals_ours_with_the_upper_middle(t, scale_base):
    torch = pytest.importorskip("torch")
    ts = pytest.importorskip("torchscale.component.xpos_relative_position",
                             reason="torchscale is not installed")
    d = 16
    module = ts.XPOS(d, scale_base=scale_base)
    q, k = RNG.standard_normal((2, 3, t, d))  # torchscale's (batch * heads, t, d)
    theirs_q = module(torch.from_numpy(q).float(), offset=0, downscale=False).double().numpy()
    theirs_k = module(torch.from_numpy(k).float(), offset=0, downscale=True).double().numpy()
    rotation = {"scale_base": float(scale_base), "center": "middle_up"}
    ours_q = xpos.xpos_rotate(q, **rotation)
    ours_k = xpos.xpos_rotate(k, key=True, **rotation)
    # their angles p θ and scales are float32: p θ carries p 2^-24 of rounding
    tol = 2e-7 * max(8, t)
    assert _largest(f"torchscale q t={t}", theirs_q, ours_q) < tol
    assert _largest(f"torchscale k t={t}", theirs_k, ours_k) < tol
    # their logits, softmax and output against ours
    v = RNG.standard_normal((3, t, 4))
    w = torch.softmax(torch.from_numpy(theirs_q @ np.swapaxes(theirs_k, -1, -2)) / d**0.5,
                      dim=-1).numpy()
    with kernels.disabled():
        out = xpos.xpos_attention(q, k, v, **rotation)
    assert _largest(f"torchscale output t={t}", w @ v, out) < 10 * tol


@pytest.mark.peers
def test_torchscale_decode_step_shares_the_keys_centre():
    torch = pytest.importorskip("torch")
    ts = pytest.importorskip("torchscale.component.xpos_relative_position",
                             reason="torchscale is not installed")
    d, src_len = 8, 13
    module = ts.XPOS(d, scale_base=16)
    q, k = RNG.standard_normal((1, 1, d)), RNG.standard_normal((1, src_len, d))
    # MultiheadAttention when decoding: k at offset 0, q at offset src_len - 1
    theirs_q = module(torch.from_numpy(q).float(), offset=src_len - 1).double().numpy()
    theirs_k = module(torch.from_numpy(k).float(), offset=0, downscale=True).double().numpy()
    ours_q = xpos.xpos_rotate(q, offset=src_len - 1, scale_base=16.0, center="middle_up")
    ours_k = xpos.xpos_rotate(k, key=True, scale_base=16.0, center="middle_up")
    assert _largest("torchscale decode q", theirs_q, ours_q) < 4e-6
    assert _largest("torchscale decode k", theirs_k, ours_k) < 4e-6
    # torchscale's decoding step is its full forward's last row
    full_q = module(torch.from_numpy(np.concatenate([k[:, :-1], q], axis=1)).float())
    np.testing.assert_allclose(full_q[:, -1:].double().numpy(), theirs_q, rtol=0, atol=1e-5)


# -- x-transformers ------------------------------------------------------------------


@pytest.mark.peers
@pytest.mark.parametrize(("t_q", "t_k", "rotary_dim"), [(7, 7, 8), (1, 12, 8), (5, 11, 4)])
def test_x_transformers_xpos_equals_ours_with_the_lower_middle(t_q, t_k, rotary_dim):
    torch = pytest.importorskip("torch")
    xt = pytest.importorskip("x_transformers.x_transformers",
                             reason="x-transformers is not installed")
    d, gamma = 8, 32
    rotary = xt.RotaryEmbedding(rotary_dim, use_xpos=True, scale_base=gamma).double()
    freqs, scale = rotary(torch.arange(t_k))  # the keys' positions; queries: the last t_q
    q, k = RNG.standard_normal((2, 3, t_q, d)), RNG.standard_normal((2, 3, t_k, d))
    theirs_q = xt.apply_rotary_pos_emb(torch.from_numpy(q), freqs, scale).numpy()
    theirs_k = xt.apply_rotary_pos_emb(torch.from_numpy(k), freqs, scale**-1).numpy()
    call = xpos.xpos_call(q, k, k, q_offset=t_k - t_q)
    rotation = {"rotary_dim": rotary_dim, "scale_base": float(gamma), "center": "middle"}
    ours_q, ours_k = xpos.xpos_pair(q, k, call, **rotation)
    # their frequencies are float32's base ** (2c / R), cast: p θ to 1e-7 relative
    tol = 2e-6
    assert _largest(f"x-transformers q {t_q}x{t_k}", theirs_q, ours_q) < tol
    assert _largest(f"x-transformers k {t_q}x{t_k}", theirs_k, ours_k) < tol


@pytest.mark.peers
def test_the_two_peers_centres_differ_by_one_on_odd_lengths_and_the_attention_does_not():
    q, k, v = (RNG.standard_normal((2, 9, 8)) for _ in range(3))
    assert (xpos.xpos_center("middle", 9), xpos.xpos_center("middle_up", 9)) == (4, 5)
    with kernels.disabled():
        outs = [xpos.xpos_attention(q, k, v, scale_base=4.0, center=c, causal=True)
                for c in ("middle", "middle_up", 0, -3)]
        rotated = [xpos.xpos_rotate(q, scale_base=4.0, center=c) for c in ("middle", 0)]
    for out in outs[1:]:
        np.testing.assert_allclose(out, outs[0], rtol=0, atol=1e-13)
    assert np.abs(rotated[0] - rotated[1]).max() > 0.1  # the operands do depend on it


# -- the range rule ------------------------------------------------------------------


def test_scales_beyond_the_dtype_are_refused_naming_the_centre():
    q = k = v = np.zeros((1, 2, 8), dtype=np.float32)
    xpos.xpos_attention(q, k, v, q_offset=35_000, center=0)  # |p| <= 35694: fine
    with pytest.raises(ValueError, match=r"`center` 0 leaves positions .* centre the call "
                                         r"\(center='middle'\) \(or use float64\)"):
        xpos.xpos_attention(q, k, v, q_offset=40_000, center=0)
    # centred already, or beyond even the centre's reach: the advice is the scale base
    wide = np.zeros((1, 80_000, 8), dtype=np.float32)
    for center in (0, "middle"):
        with pytest.raises(ValueError, match=r"a `scale_base` above 574 keeps the centred call "
                                             r"in range \(or use float64\)"):
            xpos.xpos_attention(q, wide, wide, center=center)
    # the same call, centred at L // 2 = 20001: each scale within float32
    out = xpos.xpos_attention(q + 1, k + 1, v + 1, q_offset=40_000, center="middle")
    assert np.isfinite(out).all()
    xpos.xpos_attention(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64),
                        q_offset=40_000, center=0)  # float64 reaches 289519


@pytest.mark.parametrize(("dtype", "reach"), [(np.float16, 3966), (np.float32, 35694),
                                              (np.float64, 289519)])
def test_rotated_rows_stay_in_their_own_dtype_or_are_refused(dtype, reach):
    # a float16 array is rotated in float32 and returned in float16: its scales must fit
    # float16, not float32 (no inf, no flushed zeros)
    x = np.ones((1, 4, 4), dtype=dtype)
    for key in (False, True):
        y = xpos.xpos_rotate(x, offset=reach - 3, center=0, key=key)
        assert y.dtype == dtype and np.isfinite(y).all() and (np.abs(y[..., ::2]) > 0).all()
        with pytest.raises(ValueError, match=rf"\(\|p - center\| <= {reach}\)"):
            xpos.xpos_rotate(x, offset=reach - 2, center=0, key=key)


def test_bad_options_name_themselves():
    q = k = v = np.zeros((2, 4))
    for kwargs, match in [({"center": "end"}, "`center` must be one of"),
                          ({"center": 1.5}, "`center` must be an integer"),
                          ({"scale_base": 0.0}, "`scale_base` must be > 0, got 0.0"),
                          ({"scale_offset": -1}, "`scale_offset` must be > 0, got -1.0"),
                          ({"rotary_dim": 3}, "rotary_dim"),
                          ({"layout": "pairs"}, "`layout`")]:
        with pytest.raises(ValueError, match=match):
            rp.xpos_attention(q, k, v, **kwargs)


def test_decay_is_zeta_to_the_distance_over_gamma():
    # one pair (theta_0 = 1), q = k = (1, 0): the logit of query n and key m is
    # zeta_0^((n - m)/gamma) cos((n - m) theta_0), whatever the centre
    q = np.asarray([[1.0, 0.0]])
    k = np.tile(q, (5, 1))
    call = xpos.xpos_call(q, k, k, q_offset=4)
    qr, kr = xpos.xpos_pair(q, k, call, scale_base=2.0)
    zeta = 0.4 / 1.4
    want = [zeta ** ((4 - m) / 2.0) * np.cos(4 - m) for m in range(5)]
    np.testing.assert_allclose((qr @ kr.T)[0], want, rtol=1e-14)


# -- the dispatched kernels equal the specification ------------------------------------


@st.composite
def _calls(draw, library):
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    dtype = draw(st.sampled_from(["float32", "float64", "float16"]))
    heads, t_q, t_k = draw(st.integers(1, 3)), draw(st.integers(1, 9)), draw(st.integers(1, 9))
    lead = draw(st.sampled_from([(heads,), (2, heads)]))
    q, k, v = (rng.standard_normal((*lead, t, w)).astype(dtype)
               for t, w in ((t_q, 8), (t_k, 8), (t_k, 3)))
    kwargs = {"q_offset": draw(st.integers(-4, 8)), "causal": draw(st.booleans()),
              "mask": draw_mask(draw, rng, t_q, t_k), "scale": draw(st.sampled_from([None, 0.7])),
              "layout": draw(st.sampled_from(["interleaved", "half"])),
              "rotary_dim": draw(st.sampled_from([None, 4])),
              "scale_base": draw(st.sampled_from([4.0, 512.0])),
              "center": draw(st.sampled_from(["middle", "middle_up", 0, 5]))}
    if kwargs["mask"] is not None and kwargs["mask"].ndim > 2:
        kwargs["mask"] = None  # the VJPs refuse masks that widen the batch
    d_output = rng.standard_normal((*lead, t_q, 3)).astype(dtype)
    if library == "torch":
        import torch

        def convert(a):
            return torch.from_numpy(a) if isinstance(a, np.ndarray) else a

        q, k, v, d_output = map(convert, (q, k, v, d_output))
        kwargs = {n: convert(a) for n, a in kwargs.items()}
    return (q, k, v), kwargs, d_output


def _close(got, want, dtype):
    tol = {"float16": 4e-3, "float32": 2e-4}.get(str(dtype).rsplit(".", 1)[-1], 1e-10)
    np.testing.assert_allclose(np.asarray(got, dtype=np.float64),
                               np.asarray(want, dtype=np.float64), rtol=tol, atol=tol)


@pytest.mark.parametrize("library", ["numpy", "torch"])
@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_dispatched_kernels_equal_the_specification(library, data):
    if library == "torch":
        pytest.importorskip("torch", reason="torch is not installed")
    (q, k, v), kwargs, d_output = data.draw(_calls(library))
    assert kernels.kernel_for("xpos", (q, k, v)) is not None
    got = rp.xpos_attention(q, k, v, **kwargs)
    got_grads = rp.xpos_attention_vjp(q, k, v, d_output=d_output, **kwargs)
    with kernels.disabled():
        want = rp.xpos_attention(q, k, v, **kwargs)
        want_grads = rp.xpos_attention_vjp(q, k, v, d_output=d_output, **kwargs)
    assert got.dtype == want.dtype == q.dtype
    _close(got, want, q.dtype)
    assert sorted(got_grads) == sorted(want_grads) == ["k", "q", "v"]
    for name, g in want_grads.items():
        assert tuple(got_grads[name].shape) == tuple(g.shape), name
        scale = max(1.0, float(np.abs(np.asarray(g, dtype=np.float64)).max(initial=0.0)))
        _close(np.asarray(got_grads[name], dtype=np.float64) / scale,
               np.asarray(g, dtype=np.float64) / scale, q.dtype)


def test_the_vjp_is_autograd_of_the_specification():
    torch = pytest.importorskip("torch")
    q, k, v = (torch.from_numpy(RNG.standard_normal((2, 6, 8))).requires_grad_(True)
               for _ in range(3))
    kwargs = {"q_offset": 2, "causal": True, "scale_base": 4.0, "center": "middle_up",
              "rotary_dim": 6}
    with kernels.disabled():
        out = xpos.xpos_attention(q, k, v, **kwargs)
        d_output = torch.from_numpy(RNG.standard_normal(tuple(out.shape)))
        want = torch.autograd.grad(out, (q, k, v), d_output)
        got = xpos.xpos_attention_vjp(q.detach(), k.detach(), v.detach(), d_output=d_output,
                                      **kwargs)
    for name, w in zip("qkv", want, strict=True):
        np.testing.assert_allclose(got[name].numpy(), w.numpy(), rtol=0, atol=1e-12)
