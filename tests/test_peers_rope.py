"""Peer conformance of RoPE's frequency scaling: transformers' own rotary embeddings.

For each ``rope_type`` of transformers 5 (``modeling_rope_utils``), the config
goes through `relpos_ref.presets.rope_from_config`, and the model's own
``RotaryEmbedding`` (Llama's, Phi-3's for LongRoPE, Gemma 4's for proportional,
DeepSeek-V3's for YaRN with mscale) gives the cosines and sines; the model's
``apply_rotary_pos_emb`` rotates q and k. Ours: `relpos_ref.rope_cos_sin` and
`relpos_ref.rope_rotate` with the same keyword arguments.

transformers computes in float32, and ``angles="float32"`` forms the
frequencies with the same float32 operations (`relpos_ref.schemes.rope_float32`):
for default, linear, yarn, longrope and proportional its cosines and sines
are then transformers' to float32's rounding of a cosine, at any position
(`EXACT`). Two rules differ by an ulp or three in a few frequencies, which an
angle multiplies by its position (`_bound`): llama3's smoothed band (torch
evaluates ``a / x`` as ``a * (1 / x)``) and dynamic's grown base (torch's
float32 ``pow``). Exact angles (the default) differ from transformers by its
float32 angle error. The largest differences measured (transformers 5.24,
torch 2.13, CPU; cosines and sines with float32 angles, with exact angles;
rotated q and k with float32 angles, entries of magnitude up to about 4):

==============  ==================  ==================  ===============
case            cos/sin, float32    cos/sin, exact      rotated q/k
==============  ==================  ==================  ===============
default         3.6e-08             1.7e-03 (p 131071)  2.4e-07
linear          3.6e-08             3.6e-05             4.8e-07
linear-partial  3.6e-08             9.0e-07             2.4e-07
dynamic         7.6e-06             5.6e-05             2.7e-05
yarn            9.9e-08             1.7e-04             4.8e-07
yarn-beta       9.1e-08             4.8e-06             4.8e-07
yarn-deepseek   8.7e-08             9.6e-05             4.8e-07
longrope        1.4e-07             3.4e-06             7.2e-07
llama3          1.1e-05             1.4e-04             4.0e-05
proportional    3.6e-08             9.0e-05             4.8e-07
==============  ==================  ==================  ===============

(``pytest -s`` prints them.)
"""

from __future__ import annotations

import numpy as np
import pytest

import relpos_ref as rp
from relpos_ref.presets import rope_from_config
from relpos_ref.schemes import rope_scaling

pytestmark = pytest.mark.peers
torch = pytest.importorskip("torch", reason="torch is not installed")
transformers = pytest.importorskip("transformers", reason="transformers is not installed "
                                                          "(pip install 'relpos-ref[peers]')")
if int(transformers.__version__.split(".")[0]) < 5:
    pytest.skip("rope_parameters and modeling_rope_utils as of transformers 5",
                allow_module_level=True)

import array_api_compat.numpy as xnp  # noqa: E402
from transformers import (  # noqa: E402
    DeepseekV3Config,
    Gemma4TextConfig,
    LlamaConfig,
    Phi3Config,
)
from transformers.models.deepseek_v3 import modeling_deepseek_v3 as deepseek  # noqa: E402
from transformers.models.gemma4.modeling_gemma4 import Gemma4TextRotaryEmbedding  # noqa: E402
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding  # noqa: E402
from transformers.models.phi3 import modeling_phi3 as phi3  # noqa: E402

HEAD = 64

#: name -> (model, rope_parameters, max_position_embeddings, calls: (first position, count))
CASES = {
    "default": ("llama", {"rope_type": "default", "rope_theta": 10000.0}, 4096,
                [(0, 64), (131068, 4)]),
    "linear": ("llama", {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0}, 4096,
               [(0, 64), (4000, 96)]),
    "linear-partial": ("llama", {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0,
                                 "partial_rotary_factor": 0.5}, 4096, [(0, 64)]),
    "dynamic": ("llama", {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 4.0}, 256,
                [(0, 200), (0, 1000), (0, 100)]),  # below, past (base grows), back below
    "yarn": ("llama", {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 8.0,
                       "original_max_position_embeddings": 512}, 4096, [(0, 64), (3000, 96)]),
    "yarn-beta": ("llama", {"rope_type": "yarn", "rope_theta": 500000.0, "factor": 4.0,
                            "original_max_position_embeddings": 1024, "beta_fast": 16.0,
                            "beta_slow": 2.0, "truncate": False}, 4096, [(0, 64)]),
    "yarn-deepseek": ("deepseek", {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0,
                                   "original_max_position_embeddings": 64, "mscale": 0.707,
                                   "mscale_all_dim": 1.0, "beta_fast": 32, "beta_slow": 1},
                      2560, [(0, 64), (2000, 64)]),
    "longrope": ("phi3", {"rope_type": "longrope", "rope_theta": 10000.0,
                          "short_factor": [1.0 + 0.05 * c for c in range(HEAD // 2)],
                          "long_factor": [1.0 + 1.5 * c for c in range(HEAD // 2)],
                          "original_max_position_embeddings": 64}, 512,
                 [(0, 64), (0, 65), (0, 40)]),  # short, long (65 > 64), short again
    "llama3": ("llama", {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 256}, 4096, [(0, 64), (2000, 64)]),
    "proportional": ("gemma4", {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                "rope_theta": 1000000.0}, 4096, [(0, 64), (3000, 64)]),
}

#: The cases whose float32 frequencies are transformers' bit for bit: cos and sin to float32's
#: rounding of a cosine (and of the attention factor's product), at any position.
EXACT = {"default", "linear", "linear-partial", "yarn", "yarn-beta", "yarn-deepseek",
         "longrope", "proportional"}


def _module(model, params, max_positions):
    params = dict(params)
    if model == "llama":
        config = LlamaConfig(hidden_size=2 * HEAD, num_attention_heads=2, head_dim=HEAD,
                             max_position_embeddings=max_positions, rope_parameters=params)
        return config, LlamaRotaryEmbedding(config), phi3.apply_rotary_pos_emb
    if model == "phi3":
        config = Phi3Config(hidden_size=2 * HEAD, num_attention_heads=2, num_key_value_heads=2,
                            max_position_embeddings=max_positions, rope_parameters=params,
                            original_max_position_embeddings=params[
                                "original_max_position_embeddings"])
        return config, phi3.Phi3RotaryEmbedding(config), phi3.apply_rotary_pos_emb
    if model == "deepseek":
        config = DeepseekV3Config(hidden_size=2 * HEAD, num_attention_heads=2,
                                  qk_rope_head_dim=HEAD, qk_nope_head_dim=32, v_head_dim=32,
                                  max_position_embeddings=max_positions, rope_parameters=params)
        return config, deepseek.DeepseekV3RotaryEmbedding(config), phi3.apply_rotary_pos_emb
    config = Gemma4TextConfig(hidden_size=2 * HEAD, num_attention_heads=2, head_dim=32,
                              global_head_dim=HEAD, num_hidden_layers=2,
                              max_position_embeddings=max_positions,
                              layer_types=["sliding_attention", "full_attention"],
                              rope_parameters={"sliding_attention": {"rope_type": "default",
                                                                     "rope_theta": 10000.0},
                                               "full_attention": params})
    module = Gemma4TextRotaryEmbedding(config)

    class FullAttention(torch.nn.Module):  # the full-attention layers' rotation
        def __init__(self):
            super().__init__()
            self.inner = module
            self.inv_freq = module.full_attention_inv_freq
            self.attention_scaling = module.full_attention_attention_scaling

        def forward(self, x, position_ids):
            return self.inner(x, position_ids, "full_attention")

    return config, FullAttention(), phi3.apply_rotary_pos_emb


def _ours(name, model, params, max_positions):
    return rope_from_config(params, head_dim=HEAD, max_position_embeddings=max_positions,
                            softmax_mscale=model == "deepseek")


def _bound(first, count, thetas):
    # one float32 ulp of a frequency moves an angle by p theta 2**-23 (two ulps: 2**-22
    # relative); cos and sin are rounded to float32 (and times a factor, once more)
    largest = max(abs(first), abs(first + count - 1)) * max(thetas)
    return largest * 2.0**-21 + 2.0**-21


@pytest.mark.parametrize("name", list(CASES))
def test_cos_sin_and_rotated_q_k_equal_transformers(name):
    model, params, max_positions = CASES[name][:3]
    _, module, apply = _module(model, params, max_positions)
    kw = _ours(name, model, params, max_positions)
    rd = kw["rotary_dim"]
    rng = np.random.default_rng(0)
    worst = [0.0, 0.0, 0.0]
    for first, count in CASES[name][3]:
        positions = torch.arange(first, first + count)[None]
        cos, sin = (a[0].numpy() for a in module(torch.zeros(1), positions))
        length = first + count  # transformers' seq_len: the largest position + 1
        mine = {}
        for angles in ("float32", "float64"):
            mine[angles] = rp.rope_cos_sin(count, offset=first, rotary_dim=rd, angles=angles,
                                           length=length, base=kw["base"],
                                           scaling=kw["scaling"], xp=xnp)
        thetas = rp.rope_frequencies(rd, base=kw["base"], scaling=kw["scaling"], length=length)
        bound = _bound(first, count, thetas)
        for k, angles in enumerate(("float32", "float64")):
            c, s = mine[angles]
            gap = max(np.abs(c - cos[:, :rd // 2]).max(), np.abs(s - sin[:, :rd // 2]).max(),
                      np.abs(c - cos[:, rd // 2:rd]).max())
            limit = 2.0**-22 if angles == "float32" and name in EXACT else bound
            assert gap <= limit, (name, first, angles, gap, limit)
            worst[k] = max(worst[k], float(gap))
        # the rotated queries and keys: transformers' apply_rotary_pos_emb against ours
        q, k = (torch.tensor(rng.standard_normal((1, 2, count, HEAD)), dtype=torch.float32)
                for _ in range(2))
        theirs = apply(q, k, torch.tensor(cos[None, :, :rd]), torch.tensor(sin[None, :, :rd]))
        for x, y in zip((q, k), theirs, strict=True):
            ours = rp.rope_rotate(x.numpy(), offset=first, length=length, angles="float32",
                                  **kw)
            gap = float(np.abs(ours - y.numpy()).max())
            limit = 2.0**-21 if name in EXACT else bound
            assert gap <= 4 * limit * float(x.abs().max()), (name, gap)
            worst[2] = max(worst[2], gap)
    print(f"{name}: cos/sin float32 angles {worst[0]:.2e}, exact angles {worst[1]:.2e}, "
          f"rotated q/k {worst[2]:.2e}")


@pytest.mark.parametrize("name", list(CASES))
def test_frequencies_and_attention_factor_equal_transformers(name):
    model, params, max_positions = CASES[name][:3]
    _, module, _ = _module(model, params, max_positions)
    kw = _ours(name, model, params, max_positions)
    theirs = module.inv_freq.numpy().astype(np.float64)
    ours = np.asarray(rp.rope_frequencies(kw["rotary_dim"], base=kw["base"],
                                          scaling=kw["scaling"], length=1))
    # within four float32 ulps (transformers' float32 pow, division and blend)
    np.testing.assert_allclose(ours, theirs, rtol=4 * 2.0**-23, atol=0)
    ours_factor = rope_scaling.attention_factor(rope_scaling.check_scaling(kw["scaling"]))
    assert ours_factor == pytest.approx(module.attention_scaling, rel=1e-15)


def test_deepseek_softmax_scale_equals_transformers():
    model, params, max_positions = CASES["yarn-deepseek"][:3]
    config, _, _ = _module(model, params, max_positions)
    d = config.qk_nope_head_dim + config.qk_rope_head_dim
    theirs = deepseek.yarn_apply_mscale(config.rope_parameters, d**-0.5)
    kw = _ours("yarn-deepseek", model, params, max_positions)
    q = np.zeros((2, 3, d))
    call = rp.schemes.rope.rope_call(q, q, q, **{**kw, "rotary_dim": HEAD})
    assert call.scale == pytest.approx(theirs, rel=1e-15)
    assert call.scale != pytest.approx(d**-0.5)


def test_deepseek_interleaved_weights_are_our_interleaved_pairs():
    # DeepSeek's rope_interleave: apply_rotary_pos_emb_interleave takes pairs (2c, 2c + 1)
    # and returns them de-interleaved ([x_0, x_2, ..., x_1, x_3, ...]) for rotate_half
    model, params, max_positions = CASES["yarn-deepseek"][:3]
    _, module, _ = _module(model, params, max_positions)
    kw = _ours("yarn-deepseek", model, params, max_positions)
    positions = torch.arange(5)[None]
    cos, sin = module(torch.zeros(1), positions)
    rng = np.random.default_rng(1)
    q, k = (torch.tensor(rng.standard_normal((1, 2, 5, HEAD)), dtype=torch.float32)
            for _ in range(2))
    theirs, _ = deepseek.apply_rotary_pos_emb_interleave(q, k, cos, sin)
    ours = rp.rope_rotate(q.numpy(), angles="float32", length=5,
                          **{**kw, "layout": "interleaved"})
    deinterleaved = np.concatenate([ours[..., 0::2], ours[..., 1::2]], axis=-1)
    np.testing.assert_allclose(deinterleaved, theirs.numpy(), rtol=0, atol=1e-6)


def test_dynamic_cached_keys_keep_the_old_base_in_transformers():
    # transformers #25104: generating past the trained length, the keys already in the
    # cache were rotated with the base of their own step; ours (per call) rotates every
    # key with the call's base, which is the full forward's
    model, params, max_positions = CASES["dynamic"][:3]
    _, module, _ = _module(model, params, max_positions)
    kw = _ours("dynamic", model, params, max_positions)
    early, _ = module(torch.zeros(1), torch.arange(0, 256)[None])  # prefill: base unchanged
    late, _ = module(torch.zeros(1), torch.arange(0, 300)[None])  # past 256: base grows
    ours, _ = rp.rope_cos_sin(300, rotary_dim=HEAD, xp=xnp, angles="float32",
                              base=kw["base"], scaling=kw["scaling"])
    row = 200  # a key of the prefill, as the cache holds it and as the call of 300 sees it
    moved = early[0, row, 1:HEAD // 2].numpy() - late[0, row, 1:HEAD // 2].numpy()
    assert np.abs(moved).max() > 1e-3
    np.testing.assert_allclose(ours[row], late[0, row, :HEAD // 2].numpy(), atol=1e-4)
