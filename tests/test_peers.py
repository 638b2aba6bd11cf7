"""Peer conformance: the presets reproduce the real packages (skipped when one is absent)."""

from __future__ import annotations

import numpy as np
import pytest

import relpos_ref as rp
from relpos_ref.presets import PRESETS

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
