r"""The backward pass: the steps every scheme's vector-Jacobian product is built from.

For a scalar loss with gradient :math:`\bar{o} = \partial L / \partial\,\text{out}`
(the output's cotangent, ``d_output``), attention's forward pass

.. math::
    l = s\,(q k^\top + P) + B, \qquad w = \operatorname{softmax}_\text{allowed}(l),
    \qquad \text{out} = w\, v + \textstyle\sum_j w_{ij}\, a^V_{\text{idx}(r_{ij})}

runs backwards as

.. math::
    \bar{v} = w^\top \bar{o}, \qquad
    \bar{w}_{ij} = [\text{allowed}_{ij}]\;\bar{o}_i \cdot
                   (v_j + a^V_{\text{idx}(r_{ij})}), \qquad
    \bar{l}_{ij} = w_{ij}\,\bigl(\bar{w}_{ij} - \textstyle\sum_{j'} w_{ij'}\bar{w}_{ij'}\bigr),

    \bar{B} = \bar{l}, \qquad \bar{P} = s\,\bar{l}, \qquad
    \bar{q} = s\,\bar{l}\,k, \qquad \bar{k} = s\,\bar{l}^\top q .

A relative term reads its table through a layout: row ``idx(r)`` for the pair
at distance ``r``. Its transpose is a sum over distances
(`relpos_ref.distance_gradients`): ``by_distance`` lays a ``(t_q, t_k)``
gradient out by distance (`relpos_ref.layouts.to_relative`, each entry once)
and ``rows_to_table`` adds the distances that share a table
row (a scatter-add, written as a product with the 0/1 matrix of the row map,
since the array API has no scatter). So

.. math::
    \bar{q}_i \mathrel{+}= \sum_r \bar{P}^{\,\text{rel}}_{ir}\, a_{\text{idx}(r)}, \qquad
    \bar{a}_c = \sum_{r:\ \text{idx}(r) = c}\ \sum_i \bar{P}^{\,\text{rel}}_{ir}\, q_i,

with ``O(t_q (t_q + t_k))`` memory and no ``(t_q, t_k, d)`` tensor. Gradients
of arrays that were broadcast are summed back to their shapes (`sum_to_shape`).

The same rule as the forward pass holds for masked entries: a pair that is not
allowed contributes nothing to any gradient, even when a value, a key or a
table row it would read is NaN or infinite.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from . import _xp
from ._validate import broadcast_shapes
from .attention import allowed_keys, compose_logits, masked_softmax
from .calls import Call, check_terms, computes_in_float32, resolve_call

__all__ = [
    "CoreGradients",
    "Forward",
    "attention_vjp",
    "backward_through_softmax",
    "check_d_output",
    "content_vjp",
    "core_vjp",
    "dot_rows",
    "forward",
    "masked_product",
    "softmax_vjp",
    "sum_to_shape",
]


def sum_to_shape(x: Any, shape: tuple[int, ...], /) -> Any:
    """Sum `x` over the axes it was broadcast along from `shape` (the transpose of broadcasting).

    Examples
    --------
    >>> import array_api_strict as xp
    >>> sum_to_shape(xp.ones((2, 3, 4)), (3, 1))
    Array([[8.],
           [8.],
           [8.]], dtype=array_api_strict.float64)
    """
    xp = _xp.array_namespace(x)
    shape = tuple(shape)
    lead = x.ndim - len(shape)
    if lead < 0:
        msg = f"cannot sum an array of shape {tuple(x.shape)} to the larger rank of {shape}"
        raise ValueError(msg)
    if lead:
        x = xp.sum(x, axis=tuple(range(lead)))
    ones = tuple(i for i, (n, m) in enumerate(zip(shape, x.shape, strict=True))
                 if n == 1 and m != 1)
    if ones:
        x = xp.sum(x, axis=ones, keepdims=True)
    if tuple(x.shape) != shape:
        msg = f"an array of shape {tuple(x.shape)} does not broadcast from {shape}"
        raise ValueError(msg)
    return x


def masked_product(a: Any, b: Any, /, *, used: Any = None) -> Any:
    r"""``a @ b`` in which a pair ``(i, j)`` that is not `used` contributes nothing.

    .. math:: \text{out}_i = \sum_{j:\ \text{used}_{ij}} a_{ij}\, b_j

    A row ``b_j`` that is NaN or infinite is read only through used pairs:
    each output row that uses such a ``b_j`` is NaN (as a gradient that
    depends on a non-finite value is), every other row is exact. `a` is
    zero where not used (a gradient of masked logits), so unused finite rows
    contribute nothing either way.

    Parameters
    ----------
    a : floating array, shape ``(..., t, n)``
    b : floating array, shape ``(..., n, d)``
    used : bool array broadcastable to ``(..., t, n)``, optional

    Examples
    --------
    >>> import array_api_strict as xp
    >>> a = xp.asarray([[1.0, 0.0], [1.0, 1.0]])
    >>> b = xp.asarray([[2.0], [xp.nan]])
    >>> masked_product(a, b, used=xp.asarray([[True, False], [True, True]]))
    Array([[ 2.],
           [nan]], dtype=array_api_strict.float64)
    """
    xp = _xp.array_namespace(a, b, used)
    if used is None:
        return xp.matmul(a, b)
    dev = _xp.device(a)
    zero = xp.zeros((), dtype=b.dtype, device=dev)
    finite = xp.all(xp.isfinite(b), axis=-1)  # (..., n): a row read whole or not at all
    out = xp.matmul(a, xp.where(finite[..., None], b, zero))
    # used pairs with a non-finite row, by logic: a float matrix-vector product here let
    # OpenBLAS raise a spurious "invalid value" on its uninitialized output (beta = 0)
    hits = xp.any(xp.logical_and(used, xp.logical_not(finite)[..., None, :]), axis=-1,
                  keepdims=True)
    nan = xp.asarray(xp.nan, dtype=out.dtype, device=dev)
    return xp.where(hits, nan, out)


def dot_rows(a: Any, b: Any, /) -> Any:
    r"""``a @ b^T``, NaN in each column whose row ``b_j`` is not finite (no ``inf - inf``).

    .. math:: \text{out}_{ij} = a_i \cdot b_j

    A column of a non-finite row is NaN whatever `a` holds; the caller masks
    the pairs that are not used (a masked key's value, an unreachable table row).
    """
    xp = _xp.array_namespace(a, b)
    dev = _xp.device(b)
    finite = xp.all(xp.isfinite(b), axis=-1)  # (..., n)
    zero = xp.zeros((), dtype=b.dtype, device=dev)
    out = xp.matmul(a, xp.matrix_transpose(xp.where(finite[..., None], b, zero)))
    nan = xp.asarray(xp.nan, dtype=out.dtype, device=dev)
    return xp.where(finite[..., None, :], out, nan)


class Forward(NamedTuple):
    """What the backward pass keeps of the forward pass."""

    weights: Any
    allowed: Any


def forward(q: Any, k: Any, call: Call, *, mask: Any = None, position: Any = None,
            bias: Any = None) -> Forward:
    """Recompute the attention weights of a call (and the allowed pairs)."""
    xp = call.xp
    allowed = allowed_keys(call.t_q, call.t_k, mask=mask, causal=call.causal,
                           q_offset=call.q_offset, xp=xp, device=_xp.device(q))
    if allowed is not None:  # a mask of shape (t_k,), (1, t_k), (t_q, 1) or (): every pair
        allowed = xp.broadcast_to(allowed, (*allowed.shape[:-2], call.t_q, call.t_k))
    content = xp.matmul(q, xp.matrix_transpose(k))
    logits = compose_logits(content, scale=call.scale, position=position, bias=bias)
    return Forward(masked_softmax(logits, allowed=allowed), allowed)


def check_d_output(d_output: Any, q: Any, call: Call, d_v: int, *, mask: Any = None) -> None:
    """A `TypeError` or `ValueError` naming ``d_output`` unless it fits the output.

    ``d_output`` is a floating array of `q`'s library and dtype that
    broadcasts to the output's shape, ``(*batch, t_q, d_v)`` with the batch of
    ``q``, ``k``, ``v`` and the mask, without widening it.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> q = k = v = xp.zeros((2, 3))
    >>> call = resolve_call(q, k, v, scale=None, mask=None, causal=None, q_offset=None)
    >>> check_d_output(xp.zeros((4, 2, 3)), q, call, 3)
    Traceback (most recent call last):
    ...
    ValueError: `d_output` must broadcast to the output's shape (2, 3), got shape (4, 2, 3)
    """
    if d_output is None:
        msg = "`d_output` must be an array, the gradient of the loss with respect to the output"
        raise TypeError(msg)
    _xp.named_namespace({"q": q, "d_output": d_output})
    _xp.check_floating(call.xp, "d_output", d_output)
    _xp.check_same_dtype(q=q, d_output=d_output)
    batch = tuple(call.batch)
    if mask is not None and mask.ndim > 2:
        batch = broadcast_shapes(batch=batch, mask=tuple(mask.shape[:-2]))
    output = (*batch, call.t_q, d_v)
    shape = tuple(d_output.shape)
    try:
        fits = broadcast_shapes(d_output=shape, output=output) == output
    except ValueError:
        fits = False
    if not fits:
        msg = f"`d_output` must broadcast to the output's shape {output}, got shape {shape}"
        raise ValueError(msg)


def softmax_vjp(weights: Any, d_weights: Any, /) -> Any:
    r"""Gradient of the logits from that of the softmax weights.

    .. math:: \bar{l}_{ij} = w_{ij}\,\bigl(\bar{w}_{ij}
              - \textstyle\sum_{j'} w_{ij'}\,\bar{w}_{ij'}\bigr)

    Masked entries (``w = 0``) and empty rows get zero; `d_weights` must be
    zero (not NaN) where the weights are masked.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> softmax_vjp(xp.asarray([[0.5, 0.5]]), xp.asarray([[1.0, 0.0]]))
    Array([[ 0.25, -0.25]], dtype=array_api_strict.float64)
    """
    xp = _xp.array_namespace(weights, d_weights)
    inner = xp.sum(weights * d_weights, axis=-1, keepdims=True)
    return weights * (d_weights - inner)


def backward_through_softmax(fwd: Forward, v: Any, d_output: Any, *,
                             d_weights: Any = None) -> tuple[Any, Any]:
    r"""``(d_logits, d_v)`` from the output's cotangent.

    ``d_weights`` adds a relative-value term's share of :math:`\bar{w}`.
    """
    xp = _xp.array_namespace(fwd.weights, v, d_output)
    # the output's batch: the weights' (q, k, mask) and v's
    batch = broadcast_shapes(weights=tuple(fwd.weights.shape[:-2]), v=tuple(v.shape[:-2]),
                             d_output=tuple(d_output.shape[:-2]))
    weights = xp.broadcast_to(fwd.weights, (*batch, *fwd.weights.shape[-2:]))
    dev = _xp.device(weights)
    zero = xp.zeros((), dtype=weights.dtype, device=dev)
    d_out = xp.broadcast_to(d_output, (*batch, weights.shape[-2], v.shape[-1]))
    dv = xp.matmul(xp.matrix_transpose(weights), d_out)
    dw = dot_rows(d_out, v)
    if d_weights is not None:
        dw = dw + d_weights
    if fwd.allowed is not None:  # a masked key's value (NaN, say) reaches no gradient
        dw = xp.where(fwd.allowed, dw, zero)
    return softmax_vjp(weights, dw), dv


def content_vjp(q: Any, k: Any, d_content: Any, /, *, allowed: Any = None) -> tuple[Any, Any]:
    r"""``(dq, dk)`` of the content term ``q k^T`` given its gradient (already scaled).

    .. math:: \bar{q} = \bar{C}\,k, \qquad \bar{k} = \bar{C}^\top q
    """
    xp = _xp.array_namespace(q, k, d_content)
    t = None if allowed is None else xp.matrix_transpose(allowed)
    dq = masked_product(d_content, k, used=allowed)
    dk = masked_product(xp.matrix_transpose(d_content), q, used=t)
    return dq, dk


class CoreGradients(NamedTuple):
    """The gradients every scheme shares: the logits', and q, k, v through ``q k^T`` and ``w v``."""

    d_logits: Any
    dq: Any
    dk: Any
    dv: Any


def core_vjp(q: Any, k: Any, v: Any, d_output: Any, call: Call, fwd: Forward, *,
             d_weights: Any = None) -> CoreGradients:
    """`backward_through_softmax` then `content_vjp` with the call's scale."""
    d_logits, dv = backward_through_softmax(fwd, v, d_output, d_weights=d_weights)
    dq, dk = content_vjp(q, k, d_logits * call.scale, allowed=fwd.allowed)
    return CoreGradients(d_logits, dq, dk, dv)


@computes_in_float32
def attention_vjp(
    q: Any,
    k: Any,
    v: Any,
    /,
    *,
    d_output: Any,
    scale: float | None = None,
    mask: Any = None,
    causal: bool | None = None,
    q_offset: int | None = None,
    bias: Any = None,
    position: Any = None,
) -> dict[str, Any]:
    r"""Gradients of `relpos_ref.attention` for the output's cotangent `d_output` (a VJP).

    .. math::
        \bar{v} = w^\top \bar{o},\quad
        \bar{l} = w \odot (\bar{w} - \operatorname{rowsum}(w \odot \bar{w})),\quad
        \bar{q} = s\,\bar{l}\,k,\quad \bar{k} = s\,\bar{l}^\top q,\quad
        \bar{B} = \bar{l},\quad \bar{P} = s\,\bar{l}

    with :math:`\bar{w} = \bar{o}\, v^\top` over the allowed pairs.

    Parameters
    ----------
    q, k, v, scale, mask, causal, q_offset, bias, position
        As in `relpos_ref.attention`.
    d_output : floating array, shape ``(..., t_q, d_v)``
        :math:`\partial L / \partial\,\text{out}`; same dtype as `q`.

    Returns
    -------
    dict
        ``"q"``, ``"k"``, ``"v"`` and, when given, ``"bias"`` and
        ``"position"``: each the gradient of the loss with respect to that
        argument, of its shape and dtype.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> q = k = xp.asarray([[1.0, 0.0], [0.0, 1.0]])
    >>> v = xp.asarray([[1.0], [2.0]])
    >>> grads = attention_vjp(q, k, v, d_output=xp.ones((2, 1)), scale=1.0, causal=True)
    >>> grads["v"]
    Array([[1.26894142],
           [0.73105858]], dtype=array_api_strict.float64)
    """
    call = resolve_call(q, k, v, scale=scale, mask=mask, causal=causal, q_offset=q_offset)
    check_terms(q, call, bias=bias, position=position)
    check_d_output(d_output, q, call, v.shape[-1], mask=mask)
    fwd = forward(q, k, call, mask=mask, position=position, bias=bias)
    core = core_vjp(q, k, v, d_output, call, fwd)
    grads = {"q": sum_to_shape(core.dq, q.shape), "k": sum_to_shape(core.dk, k.shape),
             "v": sum_to_shape(core.dv, v.shape)}
    if bias is not None:
        grads["bias"] = sum_to_shape(core.d_logits, bias.shape)
    if position is not None:
        grads["position"] = sum_to_shape(core.d_logits * call.scale, position.shape)
    return grads
