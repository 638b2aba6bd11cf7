r"""CoPE's NumPy kernels: one product of ``q`` and ``k`` for its gates and its logits.

CoPE's term is read from the scaled logits themselves (`relpos_ref.schemes.cope`),
so the forward computes :math:`S = s\, q k^\top` once:

.. math::
    g = \sigma(S) \text{ where allowed, } 0 \text{ elsewhere}, \quad
    p = \text{the sums of } g \text{ from the end of each row}, \quad
    \bar p = \min(p, \text{max\_pos} - 1),

.. math::
    c = z_{\lfloor \bar p \rfloor} + \lambda\,(z_{\lfloor \bar p \rfloor + 1}
        - z_{\lfloor \bar p \rfloor}), \quad \lambda = \bar p - \lfloor \bar p \rfloor,
    \quad z = q e^\top,

then the NumPy kernels' masked softmax of :math:`S + c`
(`relpos_ref.kernels._numpy_blocks.softmax_in_place`: subnormal weights
flushed, a row with no allowed key zero) and its product with ``v``. The two
logits a pair interpolates are one complex number of twice the width, so one
``take_along_axis`` reads both. The VJP runs the same forward, keeping its
arrays, then: the weights' cotangent :math:`\bar c`, the table logits' by two
``bincount`` (the floor's share :math:`1 - \lambda`, the next integer's
:math:`\lambda`), the positions' :math:`\bar c\,(z_\lceil - z_\lfloor)` (0 at
an integer position, so where clamped), the gates' by a cumulative sum (the
transpose of the sums from the end) and the scaled logits'
:math:`\bar c + \bar g\, g (1 - g)`, which reach ``q`` and ``k`` by one
product each. Memory: a few ``(..., t_q, t_k)`` arrays, as the
specification's. A causal call without a mask (``q_offset >= 0``) runs
both a block of `ROWS` queries at a time against the keys up to the
block's last query only (about half of the grid at ``t_q = t_k``; a gate
after a row's query is 0, so the sums from the end of each row are the
whole grid's), each block's arrays kept for its own backward pass. What the
kernels cover, and hand back, is what `relpos_ref.kernels._numpy_vjps` says
of every kernel.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from ..attention import allowed_keys
from ..calls import Call, computes_in_float32
from ..gradients import check_d_output
from ..schemes import cope
from ..schemes._tables import table_logits
from ._numpy_blocks import softmax_in_place
from ._numpy_vjp import finite, sum_to
from ._numpy_vjp_common import _covered, _ndarrays, _register
from ._overflow import bounded

__all__ = ["ROWS", "cope_forward"]

#: Queries evaluated at a time by a causal call without a mask (no weights returned).
ROWS = 128

_WIDE = {np.dtype(np.float32): np.complex64, np.dtype(np.float64): np.complex128}


class _Kept(NamedTuple):
    """What the VJP reads of a forward: ``(*batch, t_q, t_k)`` arrays."""

    weights: Any
    gates: Any
    weight: Any  # lambda
    floor: Any  # the floor of the clamped position, an index
    slope: Any  # z at the ceiling minus z at the floor, 0 at an integer position


def _at_floor_and_ceil(z: np.ndarray, floor: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    # z[..., i, floor] and z[..., i, floor + 1] (the last column repeated after the table),
    # the pair one complex number: one take (at flat indices: 1.7 times take_along_axis's
    # speed at 8 x 1024 x 1024)
    padded = np.concatenate([z, z[..., -1:]], axis=-1)
    pairs = np.stack([padded[..., :-1], padded[..., 1:]], axis=-1)  # (..., t_q, n, 2)
    words = pairs.view(_WIDE[pairs.dtype])[..., 0]
    rows = np.arange(int(np.prod(words.shape[:-1])), dtype=np.intp) * words.shape[-1]
    found = np.take(words.reshape(-1), floor + rows.reshape(*words.shape[:-1], 1))
    found = found.view(z.dtype).reshape(*floor.shape, 2)
    return found[..., 0], found[..., 1]


def _term(scores: np.ndarray, allowed: Any, z: np.ndarray, max_pos: int, *,
          keep: bool) -> tuple[np.ndarray, _Kept | None]:
    # CoPE's term c of the scaled logits `scores` (read, not written), each gate 0 where not
    # `allowed` (None: every pair), and with `keep` what the VJP reads (its weights None)
    with np.errstate(over="ignore"):  # exp(-S) = inf: a gate of 0
        gates = np.exp(-scores)
    gates += 1.0
    np.reciprocal(gates, out=gates)
    if allowed is not None:
        gates *= allowed
    positions = np.cumsum(gates[..., ::-1], axis=-1)[..., ::-1]  # sums over the keys t >= j
    np.minimum(positions, max_pos - 1, out=positions)
    weight, whole = np.modf(positions)
    floor = whole.astype(np.intp)
    del positions, whole
    at_floor, at_ceil = _at_floor_and_ceil(z, floor)
    slope = np.subtract(at_ceil, at_floor)
    term = slope * weight
    term += at_floor
    if not keep:
        return term, None
    slope *= weight > 0  # d c / d p: 0 at an integer position (ceil = floor), so where clamped
    return term, _Kept(None, gates, weight, floor, slope)


def _forward(q: np.ndarray, k: np.ndarray, v: np.ndarray, table: np.ndarray, call: Call,
             mask: Any, *, keep: bool) -> tuple[np.ndarray, np.ndarray, _Kept | None]:
    # (out, weights, what the VJP reads)
    allowed = allowed_keys(call.t_q, call.t_k, mask=mask, causal=call.causal,
                           q_offset=call.q_offset, xp=call.xp, device=None)
    # the weights' batch: v's too only for the VJP (whose cotangent has the output's)
    shapes = [x.shape[:-2] for x in ((q, k, v, table) if keep else (q, k, table))]
    if allowed is not None:
        shapes.append(allowed.shape[:-2])
    batch = np.broadcast_shapes(*shapes)
    q = np.broadcast_to(q, (*batch, *q.shape[-2:]))
    scores = np.matmul(q, np.swapaxes(k, -1, -2))
    if scores.shape != (*batch, call.t_q, call.t_k) or not scores.flags.c_contiguous:
        scores = np.array(np.broadcast_to(scores, (*batch, call.t_q, call.t_k)), order="C")
    scores *= scores.dtype.type(call.scale)
    term, kept = _term(scores, allowed, table_logits(q, table), table.shape[-2], keep=keep)
    weights = softmax_in_place(scores, scale=1.0, bias=term, mask=mask, causal=call.causal,
                               q_offset=call.q_offset)
    del term
    out = np.matmul(weights, v)
    return out, weights, None if kept is None else kept._replace(weights=weights)


def _causal_rows(a: int, b: int, keys: int, q_offset: int) -> np.ndarray:
    # (b - a, keys): key j is allowed to row i where j <= i + q_offset; the masked ones lie
    # in the last b - a - 1 columns (those of the block's first row)
    edge = min(keys, b - a - 1)
    allowed = np.ones((b - a, keys), dtype=bool)
    allowed[:, keys - edge:] = (np.arange(keys - edge, keys)[None, :]
                                <= np.arange(a, b)[:, None] + q_offset)
    return allowed


def _causal_blocks(q: np.ndarray, k: np.ndarray, table: np.ndarray, call: Call, *,
                   keep: bool) -> Any:
    # a causal call without a mask, q_offset >= 0 (every row keeps key 0): `_forward`'s steps
    # a block of ROWS queries at a time, against the keys up to the block's last query only
    # (about half of the grid at t_q = t_k); a gate after a row's query is 0 in `_forward`,
    # so the sums from the end of each row are the same. Yields (a, b, keys, weights, kept)
    # for queries a .. b - 1 and keys 0 .. keys - 1; `q` has the weights' batch
    z = table_logits(q, table)
    scale = q.dtype.type(call.scale)
    k_t = np.swapaxes(k, -1, -2)
    for a in range(0, call.t_q, ROWS):
        b = min(a + ROWS, call.t_q)
        keys = min(call.t_k, b + call.q_offset)
        scores = np.matmul(q[..., a:b, :], k_t[..., :keys])
        scores *= scale
        term, kept = _term(scores, _causal_rows(a, b, keys, call.q_offset), z[..., a:b, :],
                           table.shape[-2], keep=keep)
        weights = softmax_in_place(scores, scale=1.0, bias=term, causal=True,
                                   q_offset=call.q_offset + a)
        del term
        yield a, b, keys, weights, None if kept is None else kept._replace(weights=weights)


def _causal_by_blocks(q: np.ndarray, k: np.ndarray, v: np.ndarray, table: np.ndarray,
                      call: Call) -> np.ndarray:
    # `_causal_blocks`' weights times their values
    batch = np.broadcast_shapes(*(x.shape[:-2] for x in (q, k, v, table)))
    q = np.broadcast_to(q, (*batch, *q.shape[-2:]))
    out = np.empty((*batch, call.t_q, v.shape[-1]), dtype=q.dtype)
    for a, b, keys, weights, _ in _causal_blocks(q, k, table, call, keep=False):
        np.matmul(weights, v[..., :keys, :], out=out[..., a:b, :])
    return out


def cope_forward(fallback: Any) -> Any:
    """CoPE's NumPy kernel: `_forward`, or `fallback` (the lowering's kernel) for the rest."""

    @computes_in_float32
    def kernel(q, k, v, table, /, *, scale=None, mask=None, causal=None, q_offset=None,
               return_weights=False):
        given = {"scale": scale, "mask": mask, "causal": causal, "q_offset": q_offset,
                 "return_weights": return_weights}
        if not _ndarrays(q, k, v, table, mask) or return_weights not in (True, False):
            return fallback(q, k, v, table, **given)
        call = cope.cope_call(q, k, v, table, scale=scale, mask=mask, causal=causal,
                              q_offset=q_offset)
        if (q.dtype not in _WIDE or not finite(q, k, v, table)
                or not bounded("cope", call, q, k, table=table)):
            return fallback(q, k, v, table, **given)
        if call.causal and mask is None and call.q_offset >= 0 and not return_weights:
            return _causal_by_blocks(q, k, v, table, call)
        out, weights, _ = _forward(q, k, v, table, call, mask, keep=False)
        return (out, weights) if return_weights else out

    kernel.__name__ = kernel.__qualname__ = "cope_attention"
    return kernel


def _backward(q: np.ndarray, k: np.ndarray, v: np.ndarray, table: np.ndarray,
              kept: _Kept, d_output: np.ndarray, scale: Any
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    # (dq, dk, dv, d_table) over the weights' batch, of rows q (the batch's) against keys k,
    # v, from what their forward kept
    weights = kept.weights
    dv = np.matmul(np.swapaxes(weights, -1, -2), d_output)
    d_logits = np.matmul(d_output, np.swapaxes(v, -1, -2))
    d_logits -= np.einsum("...ij,...ij->...i", d_logits, weights)[..., None]
    d_logits *= weights
    # the table logits: (1 - lambda) at the floor, lambda at the next integer
    max_pos, rows = table.shape[-2], int(np.prod(weights.shape[:-1]))
    start = (np.arange(rows) * (max_pos + 1)).reshape(*weights.shape[:-1], 1)
    at = (kept.floor + start).reshape(-1)
    to_next = (d_logits * kept.weight).reshape(-1)
    d_z = (np.bincount(at, weights=d_logits.reshape(-1) - to_next, minlength=rows * (max_pos + 1))
           + np.bincount(at + 1, weights=to_next, minlength=rows * (max_pos + 1)))
    d_z = d_z.astype(q.dtype).reshape(*weights.shape[:-1], max_pos + 1)[..., :max_pos]
    del at, to_next
    # the positions, then the gates: the transpose of the sums from the end of the row
    d_gates = np.cumsum(d_logits * kept.slope, axis=-1)
    gates = kept.gates
    d_gates *= gates
    d_gates *= 1.0 - gates
    d_logits += d_gates  # the scaled logits' cotangent (0 where a pair is not allowed)
    del d_gates
    dq = np.matmul(d_logits, k) * scale + np.matmul(d_z, table)
    dk = np.matmul(np.swapaxes(d_logits, -1, -2), q) * scale
    d_table = np.matmul(np.swapaxes(d_z, -1, -2), q)
    return dq, dk, dv, d_table


def _causal_vjp_by_blocks(q: np.ndarray, k: np.ndarray, v: np.ndarray, table: np.ndarray,
                          call: Call, d_output: np.ndarray
                          ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    # `_causal_blocks`' forward, kept, then `_backward`, block by block
    batch = np.broadcast_shapes(*(x.shape[:-2] for x in (q, k, v, table, d_output)))
    q = np.broadcast_to(q, (*batch, *q.shape[-2:]))
    d_output = np.broadcast_to(d_output, (*batch, *d_output.shape[-2:]))
    scale = q.dtype.type(call.scale)
    dq = np.empty(q.shape, dtype=q.dtype)
    dk = np.zeros((*batch, call.t_k, k.shape[-1]), dtype=q.dtype)
    dv = np.zeros((*batch, call.t_k, v.shape[-1]), dtype=q.dtype)
    d_table = np.zeros((*batch, *table.shape[-2:]), dtype=q.dtype)
    for a, b, keys, _, kept in _causal_blocks(q, k, table, call, keep=True):
        parts = _backward(q[..., a:b, :], k[..., :keys, :], v[..., :keys, :], table, kept,
                          d_output[..., a:b, :], scale)
        dq[..., a:b, :] = parts[0]
        dk[..., :keys, :] += parts[1]
        dv[..., :keys, :] += parts[2]
        d_table += parts[3]
    return dq, dk, dv, d_table


@_register("cope")
def cope_attention_vjp(q, k, v, table, /, *, d_output, scale=None, mask=None, causal=None,
                       q_offset=None):
    if not _ndarrays(q, k, v, table, d_output, mask):
        return NotImplemented
    call = cope.cope_call(q, k, v, table, scale=scale, mask=mask, causal=causal,
                          q_offset=q_offset)
    check_d_output(d_output, q, call, v.shape[-1], mask=mask)
    if not _covered("cope", q, call, mask, k, v, d_output, table=table):
        return NotImplemented
    if call.causal and mask is None and call.q_offset >= 0:
        dq, dk, dv, d_table = _causal_vjp_by_blocks(q, k, v, table, call, d_output)
    else:
        _, weights, kept = _forward(q, k, v, table, call, mask, keep=True)
        batch = weights.shape[:-2]
        dq, dk, dv, d_table = _backward(
            np.broadcast_to(q, (*batch, *q.shape[-2:])), k, v, table, kept,
            np.broadcast_to(d_output, (*batch, *d_output.shape[-2:])),
            q.dtype.type(call.scale))
    return {"q": sum_to(dq, q.shape), "k": sum_to(dk, k.shape), "v": sum_to(dv, v.shape),
            "table": sum_to(d_table, table.shape)}
