r"""FIRE's NumPy VJP kernel: plain attention's backward pass with the lowering's bias.

The bias is the lowering's (`relpos_ref._fire_pieces`); plain attention's
backward pass with that dense bias (`relpos_ref.kernels._numpy_vjp.backward`)
gives its cotangent, which `relpos_ref.kernels._fire_vjp.table_gradients`
carries back through the MLP by its pieces to the tables, ``c`` and ``L``.
What it covers, and hands back, is what `relpos_ref.kernels._numpy_vjps`
says of every kernel, and an input ``x`` that is not finite (``c`` or ``L``
out of range).
"""

from __future__ import annotations

import numpy as np

from .._fire_pieces import mlp_by_pieces
from ..gradients import check_d_output
from ..schemes import fire
from ..schemes._fire_mlp import _check_mlp
from ._fire_vjp import table_gradients
from ._numpy_vjp import backward
from ._numpy_vjp_common import _covered, _FullTerms, _grads, _ndarrays, _register

__all__: list[str] = []


@_register("fire")
def fire_attention_vjp(
    q, k, v, w1, b1, w2, /, *, d_output, b2=None, c=0.1, L=512.0, eps=fire.EPS, scale=None,
    mask=None, causal=None, q_offset=None,
):
    if not _ndarrays(q, k, v, w1, b1, w2, b2, d_output, mask,
                     *(x for x in (c, L) if hasattr(x, "shape"))):
        return NotImplemented
    call = fire.fire_call(q, k, v, w1, b1, w2, b2=b2, c=c, L=L, eps=eps, scale=scale,
                          mask=mask, causal=causal, q_offset=q_offset)
    check_d_output(d_output, q, call, v.shape[-1], mask=mask)
    tables = {"w1": w1, "b1": b1, "w2": w2, **({} if b2 is None else {"b2": b2})}
    if not _covered("fire", q, call, mask, k, v, d_output, **tables):
        return NotImplemented
    heads = _check_mlp(w1, b1, w2, b2)
    wide = fire._wide(np, q.dtype, None, call.t_q, call.t_k, call.q_offset)
    parts = fire._parts(np, call.t_q, call.t_k, c, L, float(eps), call.q_offset, wide, None)
    x = parts["x"].astype(q.dtype)
    if not np.isfinite(x).all():
        return NotImplemented  # c or L out of range: the specification's NaNs
    bias = mlp_by_pieces(x, w1, b1, w2, b2)  # (H, t_q, t_k)
    term = _FullTerms(None, bias if heads is not None else bias[0], call.scale)
    core = backward(q, k, v, d_output, call, mask=mask, term=term)
    d_bias = term.gradients(call.scale)["bias"]
    more = table_gradients(x, d_bias, tables, parts, c, L, q.dtype)
    return _grads(q, k, v, core, **more)
