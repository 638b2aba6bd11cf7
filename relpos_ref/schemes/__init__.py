"""The schemes: one module each, every one built on the same conventions.

Each scheme has ``<scheme>_logits`` (the positional term, before it is
combined with the content term) and ``<scheme>_attention``; schemes with a
memory-efficient algorithm take ``method="efficient"`` (default) or
``method="definition"`` (the gather definition).
"""

from __future__ import annotations

from .absolute import absolute_attention, absolute_index, absolute_logits
from .alibi import alibi_attention, alibi_bias, alibi_slopes
from .bias import bias_attention, bias_logits
from .deberta import (
    deberta_attention,
    deberta_bucket,
    deberta_bucket_boundaries,
    deberta_index,
    deberta_logits,
)
from .general import general_attention, general_index, general_logits
from .grid2d import grid2d_attention, grid2d_index, grid2d_logits
from .music import music_attention, music_index, music_logits, music_values
from .rope import rope_attention, rope_frequencies, rope_rotate
from .shaw import shaw_attention, shaw_index, shaw_logits, shaw_values
from .swin import swin_attention, swin_bias, swin_index
from .t5 import t5_attention, t5_bias, t5_bucket, t5_bucket_boundaries
from .transformer_xl import (
    transformer_xl_attention,
    transformer_xl_distance,
    transformer_xl_embedding,
    transformer_xl_logits,
)

__all__ = [
    "absolute_attention",
    "absolute_index",
    "absolute_logits",
    "alibi_attention",
    "alibi_bias",
    "alibi_slopes",
    "bias_attention",
    "bias_logits",
    "deberta_attention",
    "deberta_bucket",
    "deberta_bucket_boundaries",
    "deberta_index",
    "deberta_logits",
    "general_attention",
    "general_index",
    "general_logits",
    "grid2d_attention",
    "grid2d_index",
    "grid2d_logits",
    "music_attention",
    "music_index",
    "music_logits",
    "music_values",
    "rope_attention",
    "rope_frequencies",
    "rope_rotate",
    "shaw_attention",
    "shaw_index",
    "shaw_logits",
    "shaw_values",
    "swin_attention",
    "swin_bias",
    "swin_index",
    "t5_attention",
    "t5_bias",
    "t5_bucket",
    "t5_bucket_boundaries",
    "transformer_xl_attention",
    "transformer_xl_distance",
    "transformer_xl_embedding",
    "transformer_xl_logits",
]
