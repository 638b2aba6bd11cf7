"""NumPy kernels: each scheme's attention, equal to the specification, in less time.

Every kernel takes the arguments of the scheme's ``*_attention``, validates
them with the scheme's own ``<scheme>_call`` (so bad input gets the
specification's message), and returns ``NotImplemented`` for what it does
not cover: arrays that are not plain ``numpy.ndarray``, ``method="definition"``
(the specification's own algorithm by definition), and the few cases named
below. What they share (`relpos_ref.kernels._numpy_blocks`):

- ``q k^T`` once, into an array the kernel owns, then the softmax composed
  and normalized in place, one row block in cache at a time, the mask and
  the causal structure applied per block (no ``(t_q, t_k)`` boolean); under
  ``causal`` a block computes only the keys one of its rows may see;
- a scheme's term one row block at a time where it can be (the per-distance
  products of general, music and Transformer-XL; DeBERTa's gathers; the 2D
  grid's row and column terms), or as a read-only view of one row of
  distances (scalar biases), so that no ``(h, t_q, t_k)`` term is built;
- Shaw's clipped table fused into the softmax, its relative values binned on
  the way (`clipped_table_softmax`).

Plain attention, absolute, RoPE, bias, T5 and ALiBi have one kernel, read
from their distance form (`relpos_ref.kernels._numpy_forms`): the content
operands it gives and its biases by distance as a view.

The results are fresh arrays, like the specification's. A call whose logits
could overflow, by a bound from the magnitudes of ``q``, ``k`` and the
tables (`relpos_ref.kernels._overflow`), goes to the specification, which
makes an overflow NaN: a kernel scales and sums in its own order, and would
read a ``-inf`` from an overflow as a masked key.

``VJP_KERNELS`` holds the backward passes (`relpos_ref.kernels._numpy_vjps`,
built on `relpos_ref.kernels._numpy_vjp`), ``BLOCKED_KERNELS`` the blocked
evaluation by these kernels, a tile of queries at a time
(`relpos_ref.kernels._numpy_blocked`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .._validate import check_bool
from ..calls import Call, computes_in_float32
from ..schemes import (
    deberta,
    fire,
    forgetting,
    general,
    grid2d,
    music,
    shaw,
    swin,
    swinv2,
    transformer_xl,
)
from ..schemes._tables import table_logits
from . import (
    _numpy_fire,  # the forward's bias rows
    _numpy_forgetting,  # the forward's bias rows; registers the forgetting bias's VJP
    _numpy_vjp_biases,  # noqa: F401  (registers KERPLE's, Sandwich's, xPos's)
    _numpy_vjp_fire,  # noqa: F401  (registers FIRE's)
    _numpy_vjp_swinv2,  # noqa: F401  (registers Swin v2's)
)
from ._numpy_blocked import blocked_kernels
from ._numpy_blocks import (
    AddRows,
    block_logits,
    clipped_table_softmax,
    kernel_arrays,
    softmax_in_place,
)
from ._numpy_cope import cope_forward
from ._numpy_forms import FORM_SCHEMES, form_kernel
from ._numpy_terms import deberta_terms, grid_terms, one_sided_rows, window_bias
from ._numpy_vjps import VJP_KERNELS
from ._overflow import bounded

__all__ = ["BLOCKED_KERNELS", "KERNELS", "VJP_KERNELS"]

#: Scheme name (as in `relpos_ref.catalog`) -> its NumPy kernel.
KERNELS: dict[str, Callable[..., Any]] = {}


def _register(scheme: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    # The conventions' 16-bit rule, as the specification applies it: float32 inside.
    def add(kernel: Callable[..., Any]) -> Callable[..., Any]:
        KERNELS[scheme] = computes_in_float32(kernel)
        return kernel

    return add


def _ndarrays(*arrays: Any) -> bool:
    return kernel_arrays(*arrays)


def _finite(*values: Any) -> bool:
    # The kernels multiply values by weights directly: equal to the specification's
    # `weighted_sum` (a masked pair contributes nothing, even NaN) when every value is
    # finite. Otherwise the call goes to the specification.
    return all(a is None or bool(np.isfinite(a).all()) for a in values)


def _scores(q: np.ndarray, k: np.ndarray, *terms: Any) -> np.ndarray:
    # q k^T as a fresh C-contiguous array of the full broadcast shape of every term.
    content = np.matmul(q, np.swapaxes(k, -1, -2))
    shape = np.broadcast_shapes(content.shape, *(t.shape for t in terms if t is not None))
    if shape != content.shape or not content.flags.c_contiguous:
        content = np.array(np.broadcast_to(content, shape), order="C")
    return content


def _attend(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    call: Call,
    *,
    mask: Any,
    return_weights: Any,
    position: Any = None,
    bias: Any = None,
    add_position: AddRows | None = None,
    add_bias: AddRows | None = None,
) -> Any:
    return_weights = check_bool("return_weights", return_weights)
    if (mask is not None or call.causal) and not _finite(v):
        return NotImplemented
    weights = softmax_in_place(
        _scores(q, k, mask, position, bias),
        scale=call.scale,
        position=position,
        add_position=add_position,
        bias=bias,
        add_bias=add_bias,
        mask=mask,
        causal=call.causal,
        q_offset=call.q_offset,
    )
    out = np.matmul(weights, v)
    return (out, weights) if return_weights else out


# -- plain attention, absolute, RoPE and the scalar biases: their distance form ----


for _name in FORM_SCHEMES:
    _register(_name)(form_kernel(_name, _attend))
del _name
KERNELS["cope"] = cope_forward(KERNELS["cope"])  # one product of q and k, not two


@_register("forgetting")  # its form's dense bias made a block of rows at a time instead
def forgetting_attention(q, k, v, f, /, *, scale=None, mask=None, causal=None, q_offset=None,
                         return_weights=False):
    if not _ndarrays(q, k, v, f, mask):
        return NotImplemented
    call = forgetting.forgetting_call(q, k, v, f, scale=scale, mask=mask, causal=causal,
                                      q_offset=q_offset)
    if not bounded("forgetting", call, q, k, f=f) or not _finite(f):
        return NotImplemented  # a closed (-inf) or NaN gate: the specification reads each range
    big_f = forgetting.forgetting_cumsum(f)
    # the scores take the bias's batch (heads where only f has them)
    batch = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], big_f.shape[:-1])
    add = _numpy_forgetting.add_bias_rows(big_f, call.q_offset, q.dtype)
    return _attend(np.broadcast_to(q, (*batch, *q.shape[-2:])), k, v, call, mask=mask,
                   add_bias=add, return_weights=return_weights)


@_register("fire")  # its bias a block of rows at a time (`_numpy_fire`), not the form's dense one
def fire_attention(q, k, v, w1, b1, w2, /, *, b2=None, c=0.1, L=512.0, eps=fire.EPS, scale=None,
                   mask=None, causal=None, q_offset=None, return_weights=False):
    scalars = {n: x for n, x in (("c", c), ("L", L)) if hasattr(x, "shape")}
    if not _ndarrays(q, k, v, w1, b1, w2, b2, mask, *scalars.values()):
        return NotImplemented
    call = fire.fire_call(q, k, v, w1, b1, w2, b2=b2, c=c, L=L, eps=eps, scale=scale, mask=mask,
                          causal=causal, q_offset=q_offset)
    if not bounded("fire", call, q, k) or not _finite(w1, b1, w2, b2, *scalars.values()):
        return NotImplemented  # a NaN weight makes the specification's bias NaN
    named = {"w1": w1, "b1": b1, "w2": w2, "c": c, "L": L, "eps": eps}
    if b2 is not None:
        named["b2"] = b2
    add = None
    if call.t_q and call.t_k:
        add = _numpy_fire.add_fire_rows(named, call, q.dtype)
        if add is None:
            return NotImplemented  # the MLP's input is not finite: the specification's NaNs
    # the scores take the bias's heads where only the MLP has them
    heads = fire._check_mlp(w1, b1, w2, b2)
    batch = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], () if heads is None else (heads,))
    return _attend(np.broadcast_to(q, (*batch, *q.shape[-2:])), k, v, call, mask=mask,
                   add_bias=add, return_weights=return_weights)


@_register("swin")
def swin_attention(
    q, k, v, table, /, *, window_height, window_width, scale=None, mask=None,
    return_weights=False,
):
    if not _ndarrays(q, k, v, table, mask):
        return NotImplemented
    call = swin.swin_call(
        q, k, v, table, window_height=window_height, window_width=window_width, scale=scale,
        mask=mask,
    )
    if not bounded("swin", call, q, k):
        return NotImplemented
    add = window_bias(table, window_height, window_width)
    return _attend(q, k, v, call, mask=mask, add_bias=add, return_weights=return_weights)


@_register("swinv2")
def swinv2_attention(
    q, k, v, w1, b1, w2, /, *, window_height, window_width, pretrained_window=None,
    logit_scale=None, scale=None, mask=None, mask_penalty=None, return_weights=False,
):
    # Swin v1's kernel on the MLP's table (and cosine attention's operands)
    if not _ndarrays(q, k, v, w1, b1, w2, logit_scale, mask):
        return NotImplemented
    if mask is not None and mask_penalty is not None:  # an additive mask: the specification
        return NotImplemented
    call = swinv2.swinv2_call(
        q, k, v, w1, b1, w2, window_height=window_height, window_width=window_width,
        pretrained_window=pretrained_window, logit_scale=logit_scale, scale=scale, mask=mask,
        mask_penalty=mask_penalty,
    )
    q2, k2, *_ = swinv2._operands(q, k, logit_scale)
    if not bounded("swin", call, q2, k2):
        return NotImplemented
    table = swinv2.swinv2_table(w1, b1, w2, window_height, window_width,
                                pretrained_window=pretrained_window)
    add = window_bias(table, window_height, window_width)
    return _attend(q2, k2, v, call, mask=mask, add_bias=add, return_weights=return_weights)


@_register("grid2d")
def grid2d_attention(
    q, k, v, row_table, col_table, /, *, height, width, scale=None, mask=None, causal=None,
    method="efficient", return_weights=False,
):
    if not _ndarrays(q, k, v, row_table, col_table, mask):
        return NotImplemented
    call = grid2d.grid2d_call(
        q, k, v, row_table, col_table, height=height, width=width, scale=scale, mask=mask,
        causal=causal, method=method,
    )
    if method != "efficient" or not bounded("grid2d", call, q, k, row_table=row_table,
                                            col_table=col_table):
        return NotImplemented
    add = grid_terms(q, row_table, col_table, height=height, width=width)
    return _attend(q, k, v, call, mask=mask, add_position=add, return_weights=return_weights)


# -- per-distance tables: one GEMM per row block ------------------------------


@_register("general")
def general_attention(
    q, k, v, table, /, *, scale=None, mask=None, causal=None, q_offset=None,
    order="past_to_future", method="efficient", return_weights=False,
):
    if not _ndarrays(q, k, v, table, mask):
        return NotImplemented
    call = general.general_call(
        q, k, v, table, scale=scale, mask=mask, causal=causal, q_offset=q_offset, order=order,
        method=method,
    )
    if method != "efficient" or not bounded("general", call, q, k, table=table):
        return NotImplemented
    t_max = (table.shape[-2] + 1) // 2
    ordered = table if order == "past_to_future" else table[..., ::-1, :]
    add = block_logits(q, ordered, q_offset=call.q_offset, low=1 - t_max)
    return _attend(q, k, v, call, mask=mask, add_position=add, return_weights=return_weights)


@_register("music")
def music_attention(
    q, k, v, table, value_table=None, /, *, scale=None, mask=None, causal=None, q_offset=None,
    beyond="clip", method="efficient", return_weights=False,
):
    if not _ndarrays(q, k, v, table, value_table, mask):
        return NotImplemented
    call = music.music_call(
        q, k, v, table, value_table, scale=scale, mask=mask, causal=causal, q_offset=q_offset,
        beyond=beyond, method=method,
    )
    if method != "efficient" or call.t_q * call.t_k == 0 or not _finite(value_table):
        return NotImplemented
    if (mask is not None or call.causal) and not _finite(v):
        return NotImplemented
    if not bounded("music", call, q, k, table=table):
        return NotImplemented
    r_min = -(call.t_q - 1) - call.q_offset
    extended = one_sided_rows(table, r_min, call.t_k - 1 - call.q_offset, beyond)
    add = block_logits(q, extended, q_offset=call.q_offset, low=r_min)
    return_weights = check_bool("return_weights", return_weights)
    out, weights = _attend(q, k, v, call, mask=mask, add_position=add, return_weights=True)
    if value_table is not None:
        out = out + music.music_values(weights, value_table, q_offset=call.q_offset,
                                       beyond=beyond)
    return (out, weights) if return_weights else out


@_register("transformer_xl")
def transformer_xl_attention(
    q, k, v, w_r, content_bias=None, position_bias=None, /, *, clamp_len=None, base=10000.0,
    scale=None, mask=None, causal=None, q_offset=None, method="efficient", return_weights=False,
):
    if not _ndarrays(q, k, v, w_r, content_bias, position_bias, mask):
        return NotImplemented
    call = transformer_xl.transformer_xl_call(
        q, k, v, w_r, content_bias, position_bias, scale=scale, mask=mask, causal=causal,
        q_offset=q_offset, clamp_len=clamp_len, method=method,
    )
    if method != "efficient" or call.t_q * call.t_k == 0 or not bounded(
            "transformer_xl", call, q, k, w_r=w_r, content_bias=content_bias,
            position_bias=position_bias):
        return NotImplemented
    # (a) + (c) = (q + u) . k in the one content GEMM, as Transformer-XL's own code does;
    # (b) + (d) = (q + v) . p_delta one block at a time from the t_q + t_k - 1 projected
    # sinusoids (no (t_q, t_q + t_k - 1) matrix, no rel_shift pass).
    import array_api_compat.numpy as xp

    deltas = transformer_xl.grid_distances(
        call.t_q, call.t_k, q_offset=call.q_offset, clamp_len=clamp_len, xp=xp
    )
    p_delta = transformer_xl.transformer_xl_rows(deltas, w_r, base=base)
    per_head = transformer_xl._per_head_vector
    content_query = q if content_bias is None else q + per_head(content_bias)
    query = q if position_bias is None else q + per_head(position_bias)
    add = block_logits(
        query, p_delta, q_offset=call.q_offset, low=-(call.t_q - 1) - call.q_offset
    )
    return _attend(content_query, k, v, call, mask=mask, add_position=add,
                   return_weights=return_weights)


@_register("deberta")
def deberta_attention(
    q, k, v, key_table=None, query_table=None, /, *, max_position=None, scale=None, mask=None,
    causal=None, q_offset=None, method="efficient", return_weights=False,
):
    if not _ndarrays(q, k, v, key_table, query_table, mask):
        return NotImplemented
    call = deberta.deberta_call(
        q, k, v, key_table, query_table, max_position=max_position, scale=scale, mask=mask,
        causal=causal, q_offset=q_offset, method=method,
    )
    tables = [t for t in (key_table, query_table) if t is not None]
    if method != "efficient" or call.t_q * call.t_k == 0 or not tables or not bounded(
            "deberta", call, q, k, key_table=key_table, query_table=query_table):
        return NotImplemented
    add = deberta_terms(q, k, key_table, query_table, call, max_position)
    return _attend(q, k, v, call, mask=mask, add_position=add, return_weights=return_weights)


# -- Shaw: the clipped table fused into the softmax ---------------------------


@_register("shaw")
def shaw_attention(
    q, k, v, key_table, value_table=None, /, *, scale=None, mask=None, causal=None,
    q_offset=None, beyond="clip", method="efficient", return_weights=False, max_past=None,
):
    if not _ndarrays(q, k, v, key_table, value_table, mask):
        return NotImplemented
    call = shaw.shaw_call(
        q, k, v, key_table, value_table, scale=scale, mask=mask, causal=causal,
        q_offset=q_offset, beyond=beyond, method=method, max_past=max_past,
    )
    past, future = shaw.two_sided_extent("key_table", key_table.shape[-2], key_table.shape,
                                         max_past)
    return_weights = check_bool("return_weights", return_weights)
    if method != "efficient" or beyond != "clip" or not _finite(value_table):
        return NotImplemented
    if (mask is not None or call.causal) and not _finite(v):
        return NotImplemented
    if not bounded("shaw", call, q, k, key_table=key_table):
        return NotImplemented
    fused = clipped_table_softmax(
        _scores(q, k, mask),
        table_logits(q, key_table),
        max_distance=future,
        max_past=past,
        q_offset=call.q_offset,
        scale=call.scale,
        mask=mask,
        causal=call.causal,
        bins=value_table is not None,
    )
    if fused is None:  # a band wider than the keys, or table logits that could overflow
        return NotImplemented
    weights, bins = fused
    out = np.matmul(weights, v)
    if value_table is not None:  # bins @ a^V, one GEMM for a shared table
        values = table_logits(bins, np.swapaxes(value_table, -1, -2))
        out = out + values if values.shape != out.shape else np.add(out, values, out=out)
    return (out, weights) if return_weights else out


#: Scheme name -> `relpos_ref.blocked.blocked_attention` of that scheme by its kernel above,
#: a tile of queries at a time (`relpos_ref.kernels._numpy_blocked`).
BLOCKED_KERNELS = blocked_kernels(KERNELS)
