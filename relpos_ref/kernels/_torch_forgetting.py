r"""The forgetting bias (FoX) on torch without the lowering's float64 bias.

The lowering hands the specification's dense bias on, made as the
specification makes it: :math:`F_{p_i} - F_j` in float64, a ``where`` for the
causal region, then rounded; three float64 ``(h, t_q, t_k)`` arrays (64 MiB
each at 8 heads and t = 1024), which the allocator maps afresh on each call.
`forgetting_bias_rounded` makes the same values on the causal region with one
subtraction of the float64 cumulative sums into an array of the call's dtype
(rounded once, as the specification rounds); the other entries, which the
causal mask drops, are :math:`F_{p_i} - F_j` too (a block of `ROWS` rows at
a time, into the thread's kept array on the CPU:
`relpos_ref.kernels._torch_blocks.kept_array`). It makes them with the
keys reversed, the order of `relpos_ref.kernels._torch_form`'s block engine,
which evaluates the call with that bias as its dense term: a causal call's
blocks of rows read only the keys their queries may see, about half the
pairs. The VJP is the engine's backward pass: the bias reaches ``f`` only
through its cotangent's row sums and column sums
(`relpos_ref.schemes.forgetting.forgetting_f_gradient_from_sums`).
"""

from __future__ import annotations

from typing import Any

import torch

from .. import _xp
from ..calls import Call
from ..lowering import DistanceForm
from ..schemes import forgetting
from ._torch_blocks import kept_array
from ._torch_form import form_attention
from ._torch_form_vjp import form_vjp

__all__ = ["ROWS", "forgetting_bias_rounded", "forgetting_fused", "forgetting_vjp_fused"]

#: Rows of the bias subtracted at a time: torch computes a float64 block, then rounds it (the
#: whole bias at once took a float64 (h, t_q, t_k) temporary: 64 MiB at 8 heads, t = 1024).
ROWS = 64


def forgetting_bias_rounded(f: Any, call: Call, dtype: Any) -> Any:
    """The bias ``(..., h, t_q, t_k)`` of a validated call, in `dtype`, rounded once, keys
    reversed (column ``j~`` holds key ``t_k - 1 - j~``): on the CPU the thread's kept array
    (`relpos_ref.kernels._torch_blocks.kept_array`), to be read before its next call.

    Equal to `relpos_ref.schemes.forgetting.forgetting_bias` where ``j <= p_i``.

    Examples
    --------
    >>> import math
    >>> import torch
    >>> from relpos_ref.calls import resolve_call
    >>> x = torch.zeros(3, 2, dtype=torch.float64)
    >>> call = resolve_call(x, x, x, scale=None, mask=None, causal=True, q_offset=0)
    >>> got = forgetting_bias_rounded(torch.zeros(3), call, torch.float64)  # gates 1/2
    >>> (got.flip(-1) / math.log(0.5)).round().abs()  # log 2 a step; above the diagonal:
    tensor([[0., 1., 2.],
            [1., 0., 1.],
            [2., 1., 0.]], dtype=torch.float64)
    """
    big_f = forgetting.forgetting_cumsum(f)
    n = big_f.shape[-1]
    at_query = (torch.arange(call.t_q, device=f.device) + call.q_offset).clamp_(0, n - 1)
    out = kept_array(torch.empty((), dtype=dtype, device=f.device),
                     (*big_f.shape[:-1], call.t_q, call.t_k))
    keys = big_f[..., None, :call.t_k].flip(-1)
    wide = None  # one block of rows in the sums' dtype, rounded into `out`
    for a in range(0, call.t_q, ROWS):
        rows = at_query[a:a + ROWS]
        if wide is None or wide.shape[-2] != rows.shape[0]:
            wide = big_f.new_empty((*big_f.shape[:-1], rows.shape[0], call.t_k))
        torch.sub(big_f[..., rows, None], keys, out=wide)
        out[..., a:a + ROWS, :].copy_(wide)
    return out


def _sums(d_bias: Any, wide: Any) -> tuple[Any, Any]:
    # the row sums (..., t_q) and the column sums (..., t_k), keys back in order, of `d_bias`
    # (keys reversed) in `wide`, a block of ROWS rows at a time (no `wide` copy of the whole)
    t_q = d_bias.shape[-2]
    rows = d_bias.new_empty(d_bias.shape[:-1], dtype=wide)
    cols = d_bias.new_zeros((*d_bias.shape[:-2], d_bias.shape[-1]), dtype=wide)
    block = None
    for a in range(0, t_q, ROWS):
        part = d_bias[..., a:a + ROWS, :]
        if block is None or block.shape != part.shape:
            block = part.new_empty(part.shape, dtype=wide)
        block.copy_(part)
        torch.sum(block, dim=-1, out=rows[..., a:a + ROWS])
        cols += block.sum(dim=-2)
    return rows, cols.flip(-1)


def forgetting_fused(q: Any, k: Any, v: Any, tables: dict[str, Any], call: Call,
                     mask: Any) -> Any:
    """`relpos_ref.forgetting_attention` of a validated, finite, bounded call, no gradient.

    `tables` is ``{"f": f}``; ``t_q, t_k, d >= 1``.

    Examples
    --------
    >>> import torch
    >>> import relpos_ref as rp
    >>> from relpos_ref.schemes.forgetting import forgetting_call
    >>> q, k, v = torch.randn(3, 2, 5, 4, dtype=torch.float64).unbind(0)
    >>> f = torch.randn(2, 5, dtype=torch.float64)
    >>> call = forgetting_call(q, k, v, f, scale=None, mask=None, causal=None, q_offset=None)
    >>> with rp.kernels.disabled():
    ...     want = rp.forgetting_attention(q, k, v, f)
    >>> bool(torch.allclose(forgetting_fused(q, k, v, {"f": f}, call, None), want))
    True
    """
    bias = forgetting_bias_rounded(tables["f"], call, q.dtype)
    return form_attention(DistanceForm(q, k, v, call, mask), dense=bias)


def forgetting_vjp_fused(q: Any, k: Any, v: Any, tables: dict[str, Any], call: Call,
                         mask: Any, d_output: Any) -> dict[str, Any]:
    """`relpos_ref.forgetting_attention_vjp` of a validated, finite, bounded call.

    Examples
    --------
    >>> import torch
    >>> import relpos_ref as rp
    >>> from relpos_ref.schemes.forgetting import forgetting_call
    >>> q, k, v, d_output = torch.randn(4, 2, 5, 4, dtype=torch.float64).unbind(0)
    >>> f = torch.randn(2, 5, dtype=torch.float64)
    >>> call = forgetting_call(q, k, v, f, scale=None, mask=None, causal=None, q_offset=None)
    >>> got = forgetting_vjp_fused(q, k, v, {"f": f}, call, None, d_output)
    >>> with rp.kernels.disabled():
    ...     want = rp.forgetting_attention_vjp(q, k, v, f, d_output=d_output)
    >>> all(torch.allclose(got[n], want[n]) for n in want)
    True
    """
    f = tables["f"]
    grads = form_vjp(DistanceForm(q, k, v, call, mask), d_output,
                     dense=forgetting_bias_rounded(f, call, q.dtype))
    d_bias = grads["dense"]  # keys reversed
    wide = forgetting._accumulator(_xp.array_namespace(f), f.device)  # float64 where it can
    rows, cols = _sums(d_bias, wide)
    d_f = forgetting.forgetting_f_gradient_from_sums(f, rows, cols, call.q_offset)
    return {"q": grads["q"], "k": grads["k"], "v": grads["v"], "f": d_f}
