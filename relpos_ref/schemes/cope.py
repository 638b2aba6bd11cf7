r"""Contextual Position Encoding, CoPE (Golovneva et al. 2024, arXiv 2405.18719).

Positions are counted by the content: each allowed key ``t`` of query ``i``
has a gate, the sigmoid of its scaled logit, and the position of key ``j``
seen from query ``i`` is the sum of the gates of the keys from ``j`` to the
end of the row,

.. math:: g_{it} = \sigma(s\, q_i \cdot k_t)\,[t \text{ allowed}], \qquad
          p_{ij} = \sum_{t \ge j} g_{it}

(a *reverse* cumulative sum over the keys: under a causal mask
:math:`p_{ij} = \sum_{t=j}^{i + q_\text{offset}} g_{it}` and :math:`p_{ii} = g_{ii}`).
Positions are fractional; with a table ``e`` of ``max_pos`` rows
(``(max_pos, d)`` shared by the heads, as x-transformers and the paper's code
hold it, or ``(h, max_pos, d)`` per head) the term interpolates between
the integer positions' logits :math:`z_{in} = q_i \cdot e_n`:

.. math:: \bar p = \min(p_{ij}, \text{max\_pos} - 1), \quad
          \lambda = \bar p - \lfloor \bar p \rfloor, \quad
          c_{ij} = \lambda\, z_{i \lceil \bar p \rceil}
                   + (1 - \lambda)\, z_{i \lfloor \bar p \rfloor}

and :math:`\text{logits}_{ij} = s\, q_i \cdot k_j + c_{ij}`: the term is *not*
scaled (the paper adds it to the already scaled logits, x-transformers
likewise).

Conventions (both peers, `tests/test_peers_cope.py`):

- the gates read the *scaled* logits :math:`s\,q \cdot k`, after the mask: a
  masked pair (a key mask, the causal future) has gate 0 (the peers' logit
  there is ``-inf`` or ``-finfo.max``), and no other term enters the gates
  (x-transformers adds any other attention bias before the gates; this
  scheme has none);
- ``causal`` is the default (CoPE is a decoder's), queries end-aligned; a
  non-causal call sums the gates of every allowed key after ``j`` in the row;
- decoding against a cache (``q_offset``): a row reads only its own gates,
  so a query's row over the cache equals the full causal call's row;
- the clamp is at ``max_pos - 1``; at an integer position the weight
  :math:`\lambda` is 0 (``ceil == floor``);
- the term of a pair that is not allowed is 0 (it is never attended).

Gradients (`cope_attention_vjp`): with :math:`\bar c` the logits' cotangent,
the table logits get :math:`\bar z_{in} = \sum_j \bar c_{ij}((1-\lambda)[\lfloor
\bar p\rfloor = n] + \lambda [\lceil \bar p\rceil = n])`, so
:math:`\bar q \mathrel{+}= \bar z\, e` and :math:`\bar e = \bar z^\top q`; the
position gets :math:`\bar p_{ij} = \bar c_{ij}(z_{i\lceil\bar p\rceil} -
z_{i\lfloor\bar p\rfloor})` where :math:`p \le \text{max\_pos} - 1` (0 at an integer,
as torch's ``ceil``, ``floor`` and ``clamp`` give it), the gates
:math:`\bar g_{it} = \sum_{j \le t} \bar p_{ij}` (a forward cumulative sum,
the transpose of the reverse one), and the scaled logits
:math:`\bar g\, g (1 - g)` on the allowed pairs, which reach ``q`` and ``k``
as the content term does.

Numerics: 16-bit inputs compute in float32 (positions summed from 16-bit
gates are coarse, and the term's derivative jumps at integer positions,
where a gate rounded to 1 puts them; docs/schemes/cope.md).

Cost: the table logits are one ``(t_q, max_pos)`` product per head, read
by a gather; no ``(t_q, t_k, d)`` array is built. The gates, the reverse
cumulative sum, the floor and ceiling, the weights and the gathered logits
are ``(t_q, t_k)`` arrays: the forward's peak is about eight of them
(NumPy, float32, 4 heads, t = 1024: 130 MiB against plain attention's
17 MiB; docs/schemes/cope.md). The table's gradient sums over the reachable
positions, ``min(max_pos, t_k + 1)`` passes over a ``(t_q, t_k)`` array.
"""

from __future__ import annotations

from typing import Any

from .. import _xp
from ..attention import allowed_keys, attention
from ..calls import Call, Defaults, computes_in_float32, resolve_call
from ..gradients import (
    check_d_output,
    content_vjp,
    core_vjp,
    forward,
    masked_product,
    sum_to_shape,
)
from ._tables import check_table, table_logits

__all__ = [
    "DEFAULTS",
    "cope_attention",
    "cope_attention_vjp",
    "cope_call",
    "cope_gates",
    "cope_positions",
    "cope_term",
]

#: CoPE's defaults: ``scale = 1/sqrt(d)``, causal, end-aligned queries.
DEFAULTS = Defaults(causal=True, q_offset="end")


def _sigmoid(xp: Any, z: Any) -> Any:
    # no overflow at either end (exp of -|z| <= 1), and differentiable as it stands: |z| is
    # where(z >= 0, z, -z), whose autograd derivative at 0 is 1, not abs's 0 (so a kernel's
    # autograd through the lowering reads sigma'(0) = 1/4)
    zero = xp.zeros((), dtype=z.dtype, device=_xp.device(z))
    up = z >= zero
    e = xp.exp(-xp.where(up, z, -z))
    one = zero + 1.0
    return xp.where(up, one, e) / (one + e)


def cope_gates(
    q: Any, k: Any, /, *, scale: float, mask: Any = None, causal: bool = True,
    q_offset: int = 0,
) -> tuple[Any, Any]:
    r"""The gates :math:`g_{ij} = \sigma(s\, q_i \cdot k_j)` of the allowed pairs (0 elsewhere).

    Parameters
    ----------
    q, k : floating arrays ``(..., t_q, d)``, ``(..., t_k, d)``
    scale : float
        The logits' scale ``s``.
    mask, causal, q_offset
        As in `relpos_ref.attention`: which pairs are allowed.

    Returns
    -------
    gates : array ``(..., t_q, t_k)``
    allowed : bool array broadcastable to the gates, or ``None`` (every pair)

    Examples
    --------
    >>> import array_api_strict as xp
    >>> q = k = xp.zeros((2, 1))
    >>> cope_gates(q, k, scale=1.0)[0]  # sigma(0) = 1/2 on the causal pairs
    Array([[0.5, 0. ],
           [0.5, 0.5]], dtype=array_api_strict.float64)
    """
    xp = _xp.array_namespace(q, k, mask)
    gates = _sigmoid(xp, xp.matmul(q, xp.matrix_transpose(k)) * scale)
    allowed = allowed_keys(q.shape[-2], k.shape[-2], mask=mask, causal=causal,
                           q_offset=q_offset, xp=xp, device=_xp.device(q))
    if allowed is not None:
        gates = xp.where(allowed, gates, xp.zeros((), dtype=gates.dtype, device=_xp.device(q)))
    return gates, allowed


def cope_positions(gates: Any, /) -> Any:
    r"""Contextual positions :math:`p_{ij} = \sum_{t \ge j} g_{it}`: a reverse cumulative sum.

    Parameters
    ----------
    gates : floating array ``(..., t_q, t_k)``
        `cope_gates` (0 where a pair is not allowed).

    Returns
    -------
    array, the shape and dtype of `gates`
        Not clamped; non-increasing along the keys.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> cope_positions(xp.asarray([[0.5, 0.25, 1.0]]))
    Array([[1.75, 1.25, 1.  ]], dtype=array_api_strict.float64)
    """
    xp = _xp.array_namespace(gates)
    return xp.flip(xp.cumulative_sum(xp.flip(gates, axis=-1), axis=-1), axis=-1)


def _take_rows(x: Any, index: Any) -> Any:
    # out[..., i, j] = x[..., i, index[..., i, j]] for indices in range, batches broadcast
    xp = _xp.array_namespace(x, index)
    batch = tuple(_broadcast(x.shape[:-2], index.shape[:-2]))
    t_q, n, t_k = x.shape[-2], x.shape[-1], index.shape[-1]
    x = xp.broadcast_to(x, (*batch, t_q, n))
    index = xp.broadcast_to(index, (*batch, t_q, t_k))
    rows = 1
    for b in batch:
        rows *= b
    rows *= t_q
    if rows == 0 or t_k == 0:
        return xp.zeros((*batch, t_q, t_k), dtype=x.dtype, device=_xp.device(x))
    start = xp.arange(rows, dtype=index.dtype, device=_xp.device(index)) * n
    flat = xp.reshape(index, (rows, t_k)) + start[:, None]
    out = xp.take(xp.reshape(x, (rows * n,)), xp.reshape(flat, (rows * t_k,)), axis=0)
    return xp.reshape(out, (*batch, t_q, t_k))


def _broadcast(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    n = max(len(a), len(b))
    a, b = (1,) * (n - len(a)) + tuple(a), (1,) * (n - len(b)) + tuple(b)
    return tuple(max(x, y) if 1 in (x, y) else x for x, y in zip(a, b, strict=True))


def _clamped(xp: Any, positions: Any, top: int) -> Any:
    return xp.minimum(positions, xp.asarray(float(top), dtype=positions.dtype,
                                            device=_xp.device(positions)))


class _Interpolation:
    # what the VJP reads: the clamped positions' floor, ceil and weight, the table logits
    # there, and where the clamp lets the gradient pass
    def __init__(self, q: Any, table: Any, positions: Any) -> None:
        xp = _xp.array_namespace(q, table, positions)
        top = table.shape[-2] - 1
        self.inside = positions <= top  # torch.clamp(max=) passes the gradient at the max
        clamped = _clamped(xp, positions, top)
        floor = xp.floor(clamped)
        idx = _xp.index_dtype(xp, _xp.device(q))
        self.floor = xp.astype(floor, idx)
        self.ceil = xp.astype(xp.ceil(clamped), idx)
        self.weight = clamped - floor
        logits = table_logits(q, table)  # (..., t_q, max_pos)
        self.at_floor = _take_rows(logits, self.floor)
        self.at_ceil = _take_rows(logits, self.ceil)


def _term(q: Any, k: Any, table: Any, call: Call, mask: Any, *,
          keep: bool = False) -> tuple[Any, Any, Any, Any]:
    # (term, gates, allowed, interpolation) of a validated call; the gates and the
    # interpolation only with `keep` (the VJP's), None otherwise
    xp = call.xp
    gates, allowed = cope_gates(q, k, scale=call.scale, mask=mask, causal=call.causal,
                                q_offset=call.q_offset)
    if keep:
        found = _Interpolation(q, table, cope_positions(gates))
        term = found.at_ceil * found.weight + found.at_floor * (1.0 - found.weight)
    else:  # each (t_q, t_k) intermediate dropped once read, for the forward's peak
        found, idx = None, _xp.index_dtype(xp, _xp.device(q))
        clamped = _clamped(xp, cope_positions(gates), table.shape[-2] - 1)
        gates = None
        logits = table_logits(q, table)  # (..., t_q, max_pos)
        floor = xp.floor(clamped)
        at_ceil = _take_rows(logits, xp.astype(xp.ceil(clamped), idx))
        weight = clamped - floor
        del clamped
        at_floor = _take_rows(logits, xp.astype(floor, idx))
        del floor
        term = at_ceil * weight + at_floor * (1.0 - weight)
        del at_ceil, at_floor, weight
    if allowed is not None:
        term = xp.where(allowed, term, xp.zeros((), dtype=term.dtype, device=_xp.device(q)))
    return term, gates, allowed, found


def cope_call(
    q: Any, k: Any, v: Any, table: Any, /, *, scale: float | None, mask: Any,
    causal: bool | None, q_offset: int | None,
) -> Call:
    """Validate a `cope_attention` call: the common checks, then the table's.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> q = k = v = xp.zeros((2, 3, 4))
    >>> call = cope_call(q, k, v, xp.zeros((5, 4)), scale=None, mask=None, causal=None,
    ...                  q_offset=None)
    >>> call.causal, call.scale
    (True, 0.5)
    """
    call = resolve_call(q, k, v, scale=scale, mask=mask, causal=causal, q_offset=q_offset,
                        defaults=DEFAULTS, tables={"table": table})
    check_table("table", table, q, width=call.d)
    if table.shape[-2] < 1:
        msg = f"`table` must have at least one row (max_pos >= 1), got shape {tuple(table.shape)}"
        raise ValueError(msg)
    return call


@computes_in_float32
def cope_term(
    q: Any, k: Any, table: Any, /, *, scale: float | None = None, mask: Any = None,
    causal: bool = True, q_offset: int = 0,
) -> Any:
    r"""CoPE's term :math:`c_{ij}`, added (unscaled) to the scaled logits.

    Parameters
    ----------
    q, k : floating arrays ``(..., t_q, d)``, ``(..., t_k, d)``
    table : floating array ``(max_pos, d)`` or ``(h, max_pos, d)``
        ``e``, the integer positions' embeddings.
    scale : float, optional
        The logits' scale in the gates; default ``1/sqrt(d)``.
    mask, causal, q_offset
        Which pairs are allowed (`relpos_ref.attention`); here ``q_offset``
        defaults to 0 and ``causal`` to ``True``.

    Returns
    -------
    array ``(..., t_q, t_k)``
        0 where a pair is not allowed; computed in float32 for 16-bit inputs
        and returned in their dtype.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> q = k = xp.zeros((2, 1))
    >>> table = xp.asarray([[0.0], [4.0]])  # q . e = 0 everywhere: take q = 1
    >>> cope_term(q + 1.0, k, table, scale=0.0)  # gates 1/2: p = 1/2, 1; 1/2
    Array([[2., 0.],
           [4., 2.]], dtype=array_api_strict.float64)
    """
    call = resolve_call(q, k, k[..., :1], scale=scale, mask=mask, causal=causal,
                        q_offset=q_offset, tables={"table": table})
    check_table("table", table, q, width=call.d)
    return _term(q, k, table, call, mask)[0]


@computes_in_float32
def cope_attention(
    q: Any, k: Any, v: Any, table: Any, /, *, scale: float | None = None, mask: Any = None,
    causal: bool | None = None, q_offset: int | None = None, return_weights: bool = False,
) -> Any:
    r"""Attention with contextual positions (CoPE).

    .. math:: w = \operatorname{softmax}(s\, q k^\top + c), \qquad
              c_{ij} = \lambda\, q_i \cdot e_{\lceil \bar p_{ij} \rceil}
                       + (1 - \lambda)\, q_i \cdot e_{\lfloor \bar p_{ij} \rfloor}

    Parameters
    ----------
    q, k, v : floating arrays ``(..., h, t_q, d)``, ``(..., h, t_k, d)``, ``(..., h, t_k, d_v)``
    table : floating array ``(max_pos, d)`` or ``(h, max_pos, d)``
        ``e``, the embeddings of positions ``0 .. max_pos - 1`` (x-transformers'
        ``CoPE.pos_emb``; the paper's ``pos_emb[0].T``); `q`'s dtype.
    scale, mask, q_offset, return_weights
        As in `relpos_ref.attention`; `q_offset` defaults to ``t_k - t_q``.
    causal : bool, optional
        Default ``True``.

    Returns
    -------
    out : array ``(..., h, t_q, d_v)``, and the weights with ``return_weights=True``.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> q = k = xp.zeros((3, 1))
    >>> v = xp.asarray([[1.0], [2.0], [4.0]])
    >>> table = xp.asarray([[0.0], [0.0], [0.0]])
    >>> cope_attention(q, k, v, table)[:, 0]  # a zero table: causal means
    Array([1.        , 1.5       , 2.33333333], dtype=array_api_strict.float64)
    """
    call = cope_call(q, k, v, table, scale=scale, mask=mask, causal=causal, q_offset=q_offset)
    term = _term(q, k, table, call, mask)[0]
    return attention(q, k, v, scale=call.scale, mask=mask, causal=call.causal,
                     q_offset=call.q_offset, bias=term, return_weights=return_weights)


def _table_logits_vjp(d_term: Any, found: _Interpolation, n: int) -> Any:
    # (..., t_q, n): sum_j d_term [(1 - w)[floor = m] + w [ceil = m]], one pass per row m
    xp = _xp.array_namespace(d_term)
    zero = xp.zeros((), dtype=d_term.dtype, device=_xp.device(d_term))
    low, high = d_term * (1.0 - found.weight), d_term * found.weight
    reached = min(n, d_term.shape[-1] + 1)  # a position never exceeds the keys' count
    cols = [xp.sum(xp.where(found.floor == m, low, zero) + xp.where(found.ceil == m, high, zero),
                   axis=-1) for m in range(reached)]
    lead = d_term.shape[:-1]
    cols += [xp.zeros(lead, dtype=d_term.dtype, device=_xp.device(d_term))] * (n - reached)
    if not cols:
        return xp.zeros((*lead, 0), dtype=d_term.dtype, device=_xp.device(d_term))
    return xp.stack(cols, axis=-1)


@computes_in_float32
def cope_attention_vjp(
    q: Any, k: Any, v: Any, table: Any, /, *, d_output: Any, scale: float | None = None,
    mask: Any = None, causal: bool | None = None, q_offset: int | None = None,
) -> dict[str, Any]:
    r"""Gradients of `cope_attention` for the output's cotangent `d_output` (a VJP).

    The logits' cotangent :math:`\bar c` reaches the table's logits (a sum by
    position), the positions (:math:`\bar c\,(z_\lceil - z_\lfloor)`, 0 where
    clamped), the gates (a forward cumulative sum) and the scaled logits
    (:math:`g (1 - g)`): see the module docstring.

    Parameters
    ----------
    q, k, v, table, scale, mask, causal, q_offset
        As in `cope_attention`.
    d_output : floating array, shape ``(..., t_q, d_v)``

    Returns
    -------
    dict
        The gradient with respect to ``q``, ``k``, ``v`` and ``table``, each
        of its argument's shape and dtype.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> q = k = xp.zeros((2, 1))
    >>> v = xp.asarray([[1.0], [3.0]])
    >>> g = cope_attention_vjp(q, k, v, xp.zeros((3, 1)), d_output=xp.ones((2, 1)))
    >>> sorted(g), g["v"][:, 0]
    (['k', 'q', 'table', 'v'], Array([1.5, 0.5], dtype=array_api_strict.float64))
    """
    call = cope_call(q, k, v, table, scale=scale, mask=mask, causal=causal, q_offset=q_offset)
    check_d_output(d_output, q, call, v.shape[-1], mask=mask)
    xp, device = call.xp, _xp.device(q)
    term, gates, allowed, found = _term(q, k, table, call, mask, keep=True)
    fwd = forward(q, k, call, mask=mask, bias=term)
    core = core_vjp(q, k, v, d_output, call, fwd)
    d_term = core.d_logits  # 0 where a pair is not allowed
    zero = xp.zeros((), dtype=d_term.dtype, device=device)
    d_logits_e = _table_logits_vjp(d_term, found, table.shape[-2])  # (..., t_q, max_pos)
    d_pos = xp.where(found.inside, d_term * (found.at_ceil - found.at_floor), zero)
    d_gates = xp.cumulative_sum(d_pos, axis=-1)  # the transpose of the reverse sum
    d_scaled = d_gates * gates * (1.0 - gates)
    if allowed is not None:
        d_scaled = xp.where(allowed, d_scaled, zero)
    dq_g, dk_g = content_vjp(q, k, d_scaled * call.scale, allowed=fwd.allowed)
    dq_e = xp.matmul(d_logits_e, table)
    # (..., max_pos, d): a query whose row has no allowed key reads no table row (its NaN
    # stays out, as the content term's does)
    reads = None
    if allowed is not None:
        grid = xp.broadcast_to(allowed, (*allowed.shape[:-2], call.t_q, call.t_k))
        reads = xp.matrix_transpose(xp.any(grid, axis=-1, keepdims=True))
    d_table = masked_product(xp.matrix_transpose(d_logits_e), q, used=reads)
    return {"q": sum_to_shape(core.dq + dq_g + dq_e, q.shape),
            "k": sum_to_shape(core.dk + dk_g, k.shape),
            "v": sum_to_shape(core.dv, v.shape),
            "table": sum_to_shape(d_table, table.shape)}
