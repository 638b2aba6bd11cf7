"""The seed schemes against loop definitions from the papers, on every backend.

For each scheme, both methods of ``<scheme>_logits`` equal the reference's
positional term, and ``<scheme>_attention`` equals the reference output and
weights, for shared and per-head tables, hypothesis-drawn shapes, offsets,
policies and masks.
"""

from __future__ import annotations

import _reference as ref
import numpy as np
from hypothesis import given
from hypothesis import strategies as st

import relpos_ref as rp

TOL = {"float32": {"rtol": 1e-4, "atol": 1e-5}, "float64": {"rtol": 1e-10, "atol": 1e-12}}
METHODS = ("efficient", "definition")

common = {
    "heads": st.integers(1, 3),
    "per_head": st.booleans(),
    "d": st.integers(1, 5),
    "causal": st.booleans(),
    "use_mask": st.booleans(),
    "dtype": st.sampled_from(["float32", "float64"]),
    "seed": st.integers(0, 10_000),
}


class Case:
    """Random inputs in NumPy and on the backend under test."""

    def __init__(self, backend, *, heads, per_head, d, t_q, t_k, dtype, seed, use_mask):
        self.backend = backend
        self.rng = np.random.default_rng(seed)
        self.dtype = dtype
        self.heads = heads
        self.per_head = per_head
        self.d = d
        self.q = self.normal((2, heads, t_q, d))
        self.k = self.normal((2, heads, t_k, d))
        self.v = self.normal((2, heads, t_k, 3))
        self.mask = self.rng.random((t_q, t_k)) < 0.8 if use_mask else None

    def normal(self, shape):
        return self.rng.standard_normal(shape).astype(self.dtype)

    def table(self, rows, width=None, scalar=False):
        tail = (rows,) if scalar else (rows, self.d if width is None else width)
        return self.normal(((self.heads,) if self.per_head else ()) + tail)

    def on(self, a):
        return None if a is None else self.backend.asarray(a)

    def check(self, got, want):
        np.testing.assert_allclose(self.backend.to_numpy(got), want, **TOL[self.dtype])
        assert got.dtype == getattr(self.backend.xp, self.dtype)


def _run(case, logits_fn, attention_fn, reference):
    want_out, want_w, want_pos = reference
    for method in METHODS:
        if logits_fn is not None:
            case.check(logits_fn(method), want_pos)
        out, w = attention_fn(method)
        case.check(out, want_out)
        case.check(w, want_w)


@given(
    t_q=st.integers(0, 6),
    t_k=st.integers(0, 7),
    k_max=st.integers(0, 4),
    q_offset=st.integers(-3, 5),
    beyond=st.sampled_from(["clip", "zero"]),
    values=st.booleans(),
    **common,
)
def test_shaw(
    backend,
    t_q,
    t_k,
    k_max,
    q_offset,
    beyond,
    values,
    heads,
    per_head,
    d,
    causal,
    use_mask,
    dtype,
    seed,
):
    c = Case(
        backend,
        heads=heads,
        per_head=per_head,
        d=d,
        t_q=t_q,
        t_k=t_k,
        dtype=dtype,
        seed=seed,
        use_mask=use_mask,
    )
    a_k = c.table(2 * k_max + 1)
    a_v = c.table(2 * k_max + 1, width=3) if values else None
    reference = ref.relative_attention(
        c.q,
        c.k,
        c.v,
        key_row=ref.shaw_row(a_k, k_max, beyond, q_offset),
        value_row=None if a_v is None else ref.shaw_row(a_v, k_max, beyond, q_offset),
        mask=c.mask,
        causal=causal,
        q_offset=q_offset,
    )
    _run(
        c,
        lambda m: rp.shaw_logits(
            c.on(c.q), c.on(a_k), t_k, q_offset=q_offset, beyond=beyond, method=m
        ),
        lambda m: rp.shaw_attention(
            c.on(c.q),
            c.on(c.k),
            c.on(c.v),
            c.on(a_k),
            c.on(a_v),
            mask=c.on(c.mask),
            causal=causal,
            q_offset=q_offset,
            beyond=beyond,
            method=m,
            return_weights=True,
        ),
        reference,
    )


@given(
    t_q=st.integers(0, 6),
    t_k=st.integers(0, 7),
    k_max=st.integers(0, 4),
    q_offset=st.integers(-3, 5),
    beyond=st.sampled_from(["clip", "zero"]),
    **common,
)
def test_bias(
    backend, t_q, t_k, k_max, q_offset, beyond, heads, per_head, d, causal, use_mask, dtype, seed
):
    c = Case(
        backend,
        heads=heads,
        per_head=per_head,
        d=d,
        t_q=t_q,
        t_k=t_k,
        dtype=dtype,
        seed=seed,
        use_mask=use_mask,
    )
    b = c.table(2 * k_max + 1, scalar=True)
    want_out, want_w, _ = ref.relative_attention(
        c.q,
        c.k,
        c.v,
        bias_value=ref.bias_value(b, k_max, beyond, q_offset),
        mask=c.mask,
        causal=causal,
        q_offset=q_offset,
    )
    want_bias = np.zeros((heads, t_q, t_k) if per_head else (t_q, t_k))
    f = ref.bias_value(b, k_max, beyond, q_offset)
    for idx in np.ndindex(want_bias.shape):
        want_bias[idx] = f(idx[0] if per_head else 0, idx[-2], idx[-1])
    c.check(rp.bias_logits(c.on(b), t_q, t_k, q_offset=q_offset, beyond=beyond), want_bias)
    out, w = rp.bias_attention(
        c.on(c.q),
        c.on(c.k),
        c.on(c.v),
        c.on(b),
        mask=c.on(c.mask),
        causal=causal,
        q_offset=q_offset,
        beyond=beyond,
        return_weights=True,
    )
    c.check(out, want_out)
    c.check(w, want_w)


@given(
    t_q=st.integers(0, 6),
    memory=st.integers(0, 3),
    m=st.integers(1, 8),
    beyond=st.sampled_from(["clip", "zero"]),
    values=st.booleans(),
    **common,
)
def test_music(
    backend, t_q, memory, m, beyond, values, heads, per_head, d, causal, use_mask, dtype, seed
):
    t_k, q_offset = t_q + memory, memory  # self-attention with a cache, end-aligned
    c = Case(
        backend,
        heads=heads,
        per_head=per_head,
        d=d,
        t_q=t_q,
        t_k=t_k,
        dtype=dtype,
        seed=seed,
        use_mask=use_mask,
    )
    e = c.table(m)
    e_v = c.table(m, width=3) if values else None
    reference = ref.relative_attention(
        c.q,
        c.k,
        c.v,
        key_row=ref.music_row(e, beyond, q_offset),
        value_row=None if e_v is None else ref.music_row(e_v, beyond, q_offset),
        mask=c.mask,
        causal=True,
        q_offset=q_offset,
    )
    _run(
        c,
        lambda meth: rp.music_logits(
            c.on(c.q), c.on(e), t_k, q_offset=q_offset, beyond=beyond, method=meth
        ),
        lambda meth: rp.music_attention(
            c.on(c.q),
            c.on(c.k),
            c.on(c.v),
            c.on(e),
            c.on(e_v),
            mask=c.on(c.mask),
            q_offset=q_offset,
            beyond=beyond,
            method=meth,
            return_weights=True,
        ),
        reference,
    )


@given(
    t_max=st.integers(1, 6),
    data=st.data(),
    order=st.sampled_from(["past_to_future", "future_to_past"]),
    **common,
)
def test_general(backend, t_max, data, order, heads, per_head, d, causal, use_mask, dtype, seed):
    t_q = data.draw(st.integers(0, t_max))
    t_k = data.draw(st.integers(0, t_max))
    q_offset = data.draw(st.integers(t_k - t_max, t_max - t_q))
    c = Case(
        backend,
        heads=heads,
        per_head=per_head,
        d=d,
        t_q=t_q,
        t_k=t_k,
        dtype=dtype,
        seed=seed,
        use_mask=use_mask,
    )
    e = c.table(2 * t_max - 1)
    reference = ref.relative_attention(
        c.q,
        c.k,
        c.v,
        key_row=ref.general_row(e, q_offset, order),
        mask=c.mask,
        causal=causal,
        q_offset=q_offset,
    )
    _run(
        c,
        lambda m: rp.general_logits(
            c.on(c.q), c.on(e), t_k, q_offset=q_offset, order=order, method=m
        ),
        lambda m: rp.general_attention(
            c.on(c.q),
            c.on(c.k),
            c.on(c.v),
            c.on(e),
            mask=c.on(c.mask),
            causal=causal,
            q_offset=q_offset,
            order=order,
            method=m,
            return_weights=True,
        ),
        reference,
    )


@given(
    t_q=st.integers(0, 5),
    t_k=st.integers(0, 6),
    extra=st.integers(0, 2),
    q_offset=st.integers(-2, 4),
    **common,
)
def test_absolute(
    backend, t_q, t_k, extra, q_offset, heads, per_head, d, causal, use_mask, dtype, seed
):
    c = Case(
        backend,
        heads=heads,
        per_head=per_head,
        d=d,
        t_q=t_q,
        t_k=t_k,
        dtype=dtype,
        seed=seed,
        use_mask=use_mask,
    )
    table = c.table(t_k + extra)
    want = ref.relative_attention(
        c.q,
        c.k,
        c.v,
        key_row=ref.absolute_row(table),
        mask=c.mask,
        causal=causal,
        q_offset=q_offset,
    )
    c.check(rp.absolute_logits(c.on(c.q), c.on(table), t_k), want[2])
    out, w = rp.absolute_attention(
        c.on(c.q),
        c.on(c.k),
        c.on(c.v),
        c.on(table),
        mask=c.on(c.mask),
        causal=causal,
        q_offset=q_offset,
        return_weights=True,
    )
    c.check(out, want[0])
    c.check(w, want[1])


@given(height=st.integers(1, 4), width=st.integers(1, 4), **common)
def test_grid2d(backend, height, width, heads, per_head, d, causal, use_mask, dtype, seed):
    n = height * width
    c = Case(
        backend,
        heads=heads,
        per_head=per_head,
        d=d,
        t_q=n,
        t_k=n,
        dtype=dtype,
        seed=seed,
        use_mask=use_mask,
    )
    rows, cols = c.table(2 * height - 1), c.table(2 * width - 1)
    reference = ref.relative_attention(
        c.q, c.k, c.v, key_row=ref.grid2d_row(rows, cols, height, width), mask=c.mask, causal=causal
    )
    _run(
        c,
        lambda m: rp.grid2d_logits(
            c.on(c.q), c.on(rows), c.on(cols), height=height, width=width, method=m
        ),
        lambda m: rp.grid2d_attention(
            c.on(c.q),
            c.on(c.k),
            c.on(c.v),
            c.on(rows),
            c.on(cols),
            height=height,
            width=width,
            mask=c.on(c.mask),
            causal=causal,
            method=m,
            return_weights=True,
        ),
        reference,
    )
