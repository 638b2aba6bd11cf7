"""NumPy VJP kernels of the extrapolation schemes (KERPLE, Sandwich, xPos), beside `_numpy_vjps`.

Each is a bias by distance: one row per distance of the grid
(`_numpy_vjp_common._DistanceBias`, read through a Toeplitz view, its gradient the
column sums of the skewed tile), and KERPLE's parameters get theirs from
those sums times the kernel's derivatives by distance. xPos is RoPE's: plain
attention's backward pass at the scaled, rotated operands, carried back by the
transposed rotation at the same scales. What they cover, and
hand back, is what `relpos_ref.kernels._numpy_vjps` says of every kernel.
"""

from __future__ import annotations

import numpy as np

from ..gradients import check_d_output
from ..schemes import kerple, sandwich, xpos
from ._numpy_vjp import backward, sum_to
from ._numpy_vjp_common import (
    _by_distance_row,
    _covered,
    _DistanceBias,
    _distances,
    _grads,
    _ndarrays,
    _register,
)

__all__: list[str] = []


@_register("kerple")
def kerple_attention_vjp(
    q, k, v, /, *, d_output, r1=None, r2=None, kernel="log", scale=None, mask=None,
    causal=None, q_offset=None,
):
    if not _ndarrays(q, k, v, r1, r2, d_output, mask):
        return NotImplemented
    call, used1, used2 = kerple.kerple_call(
        q, k, v, r1=r1, r2=r2, kernel=kernel, scale=scale, mask=mask, causal=causal,
        q_offset=q_offset,
    )
    check_d_output(d_output, q, call, v.shape[-1], mask=mask)
    if not _covered("kerple", q, call, mask, k, v, d_output, r1=used1, r2=used2):
        return NotImplemented
    row = _by_distance_row(
        lambda t_q, t_k, off: kerple.kerple_bias(used1, used2, t_q, t_k, q_offset=off,
                                                 kernel=kernel),
        call,
    )
    if not np.isfinite(row).all():
        return NotImplemented  # parameters out of their domain: the specification's NaNs
    term = _DistanceBias(row)
    core = backward(q, k, v, d_output, call, mask=mask, term=term)
    r_min, n = _distances(call)
    a = np.abs(np.arange(r_min, r_min + n)).astype(np.float64)
    d1, d2 = kerple._kernel_gradients(np, a, used1.astype(np.float64),
                                      used2.astype(np.float64), kernel)
    sums = term.sums.astype(np.float64)  # (heads of the row, n)
    out = {}
    for name, used, d in (("r1", used1, d1), ("r2", used2, d2)):
        total = (sums * d).sum(axis=-1)
        out[name] = (total if used.shape[0] == total.shape[0] else
                     total.sum(keepdims=True)).astype(q.dtype)
    return _grads(q, k, v, core, **out)


@_register("sandwich")
def sandwich_attention_vjp(
    q, k, v, /, *, d_output, d_bar=128, start=0, scale=None, mask=None, causal=None,
    q_offset=None,
):
    if not _ndarrays(q, k, v, d_output, mask):
        return NotImplemented
    call, ratios = sandwich.sandwich_call(
        q, k, v, d_bar=d_bar, start=start, scale=scale, mask=mask, causal=causal,
        q_offset=q_offset,
    )
    check_d_output(d_output, q, call, v.shape[-1], mask=mask)
    if not _covered("sandwich", q, call, mask, k, v, d_output):
        return NotImplemented
    row = _by_distance_row(
        lambda t_q, t_k, off: sandwich.sandwich_bias(ratios, t_q, t_k, q_offset=off,
                                                     d_bar=d_bar, start=start),
        call,
    )
    core = backward(q, k, v, d_output, call, mask=mask, term=_DistanceBias(row))
    return _grads(q, k, v, core)


@_register("xpos")
def xpos_attention_vjp(
    q, k, v, /, *, d_output, scale=None, mask=None, causal=None, q_offset=None, **rotation,
):
    if not _ndarrays(q, k, v, d_output, mask) or not set(rotation) <= set(xpos.ROTATION):
        return NotImplemented  # an unknown keyword: the specification names it
    call = xpos.xpos_call(q, k, v, scale=scale, mask=mask, causal=causal, q_offset=q_offset,
                          **rotation)
    check_d_output(d_output, q, call, v.shape[-1], mask=mask)
    q_rot, k_rot = xpos.xpos_pair(q, k, call, **rotation)
    if not _covered("plain", q_rot, call, mask, k_rot, v, d_output):
        return NotImplemented
    core = backward(q_rot, k_rot, v, d_output, call, mask=mask)
    dq, dk = xpos.xpos_pair(sum_to(core.dq, q.shape), sum_to(core.dk, k.shape), call,
                            inverse=True, **rotation)
    return {"q": dq, "k": dk, "v": sum_to(core.dv, v.shape)}
