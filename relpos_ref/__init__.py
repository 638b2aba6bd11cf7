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
from .layouts import gather, pad_flatten_reshape, rel_shift, skew, stacked_diagonals
from .positions import (
    TableIndex,
    causal_table_index,
    check_distances_in_table,
    distance_range,
    grid_positions,
    relative_positions,
    table_index,
)

__version__ = "0.1.0"

__all__ = [
    "TableIndex",
    "__version__",
    "allowed_keys",
    "attention",
    "causal_table_index",
    "check_distances_in_table",
    "compose_logits",
    "default_scale",
    "distance_range",
    "gather",
    "grid_positions",
    "masked_softmax",
    "pad_flatten_reshape",
    "rel_shift",
    "relative_positions",
    "skew",
    "stacked_diagonals",
    "table_index",
]
