"""Presets whose peers cannot be installed here, checked against their code transcribed."""

from __future__ import annotations

import numpy as np
import pytest

import relpos_ref as rp
from relpos_ref.presets import PRESETS, bert_key_query, rope_from_config

RNG = np.random.default_rng(7)


def test_every_preset_names_a_scheme_and_how_it_is_verified():
    schemes = {"shaw", "music", "general", "t5", "alibi", "grid2d", "swin", "transformer_xl",
               "deberta", "rope", "kerple", "sandwich", "xpos", "swinv2"}
    for preset in PRESETS.values():
        assert preset.scheme in schemes and preset.notes and preset.verified_by
        assert preset.name in PRESETS and preset.implementation


@pytest.mark.parametrize(("t_q", "t_k", "k_max"), [(4, 4, 2), (3, 7, 2), (1, 6, 3)])
def test_tensor2tensor_v1_positions_matrix(t_q, t_k, k_max):
    # common_attention._generate_relative_positions_matrix, transcribed
    range_vec_k = np.arange(t_k)
    range_vec_q = range_vec_k[-t_q:]
    distance_mat = range_vec_k[None, :] - range_vec_q[:, None]
    theirs = np.clip(distance_mat, -k_max, k_max) + k_max
    ours = rp.shaw_index(t_q, t_k, max_distance=k_max, q_offset=t_k - t_q, xp=np).index
    assert np.array_equal(ours, theirs)


@pytest.mark.parametrize(("length", "m"), [(5, 3), (3, 5), (4, 4)])
def test_tensor2tensor_v2_left_embeddings(length, m):
    emb = RNG.standard_normal((m, 6))
    q = RNG.standard_normal((2, length, 6))
    # get_relative_embeddings_left: pad with zero rows, then slice the last `length` rows
    pad_length = max(length - m, 0)
    start = max(m - length, 0)
    used = np.concatenate([np.zeros((pad_length, 6)), emb])[start : start + length]
    rel = q @ used.T  # column c is r = c - (length - 1)
    theirs = np.zeros((2, length, length))
    for i in range(length):
        for j in range(i + 1):
            theirs[:, i, j] = rel[:, i, j - i + length - 1]
    ours = rp.music_logits(q, emb, length, **PRESETS["tensor2tensor-v2"].params)
    np.testing.assert_allclose(ours, theirs, rtol=1e-12, atol=1e-12)


def _bert_positional_embedding(t, table):
    # BertSelfAttention, transcribed
    position_ids_l = np.arange(t)[:, None]
    position_ids_r = np.arange(t)[None, :]
    distance = position_ids_l - position_ids_r
    p = (table.shape[0] + 1) // 2
    return table[distance + p - 1]  # (t, t, d)


@pytest.mark.parametrize("t", [1, 3, 6])
def test_hf_bert_relative_key_and_key_query(t):
    table = RNG.standard_normal((2 * 8 - 1, 4))
    q, k = RNG.standard_normal((2, 2, t, 4)), RNG.standard_normal((2, 2, t, 4))
    emb = _bert_positional_embedding(t, table)
    key_scores = np.einsum("bhld,lrd->bhlr", q, emb)
    ours = rp.general_logits(q, table, t, **PRESETS["hf-bert-relative-key"].params)
    np.testing.assert_allclose(ours, key_scores, rtol=1e-12, atol=1e-12)
    key_query = key_scores + np.einsum("bhrd,lrd->bhlr", k, emb)
    np.testing.assert_allclose(bert_key_query(q, k, table), key_query, rtol=1e-12,
                               atol=1e-12)


@pytest.mark.parametrize(("wh", "ww"), [(2, 3), (3, 2), (1, 4), (3, 3)])
def test_swin_relative_position_index(wh, ww):
    heads = 3
    table = RNG.standard_normal(((2 * wh - 1) * (2 * ww - 1), heads))
    # WindowAttention.__init__ / forward, transcribed
    coords = np.stack(np.meshgrid(np.arange(wh), np.arange(ww), indexing="ij"))
    flat = coords.reshape(2, -1)
    rel = (flat[:, :, None] - flat[:, None, :]).transpose(1, 2, 0).copy()
    rel[:, :, 0] += wh - 1
    rel[:, :, 1] += ww - 1
    rel[:, :, 0] *= 2 * ww - 1
    index = rel.sum(-1)
    n = wh * ww
    theirs = table[index.reshape(-1)].reshape(n, n, -1).transpose(2, 0, 1)
    ours = rp.swin_bias(PRESETS["swin"].to_canonical(table), wh, ww)
    np.testing.assert_array_equal(ours, theirs)


def test_future_to_past_tables_reversed_equal_the_canonical_order():
    table = RNG.standard_normal((2 * 5 - 1, 3))
    q = RNG.standard_normal((4, 3))
    theirs = rp.general_logits(q, table, 5, q_offset=1, order="future_to_past")
    preset = PRESETS["diagonal-future-to-past"]
    ours = rp.general_logits(q, preset.to_canonical(table), 5, q_offset=1, **preset.params)
    np.testing.assert_allclose(ours, theirs, rtol=1e-12, atol=1e-12)


def test_bert_key_query_needs_self_attention():
    with pytest.raises(ValueError, match="same length"):
        bert_key_query(np.zeros((2, 3)), np.zeros((3, 3)), np.zeros((5, 3)))


def _transformer_xl_original(w_q, w_k, w_v, r_net, r_w_bias, r_r_bias, mem_len, clamp_len):
    """kimiyoung/transformer-xl RelPartialLearnableMultiHeadAttn, transcribed (one batch).

    w_q (qlen, n, d); w_k, w_v (klen, n, d); r_net (n d, d_model) a Linear weight.
    """
    qlen, n_head, d_head = w_q.shape
    klen = w_k.shape[0]
    d_model = r_net.shape[1]
    pos_seq = np.arange(klen - 1, -1, -1.0)
    if clamp_len > 0:
        pos_seq = np.minimum(pos_seq, clamp_len)
    inv_freq = 1 / (10000 ** (np.arange(0.0, d_model, 2.0) / d_model))
    sinusoid_inp = np.outer(pos_seq, inv_freq)
    pos_emb = np.concatenate([np.sin(sinusoid_inp), np.cos(sinusoid_inp)], axis=-1)
    r_head_k = (pos_emb @ r_net.T).reshape(klen, n_head, d_head)
    ac = np.einsum("ind,jnd->ijn", w_q + r_w_bias, w_k)
    bd = np.einsum("ind,jnd->ijn", w_q + r_r_bias, r_head_k)
    # _rel_shift: zero column in front, view as (klen + 1, qlen), drop the first row
    padded = np.concatenate([np.zeros((qlen, 1, n_head)), bd], axis=1)
    bd = padded.reshape(klen + 1, qlen, n_head)[1:].reshape(qlen, klen, n_head)
    score = (ac + bd) / np.sqrt(d_head)
    mask = np.triu(np.ones((qlen, klen)), k=1 + mem_len).astype(bool)
    score = np.where(mask[:, :, None], -np.inf, score)
    prob = np.exp(score - score.max(axis=1, keepdims=True))
    prob /= prob.sum(axis=1, keepdims=True)
    return np.einsum("ijn,jnd->ind", prob, w_v), prob


@pytest.mark.parametrize(("qlen", "mem_len", "clamp_len"), [(4, 0, 0), (3, 5, 0), (5, 4, 3)])
def test_transformer_xl_original_code(qlen, mem_len, clamp_len):
    heads, d, d_model = 2, 4, 6
    klen = qlen + mem_len
    w_q = RNG.standard_normal((qlen, heads, d))
    w_k, w_v = (RNG.standard_normal((klen, heads, d)) for _ in range(2))
    r_net = RNG.standard_normal((heads * d, d_model))
    r_w_bias, r_r_bias = (RNG.standard_normal((heads, d)) for _ in range(2))
    theirs, prob = _transformer_xl_original(w_q, w_k, w_v, r_net, r_w_bias, r_r_bias, mem_len,
                                            clamp_len)
    preset = PRESETS["transformer-xl"]
    params = {**preset.params, "clamp_len": clamp_len if clamp_len > 0 else None}
    out, w = rp.transformer_xl_attention(
        w_q.transpose(1, 0, 2), w_k.transpose(1, 0, 2), w_v.transpose(1, 0, 2),
        preset.to_canonical(r_net, heads=heads), r_w_bias, r_r_bias, return_weights=True,
        **params,
    )
    np.testing.assert_allclose(out, theirs.transpose(1, 0, 2), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(w, prob.transpose(2, 0, 1), rtol=1e-12, atol=1e-12)


# -- RoPE from a transformers config (the peer tests: tests/test_peers_rope.py) --------------


@pytest.mark.parametrize(("params", "kwargs", "want"), [
    (None, {}, {"base": 10000.0, "rotary_dim": 64, "scaling": None}),
    # Qwen2-VL (transformers 4.x: rope_type "mrope"), Qwen3-VL's interleaved sections
    ({"type": "mrope", "mrope_section": [8, 12, 12]}, {},
     {"scaling": None, "axes": {"axes_type": "mrope", "mrope_section": (8, 12, 12),
                                "mrope_interleaved": False}}),
    ({"rope_type": "linear", "factor": 2.0, "mrope_section": [8, 12, 12],
      "mrope_interleaved": True}, {},
     {"scaling": {"rope_type": "linear", "factor": 2.0},
      "axes": {"axes_type": "mrope", "mrope_section": (8, 12, 12), "mrope_interleaved": True}}),
    ({"rope_type": "default", "rope_theta": 1e6, "partial_rotary_factor": 0.25}, {},
     {"base": 1e6, "rotary_dim": 16, "scaling": None}),
    ({"type": "linear", "factor": 2.0}, {"rope_theta": 500.0, "partial_rotary_factor": 0.5},
     {"base": 500.0, "rotary_dim": 32, "scaling": {"rope_type": "linear", "factor": 2.0}}),
    ({"rope_type": "dynamic", "factor": 4.0}, {"max_position_embeddings": 2048,
                                               "policy": "fixed"},
     {"scaling": {"rope_type": "dynamic", "factor": 4.0,
                  "original_max_position_embeddings": 2048, "policy": "fixed"}}),
    ({"rope_type": "yarn", "factor": None, "original_max_position_embeddings": 4096,
      "beta_fast": None, "mscale": 1.0, "mscale_all_dim": 1.0},
     {"max_position_embeddings": 163840, "softmax_mscale": True, "layout": "interleaved"},
     {"layout": "interleaved",
      "scaling": {"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096,
                  "beta_fast": 32.0, "beta_slow": 1.0, "truncate": True, "mscale": 1.0,
                  "mscale_all_dim": 1.0, "attention_factor": None, "softmax_mscale": True}}),
    ({"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1e6}, {},
     {"rotary_dim": 64, "scaling": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                    "factor": 1.0}}),
    ({"rope_type": "longrope", "short_factor": [1.0] * 32, "long_factor": [2.0] * 32},
     {"max_position_embeddings": 131072},
     {"scaling": {"rope_type": "longrope", "short_factor": [1.0] * 32,
                  "long_factor": [2.0] * 32, "original_max_position_embeddings": 131072,
                  "factor": None, "attention_factor": None, "max_position_embeddings": 131072,
                  "policy": "per_call"}}),
])
def test_rope_from_config_reads_rope_parameters(params, kwargs, want):
    got = rope_from_config(params, head_dim=64, **kwargs)
    for key, value in want.items():
        assert got[key] == value, key
    q = np.ones((3, 64))
    rp.rope_attention(q, q, q, **got)  # the arguments are accepted as they are


@pytest.mark.parametrize(("params", "kwargs", "match"), [
    ({"rope_type": "dynamic", "factor": 2.0}, {}, "rope_type 'dynamic' needs "
                                                 "`max_position_embeddings`"),
    ({"rope_type": "mrope", "mrope_section": [16, 24, 24]}, {},
     r"must share out the 32 pairs of a rotary dimension of 64, got \[16, 24, 24\] \(sum 64\)"),
    ({"rope_type": "default", "mrope_interleaved": True}, {},
     r"`rope_parameters\['mrope_interleaved'\]` needs `mrope_section`"),
    ({"mrope_section": [8, "x", 12]}, {}, r'`axes\["mrope_section"\]` must hold integers'),
    ({"rope_type": "linear", "factor": 2.0, "beta_fast": 3}, {},
     "has field.s. beta_fast that it does not read"),
    ({"rope_type": "ntk"}, {}, r"`rope_parameters\['rope_type'\]` must be one of"),
    ({"rope_type": "linear"}, {}, "rope_type 'linear' needs `factor`"),
    (None, {"head_dim": 0}, "`head_dim` must be >= 1"),
    (None, {"policy": "sometimes"}, "`policy` must be one of"),
    (None, {"partial_rotary_factor": 1.5}, r"`partial_rotary_factor` must be in \(0, 1\], got 1.5"),
    ({"partial_rotary_factor": 0.0}, {}, r"`partial_rotary_factor` must be in \(0, 1\], got 0.0"),
    (None, {"rope_theta": -1.0}, "`rope_theta` must be > 0, got -1.0"),
    ({"rope_theta": "1e4"}, {}, "`rope_theta` must be a real number, got '1e4' of type str"),
    (None, {"head_dim": 127}, r"int\(127 \* 1.0\) = 127 must be even"),
    (None, {"head_dim": 64, "partial_rotary_factor": 0.3}, r"int\(64 \* 0.3\) = 19 must be even"),
])
def test_rope_from_config_names_what_is_wrong(params, kwargs, match):
    with pytest.raises(ValueError, match=match):
        rope_from_config(params, **{"head_dim": 64, **kwargs})


@pytest.mark.parametrize(("name", "shape", "options", "match"), [
    ("hf-t5", (32,), {}, r"preset 'hf-t5': `table` must be stored as \(num_buckets, h\), "
                         r"got shape \(32,\)"),
    ("x-transformers-t5", (32, 2, 1), {}, r"stored as \(num_buckets, h\)"),
    ("swin", (9,), {}, r"preset 'swin': `table` must be stored as Swin's table \(n, h\)"),
    ("nemo-kerple", (2, 8, 1, 1), {}, r"one value per head, \(h, 1, 1\) or \(1, h, 1, 1\), "
                                      r"got shape \(2, 8, 1, 1\)"),
    ("swinv2", (5, 3), {}, r"preset 'swinv2': `w1` must be the first layer's weight \(m, 2\)"),
    ("transformer-xl", (10, 4), {"heads": 3}, r"`heads` must be a whole number >= 1 that "
                                              r"divides the 10 rows"),
    ("xlnet", (4, 8), {}, r"stored as XLNet's r \(d_model, h, d\), got shape \(4, 8\)"),
    ("hf-deberta-v2", (8, 6), {"heads": 4}, r"divides the 6 columns of \(2S, h d\), got 4"),
    ("transformer-xl", (8, 4), {"heads": 2.0}, r"`heads` must be a whole number >= 1 .* 2.0"),
])
def test_a_table_of_the_wrong_layout_is_refused_naming_the_preset(name, shape, options, match):
    with pytest.raises(ValueError, match=match):
        PRESETS[name].to_canonical(np.zeros(shape), **options)


def test_a_head_count_of_numpy_s_integers_is_taken():
    out = PRESETS["transformer-xl"].to_canonical(np.zeros((8, 4)), heads=np.int64(2))
    assert out.shape == (2, 4, 4)
