"""Positions exact at any offset the API accepts (issue 26, item 4).

The rule (docs/conventions.md, "exact positions"): distances and positions
become floats only where the dtype holds every integer the call reaches, else
in float64 where the device has it (rounded once to the call's dtype); RoPE's
and Transformer-XL's angles are float64 wherever the device has it; ALiBi's
attention adds a constant softmax ignores so that its distances stay small;
beyond ``2**53`` (or beyond the dtype on a device without float64) the call is
refused with the range of exact offsets.

- the reported cases (ALiBi at ``2**30``, RoPE at ``2**24 + 1``) and
  Transformer-XL's sinusoids, in float32 against the float64 definition, on
  every backend, with the kernels and without;
- the backward passes (ALiBi's slopes included) and the blocked paths on NumPy
  and torch;
- the refusals, their exact messages, and a device without float64;
- T5's and DeBERTa's buckets, integers at every offset.
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
import re

import numpy as np
import pytest
from conftest import FLOAT_TOLERANCE

import relpos_ref as rp
from relpos_ref import kernels

HAS_TORCH = importlib.util.find_spec("torch") is not None
LIBRARIES = ["numpy", *(["torch"] if HAS_TORCH else [])]
F32 = FLOAT_TOLERANCE["float32"]
W_R = np.random.default_rng(3).standard_normal((8, 4)).astype(np.float32) / 2


def exactly(message: str) -> str:
    """A `pytest.raises` pattern for `message`, whole."""
    return f"^{re.escape(message)}$"


def _kernels(use: bool):
    return contextlib.nullcontext() if use else kernels.disabled()


def _qkv(t_q=3, t_k=5, seed=0):
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal((2, t, 4)).astype(np.float32) for t in (t_q, t_k, t_k))


CASES = {  # scheme -> (function, tables, keywords) of a call at a far offset
    "alibi": (rp.alibi_attention, (), {"q_offset": 2**30}),
    "alibi-causal-form": (rp.alibi_attention, (), {"q_offset": 2**30 + 7, "symmetric": False}),
    "alibi-before": (rp.alibi_attention, (), {"q_offset": -(2**40) - 3}),
    "rope": (rp.rope_attention, (), {"q_offset": 2**24 + 1}),
    "rope-far": (rp.rope_attention, (), {"q_offset": 3 * 2**33 + 5}),
    "rope-interleaved": (rp.rope_attention, (), {"q_offset": 2**26 + 3,
                                                 "layout": "interleaved"}),
    "transformer_xl": (rp.transformer_xl_attention, (W_R,), {"q_offset": 2**30 + 1,
                                                             "causal": False}),
}


def _definition(function, tables, keywords, arrays):
    # the float64 definition of the same (float32) inputs, the specification's own path
    with kernels.disabled():
        return function(*(a.astype(np.float64) for a in (*arrays, *tables)), **keywords)


@pytest.mark.parametrize("use_kernels", [True, False], ids=["kernels", "spec"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_float32_at_a_far_offset_equals_the_float64_definition(backend, case, use_kernels):
    function, tables, keywords = CASES[case]
    arrays = _qkv()
    want = _definition(function, tables, keywords, arrays)
    with _kernels(use_kernels):
        got = function(*(backend.asarray(a) for a in (*arrays, *tables)), **keywords)
    got = backend.to_numpy(got)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want, **F32)


@pytest.mark.parametrize("library", LIBRARIES)
@pytest.mark.parametrize("case", ["alibi", "alibi-causal-form", "rope", "transformer_xl"])
def test_blocked_attention_at_a_far_offset_equals_the_float64_definition(case, library):
    function, tables, keywords = CASES[case]
    scheme = case.split("-")[0]
    arrays = _qkv(t_q=5, t_k=7)
    want = _definition(function, tables, keywords, arrays)
    make, back = _library(library)
    for use_kernels in (True, False):  # the library's blocked kernel, then the loop
        with _kernels(use_kernels):
            got = rp.blocked_attention(*(make(a) for a in (*arrays, *tables)), scheme=scheme,
                                       block_size=2, **keywords)
        np.testing.assert_allclose(back(got), want, **F32)


def _library(name):
    if name == "numpy":
        return np.asarray, np.asarray
    import torch

    return torch.from_numpy, lambda x: x.numpy()


VJPS = {
    "alibi": (rp.alibi_attention_vjp, (), {"q_offset": 2**30}),
    "alibi-causal-form": (rp.alibi_attention_vjp, (), {"q_offset": 2**30, "symmetric": False,
                                                       "causal": True}),
    "rope": (rp.rope_attention_vjp, (), {"q_offset": 2**24 + 1}),
    "transformer_xl": (rp.transformer_xl_attention_vjp, (W_R,), {"q_offset": 2**30 + 1,
                                                                 "causal": False}),
}


@pytest.mark.parametrize("use_kernels", [True, False], ids=["kernels", "spec"])
@pytest.mark.parametrize("library", LIBRARIES)
@pytest.mark.parametrize("case", sorted(VJPS))
def test_gradients_at_a_far_offset_equal_the_float64_definition(case, library, use_kernels):
    function, tables, keywords = VJPS[case]
    arrays = _qkv()
    d_output = np.random.default_rng(1).standard_normal((2, 3, 4)).astype(np.float32)
    want = _definition(function, tables, {**keywords, "d_output": d_output.astype(np.float64)},
                       arrays)
    make, back = _library(library)
    with _kernels(use_kernels):
        got = function(*(make(a) for a in (*arrays, *tables)), d_output=make(d_output),
                       **keywords)
    for name, value in want.items():  # ALiBi's slopes too: a sum over 2**30-sized distances
        scale = max(1.0, float(np.abs(value).max()))
        np.testing.assert_allclose(back(got[name]), value, rtol=0, atol=4e-6 * scale,
                                   err_msg=name)


def test_alibi_attention_depends_on_j_minus_i_alone_far_in_the_past(backend):
    # every key in the past of every query: -|r| + |q_offset| = j - i, whatever the offset
    q, k, v = (backend.asarray(a) for a in _qkv())
    near = rp.alibi_attention(q, k, v, q_offset=10)
    for far in (2**30, 2**53 + 2**52, 2**61):
        np.testing.assert_array_equal(backend.to_numpy(rp.alibi_attention(q, k, v, q_offset=far)),
                                      backend.to_numpy(near))


# -- the definition's own functions --------------------------------------------------


def test_alibi_bias_is_the_definition_rounded_once(backend):
    # |r| = 2**24 + 1 is 2**24 in float32: 0.75 |r| would be 12582912, not 12582913
    slopes = backend.asarray(np.array([0.75, 0.3], dtype=np.float32))
    got = backend.to_numpy(rp.alibi_bias(slopes, 2, 3, q_offset=2**24))
    r = np.arange(3)[None, :] - (np.arange(2)[:, None] + 2**24)
    exact = np.array([0.75, 0.3], dtype=np.float32).astype(np.float64)
    want = (exact[:, None, None] * -np.abs(r)).astype(np.float32)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, want)


def test_rope_rotate_turns_by_the_exact_position(backend):
    x = backend.asarray(np.array([[1.0, 0.0]], dtype=np.float32))
    got = backend.to_numpy(rp.rope_rotate(x, offset=2**24 + 1, base=1.0))
    p = 2**24 + 1
    np.testing.assert_allclose(got, [[math.cos(p), math.sin(p)]], rtol=0, atol=1e-7)


# -- refused beyond what is exact ------------------------------------------------------


REFUSED = {
    "rope": (rp.rope_attention, (), {"q_offset": 2**60},
             "`q_offset` = 1152921504606846976 gives positions up to 1152921504606846978 in "
             "magnitude, beyond 2**53 = 9007199254740992, the largest integer float64 holds "
             "exactly; `q_offset` must be in -9007199254740992 .. 9007199254740990 here"),
    "rope-before": (rp.rope_attention, (), {"q_offset": -(2**53) - 1},
                    "`q_offset` = -9007199254740993 gives positions up to 9007199254740993 in "
                    "magnitude, beyond 2**53 = 9007199254740992, the largest integer float64 "
                    "holds exactly; `q_offset` must be in -9007199254740992 .. "
                    "9007199254740990 here"),
    "transformer_xl": (rp.transformer_xl_attention, (W_R,), {"q_offset": 2**55},
                       "`q_offset` = 36028797018963968 gives distances up to 36028797018963970 "
                       "in magnitude, beyond 2**53 = 9007199254740992, the largest integer "
                       "float64 holds exactly; `q_offset` must be in -9007199254740988 .. "
                       "9007199254740990 here"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_beyond_2_53_the_call_is_refused_with_the_exact_range(backend, case):
    function, tables, keywords, message = REFUSED[case]
    arrays = (backend.asarray(a) for a in (*_qkv(), *tables))
    with pytest.raises(ValueError, match=exactly(message)):
        function(*arrays, **keywords)


def test_a_clamped_transformer_xl_is_exact_at_any_offset():
    arrays = (*_qkv(), W_R)
    keywords = {"q_offset": 2**55, "clamp_len": 1000, "causal": False}
    want = _definition(rp.transformer_xl_attention, (), keywords, arrays)
    np.testing.assert_allclose(rp.transformer_xl_attention(*arrays, **keywords), want, **F32)


def test_alibi_bias_of_distances_beyond_2_53_is_refused():
    message = (
        "`q_offset` = 1152921504606846976 gives distances up to 1152921504606846976 in "
        "magnitude, beyond 2**53 = 9007199254740992, the largest integer float64 holds exactly; "
        "`q_offset` must be in -9007199254740991 .. 9007199254740992 here")
    with pytest.raises(ValueError, match=exactly(message)):
        rp.alibi_bias(np.ones(1), 1, 2, q_offset=2**60)


# -- a device without float64 (array-api-strict's "no_float64") ------------------------


@pytest.fixture
def strict():
    xp = pytest.importorskip("array_api_strict")
    device = xp.Device("no_float64")

    def make(a):
        return xp.asarray(np.asarray(a, dtype=np.float32), device=device)

    return xp, make


def test_without_float64_rope_is_refused_past_2_24(strict):
    xp, make = strict
    q, k, v = (make(a) for a in _qkv())
    message = (
        "`q_offset` = 16777217 gives positions up to 16777219 in magnitude, beyond 2**24 = "
        "16777216, the largest integer float32 holds exactly (and these arrays' device has no "
        "float64); `q_offset` must be in -16777216 .. 16777214 here")
    with pytest.raises(ValueError, match=exactly(message)):
        rp.rope_attention(q, k, v, q_offset=2**24 + 1)
    out = rp.rope_attention(q, k, v, q_offset=2**24 - 2)  # the largest exact offset: runs
    assert out.dtype == xp.float32


def test_without_float64_alibi_attention_stays_exact(strict):
    xp, make = strict
    arrays = _qkv()
    got = rp.alibi_attention(*(make(a) for a in arrays), q_offset=2**30)
    want = _definition(rp.alibi_attention, (), {"q_offset": 2**30}, arrays)
    got = np.from_dlpack(got.to_device(xp.Device("CPU_DEVICE")))
    np.testing.assert_allclose(got, want, **F32)
    with pytest.raises(ValueError, match=r"beyond 2\*\*24 = 16777216, the largest integer "
                                         r"float32 holds exactly \(and these arrays' device"):
        rp.alibi_bias(make(np.ones(2)), 2, 3, q_offset=2**30)  # the definition: refused


# -- bucketed schemes: integers at any offset ------------------------------------------


@pytest.mark.parametrize("q_offset", [2**30, -(2**45), 2**61])
def test_t5_and_deberta_buckets_are_exact_at_any_offset(backend, q_offset):
    xp = backend.xp
    r = rp.relative_positions(2, 3, q_offset=q_offset, xp=xp)
    t5 = backend.to_numpy(rp.t5_bucket(r, num_buckets=32, max_distance=128))
    deberta = backend.to_numpy(rp.deberta_bucket(r, bucket_size=8, max_position=64))
    # every distance is beyond both: T5's last bucket of its side, DeBERTa's +-bucket_size
    side = 16 if q_offset < 0 else 0
    np.testing.assert_array_equal(t5, np.full((2, 3), side + 15))
    np.testing.assert_array_equal(deberta, np.full((2, 3), 8 if q_offset < 0 else -8))
