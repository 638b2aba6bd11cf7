r"""A distance form through torch's ``scaled_dot_product_attention`` (SDPA).

For forms whose only terms are biases by distance (bias, T5, ALiBi), or
none (plain attention, RoPE, absolute once its key embedding joins ``k``),
SDPA runs the softmax and the weighted sum fused (a flash or
memory-efficient kernel on CUDA, a blocked loop on the CPU):

.. math::
    \text{out} = \operatorname{SDPA}\bigl(q', k', v,\ \text{attn\_mask} =
    s\,P + B \text{ where allowed}, -\infty \text{ elsewhere},\ \text{scale} = s\bigr)

The biases are one row of the call's ``t_q + t_k - 1`` distances, the form's
tables read at its maps (`distance_bias`), laid out as a view with the keys
reversed (`toeplitz`: entry ``(i, j~)`` depends on ``i + j~``, which a view
of positive strides expresses). Plain attention with no mask and no term, or
a causal one with ``q_offset = 0``, passes no ``attn_mask`` at all
(``is_causal``: SDPA's fastest kernels). A scale that is not positive goes
into ``q`` (SDPA then gets 1): SDPA's CPU flash loop returned NaN for a
causal call at scale -0.5. A row with no allowed key sees every key (no NaN,
in the output or a gradient through it), and its output is replaced by
zeros.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch.nn.functional import scaled_dot_product_attention

from .._adapters import Terms
from ..attention import allowed_keys
from ..calls import Call
from ..lowering import DistanceForm
from . import _torch_plan
from ._torch_blocks import kept_array
from ._torch_form import add_terms, arena_for
from ._torch_plan import lead_axes, plan

__all__ = ["TERMS_BYTES", "by_sdpa", "distance_bias", "sdpa_form", "sdpa_terms", "terms_attention",
           "toeplitz", "with_terms_made"]

#: Most bytes of ``(..., t_q, t_k)`` arrays `terms_attention` makes (its terms; with a mask,
#: also SDPA's mask made from them).
TERMS_BYTES = 2**29


def by_sdpa(form: DistanceForm) -> bool:
    """Whether SDPA takes the form: no content-position term, no relative value, every bias
    by distance.

    Examples
    --------
    >>> import torch
    >>> from relpos_ref.lowering import lower
    >>> x = torch.zeros(3, 2)
    >>> by_sdpa(lower("t5", x, x, x, torch.zeros(4))), by_sdpa(lower("shaw", x, x, x, x))
    (True, False)
    """
    return (not form.query_terms and not form.key_terms and not form.values
            and all(t.index.by_distance for t in form.biases))


def distance_bias(form: DistanceForm) -> Any:
    """The form's biases summed on the call's distances: ``(..., t_q + t_k - 1)``, or ``None``.

    Entry ``c`` is the bias of the distance ``r = c - (t_q - 1) - q_offset``
    (`relpos_ref.lowering.distances`); a map's ``-1`` adds nothing.
    """
    row = None
    for term in form.biases:
        found = term.table[..., torch.clamp(term.index.rows, min=0)]
        found = torch.where(term.index.rows >= 0, found, torch.zeros((), dtype=found.dtype,
                                                                     device=found.device))
        row = found if row is None else row + found
    return row


def toeplitz(row: Any, call: Call) -> Any:
    """``term[..., i, j~] = row[..., n - 1 - i - j~]``: a row of distances as a view, keys
    reversed (key ``t_k - 1 - j~`` in column ``j~``), ``n = t_q + t_k - 1``.

    Examples
    --------
    >>> import torch
    >>> from relpos_ref.calls import Call
    >>> toeplitz(torch.arange(4.0), Call(None, (), 2, 3, 1, 1.0, False, 0)).flip(-1)
    tensor([[1., 2., 3.],
            [0., 1., 2.]])
    """
    return row.flip(-1).unfold(-1, call.t_k, 1)


def sdpa_form(form: DistanceForm, *, fused: bool = True,
              flipped: tuple[Any, Any] | None = None) -> Any:
    """Attention of a form `by_sdpa` takes (see the module docstring).

    Parameters
    ----------
    form : DistanceForm
        Finite arrays; ``t_q, t_k, d >= 1``.
    fused : bool, optional
        ``False``: SDPA's math backend (differentiable twice, and in forward mode).
    flipped : pair of tensors, optional
        ``k'`` and ``v`` with their keys already reversed (a blocked call reverses
        them once for all its tiles).
    """
    call = form.call
    position, dense_bias = form.dense
    row = distance_bias(form)
    # causal alone, every row with a key: the causal structure in the row of distances too
    # (with no bias, where SDPA's own is_causal does not fit: q_offset > 0, a blocked tile)
    fold = (call.causal and form.mask is None and call.q_offset >= 0 and position is None
            and dense_bias is None and (row is not None or call.q_offset > 0))
    if fold:
        n = call.t_q + call.t_k - 1
        if row is None:
            row = form.q.new_zeros(n)
        future = torch.arange(n, device=row.device) > call.t_q - 1 + call.q_offset
        row = torch.where(future, torch.tensor(-math.inf, dtype=row.dtype, device=row.device),
                          row)
        call = call._replace(causal=False)
    if row is None:
        return sdpa_terms(form.q, form.k, form.v, call, terms=Terms(position, dense_bias),
                          mask=form.mask, fused=fused)
    return sdpa_terms(form.q, form.k, form.v, call, terms=Terms(bias=toeplitz(row, call)),
                      mask=form.mask, keys_reversed=True, flipped=flipped, fused=fused)


def sdpa_terms(
    q: Any, k: Any, v: Any, call: Call, *, terms: Terms, mask: Any = None,
    keys_reversed: bool = False, flipped: tuple[Any, Any] | None = None, fused: bool = True,
) -> Any:
    r"""Attention of a validated call with its terms, through SDPA.

    .. math:: \operatorname{softmax}_{\text{allowed}}(s\,(q k^\top + P) + B)\, v

    Parameters
    ----------
    q, k, v : tensors ``(..., t_q, d)``, ``(..., t_k, d)``, ``(..., t_k, d_v)``
        Finite, of one floating dtype and device (the kernels checked);
        ``t_q, t_k, d >= 1``.
    call : Call
        The validated call (scale, causal, q_offset).
    terms : Terms
        ``position`` ``P`` and ``bias`` ``B``, each ``None`` or broadcastable
        to ``(..., t_q, t_k)``, finite.
    mask : bool tensor, optional
        Broadcastable to ``(..., t_q, t_k)``.
    keys_reversed : bool, optional
        The terms hold key ``t_k - 1 - j`` in column ``j`` (`toeplitz`):
        ``k``, ``v`` and the allowed keys are reversed to match. The output,
        a sum over keys, is the same.
    flipped : pair of tensors, optional
        With `keys_reversed`: ``k`` and ``v`` with their keys already reversed.
    fused : bool, optional
        Let SDPA choose its fused kernels (flash, memory-efficient, the
        CPU's flash loop); ``False``: its math backend, a composition of
        differentiable operations (a gradient of a gradient, forward mode),
        as the specification is.

    Returns
    -------
    out : tensor ``(*batch, t_q, d_v)``
        ``batch`` broadcast from ``q, k, v``, the terms and the mask. Rows
        with no allowed key are zero.

    Examples
    --------
    >>> import torch
    >>> import relpos_ref as rp
    >>> from relpos_ref.calls import resolve_call
    >>> q = k = v = torch.eye(3, dtype=torch.float64)
    >>> call = resolve_call(q, k, v, scale=None, mask=None, causal=True, q_offset=None)
    >>> out = sdpa_terms(q, k, v, call, terms=Terms())
    >>> with rp.kernels.disabled():
    ...     bool(torch.allclose(out, rp.attention(q, k, v, causal=True)))
    True
    """
    position, bias = terms
    allowed = allowed_keys(call.t_q, call.t_k, mask=mask, causal=call.causal,
                           q_offset=call.q_offset, xp=call.xp, device=q.device)
    if keys_reversed:
        k, v = (k.flip(-2), v.flip(-2)) if flipped is None else flipped
        allowed = None if allowed is None else allowed.flip(-1)
    shapes = [q.shape[:-2], k.shape[:-2], v.shape[:-2],
              *(t.shape[:-2] for t in (position, bias, allowed) if t is not None)]
    batch = torch.broadcast_shapes(*shapes)
    # broadcast copies, not stride-0 views (a fused kernel's assumptions; small arrays)
    q, k, v = (x if x.shape[:-2] == batch else x.expand(*batch, *x.shape[-2:]).contiguous()
               for x in (q, k, v))
    scale = call.scale
    if not scale > 0:  # the scale in q: SDPA's kernels are for a positive one (a causal
        q, scale = q * scale, 1.0  # flash call at scale -0.5 gave NaN on the CPU)
    attn_mask, is_causal, empty = None, False, None
    if position is None and bias is None and allowed is not None and mask is None \
            and call.q_offset == 0 and not keys_reversed:
        is_causal = True  # keys j <= i: SDPA's own causal structure, no row empty
    elif position is not None or bias is not None or allowed is not None:
        term = (None if position is None else position * call.scale)
        if bias is not None:
            term = bias if term is None else term + bias
        if allowed is not None:
            # a row with no allowed key sees every key here (finite weights, finite
            # gradients), and gets zeros below
            empty = ~torch.any(allowed, dim=-1, keepdim=True)
            allowed = allowed | empty
            zero = torch.zeros((), dtype=q.dtype, device=q.device)
            term = torch.where(allowed, zero if term is None else term,
                               torch.tensor(-math.inf, dtype=q.dtype, device=q.device))
        attn_mask = term.to(q.dtype).expand(*batch, call.t_q, call.t_k)
    # (batch, heads, t, d): the fused kernels take four axes (with three, the CPU ran the
    # math backend, 3.8 times slower at t = 4096)
    q, k, v = (_four_axes(x, batch) for x in (q, k, v))
    attn_mask = None if attn_mask is None else _four_axes(attn_mask, batch)
    if fused:
        out = scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal,
                                           scale=scale)
    else:
        out, _ = torch.ops.aten._scaled_dot_product_attention_math(
            q, k, v, attn_mask, 0.0, is_causal, scale=scale)
    out = out.reshape(*batch, *out.shape[-2:])
    if empty is not None:
        out = torch.where(empty, torch.zeros((), dtype=out.dtype, device=out.device), out)
    return out


def _four_axes(x: Any, batch: tuple[int, ...]) -> Any:
    """``x`` of shape ``(*batch, a, b)`` as ``(n, h, a, b)`` (a copy only where strides need one).

    Examples
    --------
    >>> import torch
    >>> _four_axes(torch.zeros(3, 4, 5), (3,)).shape
    torch.Size([1, 3, 4, 5])
    >>> _four_axes(torch.zeros(2, 3, 4, 4, 5), (2, 3, 4)).shape
    torch.Size([6, 4, 4, 5])
    """
    if len(batch) <= 2:
        return x.reshape(*(1,) * (2 - len(batch)), *x.shape)
    return x.reshape(math.prod(batch[:-1]), batch[-1], *x.shape[-2:])


def with_terms_made(form: DistanceForm) -> bool:
    """Whether `terms_attention` takes the form: no relative value, no causal structure
    (the block engine computes only the keys a causal block sees), its terms (twice that
    with a mask: SDPA's mask is another array of their size) within `TERMS_BYTES`.

    Examples
    --------
    >>> import torch
    >>> from relpos_ref.lowering import lower
    >>> x = torch.zeros(3, 2)
    >>> with_terms_made(lower("shaw", x, x, x, x)), with_terms_made(lower("shaw", x, x, x, x, x))
    (True, False)
    """
    call = form.call
    size = math.prod(lead_axes(form)) * call.t_q * call.t_k * form.q.element_size()
    if form.mask is not None:
        size *= 2  # SDPA's mask: the terms with -inf where masked, one more such array
    return not form.values and not call.causal and size <= TERMS_BYTES


def terms_attention(form: DistanceForm, flipped: tuple[Any, Any] | None = None) -> Any:
    r"""Attention of a form without relative values: its terms made, then SDPA with them.

    The block engine (`relpos_ref.kernels._torch_form`) makes every term of
    the form a block of query rows at a time (`add_terms`: scaled, keys
    reversed) into one ``(..., t_q, t_k)`` array, and SDPA takes it as its
    additive mask (`sdpa_terms`, which masks), so that SDPA's own loop does
    the products and the softmax. On the CPU the array is kept for the
    thread's next call (`relpos_ref.kernels._torch_blocks.kept_array`).
    t = 1024, 8 heads, one thread, glibc's default allocator: general 61 ->
    50 ms, grid2d 48 -> 46, Swin 39 -> 38, DeBERTa 90 -> 75 (plain attention
    27). `flipped` as `relpos_ref.kernels._torch_plan.plan` takes it.

    Examples
    --------
    >>> import torch
    >>> import relpos_ref as rp
    >>> from relpos_ref.lowering import lower
    >>> q = k = v = torch.randn(2, 5, 4, dtype=torch.float64)  # two heads, five positions
    >>> table = torch.randn(9, 4, dtype=torch.float64)  # general: one row per distance
    >>> keep = torch.rand(5, 5) > 0.2
    >>> out = terms_attention(lower("general", q, k, v, table, mask=keep))
    >>> with rp.kernels.disabled():
    ...     bool(torch.allclose(out, rp.general_attention(q, k, v, table, mask=keep)))
    True
    """
    if flipped is None:  # reversed once, for the plan and for SDPA
        flipped = (form.k.flip(-2), form.v.flip(-2))
    # blocks of twice the engine's size, whose scores stay in cache through the softmax: these
    # are written once and left for SDPA (DeBERTa, t = 1024, 8 heads, one thread: 51.4 ms a
    # call with 2 MiB blocks, 50.5 with 4)
    p = plan(form, flipped, block_bytes=2 * _torch_plan.BLOCK_BYTES)
    call = form.call
    terms = kept_array(p.q, (p.q.shape[0], call.t_q, call.t_k))
    arena = arena_for(p)
    for a, b, width in p.blocks:  # not causal: every row, every key
        arena.reset()
        # written block by block: in cache when the terms come
        add_terms(terms[:, a:b], p, a, b, width, arena, fresh=True)
    terms = terms.reshape(*p.lead, call.t_q, call.t_k)
    return sdpa_terms(form.q, form.k, form.v, call, terms=Terms(bias=terms), mask=form.mask,
                      keys_reversed=True, flipped=flipped)
