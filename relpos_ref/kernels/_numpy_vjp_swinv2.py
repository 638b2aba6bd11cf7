"""Swin v2's NumPy VJP kernel: Swin v1's, carried back through the MLP and the cosine.

Swin v2 is Swin v1 (`relpos_ref.schemes.swin`) at the cosine operands ``q_hat
tau`` and ``k_hat`` with the table ``16 sigma(MLP(c))`` (`relpos_ref.schemes.swinv2`).
This runs Swin v1's backward pass (`relpos_ref.kernels._numpy_vjps`'s window
bias: a block of rows at a time, the table's gradient from the skewed tile)
at those operands and that table, and hands the cotangents to the
specification's own chain through the MLP, the normalization and the logit
scale (`relpos_ref.schemes.swinv2._carried_back`), so no rule of the scheme is
written twice. What it covers, and hands back, is what
`relpos_ref.kernels._numpy_vjps` says of every kernel, and an additive mask
(``mask_penalty`` with a ``mask``: a dense bias, as the torch kernels decline it).
"""

from __future__ import annotations

import numpy as np

from ..gradients import check_d_output
from ..schemes import swinv2
from ._numpy_vjp import backward
from ._numpy_vjp_common import _covered, _ndarrays, _register
from ._numpy_vjps import _WindowBias

__all__: list[str] = []


@_register("swinv2")
def swinv2_attention_vjp(
    q, k, v, w1, b1, w2, /, *, d_output, window_height, window_width, pretrained_window=None,
    logit_scale=None, scale=None, mask=None, mask_penalty=None,
):
    if not _ndarrays(q, k, v, w1, b1, w2, d_output, mask,
                     *([logit_scale] if hasattr(logit_scale, "shape") else [])):
        return NotImplemented
    call = swinv2.swinv2_call(
        q, k, v, w1, b1, w2, window_height=window_height, window_width=window_width,
        pretrained_window=pretrained_window, logit_scale=logit_scale, scale=scale, mask=mask,
        mask_penalty=mask_penalty,
    )
    check_d_output(d_output, q, call, v.shape[-1], mask=mask)
    if mask is not None and mask_penalty is not None:
        return NotImplemented  # an additive mask: a dense bias, which the window term lacks
    options = {"window_height": window_height, "window_width": window_width,
               "pretrained_window": pretrained_window}
    table = swinv2.swinv2_table(w1, b1, w2, window_height, window_width,
                                pretrained_window=pretrained_window)
    q2, k2, *_ = swinv2._operands(q, k, logit_scale)
    q2, k2 = (np.asarray(x, dtype=q.dtype) for x in (q2, k2))
    if not _covered("swin", q2, call, mask, k2, v, d_output, table=table):
        return NotImplemented
    term = _WindowBias(table, int(window_height), int(window_width))
    core = backward(q2, k2, v, d_output, call, mask=mask, term=term)
    return swinv2._carried_back(q, k, v, w1, b1, w2, options, logit_scale, core,
                                term.gradient())
