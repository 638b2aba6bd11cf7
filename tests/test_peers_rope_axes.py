"""Peer conformance of multi-axis RoPE and the tail layout: transformers' own modules.

Qwen2-VL's and Qwen3-VL's text rotary embeddings (M-RoPE, contiguous and
interleaved sections, default and linear frequencies) and their vision towers'
axial rotary embeddings give cosines and sines for 3-axis and 2-axis positions;
``apply_rotary_pos_emb`` and ``apply_rotary_pos_emb_vision`` rotate q and k.
Ours: `relpos_ref.rope_rotate` with ``axes`` and ``positions``, float32 angles
(transformers' arithmetic) and exact ones. DeepSeek-V3's MLA rotates the tail of
its query heads, ``cat(q_pass, rotate(q_rot))``: ours with ``rotary_at="tail"``.

Largest differences measured (transformers 5.24, torch 2.13, CPU; text positions
below 180, vision positions up to 25; entries of q and k of magnitude up to about 4;
``pytest -s`` prints them):

================  ================  ================  ================
case              cos/sin, float32  cos/sin, exact    rotated q/k f32
================  ================  ================  ================
qwen2-vl text     6.0e-08           3.3e-06           2.4e-07
qwen2-vl linear   6.0e-08           1.9e-06           2.4e-07
qwen3-vl text     6.0e-08           4.9e-06           2.4e-07
qwen2-vl vision   6.0e-08           2.4e-07           2.4e-07
qwen3-vl vision   6.0e-08           2.4e-07           2.4e-07
deepseek tail     --                --                2.4e-07
================  ================  ================  ================
"""

from __future__ import annotations

import numpy as np
import pytest

import relpos_ref as rp
from relpos_ref.presets import rope_from_config

pytestmark = pytest.mark.peers
torch = pytest.importorskip("torch", reason="torch is not installed")
transformers = pytest.importorskip("transformers", reason="transformers is not installed "
                                                          "(pip install 'relpos-ref[peers]')")
if int(transformers.__version__.split(".")[0]) < 5:
    pytest.skip("rope_parameters and the VL rotary modules as of transformers 5",
                allow_module_level=True)

from transformers.models.qwen2_vl import modeling_qwen2_vl as qwen2  # noqa: E402
from transformers.models.qwen3_vl import modeling_qwen3_vl as qwen3  # noqa: E402

HEAD, T = 32, 24
SECTION = [4, 6, 6]  # of HEAD / 2 = 16 pairs


def _text(model, params):
    module, config_class, rotary = {
        "qwen2": (qwen2, transformers.Qwen2VLTextConfig, qwen2.Qwen2VLRotaryEmbedding),
        "qwen3": (qwen3, transformers.Qwen3VLTextConfig, qwen3.Qwen3VLTextRotaryEmbedding),
    }[model]
    config = config_class(hidden_size=2 * HEAD, num_attention_heads=2, num_key_value_heads=2,
                          head_dim=HEAD, rope_parameters=params)
    return rotary(config), module.apply_rotary_pos_emb


def _positions(axes, seed):
    # text tokens (every axis equal), then an image grid, then text again
    rng = np.random.default_rng(seed)
    out = np.repeat(np.arange(T)[None], axes, axis=0)
    out[:, 8:20] = rng.integers(0, 180, size=(axes, 12))
    return out


TEXT = {
    "qwen2-vl text": ("qwen2", {"rope_type": "default", "rope_theta": 10000.0,
                                "mrope_section": SECTION}, False),
    "qwen2-vl linear": ("qwen2", {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0,
                                  "mrope_section": SECTION}, False),
    "qwen3-vl text": ("qwen3", {"rope_type": "default", "rope_theta": 5000000.0,
                                "mrope_section": SECTION, "mrope_interleaved": True}, True),
}


def _compare(name, cos, sin, ours_of, q, k, theirs, rd):
    worst = []
    for angles in ("float32", "float64"):
        c, s = ours_of(angles)
        gap = max(np.abs(c - cos[..., :rd // 2]).max(), np.abs(s - sin[..., :rd // 2]).max(),
                  np.abs(c - cos[..., rd // 2:]).max(), np.abs(s - sin[..., rd // 2:]).max())
        assert gap <= (2.0**-22 if angles == "float32" else 2e-5), (name, angles, gap)
        worst.append(float(gap))
    gaps = [float(np.abs(ours - y).max()) for ours, y in zip((q, k), theirs, strict=True)]
    assert max(gaps) <= 2.0**-19, (name, gaps)
    print(f"{name}: cos/sin float32 angles {worst[0]:.2e}, exact {worst[1]:.2e}, "
          f"rotated q/k {max(gaps):.2e}")


def _cos_sin(positions, axes, base, scaling, angles, rd):
    # our cosines and sines: rotate the unit pairs (1, 0) of each pair
    x = np.zeros((positions.shape[-1], rd), dtype=np.float32)
    x[:, :rd // 2] = 1.0
    y = rp.rope_rotate(x, positions=positions, axes=axes, base=base, scaling=scaling,
                       angles=angles)
    return y[:, :rd // 2], y[:, rd // 2:]


@pytest.mark.parametrize("name", list(TEXT))
def test_mrope_cos_sin_and_rotated_q_k_equal_transformers(name):
    model, params, interleaved = TEXT[name]
    module, apply = _text(model, params)
    positions = _positions(3, 0)
    cos, sin = (a[0].numpy() for a in module(torch.zeros(1), torch.tensor(positions)[:, None]))
    # the arguments from the model's own rope_parameters, through the preset
    preset = rope_from_config(params, head_dim=HEAD)
    assert preset["axes"] == {"axes_type": "mrope", "mrope_section": tuple(SECTION),
                              "mrope_interleaved": interleaved}
    assert preset["rotary_dim"] == HEAD and preset["layout"] == "half"
    kw = {key: preset[key] for key in ("axes", "base", "scaling")}
    rng = np.random.default_rng(1)
    q, k = (torch.tensor(rng.standard_normal((1, 2, T, HEAD)), dtype=torch.float32)
            for _ in range(2))
    theirs = [a.numpy() for a in apply(q, k, torch.tensor(cos[None]), torch.tensor(sin[None]))]
    ours = [rp.rope_rotate(x.numpy(), positions=positions, angles="float32", **kw)
            for x in (q, k)]
    _compare(name, cos, sin, lambda angles: _cos_sin(positions, angles=angles, rd=HEAD, **kw),
             *ours, theirs, HEAD)


@pytest.mark.parametrize("model", ["qwen2", "qwen3"])
def test_vision_axial_cos_sin_and_rotated_q_k_equal_transformers(model):
    module, config_class, rotary = {
        "qwen2": (qwen2, transformers.Qwen2VLVisionConfig, qwen2.Qwen2VLVisionRotaryEmbedding),
        "qwen3": (qwen3, transformers.Qwen3VLVisionConfig, qwen3.Qwen3VLVisionRotaryEmbedding),
    }[model]
    heads = 2
    width = {"qwen2": "embed_dim", "qwen3": "hidden_size"}[model]
    config = config_class(**{width: heads * HEAD}, num_heads=heads)
    emb = rotary(config)
    rows, cols = np.divmod(np.arange(T), 6)  # a 4 x 6 grid of patches, row-major
    positions = np.stack([rows * 7, cols * 5])  # a coarse grid: positions up to about 25
    # transformers' vision position ids are (tokens, 2), columns h and w (get_vision_position_ids)
    cos, sin = (a.numpy() for a in emb(torch.zeros(1), torch.tensor(positions.T)))
    rng = np.random.default_rng(2)
    q, k = (torch.tensor(rng.standard_normal((T, heads, HEAD)), dtype=torch.float32)
            for _ in range(2))  # transformers' vision layout: tokens, heads, features
    theirs = [a.numpy().transpose(1, 0, 2) for a in module.apply_rotary_pos_emb_vision(
        q, k, torch.tensor(cos), torch.tensor(sin))]
    kw = {"axes": {"axes_type": "axial", "axes_dims": [HEAD // 2, HEAD // 2]},
          "base": config.rope_parameters["rope_theta"]}
    ours = [rp.rope_rotate(x.numpy().transpose(1, 0, 2), positions=positions, angles="float32",
                           **kw) for x in (q, k)]
    _compare(f"{model}-vl vision", cos, sin,
             lambda angles: _cos_sin(positions, angles=angles, rd=HEAD, scaling=None, **kw),
             *ours, theirs, HEAD)


def test_deepseek_mla_tail_equals_ours():
    # DeepSeek-V3's attention splits each query head into [q_pass (nope), q_rot (rope)],
    # rotates q_rot with its rotary embedding and concatenates them back
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as deepseek

    nope, rope_dim = 16, 32
    config = transformers.DeepseekV3Config(
        hidden_size=64, num_attention_heads=2, qk_rope_head_dim=rope_dim,
        qk_nope_head_dim=nope, v_head_dim=16,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    module = deepseek.DeepseekV3RotaryEmbedding(config)
    cos, sin = module(torch.zeros(1), torch.arange(T)[None])
    rng = np.random.default_rng(3)
    q = torch.tensor(rng.standard_normal((1, 2, T, nope + rope_dim)), dtype=torch.float32)
    q_pass, q_rot = torch.split(q, [nope, rope_dim], dim=-1)
    rotated, _ = deepseek.apply_rotary_pos_emb(q_rot, q_rot, cos, sin)
    theirs = torch.cat((q_pass, rotated), dim=-1).numpy()
    ours = rp.rope_rotate(q.numpy(), rotary_dim=rope_dim, rotary_at="tail", angles="float32")
    gap = float(np.abs(ours - theirs).max())
    assert gap <= 2.0**-19, gap
    np.testing.assert_array_equal(ours[..., :nope], q_pass.numpy())
    print(f"deepseek tail: rotated q {gap:.2e}")
