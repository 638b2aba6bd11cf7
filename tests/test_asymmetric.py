"""Asymmetric clipping of two-sided tables (``max_past``): Shaw and the scalar bias.

A table of ``P + K + 1`` rows covers ``r = -P .. K`` and row ``clip(r, -P, K) + P``
(wav2vec2-BERT's ``relative_key``, with ``P`` its left and ``K`` its right
maximum). The loop definitions below are written from that description, not
from the library: every pair's row, then the softmax, one query at a time.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import relpos_ref as rp
from relpos_ref import kernels
from relpos_ref.kernels import _numpy_blocks
from relpos_ref.kernels.numpy import KERNELS, VJP_KERNELS

TOL = {"float32": {"rtol": 2e-4, "atol": 2e-5}, "float64": {"rtol": 1e-10, "atol": 1e-12}}


def _row(r: int, past: int, future: int, beyond: str) -> int | None:
    """The table row distance `r` reads, or None for no term."""
    if -past <= r <= future:
        return r + past
    if beyond == "zero":
        return None
    return 0 if r < 0 else past + future


def _loop_attention(q, k, v, key_table, value_table, *, past, beyond, q_offset, causal,
                    scalar=False):
    """Shaw (``scalar=False``) or the scalar bias, one (batch, head, query) at a time."""
    *lead, t_q, d = q.shape
    t_k = k.shape[-2]
    out = np.zeros((*lead, t_q, v.shape[-1]))
    rows = key_table.shape[-1] if scalar else key_table.shape[-2]
    future = rows - 1 - past
    scale = 1 / math.sqrt(d)
    for index in np.ndindex(*lead):
        head = index[-1]
        kt = key_table[head] if key_table.ndim == (2 if scalar else 3) else key_table
        vt = None
        if value_table is not None:
            vt = value_table[head] if value_table.ndim == 3 else value_table
        for i in range(t_q):
            logits, extra = [], []
            for j in range(t_k):
                r = j - (i + q_offset)
                row = _row(r, past, future, beyond)
                if causal and r > 0:
                    logits.append(-np.inf)
                    extra.append(0.0)
                    continue
                content = float(q[index][i] @ k[index][j])
                if scalar:
                    bias = 0.0 if row is None else float(kt[row])
                    logits.append(scale * content + bias)
                else:
                    pos = 0.0 if row is None else float(q[index][i] @ kt[row])
                    logits.append(scale * (content + pos))
                extra.append(row)
            logits = np.asarray(logits)
            if np.all(np.isinf(logits)):
                continue
            w = np.exp(logits - logits.max())
            w /= w.sum()
            for j in range(t_k):
                out[index][i] += w[j] * v[index][j]
                if vt is not None and extra[j] is not None and w[j] > 0:
                    out[index][i] += w[j] * vt[extra[j]]
    return out


@st.composite
def _calls(draw):
    t_q, t_k = draw(st.integers(1, 9)), draw(st.integers(1, 12))
    past, future = draw(st.integers(0, 6)), draw(st.integers(0, 6))
    return {
        "t_q": t_q, "t_k": t_k, "past": past, "future": future,
        "q_offset": draw(st.integers(-4, 8)),
        "beyond": draw(st.sampled_from(["clip", "zero"])),
        "causal": draw(st.booleans()),
        "per_head": draw(st.booleans()),
        "values": draw(st.booleans()),
        "dtype": draw(st.sampled_from(["float32", "float64"])),
        "seed": draw(st.integers(0, 2**16)),
    }


def _arrays(c, *, scalar):
    rng = np.random.default_rng(c["seed"])
    heads, d = 2, 4
    rows = c["past"] + c["future"] + 1
    q = rng.standard_normal((heads, c["t_q"], d))
    k, v = rng.standard_normal((2, heads, c["t_k"], d))
    if scalar:
        table = rng.standard_normal((heads, rows) if c["per_head"] else (rows,))
        return q, k, v, table, None
    shape = (heads, rows, d) if c["per_head"] else (rows, d)
    value_table = rng.standard_normal(shape) if c["values"] else None
    return q, k, v, rng.standard_normal(shape), value_table


def _check_against_the_loop(backend, c):
    for scalar in (False, True):
        q, k, v, table, value_table = _arrays(c, scalar=scalar)
        want = _loop_attention(q, k, v, table, value_table, past=c["past"], beyond=c["beyond"],
                               q_offset=c["q_offset"], causal=c["causal"], scalar=scalar)
        args = [backend.asarray(a.astype(c["dtype"])) for a in (q, k, v, table)]
        kwargs = {"max_past": c["past"], "beyond": c["beyond"], "q_offset": c["q_offset"],
                  "causal": c["causal"]}
        if scalar:
            got = rp.bias_attention(*args, **kwargs)
        else:
            if value_table is not None:
                args.append(backend.asarray(value_table.astype(c["dtype"])))
            got = rp.shaw_attention(*args, **kwargs)
        assert got.dtype == args[0].dtype
        np.testing.assert_allclose(backend.to_numpy(got), want, **TOL[c["dtype"]])


class _NumPy:
    asarray = staticmethod(np.asarray)
    to_numpy = staticmethod(np.asarray)


@given(c=_calls())
def test_shaw_and_bias_match_the_loop_definition(c):
    _check_against_the_loop(_NumPy, c)


@pytest.mark.parametrize("c", [
    {"t_q": 6, "t_k": 9, "past": 4, "future": 1, "q_offset": 2, "beyond": "clip",
     "causal": False, "per_head": True, "values": True, "dtype": "float32", "seed": 1},
    {"t_q": 5, "t_k": 5, "past": 0, "future": 3, "q_offset": 0, "beyond": "zero",
     "causal": True, "per_head": False, "values": True, "dtype": "float64", "seed": 2},
])
def test_shaw_and_bias_match_the_loop_definition_on_every_backend(backend, c):
    _check_against_the_loop(backend, c)


@given(c=_calls(), method=st.sampled_from(["efficient", "definition"]))
def test_max_past_equal_to_k_is_the_symmetric_table(c, method):
    q, k, v, table, value_table = _arrays({**c, "future": c["past"]}, scalar=False)
    kwargs = {"beyond": c["beyond"], "q_offset": c["q_offset"], "causal": c["causal"]}
    np.testing.assert_array_equal(
        rp.shaw_attention(q, k, v, table, value_table, max_past=c["past"], method=method,
                          **kwargs),
        rp.shaw_attention(q, k, v, table, value_table, method=method, **kwargs))


@given(c=_calls(), block=st.sampled_from([64, 700, 2**22]))
def test_numpy_kernels_equal_the_specification(c, block):
    """Forward and backward kernels, with the fused Shaw softmax on its own band."""
    for scheme, scalar in (("shaw", False), ("bias", True)):
        q, k, v, table, value_table = _arrays(c, scalar=scalar)
        args = [a.astype(c["dtype"]) for a in (q, k, v, table)]
        if value_table is not None and not scalar:
            args.append(value_table.astype(c["dtype"]))
        kwargs = {"max_past": c["past"], "beyond": c["beyond"], "q_offset": c["q_offset"],
                  "causal": c["causal"]}
        d_output = np.random.default_rng(c["seed"]).standard_normal(
            (2, c["t_q"], 4)).astype(c["dtype"])
        with kernels.disabled():
            spec = getattr(rp, f"{scheme}_attention")(*args, **kwargs)
            spec_grads = getattr(rp, f"{scheme}_attention_vjp")(*args, d_output=d_output,
                                                                 **kwargs)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(_numpy_blocks, "BLOCK_BYTES", block)
            fast = KERNELS[scheme](*args, **kwargs)
            fast_grads = VJP_KERNELS[scheme](*args, d_output=d_output, **kwargs)
        if scheme == "bias" or (c["beyond"] == "clip" and table.shape[-2] <= c["t_k"]):
            assert fast is not NotImplemented, "the kernel declined a call it covers"
        if fast is not NotImplemented:
            assert fast.dtype == spec.dtype
            np.testing.assert_allclose(fast, spec, **TOL[c["dtype"]])
        assert fast_grads is not NotImplemented
        assert set(fast_grads) == set(spec_grads)
        for name, grad in spec_grads.items():
            assert fast_grads[name].dtype == grad.dtype
            np.testing.assert_allclose(fast_grads[name], grad, **TOL[c["dtype"]])


@pytest.mark.parametrize("scheme", ["shaw", "bias"])
@pytest.mark.parametrize(("past", "future", "q_offset"), [(3, 1, 0), (0, 2, 1), (4, 0, -2)])
def test_gradients_equal_torch_autograd_of_the_definition(scheme, past, future, q_offset):
    torch = pytest.importorskip("torch", reason="torch is not installed")
    rng = np.random.default_rng(past * 10 + future)
    rows = past + future + 1
    q = rng.standard_normal((2, 5, 4))
    k, v = rng.standard_normal((2, 2, 7, 4))
    tables = [rng.standard_normal((rows, 4)), rng.standard_normal((2, rows, 4))]
    if scheme == "bias":
        tables = [rng.standard_normal((2, rows))]
    d_output = rng.standard_normal((2, 5, 4))
    kwargs = {"max_past": past, "q_offset": q_offset, "causal": True}
    function = getattr(rp, f"{scheme}_attention")
    tensors = [torch.from_numpy(a.copy()).requires_grad_(True) for a in (q, k, v, *tables)]
    definition = {"method": "definition"} if scheme == "shaw" else {}
    function(*tensors, **kwargs, **definition).backward(torch.from_numpy(d_output))
    got = getattr(rp, f"{scheme}_attention_vjp")(q, k, v, *tables, d_output=d_output, **kwargs)
    names = ["q", "k", "v", *(["key_table", "value_table"] if scheme == "shaw" else ["table"])]
    for name, tensor in zip(names, tensors, strict=True):
        np.testing.assert_allclose(got[name], tensor.grad.numpy(), rtol=1e-10, atol=1e-12)


def test_the_error_policy_names_both_extents():
    q = k = v = np.zeros((1, 6, 4))
    with pytest.raises(ValueError, match=r"max_past=3, max_distance=1"):
        rp.shaw_attention(q, k, v, np.zeros((5, 4)), max_past=3, beyond="error")
    with pytest.raises(ValueError, match=r"max_past=3, max_distance=1"):
        rp.bias_attention(q, k, v, np.zeros(5), max_past=3, beyond="error")
    for method in ("efficient", "definition"):  # a symmetric table names K alone
        with pytest.raises(ValueError, match=r"\(max_distance=1, rows for r = -1 \.\. 1\)"):
            rp.shaw_attention(q, k, v, np.zeros((3, 4)), np.zeros((3, 4)), beyond="error",
                              method=method)
    # r = -4 .. 1 for 2 queries after 3 earlier keys: rows for -4 .. 1 cover them
    out = rp.shaw_attention(np.zeros((2, 4)), np.zeros((5, 4)), np.ones((5, 4)),
                            np.zeros((6, 4)), max_past=4, q_offset=3, beyond="error")
    assert out.tolist() == np.ones((2, 4)).tolist()


@pytest.mark.parametrize(("max_past", "error", "message"), [
    (-1, ValueError, "`max_past` must be >= 0, got -1"),
    (5, ValueError, r"`max_past` must be at most 4 \(`key_table` has 5 rows, shape \(5, 4\)\)"
                    ", got 5"),
    (1.5, ValueError, "`max_past` must be an integer, got 1.5 of type float"),
    (True, ValueError, "`max_past` must be an integer, got the bool True"),
])
def test_bad_max_past_is_named(max_past, error, message):
    q = k = v = np.zeros((3, 4))
    for function in (rp.shaw_attention, KERNELS["shaw"]):
        with pytest.raises(error, match=message):
            function(q, k, v, np.zeros((5, 4)), max_past=max_past)
    scalar = message.replace("`key_table`", "`table`").replace("rows", "entries").replace(
        r"\(5, 4\)", r"\(5,\)")
    for function in (rp.bias_attention, KERNELS["bias"]):
        with pytest.raises(error, match=scalar):
            function(q, k, v, np.zeros(5), max_past=max_past)


def test_an_even_table_without_max_past_points_to_it():
    q = k = v = np.zeros((3, 4))
    with pytest.raises(ValueError, match="pass `max_past` for a table of P \\+ K \\+ 1 rows"):
        rp.shaw_attention(q, k, v, np.zeros((4, 4)))
    with pytest.raises(ValueError, match="P \\+ K \\+ 1 entries"):
        rp.bias_attention(q, k, v, np.zeros(4))


def test_the_value_table_reads_the_key_tables_rows():
    # one query, keys at r = -3 .. 2; P = 2, K = 1: rows 0 0 1 2 3 3 of a^V
    weights = np.full((1, 6), 1 / 6)
    value_table = np.arange(4.0)[:, None] * 6  # row c holds 6c
    out = rp.shaw_values(weights, value_table, q_offset=3, max_past=2)
    assert out.tolist() == [[0 + 0 + 1 + 2 + 3 + 3]]
    zero = rp.shaw_values(weights, value_table, q_offset=3, max_past=2, beyond="zero")
    assert zero.tolist() == [[0 + 1 + 2 + 3]]
