r"""FIRE on torch: its bias made row by row from the distances, then SDPA.

The lowering hands on FIRE's bias as a dense ``(H, t_q, t_k)`` array: the
specification's input ``x`` of every pair in float64, its segment among the
MLP's breakpoints, two coefficients gathered per pair and head
(`relpos_ref._fire_pieces`), and then a ``where`` for the causal mask. Here
(`fire_bias_reversed`), the same values with less work:

- A query whose position is at most ``|L|`` is normalised by ``psi(|L|)``:
  its row of the bias is a function of the distance alone, the same for every
  such row. Those rows are read from one row of ``t_q + t_k - 1`` distances,
  a window each, as a copy.
- The other rows, a block at a time, evaluate ``x`` from the distances' logs
  (one division per pair), its segment (one binary search) and each head's
  ``A x + B``. A block's keys after its last query's position are masked
  without being evaluated.
- The causal mask is a segment of its own (slope 0, intercept ``-inf``): no
  ``where`` over the ``(H, t_q, t_k)`` bias.

The rows are made in reverse order (row ``w`` holds query ``t_q - 1 - w``):
query ``i``'s window of distances then starts at ``t_q - 1 - i``, so that the
windows are one strided view (torch has no negative strides). A causal call
without a mask (``q_offset >= 0``) gives SDPA the queries reversed too (a
copy of ``q``, not of the bias) and reverses its output back; any other
call, and the VJP, reverse the bias's rows back (one copy of it) and let
`relpos_ref.kernels._torch_sdpa.sdpa_terms` mask. Each pair's ``x`` is the
specification's: ``psi(|p_i - j|)`` is the same function of the distance
wherever it is computed, divided by the same normaliser in float64 and
rounded once.

The VJP is torch's autograd through that one SDPA call (the bias a leaf),
and the bias's cotangent goes back through the MLP by its pieces
(`relpos_ref.kernels._fire_vjp`).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from .. import _xp
from .._fire_pieces import call_options, input_factors, pieces, segments
from ..calls import Call
from ..schemes import _fire_inputs, fire
from ._fire_vjp import table_gradients
from ._torch_sdpa import Terms, sdpa_terms

__all__ = ["ROWS", "fire_bias_reversed", "fire_fused", "fire_vjp_fused"]

#: Rows of the bias made at a time where each row has its own normaliser.
ROWS = 64


def fire_bias_reversed(named: dict[str, Any], call: Call, *, masked: bool) -> Any:
    """FIRE's bias ``(H, t_q, t_k)``, rows reversed, or ``None`` where ``x`` is not finite.

    `named` holds the tables ``w1``, ``b1``, ``w2`` (finite, of one dtype:
    the bias's) and the options ``b2``, ``c``, ``L`` and ``eps`` where given; ``H``
    is 1 where no table has a head axis. Row ``w`` holds query
    ``t_q - 1 - w``. With `masked`, keys after a query's position are
    ``-inf`` (the causal mask of a call with ``q_offset >= 0``, whose rows each
    keep a key).

    Examples
    --------
    >>> import torch
    >>> from relpos_ref.calls import resolve_call
    >>> from relpos_ref.schemes.fire import fire_bias
    >>> w1, b1, w2 = torch.ones(2, 1), torch.tensor([0.0, -0.5]), torch.tensor([[1.0, -2.0]])
    >>> x = torch.zeros(4, 2)
    >>> call = resolve_call(x, x, x, scale=None, mask=None, causal=False, q_offset=0)
    >>> got = fire_bias_reversed({"w1": w1, "b1": b1, "w2": w2, "L": 2.0}, call, masked=False)
    >>> torch.equal(got.flip(-2), fire_bias(w1, b1, w2, 4, 4, L=2.0))
    True
    """
    c, big_l, eps = call_options(named)
    w1 = named["w1"]
    dtype, device = w1.dtype, w1.device
    xp = _xp.array_namespace(w1)
    t_q, t_k, q_offset = call.t_q, call.t_k, call.q_offset
    found = input_factors(t_q, t_k, c=c, L=big_l, eps=eps, q_offset=q_offset, xp=xp,
                          dtype=dtype, device=device)
    if found is None:
        return None  # the specification's NaN or infinite inputs
    # row w (query t_q - 1 - w) reads logs[w + j] at key j, at distance w + j - n_0
    logs, norm, shared = found.logs, found.norms.flip(0), found.shared
    offset = torch.arange(t_q + t_k - 1, device=device) - (t_q - 1 + q_offset)
    bounds, columns = pieces(w1, named["b1"], named["w2"], named.get("b2"))
    heads, future = columns.shape[0] // 2, columns.shape[1]
    # one more segment for a masked pair: A = 0, B = -inf
    columns = torch.cat([columns, torch.cat([torch.zeros(heads, 1, dtype=dtype, device=device),
                                             torch.full((heads, 1), -math.inf, dtype=dtype,
                                                        device=device)])], dim=1)
    out = torch.empty((heads, t_q, t_k), dtype=dtype, device=device)
    dense = t_q - shared  # rows 0 .. dense - 1: each query its own normaliser
    if shared:
        x = (logs / norm[-1]).to(dtype)
        segment = segments(xp, bounds, x)
        if masked:
            segment = torch.where(offset > 0, future, segment)
        row = columns[:heads, segment] * x + columns[heads:, segment]
        out[:, dense:, :] = row.unfold(-1, t_k, 1)[:, dense:, :]
    windows, after = logs.unfold(0, t_k, 1), offset.unfold(0, t_k, 1)
    for w0 in range(0, dense, ROWS):
        w1_ = min(dense, w0 + ROWS)
        keys = t_k
        if masked:  # keys after this block's last query (row w0) are masked in every row
            keys = min(t_k, max(0, t_q - w0 + q_offset))
            out[:, w0:w1_, keys:] = -math.inf
        # (the division's result may come in the overlapping windows' column order)
        x = (windows[w0:w1_, :keys] / norm[w0:w1_, None]).to(dtype).contiguous()
        segment = segments(xp, bounds, x)
        if masked:
            segment = torch.where(after[w0:w1_, :keys] > 0, future, segment)
        picked = torch.index_select(columns, 1, segment.reshape(-1))
        picked = picked.reshape(2 * heads, w1_ - w0, keys)
        torch.addcmul(picked[heads:], picked[:heads], x, out=out[:, w0:w1_, :keys])
    return out


def _shaped(bias: Any, named: dict[str, Any]) -> Any:
    # (t_q, t_k) where no table has a head axis: one bias for every head, as fire_bias's
    heads = fire._check_mlp(named["w1"], named["b1"], named["w2"], named.get("b2"))
    return bias if heads is not None else bias[0]


def fire_fused(q: Any, k: Any, v: Any, named: dict[str, Any], call: Call, mask: Any) -> Any:
    """`relpos_ref.fire_attention` of a validated, finite, bounded call, no gradient.

    `named`: the tables and the options given (`fire_bias_reversed`).

    ``NotImplemented`` where the MLP's input is not finite (``c``, ``L`` and
    ``eps`` make a normaliser 0 or tiny): the specification evaluates that unit
    by unit.

    Examples
    --------
    >>> import torch
    >>> import relpos_ref as rp
    >>> from relpos_ref.schemes.fire import fire_call
    >>> q, k, v = torch.randn(3, 2, 5, 4, dtype=torch.float64).unbind(0)
    >>> w1, b1, w2 = torch.randn(3, 1), torch.randn(3), torch.randn(2, 3)
    >>> w1, b1, w2 = (t.double() for t in (w1, b1, w2))
    >>> call = fire_call(q, k, v, w1, b1, w2, b2=None, c=0.1, L=2.0, eps=1e-6, scale=None,
    ...                  mask=None, causal=None, q_offset=None)
    >>> with rp.kernels.disabled():
    ...     want = rp.fire_attention(q, k, v, w1, b1, w2, L=2.0)
    >>> got = fire_fused(q, k, v, {"w1": w1, "b1": b1, "w2": w2, "L": 2.0}, call, None)
    >>> bool(torch.allclose(got, want))
    True
    """
    masked = call.causal and mask is None and call.q_offset >= 0
    bias = fire_bias_reversed(named, call, masked=masked)
    if bias is None:
        return NotImplemented
    bias = _shaped(bias, named)
    if masked:  # the causal mask is in the bias: SDPA on the queries reversed, as its rows
        out = sdpa_terms(q.flip(-2), k, v, call._replace(causal=False),
                         terms=Terms(bias=bias))
        return out.flip(-2)
    return sdpa_terms(q, k, v, call, terms=Terms(bias=bias.flip(-2)), mask=mask)


def fire_vjp_fused(q: Any, k: Any, v: Any, named: dict[str, Any], call: Call, mask: Any,
                   d_output: Any) -> Any:
    """`relpos_ref.fire_attention_vjp` of a validated, finite, bounded call.

    ``NotImplemented`` where the MLP's input is not finite.

    Examples
    --------
    >>> import torch
    >>> import relpos_ref as rp
    >>> from relpos_ref.schemes.fire import fire_call
    >>> q, k, v, d_output = torch.randn(4, 2, 5, 4, dtype=torch.float64).unbind(0)
    >>> w1, b1, w2 = (torch.randn(s, dtype=torch.float64) for s in ((3, 1), (3,), (2, 3)))
    >>> call = fire_call(q, k, v, w1, b1, w2, b2=None, c=0.1, L=2.0, eps=1e-6, scale=None,
    ...                  mask=None, causal=None, q_offset=None)
    >>> got = fire_vjp_fused(q, k, v, {"w1": w1, "b1": b1, "w2": w2, "L": 2.0}, call, None,
    ...                      d_output)
    >>> with rp.kernels.disabled():
    ...     want = rp.fire_attention_vjp(q, k, v, w1, b1, w2, d_output=d_output, L=2.0)
    >>> all(torch.allclose(got[n], want[n]) for n in want)
    True
    """
    bias = fire_bias_reversed(named, call, masked=False)
    if bias is None:
        return NotImplemented
    c, big_l, eps = call_options(named)
    xp = _xp.array_namespace(q)
    wide = _fire_inputs._wide(xp, q.dtype, q.device, call.t_q, call.t_k, call.q_offset)
    parts = _fire_inputs._parts(xp, call.t_q, call.t_k, c, big_l, eps, call.q_offset, wide,
                                q.device)
    leaves = [x.detach().requires_grad_(True)
              for x in (q, k, v, _shaped(bias, named).flip(-2))]
    with torch.enable_grad():
        out = sdpa_terms(*leaves[:3], call, terms=Terms(bias=leaves[3]), mask=mask)
        dq, dk, dv, d_bias = torch.autograd.grad(out, leaves, d_output.expand(out.shape))
    tables = {n: named[n] for n in ("w1", "b1", "w2", "b2") if n in named}
    more = table_gradients(parts["x"].to(q.dtype), d_bias, tables, parts, c, big_l, q.dtype)
    return {"q": dq, "k": dk, "v": dv, **more}
