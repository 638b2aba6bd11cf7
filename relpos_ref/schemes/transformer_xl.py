r"""Transformer-XL's relative attention (Dai et al. 2019), with a memory.

Queries are the last ``t_q`` of ``t_k`` positions: a memory of
``t_k - t_q`` earlier positions comes first (``q_offset = t_k - t_q``, the
default here). With ``\delta_{ij} = -r_{ij} = (i + q_\text{offset}) - j``, the
query-minus-key distance Transformer-XL writes ``i - j``, the score is the
sum of four terms, scaled together:

.. math::
    e_{ij} = s\,\bigl(\underbrace{q_i \cdot k_j}_{(a)}
             + \underbrace{q_i \cdot p_{\delta_{ij}}}_{(b)}
             + \underbrace{u \cdot k_j}_{(c)}
             + \underbrace{v \cdot p_{\delta_{ij}}}_{(d)}\bigr),

    p_\delta = W_R^\top R_{\text{clamp}(\delta)},

where ``R_δ = [sin(δ ω_0) .. sin(δ ω_{m-1}), cos(δ ω_0) .. cos(δ ω_{m-1})]``
is the sinusoid of width ``d_model = 2m`` with ``ω_c = base^{-2c / d_model}``,
``W_R`` is ``(d_model, d)`` (per head ``(h, d_model, d)``), ``u`` and ``v``
are the learned content and position biases (``r_w_bias`` and ``r_r_bias``
in the original code), and ``clamp`` limits ``|δ|`` to `clamp_len`.

Future keys (``δ < 0``) get the sinusoid of their negative distance, as in
XLNet's bidirectional attention; Transformer-XL masks them (``causal=True``,
the default here) and never looks at their value.

The efficient path computes ``(q_i + v) . p_δ`` once per distance, a
``t_q x (t_q + t_k - 1)`` matrix whose columns run from the most distant past
to the most distant future, and lays it out with `relpos_ref.layouts.rel_shift`
(the slice ``[..., :t_k]`` of the shifted matrix is exact everywhere, for any
``q_offset``). It never builds a ``(t_q, t_k, d)`` tensor.

The angles ``δ ω_c`` and their sines and cosines are computed in float64
wherever the arrays' device has it, then rounded once to the dtype of
``W_R``; a distance beyond what that holds exactly (``2**53``, or ``2**24``
in float32 on a device without float64), after `clamp_len`, is refused
(`relpos_ref._exact`).
"""

from __future__ import annotations

from typing import Any

from .. import _xp
from .._exact import check_exact_distances
from ..attention import attention
from ..calls import Call, Defaults, computes_in_float32, resolve_call
from ..distance_gradients import distance_axis, every_pair_unless, query_rows_vjp
from ..gradients import check_d_output, core_vjp, forward, sum_to_shape
from ..layouts import rel_shift
from ._tables import check_method, check_table, contract_rows
from .transformer_xl_sinusoids import (
    _check_projection,
    _clamp_len,
    _end_aligned,
    transformer_xl_distance,
    transformer_xl_embedding,
    transformer_xl_rows,
)

__all__ = [
    "DEFAULTS",
    "transformer_xl_attention",
    "transformer_xl_attention_vjp",
    "transformer_xl_call",
    "transformer_xl_distance",
    "transformer_xl_embedding",
    "transformer_xl_logits",
    "transformer_xl_rows",
]

#: Transformer-XL's defaults: ``scale = 1/sqrt(d)``, causal, queries after the memory
#: (``q_offset = t_k - t_q``).
DEFAULTS = Defaults(causal=True, q_offset="end")


def _check_bias(name: str, vector: Any, q: Any) -> None:
    if vector is not None:
        check_table(name, vector, q, rows=q.shape[-1], rows_rule=" (the feature width d)",
                    scalar=True)


def _per_head_vector(vector: Any) -> Any:
    # (d,) broadcasts against (..., t, d) as is; (h, d) needs a length-1 axis for t.
    return vector if vector.ndim == 1 else vector[:, None, :]


@computes_in_float32
def transformer_xl_logits(
    q: Any,
    k: Any,
    w_r: Any,
    content_bias: Any = None,
    position_bias: Any = None,
    /,
    *,
    q_offset: int | None = None,
    clamp_len: int | None = None,
    base: float = 10000.0,
    method: str = "efficient",
) -> Any:
    r"""Terms (b) to (d): :math:`(q_i + v) \cdot p_{\delta_{ij}} + u \cdot k_j`, unscaled.

    Parameters
    ----------
    q : floating array, shape ``(..., t_q, d)``
    k : floating array, shape ``(..., t_k, d)``
    w_r : floating array, shape ``(d_model, d)`` or ``(h, d_model, d)``
        The projection ``W_R`` of the sinusoids (``r_net`` in the original
        code, per head); ``d_model`` even.
    content_bias : floating array, shape ``(d,)`` or ``(h, d)``, optional
        ``u`` (``r_w_bias``); omitted, term (c) is absent.
    position_bias : floating array, shape ``(d,)`` or ``(h, d)``, optional
        ``v`` (``r_r_bias``); omitted, term (d) is absent.
    q_offset : int, optional
        Position of query 0; default ``t_k - t_q`` (after the memory).
    clamp_len : int, optional
        Distances beyond ``±clamp_len`` use the sinusoid of ``±clamp_len``.
    base : float, optional
        Frequency base of the sinusoids.
    method : {"efficient", "definition"}, optional
        ``"definition"`` builds ``p_δ`` for every pair, a ``(t_q, t_k, d)``
        tensor; ``"efficient"`` computes one column per distance and lays
        them out with `relpos_ref.layouts.rel_shift`, memory
        ``O(t_q (t_q + t_k))``.

    Returns
    -------
    array, shape ``(..., t_q, t_k)``

    Examples
    --------
    >>> import array_api_strict as xp
    >>> q = xp.reshape(xp.arange(12.0), (3, 4)) / 12
    >>> k = xp.reshape(xp.arange(20.0), (5, 4)) / 20
    >>> w_r, u, v = xp.ones((6, 4)) / 6, xp.ones(4), xp.zeros(4)
    >>> fast = transformer_xl_logits(q, k, w_r, u, v)
    >>> fast.shape
    (3, 5)
    >>> slow = transformer_xl_logits(q, k, w_r, u, v, method="definition")
    >>> bool(xp.all(xp.abs(fast - slow) < 1e-12))
    True
    """
    xp = _xp.array_namespace(q, k, w_r, content_bias, position_bias)
    check_method(method)
    _check_projection(w_r, q)
    _check_bias("content_bias", content_bias, q)
    _check_bias("position_bias", position_bias, q)
    t_q, t_k = q.shape[-2], k.shape[-2]
    q_offset = _end_aligned(t_q, t_k, q_offset)
    dev = _xp.device(q)
    check_exact_distances(xp, q.dtype, dev, t_q=t_q, t_k=t_k, q_offset=q_offset,
                          clamp_len=_clamp_len(clamp_len))
    query = q if position_bias is None else q + _per_head_vector(position_bias)
    if method == "definition" or t_q == 0 or t_k == 0:
        delta = transformer_xl_distance(
            t_q, t_k, q_offset=q_offset, clamp_len=clamp_len, xp=xp, device=dev
        )
        out = contract_rows(query, transformer_xl_rows(delta, w_r, base=base))
    else:
        deltas = grid_distances(t_q, t_k, q_offset=q_offset, clamp_len=clamp_len, xp=xp,
                                device=dev)
        rows = transformer_xl_rows(deltas, w_r, base=base)
        out = rel_shift(xp.matmul(query, xp.matrix_transpose(rows)))[..., :t_k]
    term_c = key_term(k, content_bias)
    return out if term_c is None else out + term_c


def grid_distances(
    t_q: int, t_k: int, /, *, q_offset: int | None, clamp_len: int | None, xp: Any,
    device: Any = None,
) -> Any:
    """``δ = -r`` for each distance of the grid, most distant past first, clamped.

    One entry per column of the efficient layout: ``r = -(t_q - 1 + q_offset)
    .. t_k - 1 - q_offset`` (shared with the kernels).
    """
    q_offset = _end_aligned(t_q, t_k, q_offset)
    idx = _xp.index_dtype(xp, device)
    r = xp.arange(max(t_q + t_k - 1, 0), dtype=idx, device=device) - (t_q - 1 + q_offset)
    c = _clamp_len(clamp_len)
    return -r if c is None else xp.clip(-r, -c, c)


def key_term(k: Any, content_bias: Any, /) -> Any:
    """Term (c), ``u . k_j``, a ``(..., 1, t_k)`` row; ``None`` without ``u`` (kernels share it)."""
    if content_bias is None:
        return None
    xp = _xp.array_namespace(k, content_bias)
    u = content_bias[..., :, None]  # (d, 1) or (h, d, 1)
    return xp.matrix_transpose(xp.matmul(k, u))


def transformer_xl_call(
    q: Any,
    k: Any,
    v: Any,
    w_r: Any,
    content_bias: Any = None,
    position_bias: Any = None,
    /,
    *,
    scale: float | None,
    mask: Any,
    causal: bool | None,
    q_offset: int | None,
    clamp_len: int | None,
    method: str,
) -> Call:
    """Validate a `transformer_xl_attention` call and resolve its defaults (kernels share it).

    Examples
    --------
    >>> import array_api_strict as xp
    >>> q, k = xp.zeros((3, 4)), xp.zeros((7, 4))
    >>> call = transformer_xl_call(q, k, k, xp.zeros((6, 4)), scale=None, mask=None,
    ...                            causal=None, q_offset=None, clamp_len=None,
    ...                            method="efficient")
    >>> call.causal, call.q_offset
    (True, 4)
    """
    call = resolve_call(
        q, k, v, scale=scale, mask=mask, causal=causal, q_offset=q_offset, defaults=DEFAULTS,
        tables={"w_r": w_r, "content_bias": content_bias, "position_bias": position_bias},
    )
    check_method(method)
    _clamp_len(clamp_len)
    _check_projection(w_r, q)
    _check_bias("content_bias", content_bias, q)
    _check_bias("position_bias", position_bias, q)
    check_exact_distances(call.xp, q.dtype, _xp.device(q), t_q=call.t_q, t_k=call.t_k,
                          q_offset=call.q_offset, clamp_len=_clamp_len(clamp_len))
    return call


@computes_in_float32
def transformer_xl_attention(
    q: Any,
    k: Any,
    v: Any,
    w_r: Any,
    content_bias: Any = None,
    position_bias: Any = None,
    /,
    *,
    clamp_len: int | None = None,
    base: float = 10000.0,
    scale: float | None = None,
    mask: Any = None,
    causal: bool | None = None,
    q_offset: int | None = None,
    method: str = "efficient",
    return_weights: bool = False,
) -> Any:
    r"""Transformer-XL attention over a memory and the current segment.

    .. math::
        w = \operatorname{softmax}\bigl(s\,(q k^\top + P)\bigr),

        P_{ij} = (q_i + v) \cdot W_R^\top R_{\text{clamp}(\delta_{ij})} + u \cdot k_j

    Parameters
    ----------
    q : floating array ``(..., t_q, d)``
        Queries of the current segment.
    k, v : floating arrays ``(..., t_k, d)``, ``(..., t_k, d_v)``
        Keys and values of the memory followed by the segment
        (``t_k = mem + t_q``).
    w_r, content_bias, position_bias
        As in `transformer_xl_logits`.
    clamp_len, base, method
        As in `transformer_xl_logits`.
    scale : float, optional
        Default ``1 / sqrt(d)``, Transformer-XL's.
    mask, return_weights
        As in `relpos_ref.attention`.
    causal : bool, optional
        Default ``True`` (Transformer-XL's decoder mask); ``False`` for
        XLNet's bidirectional attention.
    q_offset : int, optional
        Position of query 0; default ``t_k - t_q`` (`DEFAULTS`).

    Returns
    -------
    out : array ``(..., t_q, d_v)``, and the weights with ``return_weights=True``.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> q = xp.ones((2, 3, 4))               # 2 heads, segment of 3
    >>> k = v = xp.ones((2, 7, 4))           # memory of 4, then the segment
    >>> w_r, u, bv = xp.ones((8, 4)), xp.ones((2, 4)), xp.zeros(4)
    >>> out, w = transformer_xl_attention(q, k, v, w_r, u, bv, return_weights=True)
    >>> out.shape, bool(xp.all(w[:, 0, 5:] == 0))  # query 0 sits at position 4
    ((2, 3, 4), True)
    """
    call = transformer_xl_call(
        q, k, v, w_r, content_bias, position_bias, scale=scale, mask=mask, causal=causal,
        q_offset=q_offset, clamp_len=clamp_len, method=method,
    )
    position = transformer_xl_logits(
        q, k, w_r, content_bias, position_bias, q_offset=call.q_offset, clamp_len=clamp_len,
        base=base, method=method,
    )
    return attention(
        q, k, v, scale=call.scale, mask=mask, causal=call.causal, q_offset=call.q_offset,
        position=position, return_weights=return_weights,
    )


def _vector_gradient(per_row: Any, vector: Any) -> Any:
    # The gradient of a (d,) or per-head (h, d) bias added to every row of (..., t, d).
    xp = _xp.array_namespace(per_row)
    if vector.ndim == 1:
        return sum_to_shape(per_row, tuple(vector.shape))
    per_head = sum_to_shape(per_row, (vector.shape[0], 1, vector.shape[1]))
    return xp.reshape(per_head, tuple(vector.shape))


@computes_in_float32
def transformer_xl_attention_vjp(
    q: Any,
    k: Any,
    v: Any,
    w_r: Any,
    content_bias: Any = None,
    position_bias: Any = None,
    /,
    *,
    d_output: Any,
    clamp_len: int | None = None,
    base: float = 10000.0,
    scale: float | None = None,
    mask: Any = None,
    causal: bool | None = None,
    q_offset: int | None = None,
) -> dict[str, Any]:
    r"""Gradients of `transformer_xl_attention` for the output's cotangent `d_output` (a VJP).

    With :math:`\bar{P} = s\,\bar{l}` laid out by distance and
    :math:`p_r = W_R^\top R_{\text{clamp}(-r)}` one row per distance,

    .. math::
        \bar{q}_i \mathrel{+}= \sum_r \bar{P}^\text{rel}_{ir}\, p_r, \quad
        \bar{v} = \sum_i \sum_r \bar{P}^\text{rel}_{ir}\, p_r,

        \bar{W}_R = \sum_r R_{\text{clamp}(-r)} \Bigl(\sum_i \bar{P}^\text{rel}_{ir}
        (q_i + v)\Bigr)^\top,

        \bar{k}_j \mathrel{+}= \Bigl(\sum_i \bar{P}_{ij}\Bigr) u, \qquad
        \bar{u} = \sum_j \Bigl(\sum_i \bar{P}_{ij}\Bigr) k_j .

    Parameters
    ----------
    q, k, v, w_r, content_bias, position_bias, clamp_len, base, scale, mask, causal, q_offset
        As in `transformer_xl_attention`.
    d_output : floating array, shape ``(..., t_q, d_v)``
        :math:`\partial L / \partial\,\text{out}`; same dtype as `q`.

    Returns
    -------
    dict
        The gradient with respect to each of ``q``, ``k``, ``v``, ``w_r`` and, when given,
        ``content_bias`` and ``position_bias``, of its shape and dtype.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> q = k = v = xp.ones((2, 2))
    >>> g = transformer_xl_attention_vjp(q, k, v, xp.zeros((4, 2)), d_output=xp.ones((2, 2)))
    >>> g["w_r"].shape
    (4, 2)
    """
    call = transformer_xl_call(
        q, k, v, w_r, content_bias, position_bias, scale=scale, mask=mask, causal=causal,
        q_offset=q_offset, clamp_len=clamp_len, method="efficient",
    )
    check_d_output(d_output, q, call, v.shape[-1], mask=mask)
    if call.t_q == 0 or call.t_k == 0:  # no pair: every gradient is zero
        arrays = {"q": q, "k": k, "v": v, "w_r": w_r, "content_bias": content_bias,
                  "position_bias": position_bias}
        return {name: call.xp.zeros_like(a) for name, a in arrays.items() if a is not None}
    position = transformer_xl_logits(
        q, k, w_r, content_bias, position_bias, q_offset=call.q_offset, clamp_len=clamp_len,
        base=base,
    )
    fwd = forward(q, k, call, mask=mask, position=position)
    core = core_vjp(q, k, v, d_output, call, fwd)
    xp, dev = call.xp, _xp.device(q)
    d_position = core.d_logits * call.scale
    axis = distance_axis(call.t_q, call.t_k, call.q_offset)
    deltas = grid_distances(call.t_q, call.t_k, q_offset=call.q_offset, clamp_len=clamp_len,
                            xp=xp, device=dev)
    rows = transformer_xl_rows(deltas, w_r, base=base)  # (n, d) or (h, n, d)
    query = q if position_bias is None else q + _per_head_vector(position_bias)
    dq_rows, d_rows = query_rows_vjp(d_position, query, rows, axis, allowed=fwd.allowed)
    embedding = transformer_xl_embedding(deltas, w_r.shape[-2], dtype=w_r.dtype, base=base)
    d_rows = sum_to_shape(d_rows, (*w_r.shape[:-2], axis.n, w_r.shape[-1]))
    grads = {
        "q": sum_to_shape(core.dq + dq_rows, q.shape),
        "k": None,
        "v": sum_to_shape(core.dv, v.shape),
        "w_r": xp.matmul(xp.matrix_transpose(embedding), d_rows),
    }
    dk = core.dk
    if content_bias is not None:
        allowed = every_pair_unless(fwd.allowed, call.t_q, call.t_k, xp=xp, device=dev)
        per_key = xp.sum(d_position, axis=-2)[..., None]  # (..., t_k, 1)
        seen = xp.any(allowed, axis=-2)[..., None]  # keys some query attends to
        zero = xp.zeros((), dtype=k.dtype, device=dev)
        dk = dk + per_key * _per_head_vector(content_bias)
        grads["content_bias"] = _vector_gradient(per_key * xp.where(seen, k, zero),
                                                 content_bias)
    grads["k"] = sum_to_shape(dk, k.shape)
    if position_bias is not None:
        grads["position_bias"] = _vector_gradient(dq_rows, position_bias)
    return grads
