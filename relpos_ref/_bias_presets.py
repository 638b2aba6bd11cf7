"""The presets of `relpos_ref.presets` for ALiBi's conventions and the extrapolation biases.

Each entry holds the fields of a `relpos_ref.presets.Preset` (its module
builds them): FlashAttention's ``alibi_slopes``, BLOOM's and MPT's key-only
biases, attention-gym's score_mods, NeMo's KERPLE and Sandwich modules, xPos's
torchscale and x-transformers centres, and Swin v2's continuous position bias
(Microsoft's and transformers' masks).
A key-only bias ``m j`` differs from our causal form ``m r = m (j - i - q_offset)``
by ``m (i + q_offset)``, one constant per query row, which softmax ignores:
the weights are the same, masked or not.
"""

from __future__ import annotations

from typing import Any

from . import _xp

__all__ = ["BIAS_PRESETS", "negate_first_layer", "per_head_vector"]


def per_head_vector(table: Any, **_: Any) -> Any:
    """A per-head parameter stored ``(h, 1, 1)`` or ``(1, h, 1, 1)`` -> ``(h,)``.

    Examples
    --------
    >>> import numpy as np
    >>> per_head_vector(np.arange(3.0).reshape(3, 1, 1))
    array([0., 1., 2.])
    """
    xp = _xp.array_namespace(table)
    if sum(n != 1 for n in table.shape) > 1:
        msg = (f"`table` must hold one value per head, (h, 1, 1) or (1, h, 1, 1), got shape "
               f"{tuple(table.shape)}")
        raise ValueError(msg)
    return xp.reshape(table, (-1,))


def negate_first_layer(w1: Any, **_: Any) -> Any:
    """Swin v2's ``Linear(2, m)`` weight on query-minus-key offsets -> ours (key minus query).

    The log-spaced coordinate is odd, ``c(-Δ) = -c(Δ)``, so reading the offsets the other
    way round negates the MLP's input: ``-W_1`` on ours gives their bias.

    Examples
    --------
    >>> import numpy as np
    >>> negate_first_layer(np.asarray([[1.0, -2.0]]))
    array([[-1.,  2.]])
    """
    if not hasattr(w1, "shape") or w1.ndim not in (2, 3) or w1.shape[-1] != 2:
        msg = (f"`w1` must be the first layer's weight (m, 2) (or (h, m, 2)), got shape "
               f"{tuple(getattr(w1, 'shape', ()))}")
        raise ValueError(msg)
    return -w1


_SWINV2_NOTES = (
    "relative_coords = coords_q - coords_k (query minus key) feed the MLP: to_canonical(w1) "
    "negates continuous_position_bias_mlp[0].weight (m, 2) (the log-spaced coordinates are "
    "odd); its bias b1 (m,) and [2].weight (h, m) are w2 unchanged; logit_scale (h, 1, 1) "
    "reshaped to (h,) is logit_scale; pretrained_window_size [0, 0] is None, else the pair. "
)

#: The fields of each preset (`relpos_ref.presets.Preset`), in the docs table's order.
BIAS_PRESETS: tuple[dict[str, Any], ...] = (
    {
        "name": "flash-attn-alibi",
        "implementation": "flash_attn flash_attn_func(..., alibi_slopes=...) (FlashAttention 2, "
                          "csrc/flash_attn/src/alibi.h)",
        "scheme": "alibi",
        "params": {"symmetric": True},
        "notes": "bias -slope abs(i + t_k - t_q - j): queries end-aligned, our q_offset = "
                 "t_k - t_q (pass it: our default is start-aligned); added after the softmax "
                 "scale, as ours. With causal=True it adds slope * j instead, which differs from "
                 "-slope abs(r) by slope (i + t_k - t_q) in each row, a constant softmax ignores, "
                 "under its bottom-right causal mask (our causal with q_offset = t_k - t_q). "
                 "alibi_slopes is (h,) or (batch, h): pass each batch's row as slopes.",
        "verified_by": "worked example (tests/test_peers_alibi.py) transcribing alibi.h; "
                       "flash-attn needs CUDA",
    },
    {
        "name": "hf-bloom-alibi",
        "implementation": "transformers BloomAttention with build_alibi_tensor",
        "scheme": "alibi",
        "params": {"symmetric": False, "causal": True},
        "notes": "key-only bias slope * j, j counted over the attention mask "
                 "((cumsum - 1) * mask: left padding moves every key of a row by one "
                 "constant), added unscaled by baddbmm (beta = 1, alpha = 1/sqrt(head_dim)): "
                 "our causal form plus a constant per row; the paper's slopes.",
        "verified_by": "peer test (tests/test_peers_alibi.py) against transformers' "
                       "BloomAttention weights",
    },
    {
        "name": "hf-mpt-alibi",
        "implementation": "transformers MptAttention with build_mpt_alibi_tensor "
                          "(alibi_bias_max=8)",
        "scheme": "alibi",
        "params": {"symmetric": False, "causal": True},
        "notes": "key-only bias slope * (j - (L - 1)) over max_seq_len L keys, sliced to the "
                 "last key_length: our causal form plus a constant per row, after the "
                 "softmax scale; slopes of the next power of two P, 2^(-8 c / P) for "
                 "c = 1 .. P, even c first then odd: the paper's for every head count (another "
                 "alibi_bias_max scales "
                 "the exponents: pass slopes).",
        "verified_by": "peer test (tests/test_peers_alibi.py) against transformers' "
                       "MptAttention weights and slopes",
    },
    {
        "name": "attention-gym-alibi",
        "implementation": "attn_gym.mods.generate_alibi_bias (FlexAttention score_mod)",
        "scheme": "alibi",
        "params": {"symmetric": False, "slope_rule": "power_of_two"},
        "notes": "score + (kv_idx - q_idx) 2^(-8 (h + 1) / H) (q_idx - kv_idx before "
                 "attention-gym PR #86): our causal form with the power-of-two slope rule, "
                 "the paper's slopes only for a power-of-two head count; indices without an "
                 "offset (start-aligned): decoding with a cache needs q_offset.",
        "verified_by": "peer test (tests/test_peers_alibi.py) against attn-gym",
    },
    {
        "name": "nemo-kerple",
        "implementation": "NeMo KERPLERelativePositionEmbedding (nemo.collections.nlp.modules."
                          "common.megatron.position_embedding)",
        "scheme": "kerple",
        "params": {"kernel": "log"},
        "notes": "-kerple_b log(1 + kerple_a abs(i - j)^kerple_p), abs(i - j) end-aligned "
                 "(the last t_q rows and t_k columns of a square matrix); not bidirectional, "
                 "it tril()s that (t_q, t_k) slice, start-aligned: with t_q < t_k the "
                 "t_k - t_q - 1 most recent past keys of each query lose their bias (ours "
                 "when t_q = t_k); "
                 "the log kernel for kerple_p = 1 (its initialization; kerple_p is "
                 "learned, and a checkpoint with kerple_p != 1 is not a kernel here), "
                 "r1 = kerple_b (initialized to the ALiBi slopes), r2 = "
                 "kerple_a (ones; a constant 0 before NVIDIA-NeMo PR #6666, so every bias was "
                 "0): to_canonical(param) reshapes (1, h, 1, 1) to (h,).",
        "verified_by": "worked example (tests/test_peers_biases.py) transcribing NeMo's "
                       "forward; nemo_toolkit is not installed",
        "convert": per_head_vector,
    },
    {
        "name": "nemo-sandwich",
        "implementation": "NeMo SandwichRelativePositionEmbedding",
        "scheme": "sandwich",
        "params": {"start": 1},
        "notes": "frequencies 10000^(-2c / hidden_size) for c = 1 .. hidden_size / 2 "
                 "(start = 1, d_bar = hidden_size, the per-head width); minus hidden_size / 2, "
                 "over 8 (h + 1) / H; abs(i - j) end-aligned, and the same start-aligned tril as "
                 "nemo-kerple when not bidirectional.",
        "verified_by": "worked example (tests/test_peers_biases.py) transcribing NeMo's "
                       "forward",
    },
    {
        "name": "attention-gym-sandwich",
        "implementation": "attn_gym.mods.generate_sandwich_bias(H, max_seq_len, d_bar=128)",
        "scheme": "sandwich",
        "params": {"start": 0, "d_bar": 128},
        "notes": "frequencies c = 0 .. d_bar / 2 - 1; no - d_bar / 2 (a constant of each "
                 "head, which softmax ignores); indices q_idx - kv_idx without an offset "
                 "(start-aligned; the cosine is even).",
        "verified_by": "peer test (tests/test_peers_biases.py) against attn-gym",
    },
    {
        "name": "torchscale-xpos",
        "implementation": "torchscale.component.xpos_relative_position.XPOS(head_dim, "
                          "scale_base=512)",
        "scheme": "xpos",
        "params": {"layout": "interleaved", "center": "middle_up"},
        "notes": "interleaved pairs (rotate_every_two), zeta over the head width; scales "
                 "centred at ceil(L / 2) of L = length + offset (min_pos = -(length + offset) "
                 "// 2), angles at the positions themselves; MultiheadAttention scales the keys "
                 "down at offset 0 and, when decoding, the query up at offset src_len - 1, so "
                 "both share the centre. Its angles and scales are float32.",
        "verified_by": "peer test (tests/test_peers_xpos.py) against torchscale's XPOS",
    },
    {
        "name": "x-transformers-xpos",
        "implementation": "x_transformers RotaryEmbedding(dim, use_xpos=True, scale_base=512) "
                          "with apply_rotary_pos_emb",
        "scheme": "xpos",
        "params": {"layout": "interleaved", "center": "middle"},
        "notes": "interleaved pairs (its rotate_half stacks (-x2, x1) pairwise), zeta over the "
                 "rotary dim (rotary_dim = dim); scales centred at max_pos // 2 = L // 2 of the "
                 "positions it is given (t - max_pos // 2), keys by scale ** -1; queries take "
                 "the last t_q rows.",
        "verified_by": "peer test (tests/test_peers_xpos.py) against x-transformers",
    },
    {
        "name": "swinv2",
        "implementation": "microsoft/Swin-Transformer models/swin_transformer_v2.py "
                          "WindowAttention",
        "scheme": "swinv2",
        "params": {"mask_penalty": -100.0},
        "notes": _SWINV2_NOTES + "The shifted-window mask is added once: masked pairs get "
                 "-100, not -inf (at tau = log 100 a masked key can still win); a window side of 1 "
                 "divides 0 by 0 (NaN bias) unless pretrained_window_size is given.",
        "verified_by": "peer test (tests/test_peers_swinv2.py) against transformers' "
                       "Swinv2SelfAttention given a -100 mask once (Microsoft's code adds "
                       "its mask once; transformers twice)",
        "convert": negate_first_layer,
    },
    {
        "name": "hf-swinv2",
        "implementation": "transformers Swinv2SelfAttention (modeling_swinv2)",
        "scheme": "swinv2",
        "params": {"mask_penalty": -200.0},
        "notes": _SWINV2_NOTES + "forward adds attention_mask (0 / -100) twice: masked pairs "
                 "get -200. Coordinates are normalized only when window_size[0] > 1: a window "
                 "(Wh > 1, 1) divides 0 by 0 (NaN bias), a window (1, Ww > 1) is unnormalized "
                 "(pass pretrained_window=(2, 2) to reproduce it); transformers builds the "
                 "coordinates in float32.",
        "verified_by": "peer test (tests/test_peers_swinv2.py) against transformers' "
                       "Swinv2SelfAttention: coordinates, table, bias and attention",
        "convert": negate_first_layer,
    },
)
