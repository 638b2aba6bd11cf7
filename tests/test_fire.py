"""FIRE (Li et al. 2023): the specification against loops, its VJP, its kernels, decoding.

- a loop over every pair of ``f_h(psi(|p_i - j|) / (psi(max(|L|, p_i)) + eps))``
  in Python floats (`_reference.fire_value`, written from the paper) against
  `fire_bias`, and attention on every backend against it;
- the normaliser reads the query's absolute position: a query's row is the
  same whatever the call it is part of, beyond ``L`` too;
- ``causal=False`` reads ``psi(|p_i - j|)`` for later keys;
- the VJP against central differences (q, k, v, the MLP, c and L, on both sides
  of the threshold) and torch autograd at a tie ``|L| = p_i``;
- the dispatched kernels (NumPy, torch) against the specification by
  hypothesis, forward and VJP;
- decoding one query at a time against a cache equals the full causal call;
- bad calls name the parameter.
"""

from __future__ import annotations

import numpy as np
import pytest
from _calls import draw_mask
from _reference import fire_value
from hypothesis import given, settings
from hypothesis import strategies as st

import relpos_ref as rp
from relpos_ref import kernels


def _mlp(rng, heads, m=5, per_head=False, dtype="float64"):
    """w1, b1, w2 (a head axis on each, or the paper's shared hidden layer) and b2."""
    h = (heads,) if per_head else ()
    w1, b1 = rng.standard_normal((*h, m, 1)), rng.standard_normal((*h, m))
    w2 = rng.standard_normal((heads, m))
    b2 = rng.standard_normal((heads, 1) if per_head else (heads,))
    return tuple(x.astype(dtype) for x in (w1, b1, w2)), b2.astype(dtype)


def loop_bias(mlp, heads, t_q, t_k, q_offset, **params):
    out = np.zeros((heads, t_q, t_k))
    for h in range(heads):
        for i in range(t_q):
            for j in range(t_k):
                out[h, i, j] = fire_value(*mlp, h, i + q_offset, j, **params)
    return out


def loop_attention(q, k, v, bias, q_offset, scale, causal, mask=None):
    t_q, t_k = q.shape[-2], k.shape[-2]
    logits = scale * q @ np.swapaxes(k, -1, -2) + bias
    allowed = np.ones((t_q, t_k), dtype=bool)
    if causal:
        allowed = np.arange(t_k)[None, :] <= np.arange(t_q)[:, None] + q_offset
    if mask is not None:
        allowed = allowed & mask
    logits = np.where(allowed, logits, -np.inf)
    top = np.max(logits, axis=-1, keepdims=True)
    w = np.exp(logits - np.where(np.isfinite(top), top, 0))
    total = w.sum(-1, keepdims=True)
    return np.where(total > 0, w / np.where(total > 0, total, 1), 0) @ v


PARAMS = st.fixed_dictionaries({
    "c": st.sampled_from([0.1, -0.7, 0.0, 3.0]), "L": st.sampled_from([512.0, 3.0, -2.5, 0.0]),
    "eps": st.sampled_from([1e-6, 0.5])})


@settings(deadline=None, max_examples=30)
@given(t_q=st.integers(0, 5), t_k=st.integers(0, 7), q_offset=st.integers(-3, 9),
       heads=st.integers(1, 3), per_head=st.booleans(), params=PARAMS,
       seed=st.integers(0, 2**16))
def test_the_bias_is_the_loop_definition(t_q, t_k, q_offset, heads, per_head, params, seed):
    mlp, b2 = _mlp(np.random.default_rng(seed), heads, per_head=per_head)
    got = rp.fire_bias(*mlp, t_q, t_k, b2=b2, q_offset=q_offset, **params)
    np.testing.assert_allclose(got, loop_bias(mlp, heads, t_q, t_k, q_offset, b2=b2, **params),
                               rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("causal", [True, False])
def test_attention_equals_the_loop_definition_on_every_backend(backend, causal):
    rng = np.random.default_rng(3)
    t_q, t_k, q_offset, params = 4, 11, 7, {"c": 0.4, "L": 8.0, "eps": 1e-6}
    mlp, b2 = _mlp(rng, 2)
    q, k, v = (rng.standard_normal((2, t, 4)) for t in (t_q, t_k, t_k))
    mask = rng.random((t_q, t_k)) < 0.8
    want = loop_attention(q, k, v, loop_bias(mlp, 2, t_q, t_k, q_offset, **params), q_offset,
                          0.5, causal, mask)
    a = backend.asarray
    got = rp.fire_attention(a(q), a(k), a(v), *map(a, mlp), mask=a(mask), causal=causal,
                            q_offset=q_offset, **params)
    np.testing.assert_allclose(backend.to_numpy(got), want, rtol=1e-10, atol=1e-12)
    # b2 is in the bias, never in the weights: the output is the same with it
    got = rp.fire_attention(a(q), a(k), a(v), *map(a, mlp), b2=a(b2), mask=a(mask),
                            causal=causal, q_offset=q_offset, **params)
    np.testing.assert_allclose(backend.to_numpy(got), want, rtol=1e-10, atol=1e-12)


def test_the_normaliser_reads_the_absolute_query_position():
    # a query at position p has the same row alone (q_offset = p) as inside a longer call,
    # before and beyond L; and that row is not the row of the same distances at another p
    mlp, _ = _mlp(np.random.default_rng(0), 2)
    full = rp.fire_bias(*mlp, 20, 20, L=8.0, c=1.0)
    for p in (3, 8, 15, 19):
        np.testing.assert_array_equal(rp.fire_bias(*mlp, 1, 20, L=8.0, c=1.0, q_offset=p)[:, 0],
                                      full[:, p])
    x = np.asarray(rp.fire_inputs(20, 20, L=8.0, c=1.0, eps=0.0, xp=np))
    np.testing.assert_allclose(np.diagonal(x, -1)[:7], np.diagonal(x, -1)[0])  # p <= 8: log 9
    assert np.all(np.diff(np.diagonal(x, -1)[8:]) < 0)  # beyond L, the same distance shrinks
    assert x[19, 0] == pytest.approx(1.0) and x[5, 0] < 1.0  # the first key: 1 once p >= L


def test_later_keys_read_the_absolute_distance():
    x = np.asarray(rp.fire_inputs(1, 9, c=0.5, L=2.0, q_offset=4, xp=np))[0]
    np.testing.assert_allclose(x[4 + 3], x[4 - 3], rtol=0, atol=0)
    np.testing.assert_allclose(x[8], x[0])
    assert x[4] == 0.0


def _finite_differences(loss, x, eps=1e-6):
    grad = np.zeros_like(x)
    for index in np.ndindex(x.shape):
        up, down = x.copy(), x.copy()
        up[index] += eps
        down[index] -= eps
        grad[index] = (loss(up) - loss(down)) / (2 * eps)
    return grad


@pytest.mark.parametrize(("big_l", "per_head", "causal"),
                         [(3.5, False, True), (-5.5, True, False), (100.0, False, True)])
def test_vjp_equals_finite_differences(big_l, per_head, causal):
    rng = np.random.default_rng(5)
    (w1, b1, w2), b2 = _mlp(rng, 2, m=4, per_head=per_head)
    q, k, v = (rng.standard_normal((2, 2, t, 3)) for t in (4, 9, 9))
    mask = rng.random((4, 9)) < 0.8
    d_out = rng.standard_normal((2, 2, 4, 3))
    kw = {"mask": mask, "causal": causal, "q_offset": 2, "scale": 0.7, "eps": 0.01}
    args = {"q": q, "k": k, "v": v, "w1": w1, "b1": b1, "w2": w2, "b2": b2,
            "c": np.asarray(-0.3), "L": np.asarray(big_l)}
    order = ("q", "k", "v", "w1", "b1", "w2")
    with kernels.disabled():
        grads = rp.fire_attention_vjp(*(args[n] for n in order), b2=b2, c=args["c"],
                                      L=args["L"], d_output=d_out, **kw)
        assert not np.any(grads["b2"])  # exactly 0
        for name in args:
            def loss(x, name=name):
                call = {**args, name: x}
                return float(np.sum(rp.fire_attention(
                    *(call[n] for n in order), b2=call["b2"], c=call["c"], L=call["L"],
                    **kw) * d_out))
            np.testing.assert_allclose(grads[name], _finite_differences(loss, args[name]),
                                       rtol=1e-6, atol=1e-8, err_msg=name)


def test_vjp_at_a_tie_halves_as_torch_maximum():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(7)
    mlp, _ = _mlp(rng, 2)
    q, k, v = (rng.standard_normal((2, t, 4)) for t in (6, 6, 6))
    d_out = rng.standard_normal((2, 6, 4))
    args = {"q": q, "k": k, "v": v, "w1": mlp[0], "b1": mlp[1], "w2": mlp[2],
            "c": np.asarray(0.8), "L": np.asarray(3.0)}  # position 3 ties
    order = ("q", "k", "v", "w1", "b1", "w2")
    with kernels.disabled():
        grads = rp.fire_attention_vjp(*(args[n] for n in order), c=args["c"], L=args["L"],
                                      d_output=d_out)
        leaves = {n: torch.tensor(a, requires_grad=True) for n, a in args.items()}
        out = rp.fire_attention(*(leaves[n] for n in order), c=leaves["c"], L=leaves["L"])
    out.backward(torch.tensor(d_out))
    for name, leaf in leaves.items():
        np.testing.assert_allclose(grads[name], leaf.grad.numpy(), rtol=1e-12, atol=1e-12,
                                   err_msg=name)
    # and the tie's row is what it is: half of each one-sided derivative
    above = rp.fire_attention_vjp(*(args[n] for n in order), c=args["c"],
                                  L=np.asarray(3.0 + 1e-9), d_output=d_out)["L"]
    below = rp.fire_attention_vjp(*(args[n] for n in order), c=args["c"],
                                  L=np.asarray(3.0 - 1e-9), d_output=d_out)["L"]
    assert float(grads["L"]) == pytest.approx((float(above) + float(below)) / 2, rel=1e-6)


@st.composite
def _calls(draw):
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    dtype = draw(st.sampled_from(["float32", "float64"]))
    heads, t_q, t_k = draw(st.integers(1, 3)), draw(st.integers(0, 6)), draw(st.integers(0, 7))
    lead = draw(st.sampled_from([(heads,), (2, heads)]))
    q, k, v = (rng.standard_normal((*lead, t, 4)).astype(dtype) for t in (t_q, t_k, t_k))
    mlp, b2 = _mlp(rng, heads, m=draw(st.sampled_from([1, 4])), per_head=draw(st.booleans()),
                   dtype=dtype)
    params = draw(PARAMS)
    if draw(st.booleans()):
        params["b2"] = b2
    if draw(st.booleans()):
        params = {**params, "c": np.asarray(params["c"], dtype=dtype),
                  "L": np.asarray(params["L"], dtype=dtype)}
    kwargs = {"mask": draw_mask(draw, rng, t_q, t_k), "q_offset": draw(st.integers(-3, 8)),
              "causal": draw(st.booleans()), "scale": draw(st.sampled_from([None, 0.7])),
              **params}
    d_out = rng.standard_normal((*lead, t_q, 4)).astype(dtype)
    return (q, k, v, *mlp), kwargs, d_out


def _same(got, want, dtype):
    tol = {"float32": 2e-5, "float64": 1e-12}[str(dtype)]
    np.testing.assert_allclose(np.asarray(got, dtype=np.float64),
                               np.asarray(want, dtype=np.float64), rtol=tol, atol=tol)


@settings(deadline=None, max_examples=40)
@given(call=_calls(), library=st.sampled_from(["numpy", "torch"]))
def test_kernels_equal_the_specification(call, library):
    args, kwargs, d_out = call
    if library == "torch":
        torch = pytest.importorskip("torch")
        args = tuple(torch.from_numpy(a) for a in args)
        kwargs = {n: torch.from_numpy(a) if isinstance(a, np.ndarray) else a
                  for n, a in kwargs.items()}
        d_out = torch.from_numpy(d_out)
    with kernels.disabled():
        want = rp.fire_attention(*args, **kwargs, return_weights=True)
        want_g = rp.fire_attention_vjp(*args, **kwargs, d_output=d_out)
    got = rp.fire_attention(*args, **kwargs, return_weights=True)
    got_g = rp.fire_attention_vjp(*args, **kwargs, d_output=d_out)
    dtype = str(args[0].dtype).removeprefix("torch.")
    for g, w in zip(got, want, strict=True):
        assert type(g) is type(w) and g.dtype == w.dtype and g.shape == w.shape
        _same(g, w, dtype)
    assert sorted(got_g) == sorted(want_g)
    for name, w in want_g.items():
        assert got_g[name].dtype == w.dtype and got_g[name].shape == w.shape, name
        _same(got_g[name], w, dtype)


@pytest.mark.parametrize("library", ["numpy", "torch"])
def test_decode_against_a_cache_equals_the_full_call(library):
    rng = np.random.default_rng(11)
    t = 20  # beyond L = 8: the normaliser changes as the cache grows
    q, k, v = (rng.standard_normal((2, t, 4)) for _ in range(3))
    mlp, _ = _mlp(rng, 2)
    if library == "torch":
        torch = pytest.importorskip("torch")
        q, k, v = (torch.from_numpy(x) for x in (q, k, v))
        mlp = tuple(torch.from_numpy(x) for x in mlp)
    full = rp.fire_attention(q, k, v, *mlp, L=8.0)
    for i in range(t):  # query i against the cache of keys 0 .. i: q_offset = i (the default)
        step = rp.fire_attention(q[:, i:i + 1], k[:, :i + 1], v[:, :i + 1], *mlp, L=8.0)
        np.testing.assert_allclose(np.asarray(step), np.asarray(full[:, i:i + 1]),
                                   rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize(("change", "needle"), [
    ({"w1": np.zeros((4, 2))}, "the MLP needs `w1` (m, 1)"),
    ({"b2": np.zeros((2, 3))}, "the MLP needs"),
    ({"w2": np.zeros((3, 4)), "b2": np.zeros(3)}, "the MLP has 3 heads, `q` has 2"),
    ({"b2": np.zeros(3)}, "the head axes of `w1`, `b1`, `w2`, `b2` must agree, got [2, 3]"),
    ({"c": np.zeros(2)}, "`c` must be a number or an array of shape ()"),
    ({"L": "far"}, "`L`"),
    ({"eps": "small"}, "`eps`"),
    ({"eps": -1e-3}, "`eps` must be a finite number >= 0, got -0.001"),
    ({"eps": 0.0, "L": 0.0}, "`eps` = 0 leaves the normaliser log(|c| max(|L|, p_i) + 1) + eps "
                             "at 0 for the query at position 0 (c = 0.1, L = 0)"),
    ({"eps": 0.0, "c": np.asarray(0.0)}, "at 0 for the query at position 0 (c = 0, L = 512)"),
    ({"w1": np.zeros((0, 1)), "b1": np.zeros(0), "w2": np.zeros((2, 0))},
     "the MLP needs at least one hidden unit (m >= 1), got `w1` of shape (0, 1)"),
    ({"b1": np.zeros(4, dtype=np.int64)}, "`b1` must have a real floating dtype"),
])
def test_bad_calls_name_the_parameter(change, needle):
    q = np.zeros((2, 3, 4))  # q_offset 0: queries at positions 0 ..
    call = {"w1": np.zeros((4, 1)), "b1": np.zeros(4), "w2": np.zeros((2, 4)), "b2": np.zeros(2),
            "c": 0.1, "L": 512.0, "eps": 1e-6, **change}
    with pytest.raises((ValueError, TypeError)) as info:
        rp.fire_attention(q, q, q, call["w1"], call["b1"], call["w2"], b2=call["b2"],
                          c=call["c"], L=call["L"], eps=call["eps"])
    assert needle in str(info.value)


@pytest.mark.parametrize("per_head", [False, True])
def test_the_mlp_by_blocks_of_rows_is_the_whole_evaluation_bit_for_bit(monkeypatch, per_head):
    from relpos_ref.schemes import _fire_mlp

    mlp, b2 = _mlp(np.random.default_rng(9), 3, m=4, per_head=per_head)
    whole = rp.fire_bias(*mlp, 7, 9, b2=b2, L=3.0, c=0.7, q_offset=2)
    monkeypatch.setattr(_fire_mlp, "HIDDEN_ENTRIES", 50)  # blocks of one or two rows
    np.testing.assert_array_equal(rp.fire_bias(*mlp, 7, 9, b2=b2, L=3.0, c=0.7, q_offset=2),
                                  whole)


@pytest.mark.parametrize("per_head", [False, True])
def test_the_vjp_by_blocks_of_rows_equals_one_block(monkeypatch, per_head):
    # the MLP's backward pass holds no (H, t_q, t_k, m) array: blocks of rows, summed
    from relpos_ref.schemes import _fire_mlp

    rng = np.random.default_rng(10)
    mlp, b2 = _mlp(rng, 3, m=4, per_head=per_head)
    q, k, v, d_output = (rng.standard_normal((3, n, 4)) for n in (7, 9, 9, 7))
    kwargs = {"b2": b2, "L": 3.0, "c": 0.7, "q_offset": 2, "d_output": d_output}
    with kernels.disabled():
        whole = rp.fire_attention_vjp(q, k, v, *mlp, **kwargs)
        monkeypatch.setattr(_fire_mlp, "HIDDEN_ENTRIES", 50)  # blocks of one or two rows
        blocks = rp.fire_attention_vjp(q, k, v, *mlp, **kwargs)
    assert sorted(blocks) == sorted(whole)
    for name, grad in whole.items():
        np.testing.assert_allclose(blocks[name], grad, rtol=1e-13, atol=1e-13, err_msg=name)


def _small_mlp(data):
    # breakpoints hit exactly, shared by two units, units with zero slope; one hidden layer,
    # or one per head for w1, b1 or both (each head its own breakpoints); inputs x (2, 3)
    m = data.draw(st.integers(1, 6), label="m")
    heads = data.draw(st.sampled_from([None, 2, 3]), label="heads")
    small = st.sampled_from([-2.0, -1.0, -0.5, 0.0, 0.5, 1.0, 2.0])
    w1_heads, b1_heads = (heads if heads and data.draw(st.booleans(), label=f"{n} per head")
                          else 1 for n in ("w1", "b1"))
    if heads and w1_heads == b1_heads == 1:
        w1_heads = heads
    w1 = np.asarray(data.draw(st.lists(small, min_size=m * w1_heads, max_size=m * w1_heads)))
    b1 = np.asarray(data.draw(st.lists(small, min_size=m * b1_heads, max_size=m * b1_heads)))
    w1 = w1.reshape(m, 1) if heads is None else w1.reshape(w1_heads, m, 1)
    b1 = b1.reshape(m) if heads is None else b1.reshape(b1_heads, m)
    out = heads or 3  # one MLP per head, or one hidden layer for three outputs
    w2 = np.asarray(data.draw(st.lists(small, min_size=out * m, max_size=out * m)))
    w2 = w2.reshape(out, m)
    b2 = np.asarray(data.draw(st.lists(small, min_size=out, max_size=out)))
    x = np.asarray(data.draw(st.lists(st.sampled_from([-4.0, -1.0, -0.25, 0.0, 0.25, 0.5,
                                                        1.0, 2.0, 3.5]),
                                      min_size=6, max_size=6))).reshape(2, 3)
    return x, w1, b1, w2, b2


@given(data=st.data())
def test_the_lowering_s_piecewise_mlp_equals_the_unit_sums(data):
    from relpos_ref._fire_pieces import mlp_by_pieces
    from relpos_ref.schemes._fire_mlp import mlp_output

    x, w1, b1, w2, b2 = _small_mlp(data)
    np.testing.assert_allclose(mlp_by_pieces(x, w1, b1, w2, b2), mlp_output(x, w1, b1, w2, b2),
                               rtol=0, atol=1e-12)


@given(data=st.data())
def test_the_kernels_unit_sums_equal_the_specifications_mlp_vjp(data):
    # the kernels' MLP backward (sums by segment, then each unit's live segments) against the
    # specification's hidden layer; at a breakpoint a unit passes no gradient (relu(pre > 0))
    from relpos_ref._fire_pieces import live_sums, segments, units
    from relpos_ref.gradients import sum_to_shape
    from relpos_ref.kernels._fire_vjp import sums_by_segment, unit_gradients
    from relpos_ref.schemes._fire_mlp import _tables, mlp_vjp

    x, w1, b1, w2, _ = _small_mlp(data)
    heads = w2.shape[0]
    d_out = np.asarray(data.draw(st.lists(st.sampled_from([-1.5, -1.0, 0.0, 0.5, 2.0]),
                                          min_size=6 * heads, max_size=6 * heads)))
    d_out = d_out.reshape(heads, *x.shape)
    want = mlp_vjp(x, d_out, w1, b1, w2)
    tw1, tb1, tw2, _ = _tables(w1, b1, w2, None)
    hidden = max(tw1.shape[0], tb1.shape[0])
    hw1, hb1 = (np.broadcast_to(t, (hidden, t.shape[1])) for t in (tw1, tb1))
    found = units(hw1, hb1, tw2)
    n_seg = found.segments.shape[0]
    flat, d_flat = x.reshape(-1), d_out.reshape(heads, -1)
    segment = segments(np, found.u, flat)
    d_x = (d_flat * np.take(live_sums(found, found.slope), segment, axis=1)).sum(0)
    got = unit_gradients(found, sums_by_segment(np, segment, d_flat * flat, n_seg),
                         sums_by_segment(np, segment, d_flat, n_seg), hw1, hb1, tw2)
    np.testing.assert_allclose(d_x.reshape(x.shape), want[0], rtol=0, atol=1e-12, err_msg="x")
    for name, g, w, shape in (("w1", got[0], want[1], tw1.shape), ("b1", got[1], want[2],
                              tb1.shape), ("w2", got[2], want[3], tw2.shape)):
        np.testing.assert_allclose(sum_to_shape(g, shape), sum_to_shape(w, shape), rtol=0,
                                   atol=1e-12, err_msg=name)


def test_the_kernels_pass_no_gradient_through_a_unit_at_its_breakpoint():
    # b1 = 0: every diagonal pair has x = 0, each rising unit's breakpoint, where relu passes
    # no gradient (the specification's pre > 0); the torch kernel's autograd reads the lowering
    torch = pytest.importorskip("torch", reason="torch is not installed")
    rng = np.random.default_rng(0)
    q, k, v, d_output = (rng.standard_normal((2, 4, 3)) for _ in range(4))
    w1, b1, w2 = np.abs(rng.standard_normal((5, 1))) + 0.1, np.zeros(5), rng.standard_normal((2, 5))
    with kernels.disabled():
        want = rp.fire_attention_vjp(q, k, v, w1, b1, w2, d_output=d_output, L=3.0)
    got = rp.fire_attention_vjp(*(torch.from_numpy(a) for a in (q, k, v, w1, b1, w2)),
                                d_output=torch.from_numpy(d_output), L=3.0)
    for name, grad in want.items():
        np.testing.assert_allclose(np.asarray(got[name]), grad, rtol=1e-12, atol=1e-12,
                                   err_msg=name)


def test_autograd_through_the_specification_passes_no_gradient_at_a_breakpoint():
    # the same diagonal ties: torch autograd through fire_attention itself (kernels off)
    # agrees with fire_attention_vjp, as through the reference's torch.relu (maximum's rule
    # would pass half: db1 -0.28 against 0 for a falling unit at its breakpoint)
    torch = pytest.importorskip("torch", reason="torch is not installed")
    rng = np.random.default_rng(0)
    q, k, v, d_output = (torch.from_numpy(rng.standard_normal((2, 4, 3))) for _ in range(4))
    w1 = torch.from_numpy(np.asarray([[-1.0], [0.5], [2.0]]))
    b1, w2 = torch.zeros(3, dtype=torch.float64), torch.from_numpy(rng.standard_normal((2, 3)))
    with kernels.disabled():
        want = rp.fire_attention_vjp(q, k, v, w1, b1, w2, d_output=d_output, L=3.0)
        leaves = [x.clone().requires_grad_(True) for x in (w1, b1, w2)]
        out = rp.fire_attention(q, k, v, *leaves, L=3.0)
    (out * d_output).sum().backward()
    for name, leaf in zip(("w1", "b1", "w2"), leaves, strict=True):
        np.testing.assert_allclose(leaf.grad.numpy(), want[name].numpy(), rtol=1e-12,
                                   atol=1e-12, err_msg=name)
    assert float(want["b1"][0]) == 0.0  # the falling unit (pre = -x <= 0) is never live


def test_the_lowering_s_mlp_keeps_nan_weights_and_flat_units():
    from relpos_ref._fire_pieces import mlp_by_pieces
    from relpos_ref.schemes._fire_mlp import mlp_output

    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((2, 4, 3)) for _ in range(3))
    out = rp.fire_attention(q, k, v, np.asarray([[np.nan], [1.0]]), np.zeros(2),
                            np.ones((2, 2)), L=3.0)  # the NumPy kernel hands it back
    assert np.isnan(out).all()
    for dtype, tiny in ((np.float32, 1e-8), (np.float64, 1e-17)):  # breakpoints at -5e7, -5e16
        x = np.asarray([[0.3, 0.7]], dtype=dtype)
        args = (np.asarray([[tiny]], dtype=dtype), np.asarray([0.5], dtype=dtype),
                np.ones((1, 1), dtype=dtype), None)
        np.testing.assert_allclose(mlp_by_pieces(x, *args), mlp_output(x, *args), rtol=1e-6)


def test_a_unit_of_slope_0_gets_the_specifications_w1_gradient():
    # w1 = 0, b1 > 0: relu(0 x + b1) = b1 for every pair, and d/dw1 = w2 x there (the
    # specification's pre > 0); the lowering's constant term once passed none to w1
    torch = pytest.importorskip("torch", reason="torch is not installed")
    rng = np.random.default_rng(0)
    q, k, v, d_output = (rng.standard_normal((2, 5, 3)) for _ in range(4))
    w1, b1 = np.asarray([[0.0], [1.0], [-0.7]]), np.asarray([0.5, -0.2, 0.3])
    w2 = rng.standard_normal((2, 3))
    with kernels.disabled():
        want = rp.fire_attention_vjp(q, k, v, w1, b1, w2, d_output=d_output, L=3.0)
    assert abs(want["w1"][0, 0]) > 1e-3  # the case tests something
    for backend in ("numpy", "torch"):
        wrap = torch.from_numpy if backend == "torch" else np.asarray
        got = rp.fire_attention_vjp(*(wrap(a) for a in (q, k, v, w1, b1, w2)),
                                    d_output=wrap(d_output), L=3.0)
        for name, grad in want.items():
            np.testing.assert_allclose(np.asarray(got[name]), grad, rtol=1e-12, atol=1e-12,
                                       err_msg=f"{backend} {name}")


def test_the_pieces_sum_live_units_only_and_read_relu_s_0_at_an_infinite_input():
    # a falling unit of slope -1e8 dead at x = 0.25 once cancelled the live one's 0.25 away
    # (float32); L = eps = 0 before position 0 makes x infinite, where relu is 0 or inf
    from relpos_ref._fire_pieces import mlp_by_pieces
    from relpos_ref.schemes._fire_mlp import mlp_output

    x = np.asarray([[0.25]], dtype=np.float32)
    args = (np.asarray([[-1e8], [-1.0]], dtype=np.float32), np.asarray([0.0, 0.5], np.float32),
            np.ones((1, 2), dtype=np.float32), None)
    np.testing.assert_allclose(mlp_by_pieces(x, *args), mlp_output(x, *args), rtol=1e-6)
    x = np.asarray([[np.inf, 0.5]])
    args = (np.asarray([[-1.0], [-2.0]]), np.asarray([0.5, 0.3]), np.ones((1, 2)), None)
    np.testing.assert_array_equal(mlp_by_pieces(x, *args), mlp_output(x, *args))


def test_eps_0_is_taken_where_no_query_that_sees_a_key_has_a_normaliser_of_0():
    # causal queries before position 0 see no key: a normaliser of 0 there changes nothing
    rng = np.random.default_rng(8)
    q = rng.standard_normal((2, 2, 3))
    k = v = rng.standard_normal((2, 4, 3))
    mlp = (rng.standard_normal((3, 1)), rng.standard_normal(3), rng.standard_normal((2, 3)))
    with np.errstate(divide="ignore", invalid="ignore"):  # the rows without a key
        out = rp.fire_attention(q, k, v, *mlp, eps=0.0, L=0.0, q_offset=-2)
    assert (out == 0).all()
    with pytest.raises(ValueError, match="at 0 for the query at position -2"):
        rp.fire_attention(q, k, v, *mlp, eps=0.0, L=0.0, q_offset=-2, causal=False)
    with pytest.raises(ValueError, match="at 0 for the query at position 0"):
        rp.fire_attention(q, k, v, *mlp, eps=0.0, L=0.0, q_offset=-1)
