"""relpos_ref: the reference implementation of relative positional attention.

Small pure functions over the Python array API, so the same code runs on
NumPy, CuPy, torch, JAX and array-api-strict. The conventions are stated once,
in :mod:`relpos_ref.positions`: the distance is key minus query,
``r = j - (i + q_offset)``.
"""

from __future__ import annotations

from .attention import (
    allowed_keys,
    attention,
    compose_logits,
    default_scale,
    masked_softmax,
)
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
    absolute_attention,
    absolute_index,
    absolute_logits,
    bias_attention,
    bias_logits,
    general_attention,
    general_index,
    general_logits,
    grid2d_attention,
    grid2d_index,
    grid2d_logits,
    music_attention,
    music_index,
    music_logits,
    music_values,
    shaw_attention,
    shaw_index,
    shaw_logits,
    shaw_values,
)

__version__ = "0.1.0"

__all__ = [
    "TableIndex",
    "__version__",
    "absolute_attention",
    "absolute_index",
    "absolute_logits",
    "allowed_keys",
    "attention",
    "bias_attention",
    "bias_logits",
    "causal_table_index",
    "check_distances_in_table",
    "compose_logits",
    "default_scale",
    "distance_range",
    "gather",
    "general_attention",
    "general_index",
    "general_logits",
    "grid2d_attention",
    "grid2d_index",
    "grid2d_logits",
    "grid_positions",
    "masked_softmax",
    "music_attention",
    "music_index",
    "music_logits",
    "music_values",
    "pad_flatten_reshape",
    "rel_shift",
    "relative_positions",
    "shaw_attention",
    "shaw_index",
    "shaw_logits",
    "shaw_values",
    "skew",
    "stacked_diagonals",
    "table_index",
    "take_per_row",
    "to_relative",
]
