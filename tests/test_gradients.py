"""The backward pass: every scheme's VJP against autodiff, finite differences and backends.

``<scheme>_attention_vjp`` (the specification's backward pass, built from
`relpos_ref.gradients`) is compared with

- ``torch.autograd`` of the scheme's forward function, over hypothesis-drawn
  shapes, masks, offsets, causality, policies and shared or per-head tables,
  and ``jax.vjp`` on a masked, per-head case per scheme (float64);
- central finite differences of the forward function along random directions
  (independent of any autodiff);
- itself on every available backend.

Masked keys and unreachable table rows holding NaN never reach a gradient;
``d_output`` is validated like every other argument; 16-bit inputs give
16-bit gradients computed in float32.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

import relpos_ref as rp
from relpos_ref import catalog
from relpos_ref.golden.cases import Case
from relpos_ref.kernels import disabled as kernels_disabled

SCHEMES = catalog.names()
GRID = {"grid2d", "swin", "swinv2"}

#: Per scheme, the parameters drawn beyond the common ones (valid ranges only).
EXTRA = {
    "absolute": {},
    "shaw": {"K": st.integers(0, 4), "beyond": st.sampled_from(["clip", "zero"]),
             "values": st.booleans()},
    "bias": {"K": st.integers(0, 4), "beyond": st.sampled_from(["clip", "zero"])},
    "music": {"M": st.integers(1, 8), "beyond": st.sampled_from(["clip", "zero"]),
              "values": st.booleans()},
    "general": {"t_max": st.just(9), "order": st.sampled_from(["past_to_future",
                                                                "future_to_past"])},
    "grid2d": {"height": st.integers(1, 3), "width": st.integers(1, 3)},
    "t5": {"buckets": st.sampled_from([8, 16]), "bidirectional": st.booleans(),
           "max_distance": st.sampled_from([12, 20])},
    "alibi": {"symmetric": st.booleans()},
    "kerple": {"kernel": st.sampled_from(["log", "power"])},
    "forgetting": {},
    "fire": {"hidden": st.sampled_from([1, 3]), "c": st.sampled_from([0.1, -0.7]),
             "L": st.sampled_from([512.0, 3.0, 4.0, -2.0]), "eps": st.sampled_from([1e-6, 0.5])},
    "cope": {"npos": st.integers(1, 6)},
    "sandwich": {"d_bar": st.sampled_from([2, 16]), "start": st.sampled_from([0, 1])},
    "swin": {"height": st.integers(1, 3), "width": st.integers(1, 3)},
    "swinv2": {"height": st.integers(1, 3), "width": st.integers(1, 3),
               "hidden": st.sampled_from([1, 3])},
    "rope": {"rotary_dim": st.sampled_from([None, 2]),
             "layout": st.sampled_from(["half", "interleaved"])},
    "xpos": {"rotary_dim": st.sampled_from([None, 2]),
             "layout": st.sampled_from(["half", "interleaved"]),
             "scale_base": st.sampled_from([4.0, 512.0]),
             "center": st.sampled_from(["middle", "middle_up", 0])},
    "transformer_xl": {"d_model": st.sampled_from([2, 6]),
                       "clamp_len": st.sampled_from([None, 0, 2]), "biases": st.booleans()},
    "deberta": {"span": st.integers(1, 4), "max_position": st.sampled_from([None, 9]),
                "c2p": st.booleans(), "p2c": st.booleans()},
}


@st.composite
def cases(draw: Any, scheme: str) -> Case:
    extra = {name: draw(s) for name, s in EXTRA[scheme].items()}
    if scheme in GRID:
        t_q = t_k = extra["height"] * extra["width"]
        timing = {"causal": draw(st.sampled_from([None, False]))} if scheme != "grid2d" else {
            "causal": draw(st.sampled_from([None, True, False]))}
    else:
        t_q, t_k = draw(st.integers(1, 6)), draw(st.integers(1, 7))
        timing = {"causal": draw(st.sampled_from([None, True, False])),
                  "q_offset": draw(st.sampled_from([None, -1, 0, 2]))}
    if scheme == "forgetting":  # causal only; every query has its own token's gate
        t_q = min(t_q, t_k)
        timing = {"causal": draw(st.sampled_from([None, True])),
                  "q_offset": draw(st.sampled_from([None, 0]))}
    if scheme == "deberta" and not (extra["c2p"] or extra["p2c"]):
        extra["c2p"] = True
    try:
        case = Case.make(
            scheme, "gradient", dtype="float64", seed=draw(st.integers(0, 2**16)),
            b=draw(st.sampled_from([1, 2])), h=draw(st.sampled_from([1, 3])), t_q=t_q,
            t_k=t_k, d=draw(st.sampled_from([2, 4])), masked=draw(st.booleans()),
            per_head=draw(st.booleans()), **timing, **extra,
        )
    except ValueError:
        assume(False)
    return case


def _call(case: Case) -> tuple[list[str], list[np.ndarray], dict[str, Any], np.ndarray | None]:
    """Names and arrays of the differentiable arguments, the keywords, the mask."""
    entry = case.entry
    p = case.parameters
    arrays = case.inputs()
    forward = getattr(rp, f"{entry.name}_attention")
    accepts = inspect.signature(forward).parameters
    kwargs = {"scale": p["scale"], **entry.options_from(p)}
    kwargs.update({n: p[n] for n in ("causal", "q_offset") if n in accepts})
    names = ["q", "k", "v"] + [t.name for t in entry.tables if t.name in arrays]
    values = [arrays[n] for n in names]
    if entry.name == "alibi":  # learned slopes: differentiate them too
        names.append("slopes")
        values.append(np.asarray(rp.alibi_slopes(p["h"]), dtype=np.float64))
    if entry.name == "kerple":  # KERPLE's learned r1, r2 (> 0) too
        names += ["r1", "r2"]
        values += [np.asarray(rp.alibi_slopes(p["h"])) * 4, np.linspace(0.5, 1.5, p["h"])]
    if entry.name == "fire":  # FIRE's learned c and L (ties |L| = p_i included)
        names += ["c", "L"]
        values += [np.asarray(kwargs.pop("c")), np.asarray(kwargs.pop("L"))]
        if case.seed % 2 == 0:  # the output layer's bias: its gradient is 0
            names.append("b2")
            values.append(np.linspace(-1.0, 1.0, p["h"]))
    if entry.name == "swinv2" and case.seed % 2 == 0:  # cosine attention: tau per head
        kwargs.pop("logit_scale", None)  # the case's (None): an array here
        names.append("logit_scale")
        values.append(np.linspace(1.0, 5.5, p["h"]))  # 5.5: above the clamp, log 100
        kwargs["scale"] = None
    if entry.name == "swinv2" and case.seed % 3 == 0:  # Swin v2's additive mask
        kwargs["mask_penalty"] = -7.0
    return names, values, kwargs, arrays.get("mask")


def _split(case: Case, names: list[str], values: list[Any]) -> tuple[list[Any], dict[str, Any]]:
    """Positional arguments (q, k, v, tables with None in gaps) and keyword arrays."""
    by_name = dict(zip(names, values, strict=True))
    tables = [by_name.get(t.name) for t in case.entry.tables]
    while tables and tables[-1] is None:
        tables.pop()
    keywords = {n: by_name[n] for n in ("slopes", "r1", "r2", "logit_scale", "b2", "c", "L")
                if n in by_name}
    return [by_name["q"], by_name["k"], by_name["v"], *tables], keywords


def vjp_of(case: Case, d_output: Any, names: list[str], values: list[Any], kwargs: dict,
           mask: Any) -> dict[str, Any]:
    positional, keywords = _split(case, names, values)
    return case.entry.vjp(*positional, d_output=d_output, mask=mask, **kwargs, **keywords)


def forward_of(case: Case, names: list[str], values: list[Any], kwargs: dict, mask: Any) -> Any:
    positional, keywords = _split(case, names, values)
    function = getattr(rp, f"{case.entry.name}_attention")
    return function(*positional, mask=mask, **kwargs, **keywords)


def _valid_forward(case: Case) -> tuple[list[str], list[np.ndarray], dict, Any, np.ndarray]:
    names, values, kwargs, mask = _call(case)
    try:
        out = forward_of(case, names, values, kwargs, mask)
    except ValueError:  # a grid the scheme refuses (a distance beyond the table, say)
        assume(False)
    return names, values, kwargs, mask, out


def _d_output(case: Case, out: np.ndarray) -> np.ndarray:
    return np.random.default_rng(case.seed + 1).standard_normal(out.shape)


def _close(got: dict[str, Any], want: dict[str, Any], rtol: float = 1e-9) -> None:
    assert sorted(got) == sorted(want)
    for name, w in want.items():
        g = np.asarray(got[name])
        assert g.shape == np.shape(w), name
        scale = max(1.0, float(np.max(np.abs(w), initial=0.0)))
        np.testing.assert_allclose(g, w, rtol=0, atol=rtol * scale, err_msg=name)


# -- against autodiff ------------------------------------------------------------------------


def _jax() -> Any:
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)  # as the backend fixture does: float64 goldens
    return jax


@pytest.mark.parametrize("scheme", SCHEMES)
def test_vjp_equals_jax_autodiff(scheme):
    # One masked, per-head, offset case per scheme: JAX runs op by op here, seconds a case
    # (torch autograd below takes the hypothesis-drawn ones).
    jax = _jax()
    jnp = jax.numpy
    case = _small(scheme)
    names, values, kwargs, mask = _call(case)
    out = forward_of(case, names, values, kwargs, mask)
    d_output = _d_output(case, out)
    got = vjp_of(case, d_output, names, values, kwargs, mask)
    jmask = None if mask is None else jnp.asarray(mask)
    _, pullback = jax.vjp(lambda *xs: forward_of(case, names, list(xs), kwargs, jmask),
                          *[jnp.asarray(a) for a in values])
    want = dict(zip(names, (np.asarray(g) for g in pullback(jnp.asarray(d_output))),
                    strict=True))
    _close(got, want)


@pytest.mark.parametrize("scheme", SCHEMES)
@given(data=st.data())
def test_vjp_equals_torch_autograd(scheme, data):
    torch = pytest.importorskip("torch")
    case = data.draw(cases(scheme))
    names, values, kwargs, mask, out = _valid_forward(case)
    d_output = _d_output(case, out)
    got = vjp_of(case, d_output, names, values, kwargs, mask)
    tensors = [torch.from_numpy(a.copy()).requires_grad_(True) for a in values]
    tmask = None if mask is None else torch.from_numpy(mask)
    forward_of(case, names, tensors, kwargs, tmask).backward(torch.from_numpy(d_output))
    _close(got, {n: t.grad.numpy() for n, t in zip(names, tensors, strict=True)})


def test_plain_attention_vjp_equals_jax_autodiff():
    jax = _jax()
    jnp = jax.numpy
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((2, 3, t, 4)) for t in (5, 6, 6))
    bias, position = rng.standard_normal((3, 5, 6)), rng.standard_normal((5, 6))
    mask = rng.random((5, 6)) < 0.6
    d_output = rng.standard_normal((2, 3, 5, 4))
    kw = {"causal": True, "q_offset": 1, "scale": 0.7}
    got = rp.attention_vjp(q, k, v, d_output=d_output, mask=mask, bias=bias, position=position,
                           **kw)
    _, pullback = jax.vjp(lambda *x: rp.attention(*x[:3], bias=x[3], position=x[4],
                                                  mask=jnp.asarray(mask), **kw),
                          *(jnp.asarray(a) for a in (q, k, v, bias, position)))
    want = pullback(jnp.asarray(d_output))
    _close(got, dict(zip(["q", "k", "v", "bias", "position"], map(np.asarray, want),
                         strict=True)))


# -- against finite differences (no autodiff) ------------------------------------------------

SMALL = {"absolute": {}, "shaw": {"K": 2}, "bias": {"K": 2}, "music": {"M": 3, "values": True},
         "general": {"t_max": 6}, "grid2d": {"height": 2, "width": 3},
         "t5": {"buckets": 8, "max_distance": 12}, "alibi": {}, "kerple": {"kernel": "power"},
         "sandwich": {"d_bar": 16}, "forgetting": {}, "cope": {"npos": 16},
         "fire": {"hidden": 3, "c": -0.4, "L": 3.5, "eps": 0.01},
         "swin": {"height": 2, "width": 3}, "swinv2": {"height": 2, "width": 3, "hidden": 3},
         "rope": {"rotary_dim": 2},
         "xpos": {"scale_base": 4.0, "rotary_dim": 2},
         "transformer_xl": {"d_model": 4, "clamp_len": 2}, "deberta": {"span": 3}}


def _small(scheme: str, **changes: Any) -> Case:
    t = 6 if scheme in GRID else None
    params = {"b": 1, "h": 2, "t_q": t or 4, "t_k": t or 5, "d": 4, "masked": True,
              "per_head": True, **({} if t else {"q_offset": 1}), **SMALL[scheme], **changes}
    return Case.make(scheme, "gradient", dtype="float64", seed=7, **params)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_vjp_matches_finite_differences(scheme):
    case = _small(scheme)
    names, values, kwargs, mask = _call(case)
    out = forward_of(case, names, values, kwargs, mask)
    rng = np.random.default_rng(11)
    d_output = rng.standard_normal(out.shape)
    grads = vjp_of(case, d_output, names, values, kwargs, mask)
    for _ in range(3):
        direction = [rng.standard_normal(a.shape) for a in values]
        eps = 1e-6
        plus = forward_of(case, names, [a + eps * u for a, u in zip(values, direction,
                                                                     strict=True)],
                          kwargs, mask)
        minus = forward_of(case, names, [a - eps * u for a, u in zip(values, direction,
                                                                      strict=True)],
                           kwargs, mask)
        numeric = np.sum(d_output * (plus - minus)) / (2 * eps)
        analytic = sum(np.sum(grads[n] * u) for n, u in zip(names, direction, strict=True))
        assert analytic == pytest.approx(numeric, rel=1e-6, abs=1e-8)


# -- every backend ---------------------------------------------------------------------------


@pytest.mark.parametrize("scheme", [*SCHEMES, "plain"])
def test_vjp_runs_on_every_backend(backend, scheme):
    if scheme == "plain":
        rng = np.random.default_rng(5)
        arrays = [rng.standard_normal((2, t, 4)) for t in (3, 5, 5)]
        d_output = rng.standard_normal((2, 3, 4))
        mask = rng.random((3, 5)) < 0.7
        want = rp.attention_vjp(*arrays, d_output=d_output, mask=mask, causal=True)
        got = rp.attention_vjp(*(backend.asarray(a) for a in arrays),
                               d_output=backend.asarray(d_output), mask=backend.asarray(mask),
                               causal=True)
    else:
        case = _small(scheme)
        names, values, kwargs, mask = _call(case)
        out = forward_of(case, names, values, kwargs, mask)
        d_output = np.random.default_rng(2).standard_normal(out.shape)
        want = vjp_of(case, d_output, names, values, kwargs, mask)
        got = vjp_of(case, backend.asarray(d_output), names,
                     [backend.asarray(a) for a in values], kwargs,
                     None if mask is None else backend.asarray(mask))
    assert sorted(got) == sorted(want)
    for name, g in got.items():
        assert g.dtype == backend.asarray(np.zeros(1)).dtype, name
    _close({n: backend.to_numpy(g) for n, g in got.items()}, want, rtol=1e-12)


# -- masked and unreachable values never reach a gradient ------------------------------------


def test_nan_in_masked_keys_never_reaches_a_gradient():
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((2, t, 3)) for t in (4, 5, 5))
    mask = np.ones((4, 5), dtype=bool)
    mask[:, 1] = False  # key 1 is masked for every query
    mask[2] = False  # query 2 attends to nothing
    k, v, q = k.copy(), v.copy(), q.copy()
    k[:, 1], v[:, 1], q[:, 2] = np.nan, np.inf, np.nan
    d_output = rng.standard_normal((2, 4, 3))
    table = rng.standard_normal((2, 5, 3))  # K = 2
    for grads in (rp.attention_vjp(q, k, v, d_output=d_output, mask=mask),
                  rp.shaw_attention_vjp(q, k, v, table, table, d_output=d_output, mask=mask)):
        for name, g in grads.items():
            finite = np.isfinite(g)
            if name == "k":
                assert finite[:, [0, 2, 3, 4]].all() and (g[:, 1] == 0).all()
            elif name == "v":
                assert finite.all() and (g[:, 1] == 0).all()
            elif name == "q":
                assert finite[:, [0, 1, 3]].all() and (g[:, 2] == 0).all()
            else:
                assert finite.all(), name


def test_nan_in_unreachable_table_rows_never_reaches_a_gradient():
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((1, 2, t, 3)) for t in (3, 3, 3))
    key_table = rng.standard_normal((9, 3))  # K = 4, but |r| <= 2 on a 3 x 3 grid
    value_table = key_table.copy()
    key_table[0] = value_table[8] = np.nan
    d_output = rng.standard_normal((1, 2, 3, 3))
    grads = rp.shaw_attention_vjp(q, k, v, key_table, value_table, d_output=d_output)
    assert all(np.isfinite(g).all() for g in grads.values())
    assert (grads["key_table"][[0, 1, 7, 8]] == 0).all()
    forward = rp.shaw_attention(q, k, v, key_table, value_table)
    assert np.isfinite(forward).all()


def test_a_nan_a_query_reads_makes_its_gradient_nan():
    rng = np.random.default_rng(2)
    q, k, v = (rng.standard_normal((3, 2)) for _ in range(3))
    table = rng.standard_normal((3, 2))
    table[2] = np.nan  # r = +1: read by queries 0 and 1
    g = rp.shaw_attention_vjp(q, k, v, table, d_output=np.ones((3, 2)))
    assert np.isnan(g["q"][:2]).all() and np.isfinite(g["q"][2]).all()


# -- arguments -------------------------------------------------------------------------------


def _qkv(dtype=np.float64):
    rng = np.random.default_rng(4)
    return [rng.standard_normal((2, 3, 4)).astype(dtype) for _ in range(3)]


_SHAPE = r"`d_output` must broadcast to the output's shape \(2, 3, 4\), got shape "


@pytest.mark.parametrize(("d_output", "error", "message"), [
    (np.ones((2, 4, 4)), ValueError, _SHAPE + r"\(2, 4, 4\)"),
    (np.ones((2, 3, 5)), ValueError, _SHAPE + r"\(2, 3, 5\)"),
    (np.ones((7, 2, 3, 4)), ValueError, _SHAPE + r"\(7, 2, 3, 4\)"),  # would widen the batch
    (np.asarray(1.0), None, None),  # broadcasts: fine
    (np.ones((3, 4)), None, None),
    (np.ones((2, 1, 1)), None, None),
    (np.ones((2, 3, 4), dtype=np.float32), TypeError, r"`d_output` is float32"),
    (np.ones((2, 3, 4), dtype=np.int64), TypeError, "`d_output` must have a real floating"),
    ([[1.0]], TypeError, r"`d_output` must be an array of the call's library, got \[\[1.0\]\] "
                         "of type list"),
    (None, TypeError, "`d_output` must be an array"),
])
def test_d_output_is_checked(d_output, error, message):
    q, k, v = _qkv()
    if error is None:
        want = rp.attention_vjp(q, k, v, d_output=np.broadcast_to(d_output, (2, 3, 4)))
        _close(rp.attention_vjp(q, k, v, d_output=d_output), want)
        return
    with pytest.raises(error, match=message):
        rp.attention_vjp(q, k, v, d_output=d_output)
    with pytest.raises(error, match=message):
        rp.shaw_attention_vjp(q, k, v, np.zeros((3, 4)), d_output=d_output)


def test_d_output_may_carry_the_batch_a_mask_adds():
    q, k, v = _qkv()  # batch (2,); a (5, 2, 3, 3) mask makes the output (5, 2, 3, 4)
    mask = np.random.default_rng(0).random((5, 2, 3, 3)) < 0.7
    grads = rp.attention_vjp(q, k, v, d_output=np.ones((5, 2, 3, 4)), mask=mask)
    assert grads["q"].shape == q.shape
    with pytest.raises(ValueError, match=r"output's shape \(5, 2, 3, 4\), got shape "
                                         r"\(6, 2, 3, 4\)"):
        rp.attention_vjp(q, k, v, d_output=np.ones((6, 2, 3, 4)), mask=mask)


def _torch_grads(function, arrays, d_output, **kwargs):
    torch = pytest.importorskip("torch")
    tensors = [torch.from_numpy(a.copy()).requires_grad_(True) for a in arrays]
    kwargs = {n: torch.from_numpy(m) if isinstance(m, np.ndarray) else m
              for n, m in kwargs.items()}
    function(*tensors, **kwargs).backward(torch.from_numpy(d_output))
    return [t.grad.numpy() for t in tensors]


def test_values_with_a_larger_batch_than_queries_and_keys():
    rng = np.random.default_rng(8)
    q, k, v = rng.standard_normal((3, 4, 4)), rng.standard_normal((3, 5, 4)), \
        rng.standard_normal((2, 3, 5, 3))
    d_output = rng.standard_normal((2, 3, 4, 3))
    table = rng.standard_normal((5, 4))  # K = 2
    want = _torch_grads(rp.shaw_attention, [q, k, v, table], d_output)
    got = rp.shaw_attention_vjp(q, k, v, table, d_output=d_output)
    _close(got, dict(zip(["q", "k", "v", "key_table"], want, strict=True)))
    want = _torch_grads(rp.attention, [q, k, v], d_output)
    _close(rp.attention_vjp(q, k, v, d_output=d_output), dict(zip("qkv", want, strict=True)))


@pytest.mark.parametrize("mask_shape", [(3, 4, 6), (2, 3, 4, 6)])
def test_transformer_xl_biases_with_a_batched_mask(mask_shape):
    rng = np.random.default_rng(9)
    q, k, v = (rng.standard_normal((3, t, 4)) for t in (4, 6, 6))
    w_r, u, pos = rng.standard_normal((6, 4)), rng.standard_normal(4), rng.standard_normal(4)
    mask = rng.random(mask_shape) < 0.6
    mask[..., 1] = False
    d_output = rng.standard_normal((*mask_shape[:-2], 4, 4))
    want = _torch_grads(rp.transformer_xl_attention, [q, k, v, w_r, u, pos], d_output,
                        mask=mask)
    got = rp.transformer_xl_attention_vjp(q, k, v, w_r, u, pos, d_output=d_output, mask=mask)
    _close(got, dict(zip(["q", "k", "v", "w_r", "content_bias", "position_bias"], want,
                         strict=True)))


@pytest.mark.parametrize("scheme", [*SCHEMES])
def test_empty_grids_have_zero_gradients(scheme):
    if scheme in GRID:
        pytest.skip(f"{scheme} attends within a fixed grid: its token count is never zero")
    case = _small(scheme, masked=False)
    names, values, kwargs, mask = _call(case)
    values[0] = values[0][..., :0, :]  # no query
    out = forward_of(case, names, values, kwargs, mask)
    assert out.shape[-2] == 0
    grads = vjp_of(case, np.zeros(out.shape), names, values, kwargs, mask)
    for name, a in zip(names, values, strict=True):
        assert grads[name].shape == a.shape and not np.any(grads[name]), name


def test_d_output_must_be_given():
    q, k, v = _qkv()
    with pytest.raises(TypeError, match="d_output"):
        rp.bias_attention_vjp(q, k, v, np.zeros(3))  # type: ignore[call-arg]


def test_arguments_are_checked_as_in_the_forward_pass():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="`beyond` must be one of"):
        rp.shaw_attention_vjp(q, k, v, np.zeros((3, 4)), d_output=q, beyond="wrap")
    with pytest.raises(ValueError, match=r"`table` must have 2K \+ 1 entries"):
        rp.bias_attention_vjp(q, k, v, np.zeros(4), d_output=q)  # an even table


@pytest.mark.parametrize("scheme", SCHEMES)
def test_every_vjp_is_named_by_the_catalog_and_exported(scheme):
    entry = catalog.get(scheme)
    module = importlib.import_module(f"relpos_ref.schemes.{scheme}")
    assert entry.vjp is getattr(module, f"{scheme}_attention_vjp")
    public = getattr(rp, f"{scheme}_attention_vjp")  # the specification behind the dispatcher
    assert public.__wrapped__ is entry.vjp
    assert (public.__name__, public.__doc__) == (entry.vjp.__name__, entry.vjp.__doc__)
    assert inspect.signature(public) == inspect.signature(entry.vjp)
    forward = inspect.signature(entry.attention).parameters
    backward = inspect.signature(entry.vjp).parameters
    assert set(backward) == (set(forward) - {"method", "return_weights"}) | {"d_output"}


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_gradients_keep_the_dtype(dtype):
    q, k, v = _qkv(dtype)
    table = np.zeros((5, 4), dtype=dtype)
    grads = rp.shaw_attention_vjp(q, k, v, table, table, d_output=q, causal=True)
    assert {g.dtype for g in grads.values()} == {np.dtype(dtype)}
    want = rp.shaw_attention_vjp(*(a.astype(np.float64) for a in (q, k, v, table, table)),
                                 d_output=q.astype(np.float64), causal=True)
    tol = 1e-5 if dtype == np.float32 else 1e-2
    for name, g in grads.items():
        np.testing.assert_allclose(g.astype(np.float64), want[name], atol=tol, rtol=tol)


def test_big_float16_inputs_do_not_overflow():
    q = k = v = np.full((3, 4), 255.0, dtype=np.float16)  # q . k overflows float16
    grads = rp.attention_vjp(q, k, v, d_output=np.ones((3, 4), dtype=np.float16))
    assert all(np.isfinite(g).all() for g in grads.values())
    np.testing.assert_array_equal(grads["v"], np.full((3, 4), 1.0, dtype=np.float16))


# -- broadcast masks, cotangents and values ------------------------------------------------------


@pytest.mark.parametrize("scheme", SCHEMES)
@given(data=st.data())
def test_a_mask_that_broadcasts_over_pairs_gives_the_full_masks_gradients(scheme, data):
    # (t_k,), (1, t_k), (t_q, 1) and () masks work in the forward pass; the backward pass
    # gives what the mask broadcast to (t_q, t_k) gives (they crashed it before)
    case = data.draw(cases(scheme))
    names, values, kwargs, _, out = _valid_forward(case)
    t_q, t_k = case.parameters["t_q"], case.parameters["t_k"]
    rng = np.random.default_rng(case.seed)
    shape = data.draw(st.sampled_from([(t_k,), (1, t_k), (t_q, 1), ()]))
    mask = rng.random(shape) < 0.7 if shape else np.asarray(True)
    d_output = _d_output(case, out)
    with rp.kernels.disabled():
        got = vjp_of(case, d_output, names, values, kwargs, mask)
        want = vjp_of(case, d_output, names, values, kwargs, np.broadcast_to(mask, (t_q, t_k)))
    _close(got, want)


@pytest.mark.parametrize("scheme", SCHEMES)
@given(data=st.data())
def test_a_cotangent_that_broadcasts_gives_the_broadcast_cotangents_gradients(scheme, data):
    # v with more leading axes than q, k and the mask widens the output; a d_output of the
    # narrower shape broadcasts to it, and every gradient must count each broadcast copy
    # (Shaw's and Music's value tables counted one before)
    case = data.draw(cases(scheme))
    names, values, kwargs, mask, out = _valid_forward(case)
    by_name = dict(zip(names, values, strict=True))
    wide = np.stack([by_name["v"], by_name["v"][..., ::-1] * 0.5])  # (2, b, h, t_k, d)
    values = [wide if n == "v" else x for n, x in zip(names, values, strict=True)]
    narrow = _d_output(case, out)  # (b, h, t_q, d): broadcasts to (2, b, h, t_q, d)
    with rp.kernels.disabled():
        got = vjp_of(case, narrow, names, values, kwargs, mask)
        full = np.broadcast_to(narrow, (2, *narrow.shape))
        want = vjp_of(case, full, names, values, kwargs, mask)
    _close(got, want)


@pytest.mark.parametrize("library", ["numpy", "torch"])
@pytest.mark.parametrize("scheme", ["plain", *SCHEMES])
def test_an_empty_value_axis_runs_as_the_specification(scheme, library):
    """``d_v = 0``: the kernels give what the specification gives (empty outputs, and the
    gradients of q, k and the tables, which are zero), or hand the call back; none raises."""
    case = _small("bias" if scheme == "plain" else scheme, masked=False)
    names, values, kwargs, mask = _call(case)
    for n, name in enumerate(names):  # v and relative value tables: no feature
        if name == "v" or name == "value_table":
            values[n] = values[n][..., :0]
    if library == "torch":
        torch = pytest.importorskip("torch")
        values = [torch.tensor(np.asarray(a)) for a in values]
        mask = None if mask is None else torch.tensor(mask)
    if scheme == "plain":
        def forward():
            return rp.attention(*values[:3])

        def backward():
            return rp.attention_vjp(*values[:3], d_output=out * 0)
    else:
        def forward():
            return forward_of(case, names, values, kwargs, mask)

        def backward():
            return vjp_of(case, out * 0, names, values, kwargs, mask)
    out = forward()
    grads = backward()
    with kernels_disabled():
        want_out, want = forward(), backward()
    assert out.shape == want_out.shape and out.shape[-1] == 0
    assert grads.keys() == want.keys()
    for name in want:
        np.testing.assert_array_equal(np.asarray(grads[name]), np.asarray(want[name]), name)


@pytest.mark.parametrize("scheme", ["general", "music"])
def test_an_empty_feature_axis_runs_on_the_numpy_kernel(scheme):
    """``d = 0``: every logit is 0; the per-distance product of the NumPy kernel took
    ``reshape(-1, 0)``, which NumPy refuses."""
    rng = np.random.default_rng(2)
    q, v = np.zeros((2, 5, 0)), rng.standard_normal((2, 5, 3))
    table = np.zeros((9, 0) if scheme == "general" else (5, 0))
    function = getattr(rp, f"{scheme}_attention")
    got = function(q, q, v, table)
    with kernels_disabled():
        want = function(q, q, v, table)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
