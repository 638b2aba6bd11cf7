"""The Triton backward kernels equal the specification's VJPs (on the CPU, interpreted).

Forms without window terms (plain attention with its dense terms, absolute,
bias, grid2d, T5, ALiBi, Swin, RoPE) run the fused backward kernels, and
the gradients of the scheme's own arguments follow by autograd through the
lowering; the other schemes hand the call back. Hypothesis draws the calls
of `test_kernels_vjp.vjp_calls` (shapes with broadcast batches, offsets,
causality, masks with empty rows, scales, per-head tables, a cotangent that
broadcasts) in float64, float32, float16 and bfloat16, with tiles of 16, and
a longer call spans several tiles each way.
"""

from __future__ import annotations

from unittest import mock

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_kernels_triton import (
    DTYPES,
    INTERPRETED,
    INTERPRETED_EXAMPLES,
    _on,
    _small_tiles,
    _tensor,
    kt,
    torch,
)
from test_kernels_vjp import vjp_calls

import relpos_ref as rp
from relpos_ref import catalog, kernels
from relpos_ref.kernels import _triton_tiling, _triton_vjp
from relpos_ref.lowering import lower

TOL = {"float64": (1e-9, 1e-11), "float32": (2e-4, 2e-5), "float16": (2e-2, 1e-2),
       "bfloat16": (8e-2, 4e-2)}


def _public(scheme):
    return "attention_vjp" if scheme == "plain" else f"{scheme}_attention_vjp"


def _spec(scheme, args, kwargs):
    with kernels.disabled():
        return getattr(rp, _public(scheme))(*args, **kwargs)


def _run(scheme, args, kwargs, backward_tiles=((16, 16), (16, 16), 4)):
    context = kt.interpreted() if INTERPRETED else mock.patch.dict({})
    tiles = dict.fromkeys(_triton_tiling.BACKWARD_TILES, backward_tiles)
    with context, _small_tiles(), mock.patch.dict(_triton_tiling.BACKWARD_TILES, tiles):
        return kt.VJP_KERNELS[scheme](*args, **kwargs)


def _outcome(function):
    try:
        return "ok", function()
    except (TypeError, ValueError) as exc:
        return type(exc), str(exc)


def _assert_gradients(got, want, dtype):
    assert sorted(got) == sorted(want)
    rtol, atol = TOL[dtype]
    for name, expected in want.items():
        found = got[name]
        assert found.dtype == expected.dtype and found.shape == expected.shape, name
        scale = max(1.0, float(expected.double().abs().max())) if dtype in (
            "float16", "bfloat16") else 1.0
        np.testing.assert_allclose(found.double().cpu().numpy(),
                                   expected.double().cpu().numpy(), rtol=rtol,
                                   atol=atol * scale, err_msg=name)


@pytest.mark.parametrize("scheme", catalog.names(plain=True))
@INTERPRETED_EXAMPLES
@given(data=st.data(), dtype=st.sampled_from(list(DTYPES)))
def test_vjp_kernel_equals_the_specification(scheme, data, dtype):
    args, kwargs = data.draw(vjp_calls(scheme))
    args, kwargs = _on(DTYPES[dtype], args, kwargs)
    want = _outcome(lambda: _spec(scheme, args, kwargs))
    got = _outcome(lambda: _run(scheme, args, kwargs))
    empty = 0 in (args[0].shape[-2], args[1].shape[-2])
    covered = want[0] == "ok" and _triton_vjp.covers(lower(scheme, *args, **{
        n: a for n, a in kwargs.items() if n != "d_output"}))
    if got[1] is NotImplemented:
        assert not covered or empty, "a covered call was declined"
        return
    assert got[0] == want[0], (got, want)
    if want[0] == "ok":
        assert covered
        _assert_gradients(got[1], want[1], dtype)
    else:  # refused with the specification's own message
        assert got == want


@pytest.mark.parametrize("scheme", ["bias", "alibi", "t5", "rope", "plain"])
@pytest.mark.parametrize("causal", [False, True])
def test_vjp_kernel_over_several_tiles(scheme, causal):
    """50 queries and 70 keys: tiles of 16 each way, an offset, per-head tables, a mask."""
    data = np.random.default_rng(11)
    q, k, v = (_tensor(data.standard_normal(s), torch.float64)
               for s in ((2, 50, 16), (2, 70, 16), (2, 70, 8)))
    tables = {"bias": [_tensor(data.standard_normal((2, 21)), torch.float64)],
              "t5": [_tensor(data.standard_normal((2, 16)), torch.float64)]}.get(scheme, [])
    kwargs = {"causal": causal, "q_offset": 20, "mask": _tensor(data.random((50, 70)) < 0.9,
                                                                 None),
              "d_output": _tensor(data.standard_normal((2, 50, 8)), torch.float64)}
    if scheme == "t5":
        kwargs["max_distance"] = 40
    if scheme == "plain":
        kwargs["bias"] = _tensor(data.standard_normal((50, 70)), torch.float64)
    args = (q, k, v, *tables)
    _assert_gradients(_run(scheme, args, kwargs), _spec(scheme, args, kwargs), "float64")


@pytest.mark.parametrize("scheme", ["bias", "plain"])
def test_the_two_backward_kernels_walk_their_own_tiles(scheme):
    """dQ on tiles of 16 queries and 32 keys, dK/dV on 32 queries and 64 keys.

    Each kernel's grid, walk and window of distances (a bias row's gradient
    by diagonals: 64 wide for dQ's tiles, 128 for the others) come from its
    own tiles, which differ in every size; causal, an offset and a mask.
    """
    data = np.random.default_rng(12)
    q, k, v = (_tensor(data.standard_normal(s), torch.float64)
               for s in ((2, 50, 16), (2, 70, 16), (2, 70, 8)))
    tables = [_tensor(data.standard_normal((2, 21)), torch.float64)] if scheme == "bias" else []
    kwargs = {"causal": True, "q_offset": 20,
              "mask": _tensor(data.random((50, 70)) < 0.9, None),
              "d_output": _tensor(data.standard_normal((2, 50, 8)), torch.float64)}
    if scheme == "plain":
        kwargs["bias"] = _tensor(data.standard_normal((2, 50, 70)), torch.float64)
    args = (q, k, v, *tables)
    got = _run(scheme, args, kwargs, backward_tiles=((16, 32), (32, 64), 4))
    _assert_gradients(got, _spec(scheme, args, kwargs), "float64")


@pytest.mark.parametrize("max_distance", [0, 1, 4, 5, 14, 15, 16, 17])
def test_a_bias_tile_beyond_the_band_adds_its_gradient_at_one_entry(max_distance):
    """Tiles of 16: a window of 31 distances ends at the clipped end, or one past it.

    The tiles' smallest differences are ``24 + 16 m`` (``c = j - i + 39``)
    and the table's first row covers ``c <= 42 - K``, its last ``c >= 42 +
    K``: K = 4 and 14 put a tile's window exactly at an end, 5 and 15 one
    difference over it.
    """
    data = np.random.default_rng(max_distance)
    q, k, v = (_tensor(data.standard_normal((2, t, 8)), torch.float64) for t in (40, 48, 48))
    table = _tensor(data.standard_normal((2, 2 * max_distance + 1)), torch.float64)
    kwargs = {"q_offset": 3, "d_output": _tensor(data.standard_normal((2, 40, 8)),
                                                 torch.float64)}
    args = (q, k, v, table)
    _assert_gradients(_run("bias", args, kwargs), _spec("bias", args, kwargs), "float64")


def test_a_window_scheme_and_a_recorded_call_hand_back():
    q = k = v = _tensor(np.ones((2, 4, 4)), torch.float32)
    d_output = _tensor(np.ones((2, 4, 4)), torch.float32)
    table = _tensor(np.ones((3, 4)), torch.float32)
    assert _run("shaw", (q, k, v, table), {"d_output": d_output}) is NotImplemented
    leaf = q.clone().requires_grad_(True)  # the specification's gradients are differentiable
    assert _run("plain", (leaf, k, v), {"d_output": d_output}) is NotImplemented
    assert _run("plain", (q, k, v), {"d_output": d_output}) is not NotImplemented


def test_a_variant_triton_cannot_build_hands_the_vjp_back_with_a_warning(monkeypatch):
    monkeypatch.setattr(kt, "_UNBUILT", set())  # warned once per process: anew here
    # as the forward: triton 3.6 failed to build every float64 backward kernel for sm_90
    q = k = v = d_output = _tensor(np.ones((2, 4, 4)), torch.float64)
    failure = RuntimeError("PassManager::run failed")
    with mock.patch.object(kt, "form_gradients", side_effect=failure), \
            pytest.warns(RuntimeWarning, match="could not be built for this call"):
        assert _run("alibi", (q, k, v), {"d_output": d_output}) is NotImplemented
    with mock.patch.object(kt, "form_gradients", side_effect=RuntimeError("a real fault")), \
            pytest.raises(RuntimeError, match="a real fault"):
        _run("alibi", (q, k, v), {"d_output": d_output})


def test_bad_cotangent_gets_the_specification_message():
    q = k = v = _tensor(np.ones((2, 4, 4)), torch.float32)
    with pytest.raises(ValueError, match="d_output"):
        _run("plain", (q, k, v), {"d_output": _tensor(np.ones((2, 5, 4)), torch.float32)})


@pytest.mark.parametrize("q_offset", [-1, 0, 1, 15, 16, 17, 20])
def test_causal_gradients_reach_every_query_a_key_tile_is_seen_by(q_offset):
    """Query tiles wholly before a key tile's first viewer are skipped, and no other."""
    data = np.random.default_rng(4)
    q, k, v = (_tensor(data.standard_normal((2, t, 16)), torch.float64) for t in (48, 64, 64))
    kwargs = {"causal": True, "q_offset": q_offset,
              "d_output": _tensor(data.standard_normal((2, 48, 16)), torch.float64)}
    _assert_gradients(_run("plain", (q, k, v), kwargs), _spec("plain", (q, k, v), kwargs),
                      "float64")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_16_bit_gradients_keep_float32_accuracy(dtype):
    """``p`` and ``dl`` split in two 16-bit parts: cotangents of +-1000 that cancel.

    Rounded to 16 bits, the weights would put ``dv`` off by about 2^-9 * 1000
    (bfloat16); kept to float32's accuracy it stays within the gradient's own
    rounding to the dtype.
    """
    data = np.random.default_rng(6)
    sign = np.where(np.arange(64) % 2 == 0, 1.0, -1.0)
    q, k, v = (_tensor(data.standard_normal((2, 64, 16)) / 2, DTYPES[dtype]) for _ in range(3))
    d_output = _tensor(1000 * sign[:, None] * (1 + data.random((2, 64, 16)) / 64),
                       DTYPES[dtype])
    got = _run("plain", (q, k, v), {"d_output": d_output})
    exact = _spec("plain", [a.double() for a in (q, k, v)], {"d_output": d_output.double()})
    rounding = 2.0 ** -10 if dtype == "float16" else 2.0 ** -7
    for name in ("q", "k", "v"):
        error = (got[name].double() - exact[name]).abs()
        assert bool((error <= exact[name].abs() * rounding + 0.05).all()), name
