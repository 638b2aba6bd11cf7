"""Public functions return fresh arrays: no view of an input, nothing read-only, on every backend.

Every public function of `relpos_ref` that takes arrays is called here, with
the kernels (NumPy) and without; each array it returns must share no memory
with any array passed in and, on NumPy, be writeable. Edge cases that once
returned an input itself (an empty skew, ``rotary_dim=0``, an empty softmax)
are among the calls.
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest

import relpos_ref as rp
from relpos_ref import kernels

RNG = np.random.default_rng(0)


def _n(*shape):
    return RNG.standard_normal(shape)


Q, K, V = _n(2, 5, 4), _n(2, 6, 4), _n(2, 6, 3)
D = _n(2, 5, 3)  # an output's cotangent
R = np.arange(-3, 4).reshape(1, 7)


def _calls():
    """(name, arrays, call) for every public function that takes arrays."""
    table5, table8 = _n(5, 4), _n(2, 8, 4)
    return [
        ("attention", (Q, K, V), lambda q, k, v: rp.attention(q, k, v, return_weights=True)),
        ("attention", (Q[:, :0], K, V), lambda q, k, v: rp.attention(q, k, v)),
        ("compose_logits", (_n(2, 3),), lambda c: rp.compose_logits(c, scale=1.0)),
        ("allowed_keys", (np.ones((2, 3), dtype=bool),),
         lambda m: rp.allowed_keys(2, 3, mask=m, xp=_namespace(m))),
        ("masked_softmax", (_n(2, 3),), lambda x: rp.masked_softmax(x)),
        ("masked_softmax", (_n(2, 0),), lambda x: rp.masked_softmax(x)),
        ("gather", (_n(3, 5),), lambda x: rp.gather(x, 4, offset=2)),
        ("take_per_row", (_n(2, 3), np.array([[0, 2], [1, 1]])),
         lambda x, i: rp.take_per_row(x, i)),
        ("to_relative", (_n(3, 4),), lambda x: rp.to_relative(x, 3, offset=1)),
        ("pad_flatten_reshape", (_n(3, 5),), lambda x: rp.pad_flatten_reshape(x, 3, offset=2)),
        ("skew", (_n(3, 3),), rp.skew),
        ("skew", (_n(0, 0),), rp.skew),
        ("rel_shift", (_n(2, 4),), rp.rel_shift),
        ("rel_shift", (_n(0, 4),), rp.rel_shift),
        ("stacked_diagonals", (_n(2, 7),), lambda x: rp.stacked_diagonals(x, 4)),
        ("table_index", (R,), lambda r: rp.table_index(r, 2)),
        ("causal_table_index", (R,), lambda r: rp.causal_table_index(r, 3)),
        ("absolute_attention", (Q, K, V, table8), rp.absolute_attention),
        ("absolute_logits", (Q, table8), lambda q, t: rp.absolute_logits(q, t, 6)),
        ("shaw_attention", (Q, K, V, table5, _n(5, 3)),
         lambda *a: rp.shaw_attention(*a, return_weights=True)),
        ("shaw_logits", (Q, table5), lambda q, t: rp.shaw_logits(q, t, 6)),
        ("shaw_values", (_n(2, 5, 6), table5), lambda w, t: rp.shaw_values(w, t)),
        ("bias_attention", (Q, K, V, _n(2, 5)), rp.bias_attention),
        ("bias_logits", (_n(2, 5),), lambda t: rp.bias_logits(t, 5, 6)),
        ("music_attention", (Q, K, V, _n(6, 4), _n(6, 3)),
         lambda *a: rp.music_attention(*a, q_offset=1)),
        ("music_logits", (Q, _n(6, 4)), lambda q, t: rp.music_logits(q, t, 6, q_offset=1)),
        ("music_values", (_n(2, 5, 6), _n(6, 3)), lambda w, t: rp.music_values(w, t, q_offset=1)),
        ("general_attention", (Q, K, V, _n(11, 4)), rp.general_attention),
        ("general_logits", (Q, _n(11, 4)), lambda q, t: rp.general_logits(q, t, 6)),
        ("general_window", (_n(11, 4),), lambda t: rp.general_window(t, 5, 6)),
        ("general_window", (_n(11, 4),),
         lambda t: rp.general_window(t, 5, 6, order="future_to_past")),
        ("grid2d_attention", (K, K, V, _n(3, 4), _n(5, 4)),
         lambda *a: rp.grid2d_attention(*a, height=2, width=3)),
        ("grid2d_logits", (K, _n(3, 4), _n(5, 4)),
         lambda *a: rp.grid2d_logits(*a, height=2, width=3)),
        ("t5_attention", (Q, K, V, _n(2, 8)), lambda *a: rp.t5_attention(*a, max_distance=8)),
        ("t5_bias", (_n(2, 8),), lambda t: rp.t5_bias(t, 5, 6, max_distance=8)),
        ("t5_bucket", (R,), lambda r: rp.t5_bucket(r, num_buckets=8, max_distance=8)),
        ("alibi_attention", (Q, K, V), rp.alibi_attention),
        ("alibi_bias", (np.array([0.5, 0.25]),), lambda m: rp.alibi_bias(m, 5, 6)),
        ("kerple_attention", (Q, K, V, _n(2), _n(2)),
         lambda q, k, v, r1, r2: rp.kerple_attention(q, k, v, r1=r1 ** 2, r2=r2 ** 2 + 1)),
        ("kerple_bias", (_n(2), _n(2)),
         lambda r1, r2: rp.kerple_bias(r1 ** 2, r2 ** 2 + 1, 5, 6, kernel="power")),
        ("kerple_kernel", (_n(7), _n(2), _n(2)),
         lambda a, r1, r2: rp.kerple_kernel(a ** 2, r1 ** 2, r2 ** 2 + 1, kernel="power")),
        ("sandwich_attention", (Q, K, V), lambda *a: rp.sandwich_attention(*a, d_bar=8)),
        ("sandwich_bias", (np.array([2.0, 4.0]),), lambda r: rp.sandwich_bias(r, 5, 6)),
        ("sandwich_kernel", (_n(2, 7),), lambda r: rp.sandwich_kernel(r, d_bar=8)),
        ("convert_rope_weights", (_n(8, 3),),
         lambda w: rp.convert_rope_weights(w, head_dim=4, source="half", target="interleaved")),
        ("cope_attention", (Q, K, V, _n(3, 4)), rp.cope_attention),
        ("cope_gates", (Q, K), lambda q, k: rp.cope_gates(q, k, scale=0.5, q_offset=1)),
        ("cope_positions", (_n(2, 5, 6),), rp.cope_positions),
        ("cope_term", (Q, K, _n(3, 4)), lambda q, k, e: rp.cope_term(q, k, e, q_offset=1)),
        ("forgetting_attention", (Q, K, V, _n(2, 6)), rp.forgetting_attention),
        ("fire_attention", (Q, K, V, _n(4, 1), _n(4), _n(2, 4), _n(2)),
         lambda *a: rp.fire_attention(*a[:-1], b2=a[-1], L=3.0)),
        ("fire_bias", (_n(4, 1), _n(4), _n(2, 4), _n(2)),
         lambda *a: rp.fire_bias(*a[:-1], 5, 6, b2=a[-1], L=3.0, q_offset=1)),
        ("fire_inputs", (np.asarray(0.5),), lambda c: rp.fire_inputs(5, 6, c=c, xp=_namespace(c))),
        ("forgetting_bias", (_n(2, 6),), lambda f: rp.forgetting_bias(f, 5, 6, q_offset=1)),
        ("forgetting_cumsum", (_n(2, 6),), rp.forgetting_cumsum),
        ("log_sigmoid", (_n(2, 6),), rp.log_sigmoid),
        ("xpos_attention", (Q, K, V), lambda *a: rp.xpos_attention(*a, scale_base=8.0)),
        ("xpos_rotate", (Q,), lambda x: rp.xpos_rotate(x, scale_base=8.0)),
        ("swin_attention", (K, K, V, _n(2, 15)),
         lambda *a: rp.swin_attention(*a, window_height=2, window_width=3)),
        ("swin_bias", (_n(2, 15),), lambda t: rp.swin_bias(t, 2, 3)),
        ("swinv2_attention", (K, K, V, _n(2, 4, 2), _n(4), _n(2, 4), np.ones(2)),
         lambda *a: rp.swinv2_attention(*a[:-1], window_height=2, window_width=3,
                                        logit_scale=a[-1])),
        ("swinv2_bias", (_n(4, 2), _n(4), _n(2, 4)), lambda *a: rp.swinv2_bias(*a, 2, 3)),
        ("swinv2_table", (_n(4, 2), _n(4), _n(2, 4)), lambda *a: rp.swinv2_table(*a, 2, 3)),
        ("rope_attention", (Q, K, V), rp.rope_attention),
        ("rope_rotate", (Q,), lambda x: rp.rope_rotate(x)),
        ("rope_rotate", (Q,), lambda x: rp.rope_rotate(x, rotary_dim=0)),
        ("transformer_xl_attention", (Q, K, V, _n(6, 4), _n(4), _n(2, 4)),
         rp.transformer_xl_attention),
        ("transformer_xl_logits", (Q, K, _n(6, 4)), rp.transformer_xl_logits),
        ("transformer_xl_embedding", (R, _n(1)),
         lambda r, like: rp.transformer_xl_embedding(r, 4, dtype=like.dtype)),
        ("transformer_xl_rows", (R, _n(4, 4)), lambda r, w: rp.transformer_xl_rows(r, w)),
        ("deberta_attention", (Q, K, V, _n(8, 4), _n(8, 4)),
         lambda *a: rp.deberta_attention(*a, max_position=6)),
        ("deberta_logits", (Q, K, _n(8, 4)), rp.deberta_logits),
        ("deberta_bucket", (R,), lambda r: rp.deberta_bucket(r, bucket_size=4, max_position=6)),
        ("deberta_rows", (R,), lambda r: rp.deberta_rows(r, span=4)),
        # blocked: one block (its output is the whole result) and several, on both paths
        ("blocked_attention", (Q, K, V), lambda *a: rp.blocked_attention(*a, causal=True)),
        ("blocked_attention", (Q, K, V, _n(2, 8)),
         lambda *a: rp.blocked_attention(*a, scheme="t5", max_distance=8, block_size=2)),
        # the backward passes: gradients are fresh too
        ("attention_vjp", (Q, K, V, D), lambda q, k, v, d: rp.attention_vjp(q, k, v, d_output=d)),
        ("absolute_attention_vjp", (Q, K, V, table8, D),
         lambda *a: rp.absolute_attention_vjp(*a[:-1], d_output=a[-1])),
        ("shaw_attention_vjp", (Q, K, V, table5, _n(5, 3), D),
         lambda *a: rp.shaw_attention_vjp(*a[:-1], d_output=a[-1])),
        ("bias_attention_vjp", (Q, K, V, _n(2, 5), D),
         lambda *a: rp.bias_attention_vjp(*a[:-1], d_output=a[-1])),
        ("music_attention_vjp", (Q, K, V, _n(6, 4), _n(6, 3), D),
         lambda *a: rp.music_attention_vjp(*a[:-1], d_output=a[-1], q_offset=1)),
        ("general_attention_vjp", (Q, K, V, _n(11, 4), D),
         lambda *a: rp.general_attention_vjp(*a[:-1], d_output=a[-1])),
        ("grid2d_attention_vjp", (K, K, V, _n(3, 4), _n(5, 4), _n(2, 6, 3)),
         lambda *a: rp.grid2d_attention_vjp(*a[:-1], d_output=a[-1], height=2, width=3)),
        ("t5_attention_vjp", (Q, K, V, _n(2, 8), D),
         lambda *a: rp.t5_attention_vjp(*a[:-1], d_output=a[-1], max_distance=8)),
        ("alibi_attention_vjp", (Q, K, V, D),
         lambda *a: rp.alibi_attention_vjp(*a[:-1], d_output=a[-1])),
        ("kerple_attention_vjp", (Q, K, V, _n(2), _n(2), D),
         lambda q, k, v, r1, r2, d: rp.kerple_attention_vjp(q, k, v, d_output=d, r1=r1 ** 2,
                                                            r2=r2 ** 2 + 1)),
        ("sandwich_attention_vjp", (Q, K, V, D),
         lambda *a: rp.sandwich_attention_vjp(*a[:-1], d_output=a[-1], d_bar=8)),
        ("fire_attention_vjp", (Q, K, V, _n(4, 1), _n(4), _n(2, 4), _n(2), D),
         lambda *a: rp.fire_attention_vjp(*a[:-2], b2=a[-2], d_output=a[-1], L=3.0)),
        ("cope_attention_vjp", (Q, K, V, _n(3, 4), D),
         lambda *a: rp.cope_attention_vjp(*a[:-1], d_output=a[-1])),
        ("forgetting_attention_vjp", (Q, K, V, _n(2, 6), D),
         lambda *a: rp.forgetting_attention_vjp(*a[:-1], d_output=a[-1])),
        ("xpos_attention_vjp", (Q, K, V, D),
         lambda *a: rp.xpos_attention_vjp(*a[:-1], d_output=a[-1], scale_base=8.0)),
        ("swin_attention_vjp", (K, K, V, _n(2, 15), _n(2, 6, 3)),
         lambda *a: rp.swin_attention_vjp(*a[:-1], d_output=a[-1], window_height=2,
                                          window_width=3)),
        ("swinv2_attention_vjp", (K, K, V, _n(4, 2), _n(4), _n(2, 4), np.ones(2), _n(2, 6, 3)),
         lambda *a: rp.swinv2_attention_vjp(*a[:-2], d_output=a[-1], window_height=2,
                                            window_width=3, logit_scale=a[-2])),
        ("rope_attention_vjp", (Q, K, V, D),
         lambda *a: rp.rope_attention_vjp(*a[:-1], d_output=a[-1])),
        ("transformer_xl_attention_vjp", (Q, K, V, _n(6, 4), _n(4), _n(2, 4), D),
         lambda *a: rp.transformer_xl_attention_vjp(*a[:-1], d_output=a[-1])),
        ("deberta_attention_vjp", (Q, K, V, _n(8, 4), _n(8, 4), D),
         lambda *a: rp.deberta_attention_vjp(*a[:-1], d_output=a[-1], max_position=6)),
    ]


def _namespace(x):
    import array_api_compat

    return array_api_compat.array_namespace(x)


CALLS = _calls()


def test_every_public_array_function_is_called_here():
    takes_arrays = set()
    for name in rp.__all__:
        obj = getattr(rp, name)
        if not inspect.isfunction(obj):
            continue
        first = next(iter(inspect.signature(obj).parameters.values()), None)
        if first is not None and first.kind is first.POSITIONAL_ONLY and first.annotation == "Any":
            takes_arrays.add(name)  # an array first (integers are annotated int)
    assert takes_arrays | {"allowed_keys"} <= {name for name, _, _ in CALLS}


def _results(out):
    if isinstance(out, dict):  # gradients by name
        return list(out.values())
    if isinstance(out, tuple):
        return [x for x in out]
    return [out]


def _shares(backend, a, b) -> bool:
    name = backend.adapter.name
    if name == "numpy":
        return np.shares_memory(a, b)
    if name == "array_api_strict":
        return np.shares_memory(a._array, b._array)
    if name == "torch":  # empty tensors have no storage to share
        if a.numel() == 0 or b.numel() == 0:
            return False
        return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
    return False  # JAX arrays are immutable, dask's are lazy: nothing to alias


@pytest.mark.parametrize("use_kernels", [True, False], ids=["kernels", "spec"])
@pytest.mark.parametrize(("name", "arrays", "call"), CALLS, ids=[c[0] for c in CALLS])
def test_public_functions_return_fresh_arrays(backend, name, arrays, call, use_kernels):
    if backend.adapter.name == "dask":
        pytest.skip("dask arrays are lazy graphs: there is no memory to alias")
    if use_kernels and backend.adapter.name not in kernels.LIBRARIES:
        pytest.skip(f"no kernels for {backend.adapter.name}: the specification ran already")
    inputs = [backend.asarray(a) for a in arrays]
    if use_kernels:
        out = call(*inputs)
    else:
        with kernels.disabled():
            out = call(*inputs)
    for result in _results(out):
        for given in inputs:
            assert not _shares(backend, result, given), f"{name} returned a view of an input"
        if backend.adapter.name == "numpy":
            assert result.flags.writeable, f"{name} returned a read-only array"
