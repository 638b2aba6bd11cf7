"""Properties every relative scheme must have, worked examples, and bad input."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import relpos_ref as rp


def _qkv(backend, rng, t_q, t_k, d=4, heads=2):
    q = rng.standard_normal((heads, t_q, d))
    k = rng.standard_normal((heads, t_k, d))
    v = rng.standard_normal((heads, t_k, 3))
    return q, k, v


SCHEMES = {
    # name: (table rows for (t_q, t_k), call(backend arrays, table, method, **kw))
    "shaw": lambda q, k, v, t, m, **kw: rp.shaw_attention(q, k, v, t, t[..., :3], method=m, **kw),
    "bias": lambda q, k, v, t, m, **kw: rp.bias_attention(q, k, v, t[..., 0], **kw),
    "music": lambda q, k, v, t, m, **kw: rp.music_attention(q, k, v, t, t[..., :3], method=m, **kw),
    "general": lambda q, k, v, t, m, **kw: rp.general_attention(q, k, v, t, method=m, **kw),
    # w_r (d_model = 6, d), without the biases u and v (they are not positional)
    "transformer_xl": lambda q, k, v, t, m, **kw: rp.transformer_xl_attention(
        q, k, v, t, method=m, **kw
    ),
    # the same table for c2p and p2c, S = 4, log buckets from |r| > 2
    "deberta": lambda q, k, v, t, m, **kw: rp.deberta_attention(
        q, k, v, t, t, max_position=6, method=m, **kw
    ),
}


def _table(name, rng, t, d=4):
    rows = {"shaw": 5, "bias": 5, "music": t, "general": 2 * t - 1, "transformer_xl": 6,
            "deberta": 8}[name]
    return rng.standard_normal((rows, d))


@pytest.mark.parametrize("name", sorted(SCHEMES))
@pytest.mark.parametrize("method", ["efficient", "definition"])
def test_zero_tables_reduce_to_plain_attention(backend, name, method):
    rng = np.random.default_rng(1)
    q, k, v = (backend.asarray(a) for a in _qkv(backend, rng, 5, 5))
    table = backend.asarray(np.zeros_like(_table(name, rng, 5)))
    causal = name == "music"
    got = SCHEMES[name](q, k, v, table, method, causal=causal)
    scale = 1 / np.sqrt(3 * 4) if name == "deberta" else None  # 1 / sqrt(d (1 + 2 terms))
    want = rp.attention(q, k, v, causal=causal, scale=scale)
    np.testing.assert_allclose(backend.to_numpy(got), backend.to_numpy(want), rtol=1e-12)


def test_grid2d_and_absolute_zero_tables_reduce_to_plain_attention(backend):
    rng = np.random.default_rng(2)
    q, k, v = (backend.asarray(a) for a in _qkv(backend, rng, 6, 6))
    want = backend.to_numpy(rp.attention(q, k, v))
    zeros = backend.asarray(np.zeros((6, 4)))
    got = rp.grid2d_attention(q, k, v, zeros[:3, :], zeros[:5, :], height=2, width=3)
    np.testing.assert_allclose(backend.to_numpy(got), want, rtol=1e-12)
    got = rp.absolute_attention(q, k, v, zeros)
    np.testing.assert_allclose(backend.to_numpy(got), want, rtol=1e-12)


@pytest.mark.parametrize("name", sorted(SCHEMES))
@given(shift=st.integers(1, 4), seed=st.integers(0, 999))
def test_translating_all_positions_changes_nothing(backend, name, shift, seed):
    # Prepend `shift` keys the queries may not see and move the queries by as
    # much: every real (query, key) pair keeps its distance, so nothing changes.
    rng = np.random.default_rng(seed)
    t = 4
    q, k, v = _qkv(backend, rng, t, t)
    table = backend.asarray(_table(name, rng, t + shift))
    pad_k = np.concatenate([rng.standard_normal((2, shift, 4)), k], axis=1)
    pad_v = np.concatenate([rng.standard_normal((2, shift, 3)), v], axis=1)
    mask = np.ones((t, t + shift), dtype=bool)
    mask[:, :shift] = False
    base = SCHEMES[name](*(backend.asarray(a) for a in (q, k, v)), table, "efficient", causal=True)
    moved = SCHEMES[name](
        *(backend.asarray(a) for a in (q, pad_k, pad_v)),
        table,
        "efficient",
        causal=True,
        q_offset=shift,
        mask=backend.asarray(mask),
    )
    np.testing.assert_allclose(
        backend.to_numpy(moved), backend.to_numpy(base), rtol=1e-10, atol=1e-12
    )


@pytest.mark.parametrize("name", sorted(SCHEMES))
@pytest.mark.parametrize("method", ["efficient", "definition"])
def test_causal_rows_ignore_the_future(backend, name, method):
    rng = np.random.default_rng(3)
    t = 6
    q, k, v = _qkv(backend, rng, t, t)
    table = backend.asarray(_table(name, rng, t))
    base = backend.to_numpy(
        SCHEMES[name](*(backend.asarray(a) for a in (q, k, v)), table, method, causal=True)
    )
    k2, v2 = k.copy(), v.copy()
    k2[:, 4:] += 10.0
    v2[:, 4:] -= 10.0
    moved = backend.to_numpy(
        SCHEMES[name](*(backend.asarray(a) for a in (q, k2, v2)), table, method, causal=True)
    )
    np.testing.assert_allclose(moved[:, :4], base[:, :4], rtol=1e-12)
    assert not np.allclose(moved[:, 4:], base[:, 4:])


@pytest.mark.parametrize("name", sorted(SCHEMES))
def test_identical_per_head_tables_equal_the_shared_table(backend, name):
    rng = np.random.default_rng(4)
    q, k, v = (backend.asarray(a) for a in _qkv(backend, rng, 5, 5, heads=3))
    shared = _table(name, rng, 5)
    per_head = np.broadcast_to(shared, (3, *shared.shape)).copy()
    causal = name == "music"
    a = SCHEMES[name](q, k, v, backend.asarray(shared), "efficient", causal=causal)
    b = SCHEMES[name](q, k, v, backend.asarray(per_head), "efficient", causal=causal)
    np.testing.assert_allclose(backend.to_numpy(a), backend.to_numpy(b), rtol=1e-12)


def test_worked_example_five_word_window(xp):
    # Shaw et al. with K = 2 and five words: word 0 reads rows 2..4 (clipped at 4),
    # word 4 reads rows 0..2, so its first keys share the row of distance -2.
    index, _ = rp.shaw_index(5, 5, max_distance=2, xp=xp)
    index = np.asarray(index)
    np.testing.assert_array_equal(index[0], [2, 3, 4, 4, 4])
    np.testing.assert_array_equal(index[4], [0, 0, 0, 1, 2])
    # With a window of K = 4 every row of the 9-row table is distinct: word 0 uses
    # indices 4..8 and word 4 uses 0..4.
    index = np.asarray(rp.shaw_index(5, 5, max_distance=4, xp=xp).index)
    np.testing.assert_array_equal(index[0], [4, 5, 6, 7, 8])
    np.testing.assert_array_equal(index[4], [0, 1, 2, 3, 4])


def test_worked_example_four_token_distance_table(xp):
    # Four tokens, a 7-row table: index 0 means distance -3, index 6 means +3.
    index = np.asarray(rp.general_index(4, 4, t_max=4, xp=xp))
    r = np.asarray(rp.relative_positions(4, 4, xp=xp))
    np.testing.assert_array_equal(index - 3, r)
    assert index[3, 0] == 0 and r[3, 0] == -3
    assert index[0, 3] == 6 and r[0, 3] == 3


def test_worked_example_stacked_diagonals_t_max_4(xp):
    # Table rows hold their own distance; each diagonal of the term reads one row.
    e = xp.asarray([[-3.0], [-2.0], [-1.0], [0.0], [1.0], [2.0], [3.0]])
    for t_q, t_k, q_offset in [(4, 4, 0), (2, 4, 2), (4, 2, 0), (1, 4, 3)]:
        got = np.asarray(rp.general_logits(xp.ones((t_q, 1)), e, t_k, q_offset=q_offset))
        np.testing.assert_array_equal(
            got, np.asarray(rp.relative_positions(t_q, t_k, q_offset=q_offset, xp=xp))
        )
    got = np.asarray(
        rp.general_logits(xp.ones((4, 1)), xp.flip(e, axis=0), 4, order="future_to_past")
    )
    np.testing.assert_array_equal(got, np.asarray(rp.relative_positions(4, 4, xp=xp)))


def test_bad_input(backend):
    a = backend.asarray
    q = a(np.ones((2, 4, 8)))
    with pytest.raises(ValueError, match=r"`key_table` must have 2K \+ 1 rows .* got 4"):
        rp.shaw_logits(q, a(np.ones((4, 8))), 4)
    with pytest.raises(ValueError, match=r"`key_table` must have width 8"):
        rp.shaw_logits(q, a(np.ones((5, 7))), 4)
    with pytest.raises(ValueError, match=r"`key_table` has 3 heads .* `q` has shape \(2, 4, 8\)"):
        rp.shaw_logits(q, a(np.ones((3, 5, 8))), 4)
    with pytest.raises(ValueError, match=r"`value_table` must have as many rows as `key_table`"):
        rp.shaw_attention(q, q, q, a(np.ones((5, 8))), a(np.ones((3, 8))))
    with pytest.raises(ValueError, match=r"`value_table` must have width d_v = 8"):
        rp.shaw_attention(q, q, q, a(np.ones((5, 8))), a(np.ones((5, 3))))
    with pytest.raises(ValueError, match=r"`t_k` = 5 exceeds the table's maximum length t_max = 4"):
        rp.general_logits(q, a(np.ones((7, 8))), 5)
    with pytest.raises(ValueError, match=r"`t_k` = 5 exceeds the table's 4 positions"):
        rp.absolute_logits(q, a(np.ones((4, 8))), 5)
    with pytest.raises(
        ValueError, match=r"`row_table` must have 3 rows \(2 height - 1 for height = 2\), got 4"
    ):
        rp.grid2d_logits(q, a(np.ones((4, 8))), a(np.ones((3, 8))), height=2, width=2)
    with pytest.raises(ValueError, match=r"`q` must have height \* width = 6 tokens"):
        rp.grid2d_logits(q, a(np.ones((3, 8))), a(np.ones((5, 8))), height=2, width=3)
    with pytest.raises(ValueError, match=r"`method` must be one of 'efficient', 'definition'"):
        rp.music_logits(q, a(np.ones((4, 8))), 4, method="fast")
    # any offset has an efficient path (the skew for end-aligned queries, stacked diagonals
    # otherwise); it equals the definition
    table = a(np.arange(32.0).reshape(4, 8) / 32)
    fast = rp.music_logits(q, table, 4, q_offset=1)
    slow = rp.music_logits(q, table, 4, q_offset=1, method="definition")
    np.testing.assert_allclose(backend.to_numpy(fast), backend.to_numpy(slow), rtol=1e-12)
    with pytest.raises(ValueError, match=r"distance -3 is beyond the table \(length=3"):
        rp.music_logits(q, a(np.ones((3, 8))), 4, beyond="error")
    # The message states the table's rows (r = -1 .. 0), not the future distances.
    with pytest.raises(ValueError, match=r"\(length=2, rows for r = -1 \.\. 0\)"):
        rp.music_logits(q, a(np.ones((2, 8))), 4, beyond="error")
    with pytest.raises(ValueError, match=r"distance -3 is beyond the table \(max_distance=1"):
        rp.shaw_attention(q, q, q, a(np.ones((3, 8))), beyond="error")
    with pytest.raises(TypeError, match="no silent upcast"):
        rp.shaw_logits(q, a(np.ones((5, 8), dtype=np.float32)), 4)
    with pytest.raises(ValueError, match=r"`table` must have shape \(n,\) or \(h, n\)"):
        rp.bias_logits(a(np.ones((2, 3, 5))), 4, 4)


@pytest.mark.parametrize("scheme", ["shaw", "music"])
@pytest.mark.parametrize("mask_shape", [(), (6,), (1, 6), (5, 1), (2, 1, 6)])
@pytest.mark.parametrize("method", ["efficient", "definition"])
def test_value_tables_take_a_mask_that_broadcasts_over_the_pairs(backend, scheme, mask_shape,
                                                                 method):
    # A mask broadcasting over (t_q, t_k) means what the full mask means; the relative
    # values' distance bins used to need the full one (an unpacking error otherwise).
    rng = np.random.default_rng(11)
    q, k, v = _qkv(backend, rng, 5, 6)
    table = rng.standard_normal((7, 4))
    mask = rng.random(mask_shape) < 0.7
    if mask.ndim:
        mask.reshape(-1)[0] = True
    full = np.broadcast_to(mask, (*mask_shape[:-2], 5, 6)).copy()
    call = SCHEMES[scheme]
    args = [backend.asarray(a) for a in (q, k, v, table)]
    got = call(*args, method, mask=backend.asarray(mask), q_offset=1, causal=scheme == "music")
    want = call(*args, method, mask=backend.asarray(full), q_offset=1,
                causal=scheme == "music")
    np.testing.assert_allclose(backend.to_numpy(got), backend.to_numpy(want), rtol=1e-12,
                               atol=1e-12)
