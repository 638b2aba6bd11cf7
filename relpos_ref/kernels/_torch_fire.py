r"""FIRE on torch: its bias made row by row from the distances, then the block engine.

The lowering hands on FIRE's bias as a dense ``(H, t_q, t_k)`` array: the
specification's input ``x`` of every pair in float64, its segment among the
MLP's breakpoints, two coefficients gathered per pair and head
(`relpos_ref._fire_pieces`), and then a ``where`` for the causal mask. Here
(`fire_bias_keys_reversed`), the same values with less work:

- A query whose position is at most ``|L|`` is normalised by ``psi(|L|)``:
  its row of the bias is a function of the distance alone, the same for every
  such row. Those rows are read from one row of ``t_q + t_k - 1`` distances,
  a window each, as a copy.
- The other rows, a block at a time, evaluate ``x`` from the distances' logs
  (one division per pair), its segment (one binary search) and each head's
  ``A x + B``. In a causal call, a block's keys after its last query's
  position are not evaluated.

The keys are made in reverse order (column ``j~`` holds key ``t_k - 1 -
j~``), the order of `relpos_ref.kernels._torch_form`'s block engine: query
``i``'s window of distances then starts at ``i`` in the distances' logs
reversed, so that the windows are one strided view (torch has no negative
strides), and the engine takes the bias as it is made (its ``dense``), with
no copy. The engine masks, and in a causal call each block of rows reads
only the keys its queries may see: about half the pairs. Each pair's ``x``
is the specification's: ``psi(|p_i - j|)`` is the same function of the
distance wherever it is computed, divided by the same normaliser in float64
and rounded once.

The VJP is the engine's backward pass with that bias (`relpos_ref.kernels.
_torch_form_vjp`, its gradient in the same order), and the bias's cotangent
goes back through the MLP by its pieces a block of rows at a time
(`mlp_vjp_by_blocks`: each pair's input made again as the bias made it, the
keys a causal block's rows cannot see skipped, sums by segment as
`relpos_ref.kernels._fire_vjp` makes them).
"""

from __future__ import annotations

from typing import Any

import torch

from .. import _xp
from .._fire_pieces import (
    broadcast_tables,
    call_options,
    input_factors,
    live_sums,
    pieces,
    segments,
    units,
)
from ..calls import Call
from ..lowering import DistanceForm
from ..schemes import _fire_inputs, fire
from ._fire_vjp import sums_by_segment, tables_from_unit_gradients, unit_gradients
from ._torch_blocks import kept_array
from ._torch_form import form_attention
from ._torch_form_vjp import form_vjp

__all__ = ["ROWS", "fire_bias_keys_reversed", "fire_fused", "fire_vjp_fused",
           "mlp_vjp_by_blocks"]

#: Rows of the bias made at a time where each row has its own normaliser.
ROWS = 64


def fire_bias_keys_reversed(named: dict[str, Any], call: Call, found: Any = None) -> Any:
    """FIRE's bias ``(H, t_q, t_k)``, keys reversed, or ``None`` where ``x`` is not finite.

    `named` holds the tables ``w1``, ``b1``, ``w2`` (finite, of one dtype:
    the bias's) and the options ``b2``, ``c``, ``L`` and ``eps`` where given; ``H``
    is 1 where no table has a head axis; `found` the input's factors where
    already made (`relpos_ref._fire_pieces.input_factors`). Column ``j~`` holds key
    ``t_k - 1 - j~`` (the block engine's order, `relpos_ref.kernels._torch_form`); on the
    CPU it is the thread's kept array (`relpos_ref.kernels._torch_blocks.kept_array`), to
    be read before its next call.
    In a causal call, the keys after the last query of a block of rows (the
    rows sharing one normaliser, then blocks of `ROWS`) are left unwritten:
    the engine masks them.

    Examples
    --------
    >>> import torch
    >>> from relpos_ref.calls import resolve_call
    >>> from relpos_ref.schemes.fire import fire_bias
    >>> w1, b1, w2 = torch.ones(2, 1), torch.tensor([0.0, -0.5]), torch.tensor([[1.0, -2.0]])
    >>> x = torch.zeros(4, 2)
    >>> call = resolve_call(x, x, x, scale=None, mask=None, causal=False, q_offset=0)
    >>> got = fire_bias_keys_reversed({"w1": w1, "b1": b1, "w2": w2, "L": 2.0}, call)
    >>> torch.equal(got.flip(-1), fire_bias(w1, b1, w2, 4, 4, L=2.0))
    True
    """
    found = _factors(named, call) if found is None else found
    if found is None:
        return None  # the specification's NaN or infinite inputs
    w1 = named["w1"]
    dtype = w1.dtype
    xp = _xp.array_namespace(w1)
    t_q, t_k = call.t_q, call.t_k
    logs, norm, shared = found.logs.flip(0), found.norms, found.shared
    bounds, columns = pieces(w1, named["b1"], named["w2"], named.get("b2"))
    heads = columns.shape[0] // 2
    out = kept_array(w1, (heads, t_q, t_k))  # (the thread's kept array on the CPU)
    if shared:  # rows 0 .. shared - 1: one normaliser, a function of the distance alone
        x = (logs / norm[0]).to(dtype)
        segment = segments(xp, bounds, x)
        row = columns[:heads, segment] * x + columns[heads:, segment]
        first = t_k - _seen(call, shared)
        out[:, :shared, first:] = row.unfold(-1, t_k, 1)[:, :shared, first:]
    windows = logs.unfold(0, t_k, 1)
    for i0 in range(shared, t_q, ROWS):
        i1 = min(t_q, i0 + ROWS)
        first, x = _block_inputs(windows, norm, call, i0, i1, dtype)
        segment = segments(xp, bounds, x)
        picked = torch.index_select(columns, 1, segment.reshape(-1))
        picked = picked.reshape(2 * heads, i1 - i0, t_k - first)
        torch.addcmul(picked[heads:], picked[:heads], x, out=out[:, i0:i1, first:])
    return out


def _factors(named: dict[str, Any], call: Call) -> Any:
    # the input's factors (`input_factors`) in the wide dtype, or None where not finite. Entry
    # (i, j~) is key t_k - 1 - j~, at distance t_k - 1 - j~ - i - q_offset: it reads the
    # logs reversed at i + j~, so row i's window starts at i (a strided view)
    c, big_l, eps = call_options(named)
    w1 = named["w1"]
    return input_factors(call.t_q, call.t_k, c=c, L=big_l, eps=eps, q_offset=call.q_offset,
                         xp=_xp.array_namespace(w1), dtype=w1.dtype, device=w1.device)


def _seen(call: Call, i1: int) -> int:
    # the keys the rows before i1 may see, the last columns with the keys reversed
    return min(call.t_k, max(0, i1 + call.q_offset)) if call.causal else call.t_k


def _block_inputs(windows: Any, norm: Any, call: Call, i0: int, i1: int, dtype: Any
                  ) -> tuple[int, Any]:
    # rows i0 .. i1 - 1's inputs x, rounded once to `dtype`, on the keys those rows may see
    # (columns `first` ..): the bias and its VJP read the same x, so the same segments.
    # `windows` (t_q, t_k): the distances' logs reversed, a window per row
    first = call.t_k - _seen(call, i1)
    # (the division's result may come in the overlapping windows' column order)
    return first, (windows[i0:i1, first:] / norm[i0:i1, None]).to(dtype).contiguous()


def mlp_vjp_by_blocks(d_bias: Any, named: dict[str, Any], call: Call, found: Any) -> dict:
    r"""FIRE's tables', ``c``'s and ``L``'s gradients from the bias's cotangent, keys reversed.

    `d_bias` ``(H, t_q, t_k)`` (``H`` 1 where no table has a head axis) holds
    key ``t_k - 1 - j~`` in column ``j~``, as `fire_bias_keys_reversed` made the
    bias; `found` the input's factors (`relpos_ref._fire_pieces.input_factors`).
    A block of `ROWS` rows at a time, each pair's input ``x`` made again as the
    bias was (so its segment is the same), and, in a causal call, only the keys
    its rows may see (the others' cotangent is 0): :math:`\bar x_p = \sum_h
    \bar b_{hp} A_{h s_p}` summed along each row against :math:`\psi` and
    :math:`\partial \psi / \partial c` of the distance (a window of one row of
    distances, no ``(t_q, t_k)`` array of them), and :math:`\bar b x` and
    :math:`\bar b` summed by segment (`relpos_ref.kernels._fire_vjp`).

    Examples
    --------
    >>> import torch
    >>> from relpos_ref.calls import resolve_call
    >>> import relpos_ref as rp
    >>> w1, b1, w2 = torch.ones(2, 1), torch.tensor([0.0, -0.5]), torch.tensor([[1.0, -2.0]])
    >>> x = torch.zeros(4, 2)
    >>> call = resolve_call(x, x, x, scale=None, mask=None, causal=False, q_offset=0)
    >>> named = {"w1": w1, "b1": b1, "w2": w2, "L": 2.0}
    >>> got = mlp_vjp_by_blocks(torch.ones(1, 4, 4), named, call, _factors(named, call))
    >>> got["w2"].shape, got["c"].shape
    (torch.Size([1, 2]), torch.Size([]))
    """
    c, big_l, _ = call_options(named)
    tables = {n: named[n] for n in ("w1", "b1", "w2", "b2") if n in named}
    w1, b1, w2, _ = broadcast_tables(*(tables.get(n) for n in ("w1", "b1", "w2", "b2")))
    dtype, xp = w1.dtype, _xp.array_namespace(w1)
    t_q, t_k = call.t_q, call.t_k
    found_units = units(w1, b1, w2)
    n_seg = found_units.segments.shape[0]
    slope = live_sums(found_units, found_units.slope)  # (H, n_seg): each pair's A
    psi = found.logs.flip(0).unfold(0, t_k, 1)  # (t_q, t_k) windows, keys reversed
    d_psi = _fire_inputs._distance_derivative(xp, found.distances, found.rows["u"], c)
    d_psi = d_psi.flip(0).unfold(0, t_k, 1)
    norm, wide = found.norms, found.logs.dtype
    by_a, by_da = (torch.zeros(t_q, dtype=wide, device=w1.device) for _ in range(2))
    d_a = d_b = torch.zeros((w2.shape[0], n_seg), dtype=wide, device=w1.device)
    for i0 in range(0, t_q, ROWS):
        i1 = min(t_q, i0 + ROWS)
        first, x = _block_inputs(psi, norm, call, i0, i1, dtype)  # as the bias made them
        if first == t_k:
            continue
        segment = segments(xp, found_units.u, x).reshape(-1)
        d_out = d_bias[:, i0:i1, first:].reshape(d_bias.shape[0], -1)
        d_x = (d_out * torch.index_select(slope, 1, segment)).sum(0).reshape(i1 - i0, -1).to(wide)
        by_a[i0:i1] = (d_x * psi[i0:i1, first:]).sum(-1)
        by_da[i0:i1] = (d_x * d_psi[i0:i1, first:]).sum(-1)
        d_a = d_a + sums_by_segment(xp, segment, d_out * x.reshape(-1), n_seg)
        d_b = d_b + sums_by_segment(xp, segment, d_out, n_seg)
    out = tables_from_unit_gradients(*unit_gradients(found_units, d_a.to(dtype), d_b.to(dtype),
                                                     w1, b1, w2), tables)
    d_c, d_l = _fire_inputs._gradients_from_row_sums(xp, found.rows, by_da, by_a, c, big_l)
    out["c"] = _fire_inputs._like(xp, d_c, c, dtype)
    out["L"] = _fire_inputs._like(xp, d_l, big_l, dtype)
    return out


def _shaped(bias: Any, named: dict[str, Any]) -> Any:
    # (t_q, t_k) where no table has a head axis: one bias for every head, as fire_bias's
    heads = fire._check_mlp(named["w1"], named["b1"], named["w2"], named.get("b2"))
    return bias if heads is not None else bias[0]


def fire_fused(q: Any, k: Any, v: Any, named: dict[str, Any], call: Call, mask: Any) -> Any:
    """`relpos_ref.fire_attention` of a validated, finite, bounded call, no gradient.

    `named`: the tables and the options given (`fire_bias_keys_reversed`).

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
    bias = fire_bias_keys_reversed(named, call)
    if bias is None:
        return NotImplemented
    return form_attention(DistanceForm(q, k, v, call, mask), dense=_shaped(bias, named))


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
    found = _factors(named, call)
    if found is None:
        return NotImplemented
    bias = fire_bias_keys_reversed(named, call, found)
    grads = form_vjp(DistanceForm(q, k, v, call, mask), d_output, dense=_shaped(bias, named))
    d_bias = grads["dense"] if grads["dense"].dim() == 3 else grads["dense"][None]
    more = mlp_vjp_by_blocks(d_bias, named, call, found)
    return {"q": grads["q"], "k": grads["k"], "v": grads["v"], **more}
