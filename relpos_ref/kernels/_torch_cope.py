r"""CoPE on torch, one product of ``q`` and ``k`` for its gates and its logits.

CoPE's term is read from the scaled logits themselves (the gates
:math:`\sigma(s\, q_i \cdot k_t)`), so through the lowering's dense term
(`relpos_ref._lowerings.cope_form`) and SDPA a call computes
:math:`q k^\top` twice, and its generic array code pays for broadcasting.
This evaluates a call whose gradient no one records, with the keys reversed
(:math:`\tilde k`, key ``t_k - 1 - j`` in column ``j``) so that the
positions are a forward cumulative sum, in the specification's order:

.. math::
    S = s\, q \tilde k^\top, \quad
    g = \sigma(S) \text{ where allowed, } 0 \text{ elsewhere}, \quad
    \tilde p = \operatorname{cumsum}(g), \quad
    \bar p = \min(\tilde p, \text{max\_pos} - 1)

.. math::
    c = z_{\lfloor \bar p \rfloor} + \lambda\,(z_{\lfloor \bar p \rfloor + 1}
        - z_{\lfloor \bar p \rfloor}), \quad \lambda = \bar p - \lfloor \bar p \rfloor,
    \quad z = q e^\top, \qquad
    \text{out} = \operatorname{softmax}(S + c \text{ where allowed}, -\infty
    \text{ elsewhere})\, \tilde v

(``z`` gets its last column again after it: at ``max_pos - 1`` the weight is
0). In float32 the two logits a pair reads, :math:`z_n` and :math:`z_{n+1}`,
are one 64-bit word, so one gather finds both. A row with no allowed key
gets zeros. Memory: a few ``(..., t_q, t_k)`` arrays, as the lowering's.

A causal call without a mask (``q_offset >= 0``, so every row keeps a key)
runs the same steps a block of `ROWS` queries at a time, against the keys up
to the block's last query only: about half of the grid at ``t_q = t_k``, and
arrays of ``ROWS`` rows; so does the VJP kernel, each block's forward arrays
kept for that block's backward pass (the whole grid's for any other call).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch

from ..attention import allowed_keys
from ..calls import Call
from ..gradients import sum_to_shape
from ..schemes._tables import table_logits

__all__ = ["ROWS", "cope_fused", "cope_vjp_fused"]

#: Queries evaluated at a time by a causal call without a mask.
ROWS = 128


def _at_floor_and_ceil(z: Any, floor: Any) -> tuple[Any, Any]:
    # z[..., i, floor] and z[..., i, floor + 1], the last column repeated after the table
    padded = torch.cat([z, z[..., -1:]], dim=-1)
    pairs = torch.stack([padded[..., :-1], padded[..., 1:]], dim=-1)  # (..., t_q, n, 2)
    if pairs.dtype == torch.float32:  # both in one 64-bit word: one gather
        words = pairs.view(torch.int64).squeeze(-1)
        found = torch.gather(words, -1, floor).view(torch.float32)
        found = found.unflatten(-1, (floor.shape[-1], 2))
        return found[..., 0], found[..., 1]
    return (torch.gather(pairs[..., 0], -1, floor), torch.gather(pairs[..., 1], -1, floor))


class _Forward(NamedTuple):
    """What a call's forward leaves for its VJP, keys reversed: ``(*batch, t_q, t_k)`` arrays."""

    weights: Any  # the softmax (0 where a pair is not allowed)
    gates: Any  # sigma(S) where allowed, 0 elsewhere
    weight: Any  # lambda, the interpolation weight
    floor: Any  # int64, the floor of the clamped position
    slope: Any  # z at the ceiling minus z at the floor, 0 where the clamp holds
    empty: Any  # (*batch, t_q, 1) rows with no allowed key, or None


def _add_term(scores: Any, gates: Any, z: Any, max_pos: int, *,
              keep: bool) -> tuple[Any, Any, Any] | None:
    # CoPE's term added into `scores` (keys reversed) from the gates, 0 where a pair is not
    # allowed; with `keep`, (weight, floor, slope) for the VJP
    positions = torch.cumsum(gates, dim=-1)  # sum over the keys t >= j
    positions.clamp_(max=max_pos - 1)
    floor = positions.to(torch.int64)  # the floor: positions are not negative
    weight = positions.frac_()
    at_floor, at_ceil = _at_floor_and_ceil(z, floor)
    if not keep:
        scores.add_(torch.lerp(at_floor, at_ceil, weight, out=weight))
        return None
    scores.add_(torch.lerp(at_floor, at_ceil, weight))
    # d c / d p: 0 at an integer position (ceil = floor), so where clamped too
    return weight, floor, (at_ceil - at_floor).mul_(weight > 0)


def _forward(q: Any, k: Any, v: Any, table: Any, call: Call, mask: Any, *,
             keep: bool) -> tuple[Any, _Forward | None]:
    # the output, and with `keep` what the VJP reads
    allowed = allowed_keys(call.t_q, call.t_k, mask=mask, causal=call.causal,
                           q_offset=call.q_offset, xp=call.xp, device=q.device)
    shapes = [x.shape[:-2] for x in (q, k, v, table)]
    empty = None
    if allowed is not None:
        shapes.append(allowed.shape[:-2])
        # a row with no allowed key sees every key here (no NaN), and gets zeros below
        empty = ~torch.any(allowed, dim=-1, keepdim=True)
        allowed = (allowed | empty).flip(-1)
    batch = torch.broadcast_shapes(*shapes)
    q = q.expand(*batch, *q.shape[-2:])
    k_reversed = k.flip(-2).expand(*batch, *k.shape[-2:])
    v_reversed = v.flip(-2).expand(*batch, *v.shape[-2:])
    scores = torch.matmul(q * call.scale, k_reversed.transpose(-1, -2))
    gates = torch.sigmoid(scores)
    if allowed is not None:
        gates.mul_(allowed)
    found = _add_term(scores, gates, table_logits(q, table), table.shape[-2], keep=keep)
    if not keep:
        gates = None  # not held through the softmax
    if allowed is not None:
        zero = torch.zeros((), dtype=scores.dtype, device=scores.device)
        scores.add_(torch.where(allowed, zero, torch.full((), -math.inf, dtype=scores.dtype,
                                                          device=scores.device)))
    weights = torch.softmax(scores, dim=-1)
    del scores
    out = torch.matmul(weights, v_reversed)
    if empty is not None:
        out = torch.where(empty, torch.zeros((), dtype=out.dtype, device=out.device), out)
    kept = _Forward(weights, gates, *found, empty) if keep else None
    return out, kept


def cope_fused(q: Any, k: Any, v: Any, tables: dict[str, Any], call: Call, mask: Any) -> Any:
    """`relpos_ref.cope_attention` of a validated, finite, bounded call, no gradient recorded.

    Parameters
    ----------
    q, k, v : tensors ``(..., t_q, d)``, ``(..., t_k, d)``, ``(..., t_k, d_v)``
        float32 or float64, one device; ``t_q, t_k, d >= 1``.
    tables : dict
        ``{"table": e}``, ``(max_pos, d)`` or ``(h, max_pos, d)``.
    call : Call
        The validated call (scale, causal, q_offset).
    mask : bool tensor or None

    Returns
    -------
    tensor ``(*batch, t_q, d_v)``

    Examples
    --------
    >>> import torch
    >>> import relpos_ref as rp
    >>> from relpos_ref.schemes.cope import cope_call
    >>> q, k, v = torch.randn(3, 2, 5, 4, dtype=torch.float64).unbind(0)
    >>> table = torch.randn(3, 4, dtype=torch.float64)
    >>> call = cope_call(q, k, v, table, scale=None, mask=None, causal=None, q_offset=None)
    >>> out = cope_fused(q, k, v, {"table": table}, call, None)
    >>> with rp.kernels.disabled():
    ...     bool(torch.allclose(out, rp.cope_attention(q, k, v, table)))
    True
    """
    if call.causal and mask is None and call.q_offset >= 0:
        return _causal_by_blocks(q, k, v, tables["table"], call)
    return _forward(q, k, v, tables["table"], call, mask, keep=False)[0]


def _causal_block(q: Any, k_reversed: Any, v_reversed: Any, z: Any, max_pos: int,
                  rows: tuple[int, int], keys: int, q_offset: int, *,
                  keep: bool) -> tuple[Any, _Forward | None]:
    # `_forward`'s steps for queries i0 .. i1 - 1 (`q` scaled, `z` their table logits) against
    # keys 0 .. keys - 1 (`k_reversed`, `v_reversed`: those keys, reversed), causal: column c
    # is key keys - 1 - c, allowed where keys - 1 - c <= i + q_offset, so the masked pairs are
    # in the first i1 - i0 - 1 columns (the block's first row's)
    i0, i1 = rows
    scores = torch.matmul(q, k_reversed.mT)
    edge = min(keys, i1 - i0 - 1)
    first = keys - 1 - q_offset - torch.arange(i0, i1, device=q.device)[:, None]
    allowed = torch.arange(edge, device=q.device) >= first
    gates = torch.sigmoid(scores)
    gates[..., :edge].mul_(allowed)
    found = _add_term(scores, gates, z, max_pos, keep=keep)
    kept = None if found is None else _Forward(None, gates, *found, None)
    scores[..., :edge].masked_fill_(~allowed, -math.inf)
    weights = torch.softmax(scores, dim=-1)
    out = torch.matmul(weights, v_reversed)
    return out, None if kept is None else kept._replace(weights=weights)


def _causal_operands(q: Any, k: Any, v: Any, table: Any, *rest: Any) -> tuple[Any, ...]:
    # q (scaled later), k and v reversed, all over the batch of every array; then z = q e^T
    batch = torch.broadcast_shapes(*(x.shape[:-2] for x in (q, k, v, table, *rest)))
    q = q.expand(*batch, *q.shape[-2:])
    return (batch, q, k.flip(-2).expand(*batch, *k.shape[-2:]),
            v.flip(-2).expand(*batch, *v.shape[-2:]), table_logits(q, table))


def _causal_by_blocks(q: Any, k: Any, v: Any, table: Any, call: Call) -> Any:
    # a causal call without a mask, q_offset >= 0 (every row keeps key 0): `_forward`'s steps
    # a block of ROWS queries at a time, against the keys up to the block's last query only
    # (in reversed order, the last columns): about half of the grid at t_q = t_k. The masked
    # gates before a row's first key are 0 in `_forward`'s cumulative sum, so the sums are
    # the same
    batch, q, k_reversed, v_reversed, z = _causal_operands(q, k, v, table)
    q = q * call.scale
    out = torch.empty((*batch, call.t_q, v.shape[-1]), dtype=q.dtype, device=q.device)
    for i0 in range(0, call.t_q, ROWS):
        i1 = min(call.t_q, i0 + ROWS)
        keys = min(call.t_k, i1 + call.q_offset)  # keys 0 .. keys - 1: columns t_k - keys ..
        out[..., i0:i1, :] = _causal_block(
            q[..., i0:i1, :], k_reversed[..., call.t_k - keys:, :],
            v_reversed[..., call.t_k - keys:, :], z[..., i0:i1, :], table.shape[-2],
            (i0, i1), keys, call.q_offset, keep=False)[0]
    return out


def _backward(q: Any, k_reversed: Any, v_reversed: Any, table: Any, kept: _Forward,
              d_output: Any, scale: float) -> tuple[Any, Any, Any, Any]:
    # (dq, dk, dv, d_table) over the weights' batch, dk and dv of the keys reversed; `q` the
    # batch's (unscaled), `d_output` with the weights' rows
    weights = kept.weights
    dv = torch.matmul(weights.transpose(-1, -2), d_output)
    d_logits = torch.matmul(d_output, v_reversed.transpose(-1, -2))
    d_logits.sub_((d_logits * weights).sum(dim=-1, keepdim=True)).mul_(weights)
    # the table logits: (1 - lambda) at the floor, lambda at the next integer
    max_pos = table.shape[-2]
    d_z = torch.zeros(*weights.shape[:-1], max_pos + 1, dtype=q.dtype, device=q.device)
    at_next = d_logits * kept.weight
    d_z.scatter_add_(-1, kept.floor, d_logits - at_next)
    d_z.scatter_add_(-1, kept.floor + 1, at_next)
    d_z = d_z[..., :max_pos]
    del at_next
    # the positions, then the gates: a sum from the end of the reversed row
    d_gates = torch.cumsum((d_logits * kept.slope).flip(-1), dim=-1).flip(-1)
    gates = kept.gates
    d_logits.add_(d_gates.mul_(gates).mul_(1.0 - gates))  # the scaled logits' cotangent
    del d_gates
    dq = torch.matmul(d_logits, k_reversed).mul_(scale) + torch.matmul(d_z, table)
    dk = torch.matmul(d_logits.transpose(-1, -2), q).mul_(scale)
    d_table = torch.matmul(d_z.transpose(-1, -2), q)
    return dq, dk, dv, d_table


def _causal_vjp_by_blocks(q: Any, k: Any, v: Any, table: Any, call: Call, d_output: Any
                          ) -> tuple[Any, Any, Any, Any]:
    # `_causal_by_blocks`'s forward, kept, then `_backward`, a block of ROWS queries at a time
    batch, q, k_reversed, v_reversed, z = _causal_operands(q, k, v, table, d_output)
    d_output = d_output.expand(*batch, *d_output.shape[-2:])
    q_scaled = q * call.scale
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    dk = torch.zeros((*batch, call.t_k, k.shape[-1]), dtype=q.dtype, device=q.device)
    dv = torch.zeros((*batch, call.t_k, v.shape[-1]), dtype=q.dtype, device=q.device)
    d_table = torch.zeros((*batch, *table.shape[-2:]), dtype=q.dtype, device=q.device)
    for i0 in range(0, call.t_q, ROWS):
        i1 = min(call.t_q, i0 + ROWS)
        keys = min(call.t_k, i1 + call.q_offset)
        columns = slice(call.t_k - keys, None)
        _, kept = _causal_block(q_scaled[..., i0:i1, :], k_reversed[..., columns, :],
                                v_reversed[..., columns, :], z[..., i0:i1, :],
                                table.shape[-2], (i0, i1), keys, call.q_offset, keep=True)
        parts = _backward(q[..., i0:i1, :], k_reversed[..., columns, :],
                          v_reversed[..., columns, :], table, kept, d_output[..., i0:i1, :],
                          call.scale)
        dq[..., i0:i1, :] = parts[0]
        dk[..., columns, :] += parts[1]
        dv[..., columns, :] += parts[2]
        d_table += parts[3]
    return dq, dk.flip(-2), dv.flip(-2), d_table


def cope_vjp_fused(q: Any, k: Any, v: Any, tables: dict[str, Any], call: Call, mask: Any,
                   d_output: Any) -> dict[str, Any]:
    r"""`relpos_ref.cope_attention_vjp` of a validated, finite, bounded call.

    The forward again (`cope_fused`, keeping its ``(t_q, t_k)`` arrays), then,
    keys reversed, with :math:`w` the weights and :math:`\bar o` `d_output`:
    :math:`\bar{\tilde v} = w^\top \bar o`, :math:`\bar c = w\,(\bar o \tilde
    v^\top - \operatorname{rowsum})`, the table logits
    :math:`\bar z_{i,\lfloor \bar p \rfloor} \mathrel{+}= (1 - \lambda) \bar c`
    and :math:`\bar z_{i,\lfloor \bar p \rfloor + 1} \mathrel{+}= \lambda \bar c`
    (a scatter-add each), the positions :math:`\bar p = \bar c\,(z_\lceil -
    z_\lfloor)` where not clamped, the gates by the transpose of the forward
    cumulative sum (a sum from the end of the row), and the scaled logits
    :math:`\bar S = \bar c + \bar g\, g (1 - g)`, which reach ``q`` and ``k``
    through one product each. Each gradient is summed to its argument's shape.

    Examples
    --------
    >>> import torch
    >>> import relpos_ref as rp
    >>> from relpos_ref.schemes.cope import cope_call
    >>> q, k, v, d_output = torch.randn(4, 2, 5, 4, dtype=torch.float64).unbind(0)
    >>> table = torch.randn(3, 4, dtype=torch.float64)
    >>> call = cope_call(q, k, v, table, scale=None, mask=None, causal=None, q_offset=None)
    >>> got = cope_vjp_fused(q, k, v, {"table": table}, call, None, d_output)
    >>> with rp.kernels.disabled():
    ...     want = rp.cope_attention_vjp(q, k, v, table, d_output=d_output)
    >>> all(torch.allclose(got[n], want[n]) for n in want)
    True
    """
    table = tables["table"]
    if call.causal and mask is None and call.q_offset >= 0:
        dq, dk, dv, d_table = _causal_vjp_by_blocks(q, k, v, table, call, d_output)
    else:
        _, kept = _forward(q, k, v, table, call, mask, keep=True)
        batch = kept.weights.shape[:-2]
        if kept.empty is not None:  # a row with no key passes no gradient
            d_output = torch.where(kept.empty, torch.zeros((), dtype=d_output.dtype,
                                                           device=d_output.device), d_output)
        dq, dk, dv, d_table = _backward(
            q.expand(*batch, *q.shape[-2:]), k.flip(-2).expand(*batch, *k.shape[-2:]),
            v.flip(-2).expand(*batch, *v.shape[-2:]), table, kept,
            d_output.expand(*batch, *d_output.shape[-2:]), call.scale)
        dk, dv = dk.flip(-2), dv.flip(-2)
    return {"q": sum_to_shape(dq, q.shape), "k": sum_to_shape(dk, k.shape),
            "v": sum_to_shape(dv, v.shape), "table": sum_to_shape(d_table, table.shape)}
