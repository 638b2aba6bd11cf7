"""The default golden suite's cases: every scheme and its edge cases, once each.

`relpos_ref.golden.default_cases` makes each of them in every float dtype.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["base_cases"]


def base_cases() -> list[tuple[str, str, Mapping[str, Any]]]:
    """(scheme, variant, parameters) of the default suite, one dtype each."""
    return [
        # absolute: a key-position row per key
        ("absolute", "plain", {"b": 2, "h": 3, "t_q": 9, "t_k": 9, "d": 16}),
        ("absolute", "cross-causal", {"h": 2, "t_q": 5, "t_k": 12, "d": 8, "rows": 16,
                                      "causal": True, "q_offset": 7, "per_head": True}),
        # shaw: clipped two-sided tables, keys and values
        ("shaw", "clip", {"b": 2, "h": 4, "t_q": 17, "t_k": 33, "d": 16, "K": 4}),
        ("shaw", "zero", {"b": 2, "h": 4, "t_q": 17, "t_k": 33, "d": 16, "K": 4,
                          "beyond": "zero"}),
        ("shaw", "error-edge", {"h": 2, "t_q": 9, "t_k": 9, "d": 8, "K": 8, "beyond": "error"}),
        ("shaw", "per-head-causal-end", {"h": 3, "t_q": 5, "t_k": 12, "d": 8, "K": 3,
                                         "per_head": True, "causal": True, "q_offset": 7}),
        ("shaw", "masked", {"h": 2, "t_q": 8, "t_k": 8, "d": 8, "K": 2, "masked": True}),
        ("shaw", "length-1", {"t_q": 1, "t_k": 1, "d": 4, "K": 2}),
        ("shaw", "keys-only", {"h": 2, "t_q": 6, "t_k": 6, "d": 8, "K": 2, "values": False}),
        # asymmetric clipping (wav2vec2-BERT's relative_key): rows r = -P .. K
        ("shaw", "asymmetric", {"h": 2, "t_q": 12, "t_k": 12, "d": 8, "K": 2, "P": 5}),
        # bias: learned scalar per distance, added after scaling
        ("bias", "clip", {"h": 3, "t_q": 7, "t_k": 11, "d": 8, "K": 3, "per_head": True}),
        ("bias", "zero-causal", {"h": 3, "t_q": 11, "t_k": 11, "d": 8, "K": 3, "beyond": "zero",
                                 "causal": True, "per_head": True}),
        ("bias", "decode-step", {"h": 2, "t_q": 1, "t_k": 16, "d": 8, "K": 4, "causal": True,
                                 "q_offset": 15, "scale": 1.0}),
        # ... and at the default scale 1/sqrt(d): a kernel that scales its bias fails here
        ("bias", "decode-step-scaled", {"h": 2, "t_q": 1, "t_k": 16, "d": 8, "K": 4,
                                        "causal": True, "q_offset": 15}),
        ("bias", "asymmetric-zero", {"h": 2, "t_q": 7, "t_k": 10, "d": 8, "K": 3, "P": 1,
                                     "beyond": "zero", "per_head": True}),
        # music: one-sided causal table through the skew
        ("music", "skew", {"h": 2, "t_q": 16, "t_k": 16, "d": 8, "M": 16, "values": True}),
        ("music", "clip-end-aligned", {"h": 3, "t_q": 5, "t_k": 20, "d": 8, "M": 8,
                                       "q_offset": 15, "per_head": True}),
        ("music", "zero", {"h": 2, "t_q": 12, "t_k": 12, "d": 8, "M": 6, "beyond": "zero",
                           "masked": True}),
        ("music", "start-aligned", {"t_q": 6, "t_k": 10, "d": 8, "M": 10}),
        # general: any t_q, t_k through stacked diagonals
        ("general", "full", {"h": 2, "t_q": 12, "t_k": 12, "d": 8, "t_max": 12}),
        ("general", "cross-future-to-past", {"h": 3, "t_q": 7, "t_k": 13, "d": 8, "t_max": 13,
                                             "q_offset": 3, "order": "future_to_past",
                                             "per_head": True}),
        ("general", "causal-end", {"h": 2, "t_q": 4, "t_k": 10, "d": 8, "t_max": 10,
                                   "q_offset": 6, "causal": True}),
        # grid2d: row and column tables on a row-major grid
        ("grid2d", "non-square", {"b": 2, "h": 2, "d": 8, "height": 3, "width": 5}),
        ("grid2d", "per-head-masked", {"h": 3, "d": 8, "height": 4, "width": 4,
                                       "per_head": True, "masked": True}),
        ("grid2d", "one-token", {"d": 4, "height": 1, "width": 1}),
        # t5: bucketed scalar bias, unscaled
        ("t5", "bidirectional", {"h": 3, "t_q": 20, "t_k": 40, "d": 8, "buckets": 32,
                                 "max_distance": 16, "per_head": True}),
        ("t5", "causal-decode", {"h": 2, "t_q": 4, "t_k": 64, "d": 8, "buckets": 32,
                                 "max_distance": 32, "bidirectional": False, "causal": True,
                                 "q_offset": 60, "per_head": True}),
        # T5 with a scale (a port that scales q k^T): the bias must stay unscaled
        ("t5", "causal-decode-scaled", {"h": 2, "t_q": 4, "t_k": 64, "d": 8, "buckets": 32,
                                        "max_distance": 32, "bidirectional": False,
                                        "causal": True, "q_offset": 60, "per_head": True,
                                        "scale": 0.5}),
        # alibi: linear biases, slopes for head counts that are not powers of two
        ("alibi", "symmetric", {"h": 6, "t_q": 9, "t_k": 13, "d": 8}),
        ("alibi", "causal-end", {"h": 5, "t_q": 4, "t_k": 12, "d": 8, "causal": True,
                                 "q_offset": 8, "symmetric": False}),
        # the slope rules disagree for every head count that is not a power of two: the
        # paper's (5 and 6 heads above) and attention-gym's 2^(-8 (h + 1) / h)
        *(("alibi", f"paper-h{h}", {"h": h, "t_q": 3, "t_k": 5, "d": 4, "causal": True,
                                     "q_offset": 2})
          for h in (3, 12, 20)),
        *(("alibi", f"power-of-two-h{h}", {"h": h, "t_q": 3, "t_k": 5, "d": 4, "causal": True,
                                            "q_offset": 2, "slope_rule": "power_of_two"})
          for h in (3, 5, 6, 12, 20)),
        # kerple: NeMo's initialization (r1 the ALiBi slopes, r2 = 1), both kernels
        ("kerple", "log-causal-end", {"h": 3, "t_q": 4, "t_k": 9, "d": 8, "causal": True,
                                      "q_offset": 5}),
        ("kerple", "power-masked", {"h": 3, "t_q": 7, "t_k": 7, "d": 8, "kernel": "power",
                                    "masked": True}),
        # sandwich: the paper's 128-wide sinusoids, and NeMo's first frequency
        ("sandwich", "causal-end", {"h": 4, "t_q": 4, "t_k": 9, "d": 8, "causal": True,
                                    "q_offset": 5}),
        ("sandwich", "nemo-d16", {"h": 3, "t_q": 5, "t_k": 7, "d": 8, "d_bar": 16, "start": 1,
                                  "q_offset": 1}),
        # forgetting (FoX): gates per head, queries end-aligned after a cache; shared gates
        ("forgetting", "per-head-end", {"h": 3, "t_q": 4, "t_k": 9, "d": 8, "per_head": True}),
        ("forgetting", "shared-masked", {"h": 2, "t_q": 6, "t_k": 6, "d": 8, "masked": True}),
        # fire: queries end-aligned past the threshold L = 5 (the normaliser is the query's
        # position there), one MLP per head; bidirectional (inputs above 1), masked. Inputs
        # in [0, 1] or so, and 16 hidden units, so that some unit's ReLU turns within the
        # grid (the paper's L = 512 at a few tokens gives inputs below 0.1: b1's gradient
        # is then a sum of rows that cancels, zero but for rounding)
        ("fire", "beyond-l-end", {"h": 3, "t_q": 3, "t_k": 9, "d": 8, "hidden": 16,
                                  "c": 0.5, "L": 5.0, "per_head": True}),
        ("fire", "bidirectional-masked", {"h": 2, "t_q": 6, "t_k": 6, "d": 8, "hidden": 16,
                                          "c": 2.0, "L": 2.0, "causal": False,
                                          "masked": True}),
        # cope: contextual positions, the clamp at max_pos - 1 reached (3 rows), per head;
        # a shared table, not causal, with a mask (its keys' gates are 0)
        ("cope", "clamped-per-head", {"h": 3, "t_q": 6, "t_k": 6, "d": 8, "npos": 3,
                                      "per_head": True}),
        ("cope", "masked-bidirectional", {"h": 2, "t_q": 5, "t_k": 7, "d": 8, "npos": 8,
                                          "causal": False, "masked": True}),
        # swin: 2D bias table of a window, non-square
        ("swin", "non-square", {"b": 2, "h": 3, "d": 8, "height": 2, "width": 3,
                                "per_head": True}),
        ("swin", "masked", {"h": 2, "d": 8, "height": 3, "width": 3, "per_head": True,
                            "masked": True}),
        # swinv2: the MLP's table (hidden width 4), per head, masked
        ("swinv2", "masked", {"h": 2, "d": 8, "height": 2, "width": 3, "hidden": 4,
                              "per_head": True, "masked": True}),
        # swinv2 as its models run: cosine attention, tau = 10 (logit_scale's initial log 10)
        # for every head, masked (the -100 penalty's fully masked rows are no Swin v2 window's)
        ("swinv2", "cosine-masked", {"h": 2, "d": 8, "height": 3, "width": 2, "hidden": 4,
                                     "masked": True, "logit_scale": 2.302585092994046,
                                     "scale": 1.0}),
        # rope: both pairings, partial rotation, an offset
        ("rope", "half-partial-end", {"h": 2, "t_q": 5, "t_k": 11, "d": 16, "rotary_dim": 8,
                                      "q_offset": 6, "causal": True}),
        ("rope", "interleaved", {"h": 2, "t_q": 9, "t_k": 9, "d": 8, "layout": "interleaved",
                                 "base": 100.0}),
        # rope frequency scaling, one case per rope_type (transformers 5's names and fields)
        ("rope", "linear", {"h": 2, "t_q": 6, "t_k": 10, "d": 8, "q_offset": 4, "causal": True,
                            "scaling": {"rope_type": "linear", "factor": 4.0}}),
        # dynamic NTK past its trained length 16: per call (transformers), a decode step of
        # 24 keys, and fixed for the deployment (vLLM: the length factor * 16)
        ("rope", "dynamic-decode", {"h": 2, "t_q": 1, "t_k": 24, "d": 8, "q_offset": 23,
                                    "causal": True, "base": 1000.0,
                                    "scaling": {"rope_type": "dynamic", "factor": 2.0,
                                                "original_max_position_embeddings": 16}}),
        ("rope", "dynamic-fixed", {"h": 2, "t_q": 8, "t_k": 8, "d": 8, "base": 1000.0,
                                   "scaling": {"rope_type": "dynamic", "factor": 2.0,
                                               "original_max_position_embeddings": 16,
                                               "policy": "fixed"}}),
        ("rope", "yarn", {"h": 2, "t_q": 5, "t_k": 12, "d": 16, "q_offset": 7, "causal": True,
                          "base": 100.0,
                          "scaling": {"rope_type": "yarn", "factor": 8.0,
                                      "original_max_position_embeddings": 64}}),
        # DeepSeek-V3: the mscale ratio on cos/sin, mscale**2 on the softmax scale, the
        # interleaved pairs, a rotated part narrower than the head
        ("rope", "yarn-deepseek", {"h": 2, "t_q": 6, "t_k": 6, "d": 16, "rotary_dim": 8,
                                   "layout": "interleaved", "base": 100.0, "causal": True,
                                   "scaling": {"rope_type": "yarn", "factor": 40.0,
                                               "original_max_position_embeddings": 64,
                                               "mscale": 0.707, "mscale_all_dim": 1.0,
                                               "softmax_mscale": True}}),
        # LongRoPE: a call of 12 positions reads the long factors (trained 8), one of 8 the
        # short ones; fixed for a deployment of 32 positions: the long ones at any length
        ("rope", "longrope-long", {"h": 2, "t_q": 4, "t_k": 12, "d": 8, "q_offset": 8,
                                   "causal": True, "base": 100.0,
                                   "scaling": {"rope_type": "longrope",
                                               "short_factor": [1.0, 1.2, 1.5, 2.0],
                                               "long_factor": [1.0, 3.0, 8.0, 16.0],
                                               "original_max_position_embeddings": 8,
                                               "max_position_embeddings": 32}}),
        ("rope", "longrope-short", {"h": 2, "t_q": 8, "t_k": 8, "d": 8, "base": 100.0,
                                    "scaling": {"rope_type": "longrope",
                                                "short_factor": [1.0, 1.2, 1.5, 2.0],
                                                "long_factor": [1.0, 3.0, 8.0, 16.0],
                                                "original_max_position_embeddings": 8,
                                                "max_position_embeddings": 32}}),
        ("rope", "longrope-fixed", {"h": 2, "t_q": 8, "t_k": 8, "d": 8, "base": 100.0,
                                    "scaling": {"rope_type": "longrope",
                                                "short_factor": [1.0, 1.2, 1.5, 2.0],
                                                "long_factor": [1.0, 3.0, 8.0, 16.0],
                                                "original_max_position_embeddings": 8,
                                                "max_position_embeddings": 32,
                                                "policy": "fixed"}}),
        ("rope", "llama3", {"h": 2, "t_q": 5, "t_k": 12, "d": 16, "q_offset": 7,
                            "causal": True, "base": 100.0,
                            "scaling": {"rope_type": "llama3", "factor": 8.0,
                                        "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                        "original_max_position_embeddings": 64}}),
        # Gemma 4: the full head's exponent, a quarter of the pairs turning
        ("rope", "proportional", {"h": 2, "t_q": 6, "t_k": 6, "d": 16, "causal": True,
                                  "scaling": {"rope_type": "proportional",
                                              "partial_rotary_factor": 0.25}}),
        # exact angles against float32 ones: past 65536 and near 2**20, each in both modes
        *(("rope", variant, {"h": 2, "t_q": 4, "t_k": 8, "d": 16, "q_offset": offset,
                             "angles": angles})
          for variant, offset in (("past-65536", 131068), ("near-1m", 2**20 - 4))
          for angles in ("float64", "float32")),
        # multi-axis positions: M-RoPE's contiguous (Qwen2-VL) and interleaved (Qwen3-VL)
        # sections over 2 text tokens, a 2 x 2 image at time 2 and 2 more text tokens (the
        # interleaved one a decode step); axial RoPE of a 3 x 3 grid (Qwen2-VL's vision
        # tower), of EVA-02's interpolated grid and of FLUX's three axes; RoPE-Mixed's
        # learned per-head frequencies; 1-D positions of two packed sequences
        ("rope", "mrope", {"h": 2, "t_q": 8, "t_k": 8, "d": 8, "causal": True, "base": 100.0,
                           "axes": {"axes_type": "mrope", "mrope_section": [2, 1, 1]},
                           "positions": _MROPE_POSITIONS}),
        ("rope", "mrope-interleaved-decode", {
            "h": 2, "t_q": 1, "t_k": 8, "d": 8, "q_offset": 7, "causal": True, "base": 100.0,
            "axes": {"axes_type": "mrope", "mrope_section": [2, 1, 1],
                     "mrope_interleaved": True},
            "positions": _MROPE_POSITIONS}),
        ("rope", "axial-2d", {"h": 2, "t_q": 9, "t_k": 9, "d": 16, "base": 100.0,
                              "axes": {"axes_type": "axial", "axes_dims": [8, 8]},
                              "positions": _GRID_3X3}),
        ("rope", "axial-eva", {"h": 2, "t_q": 9, "t_k": 9, "d": 8, "layout": "interleaved",
                               "axes": {"axes_type": "axial", "axes_dims": [4, 4],
                                        "position_scale": 0.75},
                               "positions": _GRID_3X3}),
        ("rope", "axial-3d", {"h": 2, "t_q": 6, "t_k": 6, "d": 16, "layout": "interleaved",
                              "axes": {"axes_type": "axial", "axes_dims": [4, 6, 6]},
                              "positions": [[0, 0, 0, 1, 1, 1], [0, 0, 1, 0, 0, 1],
                                            [0, 1, 0, 0, 1, 0]]}),
        ("rope", "mixed", {"h": 2, "t_q": 9, "t_k": 9, "d": 8, "layout": "interleaved",
                           "axes": {"axes_type": "mixed", "frequencies": [
                               [[1.0, 0.0], [0.0, 1.0], [0.1, 0.05], [-0.05, 0.1]],
                               [[0.6, 0.8], [-0.8, 0.6], [0.02, -0.1], [0.1, 0.02]]]},
                           "positions": _GRID_3X3}),
        ("rope", "positions-1d-packed", {"h": 2, "t_q": 7, "t_k": 7, "d": 8, "causal": True,
                                         "base": 100.0,
                                         "positions": [[0, 1, 2, 0, 1, 2, 3]]}),
        # DeepSeek MLA: the rotated part at the tail of the head, interleaved pairs
        ("rope", "tail", {"h": 2, "t_q": 5, "t_k": 8, "d": 16, "rotary_dim": 8,
                          "rotary_at": "tail", "layout": "interleaved", "q_offset": 3,
                          "causal": True, "base": 100.0}),
        # xpos: torchscale's centre ceil(L / 2) with an offset and a causal mask; the half
        # pairing, a partial rotation and a mask about x-transformers' L // 2; a short scale
        # base, so that the decay is far from 1 within the call
        ("xpos", "torchscale-causal-end", {"h": 2, "t_q": 5, "t_k": 11, "d": 8, "q_offset": 6,
                                           "causal": True, "scale_base": 16.0,
                                           "center": "middle_up"}),
        ("xpos", "half-partial-masked", {"h": 2, "t_q": 7, "t_k": 7, "d": 16, "rotary_dim": 8,
                                         "layout": "half", "scale_base": 8.0, "masked": True}),
        # transformer_xl: a memory before the segment, causal, through rel_shift
        ("transformer_xl", "memory", {"h": 2, "t_q": 6, "t_k": 16, "d": 8, "q_offset": 10,
                                      "per_head": True}),
        ("transformer_xl", "clamped", {"h": 3, "t_q": 8, "t_k": 12, "d": 8, "q_offset": 4,
                                       "clamp_len": 3, "masked": True}),
        ("transformer_xl", "bidirectional", {"h": 2, "t_q": 5, "t_k": 9, "d": 8, "q_offset": 4,
                                             "causal": False, "d_model": 6, "biases": False}),
        # deberta: c2p and p2c, log buckets, t_q != t_k
        ("deberta", "log-buckets", {"h": 2, "t_q": 24, "t_k": 24, "d": 8, "span": 8,
                                    "max_position": 16, "per_head": True}),
        ("deberta", "cross-offset", {"h": 3, "t_q": 5, "t_k": 11, "d": 8, "span": 4,
                                     "q_offset": 3, "masked": True}),
        ("deberta", "c2p-only", {"h": 2, "t_q": 7, "t_k": 7, "d": 8, "span": 3, "p2c": False,
                                 "causal": True}),
    ]


#: Qwen2-VL-like positions (time, height, width) of 8 tokens: text, a 2 x 2 image, text.
_MROPE_POSITIONS = [[0, 1, 2, 2, 2, 2, 4, 5], [0, 1, 2, 2, 3, 3, 4, 5], [0, 1, 2, 3, 2, 3, 4, 5]]
#: (row, column) of a 3 x 3 grid of patches, row-major.
_GRID_3X3 = [[0, 0, 0, 1, 1, 1, 2, 2, 2], [0, 1, 2, 0, 1, 2, 0, 1, 2]]
