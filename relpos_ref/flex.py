r"""FlexAttention export: a scheme's call as the arguments of torch's ``flex_attention``.

`flex_attention_args` lowers a call to the distance form
(`relpos_ref.lowering.lower`, the scheme's own checks first) and turns the
form's pieces into what ``torch.nn.attention.flex_attention.flex_attention``
takes, with no code for any one scheme:

.. math::
    \text{score\_mod}(x, b, h, i, j) = x
        + \sum_t s\,a_t[b, h, i, \text{row}_t(i, j)]
        + \sum_t s\,c_t[b, h, j, \text{row}_t(i, j)]
        + \sum_t \beta_t[h, \text{row}_t(i, j)] + s\,P_{ij} + B_{ij}

where ``x = s q'_i . k'_j`` arrives already scaled, ``a_t = q A_t^T`` and
``c_t = k B_t^T`` are the side terms' products (one per query, or per key,
and table row), ``β_t`` the bias rows and ``P``, ``B`` plain attention's
dense terms. A map's row is ``rows[key[j] - query[i] - low]``; for a distance
map the difference is ``r = j - (i + q_offset)``, since FlexAttention's
``q_idx`` counts from 0 whatever the offset. Rows ``-1`` (no term) read a
zero appended to each product and row. The mask and the causal structure
(``r <= 0``) become a ``mask_mod`` and a ``block_mask``
(``create_block_mask``), so FlexAttention skips the blocks with no allowed
pair.

What it cannot do, and says so:

- relative value tables (Shaw's and Music's ``value_table``): a ``score_mod``
  changes scores only, and FlexAttention's output is ``softmax(scores) @ v``,
  with no per-distance term added to it;
- an empty grid (``t_q`` or ``t_k`` zero): torch 2.13's eager FlexAttention
  raises an ``IndexError`` there and its compiled CPU kernel stops the
  process (SIGFPE); `attend` returns the specification's zeros instead.

A query with no allowed key gets zeros from FlexAttention (eager and compiled,
torch 2.13), as in the specification. Non-finite values of ``q``, ``k``,
``v`` behind a mask may reach the output in a partly masked block, as in
any fused kernel.

Precision: FlexAttention computes scores and the softmax in float32 (float64
for float64 inputs; its compiled CPU kernel takes float32, float16 and
bfloat16 only) and the export's terms are computed in that precision. For
16-bit calls the weights are rounded to the input dtype before ``@ v``
(about one unit in the last place of the output); when a scheme changes ``q``
or ``k`` (RoPE, absolute, Transformer-XL's content bias) the export passes
``q``, ``k`` and ``v`` in float32, as the specification computes them, and
`FlexArguments.output` rounds the result back.

This module needs torch (imported when called); the rest of the library
never imports it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

from . import _xp, catalog
from .lowering import DistanceForm, IndexMap, lower

__all__ = ["FlexArguments", "attend", "flex_attention_args"]

_Read = Callable[..., Any]


class FlexArguments(NamedTuple):
    """What ``flex_attention(q, k, v, score_mod=..., block_mask=..., scale=...)`` takes.

    Attributes
    ----------
    q, k, v : torch tensors, shapes ``(B, H, t_q, d)``, ``(B, H, t_k, d)``, ``(B, H, t_k, d_v)``
        The content operands (rotated, shifted where the scheme does so),
        broadcast to the call's leading shape and folded to four axes: ``H``
        the heads (the last leading axis), ``B`` the others.
    score_mod : callable
        ``(score, b, h, q_idx, kv_idx) -> score``.
    block_mask : BlockMask or None
        From ``create_block_mask(mask_mod, ...)``; ``None`` without mask and
        causal structure.
    mask_mod : callable or None
        ``(b, h, q_idx, kv_idx) -> bool``, to build a block mask of other
        block sizes.
    scale : float
        The call's scale ``s``.
    shape : tuple of int
        The specification's output shape, ``(*lead, t_q, d_v)``.
    dtype : torch dtype
        The specification's output dtype (that of ``v``).
    """

    q: Any
    k: Any
    v: Any
    score_mod: Callable[..., Any]
    block_mask: Any
    mask_mod: Callable[..., Any] | None
    scale: float
    shape: tuple[int, ...]
    dtype: Any

    @property
    def kwargs(self) -> dict[str, Any]:
        """``score_mod``, ``block_mask`` and ``scale``, as keywords of ``flex_attention``."""
        return {"score_mod": self.score_mod, "block_mask": self.block_mask, "scale": self.scale}

    def output(self, out: Any) -> Any:
        """FlexAttention's ``(B, H, t_q, d_v)`` result in the call's shape and dtype."""
        return out.reshape(self.shape).to(self.dtype)


def _lead(form: DistanceForm) -> tuple[int, ...]:
    """The leading shape of the call's output: every operand's, broadcast."""
    import torch

    shapes = [a.shape[:-2] for a in (form.q, form.k, form.v)]
    if form.mask is not None:
        shapes.append(form.mask.shape[:-2])
    for term in (*form.query_terms, *form.key_terms):
        shapes += [term.vectors.shape[:-2], term.table.shape[:-2]]
    shapes += [term.table.shape[:-1] for term in form.biases]
    shapes += [a.shape[:-2] for a in form.dense if a is not None]
    return tuple(torch.broadcast_shapes(*shapes))


def _fold(x: Any, lead: tuple[int, ...], tail: tuple[int, ...]) -> tuple[Any, int]:
    """`x` ``(..., *tail)`` as ``(B, H, *tail)``, ``(H, *tail)`` or ``tail``; which (2, 1, 0).

    Leading axes of `x` that are all 1 are dropped: a table shared by the
    heads is read without ``h``, one per head without ``b``.
    """
    own = tuple(x.shape[: x.ndim - len(tail)])
    own = (1,) * (len(lead) - len(own)) + own
    x = x.reshape(*own, *tail)
    per_head = bool(own) and own[-1] != 1
    per_batch = any(n != 1 for n in own[:-1])
    heads = lead[-1] if lead else 1
    if per_batch:
        x = x.expand(*lead, *tail).reshape(math.prod(lead[:-1]), heads, *tail)
        return x, 2
    x = x.reshape(own[-1] if own else 1, *tail)
    return (x.expand(heads, *tail), 1) if per_head else (x[0], 0)


def _at(x: Any, kind: int) -> _Read:
    """``read(b, h, *index)``: `x` at the index, with the batch and head axes it has."""
    if kind == 2:
        return lambda b, h, *index: x[(b, h, *index)]
    if kind == 1:
        return lambda b, h, *index: x[(h, *index)]
    return lambda b, h, *index: x[index]


def _difference(index: IndexMap, q_offset: int) -> Callable[[Any, Any], Any]:
    """``(q_idx, kv_idx) -> key[j] - query[i] - low``, the map's position in ``rows``."""
    if index.by_distance:  # r - low, r = kv_idx - (q_idx + q_offset)
        shift = -(q_offset + index.low)
        return lambda i, j: j - i + shift
    key, query = index.key - index.low, index.query
    return lambda i, j: key[j] - query[i]


def _rows(index: IndexMap, none: int) -> Any:
    """The map's rows, ``-1`` (no term) sent to `none` (a zero appended to the operand)."""
    rows = index.rows
    return rows.where(rows >= 0, none)


def _padded(x: Any) -> Any:
    """`x` with a zero appended along its last axis (the entry of rows ``-1``)."""
    import torch

    return torch.cat([x, x.new_zeros((*x.shape[:-1], 1))], dim=-1)


def _terms(form: DistanceForm, lead: tuple[int, ...], wide: Any) -> list[_Read]:
    """One ``read(b, h, q_idx, kv_idx)`` per term of the form, each scaled as the form says."""
    call = form.call
    s, reads = call.scale, []
    sides = [(t, True) for t in form.query_terms] + [(t, False) for t in form.key_terms]
    for term, per_query in sides:
        vectors, table = term.vectors.to(wide), term.table.to(wide)
        products = _padded(vectors @ table.transpose(-1, -2) * s)  # (..., t, m + 1)
        side, kind = _fold(products, lead, tuple(products.shape[-2:]))
        read, rows = _at(side, kind), _rows(term.index, table.shape[-2])
        where = _difference(term.index, call.q_offset)
        reads.append((lambda b, h, i, j, read=read, rows=rows, where=where, per_query=per_query:
                      read(b, h, i if per_query else j, rows[where(i, j)])))
    for term in form.biases:
        table = _padded(term.table.to(wide))
        # the table read through the map once: one entry per difference
        entries = table[..., _rows(term.index, table.shape[-1] - 1)]
        entries, kind = _fold(entries, lead, (entries.shape[-1],))
        read, where = _at(entries, kind), _difference(term.index, call.q_offset)
        reads.append(lambda b, h, i, j, read=read, where=where: read(b, h, where(i, j)))
    position, bias = form.dense
    if position is not None or bias is not None:
        dense = sum(a.to(wide) * f for a, f in ((position, s), (bias, 1.0)) if a is not None)
        dense, kind = _fold(dense.expand(*dense.shape[:-2], call.t_q, call.t_k), lead,
                            (call.t_q, call.t_k))
        read = _at(dense, kind)
        reads.append(lambda b, h, i, j, read=read: read(b, h, i, j))
    return reads


def _mask_mod(form: DistanceForm, lead: tuple[int, ...]) -> tuple[Any, int]:
    """``mask_mod(b, h, q_idx, kv_idx)`` of the mask and causal structure, or ``None``; kind."""
    call, mask = form.call, form.mask
    q_offset, causal = call.q_offset, call.causal
    if mask is None:
        if not causal:
            return None, 0
        return (lambda b, h, i, j: j - i <= q_offset), 0  # r = j - (i + q_offset) <= 0
    mask, kind = _fold(mask.expand(*mask.shape[:-2], call.t_q, call.t_k), lead,
                       (call.t_q, call.t_k))
    read = _at(mask, kind)
    if not causal:
        return (lambda b, h, i, j: read(b, h, i, j)), kind
    return (lambda b, h, i, j: read(b, h, i, j) & (j - i <= q_offset)), kind


def _value_table_name(scheme: str, tables: tuple[Any, ...], form: DistanceForm) -> str:
    """The argument that holds the form's first value table (rows of width ``d_v``)."""
    entry = catalog.get(scheme)
    named = catalog.tables_by_name(entry, tables)
    value = form.values[0].table
    found = [t for t in entry.tables if named.get(t.name) is value]  # one array may be two
    found.sort(key=lambda t: t.width != "d_v")
    return found[0].name if found else "value_table"


def _export(scheme: str, q: Any, k: Any, v: Any, tables: tuple[Any, ...],
            settings: dict[str, Any]) -> tuple[DistanceForm, tuple[int, ...]]:
    for name, a in (("q", q), ("k", k), ("v", v)):
        if _xp.library_name(a) != "torch":
            msg = (f"`{name}` must be a torch tensor (FlexAttention is torch's), "
                   f"got {type(a).__module__}.{type(a).__name__}")
            raise TypeError(msg)
    form = lower(scheme, q, k, v, *tables, **settings)
    if form.values:
        name = _value_table_name(scheme, tables, form)
        msg = (f"`{name}`: FlexAttention cannot add a per-distance value term "
               f"(a score_mod changes scores only, and its output is softmax(scores) @ v); "
               f"leave `{name}` out, or call relpos_ref.{scheme}_attention")
        raise ValueError(msg)
    return form, _lead(form)


def flex_attention_args(scheme: str, q: Any, k: Any, v: Any, /, *tables: Any,
                        scale: float | None = None, mask: Any = None,
                        causal: bool | None = None, q_offset: int | None = None,
                        **options: Any) -> FlexArguments:
    r"""A call of `scheme` as the arguments of ``torch.nn.attention.flex_attention``.

    .. math:: \text{out} = \operatorname{softmax}_\text{allowed}\bigl(
              \text{score\_mod}(s\, q' k'^\top)\bigr)\, v

    with the ``score_mod`` of the module docstring: every position term of the
    call's distance form, read per pair from small arrays.

    Parameters
    ----------
    scheme : str
        A name of `relpos_ref.catalog` (``"plain"`` for `relpos_ref.attention`,
        with ``bias=`` and ``position=``).
    q, k, v, *tables : torch tensors
        As the scheme's ``*_attention`` takes them.
    scale, mask, causal, q_offset, **options
        As the scheme's ``*_attention`` takes them (``None``: its defaults).

    Returns
    -------
    FlexArguments
        Call ``flex_attention(a.q, a.k, a.v, **a.kwargs)`` (or its
        ``torch.compile``\ d form), then ``a.output(out)``.

    Raises
    ------
    TypeError
        ``q``, ``k`` or ``v`` is not a torch tensor; the scheme's own errors.
    ValueError
        A relative value table (named); an empty grid; the scheme's own errors.

    Examples
    --------
    >>> import torch
    >>> q = k = v = torch.zeros(1, 2, 4, 8)
    >>> table = torch.tensor([[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]])  # (h, 2K + 1), K = 1
    >>> a = flex_attention_args("bias", q, k, v, table, causal=True)
    >>> a.scale, a.block_mask is not None
    (0.35355339059327373, True)
    >>> i, j = torch.tensor(3), torch.tensor(0)  # r = -3, clipped to -1: row 0
    >>> a.score_mod(torch.tensor(0.0), torch.tensor(0), torch.tensor(1), i, j)
    tensor(3.)
    """
    settings = {"scale": scale, "mask": mask, "causal": causal, "q_offset": q_offset, **options}
    form, lead = _export(scheme, q, k, v, tables, settings)
    if form.call.t_q == 0 or form.call.t_k == 0:
        msg = (f"FlexAttention cannot run an empty grid, got `t_q` = {form.call.t_q} and "
               f"`t_k` = {form.call.t_k} (the output is zeros: relpos_ref.flex.attend "
               f"returns them)")
        raise ValueError(msg)
    return _arguments(form, lead)


def _arguments(form: DistanceForm, lead: tuple[int, ...]) -> FlexArguments:
    import torch
    from torch.nn.attention.flex_attention import create_block_mask

    call = form.call
    # one dtype for q, k, v: a scheme that changed q or k (float32 for a 16-bit call) widens all
    work = torch.promote_types(torch.promote_types(form.q.dtype, form.k.dtype), form.v.dtype)
    wide = torch.float64 if work == torch.float64 else torch.float32
    heads, batch = (lead[-1] if lead else 1), math.prod(lead[:-1])
    q4, k4, v4 = (a.to(work).expand(*lead, *a.shape[-2:]).reshape(batch, heads, *a.shape[-2:])
                  for a in (form.q, form.k, form.v))
    reads = _terms(form, lead, wide)

    def score_mod(score: Any, b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        for read in reads:
            score = score + read(b, h, q_idx, kv_idx)
        return score

    mask_mod, kind = _mask_mod(form, lead)
    block_mask = None
    if mask_mod is not None:
        block_mask = create_block_mask(mask_mod, batch if kind == 2 else None,
                                       heads if kind else None, call.t_q, call.t_k,
                                       device=q4.device)
    return FlexArguments(q4, k4, v4, score_mod, block_mask, mask_mod, call.scale,
                         (*lead, call.t_q, form.v.shape[-1]), form.v.dtype)


def attend(scheme: str, q: Any, k: Any, v: Any, /, *tables: Any,
           flex_attention: Callable[..., Any] | None = None, scale: float | None = None,
           mask: Any = None, causal: bool | None = None, q_offset: int | None = None,
           **options: Any) -> Any:
    r"""Attention of a call of `scheme` computed by FlexAttention, in the call's shape and dtype.

    .. math:: \text{out} = \operatorname{softmax}_\text{allowed}\bigl(
              \text{score\_mod}(s\, q' k'^\top)\bigr)\, v

    `flex_attention_args`, then ``flex_attention``, then `FlexArguments.output`;
    an empty grid returns the specification's zeros without calling it.

    Parameters
    ----------
    scheme, q, k, v, *tables, scale, mask, causal, q_offset, **options
        As in `flex_attention_args`.
    flex_attention : callable, optional
        The function to run, e.g. ``torch.compile(flex_attention)``; default
        torch's eager ``flex_attention`` (unfused: it warns so, once).

    Returns
    -------
    torch tensor, shape ``(..., t_q, d_v)``, the dtype of ``v``

    Examples
    --------
    >>> import warnings
    >>> import torch
    >>> import relpos_ref as rp
    >>> g = torch.Generator().manual_seed(0)
    >>> q, k, v = (torch.randn(3, 5, 4, generator=g) for _ in range(3))  # 3 heads
    >>> with warnings.catch_warnings():  # eager FlexAttention: "called without torch.compile"
    ...     warnings.simplefilter("ignore", UserWarning)
    ...     out = attend("alibi", q, k, v, causal=True)
    >>> with rp.kernels.disabled():
    ...     bool(torch.allclose(out, rp.alibi_attention(q, k, v, causal=True), atol=1e-6))
    True
    """
    settings = {"scale": scale, "mask": mask, "causal": causal, "q_offset": q_offset, **options}
    form, lead = _export(scheme, q, k, v, tables, settings)
    if form.call.t_q == 0 or form.call.t_k == 0:
        return v.new_zeros((*lead, form.call.t_q, v.shape[-1]))
    if flex_attention is None:
        from torch.nn.attention.flex_attention import flex_attention
    a = _arguments(form, lead)
    return a.output(flex_attention(a.q, a.k, a.v, **a.kwargs))
