"""Presets whose peers cannot be installed here, checked against their code transcribed."""

from __future__ import annotations

import numpy as np
import pytest

import relpos_ref as rp
from relpos_ref.presets import PRESETS, bert_key_query

RNG = np.random.default_rng(7)


def test_every_preset_names_a_scheme_and_how_it_is_verified():
    schemes = {"shaw", "music", "general", "t5", "alibi", "grid2d", "swin"}
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
