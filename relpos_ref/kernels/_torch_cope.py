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
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ..attention import allowed_keys
from ..calls import Call
from ..schemes._tables import table_logits

__all__ = ["cope_fused"]


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
    table = tables["table"]
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
    positions = torch.sigmoid(scores)
    if allowed is not None:
        positions.mul_(allowed)
    positions = torch.cumsum(positions, dim=-1)  # sum over the keys t >= j
    positions.clamp_(max=table.shape[-2] - 1)
    floor = positions.to(torch.int64)  # the floor: positions are not negative
    weight = positions.frac_()
    at_floor, at_ceil = _at_floor_and_ceil(table_logits(q, table), floor)
    del floor
    scores.add_(torch.lerp(at_floor, at_ceil, weight, out=weight))
    del at_floor, at_ceil, weight, positions
    if allowed is not None:
        zero = torch.zeros((), dtype=scores.dtype, device=scores.device)
        scores.add_(torch.where(allowed, zero, torch.full((), -math.inf, dtype=scores.dtype,
                                                          device=scores.device)))
    out = torch.matmul(torch.softmax(scores, dim=-1), v_reversed)
    if empty is not None:
        out = torch.where(empty, torch.zeros((), dtype=out.dtype, device=out.device), out)
    return out
