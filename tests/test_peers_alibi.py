"""ALiBi's conventions (`relpos_ref.presets`) against the implementations that define them.

- BLOOM and MPT: transformers' own attention modules, their attention weights
  against ours at a head count that is not a power of two, and their slopes
  against `alibi_slopes` for every head count up to 64;
- attention-gym: its published score_mod (the attn-gym package), run eagerly
  on index tensors and through FlexAttention;
- FlashAttention: its ``alibi.h`` transcribed (flash-attn needs CUDA).

Each key-only bias (``m j``) equals our causal form up to a constant per row:
the weights agree, which is what is compared.
"""

from __future__ import annotations

import numpy as np
import pytest

import relpos_ref as rp
from relpos_ref import kernels
from relpos_ref.presets import PRESETS

torch = pytest.importorskip("torch", reason="torch is not installed")

pytestmark = pytest.mark.peers

HEAD_COUNTS = (3, 5, 6, 12, 20)  # where the paper's slopes and attention-gym's differ


def _ours(q, k, v, preset, **kwargs):
    with kernels.disabled():
        return rp.alibi_attention(q, k, v, **{**PRESETS[preset].params, **kwargs},
                                  return_weights=True)[1]


def _hidden(t, width, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(2, t, width, generator=g, dtype=torch.float64)


def test_bloom_attention_weights_equal_ours():
    modeling = pytest.importorskip("transformers.models.bloom.modeling_bloom")
    from transformers import BloomConfig

    heads, d, t = 6, 4, 7
    config = BloomConfig(hidden_size=heads * d, n_head=heads, attention_dropout=0.0)
    module = modeling.BloomAttention(config, layer_idx=0).double().eval()
    hidden = _hidden(t, heads * d)
    alibi = modeling.build_alibi_tensor(torch.ones(2, t), heads, torch.float64)
    future = torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1)
    additive = torch.zeros(t, t, dtype=torch.float64).masked_fill(future, float("-inf"))
    with torch.no_grad():
        _, theirs = module(hidden, torch.zeros_like(hidden), alibi, additive[None, None])
        q, k, v = (x.double() for x in module._reshape(module.query_key_value(hidden)))
    ours = _ours(q, k, v, "hf-bloom-alibi")
    # BLOOM's softmax runs in float32 whatever the dtype: 5e-8 measured
    torch.testing.assert_close(theirs, ours, rtol=0, atol=2e-7)
    # the symmetric form gives the same weights under the causal mask
    torch.testing.assert_close(theirs, _ours(q, k, v, "hf-bloom-alibi", symmetric=True),
                               rtol=0, atol=2e-7)


def test_mpt_attention_weights_equal_ours():
    modeling = pytest.importorskip("transformers.models.mpt.modeling_mpt")
    from transformers import MptConfig

    heads, d, t, longest = 6, 4, 7, 16
    config = MptConfig(d_model=heads * d, n_heads=heads, max_seq_len=longest)
    module = modeling.MptAttention(config, layer_idx=0).double().eval()
    hidden = _hidden(t, heads * d, seed=1)
    bias = modeling.build_mpt_alibi_tensor(heads, longest).double()  # (h, 1, longest)
    future = torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1)
    with torch.no_grad():
        _, theirs = module(hidden, bias, attention_mask=future[None, None])
        q, k, v = (x.reshape(2, t, heads, d).transpose(1, 2)
                   for x in module.Wqkv(hidden).chunk(3, dim=2))
    # MPT's softmax runs in float32 too
    torch.testing.assert_close(theirs, _ours(q, k, v, "hf-mpt-alibi"), rtol=0, atol=2e-7)


def test_bloom_and_mpt_slopes_are_the_papers():
    bloom = pytest.importorskip("transformers.models.bloom.modeling_bloom")
    mpt = pytest.importorskip("transformers.models.mpt.modeling_mpt")
    for heads in range(1, 65):
        ours = torch.tensor(rp.alibi_slopes(heads), dtype=torch.float64)
        theirs_bloom = bloom.build_alibi_tensor(torch.ones(1, 2), heads, torch.float64)[:, 0, 1]
        theirs_mpt = -mpt.build_mpt_alibi_tensor(heads, 2)[:, 0, 0].double()  # m * (0 - 1)
        # both compute their slopes in float32 (2^-0.5 for 9 heads is not exact there)
        torch.testing.assert_close(theirs_bloom, ours, rtol=1e-6, atol=0)  # float32 powers
        torch.testing.assert_close(theirs_mpt, ours, rtol=1e-6, atol=0)


def _gym_bias(score_mod, heads, t_q, t_k):
    # attention-gym's score_mod on a zero score, evaluated on index tensors (no compile)
    h = torch.arange(heads)[:, None, None]
    i, j = torch.arange(t_q)[None, :, None], torch.arange(t_k)[None, None, :]
    return score_mod(torch.zeros((), dtype=torch.float64), 0, h, i, j)


@pytest.mark.parametrize("heads", [4, *HEAD_COUNTS])
def test_attention_gym_alibi_is_the_power_of_two_rule(heads):
    mods = pytest.importorskip("attn_gym.mods", reason="attn-gym is not installed")
    theirs = _gym_bias(mods.generate_alibi_bias(heads), heads, 5, 5).double()
    slopes = torch.tensor(rp.alibi_slopes(heads, rule="power_of_two"), dtype=torch.float64)
    ours = rp.alibi_bias(slopes, 5, 5, symmetric=False)
    torch.testing.assert_close(theirs, ours, rtol=1e-6, atol=0)  # their exp2 is float32
    paper = torch.tensor(rp.alibi_slopes(heads), dtype=torch.float64)
    assert torch.equal(paper, slopes) == (heads & (heads - 1) == 0)


def test_attention_gym_alibi_through_flex_attention_equals_the_preset():
    mods = pytest.importorskip("attn_gym.mods", reason="attn-gym is not installed")
    flex = pytest.importorskip("torch.nn.attention.flex_attention")
    heads = 6
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, heads, 8, 4, generator=g, dtype=torch.float64) for _ in "qkv")
    block = flex.create_block_mask(lambda b, h, i, j: i >= j, None, None, 8, 8, device="cpu")
    from unittest import mock

    with mock.patch.object(flex, "_FLEX_ATTENTION_DISABLE_COMPILE_DEBUG", True, create=True):
        theirs = flex.flex_attention(q, k, v, score_mod=mods.generate_alibi_bias(heads),
                                     block_mask=block)
    with kernels.disabled():
        ours = rp.alibi_attention(q, k, v, causal=True, **PRESETS["attention-gym-alibi"].params)
        paper = rp.alibi_attention(q, k, v, causal=True)
    torch.testing.assert_close(theirs, ours, rtol=1e-6, atol=1e-7)
    assert (theirs - paper).abs().max() > 1e-3


def flash_attn_alibi_scores(q, k, slopes, *, causal, scale):
    """FlashAttention 2 ``csrc/flash_attn/src/alibi.h``, transcribed: scores of one batch.

    Dao-AILab/flash-attention v2.8: not causal, ``-slope |row + t_k - t_q - col|``;
    causal, ``slope * col`` with the bottom-right causal mask ``col <= row + t_k - t_q``;
    both added to the scaled ``q k^T``.
    """
    heads, t_q, _ = q.shape
    t_k = k.shape[1]
    scores = np.einsum("hid,hjd->hij", q, k) * scale
    for h in range(heads):
        for row in range(t_q):
            for col in range(t_k):
                if causal:
                    scores[h, row, col] += slopes[h] * col
                    if col > row + t_k - t_q:
                        scores[h, row, col] = -np.inf
                else:
                    scores[h, row, col] -= slopes[h] * abs(row + t_k - t_q - col)
    return scores


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("t_q", "t_k"), [(5, 5), (3, 8)])
def test_flash_attention_alibi_slopes_transcribed(causal, t_q, t_k):
    rng = np.random.default_rng(3)
    heads, d = 5, 4
    q, k, v = (rng.standard_normal((heads, t, d)) for t in (t_q, t_k, t_k))
    slopes = np.asarray(rp.alibi_slopes(heads))
    scores = flash_attn_alibi_scores(q, k, slopes, causal=causal, scale=d**-0.5)
    theirs = np.exp(scores - scores.max(-1, keepdims=True))
    theirs /= theirs.sum(-1, keepdims=True)
    ours = _ours(q, k, v, "flash-attn-alibi", slopes=slopes, causal=causal, q_offset=t_k - t_q)
    np.testing.assert_allclose(theirs, ours, rtol=0, atol=1e-12)
