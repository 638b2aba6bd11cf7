"""torch kernels: each scheme's attention through ``scaled_dot_product_attention``.

The specification on torch makes one pass through memory per operation over
``(..., t_q, t_k)`` arrays (the logits, their maximum, the exponential, the
sums, the weights), each a new tensor. The kernels here hand the softmax and
the weighted sum to `torch.nn.functional.scaled_dot_product_attention` (SDPA),
which runs them fused on every device torch has (a flash or memory-efficient
kernel on CUDA, a blocked loop on the CPU):

.. math::
    \\text{out} = \\operatorname{SDPA}\\bigl(q, k, v,\\ \\text{attn\\_mask} =
    s\\,P + B \\text{ where allowed}, -\\infty \\text{ elsewhere},\\ \\text{scale} = s\\bigr)

with the scheme's terms ``P`` (scaled with ``q k^T``) and ``B`` (after the
scale) computed by the specification itself: the catalog's ``terms`` of the
whole grid (`relpos_ref.catalog.Scheme`), RoPE's rotation (``rotate``), and
the call validated by the scheme's own checks (``check``), so bad input gets
the specification's message. No scheme knowledge is written here twice.
Plain attention with no mask and no term, or a causal one with
``q_offset = 0``, passes no ``attn_mask`` at all (``is_causal``: SDPA's fastest
kernels); the distance-only schemes (bias, T5, ALiBi) pass one row of
distances as a view (`toeplitz_terms`). A scale that is not positive goes
into ``q`` (SDPA then gets 1): SDPA's CPU flash loop returned NaN for a
causal call at scale -0.5.

``BLOCKED_KERNELS`` evaluate `relpos_ref.blocked.blocked_attention` for
plain attention, RoPE, bias, T5 and ALiBi (the schemes whose terms are a
function of the distance alone, or none): each of the specification's
tiles of queries is one SDPA call against the keys that tile visits
(`relpos_ref.kernels._blocked_rows`), its row of distances a view of the
tile's ``rows + keys - 1`` distances, the causal structure folded into it
where the tile has no mask and each of its queries a key; with a mask a
tile is cut into calls of about ``4 block_size ** 2`` scores per head
(`relpos_ref.kernels._blocked_rows.rows_per_call`). The
other schemes' terms depend on ``q`` or ``k``: building them per tile cost
what the specification's loop costs, so they have no blocked kernel.

Every kernel returns ``NotImplemented`` (the specification runs) for what it
does not cover:

- ``return_weights=True`` (SDPA does not return them), a relative-value table
  (Shaw's and Music's ``value_table``: a term of the output, from the
  weights), ``method="definition"``;
- any non-finite value in ``q``, ``k``, ``v``, a table or a given term (the
  specification keeps a masked pair's NaN out of the output; an additive
  mask cannot: ``NaN - inf`` is NaN);
- a call whose logits could overflow, by a bound from the largest
  magnitudes of ``q``, ``k`` and the tables (`relpos_ref.kernels._overflow`;
  read back with the finiteness check, one ``aminmax`` per array): SDPA
  would read an overflowed ``-inf`` as a masked key and return zeros or a
  finite wrong answer, the specification makes it NaN;
- an empty grid or feature axis, arrays of several devices or libraries, and
  calls under ``torch.compile`` or a ``torch.func`` transform (the finiteness
  and overflow check reads values back; the specification traces as it is).

A row with no allowed key gets zeros, as in the specification: SDPA sees that
row with every key allowed (no NaN, in the output or in a gradient through
it), and its output is replaced by zeros. 16-bit calls run in float32 and
return their dtype (`relpos_ref.calls.computes_in_float32`), as every kernel
does: SDPA gets float32 tensors, so on CUDA its 16-bit flash kernels do not
run (its memory-efficient float32 kernel does).

Gradients: a call that autograd records (grad mode on and an input that
requires gradients) or that carries forward-mode tangents runs SDPA's math
backend, a composition of differentiable operations (a gradient of a
gradient, forward mode: what the specification allows; the fused kernels'
backward passes are not differentiable), 2 to 3 times slower than the fused
kernels on the CPU and still faster than the specification. ``VJP_KERNELS``
take first-order gradients only, so they run the fused kernels: each
``*_attention_vjp`` on torch tensors runs its scheme's kernel on detached
copies of its arguments and returns
`torch.autograd.grad` of the output for `d_output`, by argument name as the
specification does (ALiBi's slopes included when they were derived), after
the specification's own checks of the call and of ``d_output``. What the
forward kernel hands back, the backward does too, and so does a call whose
own inputs require gradients (the specification's gradients are then
differentiable in turn), one in inference mode (autograd records nothing
there), and a non-finite ``d_output``.
"""

from __future__ import annotations

import contextvars
import inspect
import math
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch.autograd.forward_ad import unpack_dual
from torch.nn.functional import scaled_dot_product_attention

from .. import catalog
from .._adapters import Terms
from ..attention import allowed_keys
from ..blocked import mask_tile
from ..calls import Call, check_terms, computes_in_float32
from ..gradients import check_d_output
from ._blocked_rows import (
    blocked_arguments,
    blocked_rows,
    check_blocked_arguments,
)
from ._overflow import limit, logit_bound

__all__ = ["BLOCKED_KERNELS", "KERNELS", "VJP_KERNELS"]

#: Scheme name (as in `relpos_ref.catalog`) -> its torch kernel.
KERNELS: dict[str, Callable[..., Any]] = {}

#: Scheme name -> its backward pass: torch autograd through the scheme's kernel.
VJP_KERNELS: dict[str, Callable[..., Any]] = {}

#: Scheme name -> `relpos_ref.blocked.blocked_attention` of that scheme through SDPA, a tile
#: of queries at a time (`NO_TERMS` and `DISTANCE_ONLY`).
BLOCKED_KERNELS: dict[str, Callable[..., Any]] = {}

# Set by the VJP kernels around their own forward call: first-order gradients only, so
# SDPA's fused kernels may run although the inputs require gradients.
_FIRST_ORDER: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "relpos_torch_first_order", default=False)


def _tensors(*arrays: Any) -> bool:
    return all(a is None or isinstance(a, torch.Tensor) for a in arrays)


def _traced(*arrays: Any) -> bool:
    # under torch.compile, a CUDA graph's capture (no value may be read back), or a
    # tensor wrapped by a torch.func transform (vmap, grad)
    if torch.compiler.is_compiling():
        return True
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        return True
    wrapped = torch._C._functorch.is_functorch_wrapped_tensor
    return any(a is not None and wrapped(a) for a in arrays)


def _is_array(x: Any) -> bool:
    return hasattr(x, "shape") and hasattr(x, "dtype")


def _bounded(name: str, call: Call, named: dict[str, Any]) -> bool:
    # Whether every floating array of `named` (by argument name) is finite and no logit
    # of the call can overflow, from their largest magnitudes (`relpos_ref.kernels._overflow`):
    # one aminmax per array (1.6 times a sum's time on the CPU), one read back.
    present = [(n, a) for n, a in named.items()
               if a is not None and a.dtype.is_floating_point and a.numel()]
    if not present:
        return True
    with torch.no_grad():
        extremes = torch.stack([torch.stack(torch.aminmax(a)).to(present[0][1].dtype)
                                for _, a in present])
        values = extremes.abs().amax(dim=-1).tolist()
    magnitude = dict(zip((n for n, _ in present), values, strict=True))
    if not all(math.isfinite(x) for x in values):
        return False
    w_r = named.get("w_r")
    bound = logit_bound(name, {"q": 0.0, "k": 0.0, **magnitude}, d=call.d, scale=call.scale,
                        d_model=0 if w_r is None else w_r.shape[-2])
    info = torch.finfo(present[0][1].dtype)
    return bound <= limit(info.max, info.eps)


def _finite(arrays: list[Any]) -> bool:
    # Whether every entry is finite, or (rarely) a sum overflowed: a sum is finite only
    # when every entry is, and a sum is 100 times faster than torch.isfinite(a).all() on
    # the CPU. A false "no" only hands the call to the specification. One read back.
    with torch.no_grad():
        sums = [a.sum() for a in arrays if a is not None and a.numel()]
        return not sums or bool(torch.isfinite(torch.stack(sums)).all())


def _one_device(arrays: list[Any]) -> bool:
    return len({a.device for a in arrays if a is not None}) <= 1


def _differentiated(arrays: list[Any]) -> bool:
    # autograd records the call (a gradient may be taken twice), or a forward-mode dual
    recorded = torch.is_grad_enabled() and any(a.requires_grad for a in arrays)
    return recorded or any(unpack_dual(a).tangent is not None for a in arrays)


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
        The terms hold key ``t_k - 1 - j`` in column ``j`` (`toeplitz_terms`):
        ``k``, ``v`` and the allowed keys are reversed to match. The output,
        a sum over keys, is the same.
    flipped : pair of tensors, optional
        With `keys_reversed`: ``k`` and ``v`` with their keys already
        reversed (a blocked call reverses them once for all its blocks).
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
    >>> _four_axes(torch.zeros(3, 4, 5), (3,)).shape
    torch.Size([1, 3, 4, 5])
    >>> _four_axes(torch.zeros(2, 3, 4, 4, 5), (2, 3, 4)).shape
    torch.Size([6, 4, 4, 5])
    """
    if len(batch) <= 2:
        return x.reshape(*(1,) * (2 - len(batch)), *x.shape)
    return x.reshape(math.prod(batch[:-1]), batch[-1], *x.shape[-2:])


#: Schemes whose terms are a scalar of the distance alone (no ``q`` or ``k`` in them).
DISTANCE_ONLY = frozenset({"bias", "t5", "alibi"})

#: Schemes with no terms once ``q`` and ``k`` are rotated (`relpos_ref.catalog.Scheme.rotate`).
NO_TERMS = frozenset({"plain", "rope"})


def toeplitz_terms(entry: Any, q: Any, k: Any, tables: dict[str, Any], call: Call,
                   options: dict[str, Any], *, causal: bool = False) -> Terms:
    r"""A distance-only scheme's terms, once per distance, as a view with the keys reversed.

    (For plain attention and RoPE, which have no terms, with `causal`: the
    causal structure alone.)

    ``term[..., i, j'] = row[..., n - 1 - i - j']`` for key ``j = t_k - 1 - j'``,
    that is ``row[..., j - i + t_q - 1]``, where ``row`` is the scheme's own
    term (`relpos_ref.catalog.Scheme.terms`) on a grid of one query and
    ``n = t_q + t_k - 1`` keys whose distances are those of the call,
    ``r_min = -(t_q - 1) - q_offset`` upwards (`relpos_ref.catalog.Scheme.attention_terms`:
    ALiBi's plus a constant). The same values as the terms of
    the whole grid, without its ``(t_q, t_k)`` index array, gather or
    result: a view of ``n`` entries per head (``term[i, j']`` depends on
    ``i + j'`` alone, which a forward-strided view expresses and the
    keys' own order would not). `sdpa_terms` takes it with
    ``keys_reversed=True``; on the CPU SDPA read it faster than a
    materialized mask (14 ms against 16 ms at t = 1024, 8 heads, d = 64).
    With `causal`, the bias is ``-inf`` at every distance ``r > 0``: the
    causal structure, a function of the distance too, in the same view.

    Examples
    --------
    >>> from relpos_ref import catalog
    >>> q = k = torch.zeros(1, 3, 2, dtype=torch.float64)  # one head
    >>> entry = catalog.get("alibi")
    >>> call, options = entry.check_call(q, k, k, {}, q_offset=1,
    ...                                  options={"slopes": torch.ones(1, dtype=torch.float64)})
    >>> toeplitz_terms(entry, q, k, {}, call, options).bias.flip(-1)  # keys in order
    tensor([[[2., 3., 2.],
             [1., 2., 3.],
             [0., 1., 2.]]], dtype=torch.float64)

    (ALiBi's ``-|r|`` plus the constant 3 that softmax ignores,
    `relpos_ref.catalog.Scheme.attention_terms`.)
    """
    n = call.t_q + call.t_k - 1
    one = q[..., :1, :]
    keys = k[..., :1, :].expand(*k.shape[:-2], n, k.shape[-1])  # its shape is all it reads
    terms = entry.attention_terms(one, keys, tables, q_offset=call.t_q - 1 + call.q_offset,
                                  i0=0, j0=0, options=options, method="efficient")

    def expand(row: Any) -> Any:
        if row is None:
            return None
        # windows[..., i, j'] = reversed[i + j'] = row[n - 1 - i - j']
        return row[..., 0, :].flip(-1).unfold(-1, call.t_k, 1)

    bias = terms.bias
    if causal:  # distances r_min + c > 0 masked
        future = (torch.arange(n, device=q.device) > call.t_q - 1 + call.q_offset)[None, :]
        zero = torch.zeros((), dtype=q.dtype, device=q.device)
        bias = torch.where(future, torch.tensor(-math.inf, dtype=q.dtype, device=q.device),
                           zero if bias is None else bias)
    return Terms(position=expand(terms.position), bias=expand(bias))


class _Arguments(NamedTuple):
    """A call's arguments by name, as a kernel reads them."""

    given: dict[str, Any]
    tables: dict[str, Any]  # the tables given, by name
    terms: dict[str, Any]  # plain attention's bias and position, when given
    floating: list[Any]  # every floating array argument


def _arguments(entry: Any, signature: inspect.Signature, args: tuple[Any, ...],
               kwargs: dict[str, Any]) -> _Arguments | None:
    # None where no kernel takes the call: one the signature refuses (the specification
    # says what is wrong), arrays that are not all torch tensors of one device, a trace
    try:
        given = dict(signature.bind(*args, **kwargs).arguments)
    except TypeError:
        return None
    tables = {t.name: given[t.name] for t in entry.tables if given.get(t.name) is not None}
    terms = {n: given[n] for n in ("bias", "position") if given.get(n) is not None}
    others = ("d_output", "mask", *(o.name for o in entry.options))
    arrays = [given["q"], given["k"], given["v"], *tables.values(), *terms.values(),
              *(given[n] for n in others if _is_array(given.get(n)))]
    if not _tensors(*arrays) or _traced(*arrays) or not _one_device(arrays):
        return None
    return _Arguments(given, tables, terms, [a for a in arrays if a.dtype.is_floating_point])


def _check_call(entry: Any, arguments: _Arguments) -> tuple[Call, dict[str, Any]]:
    # the specification's checks of the call (the scheme's own, and plain's terms)
    given = arguments.given
    call, options = entry.check_call(
        given["q"], given["k"], given["v"], arguments.tables, scale=given.get("scale"),
        mask=given.get("mask"), causal=given.get("causal"), q_offset=given.get("q_offset"),
        options={o.name: given[o.name] for o in entry.options if o.name in given})
    if entry.name == "plain":
        check_terms(given["q"], call, **arguments.terms)
    return call, options


def _kernel(name: str) -> Callable[..., Any]:
    entry = catalog.get(name)
    signature = inspect.signature(entry.attention)
    value_tables = {t.name for t in entry.tables if t.width == "d_v"}

    def kernel(*args: Any, **kwargs: Any) -> Any:
        arguments = _arguments(entry, signature, args, kwargs)
        if arguments is None:
            return NotImplemented
        call, options = _check_call(entry, arguments)
        given, named = arguments.given, arguments.tables
        q, k, v, mask = given["q"], given["k"], given["v"], given.get("mask")
        # anything but the defaults (a bad value too) goes to the specification, which
        # checks them in its own order
        if (given.get("return_weights", False) is not False
                or given.get("method", "efficient") != "efficient"
                or value_tables & set(named)
                or 0 in (call.t_q, call.t_k, q.shape[-1])
                or not _bounded(name, call, {"q": q, "k": k, "v": v, **named, **arguments.terms,
                                             **{n: a for n, a in options.items()
                                                if _is_array(a)}})):
            return NotImplemented
        fused = _FIRST_ORDER.get() or not _differentiated(arguments.floating)
        if entry.rotate is not None:
            q, k = entry.rotate(q, k, q_offset=call.q_offset, options=options)
        if name == "plain":
            terms = Terms(**arguments.terms)
        elif name in DISTANCE_ONLY:
            # causal alone, every row with a key: the causal structure in the view too
            fold = call.causal and mask is None and call.q_offset >= 0
            terms = toeplitz_terms(entry, q, k, named, call, options, causal=fold)
            if fold:
                call = call._replace(causal=False)
            return sdpa_terms(q, k, v, call, terms=terms, mask=mask, keys_reversed=True,
                              fused=fused)
        else:
            terms = entry.attention_terms(q, k, named, q_offset=call.q_offset, i0=0, j0=0,
                                          options=options, method="efficient")
        return sdpa_terms(q, k, v, call, terms=terms, mask=mask, fused=fused)

    kernel.__name__ = kernel.__qualname__ = f"{name}_attention_sdpa"
    kernel.__doc__ = f"`{entry.attention.__name__}` through SDPA (see the module docstring)."
    return computes_in_float32(kernel)


def _vjp_kernel(name: str) -> Callable[..., Any]:
    entry = catalog.get(name)
    signature = inspect.signature(entry.vjp)
    forward = KERNELS[name]

    def kernel(*args: Any, **kwargs: Any) -> Any:
        arguments = _arguments(entry, signature, args, kwargs)
        if arguments is None:
            return NotImplemented
        if _differentiated(arguments.floating):
            return NotImplemented  # the specification's gradients are differentiable
        if torch.is_inference_mode_enabled() or any(a.is_inference()
                                                    for a in arguments.floating):
            return NotImplemented  # autograd records nothing there
        # the specification's checks, in its order: the call, then the cotangent
        call, options = _check_call(entry, arguments)
        given = dict(arguments.given)
        d_output = given.pop("d_output")
        check_d_output(d_output, given["q"], call, given["v"].shape[-1], mask=given.get("mask"))
        if not _finite([d_output]):
            return NotImplemented  # a NaN for a row with no key reaches dv in the specification
        # every floating argument, and array options completed by the checks (ALiBi's
        # slopes when not given: the specification returns their gradient too)
        leaves = {"q": given["q"], "k": given["k"], "v": given["v"], **arguments.tables,
                  **arguments.terms, **{n: a for n, a in options.items() if _is_array(a)}}
        token = _FIRST_ORDER.set(True)
        try:
            return _gradients(forward, entry, given, options, leaves, d_output)
        finally:
            _FIRST_ORDER.reset(token)

    kernel.__name__ = kernel.__qualname__ = f"{name}_attention_vjp_sdpa"
    kernel.__doc__ = (f"`{entry.vjp.__name__}` by torch autograd through the SDPA kernel "
                      "(see the module docstring).")
    return computes_in_float32(kernel)


def _gradients(forward: Callable[..., Any], entry: Any, given: dict[str, Any],
               options: dict[str, Any], leaves: dict[str, Any], d_output: Any) -> Any:
    # torch.autograd.grad of `forward` at detached copies of `leaves`, by name
    with torch.enable_grad():
        leaves = {n: a.detach().requires_grad_(True) for n, a in leaves.items()}
        tables_in = [leaves.get(t.name) for t in entry.tables]
        while tables_in and tables_in[-1] is None:
            tables_in.pop()
        keywords = {n: a for n, a in given.items()
                    if n not in ("q", "k", "v", *(t.name for t in entry.tables))}
        keywords.update({n: leaves[n] for n in leaves if n in keywords or n in options})
        out = forward(leaves["q"], leaves["k"], leaves["v"], *tables_in, **keywords)
        if out is NotImplemented:
            return NotImplemented
        grads = torch.autograd.grad(out, list(leaves.values()), d_output.expand(out.shape),
                                    allow_unused=True)
    return {n: torch.zeros_like(a) if g is None else g
            for (n, a), g in zip(leaves.items(), grads, strict=True)}


def _blocked_kernel(name: str) -> Callable[..., Any]:
    entry = catalog.get(name)

    def kernel(*args: Any, **kwargs: Any) -> Any:
        arguments = blocked_arguments(args, kwargs, scheme=name)
        if arguments is None:
            return NotImplemented  # the specification says what is wrong
        given, arrays = arguments
        q, k, v, mask = given["q"], given["k"], given["v"], given["mask"]
        if not _tensors(*arrays) or _traced(*arrays) or not _one_device(arrays):
            return NotImplemented
        checked = check_blocked_arguments(given)
        call, options, named = checked.call, checked.options, checked.tables
        floating = [a for a in arrays if a.dtype.is_floating_point]
        if (0 in (call.t_q, call.t_k, q.shape[-1])
                or not _bounded(name, call, {"q": q, "k": k, "v": v, **named,
                                             **{n: a for n, a in options.items()
                                                if _is_array(a)}})):
            return NotImplemented
        fused = not _differentiated(floating)
        if entry.rotate is not None:
            q, k = entry.rotate(q, k, q_offset=call.q_offset, options=options)
        # keys reversed once, for the row of distances of every call (`toeplitz_terms`)
        reverse = name in DISTANCE_ONLY or (call.causal and mask is None)
        flipped = (k.flip(-2), v.flip(-2)) if reverse else None

        def attend(i0: int, i1: int, j1: int) -> Any:
            return _attend_block(entry, q, k, v, named, call, options, i0=i0, i1=i1, j1=j1,
                                 mask=mask, flipped=flipped, fused=fused)

        # no mask: one row of distances per call, no (rows, t_k) array
        return blocked_rows(checked, q, v, name=name, lean=mask is None, attend=attend)

    kernel.__name__ = kernel.__qualname__ = f"{name}_blocked_attention_sdpa"
    kernel.__doc__ = (f"`blocked_attention(..., scheme={name!r})` through SDPA, a block of "
                      "queries at a time (see the module docstring).")
    return computes_in_float32(kernel)


def _attend_block(entry: Any, q: Any, k: Any, v: Any, named: dict[str, Any], call: Call,
                  options: dict[str, Any], *, i0: int, i1: int, j1: int, mask: Any,
                  flipped: tuple[Any, Any] | None, fused: bool) -> Any:
    # queries i0..i1 - 1 of a validated call against keys 0..j1 - 1, through SDPA
    t_k = call.t_k
    sub = call._replace(t_q=i1 - i0, t_k=j1, q_offset=call.q_offset + i0)
    q, k, v = q[..., i0:i1, :], k[..., :j1, :], v[..., :j1, :]
    mask = mask_tile(mask, i0, i1, 0, j1)
    # the causal structure in the row of distances where every row has a key
    fold = sub.causal and mask is None and sub.q_offset >= 0
    if flipped is None:  # no terms, no causal structure to fold
        return sdpa_terms(q, k, v, sub, terms=Terms(), mask=mask, fused=fused)
    # one row of distances: the scheme's terms, the causal structure folded in
    terms = toeplitz_terms(entry, q, k, named, sub, options, causal=fold)
    if fold:
        sub = sub._replace(causal=False)
    k_rev, v_rev = flipped
    return sdpa_terms(q, k, v, sub, terms=terms, mask=mask, keys_reversed=True,
                      flipped=(k_rev[..., t_k - j1:, :], v_rev[..., t_k - j1:, :]), fused=fused)


for _name in catalog.names(plain=True):
    KERNELS[_name] = _kernel(_name)
    VJP_KERNELS[_name] = _vjp_kernel(_name)
del _name
for _name in sorted(NO_TERMS | DISTANCE_ONLY):
    BLOCKED_KERNELS[_name] = _blocked_kernel(_name)
del _name
