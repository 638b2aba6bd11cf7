"""The schemes: one module each, every one built on the same conventions.

This package is the specification: array-API code only, no library-specific
branch. Each scheme module reads top to bottom as the math (its docstring),
the index and term functions (``<scheme>_index``, ``<scheme>_logits`` or
``_bias``, ``<scheme>_values``), the validation of a call (``<scheme>_call``,
which the kernels share), ``<scheme>_attention`` and its backward pass,
``<scheme>_attention_vjp`` (built from `relpos_ref.gradients`); ``DEFAULTS`` records what
``None`` means for ``scale``, ``causal`` and ``q_offset``. Schemes with a
memory-efficient algorithm take ``method="efficient"`` (default) or
``method="definition"`` (the gather definition).

The functions here are the specification itself; ``relpos_ref.<name>`` is the
same function behind the dispatcher of `relpos_ref.kernels`.
"""

from __future__ import annotations

from .absolute import absolute_attention, absolute_attention_vjp, absolute_index, absolute_logits
from .alibi import alibi_attention, alibi_attention_vjp, alibi_bias, alibi_slopes
from .bias import bias_attention, bias_attention_vjp, bias_logits
from .cope import cope_attention, cope_attention_vjp, cope_gates, cope_positions, cope_term
from .deberta import (
    deberta_attention,
    deberta_attention_vjp,
    deberta_bucket,
    deberta_bucket_boundaries,
    deberta_index,
    deberta_logits,
    deberta_rows,
)
from .fire import (
    fire_attention,
    fire_attention_vjp,
    fire_bias,
    fire_inputs,
)
from .forgetting import (
    forgetting_attention,
    forgetting_attention_vjp,
    forgetting_bias,
    forgetting_cumsum,
    log_sigmoid,
)
from .general import (
    general_attention,
    general_attention_vjp,
    general_index,
    general_logits,
    general_window,
)
from .grid2d import grid2d_attention, grid2d_attention_vjp, grid2d_index, grid2d_logits
from .kerple import kerple_attention, kerple_attention_vjp, kerple_bias, kerple_kernel
from .music import music_attention, music_attention_vjp, music_index, music_logits, music_values
from .rope import (
    rope_attention,
    rope_attention_vjp,
    rope_cos_sin,
    rope_frequencies,
    rope_rotate,
)
from .rope_axes import rope_axes_frequencies
from .rope_layouts import convert_rope_weights, rope_permutation
from .sandwich import (
    sandwich_attention,
    sandwich_attention_vjp,
    sandwich_bias,
    sandwich_kernel,
    sandwich_ratios,
)
from .shaw import shaw_attention, shaw_attention_vjp, shaw_index, shaw_logits, shaw_values
from .swin import swin_attention, swin_attention_vjp, swin_bias, swin_index
from .swinv2 import (
    swinv2_attention,
    swinv2_attention_vjp,
    swinv2_bias,
    swinv2_coordinates,
    swinv2_table,
)
from .t5 import t5_attention, t5_attention_vjp, t5_bias, t5_bucket, t5_bucket_boundaries
from .transformer_xl import (
    transformer_xl_attention,
    transformer_xl_attention_vjp,
    transformer_xl_distance,
    transformer_xl_embedding,
    transformer_xl_logits,
    transformer_xl_rows,
)
from .xpos import xpos_attention, xpos_attention_vjp, xpos_rotate, xpos_zeta

__all__ = [
    "absolute_attention",
    "absolute_attention_vjp",
    "absolute_index",
    "absolute_logits",
    "alibi_attention",
    "alibi_attention_vjp",
    "alibi_bias",
    "alibi_slopes",
    "bias_attention",
    "bias_attention_vjp",
    "bias_logits",
    "convert_rope_weights",
    "cope_attention",
    "cope_attention_vjp",
    "cope_gates",
    "cope_positions",
    "cope_term",
    "deberta_attention",
    "deberta_attention_vjp",
    "deberta_bucket",
    "deberta_bucket_boundaries",
    "deberta_index",
    "deberta_logits",
    "deberta_rows",
    "fire_attention",
    "fire_attention_vjp",
    "fire_bias",
    "fire_inputs",
    "forgetting_attention",
    "forgetting_attention_vjp",
    "forgetting_bias",
    "forgetting_cumsum",
    "general_attention",
    "general_attention_vjp",
    "general_index",
    "general_logits",
    "general_window",
    "grid2d_attention",
    "grid2d_attention_vjp",
    "grid2d_index",
    "grid2d_logits",
    "kerple_attention",
    "kerple_attention_vjp",
    "kerple_bias",
    "kerple_kernel",
    "log_sigmoid",
    "music_attention",
    "music_attention_vjp",
    "music_index",
    "music_logits",
    "music_values",
    "rope_attention",
    "rope_attention_vjp",
    "rope_axes_frequencies",
    "rope_cos_sin",
    "rope_frequencies",
    "rope_permutation",
    "rope_rotate",
    "sandwich_attention",
    "sandwich_attention_vjp",
    "sandwich_bias",
    "sandwich_kernel",
    "sandwich_ratios",
    "shaw_attention",
    "shaw_attention_vjp",
    "shaw_index",
    "shaw_logits",
    "shaw_values",
    "swin_attention",
    "swin_attention_vjp",
    "swin_bias",
    "swin_index",
    "swinv2_attention",
    "swinv2_attention_vjp",
    "swinv2_bias",
    "swinv2_coordinates",
    "swinv2_table",
    "t5_attention",
    "t5_attention_vjp",
    "t5_bias",
    "t5_bucket",
    "t5_bucket_boundaries",
    "transformer_xl_attention",
    "transformer_xl_attention_vjp",
    "transformer_xl_distance",
    "transformer_xl_embedding",
    "transformer_xl_logits",
    "transformer_xl_rows",
    "xpos_attention",
    "xpos_attention_vjp",
    "xpos_rotate",
    "xpos_zeta",
]
