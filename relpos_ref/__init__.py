"""relpos_ref: the reference implementation of relative positional attention.

Small pure functions over the Python array API, so the same code runs on
NumPy, CuPy, torch, JAX and array-api-strict. The conventions are stated once,
in :mod:`relpos_ref.positions`: the distance is key minus query,
``r = j - (i + q_offset)``.

`attention` and every ``<scheme>_attention`` here, the backward passes
``attention_vjp`` and ``<scheme>_attention_vjp``, and `blocked_attention`
are the specification's functions (`relpos_ref.schemes`,
`relpos_ref.gradients`, `relpos_ref.blocked`) behind the dispatcher of
`relpos_ref.kernels`, which runs a faster kernel where the arrays' library
has one; everything else is the specification itself.
"""

from __future__ import annotations

import importlib
from typing import Any

from . import attention as _attention_module
from . import gradients as _gradients
from . import schemes as _schemes
from .attention import (
    allowed_keys,
    compose_logits,
    default_scale,
    masked_softmax,
)
from .kernels import dispatched as _dispatched
from .layouts import (
    gather,
    pad_flatten_reshape,
    rel_shift,
    skew,
    stacked_diagonals,
    take_per_row,
    to_relative,
)
from .positions import (
    TableIndex,
    causal_table_index,
    check_distances_in_table,
    distance_range,
    grid_positions,
    relative_positions,
    table_index,
)
from .schemes import (
    absolute_index,
    absolute_logits,
    alibi_bias,
    alibi_slopes,
    bias_logits,
    convert_rope_weights,
    cope_gates,
    cope_positions,
    cope_term,
    deberta_bucket,
    deberta_bucket_boundaries,
    deberta_index,
    deberta_logits,
    deberta_rows,
    fire_bias,
    fire_inputs,
    forgetting_bias,
    forgetting_cumsum,
    general_index,
    general_logits,
    general_window,
    grid2d_index,
    grid2d_logits,
    kerple_bias,
    kerple_kernel,
    log_sigmoid,
    music_index,
    music_logits,
    music_values,
    rope_axes_frequencies,
    rope_cos_sin,
    rope_frequencies,
    rope_permutation,
    rope_rotate,
    sandwich_bias,
    sandwich_kernel,
    sandwich_ratios,
    shaw_index,
    shaw_logits,
    shaw_values,
    swin_bias,
    swin_index,
    swinv2_bias,
    swinv2_coordinates,
    swinv2_table,
    t5_bias,
    t5_bucket,
    t5_bucket_boundaries,
    transformer_xl_distance,
    transformer_xl_embedding,
    transformer_xl_logits,
    transformer_xl_rows,
    xpos_rotate,
    xpos_zeta,
)

__version__ = "0.1.0"

attention = _dispatched("plain", _attention_module.attention)
absolute_attention = _dispatched("absolute", _schemes.absolute_attention)
alibi_attention = _dispatched("alibi", _schemes.alibi_attention)
bias_attention = _dispatched("bias", _schemes.bias_attention)
cope_attention = _dispatched("cope", _schemes.cope_attention)
deberta_attention = _dispatched("deberta", _schemes.deberta_attention)
fire_attention = _dispatched("fire", _schemes.fire_attention)
forgetting_attention = _dispatched("forgetting", _schemes.forgetting_attention)
general_attention = _dispatched("general", _schemes.general_attention)
grid2d_attention = _dispatched("grid2d", _schemes.grid2d_attention)
kerple_attention = _dispatched("kerple", _schemes.kerple_attention)
music_attention = _dispatched("music", _schemes.music_attention)
rope_attention = _dispatched("rope", _schemes.rope_attention)
sandwich_attention = _dispatched("sandwich", _schemes.sandwich_attention)
shaw_attention = _dispatched("shaw", _schemes.shaw_attention)
swin_attention = _dispatched("swin", _schemes.swin_attention)
swinv2_attention = _dispatched("swinv2", _schemes.swinv2_attention)
t5_attention = _dispatched("t5", _schemes.t5_attention)
transformer_xl_attention = _dispatched("transformer_xl", _schemes.transformer_xl_attention)
xpos_attention = _dispatched("xpos", _schemes.xpos_attention)

attention_vjp = _dispatched("plain", _gradients.attention_vjp, vjp=True)
absolute_attention_vjp = _dispatched("absolute", _schemes.absolute_attention_vjp, vjp=True)
alibi_attention_vjp = _dispatched("alibi", _schemes.alibi_attention_vjp, vjp=True)
bias_attention_vjp = _dispatched("bias", _schemes.bias_attention_vjp, vjp=True)
cope_attention_vjp = _dispatched("cope", _schemes.cope_attention_vjp, vjp=True)
deberta_attention_vjp = _dispatched("deberta", _schemes.deberta_attention_vjp, vjp=True)
fire_attention_vjp = _dispatched("fire", _schemes.fire_attention_vjp, vjp=True)
forgetting_attention_vjp = _dispatched("forgetting", _schemes.forgetting_attention_vjp,
                                       vjp=True)
general_attention_vjp = _dispatched("general", _schemes.general_attention_vjp, vjp=True)
grid2d_attention_vjp = _dispatched("grid2d", _schemes.grid2d_attention_vjp, vjp=True)
kerple_attention_vjp = _dispatched("kerple", _schemes.kerple_attention_vjp, vjp=True)
music_attention_vjp = _dispatched("music", _schemes.music_attention_vjp, vjp=True)
rope_attention_vjp = _dispatched("rope", _schemes.rope_attention_vjp, vjp=True)
sandwich_attention_vjp = _dispatched("sandwich", _schemes.sandwich_attention_vjp, vjp=True)
shaw_attention_vjp = _dispatched("shaw", _schemes.shaw_attention_vjp, vjp=True)
swin_attention_vjp = _dispatched("swin", _schemes.swin_attention_vjp, vjp=True)
swinv2_attention_vjp = _dispatched("swinv2", _schemes.swinv2_attention_vjp, vjp=True)
t5_attention_vjp = _dispatched("t5", _schemes.t5_attention_vjp, vjp=True)
transformer_xl_attention_vjp = _dispatched(
    "transformer_xl", _schemes.transformer_xl_attention_vjp, vjp=True
)
xpos_attention_vjp = _dispatched("xpos", _schemes.xpos_attention_vjp, vjp=True)

#: Submodules reachable as attributes after ``import relpos_ref``, imported on first use.
_SUBMODULES = (
    "backends", "blocked", "catalog", "flex", "golden", "gradients", "kernels", "lowering",
    "presets", "testing",
)


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    if name == "blocked_attention":  # imported on first use, as the catalog it reads
        from .kernels import dispatched_blocked

        spec = importlib.import_module(f"{__name__}.blocked").blocked_attention
        public = dispatched_blocked(spec)
        globals()[name] = public
        return public
    msg = f"module {__name__!r} has no attribute {name!r}"
    raise AttributeError(msg)


def __dir__() -> list[str]:
    return sorted({*globals(), *_SUBMODULES, "blocked_attention"})

__all__ = [
    "TableIndex",
    "__version__",
    "absolute_attention",
    "absolute_attention_vjp",
    "absolute_index",
    "absolute_logits",
    "alibi_attention",
    "alibi_attention_vjp",
    "alibi_bias",
    "alibi_slopes",
    "allowed_keys",
    "attention",
    "attention_vjp",
    "bias_attention",
    "bias_attention_vjp",
    "bias_logits",
    "blocked_attention",
    "causal_table_index",
    "check_distances_in_table",
    "compose_logits",
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
    "default_scale",
    "distance_range",
    "fire_attention",
    "fire_attention_vjp",
    "fire_bias",
    "fire_inputs",
    "forgetting_attention",
    "forgetting_attention_vjp",
    "forgetting_bias",
    "forgetting_cumsum",
    "gather",
    "general_attention",
    "general_attention_vjp",
    "general_index",
    "general_logits",
    "general_window",
    "grid2d_attention",
    "grid2d_attention_vjp",
    "grid2d_index",
    "grid2d_logits",
    "grid_positions",
    "kerple_attention",
    "kerple_attention_vjp",
    "kerple_bias",
    "kerple_kernel",
    "log_sigmoid",
    "masked_softmax",
    "music_attention",
    "music_attention_vjp",
    "music_index",
    "music_logits",
    "music_values",
    "pad_flatten_reshape",
    "rel_shift",
    "relative_positions",
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
    "skew",
    "stacked_diagonals",
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
    "table_index",
    "take_per_row",
    "to_relative",
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
