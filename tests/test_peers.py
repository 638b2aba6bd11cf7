"""Peer conformance: the presets reproduce the real packages (skipped when one is absent)."""

from __future__ import annotations

import math

import numpy as np
import pytest

import relpos_ref as rp
from relpos_ref.presets import PRESETS, bert_key_query

pytestmark = pytest.mark.peers
torch = pytest.importorskip("torch", reason="torch is not installed")


def _need(module: str):
    return pytest.importorskip(module, reason=f"{module} is not installed (pip install "
                                              f"'relpos-ref[peers]')")


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize(("num_buckets", "max_distance"), [(32, 128), (16, 64), (40, 30), (8, 9)])
def test_t5_buckets_equal_hf_transformers(bidirectional, num_buckets, max_distance):
    t5 = _need("transformers.models.t5.modeling_t5")
    r = torch.arange(-2000, 2001)
    theirs = t5.T5Attention._relative_position_bucket(
        r, bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance
    )
    ours = rp.t5_bucket(r.numpy(), num_buckets=num_buckets, max_distance=max_distance,
                        bidirectional=bidirectional)
    assert np.array_equal(theirs.numpy(), ours)


def test_t5_bias_equals_hf_compute_bias():
    t5 = _need("transformers.models.t5.modeling_t5")
    config = t5.T5Config(d_model=16, d_kv=4, num_heads=3, relative_attention_num_buckets=32,
                         relative_attention_max_distance=20, is_decoder=False)
    layer = t5.T5Attention(config, has_relative_attention_bias=True)
    torch.nn.init.normal_(layer.relative_attention_bias.weight)
    theirs = layer.compute_bias(7, 11)[0].detach().numpy()  # (h, t_q, t_k)
    table = PRESETS["hf-t5"].to_canonical(layer.relative_attention_bias.weight.detach().numpy())
    ours = rp.t5_bias(table, 7, 11, max_distance=20, bidirectional=True)
    np.testing.assert_array_equal(ours, theirs)


@pytest.mark.parametrize("causal", [False, True])
def test_t5_bias_equals_x_transformers(causal):
    xt = _need("x_transformers.x_transformers")
    module = xt.RelativePositionBias(scale=0.5, causal=causal, num_buckets=16, max_distance=40,
                                     heads=3)
    torch.nn.init.normal_(module.relative_attention_bias.weight)
    theirs = module(5, 23).detach().numpy()  # end-aligned: 5 queries, 23 keys
    table = PRESETS["x-transformers-t5"].to_canonical(
        module.relative_attention_bias.weight.detach().numpy(), scale=0.5
    )
    ours = rp.t5_bias(table, 5, 23, q_offset=18, max_distance=40, bidirectional=not causal)
    np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=0)


@pytest.mark.parametrize("heads", [1, 3, 4, 6, 8, 12])
def test_alibi_equals_x_transformers(heads):
    xt = _need("x_transformers.x_transformers")
    module = xt.AlibiPositionalBias(heads=heads)
    theirs = module(6, 10).detach().numpy()
    theirs = theirs.reshape(theirs.shape[-3:])  # (h, t_q, t_k)
    slopes = np.asarray(rp.alibi_slopes(heads), dtype=np.float32)
    ours = rp.alibi_bias(slopes, 6, 10, q_offset=4, symmetric=True)
    np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=0)


@pytest.mark.parametrize("length", [1, 2, 5, 8])
def test_rel_to_abs_equals_pad_flatten_reshape(length):
    bt = _need("bottleneck_transformer_pytorch.bottleneck_transformer_pytorch")
    x = torch.randn(2, 3, length, 2 * length - 1, dtype=torch.float64)
    theirs = bt.rel_to_abs(x).numpy()
    ours = rp.pad_flatten_reshape(x.numpy(), length, offset=length - 1)
    np.testing.assert_array_equal(ours, theirs)


@pytest.mark.parametrize(("height", "width"), [(3, 4), (4, 3), (1, 5), (2, 2)])
def test_relposemb_equals_grid2d(height, width):
    bt = _need("bottleneck_transformer_pytorch.bottleneck_transformer_pytorch")
    module = bt.RelPosEmb((height, width), 8).double()
    q = torch.randn(2, 3, height * width, 8, dtype=torch.float64)
    theirs = module(q).detach().numpy()
    ours = rp.grid2d_logits(q.numpy(), module.rel_height.detach().numpy(),
                            module.rel_width.detach().numpy(), height=height, width=width)
    np.testing.assert_allclose(ours, theirs, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    ("bucket_size", "max_position"),
    [(256, 512), (256, 1024), (8, 32), (64, 512), (32, 128), (4, 10), (3, 7), (512, 4096)],
)
def test_deberta_buckets_equal_hf_transformers(bucket_size, max_position):
    dv2 = _need("transformers.models.deberta_v2.modeling_deberta_v2")
    r = torch.arange(-3 * max_position, 3 * max_position + 1)
    theirs = dv2.make_log_bucket_position(r, bucket_size, max_position).numpy().astype(np.int64)
    theirs = np.clip(theirs, -bucket_size, bucket_size)  # ours caps |b| at the table's end
    ours = rp.deberta_bucket(r.numpy(), bucket_size=bucket_size, max_position=max_position)
    differ = np.nonzero(ours != theirs)[0]
    # transformers takes the log in float32; it may only differ where the exact value of
    # the ceiling's argument is within float32 rounding of an integer
    mid = bucket_size // 2
    for n in differ:
        a = abs(int(r[n]))
        x = math.log(a / mid) / math.log((max_position - 1) / mid) * (mid - 1)
        assert abs(x - round(x)) < 1e-5, (int(r[n]), x)
        assert abs(int(ours[n]) - int(theirs[n])) == 1
    assert len(differ) <= 2


@pytest.mark.parametrize(
    ("terms", "share", "buckets", "t"),
    [(["c2p", "p2c"], True, 8, 40), (["c2p", "p2c"], False, 16, 9), (["c2p"], True, 8, 20),
     (["p2c"], False, 4, 12), (["c2p", "p2c"], True, 0, 10)],
)
def test_deberta_v2_attention_equals_hf_transformers(terms, share, buckets, t):
    dv2 = _need("transformers.models.deberta_v2.modeling_deberta_v2")
    torch.manual_seed(0)
    heads, d = 2, 8
    config = dv2.DebertaV2Config(
        hidden_size=heads * d, num_attention_heads=heads, position_buckets=buckets,
        max_relative_positions=32, relative_attention=True, pos_att_type=terms,
        share_att_key=share, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    )
    layer = dv2.DisentangledSelfAttention(config).double().eval()
    span = buckets if buckets > 0 else 32
    hidden = torch.randn(1, t, heads * d, dtype=torch.float64)
    rel_embeddings = torch.randn(2 * span, heads * d, dtype=torch.float64)
    with torch.no_grad():
        context, probs = layer(hidden, torch.ones(1, 1, t, t, dtype=torch.bool),
                               output_attentions=True, rel_embeddings=rel_embeddings)

        def split(x):  # (1, t, h d) -> (1, h, t, d)
            return x.view(1, t, heads, d).permute(0, 2, 1, 3).numpy()

        q, k, v = (split(proj(hidden)) for proj in (layer.query_proj, layer.key_proj,
                                                    layer.value_proj))
        key_proj = layer.key_proj if share else getattr(layer, "pos_key_proj", None)
        query_proj = layer.query_proj if share else getattr(layer, "pos_query_proj", None)
        convert = PRESETS["hf-deberta-v2"].to_canonical
        key_table = convert(key_proj(rel_embeddings).numpy(), heads=heads) \
            if "c2p" in terms else None
        query_table = convert(query_proj(rel_embeddings).numpy(), heads=heads) \
            if "p2c" in terms else None
    out, w = rp.deberta_attention(q, k, v, key_table, query_table,
                                  max_position=32 if buckets > 0 else None, return_weights=True)
    # transformers computes its scale as a float32 tensor: agreement to ~1e-7
    np.testing.assert_allclose(w, probs.numpy(), rtol=0, atol=1e-6)
    ours = out.transpose(0, 2, 1, 3).reshape(1, t, heads * d)
    np.testing.assert_allclose(ours, context.numpy(), rtol=0, atol=1e-6)


@pytest.mark.parametrize(("attn_type", "clamp_len", "qlen", "mlen"),
                         [("bi", -1, 5, 3), ("bi", 3, 6, 0), ("uni", -1, 4, 4), ("uni", 2, 3, 5)])
def test_xlnet_relative_attention_equals_transformer_xl(attn_type, clamp_len, qlen, mlen):
    xl = _need("transformers.models.xlnet.modeling_xlnet")
    torch.manual_seed(1)
    heads, d = 2, 8
    config = xl.XLNetConfig(d_model=16, n_head=heads, d_head=d, n_layer=1, d_inner=32,
                            attn_type=attn_type, clamp_len=clamp_len, dropout=0.0)
    model = xl.XLNetModel(config).double().eval()
    attn = model.layer[0].rel_attn
    for p in (attn.r_w_bias, attn.r_r_bias, attn.r):
        torch.nn.init.normal_(p)
    klen = qlen + mlen
    q = torch.randn(qlen, 1, heads, d, dtype=torch.float64)
    k, v = (torch.randn(klen, 1, heads, d, dtype=torch.float64) for _ in range(2))
    mask = None
    if attn_type == "uni":  # XLNetModel's causal mask, memory visible
        mask = torch.triu(torch.ones(qlen, klen, dtype=torch.float64), diagonal=1 + mlen)
        mask = mask[:, :, None, None]
    with torch.no_grad():
        pos_emb = model.relative_positional_encoding(qlen, klen, bsz=1).double()
        k_r = torch.einsum("ibh,hnd->ibnd", pos_emb, attn.r)
        vec, prob = attn.rel_attn_core(q, k, v, k_r, attn_mask=mask, output_attentions=True)

    def heads_first(x):  # (t, b, h, d) -> (b, h, t, d)
        return x.permute(1, 2, 0, 3).numpy()

    preset = PRESETS["xlnet"]
    out, w = rp.transformer_xl_attention(
        heads_first(q), heads_first(k), heads_first(v),
        preset.to_canonical(attn.r.detach().numpy()),
        attn.r_w_bias.detach().numpy(), attn.r_r_bias.detach().numpy(),
        clamp_len=None if clamp_len <= 0 else clamp_len, causal=attn_type == "uni",
        return_weights=True,
    )
    # XLNet builds the sinusoids in float32: agreement to ~1e-7
    np.testing.assert_allclose(out, heads_first(vec), rtol=0, atol=1e-6)
    np.testing.assert_allclose(w, prob.permute(2, 3, 0, 1).numpy(), rtol=0, atol=1e-6)


#: transformers' model modules with a Conformer-style self-attention, and their class prefix
_W2V = {"wav2vec2_bert": "Wav2Vec2Bert", "wav2vec2_conformer": "Wav2Vec2Conformer"}


def _wav2vec2_attention(model: str, position_type: str, heads: int, d: int, **config: int):
    """A float64 ``<prefix>SelfAttention`` with random weights, its config and its module."""
    w2v = _need(f"transformers.models.{model}.modeling_{model}")
    import transformers

    cfg = getattr(transformers, f"{_W2V[model]}Config")(
        hidden_size=heads * d, num_attention_heads=heads, position_embeddings_type=position_type,
        attention_dropout=0.0, **config)
    cfg._attn_implementation = "eager"
    layer = getattr(w2v, f"{_W2V[model]}SelfAttention")(cfg).double().eval()
    for p in layer.parameters():
        torch.nn.init.normal_(p, std=0.5)
    return w2v, cfg, layer


def _projected(layer, x, heads, d):
    """q, k, v of `layer` on hidden states `x` (1, t, h d), heads first, as NumPy."""
    def split(linear):
        return linear(x).view(1, -1, heads, d).transpose(1, 2).detach().numpy()
    return split(layer.linear_q), split(layer.linear_k), split(layer.linear_v)


@pytest.mark.parametrize(("left", "right", "t"), [(64, 8, 20), (3, 1, 9), (1, 5, 12), (0, 2, 4)])
def test_wav2vec2_bert_relative_key_equals_asymmetric_shaw(left, right, t):
    torch.manual_seed(2)
    heads, d = 2, 4
    _, _, layer = _wav2vec2_attention(
        "wav2vec2_bert", "relative_key", heads, d, left_max_position_embeddings=left,
        right_max_position_embeddings=right)
    x = torch.randn(1, t, heads * d, dtype=torch.float64)
    with torch.no_grad():
        theirs, weights = layer(x)
    preset = PRESETS["hf-wav2vec2-bert-relative-key"]
    params = {**preset.params, "max_past": left}
    q, k, v = _projected(layer, x, heads, d)
    table = preset.to_canonical(layer.distance_embedding.weight.detach().numpy())
    out, w = rp.shaw_attention(q, k, v, table, return_weights=True, **params)
    with torch.no_grad():
        ours = layer.linear_out(torch.from_numpy(out.transpose(0, 2, 1, 3).reshape(1, t, -1)))
    np.testing.assert_allclose(w, weights.numpy(), rtol=0, atol=1e-12)
    np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=0, atol=1e-12)


@pytest.mark.parametrize("model", sorted(_W2V))
@pytest.mark.parametrize("t", [1, 7, 16])
def test_conformer_relative_attention_equals_transformer_xl(model, t):
    torch.manual_seed(3)
    heads, d = 2, 4
    w2v, cfg, layer = _wav2vec2_attention(model, "relative", heads, d)
    embed = getattr(w2v, f"{_W2V[model]}RelPositionalEmbedding")(cfg)
    x = torch.randn(1, t, heads * d, dtype=torch.float64)
    with torch.no_grad():
        pe = embed(x)
        theirs, weights = layer(x, relative_position_embeddings=pe)
    preset = PRESETS["hf-conformer-relative"]
    q, k, v = _projected(layer, x, heads, d)
    w_r = preset.to_canonical(layer.linear_pos.weight.detach().numpy(), heads=heads)
    out, w = rp.transformer_xl_attention(
        q, k, v, w_r, layer.pos_bias_u.detach().numpy(), layer.pos_bias_v.detach().numpy(),
        return_weights=True, **preset.params)
    with torch.no_grad():
        ours = layer.linear_out(torch.from_numpy(out.transpose(0, 2, 1, 3).reshape(1, t, -1)))
    # transformers builds the sinusoids in float32: agreement to ~1e-6
    np.testing.assert_allclose(w, weights.numpy(), rtol=0, atol=1e-5)
    np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=0, atol=1e-5)


@pytest.mark.parametrize("kind", ["relative_key", "relative_key_query"])
@pytest.mark.parametrize("t", [1, 5, 8])
def test_bert_relative_key_equals_general(kind, t):
    transformers = _need("transformers")
    if int(transformers.__version__.split(".")[0]) >= 5:
        pytest.skip("transformers 5 removed relative_key from BERT "
                    "(huggingface/transformers#41170): needs transformers < 5")
    bert = _need("transformers.models.bert.modeling_bert")
    torch.manual_seed(4)
    heads, d, positions = 2, 4, 8
    config = bert.BertConfig(hidden_size=heads * d, num_attention_heads=heads,
                             max_position_embeddings=positions, position_embedding_type=kind,
                             attention_probs_dropout_prob=0.0)
    layer = bert.BertSelfAttention(config).double().eval()
    for p in layer.parameters():
        torch.nn.init.normal_(p, std=0.5)
    x = torch.randn(1, t, heads * d, dtype=torch.float64)
    with torch.no_grad():
        theirs, weights = layer(x, output_attentions=True)[:2]

    def split(linear):
        return linear(x).view(1, t, heads, d).transpose(1, 2).detach().numpy()

    q, k, v = split(layer.query), split(layer.key), split(layer.value)
    preset = PRESETS[f"hf-bert-{kind.replace('_', '-')}"]
    table = preset.to_canonical(layer.distance_embedding.weight.detach().numpy())
    if kind == "relative_key":
        out, w = rp.general_attention(q, k, v, table, return_weights=True, **preset.params)
    else:
        out, w = rp.attention(q, k, v, position=bert_key_query(q, k, table),
                              return_weights=True)
    np.testing.assert_allclose(w, weights.numpy(), rtol=0, atol=1e-12)
    ours = out.transpose(0, 2, 1, 3).reshape(1, t, heads * d)
    np.testing.assert_allclose(ours, theirs.numpy(), rtol=0, atol=1e-12)
