"""How popular implementations map onto relpos_ref's one set of conventions.

Each `Preset` names an implementation, the scheme and parameters that
reproduce it, and `Preset.to_canonical`, which converts that implementation's
learned table into our canonical layout (sign flips, row order, per-head
axis, scaling). Conversions are plain array API operations, so they take
NumPy, torch, JAX or CuPy tables.

=============================  ========  ==========================================================
preset                         scheme    what differs from the canonical layout
=============================  ========  ==========================================================
tensor2tensor-v1               shaw      nothing: rows ``clip(j - i, -K, K) + K``, clipped
tensor2tensor-v2               music     the policy only: distances past the table are 0
hf-bert-relative-key           general   query minus key: row ``i - j + P - 1``, future to past
hf-bert-relative-key-query     general   relative_key plus a key-side term (`bert_key_query`)
hf-wav2vec2-bert-relative-key  shaw      asymmetric clipping: ``max_past`` = left max; keys only
hf-conformer-relative          txl       sin and cos interleaved: reorder ``linear_pos``
hf-t5                          t5        table ``(num_buckets, h)``: transpose; never scaled
x-transformers-t5              t5        table ``(num_buckets, h)`` times the module's ``scale``
x-transformers-alibi           alibi     nothing: ``-m |j - i|``, end-aligned queries
bottleneck-transformer         grid2d    nothing: ``rel_height``, ``rel_width`` key minus query
swin                           swin      query minus key, ``(n, h)``: transpose, reverse rows
diagonal-future-to-past        general   rows future to past: reverse them (or pass ``order``)
transformer-xl                 txl       ``r_net`` ``(h d, d_model)``: split heads, transpose
xlnet                          txl       ``r`` ``(d_model, h, d)``: heads first; ``bi``: not causal
hf-deberta-v2                  deberta   rows ``i - j + S``: reverse; ``(2S, h d)``: split heads
hf-rope                        rope      no table: `rope_from_config` reads ``rope_parameters``
flash-attn-alibi               alibi     end-aligned ``-m |r|``; causal: ``m j`` (a row constant)
hf-bloom-alibi                 alibi     key-only ``m j``: the causal form plus a row constant
hf-mpt-alibi                   alibi     key-only ``m (j - L + 1)``; its slopes are the paper's
attention-gym-alibi            alibi     ``(kv - q) 2^(-8(h+1)/H)``: causal form, power-of-two rule
nemo-kerple                    kerple    ``-b log(1 + a |r|^p)``, p = 1; ``(1, h, 1, 1)``: reshape
nemo-sandwich                  sandwich  first frequency c = 1 (``start=1``), d_bar = head width
attention-gym-sandwich         sandwich  no ``- d_bar/2`` (a head constant); start-aligned indices
torchscale-xpos                xpos      interleaved; scales about ``ceil(L/2)`` (``middle_up``)
x-transformers-xpos            xpos      interleaved; scales about ``L // 2`` (``middle``)
swinv2                         swinv2    query-minus-key coordinates: negate ``W_1``; mask -100
hf-swinv2                      swinv2    as swinv2, its mask added twice: -200
=============================  ========  ==========================================================

(``txl`` is ``transformer_xl``.)

Examples
--------
>>> import numpy as np
>>> from relpos_ref.presets import PRESETS
>>> weight = np.arange(6.0).reshape(3, 2)  # an HF T5 embedding: 3 buckets, 2 heads
>>> PRESETS["hf-t5"].to_canonical(weight)
array([[0., 2., 4.],
       [1., 3., 5.]])
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from . import _xp
from ._bias_presets import BIAS_PRESETS
from ._rope_presets import rope_from_config

__all__ = ["PRESETS", "Preset", "bert_key_query", "rope_from_config"]


def _identity(table: Any, **_: Any) -> Any:
    return table


def _check_layout(table: Any, ndim: int, layout: str) -> None:
    # the stored layout a converter reads: `ndim` axes, named in the message
    if not hasattr(table, "shape") or table.ndim != ndim:
        msg = f"`table` must be stored as {layout}, got shape {tuple(getattr(table, 'shape', ()))}"
        raise ValueError(msg)


def _whole(heads: Any) -> int | None:
    # `heads` as an int (NumPy's integers too), or None for anything else (a bool, a float)
    if isinstance(heads, bool) or not isinstance(heads, numbers.Integral):
        return None
    return int(heads)


def _check_heads(table: Any, heads: Any, layout: str, *, axis: int = 0,
                 what: str = "rows") -> int:
    n = _whole(heads)
    if n is None or n < 1 or table.shape[axis] % n:
        msg = (f"`heads` must be a whole number >= 1 that divides the {table.shape[axis]} "
               f"{what} of {layout}, got {heads!r}")
        raise ValueError(msg)
    return n


def _heads_last_to_first(table: Any, *, scale: float = 1.0) -> Any:
    """``(n, h)`` -> ``(h, n)``, times `scale`."""
    _check_layout(table, 2, "(num_buckets, h)")
    xp = _xp.array_namespace(table)
    out = xp.permute_dims(table, (1, 0))
    return out if scale == 1.0 else out * scale


def _reverse_rows(table: Any, **_: Any) -> Any:
    """Reverse the row axis (-2 for vector tables, -1 for scalar ones)."""
    xp = _xp.array_namespace(table)
    return xp.flip(table, axis=-2)


def _linear_heads_first(table: Any, *, heads: int) -> Any:
    """A ``Linear(d_model, h d)`` weight ``(h d, d_model)`` -> ``(h, d_model, d)``."""
    _check_layout(table, 2, "a Linear weight (h d, d_model)")
    heads = _check_heads(table, heads, "a Linear weight (h d, d_model)")
    xp = _xp.array_namespace(table)
    d_model = table.shape[-1]
    split = xp.reshape(table, (heads, table.shape[0] // heads, d_model))
    return xp.permute_dims(split, (0, 2, 1))


def _xlnet(table: Any, **_: Any) -> Any:
    """XLNet's ``r`` ``(d_model, h, d)`` -> ``(h, d_model, d)``."""
    _check_layout(table, 3, "XLNet's r (d_model, h, d)")
    xp = _xp.array_namespace(table)
    return xp.permute_dims(table, (1, 0, 2))


def _conformer(table: Any, *, heads: int) -> Any:
    """A Conformer ``linear_pos`` weight ``(h d, d_model)`` over interleaved sinusoids
    ``[sin w_0, cos w_0, sin w_1, ...]`` -> ``(h, d_model, d)`` over ours, sines first."""
    xp = _xp.array_namespace(table)
    d_model = table.shape[-1]
    sines_first = list(range(0, d_model, 2)) + list(range(1, d_model, 2))
    order = xp.asarray(sines_first, device=_xp.device(table))
    return xp.take(_linear_heads_first(table, heads=heads), order, axis=1)


def _deberta(table: Any, *, heads: int) -> Any:
    """Projected relative embeddings ``(2S, h d)``, rows ``i - j + S`` -> ``(h, 2S, d)``, ours."""
    _check_layout(table, 2, "projected relative embeddings (2S, h d)")
    heads = _check_heads(table, heads, "(2S, h d)", axis=1, what="columns")
    xp = _xp.array_namespace(table)
    rows = table.shape[0]
    split = xp.reshape(table, (rows, heads, table.shape[1] // heads))
    return xp.flip(xp.permute_dims(split, (1, 0, 2)), axis=-2)


def _swin(table: Any, **_: Any) -> Any:
    """Swin's ``(n, h)`` query-minus-key table -> our ``(h, n)`` key-minus-query table."""
    _check_layout(table, 2, "Swin's table (n, h)")
    xp = _xp.array_namespace(table)
    return xp.flip(xp.permute_dims(table, (1, 0)), axis=-1)


@dataclass(frozen=True)
class Preset:
    """One implementation's mapping onto a relpos_ref scheme.

    Attributes
    ----------
    name : str
    implementation : str
        The code it describes (package, module and function or class).
    scheme : str
        The relpos_ref scheme that reproduces it.
    params : mapping
        Keyword arguments of the scheme's functions that reproduce it.
    notes : str
        Each convention that differs, and how it is converted.
    verified_by : str
        The test that proves the mapping: a peer test against the installed
        package, or a worked example transcribed from its code.
    convert : callable
        Their table -> our table; see `to_canonical`.
    """

    name: str
    implementation: str
    scheme: str
    params: Mapping[str, Any]
    notes: str
    verified_by: str
    convert: Callable[..., Any] = field(default=_identity, repr=False)

    def to_canonical(self, table: Any, **options: Any) -> Any:
        """Convert the implementation's learned table into our canonical layout.

        Parameters
        ----------
        table : array
            As the implementation stores it.
        **options
            Preset-specific (``scale`` for x-transformers' T5 bias).

        Returns
        -------
        array
            The table for the scheme's functions.

        Examples
        --------
        >>> import numpy as np
        >>> PRESETS["diagonal-future-to-past"].to_canonical(np.arange(3.0)[:, None]).ravel()
        array([2., 1., 0.])
        """
        try:
            return self.convert(table, **options)
        except ValueError as exc:  # the stored layout the preset reads, named
            raise ValueError(f"preset {self.name!r}: {exc}") from None


def bert_key_query(q: Any, k: Any, table: Any, /) -> Any:
    r"""HF BERT ``relative_key_query`` positional term, in our conventions.

    .. math:: P_{ij} = q_i \cdot E_{i - j + P - 1} + k_j \cdot E_{i - j + P - 1}

    with ``E`` the ``(2P - 1, d)`` ``distance_embedding`` as HF stores it
    (self-attention, ``t_q = t_k``, start-aligned). Pass the result as the
    ``position`` term of `relpos_ref.attention` (it is scaled with ``q . k``).

    Parameters
    ----------
    q, k : floating arrays, shape ``(..., t, d)``
    table : floating array, shape ``(2P - 1, d)``, ``t <= P``

    Returns
    -------
    array, shape ``(..., t, t)``

    Examples
    --------
    >>> import numpy as np
    >>> q = np.ones((2, 1)); k = np.zeros((2, 1))
    >>> E = np.asarray([[1.0], [2.0], [3.0]])  # rows for i - j = -1, 0, 1
    >>> bert_key_query(q, k, E)
    array([[2., 1.],
           [3., 2.]])
    """
    from .schemes import general_logits

    xp = _xp.array_namespace(q, k, table)
    t = q.shape[-2]
    if k.shape[-2] != t:
        msg = f"`q` and `k` must have the same length (self-attention), got {t} and {k.shape[-2]}"
        raise ValueError(msg)
    query_side = general_logits(q, table, t, order="future_to_past")
    # the key-side term is the query-side term with the roles of i and j swapped
    key_side = general_logits(k, table, t, order="past_to_future")
    return query_side + xp.matrix_transpose(key_side)


PRESETS: Mapping[str, Preset] = {
    p.name: p
    for p in (
        Preset(
            "tensor2tensor-v1",
            "tensor2tensor common_attention.dot_product_attention_relative",
            "shaw",
            {"beyond": "clip"},
            "_generate_relative_positions_matrix is j - i clipped to [-K, K], plus K: our "
            "index, with queries end-aligned (q_offset = t_k - t_q); embeddings (2K+1, depth) "
            "shared by heads; q scaled before both terms.",
            "worked example (tests/test_presets.py), tensor2tensor needs TensorFlow 1",
        ),
        Preset(
            "tensor2tensor-v2",
            "tensor2tensor common_attention.dot_product_self_attention_relative_v2 "
            "(Music Transformer)",
            "music",
            {"beyond": "zero"},
            "get_relative_embeddings_left holds rows for r = -(M-1) .. 0 in our order; "
            "longer sequences are padded with zero rows, so distances past the table are 0.",
            "worked example (tests/test_presets.py)",
        ),
        Preset(
            "hf-bert-relative-key",
            "transformers 4.x BertSelfAttention (and RoBERTa, ELECTRA, LayoutLM), "
            "position_embedding_type='relative_key'; removed in transformers 5 "
            "(huggingface/transformers#41170)",
            "general",
            {"order": "future_to_past"},
            "distance = position_ids_l - position_ids_r = i - j (query minus key), row "
            "i - j + P - 1 of distance_embedding (2P - 1, d), P = max_position_embeddings: "
            "our table read future to past; the term is added before dividing by sqrt(d), "
            "as ours. transformers 5 has no relative_key in BERT-like models; checkpoints "
            "trained with it need transformers < 5.",
            "worked example (tests/test_presets.py); peer test (tests/test_peers.py) where "
            "transformers < 5 is installed",
        ),
        Preset(
            "hf-bert-relative-key-query",
            "transformers 4.x BertSelfAttention, position_embedding_type="
            "'relative_key_query'; removed in transformers 5 (huggingface/transformers#41170)",
            "general",
            {"order": "future_to_past"},
            "as relative_key plus k_j . E[i - j + P - 1]; bert_key_query computes both.",
            "worked example (tests/test_presets.py); peer test (tests/test_peers.py) where "
            "transformers < 5 is installed",
        ),
        Preset(
            "hf-wav2vec2-bert-relative-key",
            "transformers Wav2Vec2BertSelfAttention, position_embeddings_type='relative_key' "
            "(transformers 4 and 5)",
            "shaw",
            {"max_past": 64, "beyond": "clip"},
            "distance = position_ids_r - position_ids_l = j - i (ours), clamped to "
            "[-left_max_position_embeddings, right_max_position_embeddings] and shifted by "
            "the left maximum: our index with max_past = left_max_position_embeddings "
            "(64 in the default config, the value in params; pass your model's: the "
            "table's left + right + 1 rows cannot tell the split) and K = "
            "right_max_position_embeddings (8), so "
            "distance_embedding (left + right + 1, head_size) is our key_table unchanged, "
            "shared by heads; no value table; the term is scaled with q . k by "
            "head_size^-0.5; start-aligned self-attention.",
            "peer test (tests/test_peers.py) against transformers",
        ),
        Preset(
            "hf-conformer-relative",
            "transformers Wav2Vec2ConformerSelfAttention and Wav2Vec2BertSelfAttention, "
            "position_embeddings_type='relative' (the Conformer's, from ESPnet)",
            "transformer_xl",
            {"causal": False, "clamp_len": None, "q_offset": 0},
            "Transformer-XL's four terms without a memory: the rel_shift reads pe row "
            "T - 1 - (i - j), the sinusoid of i - j (query minus key, ours); pe interleaves "
            "sin and cos per frequency ([sin w_0, cos w_0, ...]) where ours puts the sines "
            "first, so to_canonical(linear_pos.weight, heads=h) splits heads and reorders "
            "the d_model axis; pos_bias_u and pos_bias_v (h, d) are content_bias and "
            "position_bias; every key is visible (causal=False); scale head_size^-0.5 on "
            "all four terms. transformers builds pe in float32.",
            "peer test (tests/test_peers.py) against transformers",
            _conformer,
        ),
        Preset(
            "hf-t5",
            "transformers T5Attention.compute_bias / _relative_position_bucket",
            "t5",
            {"scale": 1.0, "max_distance": 128},
            "relative_position = memory - context = j - i (ours); relative_attention_bias "
            "weight is (num_buckets, h): transpose; no 1/sqrt(d); bidirectional = not decoder.",
            "peer test (tests/test_peers.py) against transformers",
            _heads_last_to_first,
        ),
        Preset(
            "x-transformers-t5",
            "x_transformers RelativePositionBias",
            "t5",
            {"max_distance": 128},
            "rel_pos = k_pos - q_pos with end-aligned queries (ours); embedding (num_buckets, "
            "h): transpose and multiply by the module's scale; causal=True means "
            "bidirectional=False.",
            "peer test (tests/test_peers.py) against x-transformers",
            _heads_last_to_first,
        ),
        Preset(
            "x-transformers-alibi",
            "x_transformers AlibiPositionalBias",
            "alibi",
            {"symmetric": True},
            "bias = -|j - i| * slope with end-aligned queries; the same slopes; heads beyond "
            "`heads` (total_heads) get no bias.",
            "peer test (tests/test_peers.py) against x-transformers",
        ),
        Preset(
            "bottleneck-transformer",
            "bottleneck_transformer_pytorch RelPosEmb / rel_to_abs",
            "grid2d",
            {},
            "rel_to_abs is our pad_flatten_reshape with offset l - 1 (key minus query); "
            "rel_height and rel_width are our row and column tables unchanged.",
            "peer test (tests/test_peers.py) against bottleneck-transformer-pytorch",
        ),
        Preset(
            "swin",
            "Swin Transformer WindowAttention.relative_position_bias_table",
            "swin",
            {},
            "relative_coords = coords_q - coords_k (query minus key), table "
            "((2Wh-1)(2Ww-1), h): transpose and reverse the rows.",
            "worked example (tests/test_presets.py) transcribing Swin's index code",
            _swin,
        ),
        Preset(
            "diagonal-future-to-past",
            "tables whose rows run from the farthest future to the farthest past",
            "general",
            {"order": "past_to_future"},
            "reverse the rows (or keep them and pass order='future_to_past').",
            "worked example (tests/test_presets.py)",
            _reverse_rows,
        ),
        Preset(
            "transformer-xl",
            "kimiyoung/transformer-xl RelPartialLearnableMultiHeadAttn (and HF TransfoXL)",
            "transformer_xl",
            {"causal": True, "clamp_len": None},
            "pos_seq = klen-1 .. 0 is i - j (query minus key) with queries after a memory of "
            "mlen = klen - qlen (our default q_offset); clamp_len clamps it from above (set "
            "clamp_len=None when theirs is <= 0); R = [sin, cos]; r_net.weight (h d, d_model) "
            "-> (h, d_model, d) with to_canonical(weight, heads=h); r_w_bias and r_r_bias "
            "(h, d) are content_bias and position_bias; (AC + BD) * 1/sqrt(d).",
            "worked example (tests/test_presets.py) transcribing the original PyTorch code; "
            "HF transformers removed TransfoXL",
            _linear_heads_first,
        ),
        Preset(
            "xlnet",
            "transformers XLNetRelativeAttention.rel_attn_core with "
            "XLNetModel.relative_positional_encoding",
            "transformer_xl",
            {"causal": False, "clamp_len": None},
            "attn_type='bi': pos_seq klen .. -qlen+1 covers future keys too (causal=False); "
            "'uni' is causal=True; clamp_len > 0 clamps both signs, as ours; r (d_model, h, d) "
            "-> (h, d_model, d); rel_shift_bnij is our rel_shift of t_q + t_k - 1 columns.",
            "peer test (tests/test_peers.py) against transformers",
            _xlnet,
        ),
        Preset(
            "hf-deberta-v2",
            "transformers DebertaV2 DisentangledSelfAttention (v2 and v3 checkpoints)",
            "deberta",
            {"max_position": 512},
            "relative_pos = i - j (query minus key), row clamp(bucket + S, 0, 2S - 1) with "
            "S = position_buckets: our rows reversed; pass the projected tables "
            "key_proj(rel_embeddings) and query_proj(rel_embeddings) (pos_key_proj and "
            "pos_query_proj when share_att_key is False) through to_canonical(table, heads=h); "
            "max_position = max_relative_positions; scale 1/sqrt(d (1 + #terms)). p2c reads "
            "delta(i, j) as the released code does (eq. 4 of the paper writes delta(j, i)); "
            "with t_q != t_k transformers builds p2c from key-key positions, which only "
            "works when t_q = t_k: we use the query positions. Buckets equal "
            "make_log_bucket_position except where its float32 log rounds the ceiling the "
            "other way (|r| = 1643 for position_buckets=512, max_relative_positions=4096); "
            "ours is exact.",
            "peer test (tests/test_peers.py) against transformers, buckets and attention",
            _deberta,
        ),
        Preset(
            "hf-rope",
            "transformers 5 modeling_rope_utils (ROPE_INIT_FUNCTIONS) with the models' "
            "RotaryEmbedding and apply_rotary_pos_emb",
            "rope",
            {"layout": "half"},
            "rope_from_config(config.rope_parameters, head_dim=..., max_position_embeddings=...) "
            "gives base, rotary_dim, layout and scaling for every rope_type (default, linear, "
            "dynamic, yarn, longrope, llama3, proportional), and axes for an mrope_section "
            "(Qwen2-VL; Qwen3-VL's mrope_interleaved); rotate_half pairs c and c + R/2 "
            "(layout 'half'; DeepSeek's rope_interleave: 'interleaved'); cos and sin carry the "
            "attention factor; DeepSeek-V2/V3 also scale the softmax by mscale**2 "
            "(softmax_mscale=True). transformers computes the angles in float32 "
            "(angles='float32' reproduces that arithmetic) and, for dynamic, the base from "
            "each call's length (policy 'per_call'), keeping cached keys at their old base.",
            "peer tests (tests/test_peers_rope.py, tests/test_peers_rope_axes.py) against "
            "transformers' rotary embeddings, cos/sin and rotated q/k",
        ),
        *(Preset(**fields) for fields in BIAS_PRESETS),
    )
}
